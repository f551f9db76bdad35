"""Streaming parsers of the tool-call formats that model families write.

A model asks for a tool by writing a call in its family's format; :class:`ToolCallParser` reads the
reply as it streams and splits it into text (which streams on as usual) and :class:`ParsedCall`
objects (each emitted once, when the call is complete). The formats, as each family's documented
chat template describes them:

``hermes`` (Qwen 2.5, Qwen 3, Hermes 2/3, and most fine-tunes that follow them)
    ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one block per call.
``llama3`` (Llama 3.1, 3.2, 3.3)
    the reply is one JSON object ``{"name": "f", "parameters": {...}}`` (several may follow,
    separated by ``;`` or newlines), optionally after ``<|python_tag|>``; the 3.2 lightweight models
    may answer with a Python-style list ``[f(a=1), g(b="x")]``.
``mistral`` (Mistral, Mixtral, Ministral, Mistral Small/Nemo)
    ``[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]`` (v3 tokenizers), or
    ``[TOOL_CALLS]f[ARGS]{...}`` and ``[TOOL_CALLS]f[CALL_ID]abc123xyz[ARGS]{...}`` (v11+).
``gemma`` (Gemma 2/3 tool prompts)
    a fenced block ````` ```tool_code\\nf(a=1, b="x")\\n``` ````` with Python call syntax (only
    literal arguments are accepted: the text is parsed with :mod:`ast`, never evaluated), or JSON
    in the block.
``deepseek`` (DeepSeek V2.5, V3, R1)
    ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>``; V3.1 drops the ``function`` type and the fence
    (``...<｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...``).
``json`` (the generic fallback, and the format of grammar-constrained calls and of the fallback
    tool prompt in :mod:`engine.inference.tool_prompt`)
    a reply that is one JSON object ``{"name": "f", "arguments": {...}}`` (also inside a
    ````` ```json ````` fence, or a list of them, or ``{"tool_calls": [...]}``), and Hermes blocks.

A reply that *starts* with ``{``, ``[`` or a fence (``llama3``, ``json``) is held back, since only
the whole text says whether it is a call; as soon as its start says it cannot be one (the JSON
breaks, a finished value is no call, text follows: :mod:`engine.inference.call_prefix`) it streams
as text from there, and a reply held to its end that is no call is emitted as text then. Markup
that opens a call but does not parse (broken JSON, a name that is not a string) is emitted as text
too, so nothing the model wrote is lost. In the ``json`` family a bare JSON object counts as a call
only when its name is one of the tools offered (a model asked for JSON must not have its answer
taken for a call).

Public API: :class:`ToolCallParser` (``feed(text) -> list[Piece]``, ``finish() -> list[Piece]``),
:func:`parse_tool_calls` (a whole text at once), :func:`detect_family` (from a chat template's
text), :data:`FAMILIES`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.inference.call_prefix import BareCallPrefix

Family = Literal["hermes", "llama3", "mistral", "gemma", "deepseek", "json"]
FAMILIES: tuple[Family, ...] = ("hermes", "llama3", "mistral", "gemma", "deepseek", "json")

MAX_CALL_CHARS = 256 * 1024
"""A call's markup longer than this is not parsed (it is emitted as text): bounds the JSON and
:mod:`ast` work on a runaway generation."""

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"

MISTRAL_CALLS = "[TOOL_CALLS]"
LLAMA_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    """One call found in the reply: the function, its arguments, and the text that asked for it."""

    name: str
    arguments: dict[str, Any]
    raw: str


Piece = str | ParsedCall


@dataclass(frozen=True)
class _Block:
    """Markup that opens a call, and what closes it (``None``: the end of the reply)."""

    open: str
    close: str | None


_BLOCKS: dict[Family, tuple[_Block, ...]] = {
    "hermes": (_Block("<tool_call>", "</tool_call>"),),
    "llama3": (_Block(LLAMA_PYTHON_TAG, None),),
    "mistral": (_Block(MISTRAL_CALLS, None),),
    "gemma": (_Block("```tool_code", "```"), _Block("```tool_call", "```")),
    "deepseek": (_Block(DS_CALLS_BEGIN, DS_CALLS_END),),
    "json": (_Block("<tool_call>", "</tool_call>"),),
}
_BARE_START = {"llama3", "json"}
"""Families whose call may be the whole reply, unmarked (a JSON object or list)."""


def detect_family(template_text: str | None, architecture: str = "") -> Family:
    """The call format a model writes, from the markers in its chat template.

    Args:
        template_text: the model's Jinja chat template, if any.
        architecture: ``general.architecture`` (used when the template says nothing).

    Returns:
        The family; ``"json"`` (the generic fallback) when nothing matches.
    """
    text = template_text or ""
    if "<tool_call>" in text:
        return "hermes"
    if MISTRAL_CALLS in text:
        return "mistral"
    if "tool▁call" in text:
        return "deepseek"
    if LLAMA_PYTHON_TAG in text or ("<|start_header_id|>" in text and "tools" in text):
        return "llama3"
    if "tool_code" in text:
        return "gemma"
    arch = architecture.lower()
    if arch.startswith("qwen"):
        return "hermes"
    return "json"


@dataclass
class ToolCallParser:
    """Splits a streaming reply into text and complete calls.

    Args:
        family: the call format (see the module docstring).
        tool_names: the tools offered; in the ``json`` family a bare JSON object is a call only
            when its name is one of them (empty: any name).

    Feed it the reply's text as it arrives (any piece sizes); each call returns what is settled so
    far: text pieces, and a :class:`ParsedCall` when a call's markup is complete. Call
    :meth:`finish` at the end of the reply for what was held back.
    """

    family: Family = "json"
    tool_names: Collection[str] = ()
    _buf: str = ""
    _state: Literal["start", "text", "block", "bare"] = "start"
    _block: _Block | None = None
    _calls: int = field(default=0)
    _prefix: BareCallPrefix | None = None
    _prefix_read: int = 0

    def __post_init__(self) -> None:
        if self.family not in _BLOCKS:
            raise ValueError(f"unknown tool-call family {self.family!r} (one of {', '.join(FAMILIES)})")
        self._opens = _BLOCKS[self.family]

    @property
    def calls_found(self) -> int:
        """How many calls were emitted so far."""
        return self._calls

    @property
    def in_call(self) -> bool:
        """Whether the text so far ends inside a call's markup (or a reply held as a possible call)."""
        return self._state in ("block", "bare")

    def feed(self, text: str) -> list[Piece]:
        """Takes the next piece of the reply; returns the text and calls now settled."""
        self._buf += text
        out: list[Piece] = []
        while True:
            if self._state == "start" and not self._decide_start():
                break
            if self._state == "text":
                if not self._scan_text(out):
                    break
            elif self._state == "block":
                if not self._scan_block(out):
                    break
            elif self._state == "bare":
                if self._still_a_call():
                    break
                self._state = "text"  # it cannot be a call any more: the held text streams as text
        return _merge(out)

    def _still_a_call(self) -> bool:
        """Whether the reply held as a bare call can still be one (engine/inference/call_prefix.py)."""
        if self._prefix is None:
            family, names = self.family, self.tool_names
            self._prefix = BareCallPrefix(lambda value: bool(_parse_bare(value, family, names)))
            self._prefix_read = 0
        possible = self._prefix.feed(self._buf[self._prefix_read :])
        self._prefix_read = len(self._buf)
        return possible

    def finish(self) -> list[Piece]:
        """The end of the reply: parses what was held back (or returns it as text)."""
        out: list[Piece] = []
        buf, self._buf = self._buf, ""
        if self._state == "block" and self._block is not None:
            raw = self._block.open + buf
            out.extend(self._parse_or_text(buf, raw))
        elif self._state == "bare":
            calls = _parse_bare(buf, self.family, self.tool_names)
            if calls:
                out.extend(calls)
            elif buf:
                out.append(buf)
        elif buf:
            out.append(buf)
        self._state, self._block = "text", None
        self._calls += sum(isinstance(piece, ParsedCall) for piece in out)
        return _merge(out)

    # ---------------------------------------------------------------- states
    def _decide_start(self) -> bool:
        """At the reply's start: a bare call (held until the end), or text. False: wait for more."""
        head = self._buf.lstrip()
        if not head:
            return False
        if self.family in _BARE_START:
            if head[0] in "{[":
                self._state = "bare"
                return True
            if len(head) < 3 and "```".startswith(head):
                return False  # "`" or "``" so far: could open a fence
            if head.startswith("```"):
                fence = head[3:]
                if len(fence) < 4 and "\n" not in fence and "json".startswith(fence):
                    return False  # "```js..." so far: could be a JSON fence
                if fence.startswith("json") or fence.startswith("\n"):
                    self._state = "bare"
                    return True
        self._state = "text"
        return True

    def _scan_text(self, out: list[Piece]) -> bool:
        """Emits text up to the next opening marker; False when it must wait for more text."""
        found = _earliest(self._buf, self._opens)
        if found is None:
            hold = partial_suffix(self._buf, [block.open for block in self._opens])
            cut = len(self._buf) - hold
            if cut:
                out.append(self._buf[:cut])
                self._buf = self._buf[cut:]
            return False
        at, block = found
        if at:
            out.append(self._buf[:at])
        self._buf = self._buf[at + len(block.open) :]
        self._state, self._block = "block", block
        return True

    def _scan_block(self, out: list[Piece]) -> bool:
        """Inside a call's markup: parses it once its closing marker arrives."""
        assert self._block is not None
        block = self._block
        if block.close is None:
            return False
        end = self._buf.find(block.close)
        if end < 0:
            return False
        body = self._buf[:end]
        raw = block.open + body + block.close
        self._buf = self._buf[end + len(block.close) :]
        pieces = self._parse_or_text(body, raw)
        self._calls += sum(isinstance(piece, ParsedCall) for piece in pieces)
        out.extend(pieces)
        self._state, self._block = "text", None
        return True

    def _parse_or_text(self, body: str, raw: str) -> list[Piece]:
        calls = _parse_block(self.family, body, raw)
        return list(calls) if calls else [raw]


