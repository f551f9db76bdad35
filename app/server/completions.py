"""``POST /v1/completions``: OpenAI's legacy text completions (what LlamaIndex's ``OpenAILike``
calls by default), whole or streamed.

The prompt is raw text (no chat template): a string, a list of strings, token ids, or a list of
token-id lists, each prompt answered with ``n`` choices (``index`` counts them all). Sampling,
``stop``, ``seed``, ``logit_bias``, ``logprobs`` (an integer: the alternatives per token) and
``echo`` (the prompt before the text) work as OpenAI documents them; ``max_tokens`` defaults to 16,
as there. A prompt that leaves no room for ``max_tokens`` in the window is a 400
``context_length_exceeded``. Needs a local model (it generates with
:meth:`engine.inference.session.ChatSession.complete`): a remote backend's server has its own endpoint.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypedDict

from app.server import params as fields
from app.server.errors import HttpError, map_errors
from app.server.sse import openai_error_events
from app.server.wire import TimingsDocument, text_limit, timings_document
from engine.inference.events import Event, Finished, Token

if TYPE_CHECKING:
    from app.server.exchange import Exchange
    from engine.inference.backends import LocalBackend
    from engine.inference.runtime import GenerationParams

COMPLETION_FIELDS = frozenset(
    {"model", "prompt", "max_tokens", "n", "stream", "stream_options", "logprobs", "echo", "grammar", "json_schema"}
    | fields.SAMPLING
)
"""The ``/v1/completions`` fields this server reads (``suffix`` is refused: no fill-in-the-middle)."""

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for ``/v1/completions``."""

MAX_PROMPTS = 16
"""Most prompts in one request (times ``n``: at most :data:`~app.server.params.MAX_N` choices in all)."""


class LegacyLogprobs(TypedDict):
    """The legacy ``logprobs``: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoice(TypedDict):
    text: str
    index: int
    logprobs: LegacyLogprobs | None
    finish_reason: str | None


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class _Prompt:
    text: str | None  # None when given as token ids
    tokens: tuple[int, ...] | None


def _prompts(value: object) -> list[_Prompt]:
    if isinstance(value, str):
        return [_Prompt(value, None)]
    if isinstance(value, list) and value and all(_is_id(v) for v in value):
        return [_Prompt(None, tuple(value))]
    if isinstance(value, list) and value and len(value) <= MAX_PROMPTS:
        prompts: list[_Prompt] = []
        for item in value:
            if isinstance(item, str):
                prompts.append(_Prompt(item, None))
            elif isinstance(item, list) and item and all(_is_id(v) for v in item):
                prompts.append(_Prompt(None, tuple(item)))
            else:
                break
        else:
            return prompts
    raise HttpError(
        400,
        f"'prompt' must be a string, a list of token ids, or a list of up to {MAX_PROMPTS} of either",
        code="invalid_value",
        param="prompt",
    )


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tokens(backend: LocalBackend, prompt: _Prompt, limit: int, vocab: int | None) -> list[int]:
    """A prompt's token ids, as the model reads it (a BOS first where the model wants one)."""
    if prompt.tokens is not None:
        if vocab is not None and any(t >= vocab for t in prompt.tokens):
            raise HttpError(400, f"'prompt' holds a token id outside the vocabulary of {vocab}", param="prompt")
        return list(prompt.tokens)
    text = prompt.text or ""
    if len(text) > limit:
        raise HttpError(400, f"'prompt' is longer than {limit} characters, the most allowed per request")
    return backend.tokenize_prompt(text)


def _logprobs(tokens: Sequence[Token], top: int, offset: int) -> LegacyLogprobs:
    """The legacy ``logprobs`` shape: parallel lists of tokens, their log-probabilities, the
    alternatives (``{text: logprob}``) and each token's offset in the text."""
    document: LegacyLogprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token in tokens:
        if token.logprob is None:  # the held-back tail, flushed at the end: the last tokens' text
            if token.text and document["tokens"]:
                document["tokens"][-1] += token.text
            offset += len(token.text)
            continue
        document["tokens"].append(token.text)
        document["token_logprobs"].append(token.logprob)
        document["top_logprobs"].append(dict(token.top_logprobs[:top]))
        document["text_offset"].append(offset)
        offset += len(token.text)
    return document


def handle(handler: Exchange) -> None:
    """Answers ``POST /v1/completions``."""
    state = handler.state
    body = fields.present(handler.read_json())
    wanted = state.check_model(body)  # first: it takes the server's own fields (keep_alive, lora) out
    fields.check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    if "prompt" not in body:
        raise HttpError(400, "'prompt' is required", code="invalid_value", param="prompt")
    prompts = _prompts(body["prompt"])
    n = fields.choices(body)
    if len(prompts) * n > fields.MAX_N:
        raise HttpError(400, f"prompts times n is more than {fields.MAX_N} choices", param="n")
    top = _top_logprobs(body.get("logprobs"))
    echo = fields.flag(body, "echo")
    if echo and top is not None:
        raise HttpError(
            400, "'echo' with 'logprobs' is not supported (no log-probabilities for the prompt)", param="echo"
        )
    extra = {"logprobs": max(top, 1)} if top is not None else {}
    max_new = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    params = fields.generation_params(body, max_new, state.backend.n_vocab, **extra)
    backend = state.backend.local
    if backend is None:
        raise HttpError(400, "/v1/completions needs a local model; this server serves a remote one", param="prompt")
    stream = fields.flag(body, "stream")
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
    with handler.use_model(wanted) as cancel:
        limit = text_limit(state.n_ctx)
        vocab = state.backend.n_vocab
        encoded = [map_errors(partial(_tokens, backend, p, limit, vocab)) for p in prompts]
        n_ctx = state.n_ctx or 0
        for tokens in encoded:
            if not tokens:
                raise HttpError(400, "'prompt' is empty", code="invalid_value", param="prompt")
            if n_ctx and len(tokens) + params.max_tokens > n_ctx:
                raise HttpError(
                    400,
                    f"the prompt ({len(tokens)} tokens) and max_tokens ({params.max_tokens}) do not fit "
                    f"this model's context window of {n_ctx} tokens",
                    code="context_length_exceeded",
                    param="prompt",
                )
        echoes = [_echo_text(backend, p, t) if echo else "" for p, t in zip(prompts, encoded, strict=True)]
        run = _Run(handler, encoded, echoes, n, params, top, cancel)
        if stream:
            run.stream(include_usage)
        else:
            run.whole()


