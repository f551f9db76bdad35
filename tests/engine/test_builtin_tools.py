"""engine.agent.builtin_tools: the date and time, a bounded calculator without eval, and reading only
the attached text files, each failure one line."""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from engine.agent.builtin_tools import (
    BUILTIN_NAMES,
    CALC_MAX_CHARS,
    READ_DEFAULT_CHARS,
    BuiltinTools,
    evaluate_expression,
)
from engine.inference.tools import ToolProvider, ToolResult, check_tools

FIXED = dt.datetime(2026, 3, 14, 15, 9, 26, tzinfo=dt.timezone(dt.timedelta(hours=1)))


ARITHMETIC = (
    " (numbers, + - * / // % **, parentheses and the listed functions are)"  # what the calculator's refusals end with
)


def _calc(expression: str) -> ToolResult:
    return BuiltinTools().call("calculator", {"expression": expression}, timeout_s=1)


def test_the_provider_offers_valid_specs_and_no_file_tool_without_files() -> None:
    tools = BuiltinTools()
    assert isinstance(tools, ToolProvider)
    assert [spec.name for spec in tools.tools()] == ["current_time", "calculator"]
    with_file = BuiltinTools(attached_files=[__file__])
    specs = with_file.tools()
    assert [spec.name for spec in specs] == list(BUILTIN_NAMES)
    check_tools(specs)
    assert all(spec.source == "builtin" for spec in specs)
    assert "test_builtin_tools.py" in specs[2].parameters["properties"]["path"]["description"]


def test_only_the_chosen_builtins_and_unknown_names_refused() -> None:
    assert [spec.name for spec in BuiltinTools(["calculator"]).tools()] == ["calculator"]
    result = BuiltinTools(["calculator"]).call("current_time", {}, timeout_s=1)
    assert result == ToolResult("there is no built-in tool 'current_time'", is_error=True)
    with pytest.raises(ValueError, match="unknown built-in tool 'shell'"):
        BuiltinTools(["shell"])


def test_current_time_is_the_clock_in_iso_with_the_weekday() -> None:
    tools = BuiltinTools(clock=lambda: FIXED)
    assert tools.call("current_time", {}, timeout_s=1).content == "2026-03-14T15:09:26+01:00 (Saturday, UTC+01:00)"
    tokyo = tools.call("current_time", {"timezone": "Asia/Tokyo"}, timeout_s=1)
    assert tokyo.content == "2026-03-14T23:09:26+09:00 (Saturday, JST)"
    bad = tools.call("current_time", {"timezone": "Mars/Olympus"}, timeout_s=1)
    assert bad == ToolResult("current_time: unknown timezone 'Mars/Olympus'", is_error=True)
    traversal = tools.call("current_time", {"timezone": "../../etc/passwd"}, timeout_s=1)
    assert traversal.is_error


