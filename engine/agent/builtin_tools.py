"""Tools that need no server: the current date and time, a calculator, and reading a file the
user attached. None of them writes a file or runs a command.

Contract: ARCHITECTURE.md, 'engine.agent.builtin_tools'.
"""

from __future__ import annotations

import ast
import datetime as dt
import errno
import math
import operator
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from engine.inference.tools import BUILTIN_SOURCE, ToolResult, ToolSpec

CURRENT_TIME = "current_time"
CALCULATOR = "calculator"
READ_FILE = "read_file"
#: Every built-in this module offers, in the order they are listed.
BUILTIN_NAMES = (CURRENT_TIME, CALCULATOR, READ_FILE)

#: The longest expression the calculator takes.
CALC_MAX_CHARS = 500
#: The most syntax-tree nodes in one expression.
CALC_MAX_NODES = 200
#: The largest whole number (in bits) the calculator makes along the way.
CALC_MAX_BITS = 4096
#: The largest ``n`` for ``factorial(n)``.
CALC_MAX_FACTORIAL = 500

#: The default and the largest number of characters one ``read_file`` call returns.
READ_DEFAULT_CHARS = 20_000
READ_MAX_CHARS = 100_000
#: A file larger than this is refused (it is not a text the user attached to be read).
READ_MAX_FILE_BYTES = 50 * 1024 * 1024

_DESCRIPTIONS = {
    CURRENT_TIME: "The current date and time (ISO 8601, with the weekday and the UTC offset).",
    CALCULATOR: (
        "Evaluates an arithmetic expression exactly: + - * / // % **, parentheses, and the functions "
        "sqrt, exp, log, log10, log2, sin, cos, tan, asin, acos, atan, atan2, hypot, abs, round, floor, "
        "ceil, min, max, factorial; constants pi, e, tau."
    ),
    READ_FILE: "Reads a text file the user attached to this conversation, a window of characters at a time.",
}


class _CalcError(ValueError):
    """A one-line reason an expression is refused."""


