"""``python -m app`` starts Glassbox, like the ``glassbox`` command (its entry point is :func:`main`).

Nothing is imported at module level: child processes started by :mod:`multiprocessing` import the
launching script again (the ``glassbox`` console script imports this module), and each such
import should cost nothing (``app.cli.main`` and its imports took 64 ms per child here).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.paths import Paths


class _QtFrontEnd:
    """The GUI front end handed to the command line (``app.cli.main.Gui``): this module is the one
    place that knows both, so that ``app.cli`` never imports Qt."""

    @staticmethod
    def run_gui(paths: Paths, *, safe_mode: bool) -> int:
        # lazy: child process (see the module docstring)
        from app.gui.launch import leave_process, run_gui

        # The window shut everything down as it closed: the process leaves without Python's
        # teardown of every module (app.gui.launch.leave_process), which made closing slow.
        leave_process(run_gui(paths, safe_mode=safe_mode))

    @staticmethod
    def run_self_test(paths: Paths, *, as_json: bool) -> int:
        # lazy: child process (see the module docstring)
        from app.gui.selftest import run_self_test

        return run_self_test(paths, as_json=as_json)


def main() -> int:
    """Runs the command line (or the GUI without a command)."""
    # lazy: child process (see the module docstring)
    from app.cli.main import main as cli_main

    return cli_main(gui=_QtFrontEnd())


if __name__ == "__main__":
    sys.exit(main())
