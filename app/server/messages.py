"""``POST /v1/messages``: Anthropic's Messages API over the same core as chat completions.

Contract: ARCHITECTURE.md, 'app.server.messages'.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from app.server import params as fields
from app.server.errors import HttpError, map_errors
from app.server.media_parts import anthropic_image
from app.server.sse import anthropic_error_events
from app.server.turn import check_backend, check_fits, engine_messages, hold_model, open_stream, read_turn, whole_choice
from app.server.wire import (
    Arguments,
    ChatRequest,
    Choice,
    TextBudget,
    WireMessage,
    chat_request,
    check_count,
    forced_call,
    keeps_call,
    parse_tools,
    tools_chars,
    truncated_call,
)
from engine.inference.events import Event, Finished, Reasoning, Token, ToolCall

if TYPE_CHECKING:
    from app.server.exchange import Exchange
    from engine.inference.events import Stats
    from engine.media import Media

MESSAGE_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
    }
)
"""The ``/v1/messages`` fields this server reads; any other is a 400."""

MESSAGE_NO_EFFECT = ("cache_control", "service_tier")
"""The :data:`~app.server.params.NO_EFFECT` fields ``/v1/messages`` accepts (prompt caching: the
KV cache is reused anyway)."""


def _output_config(value: object) -> tuple[dict[str, object], str | None]:
    """``output_config`` (the ``anthropic`` SDK's structured output, what ``messages.parse()`` sends):
    its ``format`` as the chat ``response_format``, its ``effort`` as the template's reasoning effort.

    Raises:
        HttpError: 400 for another key, or a format that is not ``json_schema`` with its schema.
    """
    if value is None:
        return {}, None
    if not isinstance(value, dict) or set(value) - {"format", "effort"}:
        raise HttpError(
            400, "'output_config' may only hold format and effort", code="unsupported_parameter", param="output_config"
        )
    effort = value.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise HttpError(400, "output_config.effort must be a string", param="output_config.effort")
    fmt = value.get("format")
    if fmt is None:
        return {}, effort
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise HttpError(
            400,
            "output_config.format must be {'type': 'json_schema', 'schema': {...}}",
            param="output_config.format",
        )
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}}, effort


def _blocks(content: object, where: str) -> list[dict[str, object]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise HttpError(400, f"{where} must be text or a list of content blocks", param=where)
    blocks: list[dict[str, object]] = []
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise HttpError(400, f"{where}[{index}] must be a content block", param=where)
        blocks.append(block)
    return blocks


def _result_text(content: object, where: str) -> str:
    if content is None:
        return ""
    parts = []
    for index, block in enumerate(_blocks(content, where)):
        text = block.get("text")
        if block.get("type") != "text" or not isinstance(text, str):
            raise HttpError(400, f"{where}[{index}]: a tool result may only hold text", param=where)
        parts.append(text)
    return "".join(parts)


def _system(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    return _result_text(value, "system") or None


def _conversation(messages: object, budget: TextBudget) -> list[WireMessage]:
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' must be a non-empty list", param="messages")
    check_count(messages, "messages")
    turns: list[WireMessage] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise HttpError(400, f"{where}: role must be user or assistant", param=where)
        text: list[str] = []
        calls: list[tuple[str, str, Arguments]] = []
        results: list[WireMessage] = []
        media: list[Media] = []
        for number, block in enumerate(_blocks(message.get("content"), f"{where}.content")):
            spot = f"{where}.content[{number}]"
            if block.get("type") == "image" and role == "user":
                media.append(anthropic_image(block, spot))
                continue
            _read_block(block, role == "assistant", spot, text, calls, results)
        budget.add(sum(len(result.content) for result in results))
        budget.add(sum(len(json.dumps(arguments, ensure_ascii=False)) for _, _, arguments in calls))
        turns.extend(results)
        joined = "".join(text)
        budget.add(len(joined))
        if role == "assistant":
            turns.append(WireMessage("assistant", joined, tuple(calls)))
        elif joined or media or not turns or turns[-1].role != "tool":
            turns.append(WireMessage("user", joined, media=tuple(media)))
    if turns[-1].role not in ("user", "tool"):
        raise HttpError(400, "the last message must be from the user", param="messages")
    return turns


def _read_block(
    block: dict[str, object],
    assistant: bool,
    spot: str,
    text: list[str],
    calls: list[tuple[str, str, Arguments]],
    results: list[WireMessage],
) -> None:
    """Adds one content block of a message to its text, its calls (an assistant's ``tool_use``) or
    its tool results (a user's ``tool_result``). Raises HttpError for a block not supported there."""
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        text.append(str(block["text"]))
    elif kind == "tool_use" and assistant:
        arguments = block.get("input") or {}
        call_id, name = block.get("id"), block.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise HttpError(400, f"{spot}: a tool_use block needs 'id', 'name' and 'input'", param=spot)
        if not isinstance(arguments, dict):
            raise HttpError(400, f"{spot}: 'input' must be an object", param=spot)
        calls.append((call_id, name, arguments))
    elif kind == "tool_result" and not assistant:
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            raise HttpError(400, f"{spot}: a tool_result block needs its 'tool_use_id'", param=spot)
        result = _result_text(block.get("content"), f"{spot}.content")
        if block.get("is_error"):
            result = f"Error: {result}"
        results.append(WireMessage("tool", result, tool_call_id=call_id))
    elif kind in ("thinking", "redacted_thinking") and assistant:
        return  # old reasoning is never sent back
    else:
        raise HttpError(
            400,
            f"{spot}: {str(kind)[:40]!r} blocks are not supported here",
            code="unsupported_content",
            param=spot,
        )


def _tool_choice(value: object) -> tuple[str | dict[str, object] | None, bool]:
    """Anthropic's ``tool_choice`` as the chat one, and whether parallel calls are allowed."""
    if value is None:
        return None, True
    if not isinstance(value, dict) or value.get("type") not in ("auto", "any", "tool", "none"):
        raise HttpError(400, "'tool_choice' must be {'type': 'auto' | 'any' | 'tool' | 'none'}", param="tool_choice")
    parallel = not value.get("disable_parallel_tool_use", False)
    kind = str(value["type"])
    if kind == "tool":
        return {"type": "function", "function": {"name": value.get("name")}}, parallel
    return ("required" if kind == "any" else kind), parallel


def parse_message_request(
    body: Mapping[str, object], max_chars: int, n_vocab: int | None, n_ctx: int | None = None
) -> ChatRequest:
    """A ``/v1/messages`` body as a ChatRequest (see the module docstring). Raises HttpError."""
    body = fields.present(body)
    fields.check_fields(body, MESSAGE_FIELDS, "/v1/messages", MESSAGE_NO_EFFECT)
    if "max_tokens" not in body:
        raise HttpError(400, "'max_tokens' is required", param="max_tokens")
    # The system prompt and the tools count with the messages, before anything is tokenized.
    budget = TextBudget(max_chars, n_ctx)
    system = _system(body.get("system"))
    budget.add(len(system or ""), "system")
    budget.add(tools_chars(body.get("tools")), "tools")
    turns = _conversation(body.get("messages"), budget)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise HttpError(400, "'tools' must be a list", param="tools")
    openai_tools = None
    if tools is not None:
        openai_tools = []
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or ("type" in tool and tool["type"] != "custom"):
                kind = tool.get("type") if isinstance(tool, dict) else None
                raise HttpError(
                    400, f"tools[{index}]: tools of type {str(kind)[:40]!r} are not supported", param="tools"
                )
            function = {"name": tool.get("name"), "description": tool.get("description") or "",
                        "parameters": tool.get("input_schema")}  # fmt: skip
            openai_tools.append({"type": "function", "function": function})
    choice, parallel = _tool_choice(body.get("tool_choice"))
    specs, tool_choice, warnings = parse_tools(openai_tools, choice)
    thinking = body.get("thinking")
    switch = None
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled"):
            raise HttpError(400, "'thinking' must be {'type': 'enabled' | 'disabled'}", param="thinking")
        switch = thinking["type"] == "enabled"
    sampling: dict[str, object] = {k: body[k] for k in ("temperature", "top_p", "top_k") if k in body}
    if "stop_sequences" in body:
        sampling["stop"] = body["stop_sequences"]
    output_format, effort = _output_config(body.get("output_config"))
    params = fields.generation_params({**sampling, **output_format}, body.get("max_tokens"), n_vocab)
    return chat_request(
        system,
        turns,
        params=params,
        stream=fields.flag(body, "stream"),
        include_usage=True,
        knowledge_bases=(),
        tools=specs,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        thinking=switch,
        reasoning_effort=effort,
        warnings=warnings,
    )


def _stop_reason(finished: Finished, calls: bool, stops: Sequence[str]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence``. The engine's stop strings also hold the
    template's (its end-of-turn text): only one of the request's ``stops`` is a ``stop_sequence``.
    A call cut off by ``max_tokens`` is a ``tool_use`` block with ``max_tokens``."""
    if finished.reason == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    matched = finished.stop_sequence
    if finished.reason == "stop" and matched is not None and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def _usage(stats: Stats) -> dict[str, int]:
    return {
        "input_tokens": stats.prompt_tokens - stats.cached_tokens,
        "cache_read_input_tokens": stats.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": stats.completion_tokens,
    }


def _content(choice: Choice) -> list[dict[str, object]]:
    blocks: list[dict[str, object]] = []
    if choice.reasoning:
        blocks.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.text or not choice.tool_calls:
        blocks.append({"type": "text", "text": choice.text})
    blocks.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in choice.tool_calls)
    return blocks


def _message(
    model: str,
    message_id: str,
    content: list[dict[str, object]],
    stop: tuple[str | None, str | None],
    usage: Mapping[str, int],
) -> dict[str, object]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop[0], "stop_sequence": stop[1], "usage": dict(usage)}  # fmt: skip


def handle(handler: Exchange) -> None:
    """Answers ``POST /v1/messages``."""
    state = handler.state
    request, wanted = read_turn(handler, handler.read_json(), parse_message_request)
    message_id = f"msg_{uuid.uuid4().hex}"
    with hold_model(handler, wanted, request) as cancel:
        check_fits(state.backend, request, None)
        if request.stream:
            _stream(handler, request, message_id, cancel)
            return
        choice = whole_choice(handler, request, 0, None, cancel)  # a forced call cut off is a call
        stop = _stop_reason(choice.finished, bool(choice.tool_calls), request.params.stop)
        handler.send_json(
            200, _message(state.model_id, message_id, _content(choice), stop, _usage(choice.finished.stats))
        )


def count_tokens(handler: Exchange) -> None:
    """Answers ``POST /v1/messages/count_tokens``: the prompt's tokens as the model reads it (its
    chat template, the tools included), ``{"input_tokens": N}``."""
    from engine.inference.context import effective_reserve  # lazy: start-up (measured 70 ms); a request loads it

    state = handler.state
    body = dict(handler.read_json())
    body.setdefault("max_tokens", 1)
    request, wanted = read_turn(handler, body, parse_message_request)
    with handler.use_model(wanted):
        backend = state.backend
        n_ctx = state.n_ctx
        if backend.local is None or n_ctx is None:  # a server's template renders its prompt
            raise HttpError(400, "this server's backend cannot count tokens", code="unsupported_parameter")
        check_backend(backend, request)
        room = map_errors(
            lambda: backend.result_room(
                engine_messages(request.messages),
                request.params,
                system=request.system,
                tools=request.tools,
                tool_choice=request.tool_choice,
                thinking=request.thinking,
            )
        )
        if room is None:
            raise HttpError(400, "this server's backend cannot count tokens", code="unsupported_parameter")
        kept = effective_reserve(n_ctx, min(backend.reply_reserve, request.params.max_tokens))
        handler.send_json(200, {"input_tokens": n_ctx - kept - room})


def _stream(handler: Exchange, request: ChatRequest, message_id: str, cancel: threading.Event) -> None:
    model = handler.state.model_id

    def send(kind: str, **data: object) -> None:
        handler.send_event({"type": kind, **data}, kind)

    def produce(events: Iterator[Event]) -> None:
        zero = {"input_tokens": 0, "output_tokens": 0}
        send("message_start", message=_message(model, message_id, [], (None, None), zero))
        index = -1
        open_kind: str | None = None
        calls = 0

        def start(kind: str, block: dict[str, object]) -> None:
            nonlocal index, open_kind
            if open_kind is not None:
                send("content_block_stop", index=index)
            index += 1
            open_kind = kind
            send("content_block_start", index=index, content_block=block)

        held: list[Token] | None = [] if forced_call(request) else None  # see chat's stream
        for event in events:
            if held is not None and isinstance(event, Token):
                held.append(event)
            elif isinstance(event, Reasoning) and event.text:
                if open_kind != "thinking":
                    start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                send("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": event.text})
            elif isinstance(event, Token) and event.text:
                if open_kind != "text":
                    start("text", {"type": "text", "text": ""})
                send("content_block_delta", index=index, delta={"type": "text_delta", "text": event.text})
            elif isinstance(event, ToolCall) and keeps_call(request, calls):
                calls += 1
                start("tool_use", {"type": "tool_use", "id": event.id, "name": event.name, "input": {}})
                partial = json.dumps(event.arguments, ensure_ascii=False)
                send("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial})
            elif isinstance(event, Finished):
                text = "".join(t.text for t in held or [])
                cut = (
                    truncated_call(text, request)
                    if held is not None and not calls and event.reason == "length"
                    else None
                )
                if cut is not None:
                    calls += 1
                    start("tool_use", {"type": "tool_use", "id": cut.id, "name": cut.name, "input": {}})
                    send(
                        "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": cut.raw}
                    )
                elif text:
                    start("text", {"type": "text", "text": ""})
                    send("content_block_delta", index=index, delta={"type": "text_delta", "text": text})
                if open_kind is None:
                    start("text", {"type": "text", "text": ""})
                send("content_block_stop", index=index)
                reason, sequence = _stop_reason(event, calls > 0, request.params.stop)
                delta = {"stop_reason": reason, "stop_sequence": sequence}
                send("message_delta", delta=delta, usage=_usage(event.stats))
                send("message_stop")

    handler.stream(
        open_stream(handler.state.backend, request, 0, None, cancel), cancel, produce, anthropic_error_events
    )
