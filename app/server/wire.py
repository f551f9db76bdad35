"""The OpenAI chat-completions wire format for ``glassbox serve`` (:mod:`app.server.http`).

Turns request bodies into engine calls (messages into system prompt, history and the new user
message; sampling fields into :class:`~engine.inference.runtime.GenerationParams`) and engine results into
OpenAI-shaped documents (``chat.completion`` and its chunks, ``tool_calls``, ``logprobs``, ``usage``,
and llama.cpp-style ``timings``). Errors are :class:`~app.server.errors.HttpError`.

The messages: ``system`` and ``developer`` become the system prompt; ``user``, ``assistant`` (with
``tool_calls``) and ``tool`` (with ``tool_call_id``) the conversation. Tools are
:class:`~engine.inference.tools.ToolSpec`; ``tool_choice`` is ``auto``, ``none``, ``required`` or a named
function (``{"type": "function", "function": {"name": ...}}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict, Unpack

from app.server import params as fields
from app.server.body import parse_json_text
from app.server.errors import HttpError, context_length_error
from app.server.media_parts import audio_part, image_url_part
from engine.errors import EngineError
from engine.inference.events import Event, Finished, Reasoning, Stats, Token, ToolCall
from engine.inference.tools import ToolSpec, check_tools, normalize_tool_choice

if TYPE_CHECKING:
    from engine.inference.runtime import GenerationParams
    from engine.media import Media

Arguments = dict[str, object]
"""A tool call's arguments: a JSON object."""

Source = dict[str, object]
"""One cited passage of a reply's ``sources`` (``app.knowledge_glue``: n, path, page, snippet, ...)."""

MAX_MESSAGES = 2048
"""Most messages one chat request may carry (planning the context window costs more per message)."""

TEXT_CHARS_PER_TOKEN = 32
"""Message text allowed per token of the context window: the cap on a request's text is this many
characters per token of the window, but never under :data:`MIN_TEXT_CHARS`."""

MIN_TEXT_CHARS = 256 * 1024
"""The cap on a request's text (all messages together, in characters) for a small or unknown window."""

MAX_TOOLS = 128
"""Most tools one request may offer (OpenAI allows 128)."""


def text_limit(n_ctx: int | None) -> int:
    """The most characters of message text one request may carry for a window of ``n_ctx`` tokens.

    Tokenizing costs more than linear time in the text (llama.cpp splits it at every special token,
    and some vocabularies make each newline one), so the text is capped before anything is counted.
    """
    return max(MIN_TEXT_CHARS, TEXT_CHARS_PER_TOKEN * (n_ctx or 0))


class TextBudget:
    """The text one request may carry (:func:`text_limit`), counted as the request is read: every
    dialect refuses a request over it before any of it is tokenized.

    Args:
        max_chars: the most characters (:func:`text_limit` of the window).
        n_ctx: the window, for the error's words (None: unknown).
    """

    def __init__(self, max_chars: int, n_ctx: int | None = None) -> None:
        self.max_chars = max_chars
        self.n_ctx = n_ctx
        self.chars = 0

    def add(self, chars: int, param: str = "messages") -> None:
        """Counts ``chars`` more characters.

        Raises:
            HttpError: 400 ``context_length_exceeded`` past :attr:`max_chars`.
        """
        self.chars += chars
        if self.chars > self.max_chars:
            raise context_length_error(
                self.n_ctx,
                None,
                0,
                f"the request holds more than {self.max_chars} characters of text, the most allowed per request "
                "with this context window: shorten the conversation",
                param,
            )


def check_count(items: Sequence[object], param: str) -> None:
    """Refuses more than :data:`MAX_MESSAGES` messages or items (planning costs more per message).

    Raises:
        HttpError: 400 ``too_many_messages`` naming ``param``.
    """
    if len(items) > MAX_MESSAGES:
        raise HttpError(
            400,
            f"'{param}' has {len(items)} messages; at most {MAX_MESSAGES} are allowed per request",
            code="too_many_messages",
            param=param,
        )


def tools_chars(tools: object) -> int:
    """The characters of a request's tool definitions (their JSON text), counted with its text."""
    return len(json.dumps(tools, ensure_ascii=False)) if tools else 0


CHAT_FIELDS = frozenset(
    {
        "messages",
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "knowledge_base",
        "reasoning_effort",
        "chat_template_kwargs",
        "n_probs",
        "timings_per_token",
        *fields.SAMPLING,
        *fields.CONSTRAINTS,
    }
)

