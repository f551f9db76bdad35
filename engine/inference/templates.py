"""Chat templates: the model's own (sandboxed, time-limited Jinja) or a known fallback.

A GGUF file may carry a Jinja chat template (``tokenizer.chat_template``). That text comes from
whoever published the file, so it is untrusted code. It is rendered only in a
:class:`jinja2.sandbox.ImmutableSandboxedEnvironment` subclass that also enforces a deadline and size
limits:

* every attribute access, item access, call, filter, intercepted operator and loop step checks the
  deadline (loops are guarded by rewriting each ``{% for %}``'s iterable in the parsed template, so
  even empty nested loops over long strings are stopped);
* ``range`` is replaced by a lazy, deadline-checked, capped range, and ``lipsum`` is capped;
* ``*``, ``+`` and ``~`` count the size of what they would build *before* building it, and so do
  filter and call results, ``{% set %}...{% endset %}`` captures and the output: one value may not
  exceed the size limit (1M characters or items, plus 4x the conversation's size) and one render
  may not build more than :data:`ALLOCATION_FACTOR` times that in all;
* huge powers, format widths of 7+ digits and integer call arguments above :data:`MAX_INT_ARG`
  (``"x"|center(10**9)``) are refused;
* attribute access that the sandbox deems unsafe raises at once (Jinja would print an empty
  Undefined), so a template probing for an escape is rejected rather than half-rendered.

Compiling is bounded too, since it runs in the app's own process: a template over
:data:`MAX_TEMPLATE_BYTES` (real ones are 1-17 KB) is refused before it is parsed, one that parses to
more than :data:`MAX_TEMPLATE_NODES` nodes before Jinja generates code for it, and one that would make
Jinja generate more than :data:`MAX_COMPILED_SOURCE` characters of Python before Python compiles it
(Python's compiler takes about 130 bytes of memory per character: a 1 MiB template made the app
peak above 1 GB).

:func:`select_template` test-renders the GGUF template once on a small conversation. A syntax
error, a sandbox violation, a timeout, an exception or an output that does not contain the messages
makes it fall back to a format chosen from the template's own markers or, failing that, the
architecture; :attr:`ChatTemplate.reason` says which and why.

The rendered prompt includes the BOS token text where the format starts with it (as the GGUF
templates do), so tokenize it with ``special=True`` and without adding another BOS when
``prompt.startswith(bos_token)``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum

from engine.errors import TemplateError
from engine.gguf import MAX_CHAT_TEMPLATE_BYTES
from engine.inference.harmony import is_harmony
from engine.inference.reasoning import EFFORTS, detect_thinking, thinking_controls
from engine.inference.tool_calls import Family, detect_family
from engine.inference.tool_prompt import (
    choice_note,
    fold_tools,
    has_tool_parts,
    keeps_tools,
    template_message,
    tool_entries,
    with_note,
)
from engine.inference.tools import ToolSpec

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

_BIG_WIDTH = re.compile(r"\d{7,}")

_SAMPLE_SYSTEM = "You are a helpful assistant."
_SAMPLE_TURNS = (
    {"role": "user", "content": "Hello there, who are you?"},
    {"role": "assistant", "content": "I am an assistant. How can I help?"},
    {"role": "user", "content": "What is two plus two?"},
)

FallbackName = Literal["chatml", "gemma", "llama3", "mistral", "phi3", "plain"]


class _TemplateTimeout(SecurityError):
    """The render passed its deadline."""


class _TemplateTooLarge(SecurityError):
    """The template, or the code it compiles to, is over its size limit."""


class _TemplateRaised(Exception):
    """The template called ``raise_exception(message)``."""


def _raise_exception(message: object) -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _identity(value: Any) -> Any:
    return value


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - jinja's names
    if n > 20 or max > 200:
        raise SecurityError("the chat template asked for too much lorem ipsum")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # The Hugging Face flavour of tojson (its arguments, in its order), which chat templates rely on.
    # A plain str, not Jinja's Markup: with autoescape off nothing is escaped, but Markup + str
    # escapes the str, so `'<|tag|>' + x|tojson` would print `&lt;|tag|&gt;`.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_CHECK_EVERY = 32
"""The deadline is read every this many sandbox hook calls (each takes microseconds)."""


class _GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus a deadline and size limits (see the module docstring)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(
            extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"],
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
            raise _TemplateTimeout("the chat template took too long to render")

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

    # ---------------------------------------------------------------- sandbox hooks
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
            # Our own guards (range, loops, ~) check their arguments and results themselves.
            return __context.call(__obj, *args, **kwargs)
        __self._check_args(args)
        __self._check_args(kwargs.values())
        if isinstance(__obj, LoopContext) and args:
            # A recursive loop's `loop(children)` iterates its argument outside the rewritten For.
            args = (__self.guard_iter(args[0]), *args[1:])
        return __self._check_size(super().call(__context, __obj, *args, **kwargs))

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
    def compile_guarded(self, source: str) -> jinja2.Template:
        """Parse ``source``, wrapping loops in :meth:`guard_iter` and ``~`` in :meth:`guard_concat`.

        ``environment.guard_*`` cannot be shadowed by a template variable, and the call goes
        through :meth:`call`, so it is deadline-checked too.

        Raises:
            _TemplateTooLarge: ``source`` is over :data:`MAX_TEMPLATE_BYTES`, parses to more than
                :data:`MAX_TEMPLATE_NODES` nodes, or compiles to more than :data:`MAX_COMPILED_SOURCE`
                characters of Python (each checked before the next, costlier, step).
            jinja2.TemplateSyntaxError, RecursionError: the template does not parse.
        """
        size = template_size(source)
        if size > MAX_TEMPLATE_BYTES:
            raise _TemplateTooLarge(f"it is {size} bytes, over the {MAX_TEMPLATE_BYTES}-byte limit for a chat template")
        tree = self.parse(source)
        n_nodes = sum(1 for _ in tree.find_all(nodes.Node))
        if n_nodes > MAX_TEMPLATE_NODES:
            raise _TemplateTooLarge(f"it parses to {n_nodes} syntax nodes, over the {MAX_TEMPLATE_NODES} limit")
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
        # What from_string does, with the generated code's size checked before Python compiles it.
        python_source = self.compile(tree, raw=True)
        if len(python_source) > MAX_COMPILED_SOURCE:
            raise _TemplateTooLarge(
                f"it compiles to {len(python_source)} characters of code, over the {MAX_COMPILED_SOURCE} limit"
            )
        code = compile(python_source, "<template>", "exec")
        return self.template_class.from_code(self, code, self.make_globals(None), None)

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


def _describe(exc: BaseException) -> str:
    """One line describing why a template failed."""
    if isinstance(exc, (_TemplateTimeout, _TemplateTooLarge)):
        return str(exc)
    if isinstance(exc, _TemplateRaised):
        return f"the template refused the conversation: {exc}"
    if isinstance(exc, SecurityError):
        return f"unsafe operation blocked by the sandbox: {exc}"
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"syntax error on line {exc.lineno}: {exc.message}"
    if isinstance(exc, RecursionError):
        return "the template recursed too deeply"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


@dataclass(frozen=True)
class ChatTemplate:
    """A chat format: the model's own Jinja template or a built-in fallback.

    Attributes:
        name: ``"gguf"`` for the model's own, else the fallback's name (``"chatml"``, ``"gemma"``,
            ``"llama3"``, ``"mistral"``, ``"phi3"``, ``"plain"``).
        source: ``"gguf"`` or ``"fallback"``.
        reason: why this one was chosen, for the inspector and the logs.
        stop: extra stop strings for generation.
        fold_system: the system prompt is prepended to the first user message instead of being its
            own message (the format, or the model's template, has no system role).
        supports_tools: the model's template renders ``tools``, calls and the ``tool`` role (a test
            render said so); otherwise tools go through the fallback prompt (engine/inference/tool_prompt.py).
        tool_family: the call format the model writes (engine/inference/tool_calls.py); ``json`` with the
            fallback prompt.
        thinking: the thinking switches the template reads (``enable_thinking``,
            ``reasoning_effort``); empty when it has none.
        harmony: the model writes OpenAI's harmony format (gpt-oss: channels, engine/inference/harmony.py).
        think_format: how the model marks its thinking (engine/inference/reasoning.py's
            :data:`~engine.inference.reasoning.THINK_FORMATS`: ``think`` for ``<think>``...).
    """

    name: str
    source: Literal["gguf", "fallback"]
    reason: str
    stop: tuple[str, ...]
    fold_system: bool = False
    timeout_s: float = 2.0
    bos_token: str = ""
    eos_token: str = ""
    _env: _GuardedEnvironment | None = field(default=None, repr=False, compare=False)
    _template: jinja2.Template | None = field(default=None, repr=False, compare=False)
    supports_tools: bool = False
    tool_family: Family = "json"
    thinking: frozenset[str] = frozenset()
    harmony: bool = False
    think_format: str = "think"

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[ToolSpec] | None = None,
        tool_choice: str = "auto",
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
    ) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) into one prompt string.

        Args:
            messages: the conversation; roles ``system``, ``user``, ``assistant`` and ``tool``; an
                assistant message may carry ``tool_calls`` (OpenAI-shaped, arguments a dict or its
                JSON text), a ``tool`` message ``tool_call_id`` and ``name``.
            add_generation_prompt: end with the header that starts the assistant's reply.
            tools: the tools offered (rendered through the template, or the fallback prompt when it
                has no tool support); ignored with ``tool_choice="none"``, unless the conversation
                holds calls or results: then they stay, with a note not to call one
                (engine/inference/tool_prompt.py's :func:`~engine.inference.tool_prompt.keeps_tools`).
            tool_choice: ``auto``, ``none``, ``required`` or a function name (passed to the template).
            enable_thinking: the template's thinking switch; None leaves it to the template.
            reasoning_effort: ``low``, ``medium`` or ``high`` for templates that read it; None leaves it.

        Returns:
            The prompt text, including the BOS token text where the format starts with it.

        Raises:
            TemplateError: the model's template refused the conversation, broke a sandbox rule or
                ran past its time limit.
        """
        plain = [template_message(m) for m in messages]
        offered = list(tools or ()) if keeps_tools(tool_choice, plain) else []
        if not self.supports_tools and (offered or any(has_tool_parts(m) for m in plain)):
            plain, offered = fold_tools(plain, offered, tool_choice), []
        elif offered:
            plain = with_note(plain, choice_note(tool_choice, native=True))
        if self._template is None and self.name in _STRIPS_TEXT:
            plain = [{**m, "content": m["content"].strip()} for m in plain]
        if self.fold_system:
            plain = _fold_system(plain)
        if self._template is None or self._env is None:
            return _render_fallback(self.name, plain, add_generation_prompt, self.bos_token, self.eos_token)
        context: dict[str, Any] = {
            "messages": plain,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": tool_entries(offered) or None,
        }
        if offered:
            context["tool_choice"] = tool_choice
        if enable_thinking is not None:
            context["enable_thinking"] = enable_thinking
        if reasoning_effort is not None:
            if reasoning_effort not in EFFORTS:
                raise TemplateError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, not {reasoning_effort!r}")
            context["reasoning_effort"] = reasoning_effort
        try:
            return self._env.render_guarded(self._template, context, self.timeout_s)
        except Exception as exc:
            raise TemplateError(f"chat template: {_describe(exc)}") from exc


