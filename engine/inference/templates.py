"""Chat templates: the model's own (sandboxed Jinja) or a known fallback.

Contract: ARCHITECTURE.md, 'engine.inference.templates'.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any, Literal

import jinja2
from jinja2.exceptions import SecurityError

from engine.errors import TemplateError
from engine.inference.harmony import is_harmony
from engine.inference.reasoning import EFFORTS, detect_thinking
from engine.inference.template_sandbox import (
    MAX_COMPILED_SOURCE,
    MAX_TEMPLATE_BYTES,
    MAX_TEMPLATE_NODES,
    GuardedEnvironment,
    TemplateRaised,
    TemplateTimeout,
    describe,
    template_size,
)
from engine.inference.template_switches import Switch, find_switches
from engine.inference.tool_calls import Family, detect_family
from engine.inference.tool_prompt import (
    ArgumentsForm,
    choice_note,
    fold_tools,
    has_tool_parts,
    keeps_tools,
    template_message,
    tool_entries,
    with_note,
)
from engine.inference.tools import ToolSpec

__all__ = [
    "MAX_COMPILED_SOURCE",
    "MAX_TEMPLATE_BYTES",
    "MAX_TEMPLATE_NODES",
    "ChatTemplate",
    "FallbackName",
    "Switch",
    "fallback_template",
    "guess_format",
    "select_template",
]

_SAMPLE_SYSTEM = "You are a helpful assistant."
_SAMPLE_TURNS = (
    {"role": "user", "content": "Hello there, who are you?"},
    {"role": "assistant", "content": "I am an assistant. How can I help?"},
    {"role": "user", "content": "What is two plus two?"},
)

FallbackName = Literal["chatml", "gemma", "llama3", "mistral", "phi3", "plain"]

CONVENTION_INPUTS = frozenset({"functions", "datetime"})
"""Inputs outside the Hugging Face convention that Glassbox fills when a template reads them:
FireFunction's ``functions`` (the offered functions as JSON text) and ``datetime`` (today)."""


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
        thinking: the names of the thinking switches the template reads (``enable_thinking``,
            ``reasoning_effort``, ``thinking``, ``thinking_budget``, ...; see ``switches``); empty
            when it has none.
        harmony: the model writes OpenAI's harmony format (gpt-oss: channels, engine/inference/harmony.py).
        think_format: how the model marks its thinking (engine/inference/reasoning.py's
            :data:`~engine.inference.reasoning.THINK_FORMATS`: ``think`` for ``<think>``...).
        switches: the thinking switches the template reads, with their kind, the values it names
            and its default (engine/inference/template_switches.py).
        arguments: how the template wants a call's arguments: ``object`` (a dict; JSON text is
            parsed), ``string`` (JSON text; a dict is written as JSON) or ``either`` (as given).
        empty_tools: the template needs a tool list: with no tools offered it gets an empty one
            (transformers passes ``None``, which such a template cannot iterate).
        conventions: the inputs of :data:`CONVENTION_INPUTS` the template reads (filled by render).
        renders_calls: with ``supports_tools``, the template also renders an assistant message's
            ``tool_calls`` (a few show only its text, where the model wrote the call).
    """

    name: str
    source: Literal["gguf", "fallback"]
    reason: str
    stop: tuple[str, ...]
    fold_system: bool = False
    timeout_s: float = 2.0
    bos_token: str = ""
    eos_token: str = ""
    _env: GuardedEnvironment | None = field(default=None, repr=False, compare=False)
    _template: jinja2.Template | None = field(default=None, repr=False, compare=False)
    supports_tools: bool = False
    tool_family: Family = "json"
    thinking: frozenset[str] = frozenset()
    harmony: bool = False
    think_format: str = "think"
    switches: tuple[Switch, ...] = ()
    arguments: ArgumentsForm = "object"
    empty_tools: bool = False
    conventions: frozenset[str] = frozenset()
    renders_calls: bool = False

    def switch(self, name: str) -> Switch | None:
        """The switch of that name the template reads, or None."""
        return next((s for s in self.switches if s.name == name), None)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[ToolSpec] | None = None,
        tool_choice: str = "auto",
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        switches: Mapping[str, object] | None = None,
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
            switches: values for any of the template's :attr:`switches` by name (``thinking_budget``,
                ``thinking_mode``, a ``reasoning_effort`` of the template's own such as ``max``...);
                they override ``enable_thinking`` and ``reasoning_effort``.

        Returns:
            The prompt text, including the BOS token text where the format starts with it.

        Raises:
            TemplateError: the model's template refused the conversation, broke a sandbox rule or
                ran past its time limit; a switch it does not read, or a value of the wrong kind.
        """
        plain = [template_message(m, self.arguments) for m in messages]
        offered = list(tools or ()) if keeps_tools(tool_choice, plain) else []
        if not self.supports_tools and (offered or any(has_tool_parts(m) for m in plain)):
            plain, offered = fold_tools(plain, offered, tool_choice), []
        elif offered:
            plain = with_note(plain, choice_note(tool_choice, native=True))
        if self._template is None and self.name in _STRIPS_TEXT:
            plain = [{**m, "content": m["content"].strip()} for m in plain]
        if self.fold_system:
            plain = _fold_system(plain)
        chosen = self._switch_values(enable_thinking, reasoning_effort, switches or {})
        if self._template is None or self._env is None:
            return _render_fallback(self.name, plain, add_generation_prompt, self.bos_token, self.eos_token)
        entries = tool_entries(offered)
        # What transformers' render_jinja_template passes (messages, tools, documents,
        # add_generation_prompt) and apply_chat_template adds (the special tokens, the switches).
        context: dict[str, Any] = {
            "messages": plain,
            "tools": entries or ([] if self.empty_tools else None),
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **_convention_values(self.conventions, entries),
            **chosen,
        }
        if offered:
            context["tool_choice"] = tool_choice
        try:
            return self._env.render_guarded(self._template, context, self.timeout_s)
        except Exception as exc:
            raise TemplateError(f"chat template: {describe(exc)}") from exc

    def _switch_values(
        self, enable_thinking: bool | None, reasoning_effort: str | None, switches: Mapping[str, object]
    ) -> dict[str, object]:
        chosen: dict[str, object] = {}
        if enable_thinking is not None:
            chosen["enable_thinking"] = enable_thinking
        if reasoning_effort is not None:
            if reasoning_effort not in EFFORTS:
                raise TemplateError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, not {reasoning_effort!r}")
            chosen["reasoning_effort"] = reasoning_effort
        for name, value in switches.items():
            switch = self.switch(name)
            if switch is None:
                names = ", ".join(s.name for s in self.switches) or "none"
                raise TemplateError(f"chat template: it reads no switch {name!r} (its switches: {names})")
            if not switch.accepts(value):
                raise TemplateError(f"chat template: switch {name!r} takes a {switch.kind}, not {value!r}")
            chosen[name] = value
        return chosen