CHAT_NO_EFFECT = ("store", "service_tier", "verbosity", "prediction", "prompt_cache_retention")
"""The :data:`~app.server.params.NO_EFFECT` fields ``/v1/chat/completions`` accepts."""
"""The ``/v1/chat/completions`` fields this server reads; any other is a 400 (see :mod:`app.server.params`)."""


@dataclass(frozen=True)
class WireMessage:
    """One message of a request, in the engine's terms (see :func:`engine_messages`).

    Attributes:
        role: ``user``, ``assistant`` or ``tool`` (system messages are folded into the system prompt).
        content: its text.
        tool_calls: an assistant's calls, as (id, name, arguments).
        tool_call_id: the call a ``tool`` message answers.
        media: a user message's images and clips (``app.server.media_parts``), in order.
    """

    role: str
    content: str
    tool_calls: tuple[tuple[str, str, Arguments], ...] = ()
    tool_call_id: str | None = None
    media: tuple[Media, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    """A parsed ``/v1/chat/completions`` body (or a Responses or Messages body), in the engine's terms.

    Attributes:
        system: the system prompt (all system and developer messages, joined), or None.
        history: the messages before the last one.
        user: the last user message's text ("" when the conversation ends with tool results).
        user_media: the last user message's images and clips.
        messages: every non-system message, in order (``history`` plus the last one).
        params: the GenerationParams of the first choice.
        n: how many choices.
        top_logprobs: alternatives per token when ``logprobs`` is asked for, else None.
        tools: the ToolSpecs offered.
        tool_choice: ``auto``, ``none``, ``required`` or a function name (``none`` without tools).
        parallel_tool_calls: False keeps only the first call of a reply.
        thinking: the template's thinking switch (``chat_template_kwargs.enable_thinking``), or None.
        reasoning_effort: the template's ``reasoning_effort`` switch, or None.
        warnings: what the answer says about fields accepted with no effect (``X-Glassbox-Warning``).
        max_tool_calls: the most calls a reply keeps (None: no limit).
        truncate: the oldest turns may be dropped to fit the window (Responses' ``truncation: auto``).
        timings_per_token: llama.cpp's field: each streamed chunk carries the ``timings`` so far.
    """

    system: str | None
    history: list[WireMessage]
    user: str
    params: GenerationParams
    stream: bool
    include_usage: bool
    knowledge_bases: tuple[str, ...]
    messages: tuple[WireMessage, ...] = ()
    n: int = 1
    top_logprobs: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "none"
    parallel_tool_calls: bool = True
    thinking: bool | None = None
    reasoning_effort: str | None = None
    warnings: tuple[str, ...] = ()
    max_tool_calls: int | None = None
    truncate: bool = False
    user_media: tuple[Media, ...] = ()
    timings_per_token: bool = False


class RequestFields(TypedDict, total=False):
    """The fields of a :class:`ChatRequest` besides its conversation (see :func:`chat_request`)."""

    params: GenerationParams
    stream: bool
    include_usage: bool
    knowledge_bases: tuple[str, ...]
    n: int
    top_logprobs: int | None
    tools: tuple[ToolSpec, ...]
    tool_choice: str
    parallel_tool_calls: bool
    thinking: bool | None
    reasoning_effort: str | None
    warnings: tuple[str, ...]
    max_tool_calls: int | None
    timings_per_token: bool
    truncate: bool


def chat_request(system: str | None, turns: Sequence[WireMessage], **fields: Unpack[RequestFields]) -> ChatRequest:
    """Builds the ChatRequest of a conversation, its last message split off.

    Args:
        system: the system prompt, or None.
        turns: the non-system messages, in order (at least one).
        **fields: the other ChatRequest fields (params, stream, include_usage, knowledge_bases, ...).

    Returns:
        The request: ``user`` is the last message's text when it is a user message ("" when the
        conversation ends with tool results or an assistant turn), ``history`` the messages before it.
    """
    last = turns[-1]
    return ChatRequest(
        system=system,
        history=list(turns[:-1]) if last.role == "user" else list(turns),
        user=last.content if last.role == "user" else "",
        user_media=last.media if last.role == "user" else (),
        messages=tuple(turns),
        **fields,
    )


def _text_content(content: object, index: int, media: list[Media] | None = None) -> str:
    """A message's text; with ``media`` (a user message), its ``image_url`` and ``input_audio``
    parts are read into it (``app.server.media_parts``), else they are refused."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts: list[str] = []
        for number, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get("text") if isinstance(part, dict) else None
            if kind in ("text", "input_text", "output_text") and isinstance(text, str):
                parts.append(text)
            elif media is not None and kind in ("image_url", "input_image") and isinstance(part, dict):
                media.append(image_url_part(part, f"messages[{index}].content[{number}]"))
            elif media is not None and kind == "input_audio" and isinstance(part, dict):
                media.append(audio_part(part, f"messages[{index}].content[{number}]"))
            else:
                what = "text, image_url and input_audio" if media is not None else "text"
                raise HttpError(
                    400,
                    f"messages[{index}]: only {what} content is supported here, not {str(kind)[:40]!r}",
                    code="unsupported_content",
                    param=f"messages[{index}].content",
                )
        return "".join(parts)
    raise HttpError(400, f"messages[{index}].content must be a string or a list of text parts")


def call_arguments(value: object, where: str) -> Arguments:
    """A call's arguments in a conversation: OpenAI sends them as JSON text (parsed under the body's
    limits, :func:`~app.server.body.parse_json_text`), Anthropic as an object; None is ``{}``.

    Raises:
        HttpError: 400 naming ``where`` when the text is not JSON, nests too deep, holds a lone
            surrogate or a huge number, or is not a JSON object.
    """
    if value is None:
        return {}
    if isinstance(value, str):
        value = parse_json_text(value, where)
    if not isinstance(value, dict):
        raise HttpError(400, f"{where}: the arguments must be a JSON object", code="invalid_value", param=where)
    return value


def _tool_calls(value: object, index: int) -> tuple[tuple[str, str, Arguments], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise HttpError(400, f"messages[{index}].tool_calls must be a list", code="invalid_value")
    calls: list[tuple[str, str, Arguments]] = []
    for number, call in enumerate(value):
        where = f"messages[{index}].tool_calls[{number}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise HttpError(400, f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}")
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{index}_{number}"
        arguments = call_arguments(function.get("arguments"), f"{where}.function.arguments")
        calls.append((call_id, function["name"], arguments))
    return tuple(calls)


def parse_messages(messages: object, budget: TextBudget) -> tuple[str | None, list[WireMessage]]:
    """The system prompt and the conversation of an OpenAI ``messages`` list.

    Raises:
        HttpError: 400 for a malformed message, more than :data:`MAX_MESSAGES` messages or more
            text than ``budget`` allows (the calls' arguments count too).
    """
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' must be a non-empty list", code="invalid_messages")
    check_count(messages, "messages")
    system_parts: list[str] = []
    turns: list[WireMessage] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise HttpError(400, f"messages[{index}] must be an object")
        role = message.get("role")
        media: list[Media] = []
        text = _text_content(message.get("content"), index, media if role == "user" else None)
        budget.add(len(text))
        if role in ("system", "developer"):
            system_parts.append(text)
        elif role == "user":
            turns.append(WireMessage("user", text, media=tuple(media)))
        elif role == "assistant":
            calls = _tool_calls(message.get("tool_calls"), index)  # checked first, so a bad one is named
            budget.add(sum(len(json.dumps(arguments, ensure_ascii=False)) for _, _, arguments in calls))
            turns.append(WireMessage("assistant", text, calls))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise HttpError(400, f"messages[{index}]: a tool message needs its 'tool_call_id'")
            turns.append(WireMessage("tool", text, tool_call_id=call_id))
        else:
            raise HttpError(
                400, f"messages[{index}]: role {str(role)[:40]!r} is not supported (system, user, assistant, tool)"
            )
    if not turns or turns[-1].role not in ("user", "tool"):
        raise HttpError(400, "the last message must be from the user (or a tool result)", code="invalid_messages")
    return ("\n\n".join(system_parts) if system_parts else None), turns


def parse_tools(tools: object, tool_choice: object) -> tuple[tuple[ToolSpec, ...], str, tuple[str, ...]]:
    """OpenAI's ``tools`` and ``tool_choice`` as ToolSpecs, the engine's choice and the warnings.

    A ``tool_choice`` with no tools offered applies to nothing (OpenAI answers it; LlamaIndex's
    ``structured_predict`` sends ``required`` so): it is taken as ``none``, and a warning says so.

    Raises:
        HttpError: 400 for a malformed tool, a duplicate name, or a choice that names no tool offered.
    """

    specs: list[ToolSpec] = []
    if tools is not None:
        if not isinstance(tools, list):
            raise HttpError(400, "'tools' must be a list", code="invalid_value", param="tools")
        if len(tools) > MAX_TOOLS:
            raise HttpError(400, f"'tools' offers more than {MAX_TOOLS} tools", code="invalid_value", param="tools")
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            kind = tool.get("type", "function") if isinstance(tool, dict) else None
            if kind != "function" or not isinstance(function, dict):
                raise HttpError(
                    400,
                    f"tools[{index}] must be {{'type': 'function', 'function': {{'name', 'parameters'}}}} "
                    "(other tool types are not supported)",
                    code="invalid_value",
                    param=f"tools[{index}]",
                )
            specs.append(_tool_spec(function, f"tools[{index}].function"))
    choice = _tool_choice(tool_choice)
    warnings: tuple[str, ...] = ()
    if not specs and choice not in (None, "auto", "none"):
        warnings = (f"tool_choice: {choice[:64]!r} with no tools offered applies to nothing; taken as 'none'",)
        choice = "none"
    try:
        check_tools(specs)
        return tuple(specs), normalize_tool_choice(choice, specs), warnings
    except EngineError as exc:
        raise HttpError(400, str(exc), code="invalid_value", param="tool_choice") from None


def _tool_spec(function: Mapping[str, object], where: str) -> ToolSpec:
    name = function.get("name")
    description = function.get("description") or ""
    parameters = function.get("parameters", function.get("input_schema")) or {"type": "object", "properties": {}}
    if not isinstance(name, str) or not name:
        raise HttpError(400, f"{where}.name must be a non-empty string", code="invalid_value", param=f"{where}.name")
    if not isinstance(description, str) or not isinstance(parameters, dict):
        raise HttpError(400, f"{where}: description must be text and parameters a JSON schema", code="invalid_value")
    return ToolSpec(name=name, description=description, parameters=parameters, source="request")


def _tool_choice(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        function = value.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"])
        if isinstance(value.get("name"), str):  # the Responses and Anthropic shapes
            return str(value["name"])
    raise HttpError(
        400,
        "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
        code="invalid_value",
        param="tool_choice",
    )


def knowledge_bases(body: Mapping[str, object], default_kbs: tuple[str, ...]) -> tuple[str, ...]:
    """The knowledge bases a request names (``knowledge_base``), else the server's defaults."""
    kbs = body.get("knowledge_base")
    if isinstance(kbs, str):
        kbs = [kbs]
    if kbs is None:
        kbs = list(default_kbs)
    if not isinstance(kbs, list) or not all(isinstance(k, str) and k for k in kbs):
        raise HttpError(400, "'knowledge_base' must be a name or a list of names")
    return tuple(kbs)


def logprob_count(body: Mapping[str, object]) -> int | None:
    """``top_logprobs`` when ``logprobs`` is true (0 means the chosen token's only), else None.

    Raises:
        HttpError: 400 for ``top_logprobs`` out of 0..20, or given without ``logprobs``.
    """
    wanted = fields.flag(body, "logprobs")
    top = body.get("top_logprobs")
    n_probs = body.get("n_probs")  # llama.cpp's name: the alternatives per token, logprobs implied
    if n_probs is not None:
        if isinstance(n_probs, bool) or not isinstance(n_probs, int) or not 0 <= n_probs <= fields.MAX_TOP_LOGPROBS:
            raise HttpError(400, f"'n_probs' must be an integer from 0 to {fields.MAX_TOP_LOGPROBS}", param="n_probs")
        if n_probs and top is None and "logprobs" not in body:
            wanted, top = True, n_probs
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= fields.MAX_TOP_LOGPROBS:
            raise HttpError(
                400, f"'top_logprobs' must be an integer from 0 to {fields.MAX_TOP_LOGPROBS}", param="top_logprobs"
            )
        if top and not wanted:  # 0 without logprobs asks for nothing, and some clients send it
            raise HttpError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


def parse_chat(
    body: Mapping[str, object],
    default_kbs: tuple[str, ...],
    max_chars: int = MIN_TEXT_CHARS,
    n_vocab: int | None = None,
    n_ctx: int | None = None,
) -> ChatRequest:
    """Turns a ``/v1/chat/completions`` body into engine terms.

    Args:
        body: the parsed JSON body.
        default_kbs: knowledge bases to answer from when the body names none.
        max_chars: the most characters of message text allowed (see :func:`text_limit`).
        n_vocab: the model's vocabulary size, to check ``logit_bias`` (None: unchecked).
        n_ctx: the model's window, for the words of an overflow (None: unknown).

    Raises:
        HttpError: 400 with the reason: an unsupported field (named), a bad value, more than
            :data:`MAX_MESSAGES` messages or ``max_chars`` characters, too many stop strings.
    """
    body = fields.present(body)
    fields.check_fields(body, CHAT_FIELDS, "/v1/chat/completions", CHAT_NO_EFFECT)
    budget = TextBudget(max_chars, n_ctx)
    budget.add(tools_chars(body.get("tools")), "tools")
    system, turns = parse_messages(body.get("messages"), budget)
    tools, tool_choice, warnings = parse_tools(body.get("tools"), body.get("tool_choice"))
    top_logprobs = logprob_count(body)
    extra: dict[str, int] = {}
    if top_logprobs is not None:
        extra["logprobs"] = max(top_logprobs, 1)
    limit = fields.max_tokens(body, "max_completion_tokens", "max_tokens")
    params = fields.generation_params(body, limit, n_vocab, **extra)
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise HttpError(400, "'reasoning_effort' must be a string", code="invalid_value", param="reasoning_effort")
    return chat_request(
        system,
        turns,
        params=params,
        stream=fields.flag(body, "stream"),
        include_usage=include_usage,
        knowledge_bases=knowledge_bases(body, default_kbs),
        n=fields.choices(body),
        top_logprobs=top_logprobs,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        timings_per_token=fields.flag(body, "timings_per_token"),
        thinking=thinking_switch(body),
        reasoning_effort=effort,
        warnings=(*fields.no_effect_warnings(body, CHAT_NO_EFFECT), *warnings),
    )


def thinking_switch(body: Mapping[str, object]) -> bool | None:
    """``chat_template_kwargs.enable_thinking`` (llama.cpp's and vLLM's switch), or None.

    Raises:
        HttpError: 400 for any other template argument (the server passes none through).
    """
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
        raise HttpError(
            400,
            "'chat_template_kwargs' may only hold enable_thinking (true or false)",
            code="unsupported_parameter",
            param="chat_template_kwargs",
        )
    value = kwargs.get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise HttpError(400, "chat_template_kwargs.enable_thinking must be true or false", param="chat_template_kwargs")
    return value


# ---------------------------------------------------------------------------- results


@dataclass
class Choice:
    """What one choice of a reply came to: its text, thinking, calls, tokens and end."""

    index: int
    finished: Finished
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)
    truncated: bool = False  # the last call was cut off by max_tokens (its raw arguments are partial)


