"""The engine's `sluice` sub-commands (found by the management command's discovery of
every installed app's ``sluice_cli`` module; see core.cli.base).  Imported in the order
`sluice --help` lists them."""
# isort: skip_file
from core.cli import queues, messages, delayed, worker, failed, outbox, records, alerts  # noqa: F401  (registers the groups)
