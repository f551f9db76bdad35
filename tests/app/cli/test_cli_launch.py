"""``glassbox`` without a command starts the window without building the whole command line's parser
(every command's module: ~100 ms at each start), and anything else still goes through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.cli import main as cli
from app.paths import Paths


class _Gui:
    def __init__(self) -> None:
        self.calls: list[tuple[Paths, bool]] = []

    def run_gui(self, paths: Paths, *, safe_mode: bool) -> int:
        self.calls.append((paths, safe_mode))
        return 0

    def run_self_test(self, paths: Paths, *, as_json: bool) -> int:
        return 7


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], (None, False)),
        (["--safe-mode"], (None, True)),
        (["--home", "/tmp/h"], ("/tmp/h", False)),
        (["--home=/tmp/h", "--safe-mode"], ("/tmp/h", True)),
        (["--home"], None),
        (["--home", "--safe-mode"], None),
        (["--home="], None),
        (["--self-test"], None),
        (["--help"], None),
        (["chat", "--model", "m"], None),
        (["--home", "/tmp/h", "kb", "list"], None),
    ],
)
def test_which_command_lines_only_start_the_app(argv: list[str], expected: tuple[str | None, bool] | None) -> None:
    assert cli.gui_launch(argv) == expected


def test_starting_the_app_builds_no_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_parser() -> Any:
        raise AssertionError("the whole parser was built to start the app")

    monkeypatch.setattr(cli, "build_parser", no_parser)
    gui = _Gui()
    assert cli.main(["--home", str(tmp_path), "--safe-mode"], gui=gui) == 0
    assert gui.calls == [(Paths.resolve(tmp_path), True)]


def test_other_command_lines_still_go_through_the_parser(tmp_path: Path) -> None:
    gui = _Gui()
    assert cli.main(["--home", str(tmp_path), "--self-test"], gui=gui) == 7
    assert gui.calls == []
    with pytest.raises(SystemExit) as bad:
        cli.main(["--home"], gui=gui)
    assert bad.value.code == 2 and gui.calls == []
