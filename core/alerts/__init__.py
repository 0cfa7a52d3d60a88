"""Alerts: rules over Sluice's measurements, a firing → resolved state machine, notifications
delivered through Sluice's own queue (see docs/operations/alerts.md)."""
