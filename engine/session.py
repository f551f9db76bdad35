"""A chat session: one loaded model, its chat template, the context budget and the stats.

This is the headless heart of a chat turn (DESIGN.md, "How data flows through a chat turn", steps
2–4): fit the conversation into the window, render the template, tokenize, stream from the worker
(reusing the KV cache for the common prefix), and measure what it cost.

``ChatSession.stream`` is a plain generator of typed events (:mod:`engine.events`), ending with
``Finished``. A crashed worker raises :class:`~engine.errors.EngineCrashed`; the next call starts a
fresh worker, so the conversation (kept by the caller) carries on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from engine.context import ContextPlan, Message, OverflowPolicy, plan_context
from engine.errors import EngineCrashed, ModelLoadError
from engine.events import Event, Finished, Stats
from engine.fit import kv_cache_bytes
from engine.gguf import GgufInfo, read_gguf_info
from engine.runtime import GenerationParams, InferenceWorker, LoadParams, ModelInfo, WorkerResult
from engine.templates import ChatTemplate, select_template


@dataclass(frozen=True)
class PromptView:
    """The last prompt as the model saw it: token ids and their text pieces (for the inspector)."""

    token_ids: list[int]
    pieces: list[str]


class ChatSession:
    """Owns one inference worker and everything needed to turn messages into replies.

    Args:
        load: how to load the model.
        machine_bandwidth_gbps: this machine's measured memory bandwidth, reported in Stats.
        overflow_policy: "rolling" evicts the oldest turns; "refuse" raises ContextOverflow.
        reply_reserve: tokens kept free for the reply.
    """

    def __init__(
        self,
        load: LoadParams,
        *,
        machine_bandwidth_gbps: float | None = None,
        overflow_policy: OverflowPolicy = "rolling",
        reply_reserve: int = 512,
    ) -> None:
        self.load_params = load
        self.machine_bandwidth_gbps = machine_bandwidth_gbps
        self.overflow_policy: OverflowPolicy = overflow_policy
        self.reply_reserve = reply_reserve
        self.gguf: GgufInfo = read_gguf_info(load.model_path)
        self._worker: InferenceWorker | None = None
        self.info: ModelInfo | None = None
        self.template: ChatTemplate | None = None
        self.last_prompt: list[int] = []
        self.last_plan: ContextPlan | None = None
        self.offload_note: str | None = None
        self._prompt_tokens: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    # lifetime -------------------------------------------------------------------------------
    def load(self, cancel: threading.Event | None = None) -> ModelInfo:
        """Starts the worker and loads the model (idempotent). Raises ModelLoadError, EngineCrashed."""
        with self._lock:
            return self._ensure_worker(cancel)

    def _ensure_worker(self, cancel: threading.Event | None = None) -> ModelInfo:
        if self._worker is not None and self._worker.alive and self.info is not None:
            return self.info
        if self._worker is not None:
            self._worker.close(kill=True)
        worker, info = self._start_with_fallback(cancel)
        self._worker, self.info = worker, info
        self.template = select_template(
            info.chat_template, info.architecture, info.bos_token, info.eos_token
        )
        return info

    def _start_with_fallback(self, cancel: threading.Event | None) -> tuple[InferenceWorker, ModelInfo]:
        """Starts the worker; when GPU layers fail to load (out of VRAM), retries with fewer.

        Halves the offloaded layers on each failure, down to CPU only, and remembers what worked
        in ``load_params`` (``offload_note`` says what happened).
        """
        params = self.load_params
        while True:
            worker = InferenceWorker(params)
            try:
                info = worker.start(cancel)
            except (ModelLoadError, EngineCrashed):
                if params.n_gpu_layers == 0:
                    raise
                fewer = 0 if params.n_gpu_layers < 0 else params.n_gpu_layers // 2
                self.offload_note = (
                    f"loading with {params.n_gpu_layers} GPU layers failed; retrying with {fewer}"
                )
                params = params.model_copy(update={"n_gpu_layers": fewer})
                continue
            self.load_params = params
            return worker, info

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker(self) -> InferenceWorker | None:
        return self._worker

    # tokens ---------------------------------------------------------------------------------
    def count_text(self, text: str) -> int:
        assert self._worker is not None
        return len(self._worker.tokenize(text, add_bos=False, special=False)) if text else 0

    def _tokenize_prompt(self, prompt: str) -> list[int]:
        """Tokens of a rendered prompt; the last few are remembered, since planning the context
        renders and counts the very prompt that is then sent (one pipe round trip saved a turn)."""
        cached = self._prompt_tokens.get(prompt)
        if cached is not None:
            return cached
        assert self._worker is not None and self.info is not None
        bos = self.info.bos_token
        add_bos = self.info.add_bos and not (bos and prompt.startswith(bos))
        tokens = self._worker.tokenize(prompt, add_bos=add_bos, special=True)
        if len(self._prompt_tokens) >= 8:
            self._prompt_tokens.pop(next(iter(self._prompt_tokens)))
        self._prompt_tokens[prompt] = tokens
        return tokens

    def count_messages(self, messages: Sequence[Message]) -> int:
        assert self.template is not None
        return len(self._tokenize_prompt(self.template.render([_as_dict(m) for m in messages])))

    def prompt_view(self) -> PromptView:
        """The last prompt's tokens and pieces (empty before the first turn)."""
        with self._lock:
            if self._worker is None or not self.last_prompt:
                return PromptView([], [])
            return PromptView(list(self.last_prompt), self._worker.pieces(self.last_prompt))

    # generation -----------------------------------------------------------------------------
    def stream(
        self,
        history: Sequence[Message],
        user: str,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Generates the reply to ``user`` after ``history``; yields events, ends with Finished.

        Raises:
            ContextOverflow: the conversation does not fit and the policy is "refuse" (or even the
                pinned parts do not fit).
            EngineCrashed: the worker died; the next call starts a fresh one.
        """
        params = params or GenerationParams()
        with self._lock:
            self._ensure_worker()
            assert self._worker is not None and self.info is not None and self.template is not None
            n_ctx = self.info.n_ctx
            reserve = min(self.reply_reserve, params.max_tokens)
            plan = plan_context(
                system=system,
                documents=documents,
                history=list(history),
                user=user,
                n_ctx=n_ctx,
                reply_reserve=reserve,
                count_tokens=self.count_messages,
                count_text=self.count_text,
                policy=self.overflow_policy,
            )
            self.last_plan = plan
            prompt = self.template.render([_as_dict(m) for m in plan.messages])
            tokens = self._tokenize_prompt(prompt)
            self.last_prompt = tokens
            stops = tuple(dict.fromkeys((*params.stop, *self.template.stop)))
            run = params.model_copy(update={"stop": stops})
            try:
                result = yield from self._worker.generate(tokens, run, cancel)
            except EngineCrashed:
                self._worker = None
                self.last_prompt = []
                raise
            stats = self._stats(result, plan)
            yield stats
            reason = result.reason
            yield Finished(reason=reason, stats=stats, text=result.text)  # type: ignore[arg-type]

    def _stats(self, result: WorkerResult, plan: ContextPlan) -> Stats:
        assert self.info is not None
        new_tokens = result.prompt_tokens - result.cached_tokens
        prefill_tps = new_tokens / (result.prefill_ms / 1000) if result.prefill_ms > 0 else 0.0
        decoded = max(result.completion_tokens - 1, 0)
        decode_tps = decoded / (result.decode_ms / 1000) if result.decode_ms > 0 and decoded else 0.0
        kv_total = kv_cache_bytes(self.gguf, self.info.n_ctx)
        kv_used = kv_cache_bytes(self.gguf, max(result.n_past, 1))
        model_bytes = self.info.model_bytes
        bandwidth = (model_bytes + kv_used) * decode_tps / 1e9
        assert self.template is not None
        return Stats(
            n_ctx=self.info.n_ctx,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            completion_tokens=result.completion_tokens,
            context_used=result.n_past,
            evicted_messages=plan.evicted,
            ttft_ms=round(result.ttft_ms, 2),
            prefill_ms=round(result.prefill_ms, 2),
            decode_ms=round(result.decode_ms, 2),
            prefill_tps=round(prefill_tps, 2),
            decode_tps=round(decode_tps, 2),
            kv_cache_bytes=kv_total,
            kv_used_bytes=kv_used,
            model_bytes=model_bytes,
            bandwidth_gbps=round(bandwidth, 3),
            machine_bandwidth_gbps=self.machine_bandwidth_gbps,
            template=f"{self.template.source}:{self.template.name}",
            budget=dict(plan.breakdown),
        )


def _as_dict(message: Message) -> dict[str, str]:
    return {"role": message.role, "content": message.content}