class BuiltinTools:
    """The built-in tools, as one provider.

    Args:
        enabled: which built-ins to offer (default: all of :data:`BUILTIN_NAMES`); ``read_file``
            is offered only when files are attached.
        attached_files: the files ``read_file`` may read (anything else is refused).
        clock: returns the current time, aware (tests pass a fixed one).
    """

    def __init__(
        self,
        enabled: Iterable[str] | None = None,
        *,
        attached_files: Sequence[Path | str] = (),
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        names = tuple(BUILTIN_NAMES if enabled is None else enabled)
        unknown = [name for name in names if name not in BUILTIN_NAMES]
        if unknown:
            raise ValueError(f"unknown built-in tool {unknown[0]!r} (there are: {', '.join(BUILTIN_NAMES)})")
        self._files = [Path(path).expanduser().absolute() for path in attached_files]
        # What each attached path was when attached: its real path (a link the user attached is
        # resolved now, once) and the identity of the file there, so a later swap is not followed.
        self._real = {path: _AttachedFile.of(path) for path in self._files}
        self._enabled = tuple(name for name in names if name != READ_FILE or self._files)
        self._clock = clock or (lambda: dt.datetime.now().astimezone())

    def tools(self) -> list[ToolSpec]:
        """The enabled built-ins."""
        return [self._spec(name) for name in self._enabled]

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        """Runs one built-in (each is bounded and quick: ``timeout_s`` is not needed).

        Returns:
            The result, or an error result with one line for bad arguments or an unknown tool.
        """
        del timeout_s  # every built-in is bounded by its own caps
        if cancel is not None and cancel.is_set():
            return ToolResult(f"the call to {name} was cancelled", is_error=True)
        if name not in self._enabled:
            return ToolResult(f"there is no built-in tool {name!r}", is_error=True)
        if not isinstance(arguments, dict):  # callers outside the type checker (a model's JSON)
            return ToolResult(f"{name}: the arguments must be a JSON object", is_error=True)  # type: ignore[unreachable]
        if name == CURRENT_TIME:
            return self._current_time(arguments)
        if name == CALCULATOR:
            return _calculate(arguments)
        return self._read_file(arguments)

    def close(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ the tools

    def _spec(self, name: str) -> ToolSpec:
        if name == CURRENT_TIME:
            parameters: dict[str, Any] = {
                "type": "object",
                "properties": {
                    "timezone": {"type": "string", "description": "an IANA zone such as Europe/Paris (default: local)"}
                },
            }
        elif name == CALCULATOR:
            parameters = {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "for example (2 + 3) * sqrt(16)"}},
                "required": ["expression"],
            }
        else:
            names = ", ".join(path.name for path in self._files)
            parameters = {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": f"the file's name or path; attached: {names}"},
                    "offset": {"type": "integer", "minimum": 0, "description": "the first character to read"},
                    "max_chars": {"type": "integer", "minimum": 1, "maximum": READ_MAX_CHARS},
                },
                "required": ["path"],
            }
        return ToolSpec(name, _DESCRIPTIONS[name], parameters, source=BUILTIN_SOURCE)

    def _current_time(self, arguments: dict[str, Any]) -> ToolResult:
        now = self._clock()
        zone = arguments.get("timezone")
        if zone not in (None, ""):
            # lazy: start-up (+7 ms)
            from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

            if not isinstance(zone, str):
                return ToolResult("current_time: timezone must be a string", is_error=True)
            try:
                now = now.astimezone(ZoneInfo(zone))
            except (ZoneInfoNotFoundError, ValueError):
                return ToolResult(f"current_time: unknown timezone {zone!r}", is_error=True)
        return ToolResult(f"{now.isoformat(timespec='seconds')} ({now.strftime('%A')}, {now.tzname() or 'local'})")

    def _read_file(self, arguments: dict[str, Any]) -> ToolResult:
        asked = arguments.get("path")
        offset = arguments.get("offset", 0)
        limit = arguments.get("max_chars", READ_DEFAULT_CHARS)
        if not isinstance(asked, str) or not asked:
            return ToolResult("read_file: path must be a non-empty string", is_error=True)
        if not _is_int(offset) or offset < 0:
            return ToolResult("read_file: offset must be a whole number >= 0", is_error=True)
        if not _is_int(limit) or limit < 1:
            return ToolResult("read_file: max_chars must be a whole number >= 1", is_error=True)
        limit = min(limit, READ_MAX_CHARS)
        path = self._attached(asked)
        if path is None:
            names = ", ".join(path.name for path in self._files)
            return ToolResult(f"read_file: {asked}: not an attached file (attached: {names})", is_error=True)
        try:
            return _read_window(path, self._real[path], offset, limit)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK) or isinstance(exc, _Swapped):
                return ToolResult(
                    f"read_file: {path}: it was replaced since it was attached ({_swap_reason(exc)}); not read",
                    is_error=True,
                )
            return ToolResult(f"read_file: {path}: {exc.strerror or exc}", is_error=True)

    def _attached(self, asked: str) -> Path | None:
        """The attached file ``asked`` names (its full path, or its name when that is unique)."""
        wanted = Path(asked).expanduser()
        if wanted.is_absolute():
            for path in self._files:
                if path == wanted.absolute():
                    return path
            return None
        by_name = [path for path in self._files if path.name == asked or str(path).endswith(os.sep + asked)]
        return by_name[0] if len(by_name) == 1 else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Swapped(OSError):
    """The file opened is not the one attached (another device and inode)."""


def _swap_reason(exc: OSError) -> str:
    if isinstance(exc, _Swapped):
        return "it is another file now"
    return "a symbolic link is there now"


_NO_FOLLOW_WALK = hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY") and os.open in os.supports_dir_fd