def forced_call(request: ChatRequest) -> bool:
    """Whether the request forces a call (``required`` or a named function, with tools): its reply is
    constrained to the call's JSON, so whatever it says is a call, even cut off by ``max_tokens``."""
    return bool(request.tools) and request.tool_choice not in ("auto", "none")


_CALL_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)(")?')
_CALL_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*')


def truncated_call(text: str, request: ChatRequest) -> ToolCall | None:
    """The call a forced reply cut off by ``max_tokens`` was writing (its JSON, ``{"name": ...,
    "arguments": ...``, unfinished), or None when ``text`` is not the start of one.

    The call's ``raw`` is its arguments' text as far as it got (what OpenAI returns as
    ``arguments`` with ``finish_reason: "length"``); its ``arguments`` are what of them parses
    once the open strings, arrays and objects are closed (``{}`` when nothing does).
    """
    from engine.inference.reply import new_call_id  # lazy: start-up (measured 35 ms); only a cut-off call needs it

    if not forced_call(request) or not text.lstrip().startswith("{"):
        return None
    names = [tool.name for tool in request.tools]
    head = _CALL_NAME.match(text)
    written = ""
    arguments_text = ""
    if head is not None:
        try:
            written = json.loads(f'"{head.group(1)}"')
        except ValueError:
            written = head.group(1)
        if head.group(2):
            rest = _CALL_ARGUMENTS.match(text, head.end())
            arguments_text = text[rest.end() :] if rest is not None else ""
        else:
            written = next((n for n in names if n.startswith(written)), written) if written else written
    if request.tool_choice in names:
        name = request.tool_choice
    elif written in names:
        name = written
    elif len(names) == 1:
        name = names[0]
    else:
        name = written
    return ToolCall(new_call_id(), name, _closed_json(arguments_text), arguments_text)


def _closed_json(text: str) -> Arguments:
    """What an unfinished JSON object parses to once its open strings and brackets are closed
    (an unfinished last member dropped); ``{}`` when nothing does."""
    closers: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            closers.append("}" if char == "{" else "]")
        elif char in "}]" and closers:
            closers.pop()
    body = text[:-1] if escaped else text
    tail = ('"' if in_string else "") + "".join(reversed(closers))
    cut = max(body.rfind(","), 0)
    for candidate in (body + tail, body.rstrip(" \n\t:,") + tail, body[:cut] + "".join(reversed(closers))):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def keeps_call(request: ChatRequest, calls: int) -> bool:
    """Whether a reply that has kept ``calls`` calls keeps one more (``parallel_tool_calls: false``
    keeps the first only, ``max_tool_calls`` at most that many)."""
    limit = 1 if not request.parallel_tool_calls else request.max_tool_calls
    return limit is None or calls < limit


def collect(index: int, events: Iterable[Event], keep_tokens: bool, request: ChatRequest | None = None) -> Choice:
    """Reads a whole generation into a :class:`Choice` (the answer, its thinking, the calls
    ``request`` keeps: :func:`keeps_call`)."""
    text, reasoning = "", ""
    calls: list[ToolCall] = []
    tokens: list[Token] = []
    finished: Finished | None = None
    for event in events:
        if isinstance(event, Token):
            text += event.text
            if keep_tokens:
                tokens.append(event)
        elif isinstance(event, Reasoning):
            reasoning += event.text
        elif isinstance(event, ToolCall):
            if request is None or keeps_call(request, len(calls)):
                calls.append(event)
        elif isinstance(event, Finished):
            finished = event
    if finished is None:
        raise EngineError("the engine ended without finishing the reply")
    if request is not None and finished.reason == "length" and not calls:
        cut = truncated_call(text, request)
        if cut is not None:  # a forced call cut off by max_tokens is a call, never text
            return Choice(index, finished, "", reasoning, [cut], tokens, truncated=True)
    return Choice(index, finished, text, reasoning, calls, tokens)


class FunctionDocument(TypedDict):
    name: str
    arguments: str  # JSON text


class ToolCallDocument(TypedDict):
    """One OpenAI ``tool_calls`` entry; ``index`` only in streamed deltas."""

    index: NotRequired[int]
    id: str
    type: Literal["function"]
    function: FunctionDocument


class TokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: NotRequired[list[TokenLogprob]]


class LogprobsDocument(TypedDict):
    content: list[TokenLogprob]
    refusal: None


class UsageDocument(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]


class TimingsDocument(TypedDict):
    """llama.cpp's server's ``timings``."""

    prompt_n: int
    cache_n: int
    prompt_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float


class MessageDocument(TypedDict):
    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCallDocument]]
    reasoning_content: NotRequired[str]