def _fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prepend system messages to the first user message (separated by a blank line)."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system" and m["content"])
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if not system:
        return rest
    for message in rest:
        if message["role"] == "user":
            message["content"] = f"{system}\n\n{message['content']}"
            return rest
    return [{"role": "user", "content": system}, *rest]


# ---------------------------------------------------------------- fallbacks
_FALLBACK_STOPS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_end|>",),
    "gemma": ("<end_of_turn>",),
    "llama3": ("<|eot_id|>",),
    "mistral": (),
    "phi3": ("<|end|>",),
    "plain": ("\nUser:",),
}
_FOLDS_SYSTEM = {"gemma", "mistral"}
_STRIPS_TEXT = {"gemma", "llama3"}


def _render_fallback(name: str, messages: list[dict[str, Any]], add_generation_prompt: bool, bos: str, eos: str) -> str:
    out: list[str] = []
    if name == "chatml":
        out.extend(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
    elif name == "gemma":
        out.append(bos)
        for m in messages:
            role = "model" if m["role"] == "assistant" else "user"
            out.append(f"<start_of_turn>{role}\n{m['content']}<end_of_turn>\n")
        if add_generation_prompt:
            out.append("<start_of_turn>model\n")
    elif name == "llama3":
        out.append(bos or "<|begin_of_text|>")
        for m in messages:
            out.append(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>")
        if add_generation_prompt:
            out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    elif name == "mistral":
        out.append(bos)
        for m in messages:
            if m["role"] == "assistant":
                out.append(f" {m['content']}{eos}")
            else:
                out.append(f"[INST] {m['content']} [/INST]")
    elif name == "phi3":
        out.append(bos)
        out.extend(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
        if add_generation_prompt:
            out.append("<|assistant|>\n")
    elif name == "plain":
        out.append(bos)
        labels = {"system": "System", "user": "User", "assistant": "Assistant"}
        out.extend(f"{labels.get(m['role'], m['role'].title())}: {m['content']}\n\n" for m in messages)
        if add_generation_prompt:
            out.append("Assistant:")
    else:
        raise TemplateError(f"chat template: unknown fallback format {name!r}")
    return "".join(out)


def fallback_template(
    name: FallbackName, reason: str, bos_token: str | None = None, eos_token: str | None = None
) -> ChatTemplate:
    """A built-in chat format.

    ``gemma`` and ``llama3`` strip the whitespace around each message's text, as those models' own
    templates do; the others keep the text as it is.

    Args:
        name: the format.
        reason: why it is used (shown to the user).
        bos_token: the model's BOS text, written at the start where the format has one.
        eos_token: the model's EOS text (ends assistant turns in the ``mistral`` format).

    Returns:
        The template.

    Raises:
        TemplateError: ``name`` is not a known format.
    """
    if name not in _FALLBACK_STOPS:
        raise TemplateError(f"chat template: unknown fallback format {name!r}")
    eos = eos_token or ""
    stop = _FALLBACK_STOPS[name] + ((eos,) if eos and eos not in _FALLBACK_STOPS[name] else ())
    return ChatTemplate(
        name=name,
        source="fallback",
        reason=reason,
        stop=stop,
        fold_system=name in _FOLDS_SYSTEM,
        bos_token=bos_token or "",
        eos_token=eos,
    )


_MARKERS: tuple[tuple[str, FallbackName], ...] = (
    ("<start_of_turn>", "gemma"),
    ("<|start_header_id|>", "llama3"),
    ("<|im_start|>", "chatml"),
    ("[INST]", "mistral"),
    ("<|assistant|>", "phi3"),
)


def guess_format(gguf_template: str | None, architecture: str, bos_token: str | None) -> FallbackName:
    """The built-in format that best matches a model.

    The markers of the model's own template win (even a rejected one says which format the model
    was trained on); then the architecture; then ChatML, the most common format.

    Args:
        gguf_template: the template text from the GGUF, if any.
        architecture: ``general.architecture``.
        bos_token: the BOS token text.

    Returns:
        The format's name.
    """
    if gguf_template:
        for marker, name in _MARKERS:
            if marker in gguf_template:
                return name
    arch = architecture.lower()
    if arch.startswith("gemma"):
        return "gemma"
    if arch.startswith(("qwen", "chatml")):
        return "chatml"
    if arch.startswith("phi3"):
        return "phi3"
    if arch.startswith("mistral"):
        return "mistral"
    if arch.startswith("llama") and bos_token == "<|begin_of_text|>":
        return "llama3"
    return "chatml"


def _contains_turns(rendered: str, with_system: bool) -> bool:
    texts = [m["content"] for m in _SAMPLE_TURNS if m["role"] == "user"]
    if with_system:
        texts.append(_SAMPLE_SYSTEM)
    return all(text in rendered for text in texts)


def select_template(
    gguf_template: str | None,
    architecture: str,
    bos_token: str | None,
    eos_token: str | None,
    *,
    timeout_s: float = 2.0,
) -> ChatTemplate:
    """Choose the chat format for a model.

    The GGUF template is compiled in the guarded sandbox and test-rendered on a small conversation
    with a system prompt; if it rejects the system role but accepts the conversation without one,
    it is used with the system prompt folded into the first user turn. Otherwise (no template,
    syntax error, sandbox violation, timeout, exception, output missing the messages) a built-in
    format is used (:func:`guess_format`). A template over :data:`MAX_TEMPLATE_BYTES` is refused
    without being parsed.

    Args:
        gguf_template: ``tokenizer.chat_template`` from the GGUF, or ``None``.
        architecture: ``general.architecture``.
        bos_token: the BOS token text, or ``None``.
        eos_token: the EOS token text, or ``None``.
        timeout_s: the time limit of each render.

    Returns:
        The template, with ``reason`` saying why it was chosen.
    """
    bos, eos = bos_token or "", eos_token or ""
    if not gguf_template or not gguf_template.strip():
        name = guess_format(None, architecture, bos_token)
        return fallback_template(
            name, f"the model has no chat template; using the {name} format for {architecture!r}", bos, eos
        )
    size = template_size(gguf_template)
    if size > MAX_TEMPLATE_BYTES:  # refused before anything parses it (compile_guarded checks too)
        why = f"it is {size} bytes, over the {MAX_TEMPLATE_BYTES}-byte limit for a chat template"
        return _reject(gguf_template, architecture, bos, eos, why)
    env = _GuardedEnvironment()
    try:
        compiled = env.compile_guarded(gguf_template)
    except Exception as exc:  # noqa: BLE001 - any failure to compile untrusted text means "reject it"
        return _reject(gguf_template, architecture, bos, eos, _describe(exc))
    stop = _stops_for(gguf_template, eos)
    sample = [{"role": "system", "content": _SAMPLE_SYSTEM}, *_SAMPLE_TURNS]
    own = ChatTemplate("gguf", "gguf", "the model's own chat template", stop, False, timeout_s, bos, eos, env, compiled)
    try:
        rendered = own.render(sample)
    except TemplateError as exc:
        cause = exc.__cause__
        if not isinstance(cause, _TemplateRaised):
            return _reject(gguf_template, architecture, bos, eos, _describe(cause or exc))
        why = f"it rejects a system role: {cause}"
    else:
        if _contains_turns(rendered, with_system=True):
            return _with_tool_support(own, gguf_template, architecture)
        if not _contains_turns(rendered, with_system=False):
            return _reject(gguf_template, architecture, bos, eos, "its output does not contain the messages")
        why = "it drops the system prompt"
    folded = replace(
        own,
        reason=f"the model's own chat template ({why}; the system prompt goes into the first user message)",
        fold_system=True,
    )
    try:
        rendered = folded.render(sample)
    except TemplateError as exc:
        return _reject(gguf_template, architecture, bos, eos, _describe(exc.__cause__ or exc))
    if not _contains_turns(rendered, with_system=True):
        return _reject(gguf_template, architecture, bos, eos, "its output does not contain the messages")
    return _with_tool_support(folded, gguf_template, architecture)


_PROBE_TOOL = ToolSpec(
    "glassbox_probe_tool", "Looks up a word.", {"type": "object", "properties": {"word": {"type": "string"}}}
)
_PROBE_RESULT = "glassbox probe result 7491"


def _with_tool_support(template: ChatTemplate, source: str, architecture: str) -> ChatTemplate:
    """Marks the model's template as tool-capable when a test render shows the tool, an earlier call
    and its result; records its call format and thinking switches either way."""
    arguments: dict[str, Any] = {"word": "glassbox-probe-value"}
    function = {"name": "glassbox_probe_tool", "arguments": arguments}
    call = {"id": "call00001", "type": "function", "function": function}
    sample: list[dict[str, Any]] = [
        {"role": "system", "content": _SAMPLE_SYSTEM},
        {"role": "user", "content": "Look up x."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": _PROBE_RESULT, "tool_call_id": "call00001", "name": "glassbox_probe_tool"},
    ]
    capable = replace(template, supports_tools=True)
    rendered = ""
    try:
        rendered = capable.render(sample, tools=[_PROBE_TOOL])
        works = _PROBE_TOOL.name in rendered.split(_PROBE_RESULT)[0] and _PROBE_RESULT in rendered
    except TemplateError:
        works = False
    # The call's format is the one whose parser reads the probe call back from this rendering;
    # None: no parser does, and the fallback prompt (engine/inference/tool_prompt.py) is used.
    family = (
        detect_family(
            source,
            architecture,
            rendered=rendered.split(_PROBE_RESULT)[0],
            probe_name=_PROBE_TOOL.name,
            probe_arguments=arguments,
        )
        if works
        else None
    )
    return replace(
        template,
        supports_tools=works and family is not None,
        tool_family=family or "json",
        thinking=thinking_controls(source),
        harmony=is_harmony(source),
        think_format=detect_thinking(source, rendered),
    )


def _stops_for(template: str, eos: str) -> tuple[str, ...]:
    stops = [stop for marker, name in _MARKERS if marker in template for stop in _FALLBACK_STOPS[name]]
    if eos and eos not in stops:
        stops.append(eos)
    return tuple(dict.fromkeys(stops))


def _reject(template: str, architecture: str, bos: str, eos: str, why: str) -> ChatTemplate:
    name = guess_format(template, architecture, bos)
    return fallback_template(name, f"the model's chat template was rejected ({why}); using the {name} format", bos, eos)