def test_current_time_by_default_is_now() -> None:
    text = BuiltinTools().call("current_time", {}, timeout_s=1).content
    stamp = dt.datetime.fromisoformat(text.split(" ")[0])
    assert abs(stamp.timestamp() - time.time()) < 5


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("7 // 2", "3"),
        ("7 / 2", "3.5"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2^10", "1024"),
        ("sqrt(16)", "4.0"),
        ("round(pi, 3)", "3.142"),
        ("max(1, 5, 3) - min(4, 2)", "3"),
        ("factorial(20)", "2432902008176640000"),
        ("hypot(3, 4)", "5.0"),
        ("12345678901234567890 * 98765432109876543210", "1219326311370217952237463801111263526900"),
        ("0.1 + 0.2", "0.30000000000000004"),
    ],
)
def test_the_calculator_computes(expression: str, value: str) -> None:
    assert _calc(expression) == ToolResult(value)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("sqrt(-1)", "undefined (math domain error)"),
        ("(-8) ** 0.5", "the result is not a real number"),
        ("9e307 * 10", "the result is not a finite number"),
        ("exp(1000)", "the result is too large for a floating-point number"),
        ("2 ** 100000", "2 ** 100000 is too large"),
        ("9 ** 9 ** 9", "9 ** 387420489 is too large"),
        ("factorial(100000)", "factorial(100000) is too large (the limit is 500)"),
        ("x + 1", "unknown name 'x'"),
        ("__import__('os')", "unknown function '__import__'"),
        ("__import__('os').system('true')", "only the listed functions can be called, by name, without keywords"),
        ("round(x=1)", "only the listed functions can be called, by name, without keywords"),
        ("(1).__class__", "attributes (x.y) are not arithmetic" + ARITHMETIC),
        ("[1, 2]", "lists ([...]) are not arithmetic" + ARITHMETIC),
        (
            "1 + 2,",
            "a comma separates two values here (is there a stray or trailing comma?); give one expression" + ARITHMETIC,
        ),
        ("3 & 1", "the operator & is not arithmetic here" + ARITHMETIC),
        ("not 1", "the operator not is not arithmetic here" + ARITHMETIC),
        ("1 < 2", "comparisons (<, ==, ...) are not arithmetic" + ARITHMETIC),
        ("'a' * 3", "'a' is not a number"),
        ("1 if 1 else 2", "conditionals (... if ... else ...) are not arithmetic" + ARITHMETIC),
        ("lambda: 1", "functions (lambda) cannot be defined" + ARITHMETIC),
        ("1 +", "not an expression (invalid syntax)"),
        ("max()", "wrong arguments (max expected at least 1 argument, got 0)"),
        ("round(1.5, 10**9)", "round's digits must be a whole number between -100 and 100"),
        ("2j", "2j is not a number"),
    ],
)
def test_the_calculator_refuses_in_one_line(expression: str, reason: str) -> None:
    assert _calc(expression) == ToolResult(f"calculator: {reason}", is_error=True)


