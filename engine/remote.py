"""A chat backend for any OpenAI-compatible server (llama.cpp's server, llama-cpp-python's server,
vLLM, Ollama, LM Studio, ``glassbox serve``).

:class:`RemoteSession` has the same ``load`` / ``stream`` / ``close`` shape as the local
:class:`~engine.session.ChatSession` (see :mod:`engine.backends`) and streams the same typed events,
so the app treats local and remote models alike:

* the reply streams over SSE from ``/v1/chat/completions`` (``stream: true`` and
  ``stream_options.include_usage``); each content delta becomes a :class:`~engine.events.Token`
  (``token_id=-1``: the server does not say; with ``logprobs`` its log-probabilities), each
  ``reasoning_content`` (or ``reasoning``) delta a :class:`~engine.events.Reasoning`, and the
  ``tool_calls`` deltas, gathered by index, one :class:`~engine.events.ToolCall` each when the reply
  ends;
* what a request asks for goes to the server in OpenAI's terms: tools (:class:`~engine.tools.ToolSpec`)
  and ``tool_choice``, the ``tool`` role and an assistant's ``tool_calls``, ``json_schema`` as
  ``response_format``, ``logit_bias``, ``logprobs``; a GBNF ``grammar`` only to llama.cpp's family
  (the one that reads it), else an EngineError says so; the thinking switch as
  ``chat_template_kwargs.enable_thinking`` (llama.cpp, vLLM) and ``reasoning_effort`` as is. A server
  that refuses one answers with its own 400, which the error names;
* Stop closes the response: the cancel event is checked between SSE chunks, and the server sees the
  disconnect and stops generating;
* HTTP failures become the engine's typed errors: an unreachable server and a 5xx are
  :class:`~engine.errors.EngineError`, an unknown model :class:`~engine.errors.ModelLoadError`, a
  context-length refusal :class:`~engine.errors.ContextOverflow`. Every message is one line and
  starts with the server's URL;
* :class:`~engine.events.Stats` come from what the server reports (``usage`` token counts, and
  llama.cpp's ``timings`` when present) plus what the client measures (time to first token, decode
  tokens per second);
* the context map (``Stats.budget``) uses the server's tokenizer where it has one (``/tokenize`` on
  llama.cpp's server, ``/extras/tokenize`` on llama-cpp-python's) and falls back to ~4 characters per
  token otherwise, marked ``"estimated": 1``. The chat template is the server's business, so a fixed
  per-message overhead stands in for its role headers.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from engine.context import Message, OverflowPolicy, plan_context
from engine.errors import ContextOverflow, EngineError, ModelLoadError
from engine.events import Event, Finished, FinishReason, PrefillProgress, Reasoning, Stats, Token, ToolCall
from engine.runtime import GenerationParams
from engine.session import PromptView
from engine.tools import ToolSpec, normalize_tool_choice

TokenizerKind = Literal["llama.cpp", "llama-cpp-python", "estimate"]

CHARS_PER_TOKEN = 4
"""The estimate used when the server has no tokenizer endpoint."""
MESSAGE_OVERHEAD = 4
"""Tokens a chat template typically spends on one message's role header and separators."""
_UNKNOWN_CTX = 1 << 30
_CACHE_LIMIT = 512
_MESSAGE_MAX = 300