class _AttachedFile:
    """An attached file as it was when attached: its real path and, if it existed, its identity."""

    def __init__(self, real: Path, identity: tuple[int, int] | None) -> None:
        self.real = real
        self.identity = identity

    @classmethod
    def of(cls, path: Path) -> _AttachedFile:
        real = Path(os.path.realpath(path))
        try:
            st = os.stat(real)
        except OSError:
            return cls(real, None)
        return cls(real, (st.st_dev, st.st_ino))

    def open(self) -> int:
        """A read-only descriptor of the attached file; never follows a link put there later.

        Raises:
            OSError: it cannot be opened; ``ELOOP`` when a component became a symbolic link,
                :class:`_Swapped` when (without ``O_NOFOLLOW``) it is another file now.
        """
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        if not _NO_FOLLOW_WALK:
            fd = os.open(self.real, flags)
            st = os.fstat(fd)
            if self.identity is not None and (st.st_dev, st.st_ino) != self.identity:
                os.close(fd)
                raise _Swapped(errno.ESTALE, "another file is there now", str(self.real))
            return fd
        # The real path had no link when attached: walk it one component at a time, refusing any
        # link (ELOOP), so a file or folder swapped for a link since is never followed.
        parts = self.real.parts
        folder = os.open(parts[0], os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[1:-1]:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
                os.close(folder)
                folder = inner
            return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=folder)
        finally:
            os.close(folder)


def _read_window(path: Path, attached: _AttachedFile, offset: int, limit: int) -> ToolResult:
    """Characters ``offset .. offset+limit`` of a regular UTF-8 text file, with a note when more follows.

    Raises:
        OSError: the file cannot be opened or read, or it is not the one attached.
    """
    fd = attached.open()  # non-blocking: a FIFO or a device put there opens at once and is refused below
    with open(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end: never read it
            return ToolResult(f"read_file: {path}: not a regular file", is_error=True)
        if st.st_size > READ_MAX_FILE_BYTES:
            return ToolResult(f"read_file: {path}: too large ({st.st_size} bytes; the limit is 50 MiB)", is_error=True)
        data = handle.read(READ_MAX_FILE_BYTES + 1)
    if b"\x00" in data[:8192]:
        return ToolResult(f"read_file: {path}: not a text file (binary data)", is_error=True)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return ToolResult(f"read_file: {path}: not UTF-8 text (byte {exc.start} cannot be decoded)", is_error=True)
    if offset > len(text):
        return ToolResult(f"read_file: {path}: offset {offset} is past the end ({len(text)} characters)", is_error=True)
    window = text[offset : offset + limit]
    rest = len(text) - offset - len(window)
    if rest > 0:
        window += f"\n[... {rest} more characters; call read_file again with offset={offset + len(window)}]"
    return ToolResult(window)


# ---------------------------------------------------------------------- the calculator

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _factorial(n: Any) -> int:
    if not _is_int(n) or n < 0:
        raise _CalcError("factorial takes a whole number >= 0")
    if n > CALC_MAX_FACTORIAL:
        raise _CalcError(f"factorial({n}) is too large (the limit is {CALC_MAX_FACTORIAL})")
    return math.factorial(n)


def _round(x: Any, digits: Any = 0) -> Any:
    if not _is_int(digits) or abs(digits) > 100:
        raise _CalcError("round's digits must be a whole number between -100 and 100")
    return round(x, digits) if digits else round(x)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "atan2": math.atan2,
    "hypot": math.hypot,
    "abs": abs,
    "round": _round,
    "floor": math.floor,
    "ceil": math.ceil,
    "min": min,
    "max": max,
    "factorial": _factorial,
}


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > CALC_MAX_BITS:
        raise _CalcError(f"a number grew past {CALC_MAX_BITS} bits")
    return value


