"""The ``glassbox`` command line: the parser (``app.cli.main``) and one module per subcommand group
(``app.cli.commands``). Qt-free: the GUI is started by ``app.__main__``, never from here."""
