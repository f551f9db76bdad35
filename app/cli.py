"""The ``glassbox`` command line (ARCHITECTURE.md, "The command line contract").

Each subcommand group lives in its own module under ``app.commands`` and registers itself here.
Errors are one line, ``glassbox: error: ...`` on stderr, exit code 1; bad usage exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from app.paths import Paths

Handler = Callable[[argparse.Namespace, Paths], int]


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
    from app.commands import bench, chat, kb, mcp, models, serve

    common = _common()
    parser = _Parser(prog="glassbox", description="Chat with local language models.", parents=[common])
    parser.add_argument("--safe-mode", action="store_true", help="start the app without loading a model")
    parser.add_argument("--self-test", action="store_true", help="run the built-in smoke test and exit")
    parser.add_argument(
        "--json", dest="self_test_json", action="store_true", help="with --self-test: one JSON object on stdout"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (chat, models, kb, bench, serve, mcp):
        module.register(sub, common)
    return parser


def _fail(message: str) -> int:
    print(f"glassbox: error: {message}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``glassbox`` console script and ``python -m app``."""
    import multiprocessing

    multiprocessing.freeze_support()
    parser = build_parser()
    args = parser.parse_args(argv)
    paths = Paths.resolve(getattr(args, "home", None))
    handler: Handler | None = getattr(args, "handler", None)
    if args.self_test_json and not args.self_test:
        parser.error("--json before a subcommand goes with --self-test only (put it after the subcommand)")
    if handler is None:
        if args.self_test:
            from app.selftest import run_self_test

            return run_self_test(paths, as_json=args.self_test_json)
        from app.main_window import run_gui

        return run_gui(paths, safe_mode=args.safe_mode)
    from app.paths import ReadOnlyFolder
    from engine.errors import EngineError
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
