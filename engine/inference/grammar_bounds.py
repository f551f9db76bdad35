"""What a reply's grammar or JSON schema may cost, checked before llama.cpp (or the converter) sees it.

Contract: ARCHITECTURE.md, 'engine.inference.grammar_bounds'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine.errors import EngineError

__all__ = [
    "MAX_GRAMMAR_ALTERNATIVES",
    "MAX_GRAMMAR_CHARS",
    "MAX_GRAMMAR_EXPANSION",
    "MAX_GRAMMAR_NESTING",
    "MAX_GRAMMAR_RULES",
    "MAX_SCHEMA_CHOICES",
    "MAX_SCHEMA_REPETITION",
    "MAX_SCHEMA_TOTAL",
    "check_constraint",
    "check_grammar",
    "check_json_schema",
    "describe_parse_error",
]

#: The longest grammar, in characters (a converted schema's included).
MAX_GRAMMAR_CHARS = 256 * 1024
#: The deepest nesting of groups (llama.cpp parses them recursively; 4,000 overflow a 1 MiB stack).
MAX_GRAMMAR_NESTING = 1024
#: The most alternatives (``|``) of one rule or group.
MAX_GRAMMAR_ALTERNATIVES = 512
#: The most rules llama.cpp makes of a grammar, each repetition expanded into its rules.
MAX_GRAMMAR_RULES = 200_000
#: The longest text a grammar may describe with its counted repetitions written out and every rule
#: reference expanded in place (what repetitions nested through rules multiply).
MAX_GRAMMAR_EXPANSION = 2_000_000
#: llama.cpp's own bound on one repetition (``MAX_REPETITION_THRESHOLD``): more is refused, more
#: as an upper bound means "no upper bound".
LLAMA_MAX_REPETITION = 2000

#: The largest ``minLength``/``maxLength``/``minItems``/``maxItems`` (and pattern repetition) of a schema.
MAX_SCHEMA_REPETITION = 1000
#: The most entries of one ``enum``, ``anyOf``, ``oneOf``, ``prefixItems`` or ``properties``.
MAX_SCHEMA_CHOICES = 256
#: The most repetitions and choices of a whole schema, added up.
MAX_SCHEMA_TOTAL = 20_000


def check_constraint(params: Any) -> None:
    """Checks a reply's ``grammar`` or ``json_schema`` (GenerationParams, duck-typed) against the limits.

    Raises:
        EngineError: ``grammar: ...`` or ``json_schema: ...``, one line naming the limit.
    """
    if getattr(params, "grammar", None) is not None:
        check_grammar(params.grammar)
    if getattr(params, "json_schema", None) is not None:
        check_json_schema(params.json_schema)


# ---------------------------------------------------------------------- JSON schemas


def check_json_schema(text: str) -> None:
    """Refuses a JSON schema whose grammar would be too large to build or to run.

    Raises:
        EngineError: ``json_schema: ...`` naming the keyword, where it is and the limit.
    """
    # lazy: start-up (+7 ms)
    from engine.inference.tool_schema import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, schema_depth, subschemas

    if len(text) > MAX_SCHEMA_BYTES:
        raise EngineError(f"json_schema: it is {len(text):,} characters (the limit is {MAX_SCHEMA_BYTES:,})")
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError):
        raise EngineError("json_schema: it is not valid JSON") from None
    if not isinstance(schema, dict):
        return
    if schema_depth(schema) > MAX_SCHEMA_DEPTH:
        raise EngineError(f"json_schema: it is nested more than {MAX_SCHEMA_DEPTH} levels deep")
    total = 0
    for where, node in subschemas(schema):
        at = f" at {where.lstrip('/').replace('/', '.')}" if where else ""
        for keyword in ("minLength", "maxLength", "minItems", "maxItems"):
            value = node.get(keyword)
            if isinstance(value, int) and not isinstance(value, bool):
                if value > MAX_SCHEMA_REPETITION:
                    raise EngineError(
                        f"json_schema: {keyword} {value:,}{at} is more than a grammar can enforce here "
                        f"(the limit is {MAX_SCHEMA_REPETITION:,})"
                    )
                total += max(value, 0)
        for keyword in ("enum", "anyOf", "oneOf", "prefixItems", "properties"):
            value = node.get(keyword)
            if isinstance(value, (list, dict)):
                if len(value) > MAX_SCHEMA_CHOICES:
                    raise EngineError(
                        f"json_schema: {keyword}{at} has {len(value):,} entries (the limit is {MAX_SCHEMA_CHOICES:,})"
                    )
                total += len(value)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            cost = _pattern_cost(pattern)
            if cost > MAX_SCHEMA_REPETITION:
                raise EngineError(
                    f"json_schema: the pattern{at} repeats {cost:,} times in all, more than a grammar can enforce "
                    f"here (the limit is {MAX_SCHEMA_REPETITION:,})"
                )
            total += cost
        if total > MAX_SCHEMA_TOTAL:
            raise EngineError(
                f"json_schema: its lengths, counts and choices add up to more than {MAX_SCHEMA_TOTAL:,} "
                "(the limit of one schema)"
            )


def _pattern_cost(pattern: str) -> int:
    """How many atoms a pattern's grammar holds once its counted repetitions are written out:
    atoms add up, a repetition ``{m,n}`` multiplies what it repeats by its bound (``*``, ``+``
    and ``?`` do not). Linear, forgiving: it bounds, it does not validate."""
    groups: list[int] = [0]
    last = 0  # the cost of the atom or group a quantifier would apply to
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            last = 1
            groups[-1] += 1
            continue
        if ch == "[":
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            last = 1
            groups[-1] += 1
            continue
        if ch == "(":
            groups.append(0)
            i += 1
            continue
        if ch == ")":
            inner = groups.pop() if len(groups) > 1 else 0
            groups[-1] += inner
            last = inner
            i += 1
            continue
        if ch == "{":
            j = pattern.find("}", i)
            numbers = pattern[i + 1 : j].split(",") if j > 0 else []
            if j > 0 and numbers and all(part.strip().isdigit() or not part.strip() for part in numbers):
                bound = max((int(part) for part in numbers if part.strip()), default=1)
                groups[-1] += last * (bound - 1)  # the atom itself was counted once already
                last *= bound
                i = j + 1
                continue
        if ch not in "*+?|^$":
            last = 1
            groups[-1] += 1
        i += 1
    return sum(groups)


# ---------------------------------------------------------------------- GBNF


class _ParseError(Exception):
    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.message = message
        self.at = at


# A rule's shape, built as it is parsed, for the length of the longest text it describes:
# ("n", length) an atom; ("ref", name); ("seq", [nodes]); ("alt", [nodes]); ("rep", node, times).
_Node = tuple[Any, ...]


def _cap(value: int) -> int:
    return min(value, MAX_GRAMMAR_EXPANSION + 1)


@dataclass
class _Group:
    """A group (or a rule's body) being parsed."""

    nested: bool
    start: int
    alternatives: list[_Node] = field(default_factory=list)  # the alternatives closed so far
    sequence: list[_Node] = field(default_factory=list)  # the current alternative's items
    has_last: bool = False  # whether a repetition has an item to apply to (the sequence's last)
    last_rules: int = 1  # llama.cpp's n_prev_rules for that item
    symbols_at_start: int = 0


class _Parser:
    """llama.cpp's GBNF parser (src/llama-grammar.cpp), iterative, measuring what it would build."""

    def __init__(self, text: str) -> None:
        self.src = text
        self.n = len(text)
        self.rules: dict[str, _Node] = {}
        self.referenced: dict[str, int] = {}  # rule name -> where it is first referenced
        self.symbols = 0  # the symbols llama.cpp makes (named rules, groups, repetitions)
        self.names: set[str] = set()
        self.depth = 0

    def _name_seen(self, name: str) -> None:
        if name not in self.names:  # llama.cpp gives a name its symbol when it first sees it
            self.names.add(name)
            self.symbols += 1

    def char(self, pos: int) -> str:
        return self.src[pos] if pos < self.n else ""

    def space(self, pos: int, newline_ok: bool) -> int:
        src, n = self.src, self.n
        while pos < n:
            ch = src[pos]
            if ch == "#":
                while pos < n and src[pos] not in "\r\n":
                    pos += 1
            elif ch in " \t" or (newline_ok and ch in "\r\n"):
                pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while end < self.n and _is_word_char(self.src[end]):
            end += 1
        if end == pos:
            raise _ParseError("expecting name", pos)
        return end

    def integer(self, pos: int) -> tuple[int, int]:
        end = pos
        while end < self.n and self.src[end].isascii() and self.src[end].isdigit():
            end += 1
        if end == pos:
            raise _ParseError("expecting integer", pos)
        if end - pos > 18:
            raise _ParseError("a repetition count is too large", pos)
        return int(self.src[pos:end]), end

    def parse_char(self, pos: int) -> int:
        src = self.src
        if pos >= self.n:
            raise _ParseError("unexpected end of input", pos)
        if src[pos] != "\\":
            return pos + 1
        escape = self.char(pos + 1)
        sizes = {"x": 2, "u": 4, "U": 8}
        if escape in sizes:
            size = sizes[escape]
            digits = src[pos + 2 : pos + 2 + size]
            if len(digits) != size or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise _ParseError(f"expecting {size} hex chars", pos + 2)
            return pos + 2 + size
        if escape and escape in 'trn\\"[]-':
            return pos + 2
        raise _ParseError("unknown escape", pos)

    def parse(self) -> None:
        pos = self.space(0, True)
        while pos < self.n:
            pos = self.rule(pos)
        for name, at in self.referenced.items():
            if name not in self.rules:
                raise _ParseError(f"Undefined rule identifier '{name}'", at)
        if "root" not in self.rules:
            raise _ParseError("there is no rule named root (the reply starts at root ::= ...)", 0)

    def rule(self, pos: int) -> int:
        name_end = self.name(pos)
        name = self.src[pos:name_end]
        pos = self.space(name_end, False)
        if self.src[pos : pos + 3] != "::=":
            raise _ParseError("expecting ::=", pos)
        pos = self.space(pos + 3, True)
        self._name_seen(name)
        pos, form = self.alternates(pos)
        self.rules[name] = form  # as in llama.cpp, a later definition replaces an earlier one
        ch = self.char(pos)
        if ch == "\r":
            pos += 2 if self.char(pos + 1) == "\n" else 1
        elif ch == "\n":
            pos += 1
        elif ch:
            raise _ParseError("expecting newline or end", pos)
        return self.space(pos, True)

    def alternates(self, pos: int) -> tuple[int, _Node]:
        """One rule's body: sequences, ``|``, and groups nested to any depth, on an explicit stack."""
        stack = [_Group(nested=False, start=pos)]
        while True:
            group = stack[-1]
            pos = self.sequence(pos, group, stack)
            top = stack[-1]
            if top is not group:
                continue  # a group opened: parse inside it
            if self.char(pos) == "|":
                if len(group.alternatives) + 2 > MAX_GRAMMAR_ALTERNATIVES:  # the closed ones, this, the next
                    raise _ParseError(
                        f"more than {MAX_GRAMMAR_ALTERNATIVES:,} alternatives in one rule or group "
                        f"(the limit is {MAX_GRAMMAR_ALTERNATIVES:,})",
                        pos,
                    )
                group.alternatives.append(("seq", group.sequence))
                group.sequence, group.has_last = [], False
                pos = self.space(pos + 1, True)
                continue
            group.alternatives.append(("seq", group.sequence))
            body: _Node = ("alt", group.alternatives)
            if not group.nested:
                return pos, body
            if self.char(pos) != ")":
                raise _ParseError("expecting ')'", pos)
            stack.pop()
            self.depth -= 1
            parent = stack[-1]
            parent.sequence.append(body)
            parent.has_last = True
            parent.last_rules = max(1, self.symbols - group.symbols_at_start)
            pos = self.space(pos + 1, parent.nested)

    def sequence(self, pos: int, group: _Group, stack: list[_Group]) -> int:
        """Items of one alternative until its end, or until a group opens (pushed on ``stack``)."""
        src = self.src
        while pos < self.n:
            ch = src[pos]
            if ch == '"':
                start = pos
                pos += 1
                count = 0
                while self.char(pos) != '"':
                    if pos >= self.n:
                        raise _ParseError("unexpected end of input", start)
                    pos = self.parse_char(pos)
                    count += 1
                pos = self.space(pos + 1, group.nested)
                self._item(group, ("n", count) if count else None)
            elif ch == "[":
                start = pos
                pos += 1
                if self.char(pos) == "^":
                    pos += 1
                empty = True
                while self.char(pos) != "]":
                    if pos >= self.n:
                        raise _ParseError("unexpected end of input", start)
                    pos = self.parse_char(pos)
                    empty = False
                    if self.char(pos) == "-" and self.char(pos + 1) != "]":
                        if pos + 1 >= self.n:
                            raise _ParseError("unexpected end of input", start)
                        pos = self.parse_char(pos + 1)
                pos = self.space(pos + 1, group.nested)
                self._item(group, None if empty else ("n", 1))
            elif ch in "<!":
                pos = self.token(pos + 1 if ch == "!" else pos)
                pos = self.space(pos, group.nested)
                self._item(group, ("n", 1))
            elif _is_word_char(ch):
                end = self.name(pos)
                name = src[pos:end]
                self.referenced.setdefault(name, pos)
                self._name_seen(name)
                pos = self.space(end, group.nested)
                self._item(group, ("ref", name))
            elif ch == "(":
                self.depth += 1
                if self.depth > MAX_GRAMMAR_NESTING:
                    raise _ParseError(f"groups nested {self.depth:,} deep (the limit is {MAX_GRAMMAR_NESTING:,})", pos)
                self.symbols += 1
                inner = _Group(nested=True, start=pos, symbols_at_start=self.symbols - 1)
                stack.append(inner)
                return self.space(pos + 1, True)
            elif ch == ".":
                pos = self.space(pos + 1, group.nested)
                self._item(group, ("n", 1))
            elif ch in "*+?":
                at = pos
                pos = self.space(pos + 1, group.nested)
                low, high = _OPERATORS[ch]
                self._repeat(group, low, high, at)
            elif ch == "{":
                at = pos
                pos = self.space(pos + 1, group.nested)
                if not (self.char(pos).isascii() and self.char(pos).isdigit()):
                    raise _ParseError("expecting an int", pos)
                low, pos = self.integer(pos)
                pos = self.space(pos, group.nested)
                if self.char(pos) == "}":
                    high = low
                    pos = self.space(pos + 1, group.nested)
                elif self.char(pos) == ",":
                    pos = self.space(pos + 1, group.nested)
                    high = None
                    if self.char(pos).isascii() and self.char(pos).isdigit():
                        high, pos = self.integer(pos)
                        pos = self.space(pos, group.nested)
                    if self.char(pos) != "}":
                        raise _ParseError("expecting '}'", pos)
                    pos = self.space(pos + 1, group.nested)
                else:
                    raise _ParseError("expecting ','", pos)
                if low > LLAMA_MAX_REPETITION:
                    raise _ParseError(
                        f"a repetition of {low:,} (the limit is {LLAMA_MAX_REPETITION:,}, llama.cpp's)", at
                    )
                if high is not None and high > LLAMA_MAX_REPETITION:
                    high = None  # llama.cpp: no upper bound
                self._repeat(group, low, high, at)
            else:
                break
        return pos

    def token(self, pos: int) -> int:
        if self.char(pos) != "<":
            raise _ParseError("expecting '<'", pos)
        pos += 1
        if self.char(pos) == "[":
            value, pos = self.integer(pos + 1)
            if value > 0xFFFFFFFF:
                raise _ParseError("parsed token id is too big", pos)
            if self.char(pos) != "]":
                raise _ParseError("expecting ']'", pos)
            if self.char(pos + 1) != ">":
                raise _ParseError("expecting '>'", pos + 1)
            return pos + 2
        end = self.src.find(">", pos)
        if end < 0:
            raise _ParseError("expecting '>'", self.n)
        return end + 1  # whether it is one token of the vocabulary, llama.cpp says

    def _item(self, group: _Group, node: _Node | None) -> None:
        if node is not None:
            group.sequence.append(node)
        group.has_last = node is not None  # an empty literal or class leaves nothing to repeat
        group.last_rules = 1

    def _repeat(self, group: _Group, low: int, high: int | None, at: int) -> None:
        if not group.has_last:
            raise _ParseError("expecting preceding item to */+/?/{", at)
        total = high if high is not None and high > 0 else max(low, 1)
        if group.last_rules * total > LLAMA_MAX_REPETITION:
            raise _ParseError(
                f"a repetition of {total:,} of an item that holds {group.last_rules:,} rules "
                f"(their product is over {LLAMA_MAX_REPETITION:,}, llama.cpp's limit)",
                at,
            )
        self.symbols += 1 if high is None else high - low
        if self.symbols > MAX_GRAMMAR_RULES:
            raise _ParseError(
                f"its repetitions make more than {MAX_GRAMMAR_RULES:,} rules (the limit is {MAX_GRAMMAR_RULES:,})", at
            )
        # The longest text: a bounded repetition writes its item out ``high`` times, an open one is
        # counted as its minimum and once more.
        times = (low + 1) if high is None else high
        if times == 0:  # x{0}: gone, nothing left to repeat
            group.sequence.pop()
            group.has_last = False
        else:
            group.sequence[-1] = ("rep", group.sequence[-1], times)
        group.last_rules *= total


_OPERATORS: dict[str, tuple[int, int | None]] = {"*": (0, None), "+": (1, None), "?": (0, 1)}


def _is_word_char(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "-")


def _longest(rules: dict[str, _Node]) -> int:
    """The length of the longest text ``root`` describes, every reference expanded in place (a
    reference back to a rule on the way counts 1), counted repetitions written out, saturating just
    above :data:`MAX_GRAMMAR_EXPANSION`. Iterative: no grammar can overflow the stack here."""
    done: dict[str, int] = {}
    on_path: set[str] = set()
    stack: list[tuple[str, bool]] = [("root", False)]
    while stack:
        name, ready = stack.pop()
        if name in done:
            continue
        if not ready:
            on_path.add(name)
            stack.append((name, True))
            stack.extend((ref, False) for ref in _refs(rules[name]) if ref not in done and ref not in on_path)
            continue
        done[name] = max(_evaluate(rules[name], done), 1)
        on_path.discard(name)
    return done.get("root", 1)


def _refs(node: _Node) -> list[str]:
    found: list[str] = []
    stack = [node]
    while stack:
        item = stack.pop()
        kind = item[0]
        if kind == "ref":
            found.append(item[1])
        elif kind in ("seq", "alt"):
            stack.extend(item[1])
        elif kind == "rep":
            stack.append(item[1])
    return found


def _evaluate(node: _Node, done: dict[str, int]) -> int:
    """The longest text of one rule's tree, its references' lengths known (or 1: on the way)."""
    values: dict[int, int] = {}
    stack: list[tuple[_Node, bool]] = [(node, False)]
    while stack:
        item, ready = stack.pop()
        kind = item[0]
        if kind == "n":
            values[id(item)] = item[1]
        elif kind == "ref":
            values[id(item)] = done.get(item[1], 1)
        elif not ready:
            stack.append((item, True))
            children = item[1] if kind in ("seq", "alt") else [item[1]]
            stack.extend((child, False) for child in children)
        elif kind == "seq":
            values[id(item)] = _cap(sum(values[id(child)] for child in item[1]))
        elif kind == "alt":
            values[id(item)] = max((values[id(child)] for child in item[1]), default=0)
        else:  # rep
            values[id(item)] = _cap(values[id(item[1])] * item[2])
    return values[id(node)]


def _where(text: str, at: int) -> str:
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return f"line {line}, column {column}"


def check_grammar(text: str, what: str = "grammar") -> None:
    """Parses GBNF as llama.cpp does and refuses it when it is invalid or over a limit.

    Args:
        text: the grammar.
        what: the field it came from, for the message (``grammar``, or ``json_schema`` for a
            converted schema).

    Raises:
        EngineError: ``<what>: <reason> at line L, column C``, one line.
    """
    if not text.strip():
        raise EngineError(f"{what}: it is empty")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise EngineError(f"{what}: it is {len(text):,} characters (the limit is {MAX_GRAMMAR_CHARS:,})")
    if "\x00" in text:
        raise EngineError(f"{what}: it holds a NUL character at {_where(text, text.index(chr(0)))}")
    parser = _Parser(text)
    try:
        parser.parse()
    except _ParseError as exc:
        raise EngineError(f"{what}: {exc.message} at {_where(text, exc.at)}") from None
    if _longest(parser.rules) > MAX_GRAMMAR_EXPANSION:
        raise EngineError(
            f"{what}: its counted repetitions, nested through rules, describe texts longer than "
            f"{MAX_GRAMMAR_EXPANSION:,} characters (the limit is {MAX_GRAMMAR_EXPANSION:,}); no reply is that long, "
            "and checking such a grammar holds the model for minutes a token"
        )


def describe_parse_error(captured: str, grammar: str) -> str | None:
    """llama.cpp's reason for refusing ``grammar``, from what it wrote on stderr, in one line.

    llama.cpp writes ``parse: error parsing grammar: <reason>`` followed by the whole grammar, and
    a reason ending in ``at <the rest of the grammar>``: that rest becomes a line and column.
    Other refusals (no root rule, left recursion) are its log lines. None when it said nothing.
    """
    marker = "error parsing grammar: "
    start = captured.find(marker)
    if start >= 0:
        reason = captured[start + len(marker) :]
        tail = f"\n\n{grammar}\n"
        end = reason.rfind(tail)
        if end >= 0:
            reason = reason[:end]
        cut = reason.find(" at ")  # llama.cpp's reasons hold no " at " before the one that quotes the rest
        rest = reason[cut + 4 :] if cut >= 0 else ""
        if rest and grammar.endswith(rest):
            return f"{reason[:cut]} at {_where(grammar, len(grammar) - len(rest))}"
        if cut >= 0 and not rest:
            return f"{reason[:cut]} at the end"
        return " ".join(reason.split())[:300]
    lines = [" ".join(line.split()) for line in captured.splitlines() if "grammar" in line.lower()]
    return lines[-1][:300] if lines else None