class ChoiceDocument(TypedDict):
    index: int
    message: MessageDocument
    finish_reason: str
    logprobs: LogprobsDocument | None


class CompletionDocument(TypedDict):
    """A ``chat.completion``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChoiceDocument]
    usage: UsageDocument
    timings: TimingsDocument
    sources: NotRequired[list[Source]]
    documents_dropped: NotRequired[int]  # passages found that did not fit the window (when some did not)


def tool_call_document(call: ToolCall, index: int | None = None, truncated: bool = False) -> ToolCallDocument:
    """One OpenAI ``tool_calls`` entry (``index`` is set in streamed deltas); a call cut off by
    ``max_tokens`` carries its arguments' text as far as it got, as OpenAI's does."""
    arguments = call.raw if truncated else json.dumps(call.arguments, ensure_ascii=False)
    function = FunctionDocument(name=call.name, arguments=arguments)
    if index is not None:
        return ToolCallDocument(index=index, id=call.id, type="function", function=function)
    return ToolCallDocument(id=call.id, type="function", function=function)


def _token_entry(text: str, logprob: float) -> TokenLogprob:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", errors="replace"))}


def logprob_entry(token: Token, top: int) -> TokenLogprob:
    """One ``logprobs.content`` entry for a Token that carries a log-probability (its alternatives
    cut to ``top``).

    With logprobs the decode loop reports every token, but a token's text may be held back while it
    could begin a stop string: then its entry's text is empty, and the text comes with a later token
    (or, at the end, with a last Token that has no log-probability: see :func:`logprobs_document`).
    """
    entry = _token_entry(token.text, float(token.logprob or 0.0))
    entry["top_logprobs"] = [_token_entry(text, value) for text, value in token.top_logprobs[:top]]
    return entry


def logprobs_document(tokens: Sequence[Token], top: int | None) -> LogprobsDocument | None:
    """A choice's ``logprobs`` (None when not asked for)."""
    if top is None:
        return None
    entries: list[TokenLogprob] = []
    for token in tokens:
        if token.logprob is not None:
            entries.append(logprob_entry(token, top))
        elif token.text and entries:  # the held-back tail, flushed at the end: the last tokens' text
            entries[-1]["token"] += token.text
            entries[-1]["bytes"] = list(entries[-1]["token"].encode("utf-8", errors="replace"))
    return {"content": entries, "refusal": None}