def _pow(base: Any, exponent: Any) -> Any:
    """``base ** exponent``, refused before it is computed when the result would be huge."""
    whole = isinstance(base, int) and isinstance(exponent, int)
    if whole and exponent > 0 and abs(base) > 1 and exponent * math.log2(abs(base)) > CALC_MAX_BITS:
        raise _CalcError(f"{base} ** {exponent} is too large")
    if isinstance(exponent, (int, float)) and abs(exponent) > 1e6 and isinstance(base, int) and abs(base) > 1:
        raise _CalcError(f"{base} ** {exponent} is too large")
    return base**exponent


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if _is_int(node.value) or isinstance(node.value, float):
            return _check_size(node.value)
        raise _CalcError(f"{node.value!r} is not a number")
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise _CalcError(f"unknown name {node.id!r}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_pow(left, right))
        both_whole = isinstance(left, int) and isinstance(right, int)
        if isinstance(node.op, ast.Mult) and both_whole and left.bit_length() + right.bit_length() > CALC_MAX_BITS + 1:
            raise _CalcError(f"a number grew past {CALC_MAX_BITS} bits")
        return _check_size(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        function = _FUNCTIONS.get(node.func.id)
        if function is None:
            raise _CalcError(f"unknown function {node.func.id!r}")
        return _check_size(function(*[_evaluate(arg) for arg in node.args]))
    if isinstance(node, ast.Call):
        raise _CalcError("only the listed functions can be called, by name, without keywords")
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        symbol = _OPERATORS.get(type(node.op), type(node.op).__name__)
        raise _CalcError(f"the operator {symbol} is not arithmetic here" + _WHAT_IS)
    raise _CalcError(_NOT_ARITHMETIC.get(type(node), "this is not arithmetic") + _WHAT_IS)


_OPERATORS: dict[type[ast.AST], str] = {
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}


# What a construct the calculator refuses is called in words (not the syntax tree's class names).
_NOT_ARITHMETIC: dict[type[ast.AST], str] = {
    ast.Tuple: "a comma separates two values here (is there a stray or trailing comma?); give one expression",
    ast.List: "lists ([...]) are not arithmetic",
    ast.Set: "sets ({...}) are not arithmetic",
    ast.Dict: "dictionaries ({...: ...}) are not arithmetic",
    ast.Attribute: "attributes (x.y) are not arithmetic",
    ast.Subscript: "indexing (x[...]) is not arithmetic",
    ast.Compare: "comparisons (<, ==, ...) are not arithmetic",
    ast.BoolOp: "and / or are not arithmetic",
    ast.IfExp: "conditionals (... if ... else ...) are not arithmetic",
    ast.Lambda: "functions (lambda) cannot be defined",
    ast.Starred: "unpacking (*x) is not arithmetic",
    ast.JoinedStr: "strings are not numbers",
    ast.NamedExpr: "assignments (:=) are not arithmetic",
}
_WHAT_IS = " (numbers, + - * / // % **, parentheses and the listed functions are)"


def evaluate_expression(expression: str) -> int | float:
    """The value of an arithmetic expression, computed without ``eval``.

    Raises:
        ValueError: the expression is too long, not arithmetic, or its value is undefined or huge;
            ``str()`` is one line.
    """
    if len(expression) > CALC_MAX_CHARS:
        raise _CalcError(f"the expression is longer than {CALC_MAX_CHARS} characters")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise _CalcError(f"not an expression ({exc.msg})") from None
    if sum(1 for _ in ast.walk(tree)) > CALC_MAX_NODES:
        raise _CalcError(f"the expression has more than {CALC_MAX_NODES} parts")
    try:
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise _CalcError("division by zero") from None
    except OverflowError:
        raise _CalcError("the result is too large for a floating-point number") from None
    except TypeError as exc:
        raise _CalcError(f"wrong arguments ({exc})") from None
    except ValueError as exc:
        if isinstance(exc, _CalcError):
            raise
        raise _CalcError(f"undefined ({exc})") from None
    if isinstance(value, complex):
        raise _CalcError("the result is not a real number")
    if not isinstance(value, (int, float)):
        raise _CalcError("the result is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise _CalcError("the result is not a finite number")
    return value


def _calculate(arguments: dict[str, Any]) -> ToolResult:
    expression = arguments.get("expression")
    if not isinstance(expression, str) or not expression.strip():
        return ToolResult("calculator: expression must be a non-empty string", is_error=True)
    try:
        value = evaluate_expression(expression)
    except ValueError as exc:
        return ToolResult(f"calculator: {exc}", is_error=True)
    return ToolResult(repr(value) if isinstance(value, float) else str(value))