def _convention_values(reads: frozenset[str], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The :data:`CONVENTION_INPUTS` a template reads, filled in."""
    values: dict[str, Any] = {}
    if "functions" in reads:
        values["functions"] = json.dumps([entry["function"] for entry in entries], ensure_ascii=False, indent=4)
    if "datetime" in reads:
        values["datetime"] = date.today().strftime("%b %d %Y")  # llama.cpp's format; a day long, for the KV cache
    return values


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
    env = GuardedEnvironment()
    try:
        compiled, reads = env.compile_reading(gguf_template)
        switches = find_switches(env.parse(gguf_template), reads)  # the tree as written, not as guarded
    except Exception as exc:  # noqa: BLE001 - any failure to compile untrusted text means "reject it"
        return _reject(gguf_template, architecture, bos, eos, describe(exc))
    stop = _stops_for(gguf_template, eos)
    sample = [{"role": "system", "content": _SAMPLE_SYSTEM}, *_SAMPLE_TURNS]
    own = ChatTemplate(
        "gguf",
        "gguf",
        "the model's own chat template",
        stop,
        False,
        timeout_s,
        bos,
        eos,
        env,
        compiled,
        switches=switches,
        thinking=frozenset(s.name for s in switches),
        conventions=reads & CONVENTION_INPUTS,
    )
    rendered, error = _attempt(own, sample)
    if error is not None and not isinstance(error, TemplateRaised | SecurityError):
        listed = replace(own, empty_tools=True)  # a tool_use template that iterates `tools` unconditionally
        if _attempt(listed, sample)[1] is None:
            why = "it needs a tool list: with no tools offered, it gets an empty one"
            own = replace(listed, reason=f"the model's own chat template ({why})")
            rendered, error = _attempt(own, sample)
    if error is not None:
        if not isinstance(error, TemplateRaised):
            return _reject(gguf_template, architecture, bos, eos, describe(error))
        why = f"it rejects a system role: {error}"
    else:
        if _contains_turns(rendered, with_system=True):
            return _with_facts(own, gguf_template, architecture)
        if not _contains_turns(rendered, with_system=False):
            return _reject(gguf_template, architecture, bos, eos, "its output does not contain the messages")
        why = "it drops the system prompt"
    folded = replace(
        own,
        reason=f"the model's own chat template ({why}; the system prompt goes into the first user message)",
        fold_system=True,
    )
    rendered, error = _attempt(folded, sample)
    if error is not None:
        return _reject(gguf_template, architecture, bos, eos, describe(error))
    if not _contains_turns(rendered, with_system=True):
        return _reject(gguf_template, architecture, bos, eos, "its output does not contain the messages")
    return _with_facts(folded, gguf_template, architecture)


def _attempt(
    template: ChatTemplate, messages: list[dict[str, Any]], **options: Any
) -> tuple[str, BaseException | None]:
    """(the render, None), or ("", why it failed: the template's own exception where there is one)."""
    try:
        return template.render(messages, **options), None
    except TemplateError as exc:
        return "", exc.__cause__ or exc


_PROBE_TOOL = ToolSpec(
    "glassbox_probe_tool",
    "Looks up a word.",
    {  # complete, as templates expect (Command-R+'s prints each parameter's description)
        "type": "object",
        "properties": {"word": {"type": "string", "description": "The word."}},
        "required": ["word"],
    },
)
_PROBE_VALUE = "glassbox-probe-value"
_PROBE_RESULT = "glassbox probe result 7491"
_PROBE_ASK = "Look up x."


def _probe_render(template: ChatTemplate, arguments: dict[str, Any] | str) -> str | None:
    """A test render of a call and its result (the call's arguments as given), or None when the
    template failed or did not show the result after the question."""
    call = {"id": "call00001", "type": "function", "function": {"name": _PROBE_TOOL.name, "arguments": arguments}}
    sample: list[dict[str, Any]] = [
        {"role": "system", "content": _SAMPLE_SYSTEM},
        {"role": "user", "content": _PROBE_ASK},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": _PROBE_RESULT, "tool_call_id": "call00001", "name": _PROBE_TOOL.name},
    ]
    rendered, error = _attempt(template, sample, tools=[_PROBE_TOOL])
    _, ask, tail = rendered.rpartition(_PROBE_ASK)
    if error is not None or not ask or _PROBE_RESULT not in tail:
        return None
    return rendered


def _call_region(rendered: str | None) -> str | None:
    """The part of a probe render between the question and the result (where the call is)."""
    return None if rendered is None else rendered.rpartition(_PROBE_ASK)[2].split(_PROBE_RESULT)[0]


def _with_facts(template: ChatTemplate, source: str, architecture: str) -> ChatTemplate:
    """The template with its tool facts found by test renders.

    It renders tools natively when a render with the tool and one user message names the tool,
    a render of a call and its result shows the result after the question, and the call is in a
    format Glassbox reads (the one whose parser reads the probe call back from the rendering,
    engine/inference/tool_calls's :func:`~engine.inference.tool_calls.detect_family`). It renders
    calls when the call's tool name shows between the question and the result (LFM2's and Granite
    3.3's templates show only the assistant's text, where the model wrote its call). The call's
    arguments are tried as a dict, then as compact JSON text: a dict works when its value shows
    and no Python dict text (``{'word': ...}``) does; text works only verbatim (not re-encoded as
    a JSON string).
    """
    capable = replace(template, supports_tools=True, arguments="either")
    listed, error = _attempt(capable, [{"role": "user", "content": _PROBE_ASK}], tools=[_PROBE_TOOL])
    if isinstance(error, TemplateTimeout):  # no more probes of a template that hangs on tools
        return replace(template, harmony=is_harmony(source), think_format=detect_thinking(source, None))
    arguments: dict[str, Any] = {"word": _PROBE_VALUE}
    text = json.dumps(arguments, separators=(",", ":"))
    with_dict, with_text = _probe_render(capable, arguments), _probe_render(capable, text)
    as_dict, as_text = _call_region(with_dict), _call_region(with_text)
    works = error is None and _PROBE_TOOL.name in listed and (as_dict is not None or as_text is not None)
    calls = works and any(_PROBE_TOOL.name in region for region in (as_dict, as_text) if region is not None)
    dict_ok = as_dict is not None and _PROBE_VALUE in as_dict and "'word'" not in as_dict
    text_ok = as_text is not None and text in as_text
    form: ArgumentsForm = "either" if dict_ok and text_ok else "string" if text_ok else "object"
    rendered = (with_text if form == "string" else with_dict) or with_text or ""
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
    native = works and family is not None
    return replace(
        template,
        supports_tools=native,
        renders_calls=native and calls,
        arguments=form if native and calls else "object",
        tool_family=family or "json",
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
