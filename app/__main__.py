"""``python -m app`` starts Glassbox, like the ``glassbox`` command (its entry point is :func:`main`).

Nothing is imported at module level: child processes started by :mod:`multiprocessing` import the
launching script again (the ``glassbox`` console script imports this module), and each such
import should cost nothing (``app.cli`` and its imports took 64 ms per child here).
"""

import sys


def main() -> int:
    """Runs the command line (or the GUI without a command)."""
    from app.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
