"""The ``glassbox`` command line (ARCHITECTURE.md, "The command line contract").

Each subcommand group lives in its own module under ``app.cli.commands`` and registers itself here.
Errors are one line, ``glassbox: error: ...`` on stderr, exit code 1; bad usage exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol

from app.paths import Paths, ReadOnlyFolder
from engine.display import printable
from engine.errors import EngineError

Handler = Callable[[argparse.Namespace, Paths], int]


class Gui(Protocol):
    """What the command line needs of the GUI front end, which ``app.__main__`` passes in: the CLI
    never imports Qt (an import contract)."""

    def run_gui(self, paths: Paths, *, safe_mode: bool) -> int:
        """Starts the window and returns the exit code when it closes."""
        ...

    def run_self_test(self, paths: Paths, *, as_json: bool) -> int:
        """Runs the built-in smoke test and returns its exit code."""
        ...


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"glassbox: error: {message}\n")


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a sub-parser built from these parents must not reset a --home given before the subcommand.
    common.add_argument(
        "--home", metavar="DIR", default=argparse.SUPPRESS, help="keep all data under DIR (default: the user's folders)"
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    # lazy: start-up (+170 ms: every command's module; the window's start skips it, see gui_launch)
    from app.cli.commands import bench, chat, kb, mcp, models, residents, serve

    common = _common()
    parser = _Parser(prog="glassbox", description="Chat with local language models.", parents=[common])
    parser.add_argument("--safe-mode", action="store_true", help="start the app without loading a model")
    parser.add_argument("--self-test", action="store_true", help="run the built-in smoke test and exit")
    parser.add_argument(
        "--json", dest="self_test_json", action="store_true", help="with --self-test: one JSON object on stdout"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (chat, models, kb, bench, serve, residents, mcp):
        module.register(sub, common)
    return parser


def _fail(message: str) -> int:
    # Errors name files, models and servers others named: no control or bidi character reaches the terminal.
    print(f"glassbox: error: {printable(message)}", file=sys.stderr)
    return 1


def gui_launch(argv: Sequence[str]) -> tuple[str | None, bool] | None:
    """``(home, safe_mode)`` when ``argv`` only starts the app (``--home DIR``, ``--safe-mode``);
    None for anything else, which the whole parser reads. Building it imports every command's
    module, about 100 ms the window would wait for at every start."""
    home: str | None = None
    safe_mode = False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--safe-mode":
            safe_mode = True
        elif arg == "--home" and args and not args[0].startswith("-"):
            home = args.pop(0)
        elif arg.startswith("--home=") and len(arg) > len("--home="):
            home = arg[len("--home=") :]
        else:
            return None
    return home, safe_mode


def main(argv: Sequence[str] | None = None, gui: Gui | None = None) -> int:
    """Runs one ``glassbox`` command line; without a subcommand, starts ``gui`` (``app.__main__``
    passes the Qt front end; without one, that is a one-line error)."""
    if getattr(sys, "frozen", False):  # only a frozen app's children need it
        # lazy: start-up (+13 ms)
        import multiprocessing

        multiprocessing.freeze_support()
    launch = gui_launch(sys.argv[1:] if argv is None else argv) if gui is not None else None
    if launch is not None and gui is not None:
        return gui.run_gui(Paths.resolve(launch[0]), safe_mode=launch[1])
    parser = build_parser()
    args = parser.parse_args(argv)
    paths = Paths.resolve(getattr(args, "home", None))
    handler: Handler | None = getattr(args, "handler", None)
    if args.self_test_json and not args.self_test:
        parser.error("--json before a subcommand goes with --self-test only (put it after the subcommand)")
    if handler is None:
        if gui is None:
            return _fail("no command given, and this front end has no GUI (see glassbox --help)")
        if args.self_test:
            return gui.run_self_test(paths, as_json=args.self_test_json)
        return gui.run_gui(paths, safe_mode=args.safe_mode)
    # lazy: start-up (+1 ms: the window's start loads no rag module)
    from rag.errors import RagError

    try:
        paths.ensure()
        return handler(args, paths)
    except (EngineError, RagError, ReadOnlyFolder) as exc:
        return _fail(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        print("glassbox: interrupted", file=sys.stderr)
        return 130