def finish_reason(reason: str, tool_calls: bool = False, truncated: bool = False) -> str:
    """OpenAI's ``finish_reason`` for the engine's (``tool_calls`` when the reply ended in calls,
    ``length`` when ``max_tokens`` cut one off)."""
    if tool_calls and not truncated:
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def usage_document(stats: Stats, completion_tokens: int | None = None) -> UsageDocument:
    """``usage``: the prompt's tokens and (all choices') completion tokens."""
    completion = stats.completion_tokens if completion_tokens is None else completion_tokens
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": stats.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def timings_document(stats: Stats) -> TimingsDocument:
    """llama.cpp's server's ``timings`` shape, so its clients read our figures too."""
    return {
        "prompt_n": stats.prompt_tokens - stats.cached_tokens,
        "cache_n": stats.cached_tokens,
        "prompt_ms": stats.prefill_ms,
        "prompt_per_second": stats.prefill_tps,
        "predicted_n": stats.completion_tokens,
        "predicted_ms": stats.decode_ms,
        "predicted_per_second": stats.decode_tps,
    }


def message_document(choice: Choice) -> MessageDocument:
    """The assistant ``message`` of a whole reply: its text (None when it only calls tools), its
    ``tool_calls`` and its ``reasoning_content`` (the thinking, apart from the answer)."""
    message: MessageDocument = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        message["content"] = choice.text or None
        message["tool_calls"] = [tool_call_document(call, truncated=choice.truncated) for call in choice.tool_calls]
    if choice.reasoning:
        message["reasoning_content"] = choice.reasoning
    return message


