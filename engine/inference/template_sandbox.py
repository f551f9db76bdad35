"""The sandbox chat templates render in: transformers' Jinja dialect, a deadline and size limits.

A GGUF file's chat template comes from whoever published the file, so it is untrusted code. It is
rendered only in :class:`GuardedEnvironment`, a :class:`jinja2.sandbox.ImmutableSandboxedEnvironment`
subclass.

Contract: ARCHITECTURE.md, 'engine.inference.template_sandbox'.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

from engine.gguf import MAX_CHAT_TEMPLATE_BYTES

MAX_TEMPLATE_BYTES = MAX_CHAT_TEMPLATE_BYTES
"""Longest chat template (UTF-8 bytes) that is compiled; a longer one is refused (the GGUF reader keeps
no longer one either). Real templates are 1-17 KB."""

MAX_TEMPLATE_NODES = 16_384
"""Most syntax nodes a template may parse to (the largest known template has 1,286): checked before
Jinja generates code for it, which costs as much again as parsing."""

MAX_COMPILED_SOURCE = 320 << 10
"""Most Python source (characters) a template may compile to: real templates make under 5 characters
per template byte (55 KB for the largest known, 17 KB of template), so this admits any such template
under :data:`MAX_TEMPLATE_BYTES` and bounds what Python's compiler allocates (about 40 MiB)."""

MAX_RANGE = 100_000
"""Largest ``range()`` a template may create (the same cap as Jinja's own sandbox)."""

MAX_INT_ARG = 1_000_000
"""Largest integer argument a template may pass to a call or filter (``center(10**9)``...)."""

ALLOCATION_FACTOR = 64
"""A render may build at most this many times its size limit in all (strings, lists, joins)."""

MIN_SIZE_LIMIT = 1_000_000
"""Floor of the per-render size limit (characters or items); it grows with the input size."""

ITEM_COST = 16
"""What one item a template adds to its own list or dict counts for, in characters (a pointer and
its share of the container), so that appending one short string a million times is not free."""

_BIG_WIDTH = re.compile(r"\d{7,}")
_RESOLVED = re.compile(r"\bresolve\('(\w+)'\)")  # how Jinja's generated code reads a context variable

_CHECK_EVERY = 32
"""The deadline is read every this many sandbox hook calls (each takes microseconds)."""


class TemplateTimeout(SecurityError):
    """The render passed its deadline."""


class TemplateTooLarge(SecurityError):
    """The template, or the code it compiles to, is over its size limit."""


class TemplateRaised(Exception):
    """The template called ``raise_exception(message)``: it refuses the conversation."""


def _raise_exception(message: object) -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _identity(value: Any) -> Any:
    return value


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - jinja's names
    if n > 20 or max > 200:
        raise SecurityError("the chat template asked for too much lorem ipsum")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


def _json_default(value: Any) -> Any:
    if isinstance(value, Iterator):  # what map/select/reject return
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson (its arguments, in its order). A plain str, not Jinja's Markup: with
    # autoescape off nothing is escaped, but Markup + str escapes the str, so `'<|tag|>' + x|tojson`
    # would print `&lt;|tag|&gt;`.
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_json_default,
    )


class OwnedList(list[Any]):
    """A list the template built (a literal): the template may change it."""


class OwnedDict(dict[Any, Any]):
    """A dict the template built (a literal or ``dict()``): the template may change it."""


_GROWING = frozenset({"append", "extend", "insert", "update", "setdefault"})
_LIST_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort"})
_DICT_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear"})