class ChatMessage(Protocol):
    """Anything with a role and a content (``engine.context.Message`` satisfies it)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


@dataclass(frozen=True)
class RemoteModel:
    """One entry of a server's ``/v1/models``.

    Attributes:
        id: the name to ask for in requests.
        owned_by: what the server says owns it, if anything.
        context_length: the context window, where the server reports one (vLLM's
            ``max_model_len``, Ollama/LM Studio's ``context_length``), else None.
    """

    id: str
    owned_by: str | None = None
    context_length: int | None = None


@dataclass(frozen=True)
class RemoteInfo:
    """What :meth:`RemoteSession.load` found out about the server and the model."""

    base_url: str
    model: str
    n_ctx: int
    """The context window in tokens; 0 when the server does not say and none was given."""
    tokenizer: TokenizerKind


def api_root(base_url: str) -> str:
    """``http://host:8080/v1/`` and ``http://host:8080`` both give ``http://host:8080``."""
    root = base_url.strip().rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MESSAGE_MAX else line[: _MESSAGE_MAX - 1] + "…"


def _server_message(response: httpx.Response) -> tuple[str, str]:
    """The (message, code) a server put in an error response, whatever its dialect."""
    try:
        body = response.read()
    except httpx.HTTPError:
        body = b""
    text = body.decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return _one_line(text) or response.reason_phrase, ""
    return _message_from_document(document, text)


def _message_from_document(document: Any, fallback: str) -> tuple[str, str]:
    error = document.get("error", document) if isinstance(document, dict) else document
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or fallback
        code = error.get("code") or error.get("type") or ""
        return _one_line(str(message)), str(code)
    return _one_line(str(error)), ""


def _looks_like_context_overflow(message: str, code: str) -> bool:
    lowered = f"{code} {message}".lower()
    return any(
        needle in lowered
        for needle in (
            "context_length_exceeded",
            "context length",
            "context window",
            "exceed_context_size",
            "maximum context",
            "too many tokens",
        )
    )


def raise_for_status(response: httpx.Response, base_url: str, model: str | None = None) -> None:
    """Maps an HTTP error response to the engine's typed errors (see the module docstring).

    Raises:
        EngineError: 401/403 ("refused the API key"), 5xx and anything else not 2xx.
        ModelLoadError: 404, or a ``model_not_found`` code.
        ContextOverflow: a 400 (or 413) that says the prompt exceeds the context.
    """
    status = response.status_code
    if status < 400:
        return
    message, code = _server_message(response)
    if status in (401, 403):
        raise EngineError(f"{base_url}: the server refused the API key ({status}: {message})")
    if status in (400, 413, 422) and _looks_like_context_overflow(message, code):
        raise ContextOverflow(f"{base_url}: the conversation does not fit the server's context: {message}")
    if status == 404 or "model_not_found" in code:
        what = f"model {model!r}" if model else "the requested resource"
        raise ModelLoadError(f"{base_url}: the server has no {what} ({status}: {message})")
    if status >= 500:
        raise EngineError(f"{base_url}: the server failed ({status}): {message}")
    raise EngineError(f"{base_url}: the server rejected the request ({status}): {message}")


def connection_error(base_url: str, exc: httpx.HTTPError) -> EngineError:
    """The one-line error for a transport failure (refused, DNS, TLS, timeout)."""
    if isinstance(exc, httpx.TimeoutException):
        return EngineError(f"{base_url}: the server did not answer in time ({type(exc).__name__})")
    reason = _one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return EngineError(f"cannot reach {base_url}: {reason}")
    return EngineError(f"{base_url}: the connection failed: {reason}")


def list_models(base_url: str, api_key: str | None = None, timeout: float = 15.0) -> list[RemoteModel]:
    """The models an OpenAI-compatible server offers (``GET /v1/models``).

    Raises:
        EngineError: unreachable, refused, or the answer is not a model list.
    """
    root = api_root(base_url)
    with httpx.Client(timeout=timeout, headers=_headers(api_key)) as client:
        return _fetch_models(client, root)


def _fetch_models(client: httpx.Client, root: str) -> list[RemoteModel]:
    try:
        response = client.get(f"{root}/v1/models")
    except httpx.HTTPError as exc:
        raise connection_error(root, exc) from None
    if response.status_code == 404:
        raise EngineError(f"{root}: no /v1/models here; is this an OpenAI-compatible server?")
    raise_for_status(response, root)
    try:
        document = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EngineError(f"{root}: /v1/models did not answer with JSON") from None
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise EngineError(f"{root}: /v1/models did not answer with a model list")
    models: list[RemoteModel] = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            owner = _str_or_none(entry.get("owned_by"))
            models.append(RemoteModel(entry["id"], owner, _context_length(entry)))
    return models


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _context_length(entry: dict[str, Any]) -> int | None:
    for key in ("max_model_len", "context_length", "context_window", "n_ctx"):
        value = entry.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass
class _Reply:
    """What one streamed reply accumulated."""

    text: str = ""
    deltas: int = 0
    finish: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    t_first: float = 0.0
    t_last: float = 0.0
    done: bool = False
    reasoning: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)