def test_the_calculator_bounds_the_work() -> None:
    assert _calc("1+" * (CALC_MAX_CHARS // 2) + "1").content.startswith("calculator: the expression is longer")
    assert _calc("-" * 300 + "1").content == "calculator: the expression has more than 200 parts"
    # Every step stays under the bit cap, and the product of two big numbers is refused before it is
    # made: counted in memory, not timed (the 8,000-bit product would be 1 KB; the tracemalloc peak
    # stays under 256 KB, where 2 ** 10 ** 9 would take 128 MB).
    tracemalloc.start()
    try:
        result = _calc("(2**4000) * (2**4000)")
        huge = _calc("2 ** 1000000000")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result == ToolResult("calculator: a number grew past 4096 bits", is_error=True)
    assert huge == ToolResult("calculator: 2 ** 1000000000 is too large", is_error=True)
    assert peak < 256 << 10, peak
    assert _calc("").content == "calculator: expression must be a non-empty string"
    assert BuiltinTools().call("calculator", {}, timeout_s=1).is_error
    with pytest.raises(ValueError, match="division by zero"):
        evaluate_expression("1/0")


def test_the_calculator_never_evaluates_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval called")

    monkeypatch.setattr(builtins, "eval", refuse)
    assert _calc("1 + 1").content == "2"


# ---------------------------------------------------------------------- read_file


def _read(tools: BuiltinTools, **arguments: object) -> ToolResult:
    return tools.call("read_file", dict(arguments), timeout_s=1)


def test_read_file_reads_an_attached_text_file_by_name_or_path(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("first line\nsecond line — ünïcode\n", encoding="utf-8")
    tools = BuiltinTools(attached_files=[notes])
    assert _read(tools, path="notes.txt").content == "first line\nsecond line — ünïcode\n"
    assert _read(tools, path=str(notes)).content.startswith("first line")
    assert _read(tools, path="notes.txt", offset=6, max_chars=4).content.startswith("line\n[... ")


def test_read_file_pages_a_long_file(tmp_path: Path) -> None:
    long = tmp_path / "long.txt"
    long.write_text("a" * (READ_DEFAULT_CHARS + 10))
    tools = BuiltinTools(attached_files=[long])
    first = _read(tools, path="long.txt").content
    assert first.endswith(f"[... 10 more characters; call read_file again with offset={READ_DEFAULT_CHARS}]")
    assert _read(tools, path="long.txt", offset=READ_DEFAULT_CHARS).content == "a" * 10
    past = _read(tools, path="long.txt", offset=10**9)
    assert past.is_error
    assert "past the end" in past.content


def test_read_file_refuses_what_was_not_attached(tmp_path: Path) -> None:
    attached = tmp_path / "ok.txt"
    attached.write_text("fine")
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    tools = BuiltinTools(attached_files=[attached])
    for asked in ("secret.txt", str(secret), "/etc/passwd", "../ok.txt", str(tmp_path / "sub" / ".." / "secret.txt")):
        result = _read(tools, path=asked)
        assert result.is_error, asked
        assert result.content == f"read_file: {asked}: not an attached file (attached: ok.txt)"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_read_file_refuses_binary_non_utf8_pipes_and_bad_arguments(tmp_path: Path) -> None:
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x7fELF\x00\x00\x01")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    gone = tmp_path / "gone.txt"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    tools = BuiltinTools(attached_files=[binary, latin, gone, fifo])
    assert _read(tools, path="blob.bin").content == f"read_file: {binary}: not a text file (binary data)"
    assert _read(tools, path="latin.txt").content == f"read_file: {latin}: not UTF-8 text (byte 3 cannot be decoded)"
    assert _read(tools, path="gone.txt").content == f"read_file: {gone}: No such file or directory"
    # A named pipe would block an open() forever: read in a thread, with a 10 s hang guard (the
    # refusal is immediate here), so a regression fails instead of hanging the suite.
    answers: list[ToolResult] = []
    reader = threading.Thread(target=lambda: answers.append(_read(tools, path="pipe")), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "read_file blocked on a named pipe"
    assert answers[0].content == f"read_file: {fifo}: not a regular file"
    assert _read(tools, path="").content == "read_file: path must be a non-empty string"
    assert _read(tools, path="blob.bin", offset=-1).content == "read_file: offset must be a whole number >= 0"
    assert _read(tools, path="blob.bin", max_chars=True).content == "read_file: max_chars must be a whole number >= 1"


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges on Windows")
def test_read_file_never_follows_a_link_swapped_in_after_attaching(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's private key")
    shared = tmp_path / "shared"
    shared.mkdir()
    notes = shared / "notes.txt"
    notes.write_text("notes")
    tools = BuiltinTools(attached_files=[notes])
    assert _read(tools, path="notes.txt").content == "notes"
    notes.unlink()
    notes.symlink_to(secret)  # swapped after it was attached
    result = _read(tools, path="notes.txt")
    assert result == ToolResult(
        f"read_file: {notes}: it was replaced since it was attached (a symbolic link is there now); not read",
        is_error=True,
    )
    # A folder above it swapped for a link to a folder holding a file of the same name.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("someone else's notes")
    notes.unlink()
    shared.rmdir()
    shared.symlink_to(elsewhere)
    assert "someone else" not in _read(tools, path="notes.txt").content
    assert _read(tools, path="notes.txt").is_error


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges on Windows")
def test_read_file_reads_a_link_the_user_attached_and_a_file_saved_again(tmp_path: Path) -> None:
    target = tmp_path / "real.txt"
    target.write_text("v1")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    tools = BuiltinTools(attached_files=[link])  # the user attached a link: what it points at now is read
    assert _read(tools, path="link.txt").content == "v1"
    replacement = tmp_path / "real.txt.tmp"
    replacement.write_text("v2")
    replacement.replace(target)  # an editor's atomic save: a new file at the same path
    assert _read(tools, path="link.txt").content == "v2"
