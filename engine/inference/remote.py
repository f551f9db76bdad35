"""A chat backend for any OpenAI-compatible server (llama.cpp's server, llama-cpp-python's server,
vLLM, Ollama, LM Studio, ``glassbox serve``).

Contract: ARCHITECTURE.md, 'engine.inference.remote'.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from engine.errors import EngineError, ModelLoadError
from engine.inference.context import DEFAULT_DOCUMENTS_WINDOW, Message, OverflowPolicy, RankedDocuments, plan_context
from engine.inference.events import Event, Finished, FinishReason, PrefillProgress, Token
from engine.inference.remote_errors import connection_error, raise_for_status
from engine.inference.remote_request import add_turn_options, chat_payload
from engine.inference.remote_stream import (
    StreamedReply,
    finish_reason,
    reasoning_tokens,
    reply_stats,
    sse_events,
    tool_calls,
)
from engine.inference.reply import ReplyShaper
from engine.inference.runtime import GenerationParams
from engine.inference.session import PromptView
from engine.inference.tools import ToolSpec, normalize_tool_choice
from engine.media import Media

TokenizerKind = Literal["llama.cpp", "llama-cpp-python", "estimate"]

CHARS_PER_TOKEN = 4
"""The estimate used when the server has no tokenizer endpoint."""
MESSAGE_OVERHEAD = 4
MEDIA_TOKENS_ESTIMATE = 256
"""What an image or a clip is counted as on a server (its projector's count is the server's own):
a guess, so a budget with media is marked estimated."""
"""Tokens a chat template typically spends on one message's role header and separators."""
_UNKNOWN_CTX = 1 << 30
_CACHE_LIMIT = 512


class ChatMessage(Protocol):
    """Anything with a role and a content (``engine.inference.context.Message`` satisfies it)."""

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
    kind: Literal["remote"] = "remote"
    """ModelInfo's is ``"local"``: which of the two a load reported."""