class RemoteSession:
    """A model on an OpenAI-compatible server, used like a local :class:`ChatSession`.

    Args:
        base_url: the server, with or without the trailing ``/v1``.
        model: the model id to request; ``None`` or ``""`` picks the server's first model at load.
        api_key: sent as ``Authorization: Bearer``.
        timeout: seconds to wait for the server to connect or to send the next chunk.
        n_ctx: the server's context window, when known better than the server says.
        overflow_policy: "rolling" drops the oldest turns; "refuse" raises ContextOverflow.
        reply_reserve: tokens kept free for the reply.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        *,
        n_ctx: int | None = None,
        overflow_policy: OverflowPolicy = "rolling",
        reply_reserve: int = 512,
    ) -> None:
        self.base_url = api_root(base_url)
        self.model = model or ""
        self.overflow_policy: OverflowPolicy = overflow_policy
        self.reply_reserve = reply_reserve
        self._n_ctx_override = n_ctx
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            headers=_headers(api_key),
        )
        self.info: RemoteInfo | None = None
        self._token_cache: dict[str, int] = {}
        self._lock = threading.Lock()

    # lifetime ---------------------------------------------------------------------------------
    def load(self, cancel: threading.Event | None = None) -> RemoteInfo:
        """Checks the server and the model, and finds its context size and tokenizer (idempotent).

        Raises:
            EngineError: the server is unreachable or refuses the key.
            ModelLoadError: the server does not offer the model.
        """
        del cancel  # a few short requests; nothing worth interrupting
        with self._lock:
            return self._ensure_loaded()

    def _ensure_loaded(self) -> RemoteInfo:
        if self.info is not None:
            return self.info
        models = _fetch_models(self._client, self.base_url)
        if not self.model:
            if not models:
                raise ModelLoadError(f"{self.base_url}: the server offers no models")
            self.model = models[0].id
        match = next((m for m in models if m.id == self.model), None)
        if match is None:
            offered = ", ".join(m.id for m in models[:10]) or "none"
            raise ModelLoadError(
                f"{self.base_url}: the server has no model {self.model!r} (it offers: {offered})"
            )
        n_ctx = self._n_ctx_override or match.context_length or self._probe_props_n_ctx() or 0
        self.info = RemoteInfo(self.base_url, self.model, n_ctx, self._probe_tokenizer())
        return self.info

    def prompt_view(self) -> PromptView:
        """The last prompt's tokens: a remote server does not show them, so the view is empty."""
        return PromptView([], [])

    def close(self) -> None:
        """Closes the connection pool. A generation in progress ends with an error."""
        self._client.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_models(self) -> list[RemoteModel]:
        """The server's models (``GET /v1/models``). Raises EngineError."""
        return _fetch_models(self._client, self.base_url)

    # probes -----------------------------------------------------------------------------------
    def _post_json(self, path: str, payload: dict[str, Any]) -> Any | None:
        """POSTs and returns the JSON answer, or None when the server has no such endpoint."""
        try:
            response = self._client.post(f"{self.base_url}{path}", json=payload, timeout=10.0)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    def _probe_props_n_ctx(self) -> int | None:
        """llama.cpp's server says its context size in ``/props``."""
        try:
            response = self._client.get(f"{self.base_url}/props", timeout=10.0)
            document = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(document, dict):
            return None
        settings = document.get("default_generation_settings")
        for source in (settings, document):
            if isinstance(source, dict) and isinstance(source.get("n_ctx"), int) and source["n_ctx"] > 0:
                return int(source["n_ctx"])
        return None

    def _probe_tokenizer(self) -> TokenizerKind:
        answer = self._post_json("/tokenize", {"content": "hello"})
        if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            return "llama.cpp"
        answer = self._post_json("/extras/tokenize", {"input": "hello", "model": self.model})
        if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            return "llama-cpp-python"
        return "estimate"

    # token counting ---------------------------------------------------------------------------
    @property
    def estimated(self) -> bool:
        """True when token counts are estimated from characters (the server has no tokenizer)."""
        return self.info is None or self.info.tokenizer == "estimate"

    def count_text(self, text: str) -> int:
        """Tokens of a plain text, by the server's tokenizer where it has one (cached)."""
        if not text:
            return 0
        cached = self._token_cache.get(text)
        if cached is not None:
            return cached
        count = self._tokenize_count(text)
        if len(self._token_cache) >= _CACHE_LIMIT:
            self._token_cache.pop(next(iter(self._token_cache)))
        self._token_cache[text] = count
        return count

    def _tokenize_count(self, text: str) -> int:
        kind = self.info.tokenizer if self.info is not None else "estimate"
        answer: Any = None
        if kind == "llama.cpp":
            answer = self._post_json("/tokenize", {"content": text})
        elif kind == "llama-cpp-python":
            answer = self._post_json("/extras/tokenize", {"input": text, "model": self.model})
        if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            return len(answer["tokens"])
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def count_messages(self, messages: Sequence[ChatMessage]) -> int:
        """Tokens of a chat prompt: each message's text plus a fixed per-message template overhead."""
        return sum(self.count_text(m.content) + MESSAGE_OVERHEAD for m in messages) + MESSAGE_OVERHEAD

    # generation -------------------------------------------------------------------------------
    def stream(
        self,
        history: Sequence[ChatMessage],
        user: str | None,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: str | None = None,
        cancel: threading.Event | None = None,
        cache_key: object | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
    ) -> Iterator[Event]:
        """Streams the server's reply to ``user`` after ``history``; ends with Finished.

        ``user=None`` continues the last turn of ``history`` (after a ``tool`` message). ``tools``,
        ``tool_choice``, ``thinking`` and ``reasoning_effort`` go to the server (see the module
        docstring); ``cache_key`` names a local KV cache and means nothing here (the server keeps
        its own cache).

        Raises:
            EngineError: the server is unreachable, refuses the key or a field, fails or drops the
                stream; a ``tool_choice`` that needs tools or names none offered; a ``grammar`` for a
                server outside llama.cpp's family.
            ModelLoadError: the server does not offer the model.
            ContextOverflow: the conversation does not fit (here, or as the server says).
        """
        del cache_key
        params = params or GenerationParams()
        choice = normalize_tool_choice(tool_choice, tools)
        with self._lock:
            info = self._ensure_loaded()
            n_ctx = info.n_ctx or _UNKNOWN_CTX
            plan = plan_context(
                system=system,
                documents=documents,
                history=[_as_message(m) for m in history],
                user=user,
                n_ctx=n_ctx,
                reply_reserve=min(self.reply_reserve, params.max_tokens),
                count_tokens=self.count_messages,
                count_text=self.count_text,
                policy=self.overflow_policy,
            )
            payload = self._payload(plan.messages, params)
            self._add_turn_options(payload, tools, choice, thinking, reasoning_effort)
            t0 = time.perf_counter()
            yield PrefillProgress(0, plan.prompt_tokens)
            reply = _Reply()
            try:
                yield from self._stream_reply(payload, reply, plan.prompt_tokens, cancel)
            except httpx.HTTPError as exc:
                raise connection_error(self.base_url, exc) from None
            cancelled = not reply.done and cancel is not None and cancel.is_set()
            if not reply.done and not cancelled:
                raise EngineError(f"{self.base_url}: the server closed the stream before the reply finished")
            budget = dict(plan.breakdown)
            if not info.n_ctx:
                budget.update(free=0, n_ctx_unknown=1)
            if self.estimated:
                budget["estimated"] = 1
            calls = () if cancelled else self._tool_calls(reply)
            yield from calls
            stats = self._stats(reply, plan.prompt_tokens, plan.evicted, info, budget, t0)
            yield stats
            reason: FinishReason = "cancelled" if cancelled else _finish_reason(reply.finish)
            yield Finished(
                reason=reason,
                stats=stats,
                text=reply.text,
                reasoning=reply.reasoning,
                reasoning_tokens=_reasoning_tokens(reply.usage),
                tool_calls=calls,
            )

    def _payload(self, messages: Sequence[Message], params: GenerationParams) -> dict[str, Any]:
        llama_family = self.info is not None and self.info.tokenizer != "estimate"
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [_wire_message(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if self.info is not None and self.info.tokenizer != "estimate":
            # llama.cpp's family reads these too; strict servers (OpenAI's own) reject unknown fields.
            payload.update(top_k=params.top_k, min_p=params.min_p, repeat_penalty=params.repeat_penalty)
        if params.seed is not None:
            payload["seed"] = params.seed
        if params.stop:
            payload["stop"] = list(params.stop)
        if params.logit_bias:
            # OpenAI's range is -100..100, and -100 bans the token (the engine bans with -inf).
            payload["logit_bias"] = {str(t): max(-100.0, min(100.0, b)) for t, b in params.logit_bias}
        if params.logprobs:
            payload.update(logprobs=True, top_logprobs=params.logprobs)
        if params.json_schema is not None:
            schema = json.loads(params.json_schema)
            if schema == {"type": "object"}:
                payload["response_format"] = {"type": "json_object"}
            else:
                payload["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        if params.grammar is not None:
            if not llama_family:
                raise EngineError(
                    f"{self.base_url}: this server takes no GBNF grammar (only llama.cpp's family does); "
                    "use a JSON schema instead"
                )
            payload["grammar"] = params.grammar
        return payload

    def _add_turn_options(
        self,
        payload: dict[str, Any],
        tools: Sequence[ToolSpec],
        choice: str,
        thinking: bool | None,
        reasoning_effort: str | None,
    ) -> None:
        """The tools, the tool choice and the thinking switches, in OpenAI's (and llama.cpp's) terms."""
        if tools and choice != "none":
            payload["tools"] = [tool.as_openai() for tool in tools]
            payload["tool_choice"] = (
                choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}}
            )
        elif any(m.get("tool_calls") or m.get("role") == "tool" for m in payload["messages"]) and tools:
            payload["tools"] = [tool.as_openai() for tool in tools]  # the calls in history need them
            payload["tool_choice"] = "none"
        if thinking is not None:
            payload["chat_template_kwargs"] = {"enable_thinking": thinking}
        if reasoning_effort is not None:
            payload["reasoning_effort"] = reasoning_effort

    def _tool_calls(self, reply: _Reply) -> tuple[ToolCall, ...]:
        """The calls the server streamed, gathered by index.

        Raises:
            EngineError: a call without a name, or arguments that are not a JSON object.
        """
        calls: list[ToolCall] = []
        for index in sorted(reply.calls):
            part = reply.calls[index]
            name = part.get("name", "")
            if not name:
                raise EngineError(f"{self.base_url}: the server sent a tool call without a function name")
            try:
                arguments = json.loads(part.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = None
            if not isinstance(arguments, dict):
                raise EngineError(f"{self.base_url}: the server sent a call to {name!r} whose arguments are not JSON")
            call_id = part.get("id") or f"call_{index}"
            calls.append(ToolCall(call_id, name, arguments, json.dumps({"name": name, "arguments": arguments})))
        return tuple(calls)

    def _stream_reply(
        self, payload: dict[str, Any], reply: _Reply, prompt_tokens: int, cancel: threading.Event | None
    ) -> Iterator[Event]:
        url = f"{self.base_url}/v1/chat/completions"
        headers = {"Accept": "text/event-stream"}
        with self._client.stream("POST", url, json=payload, headers=headers) as response:
            raise_for_status(response, self.base_url, self.model)
            data: list[str] = []
            for line in response.iter_lines():
                if cancel is not None and cancel.is_set():
                    return  # leaving the ``with`` closes the response: the server stops
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                    continue
                if line or not data:
                    continue  # comments (": ping"), "event:"/"id:" fields, stray blank lines
                event, data = "\n".join(data), []
                if event.strip() == "[DONE]":
                    reply.done = True
                    return
                for token in self._apply_chunk(event, reply):
                    if reply.deltas == 1:
                        yield PrefillProgress(prompt_tokens, prompt_tokens)
                    yield token
            if data and "\n".join(data).strip() == "[DONE]":
                reply.done = True
            elif reply.finish is not None:
                reply.done = True  # some servers end the stream without [DONE]

    def _apply_chunk(self, event: str, reply: _Reply) -> list[Event]:
        try:
            chunk = json.loads(event)
        except json.JSONDecodeError:
            raise EngineError(f"{self.base_url}: the server sent a malformed stream chunk") from None
        if not isinstance(chunk, dict):
            return []
        if "error" in chunk:
            message, code = _message_from_document(chunk, event)
            if _looks_like_context_overflow(message, code):
                raise ContextOverflow(
                    f"{self.base_url}: the conversation does not fit the server's context: {message}"
                )
            raise EngineError(f"{self.base_url}: the server failed mid-reply: {message}")
        if isinstance(chunk.get("usage"), dict):
            reply.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            reply.timings = chunk["timings"]
        events: list[Event] = []
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # one reply: a server answering n > 1 anyway has its other choices skipped
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            thought = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(thought, str) and thought:
                self._arrived(reply)
                reply.reasoning += thought
                events.append(Reasoning(thought))
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._arrived(reply)
                reply.text += content
                events.append(_token(content, choice.get("logprobs")))
            _gather_calls(delta.get("tool_calls"), reply)
            if isinstance(choice.get("finish_reason"), str):
                reply.finish = choice["finish_reason"]
        return events

    @staticmethod
    def _arrived(reply: _Reply) -> None:
        now = time.perf_counter()
        if not reply.deltas:
            reply.t_first = now
        reply.t_last = now
        reply.deltas += 1

    def _stats(
        self,
        reply: _Reply,
        planned_prompt: int,
        evicted: int,
        info: RemoteInfo,
        budget: dict[str, int],
        t0: float,
    ) -> Stats:
        usage = reply.usage or {}
        timings = reply.timings or {}
        prompt = _int(usage.get("prompt_tokens"))
        if prompt is None and _int(timings.get("prompt_n")) is not None:
            prompt = (_int(timings.get("prompt_n")) or 0) + (_int(timings.get("cache_n")) or 0)
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        if cached is None:
            cached = _int(timings.get("cache_n"))
        completion = _int(usage.get("completion_tokens"))
        if completion is None:
            completion = _int(timings.get("predicted_n"))
        if prompt is None or completion is None:
            budget["estimated"] = 1
        prompt = planned_prompt if prompt is None else prompt
        completion = reply.deltas if completion is None else completion
        cached = cached or 0

        end = reply.t_last or time.perf_counter()
        ttft_ms = ((reply.t_first or end) - t0) * 1000
        prefill_ms = _float(timings.get("prompt_ms")) or ttft_ms
        client_decode_ms = (end - reply.t_first) * 1000 if reply.t_first else 0.0
        decode_ms = _float(timings.get("predicted_ms")) or client_decode_ms
        new_prompt = max(prompt - cached, 0)
        prefill_tps = new_prompt / (prefill_ms / 1000) if prefill_ms > 0 else 0.0
        # Client-measured: the rate the user sees (the first token's wait is TTFT, not decode).
        decoded = max(completion - 1, 0)
        decode_tps = decoded / (client_decode_ms / 1000) if client_decode_ms > 0 and decoded else 0.0
        return Stats(
            n_ctx=info.n_ctx,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            context_used=prompt + completion,
            evicted_messages=evicted,
            ttft_ms=round(ttft_ms, 2),
            prefill_ms=round(prefill_ms, 2),
            decode_ms=round(decode_ms, 2),
            prefill_tps=round(prefill_tps, 2),
            decode_tps=round(decode_tps, 2),
            template=f"remote:{self.base_url}",
            budget=budget,
        )


def _as_message(message: ChatMessage) -> Message:
    if isinstance(message, Message):
        return message
    if message.role == "user":
        return Message("user", message.content)
    if message.role == "assistant":
        return Message("assistant", message.content)
    if message.role == "system":
        return Message("system", message.content)
    raise EngineError(f"unknown chat role {message.role!r} (use system, user or assistant)")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def _finish_reason(server: str | None) -> FinishReason:
    return "length" if server == "length" else "stop"


def _wire_message(message: Message) -> dict[str, Any]:
    """One message in OpenAI's shape: an assistant's calls as ``tool_calls``, a tool's result with
    the ``tool_call_id`` it answers."""
    document: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        document["content"] = message.content or None
        document["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        document["tool_call_id"] = message.tool_call_id
        if message.name:
            document["name"] = message.name
    return document


def _gather_calls(deltas: Any, reply: _Reply) -> None:
    """Adds streamed ``tool_calls`` deltas to the calls being gathered (by ``index``; the name and the
    id come once, the arguments in pieces)."""
    if not isinstance(deltas, list):
        return
    for number, delta in enumerate(deltas):
        if not isinstance(delta, dict):
            continue
        index = delta.get("index", number)
        part = reply.calls.setdefault(index if isinstance(index, int) else number, {})
        if isinstance(delta.get("id"), str) and delta["id"]:
            part["id"] = delta["id"]
        function = delta.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and function["name"]:
                part["name"] = part.get("name", "") + function["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                part["arguments"] = part.get("arguments", "") + arguments
            elif isinstance(arguments, dict):  # some servers send the object itself
                part["arguments"] = json.dumps(arguments)


def _token(text: str, logprobs: Any) -> Token:
    """A content delta as a Token, with the server's log-probability when it sent one."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[-1], dict):
        return Token(text, -1)
    last = content[-1]
    value = last.get("logprob")
    top = last.get("top_logprobs")
    alternatives = tuple(
        (str(alt["token"]), float(alt["logprob"]))
        for alt in (top if isinstance(top, list) else [])
        if isinstance(alt, dict) and isinstance(alt.get("logprob"), int | float) and "token" in alt
    )
    return Token(text, -1, logprob=float(value) if isinstance(value, int | float) else None, top_logprobs=alternatives)


def _reasoning_tokens(usage: dict[str, Any] | None) -> int:
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    count = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return count if isinstance(count, int) and count >= 0 else 0
