"""Subcommands of the ``glassbox`` command line, one module per group."""