def api_root(base_url: str) -> str:
    """``http://host:8080/v1/`` and ``http://host:8080`` both give ``http://host:8080``."""
    root = base_url.strip().rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


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
            raise ModelLoadError(f"{self.base_url}: the server has no model {self.model!r} (it offers: {offered})")
        n_ctx = self._n_ctx_override or match.context_length or self._probe_props_n_ctx() or 0
        self.info = RemoteInfo(self.base_url, self.model, n_ctx, self._probe_tokenizer())
        return self.info

    # what the model is (engine.inference.backends.ChatBackend) ----------------------------------
    @property
    def model_id(self) -> str:
        return self.model

    @property
    def n_ctx(self) -> int:
        """The window the server reported (or the one given); 0 when it does not say."""
        return self.info.n_ctx if self.info is not None else 0

    @property
    def n_vocab(self) -> int | None:
        """A server does not say its vocabulary."""
        return None

    @property
    def thinking_controls(self) -> frozenset[str]:
        """The template is the server's: its switches are not known here."""
        return frozenset()

    @property
    def local(self) -> None:
        """A model on a server has no local features."""
        return None

    def result_room(
        self,
        messages: Sequence[Message],
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
    ) -> None:
        """The server's template renders the prompt, so the room left cannot be measured here (the
        keywords are the protocol's, unused)."""

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
    def llama_family(self) -> bool:
        """True when the server is llama.cpp's or llama-cpp-python's (it has their tokenizer
        endpoint, and reads their extra sampling fields and a GBNF grammar)."""
        return self.info is not None and self.info.tokenizer != "estimate"

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
        return (
            sum(self.count_text(m.content) + MESSAGE_OVERHEAD + _media_estimate(m) for m in messages) + MESSAGE_OVERHEAD
        )

    # generation -------------------------------------------------------------------------------
    def stream(
        self,
        history: Sequence[ChatMessage],
        user: str | None,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        cancel: threading.Event | None = None,
        cache_key: object | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
        thinking_budget: int | None = None,
        media: Sequence[Media] = (),
    ) -> Iterator[Event]:
        """Streams the server's reply to ``user`` after ``history``; ends with Finished.

        ``user=None`` continues the last turn of ``history`` (after a ``tool`` message). ``tools``,
        ``tool_choice``, ``thinking`` and ``reasoning_effort`` go to the server (see the module
        docstring); ``cache_key`` names a local KV cache and means nothing here (the server keeps
        its own cache). A ``thinking_budget`` is refused: OpenAI's API has no such field, and the
        server decodes on its own. ``media`` (the new message's images and clips) and the history's
        go to the server as content parts (``image_url`` with a ``data:`` URL, ``input_audio``):
        whether it can see them is the server's to say (its error is passed on).

        Raises:
            EngineError: the server is unreachable, refuses the key or a field, fails or drops the
                stream; a ``tool_choice`` that needs tools or names none offered; a ``grammar`` for a
                server outside llama.cpp's family; a ``thinking_budget``.
            ModelLoadError: the server does not offer the model.
            ContextOverflow: the conversation does not fit (here, or as the server says).
        """
        del cache_key
        if thinking_budget is not None:
            raise EngineError(
                f"{self.base_url}: a thinking budget needs a local model (a server decodes on its own); "
                "turn the thinking on or off instead"
            )
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
                user_media=media,
                media_tokens=_media_estimate,
                n_ctx=n_ctx,
                reply_reserve=min(self.reply_reserve, params.max_tokens),
                count_tokens=self.count_messages,
                count_text=self.count_text,
                policy=self.overflow_policy,
                documents_window=info.n_ctx or DEFAULT_DOCUMENTS_WINDOW,
            )
            payload = chat_payload(
                self.model, plan.messages, params, llama_family=self.llama_family, base_url=self.base_url
            )
            add_turn_options(payload, tools, choice, thinking, reasoning_effort)
            t0 = time.perf_counter()
            yield PrefillProgress(0, plan.prompt_tokens)
            reply = StreamedReply()
            shaper = ReplyShaper()  # a <think> first in the content is thinking, as in a local reply
            url = f"{self.base_url}/v1/chat/completions"
            headers = {"Accept": "text/event-stream"}
            try:
                with self._client.stream("POST", url, json=payload, headers=headers) as response:
                    raise_for_status(response, self.base_url, self.model)
                    # Leaving the ``with`` on Stop closes the response: the server stops generating.
                    for event in sse_events(response.iter_lines(), reply, plan.prompt_tokens, cancel, self.base_url):
                        if isinstance(event, Token):
                            yield from shaper.on_token(event)
                        else:
                            yield event
            except httpx.HTTPError as exc:
                raise connection_error(self.base_url, exc) from None
            yield from shaper.finish()
            cancelled = not reply.done and cancel is not None and cancel.is_set()
            if not reply.done and not cancelled:
                raise EngineError(f"{self.base_url}: the server closed the stream before the reply finished")
            budget = dict(plan.breakdown)
            if not info.n_ctx:
                budget.update(free=0, n_ctx_unknown=1)
            if self.estimated or budget.get("media"):
                budget["estimated"] = 1
            calls = () if cancelled else tool_calls(reply, self.base_url)
            yield from calls
            stats = dataclasses.replace(
                reply_stats(reply, plan.prompt_tokens, plan.evicted, info.n_ctx, budget, t0, f"remote:{self.base_url}"),
                documents_kept=plan.documents_kept,
                documents_dropped=plan.documents_dropped,
            )
            yield stats
            reason: FinishReason = "cancelled" if cancelled else finish_reason(reply)
            yield Finished(
                reason=reason,
                stats=stats,
                text=shaper.answer,
                reasoning=reply.reasoning + shaper.reasoning,
                reasoning_tokens=reasoning_tokens(reply) or shaper.reasoning_tokens,
                reasoning_ms=shaper.reasoning_ms or reply.reasoning_ms,
                tool_calls=calls,
            )


def _media_estimate(message: ChatMessage) -> int:
    return MEDIA_TOKENS_ESTIMATE * len(getattr(message, "media", ()))


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
