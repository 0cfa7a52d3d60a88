"""The `sluice` command line: one module per group of sub-commands (see core.cli.base)."""