# ---------------------------------------------------------------- parsing one call's markup
def _parse_block(family: Family, body: str, raw: str) -> list[ParsedCall]:
    if len(body) > MAX_CALL_CHARS:
        return []
    if family == "mistral":
        return _parse_mistral(body, raw)
    if family == "deepseek":
        return _parse_deepseek(body, raw)
    if family == "gemma":
        return _parse_python_calls(body, raw) or _calls_from_json(body, raw)
    if family == "llama3":  # after <|python_tag|>
        return _calls_from_json(body, raw) or _parse_python_calls(body, raw)
    return _calls_from_json(body, raw)


def _parse_bare(text: str, family: Family, tool_names: Collection[str]) -> list[Piece]:
    """A whole reply that may be a call: JSON (perhaps fenced) or, for Llama, a Python-style list."""
    if len(text) > MAX_CALL_CHARS:
        return []
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*\n?(.*?)\n?```", body, flags=re.DOTALL)
    if fenced:
        body = fenced.group(1)
    calls = _calls_from_json(body, text)
    if not calls and family == "llama3":
        calls = _parse_python_calls(body, text)
    if family == "json" and tool_names and any(call.name not in tool_names for call in calls):
        return []
    return list(calls)


def _json_values(text: str) -> list[Any] | None:
    """Every JSON value in ``text``, separated by whitespace, commas or semicolons; None unless the
    whole text is such values."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    at, end = 0, len(text)
    while True:
        while at < end and text[at] in " \t\r\n,;":
            at += 1
        if at >= end:
            return values or None
        try:
            value, at = decoder.raw_decode(text, at)
        except (json.JSONDecodeError, RecursionError):
            return None
        values.append(value)


def _calls_from_json(text: str, raw: str) -> list[ParsedCall]:
    values = _json_values(text.strip())
    if values is None:
        return []
    objects: list[Any] = []
    for value in values:
        if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
            objects.extend(value["tool_calls"])
        elif isinstance(value, list):
            objects.extend(value)
        else:
            objects.append(value)
    calls = [
        _call_from_object(obj, raw if len(objects) == 1 else json.dumps(obj, ensure_ascii=False)) for obj in objects
    ]
    if not calls or any(call is None for call in calls):
        return []
    return [call for call in calls if call is not None]


def _call_from_object(obj: Any, raw: str) -> ParsedCall | None:
    """``{"name", "arguments"|"parameters"}`` or OpenAI's ``{"function": {"name", "arguments"}}``."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments: Any = {}
    for key in ("arguments", "parameters", "args"):
        if key in obj:
            arguments = obj[key]
            break
    arguments = _arguments(arguments)
    if arguments is None:
        return None
    return ParsedCall(name, arguments, raw)


def _arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as a dict: an object, or a JSON string of one (OpenAI's wire shape); else None."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return None
    if value is None:
        return {}
    return value if isinstance(value, dict) else None


def _parse_mistral(body: str, raw: str) -> list[ParsedCall]:
    calls: list[ParsedCall] = []
    for part in body.split(MISTRAL_CALLS):
        part = part.strip()
        if not part:
            continue
        if "[ARGS]" in part:
            head, _, args_text = part.partition("[ARGS]")
            name = head.split("[CALL_ID]")[0].strip()
            arguments = _arguments(args_text.strip())
            if not name or arguments is None:
                return []
            calls.append(ParsedCall(name, arguments, MISTRAL_CALLS + part))
        else:
            found = _calls_from_json(part, MISTRAL_CALLS + part)
            if not found:
                return []
            calls.extend(found)
    if len(calls) == 1:
        calls[0] = ParsedCall(calls[0].name, calls[0].arguments, raw)
    return calls


_DS_CALL = re.compile(
    re.escape(DS_CALL_BEGIN) + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)" + re.escape(DS_CALL_END), re.DOTALL
)


def _parse_deepseek(body: str, raw: str) -> list[ParsedCall]:
    calls: list[ParsedCall] = []
    for match in _DS_CALL.finditer(body):
        head, rest = match.group(1).strip(), match.group(2)
        if head == "function":  # V3/R1: "function<sep>NAME\n```json\n{...}\n```"
            name, _, rest = rest.partition("\n")
        else:  # V3.1: "NAME<sep>{...}"
            name = head
        text = rest.strip()
        fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, flags=re.DOTALL)
        arguments = _arguments(fenced.group(1) if fenced else text)
        if not name.strip() or arguments is None:
            return []
        calls.append(ParsedCall(name.strip(), arguments, match.group(0)))
    if len(calls) == 1:
        calls[0] = ParsedCall(calls[0].name, calls[0].arguments, raw)
    return calls


def _parse_python_calls(body: str, raw: str) -> list[ParsedCall]:
    """``f(a=1)`` lines, or a list ``[f(a=1), g()]``: keyword arguments with literal values only."""
    try:
        tree = ast.parse(body.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    nodes: list[ast.expr] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            return []
        value = statement.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    calls: list[ParsedCall] = []
    for node in nodes:
        call = _python_call(node)
        if call is None:
            return []
        calls.append(ParsedCall(call[0], call[1], raw if len(nodes) == 1 else ast.unparse(node)))
    return calls


def _python_call(node: ast.expr) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted(node.func)
    if name is None:
        return None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
    return name, arguments


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


# ---------------------------------------------------------------- helpers
def _earliest(text: str, blocks: Iterable[_Block]) -> tuple[int, _Block] | None:
    best: tuple[int, _Block] | None = None
    for block in blocks:
        at = text.find(block.open)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, block)
    return best


def partial_suffix(text: str, markers: Iterable[str]) -> int:
    """The length of the longest end of ``text`` that is the start of a marker (held back).

    Args:
        text: the text decoded so far.
        markers: the markers a stream parser waits for.

    Returns:
        How many characters at the end of ``text`` may begin a marker (0 when none can).
    """
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


def _merge(pieces: list[Piece]) -> list[Piece]:
    """Joins adjacent text pieces and drops empty ones."""
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, str):
            if not piece:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += piece
                continue
        out.append(piece)
    return out


def parse_tool_calls(
    text: str, family: Family = "json", tool_names: Collection[str] = ()
) -> tuple[str, list[ParsedCall]]:
    """Parses a whole reply at once.

    Args:
        text: the reply.
        family: its call format.
        tool_names: the tools offered (see :class:`ToolCallParser`).

    Returns:
        The reply's text without the calls' markup, and the calls in order.
    """
    parser = ToolCallParser(family, tool_names)
    pieces = parser.feed(text) + parser.finish()
    return (
        "".join(piece for piece in pieces if isinstance(piece, str)),
        [piece for piece in pieces if isinstance(piece, ParsedCall)],
    )
