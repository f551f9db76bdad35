"""``POST /v1/responses``: OpenAI's Responses API over the same core as chat completions.

Contract: ARCHITECTURE.md, 'app.server.responses'.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

from app.server import params as fields
from app.server.errors import HttpError
from app.server.turn import check_fits, hold_model, open_stream, read_turn, whole_choice
from app.server.wire import (
    ChatRequest,
    Choice,
    TextBudget,
    TokenLogprob,
    WireMessage,
    call_arguments,
    chat_request,
    check_count,
    keeps_call,
    logprob_entry,
    logprobs_document,
    parse_tools,
    tools_chars,
)
from engine.inference.events import Event, Finished, Reasoning, Token, ToolCall

if TYPE_CHECKING:
    from app.server.exchange import Exchange
    from app.server.sse import SseEvent

RESPONSE_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repeat_penalty",
        "seed",
        "stream",
        "text",
        "reasoning",
        "include",
        "truncation",
        "store",
        "previous_response_id",
        "top_logprobs",
        "max_tool_calls",
        "stream_options",
        *fields.SAMPLING - {"stop", "logit_bias"},
    }
)
"""The ``/v1/responses`` fields this server reads; any other is a 400."""

RESPONSE_NO_EFFECT = ("service_tier", "prompt_cache_retention")
"""The :data:`~app.server.params.NO_EFFECT` fields ``/v1/responses`` accepts."""

INCLUDES = frozenset({"reasoning.encrypted_content", "message.output_text.logprobs"})
"""What ``include`` may ask for (the reasoning's encrypted content is empty here)."""


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[object]
    logprobs: NotRequired[list[TokenLogprob]]


class ReasoningItem(TypedDict):
    """A ``reasoning`` output item (while it streams, without its content)."""

    type: Literal["reasoning"]
    id: str
    summary: list[object]
    content: NotRequired[list[dict[str, str]]]
    encrypted_content: NotRequired[None]


class MessageItem(TypedDict):
    type: Literal["message"]
    id: str
    status: str
    role: Literal["assistant"]
    content: list[OutputText]


class CallItem(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text
    status: str


OutputItem = ReasoningItem | MessageItem | CallItem


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise HttpError(
                    400,
                    f"{where}[{index}]: only text content is supported, not {str(kind)[:40]!r}",
                    code="unsupported_content",
                    param=f"{where}[{index}]",
                )
        return "".join(parts)
    raise HttpError(400, f"{where} must be text or a list of text parts", param=where)


def _items(value: object, instructions: object, budget: TextBudget) -> tuple[str | None, list[WireMessage]]:
    """The system prompt and the conversation of ``instructions`` and ``input``, counted against
    ``budget`` (and at most :data:`~app.server.wire.MAX_MESSAGES` items) as they are read."""
    system = [instructions] if isinstance(instructions, str) and instructions else []
    if instructions is not None and not isinstance(instructions, str):
        raise HttpError(400, "'instructions' must be a string", param="instructions")
    budget.add(len(instructions) if isinstance(instructions, str) else 0, "instructions")
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise HttpError(400, "'input' must be a string or a non-empty list of items", param="input")
    check_count(value, "input")
    turns: list[WireMessage] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise HttpError(400, f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = _text(item.get("content"), f"{where}.content")
            if role in ("system", "developer"):
                system.append(text)
            elif role in ("user", "assistant"):
                turns.append(WireMessage(role, text))
            else:
                raise HttpError(400, f"{where}: role {str(role)[:40]!r} is not supported", param=where)
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise HttpError(400, f"{where}: a function_call needs its 'name' and 'call_id'", param=where)
            raw = item.get("arguments")
            arguments = call_arguments(raw, f"{where}.arguments")  # checked first, so a bad one is named
            budget.add(len(raw) if isinstance(raw, str) else len(json.dumps(arguments, ensure_ascii=False)), "input")
            if turns and turns[-1].role == "assistant":  # calls after the assistant's text: one turn
                last = turns.pop()
                turns.append(WireMessage("assistant", last.content, (*last.tool_calls, (call_id, name, arguments))))
            else:
                turns.append(WireMessage("assistant", "", ((call_id, name, arguments),)))
            text = ""
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            output = item.get("output")
            if not isinstance(call_id, str):
                raise HttpError(400, f"{where}: a function_call_output needs its 'call_id'", param=where)
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            turns.append(WireMessage("tool", text, tool_call_id=call_id))
        elif kind == "reasoning":
            continue  # old reasoning is never sent back (it wastes the window)
        else:
            raise HttpError(400, f"{where}: items of type {str(kind)[:40]!r} are not supported", param=where)
        budget.add(len(text), "input")
    if not turns or turns[-1].role not in ("user", "tool"):
        raise HttpError(400, "the input must end with a user message or a function_call_output", param="input")
    return ("\n\n".join(system) if system else None), turns


def _tools(value: object) -> list[dict[str, object]] | None:
    """Responses-shaped function tools (``{"type": "function", "name", ...}``) in chat-completions shape."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise HttpError(400, "'tools' must be a list", param="tools")
    tools: list[dict[str, object]] = []
    for index, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise HttpError(
                400,
                f"tools[{index}]: only function tools are supported, not {str(kind)[:40]!r}",
                code="invalid_value",
                param=f"tools[{index}]",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


def _format(text: object) -> dict[str, object]:
    """``text.format`` as a chat ``response_format``."""
    if text is None:
        return {}
    fmt = text.get("format") if isinstance(text, dict) else None
    if (
        not isinstance(text, dict)
        or set(text) - {"format", "verbosity"}
        or (fmt is not None and not isinstance(fmt, dict))
    ):
        raise HttpError(400, "'text' may only hold {'format': {...}}", code="unsupported_parameter", param="text")
    if text.get("verbosity") not in (None, "low", "medium", "high"):  # a hint, accepted with no effect
        raise HttpError(400, "text.verbosity must be low, medium or high", param="text.verbosity")
    if not fmt or fmt.get("type") == "text":
        return {}
    if fmt.get("type") == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}}
    return {"response_format": fmt}


def parse_response_request(
    body: Mapping[str, object], max_chars: int, n_vocab: int | None, n_ctx: int | None = None
) -> ChatRequest:
    """A ``/v1/responses`` body as a ChatRequest (see the module docstring). Raises HttpError."""
    body = fields.present(body)
    fields.check_fields(body, RESPONSE_FIELDS, "/v1/responses", RESPONSE_NO_EFFECT)
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or set(include) - INCLUDES):
        raise HttpError(
            400,
            f"'include' may only ask for {' and '.join(sorted(INCLUDES))}",
            code="unsupported_parameter",
            param="include",
        )
    if body.get("truncation") not in (None, "disabled", "auto"):
        raise HttpError(400, "'truncation' must be 'auto' or 'disabled'", code="invalid_value", param="truncation")
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise HttpError(400, "'top_logprobs' must be an integer from 0 to 20", param="top_logprobs")
    max_calls = body.get("max_tool_calls")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1):
        raise HttpError(400, "'max_tool_calls' must be a positive integer", param="max_tool_calls")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise HttpError(400, "'stream_options' must be an object", param="stream_options")
    budget = TextBudget(max_chars, n_ctx)
    budget.add(tools_chars(body.get("tools")), "tools")
    system, turns = _items(body.get("input"), body.get("instructions"), budget)
    tools, tool_choice, warnings = parse_tools(_tools(body.get("tools")), body.get("tool_choice"))
    reasoning = body.get("reasoning")
    effort = None
    if reasoning is not None:
        if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary"}:
            raise HttpError(400, "'reasoning' may only hold effort", code="unsupported_parameter", param="reasoning")
        effort = reasoning.get("effort")
    sampling: dict[str, object] = {k: body[k] for k in fields.SAMPLING if k in body}
    extra = {"logprobs": max(top, 1)} if top is not None else {}
    text_format = _format(body.get("text"))
    params = fields.generation_params({**sampling, **text_format}, body.get("max_output_tokens"), n_vocab, **extra)
    return chat_request(
        system,
        turns,
        params=params,
        stream=fields.flag(body, "stream"),
        include_usage=True,
        knowledge_bases=(),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        reasoning_effort=effort if isinstance(effort, str) else None,
        top_logprobs=top,
        max_tool_calls=max_calls,
        truncate=body.get("truncation") == "auto",
        warnings=(*fields.no_effect_warnings(body, RESPONSE_NO_EFFECT), *warnings),
    )


class _Shape:
    """The ``response`` document and its items, for one request."""

    def __init__(
        self, handler: Exchange, body: Mapping[str, object], request: ChatRequest, items: Sequence[object] = ()
    ) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = handler.state.model_id
        self.body = body
        self.request = request
        self.store = body.get("store") is not False
        self.items = list(items)  # the conversation before the output (stored with it)
        self.responses = handler.state.responses

    def keep(self, document: Mapping[str, object], output: Sequence[OutputItem]) -> None:
        """Stores the finished response, unless the request said ``store: false``."""
        if self.store:
            self.responses.put(self.id, document, [*self.items, *output])  # type: ignore[list-item]

    def response(
        self, status: str, output: Sequence[OutputItem], finished: Finished | None = None
    ) -> dict[str, object]:
        incomplete = {"reason": "max_output_tokens"} if finished is not None and finished.reason == "length" else None
        document: dict[str, object] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": "incomplete" if incomplete else status,
            "model": self.model,
            "output": list(output),
            "error": None,
            "incomplete_details": incomplete,
            "instructions": self.body.get("instructions"),
            "metadata": self.body.get("metadata") or {},
            "parallel_tool_calls": self.request.parallel_tool_calls,
            "tool_choice": self.body.get("tool_choice") or ("auto" if self.request.tools else "none"),
            "tools": self.body.get("tools") or [],
            "temperature": self.request.params.temperature,
            "top_p": self.request.params.top_p,
            "max_output_tokens": self.body.get("max_output_tokens"),
            "text": self.body.get("text") or {"format": {"type": "text"}},
            "store": self.store,
            "previous_response_id": self.body.get("previous_response_id"),
        }
        if finished is not None:
            stats = finished.stats
            document["usage"] = {
                "input_tokens": stats.prompt_tokens,
                "input_tokens_details": {"cached_tokens": stats.cached_tokens},
                "output_tokens": stats.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": finished.reasoning_tokens},
                "total_tokens": stats.prompt_tokens + stats.completion_tokens,
            }
        return document

    @staticmethod
    def reasoning_item(item_id: str, text: str) -> ReasoningItem:
        # encrypted_content stays empty: reasoning is never carried into the next turn (it wastes the
        # window), so a client that asks for it to send back gets nothing to send.
        return {
            "type": "reasoning",
            "id": item_id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": None,
        }

    @staticmethod
    def message_item(
        item_id: str, text: str, status: str = "completed", logprobs: list[TokenLogprob] | None = None
    ) -> MessageItem:
        part: OutputText = {"type": "output_text", "text": text, "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        content: list[OutputText] = [part] if status == "completed" else []
        return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def call_item(call: ToolCall, status: str = "completed") -> CallItem:
        arguments = json.dumps(call.arguments, ensure_ascii=False) if status == "completed" else ""
        return {"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": call.name,
                "arguments": arguments, "status": status}  # fmt: skip

    def output(self, choice: Choice) -> list[OutputItem]:
        items: list[OutputItem] = []
        if choice.reasoning:
            items.append(self.reasoning_item(f"rs_{uuid.uuid4().hex}", choice.reasoning))
        if choice.text or not choice.tool_calls:
            logprobs = logprobs_document(choice.tokens, self.request.top_logprobs)
            content = logprobs["content"] if logprobs is not None else None
            items.append(self.message_item(f"msg_{uuid.uuid4().hex}", choice.text, logprobs=content))
        if choice.truncated:  # a forced call cut off by max_output_tokens: its arguments as far as they got
            for call in choice.tool_calls:
                item = self.call_item(call, "incomplete")
                item["arguments"] = call.raw
                items.append(item)
        else:
            items.extend(self.call_item(call) for call in choice.tool_calls)
        return items


def handle(handler: Exchange) -> None:
    """Answers ``POST /v1/responses``."""
    state = handler.state
    body = handler.read_json()
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise HttpError(400, "'store' must be true or false", code="invalid_value", param="store")
    items = _conversation(handler, body)
    request, wanted = read_turn(
        handler, body, lambda b, chars, vocab, ctx: parse_response_request({**b, "input": items}, chars, vocab, ctx)
    )
    shape = _Shape(handler, body, request, items if isinstance(items, list) else ())
    with hold_model(handler, wanted, request, truncate=request.truncate) as cancel:
        if not request.truncate:
            check_fits(state.backend, request, None)
        if request.stream:
            _stream(handler, shape, request, cancel)
            return
        choice = whole_choice(handler, request, 0, None, cancel)
        output = shape.output(choice)
        document = shape.response("completed", output, choice.finished)
        shape.keep(document, output)
        handler.send_json(200, document)


def _conversation(handler: Exchange, body: Mapping[str, object]) -> object:
    """The request's ``input`` as items, after the conversation of its ``previous_response_id``
    (the input as it is when there is none, or when it is not a string or a list: the parser then
    says what is wrong). Raises HttpError: 404 when that response is not stored."""
    value = body.get("input")
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    previous = body.get("previous_response_id")
    if previous is None:
        return value
    if not isinstance(previous, str) or not previous:
        raise HttpError(400, "'previous_response_id' must be a response id", param="previous_response_id")
    stored = handler.state.responses.get(previous)
    if stored is None:
        raise _not_found(previous, "previous_response_id")
    return [*stored[1], *value] if isinstance(value, list) and value else value


def _not_found(response_id: str, param: str | None = None) -> HttpError:
    return HttpError(404, f"Response with id {response_id[:200]!r} not found.", param=param)


def _response_id(handler: Exchange) -> str:
    """The ``{id}`` of ``/v1/responses/{id}``; a query string is refused (none is supported)."""
    path, _, query = handler.path.partition("?")
    if query:
        name = query.split("=", 1)[0][:40]
        raise HttpError(400, f"the query parameter {name!r} is not supported", code="unsupported_parameter",
                        param=name)  # fmt: skip
    return path.rstrip("/")[len("/v1/responses/") :]


def retrieve(handler: Exchange) -> None:
    """Answers ``GET /v1/responses/{id}``: the stored response, as it was answered."""
    response_id = _response_id(handler)
    stored = handler.state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    handler.send_json(200, stored[0])


def delete(handler: Exchange) -> None:
    """Answers ``DELETE /v1/responses/{id}``: forgets the stored response."""
    if (handler.headers.get("Content-Length") or "0").strip() != "0" or handler.headers.get("Transfer-Encoding"):
        handler.close_connection = True  # a body no one reads would be taken for the next request
    response_id = _response_id(handler)
    if not handler.state.responses.delete(response_id):
        raise _not_found(response_id)
    handler.send_json(200, {"id": response_id, "object": "response", "deleted": True})


def _stream(handler: Exchange, shape: _Shape, request: ChatRequest, cancel: threading.Event) -> None:
    stream = _ResponseStream(handler, shape, request)
    handler.stream(
        open_stream(handler.state.backend, request, 0, None, cancel), cancel, stream.produce, stream.error_events
    )


class _ResponseStream:
    """The typed events of one streamed response: items open, grow by deltas and close in order."""

    def __init__(self, handler: Exchange, shape: _Shape, request: ChatRequest) -> None:
        self.handler = handler
        self.shape = shape
        self.request = request
        self.sequence = 0
        self.output: list[OutputItem] = []
        self.open_item: ReasoningItem | MessageItem | None = None  # the reasoning or message item being streamed
        self.text = ""
        self.logprobs: list[TokenLogprob] = []
        self.calls = 0

    def send(self, kind: str, **data: object) -> None:
        self.handler.send_event({"type": kind, "sequence_number": self.sequence, **data}, kind)
        self.sequence += 1

    def produce(self, events: Iterator[Event]) -> None:
        self.send("response.created", response=self.shape.response("in_progress", []))
        self.send("response.in_progress", response=self.shape.response("in_progress", []))
        for event in events:
            if isinstance(event, Reasoning) and event.text:
                item = self.open_kind("reasoning")
                self.text += event.text
                self.send("response.reasoning_text.delta", item_id=item["id"], output_index=len(self.output),
                          content_index=0, delta=event.text)  # fmt: skip
            elif isinstance(event, Token) and (event.text or event.logprob is not None):
                item = self.open_kind("message")
                self.text += event.text
                top = self.request.top_logprobs
                entries = [logprob_entry(event, top)] if top is not None and event.logprob is not None else []
                self.logprobs.extend(entries)
                self.send("response.output_text.delta", item_id=item["id"], output_index=len(self.output),
                          content_index=0, delta=event.text, logprobs=entries)  # fmt: skip
            elif isinstance(event, ToolCall) and keeps_call(self.request, self.calls):
                self.tool_call(event)
            elif isinstance(event, Finished):
                self.finish(event)

    def close_item(self) -> None:
        """Ends the reasoning or message item being streamed, if any."""
        if self.open_item is None:
            return
        index, text = len(self.output), self.text
        item: ReasoningItem | MessageItem
        if self.open_item["type"] == "reasoning":
            item = self.shape.reasoning_item(self.open_item["id"], text)
            self.send("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                      text=text)  # fmt: skip
        else:
            kept = self.logprobs if self.request.top_logprobs is not None else None
            item = self.shape.message_item(self.open_item["id"], text, logprobs=kept)
            part = item["content"][0]
            self.send("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                      logprobs=kept or [])  # fmt: skip
            self.send("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                      part=part)  # fmt: skip
        self.send("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self.open_item, self.text, self.logprobs = None, "", []

    def open_kind(self, kind: str) -> ReasoningItem | MessageItem:
        """The item of ``kind`` being streamed: the open one, or a new one (closing the other)."""
        if self.open_item is not None and self.open_item["type"] == kind:
            return self.open_item
        self.close_item()
        index = len(self.output)
        if kind == "reasoning":
            item: ReasoningItem | MessageItem = {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": []}
            self.send("response.output_item.added", output_index=index, item=item)
        else:
            item = self.shape.message_item(f"msg_{uuid.uuid4().hex}", "", "in_progress")
            self.send("response.output_item.added", output_index=index, item=item)
            self.send("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                      part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
        self.open_item = item
        return item

    def tool_call(self, event: ToolCall) -> None:
        """One ``function_call`` item, whole: its arguments come in one delta."""
        self.close_item()
        self.calls += 1
        index = len(self.output)
        self.send("response.output_item.added", output_index=index, item=self.shape.call_item(event, "in_progress"))
        done = self.shape.call_item(event)
        self.send("response.function_call_arguments.delta", item_id=done["id"], output_index=index,
                  delta=done["arguments"])  # fmt: skip
        self.send("response.function_call_arguments.done", item_id=done["id"], output_index=index,
                  arguments=done["arguments"])  # fmt: skip
        self.send("response.output_item.done", output_index=index, item=done)
        self.output.append(done)

    def finish(self, event: Finished) -> None:
        if not self.output and self.open_item is None:
            self.open_kind("message")  # an empty answer is still a message
        self.close_item()
        final = self.shape.response("completed", self.output, event)
        self.shape.keep(final, self.output)
        self.send("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)

    def error_events(self, error: HttpError) -> list[SseEvent]:
        return [("error", {"type": "error", "sequence_number": self.sequence, "code": error.code or error.kind,
                           "message": error.message, "param": error.param})]  # fmt: skip