def completion_document(
    completion_id: str,
    created: int,
    model: str,
    choices: Sequence[Choice],
    sources: list[Source],
    top_logprobs: int | None = None,
) -> CompletionDocument:
    """The ``chat.completion`` document of a whole reply (one entry per choice)."""
    first = choices[0].finished.stats
    document: CompletionDocument = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": choice.index,
                "message": message_document(choice),
                "finish_reason": finish_reason(choice.finished.reason, bool(choice.tool_calls), choice.truncated),
                "logprobs": logprobs_document(choice.tokens, top_logprobs),
            }
            for choice in choices
        ],
        "usage": usage_document(first, sum(c.finished.stats.completion_tokens for c in choices)),
        "timings": timings_document(first),
    }
    if sources:
        document["sources"] = sources
    return document


class DeltaDocument(TypedDict, total=False):
    """What one streamed chunk adds to a choice's message."""

    role: Literal["assistant"]
    content: str
    reasoning_content: str
    tool_calls: list[ToolCallDocument]


class ChunkChoiceDocument(TypedDict):
    index: int
    delta: DeltaDocument
    logprobs: LogprobsDocument | None
    finish_reason: str | None


class ChunkDocument(TypedDict):
    """A ``chat.completion.chunk``: one choice's delta, or (``choices: []``) the usage at the end."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoiceDocument]
    timings: NotRequired[TimingsDocument]
    sources: NotRequired[list[Source]]
    documents_dropped: NotRequired[int]
    usage: NotRequired[UsageDocument]