class _TemplateNamespace(Namespace):
    """``namespace()``, refusing ``_``-prefixed attributes as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not store the attribute {name!r} on a namespace")


class GenerationTag(Extension):
    """transformers' ``{% generation %}...{% endgeneration %}``: marks the assistant's text for
    training masks; here its body renders as it is (a call block, scoped as transformers' is)."""

    tags = {"generation"}  # noqa: RUF012 - Jinja's Extension API

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


class _OwnLiterals(NodeTransformer):
    """Wraps each list and dict literal in ``environment.owned(...)`` (see :class:`OwnedList`)."""

    def visit_List(self, node: nodes.List) -> nodes.Node:
        return _owned(self.generic_visit(node))

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        return _owned(self.generic_visit(node))


def _owned(node: nodes.Node) -> nodes.Node:
    return nodes.Call(nodes.EnvironmentAttribute("owned"), [node], [], None, None, lineno=node.lineno)


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox in transformers' dialect, plus a deadline and size limits (see the
    module docstring)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(
            extensions=[GenerationTag, "jinja2.ext.loopcontrols", "jinja2.ext.do"],
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            autoescape=False,
        )
        # One render at a time per environment (render_guarded holds the lock), so plain attributes.
        self.lock = threading.Lock()
        self.deadline = float("inf")
        self.max_size = MIN_SIZE_LIMIT
        self._ticks = 0
        self.produced = 0
        self.globals["range"] = self._range
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["lipsum"] = _lipsum
        self.globals["dict"] = self._dict
        self.globals["namespace"] = _TemplateNamespace
        self.filters["tojson"] = _tojson
        self.filters["glassbox_size_guard"] = _identity
        # Wrap every filter and test so that each application checks the deadline and its arguments.
        self.filters = {name: self._guard_callable(fn) for name, fn in self.filters.items()}
        self.tests = {name: self._guard_callable(fn) for name, fn in self.tests.items()}

    # ---------------------------------------------------------------- checks
    def check(self) -> None:
        """Raise when the render in progress has passed its deadline."""
        self._ticks += 1
        if self._ticks % _CHECK_EVERY == 0 and time.monotonic() > self.deadline:
            raise TemplateTimeout("the chat template took too long to render")

    def _check_size(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple, dict)):
            self._count(len(value))
        return value

    def _count(self, size: int) -> None:
        """Refuse a value over the size limit, or a render that built too much in all."""
        if size > self.max_size:
            raise SecurityError(f"the chat template built a value of {size} items or characters")
        self.produced += size
        if self.produced > ALLOCATION_FACTOR * self.max_size:
            raise SecurityError(f"the chat template built more than {self.produced} characters in all")

    def _check_args(self, args: Iterable[Any]) -> None:
        for arg in args:
            if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_INT_ARG:
                raise SecurityError(f"the chat template passed an integer argument too large ({arg})")

    def _guard_callable(self, fn: Any) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.check()
            self._check_args(args[1:])
            self._check_args(kwargs.values())
            return self._check_size(fn(*args, **kwargs))

        # Keep jinja's pass_context / pass_environment markers working.
        guarded.__dict__.update(getattr(fn, "__dict__", {}))
        return guarded

    def guard_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``iterable``, checking the deadline before each item."""
        for item in iterable:
            self.check()
            yield item

    def _range(self, *args: int) -> Iterator[int]:
        self._check_args(args)
        numbers = range(*args)
        if len(numbers) > MAX_RANGE:
            raise SecurityError(f"the chat template asked for a range of {len(numbers)} items")
        return self.guard_iter(numbers)

    def owned(self, value: list[Any] | dict[Any, Any]) -> OwnedList | OwnedDict:
        """A list or dict literal, as a container the template may change."""
        self._count(len(value) * ITEM_COST)
        return OwnedDict(value) if isinstance(value, dict) else OwnedList(value)

    def _dict(self, *args: Any, **kwargs: Any) -> OwnedDict:
        made = OwnedDict(*args, **kwargs)
        self._count(len(made) * ITEM_COST)
        return made

    # ---------------------------------------------------------------- sandbox hooks
    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        owned = _LIST_MUTATORS if isinstance(obj, OwnedList) else _DICT_MUTATORS if isinstance(obj, OwnedDict) else ()
        if attr in owned:  # the template's own container: only the plain sandbox's rules
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)

    # Reads need no size check: every value a template builds was checked when it was built.
    def getattr(self, obj: Any, attribute: str) -> Any:
        self.check()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.check()
        return super().getitem(obj, argument)

    def guard_concat(self, *parts: Any) -> str:
        """The ``~`` operator, refusing a result over the size limit before building it."""
        texts = [str(part) for part in parts]
        self._count(sum(map(len, texts)))
        return "".join(texts)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self.check()
        if getattr(__obj, "__self__", None) is __self:
            # Our own guards (range, loops, ~, owned) check their arguments and results themselves.
            return __context.call(__obj, *args, **kwargs)
        __self._check_args(args)
        __self._check_args(kwargs.values())
        if isinstance(__obj, LoopContext) and args:
            # A recursive loop's `loop(children)` iterates its argument outside the rewritten For.
            args = (__self.guard_iter(args[0]), *args[1:])
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, OwnedList | OwnedDict) and getattr(__obj, "__name__", "") in _GROWING:
            return __self._grow(owner, __context, __obj, args, kwargs)
        return __self._check_size(super().call(__context, __obj, *args, **kwargs))

    def _grow(self, owner: OwnedList | OwnedDict, context: Any, method: Any, args: Any, kwargs: Any) -> Any:
        """Call a method that adds to the template's own container, counting what it added."""
        room = self.max_size // ITEM_COST - len(owner)
        if getattr(method, "__name__", "") == "extend" and args and isinstance(args[0], Iterable):
            # Read what is added first, bounded: `xs.extend(xs)` must not iterate the list it grows.
            items = []
            for item in self.guard_iter(args[0]):
                items.append(item)
                if len(items) > room:
                    raise SecurityError(f"the chat template grew a list past {self.max_size // ITEM_COST} items")
            args = (items, *args[1:])
        before = len(owner)
        result = super().call(context, method, *args, **kwargs)
        if len(owner) * ITEM_COST > self.max_size:
            owner.clear()
            raise SecurityError(f"the chat template grew a list or dict past {self.max_size // ITEM_COST} items")
        self._count(max(len(owner) - before, 1) * ITEM_COST)
        return result

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # Jinja returns a silent Undefined here, so `{{ x.__class__ }}` would print nothing and the
        # template would pass; refusing outright lets select_template() reject it with a reason.
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        f_self = getattr(value, "__self__", None)
        if isinstance(f_self, str) and _BIG_WIDTH.search(f_self):
            raise SecurityError("the chat template used a huge format width")
        return super().wrap_str_format(value)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.check()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    self._count(max(len(seq) * times, 0))
        elif operator == "**":
            if (
                isinstance(right, int | float)
                and abs(right) > 64
                and not (isinstance(left, int | float) and abs(left) <= 1)
            ):
                raise SecurityError("the chat template tried to compute a huge power")
        elif operator == "%":
            if isinstance(left, str) and _BIG_WIDTH.search(left):
                raise SecurityError("the chat template used a huge format width")
            self._check_args(right if isinstance(right, tuple) else (right,))
        elif operator == "+":
            self._count(_seq_len(left) + _seq_len(right))
            return left + right
        return super().call_binop(context, operator, left, right)

    # ---------------------------------------------------------------- compiling
    def parse_guarded(self, source: str) -> nodes.Template:
        """Parse ``source`` within the size limits (without rewriting it).

        Raises:
            TemplateTooLarge: over :data:`MAX_TEMPLATE_BYTES`, or more than :data:`MAX_TEMPLATE_NODES` nodes.
            jinja2.TemplateSyntaxError, RecursionError: the template does not parse.
        """
        size = template_size(source)
        if size > MAX_TEMPLATE_BYTES:
            raise TemplateTooLarge(f"it is {size} bytes, over the {MAX_TEMPLATE_BYTES}-byte limit for a chat template")
        tree = self.parse(source)
        n_nodes = sum(1 for _ in tree.find_all(nodes.Node))
        if n_nodes > MAX_TEMPLATE_NODES:
            raise TemplateTooLarge(f"it parses to {n_nodes} syntax nodes, over the {MAX_TEMPLATE_NODES} limit")
        return tree

    def compile_guarded(self, source: str | nodes.Template) -> jinja2.Template:
        """:meth:`compile_reading`'s template."""
        return self.compile_reading(source)[0]

    def compile_reading(self, source: str | nodes.Template) -> tuple[jinja2.Template, frozenset[str]]:
        """Compile ``source`` (text, or a tree from :meth:`parse_guarded`, which this rewrites),
        wrapping loops in :meth:`guard_iter`, ``~`` in :meth:`guard_concat` and literals in :meth:`owned`.
        Returns the template and the names it looks up in its context (its inputs, and some of its
        own variables: Jinja resolves a variable set in a block from the context first).

        ``environment.guard_*`` cannot be shadowed by a template variable, and the call goes
        through :meth:`call`, so it is deadline-checked too.

        Raises:
            TemplateTooLarge: ``source`` is over :data:`MAX_TEMPLATE_BYTES`, parses to more than
                :data:`MAX_TEMPLATE_NODES` nodes, or compiles to more than :data:`MAX_COMPILED_SOURCE`
                characters of Python (each checked before the next, costlier, step).
            jinja2.TemplateSyntaxError, RecursionError: the template does not parse.
        """
        tree = self.parse_guarded(source) if isinstance(source, str) else source
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(
                nodes.EnvironmentAttribute("guard_iter"), [loop.iter], [], None, None, lineno=loop.lineno
            )
        for block in tree.find_all(nodes.AssignBlock):
            # `{% set x %}...{% endset %}` captures output without any hook: size-check the capture.
            if block.filter is None:
                block.filter = nodes.Filter(None, "glassbox_size_guard", [], [], None, None, lineno=block.lineno)
        for concat in tree.find_all(nodes.Concat):
            concat.nodes = [
                nodes.Call(
                    nodes.EnvironmentAttribute("guard_concat"),
                    concat.nodes,
                    [],
                    None,
                    None,
                    lineno=concat.lineno,
                )
            ]
        tree = _OwnLiterals().visit(tree)
        # What from_string does, with the generated code's size checked before Python compiles it.
        python_source = self.compile(tree, raw=True)
        if len(python_source) > MAX_COMPILED_SOURCE:
            raise TemplateTooLarge(
                f"it compiles to {len(python_source)} characters of code, over the {MAX_COMPILED_SOURCE} limit"
            )
        code = compile(python_source, "<template>", "exec")
        template = self.template_class.from_code(self, code, self.make_globals(None), None)
        return template, frozenset(_RESOLVED.findall(python_source))

    def render_guarded(self, template: jinja2.Template, context: dict[str, Any], timeout_s: float) -> str:
        """Render ``template`` with a deadline ``timeout_s`` from now and the size limits."""
        input_size = sum(len(m.get("content") or "") for m in context.get("messages", ()))
        input_size += len(json.dumps(context["tools"])) if context.get("tools") else 0  # a server's many tools
        with self.lock:
            self.max_size = MIN_SIZE_LIMIT + 4 * input_size
            self.deadline = time.monotonic() + timeout_s
            self.produced = 0
            try:
                parts: list[str] = []
                total = 0
                for chunk in template.generate(context):
                    self.check()
                    total += len(chunk)
                    if total > self.max_size:
                        raise SecurityError(f"the chat template produced more than {self.max_size} characters")
                    parts.append(chunk)
                return "".join(parts)
            finally:
                self.deadline = float("inf")


def template_size(template: str) -> int:
    """A template's size in UTF-8 bytes (an ASCII one is measured without being copied)."""
    return len(template) if template.isascii() else len(template.encode("utf-8", errors="replace"))


def _seq_len(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def describe(exc: BaseException) -> str:
    """One line describing why a template failed."""
    if isinstance(exc, (TemplateTimeout, TemplateTooLarge)):
        return str(exc)
    if isinstance(exc, TemplateRaised):
        return f"the template refused the conversation: {exc}"
    if isinstance(exc, SecurityError):
        return f"unsafe operation blocked by the sandbox: {exc}"
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"syntax error on line {exc.lineno}: {exc.message}"
    if isinstance(exc, RecursionError):
        return "the template recursed too deeply"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
