"""The dashboard's pages, one module per page (overview, queues, delayed, failed, outbox, audit),
plus log-in (auth) and the open health probe (health)."""