def _top_logprobs(value: object) -> int | None:
    """``logprobs``: the alternatives per token (None: not asked for). Raises HttpError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= fields.MAX_TOP_LOGPROBS:
        raise HttpError(400, f"'logprobs' must be an integer from 0 to {fields.MAX_TOP_LOGPROBS}", param="logprobs")
    return value


def _echo_text(backend: LocalBackend, prompt: _Prompt, tokens: list[int]) -> str:
    if prompt.text is not None:
        return prompt.text
    return "".join(map_errors(lambda: backend.pieces(tokens)))


class _Run:
    """One request's choices: prompt ``p``'s choice ``j`` is choice ``p * n + j``."""

    def __init__(
        self,
        handler: Exchange,
        encoded: list[list[int]],
        echoes: list[str],
        n: int,
        params: GenerationParams,
        top: int | None,
        cancel: threading.Event,
    ) -> None:
        self.handler = handler
        self.encoded = encoded
        self.echoes = echoes
        self.n = n
        self.params = params
        self.top = top
        self.cancel = cancel
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.prompt_tokens = sum(len(tokens) for tokens in encoded)

    def _events(self, choice: int) -> Iterator[Event]:
        return self.handler.generation(self._completion(choice), self.cancel)

    def _completion(self, choice: int) -> Iterator[Event]:
        backend = self.handler.state.backend.local
        assert backend is not None  # handle() refused a remote backend
        tokens = self.encoded[choice // self.n]
        params = fields.seeded(self.params, choice % self.n)
        # ChatSession.complete holds the session's lock (a GUI sharing it never talks to the worker
        # at the same time) and sends no conversation's saved KV cache with the prompt.
        return backend.complete(tokens, params, self.cancel)

    def _document(
        self, choices: list[TextChoice], usage: Usage | None = None, timings: TimingsDocument | None = None
    ) -> dict[str, object]:
        model = self.handler.state.model_id
        document: dict[str, object] = {"id": self.id, "object": "text_completion", "created": self.created,
                                       "model": model, "choices": choices}  # fmt: skip
        if usage is not None:
            document["usage"] = usage
        if timings is not None:
            document["timings"] = timings
        return document

    def whole(self) -> None:
        choices: list[TextChoice] = []
        first = None
        completion_tokens = 0
        for choice in range(len(self.encoded) * self.n):
            tokens: list[Token] = []
            finished: Finished | None = None
            events = map_errors(partial(_listed, self._events, choice))
            for event in events:
                if isinstance(event, Token):
                    tokens.append(event)
                elif isinstance(event, Finished):
                    finished = event
            if finished is None:
                raise HttpError(500, "the model ended without finishing the reply", "server_error")
            first = first or finished.stats
            completion_tokens += finished.stats.completion_tokens
            echo = self.echoes[choice // self.n]
            choices.append(
                {
                    "text": echo + finished.text,
                    "index": choice,
                    "logprobs": _logprobs(tokens, self.top, len(echo)) if self.top is not None else None,
                    "finish_reason": "length" if finished.reason == "length" else "stop",
                }
            )
        assert first is not None
        usage = _usage(completion_tokens, self.prompt_tokens)
        document = self._document(choices, usage=usage, timings=timings_document(first))
        self.handler.send_json(200, document)

    def stream(self, include_usage: bool) -> None:
        def produce(events: Iterator[Event]) -> None:
            first = None
            completion_tokens = 0
            for choice in range(len(self.encoded) * self.n):
                source = events if choice == 0 else self._events(choice)
                echo = self.echoes[choice // self.n]
                if echo:
                    self.handler.send_event(self._document([_text_choice(choice, echo)]))
                offset = len(echo)
                for event in source:
                    if isinstance(event, Token) and (event.text or event.logprob is not None):
                        logprobs = _logprobs([event], self.top, offset) if self.top is not None else None
                        offset += len(event.text)
                        self.handler.send_event(self._document([_text_choice(choice, event.text, logprobs)]))
                    elif isinstance(event, Finished):
                        first = first or event.stats
                        completion_tokens += event.stats.completion_tokens
                        finish = "length" if event.reason == "length" else "stop"
                        last = _text_choice(choice, "", None, finish)
                        self.handler.send_event(self._document([last], timings=timings_document(event.stats)))
            if include_usage and first is not None:
                self.handler.send_event(self._document([], usage=_usage(completion_tokens, self.prompt_tokens)))
            self.handler.send_event("[DONE]")

        self.handler.stream(self._completion(0), self.cancel, produce, openai_error_events)


def _listed(events: Callable[[int], Iterator[Event]], choice: int) -> list[Event]:
    return list(events(choice))


def _text_choice(
    index: int, text: str, logprobs: LegacyLogprobs | None = None, finish: str | None = None
) -> TextChoice:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def _usage(completion_tokens: int, prompt_tokens: int) -> Usage:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
