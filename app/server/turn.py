"""The server's chat turn, shared by ``/v1/chat/completions``, ``/v1/responses`` and ``/v1/messages``:
the request read as a :class:`~app.server.wire.ChatRequest`, the model held and the turn's options
checked, then the app's one turn (:func:`app.turn.run_turn`) run for each choice. Each dialect only
reads its request shape and writes its answer (ARCHITECTURE.md, "The HTTP contract").
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from app.server import params as fields
from app.server.errors import HttpError, map_errors
from app.server.wire import ChatRequest, Choice, WireMessage, collect, text_limit
from app.turn import TurnRequest, run_turn
from engine.errors import EngineError
from engine.inference.events import Event, ToolCall

if TYPE_CHECKING:
    from app.knowledge_glue import Passages
    from app.server.exchange import Exchange
    from engine.inference.backends import ChatBackend
    from engine.inference.context import Message, RankedDocuments, Role

Parse = Callable[[Mapping[str, object], int, "int | None", "int | None"], ChatRequest]
"""A dialect's request parser: the body, the most characters of text, the vocabulary, the window."""


def read_turn(handler: Exchange, body: dict[str, object], parse: Parse) -> tuple[ChatRequest, str | None]:
    """The request's model (:meth:`~app.server.state.ServerState.check_model`, which takes the
    server's own fields out of ``body``) and the request read by ``parse`` with that model's limits.

    Returns:
        The request, and the model to lease (:meth:`~app.server.exchange.Exchange.use_model`).

    Raises:
        HttpError: 404 for a model not served; 400 for what ``parse`` refuses.
    """
    state = handler.state
    wanted = state.check_model(body)
    request = parse(body, text_limit(state.n_ctx), state.backend.n_vocab, state.n_ctx)
    return request, wanted


@contextmanager
def hold_model(
    handler: Exchange, wanted: str | None, request: ChatRequest, *, truncate: bool = False
) -> Iterator[threading.Event]:
    """Holds the request's model (:meth:`~app.server.exchange.Exchange.use_model`) with the turn's
    options checked (:func:`check_backend`); yields the request's cancel event. The request's
    warnings go in the answer's header. ``truncate``: :func:`overflow_allowed`."""
    state = handler.state
    handler.warnings.extend(request.warnings)
    with handler.use_model(wanted) as cancel, overflow_allowed(state.backend, truncate):
        check_backend(state.backend, request)
        yield cancel


def whole_choice(
    handler: Exchange, request: ChatRequest, index: int, passages: Passages | None, cancel: threading.Event
) -> Choice:
    """Choice ``index`` of ``request``, generated whole."""
    events = handler.generation(open_stream(handler.state.backend, request, index, passages, cancel), cancel)
    choice: Choice = map_errors(lambda: collect(index, events, request.top_logprobs is not None, request))
    return choice


def check_backend(backend: ChatBackend, request: ChatRequest) -> None:
    """Refuses what this backend cannot do, before the model is touched.

    A local session checks the turn's options with the engine's own rules (``engine.inference.turn.shape_turn``:
    the tool choice, a forced call with a schema of the caller's, the template's thinking switches),
    so that they are a 400 naming the reason rather than a failure mid-generation. A server checks
    them itself (its 400 is named in the error).

    Raises:
        HttpError: 400 when the engine refuses the turn's options.
    """
    local = backend.local
    template = local.template if local is not None else None
    if template is None:
        return
    from engine.inference.turn import shape_turn  # lazy: start-up (measured 60 ms); a local model's turn loads it

    try:
        shape_turn(
            template,
            request.params,
            tools=request.tools,
            tool_choice=request.tool_choice,
            thinking=request.thinking,
            reasoning_effort=request.reasoning_effort,
        )
    except EngineError as exc:
        param = "reasoning_effort" if "reasoning_effort" in str(exc) else "tool_choice"
        if "thinking switch" in str(exc):
            param = "chat_template_kwargs"
        raise HttpError(400, str(exc), code="invalid_value", param=param) from None


@contextmanager
def overflow_allowed(backend: ChatBackend, allowed: bool) -> Iterator[None]:
    """While a request that allows it runs (Responses' ``truncation: "auto"``), a session the server
    owns drops the oldest turns to fit instead of refusing (called under the model's lock)."""
    policy = backend.overflow_policy
    if not allowed or policy != "refuse":
        yield
        return
    backend.overflow_policy = "rolling"
    try:
        yield
    finally:
        backend.overflow_policy = policy


def check_fits(backend: ChatBackend, request: ChatRequest, documents: RankedDocuments | None) -> None:
    """The API's contract on a session that trims: a conversation that does not fit is a 400.

    A session the server owns refuses overflow itself (policy ``"refuse"``). The GUI's own session,
    shared through the API-server toggle, keeps the GUI's rolling eviction; for the API its room is
    measured first (``ChatBackend.result_room``: the window less the prompt and the reply reserve;
    a remote server's cannot be, and it refuses an overflow itself).

    Raises:
        HttpError: 400 ``context_length_exceeded``.
    """
    if backend.overflow_policy == "refuse":
        return
    room = map_errors(
        lambda: backend.result_room(
            engine_messages(request.messages),
            request.params,
            system=request.system,
            documents=documents,
            tools=request.tools,
            tool_choice=request.tool_choice,
            thinking=request.thinking,
            reasoning_effort=request.reasoning_effort,
        )
    )
    if room is not None and room < 0:
        raise HttpError(
            400,
            f"the conversation needs {-room} tokens more than this model's context window holds "
            "(with the reply's reserve): shorten it",
            code="context_length_exceeded",
            param="messages",
        )


def engine_messages(turns: Sequence[WireMessage]) -> list[Message]:
    """The engine's Messages for a conversation; a ``tool`` message gets its tool's name from the call."""
    from engine.inference.context import Message  # lazy: start-up (measured 70 ms); a request loads it

    messages: list[Message] = []
    names: dict[str, str] = {}
    for turn in turns:
        if turn.role == "assistant" and turn.tool_calls:
            calls = tuple(
                ToolCall(call_id, name, arguments, json.dumps({"name": name, "arguments": arguments}))
                for call_id, name, arguments in turn.tool_calls
            )
            names.update((call_id, name) for call_id, name, _ in turn.tool_calls)
            messages.append(Message("assistant", turn.content, tool_calls=calls))
        elif turn.role == "tool":
            call_id = turn.tool_call_id or ""
            messages.append(Message("tool", turn.content, tool_call_id=call_id, name=names.get(call_id, "")))
        else:
            role: Role = "assistant" if turn.role == "assistant" else "user"
            messages.append(Message(role, turn.content, media=turn.media if role == "user" else ()))
    return messages


def open_stream(
    backend: ChatBackend, request: ChatRequest, index: int, passages: Passages | None, cancel: threading.Event
) -> Iterator[Event]:
    """The events of choice ``index`` of ``request``: the app's one turn (``app.turn.run_turn``),
    its tools offered and their calls returned to the client, unrun."""
    # After a tool's result the reply continues the last turn: no new user message (user=None).
    user = request.user if request.messages[-1].role == "user" else None
    turn = TurnRequest(
        tuple(engine_messages(request.history)),
        user,
        fields.seeded(request.params, index),
        request.system,
        passages=passages,
        offered=tuple(request.tools),
        tool_choice=request.tool_choice if request.tools else None,
        thinking=request.thinking,
        reasoning_effort=request.reasoning_effort,
        media=request.user_media if user is not None else (),
        cancel=cancel,
    )
    return cast("Iterator[Event]", iter(run_turn(backend, turn)))  # a plain turn streams the backend's events
