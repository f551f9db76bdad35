"""Engine vs raw llama-cpp-python, side by side in one run (ARCHITECTURE.md, "Budgets").

Both sides get the same model, context, prompt tokens and greedy sampling, with the KV cache
cleared before every run, and run in the app's environment: the threads the worker starts with
(every core unless ``threads`` is given; the worker then keeps the decode threads it times fastest,
``engine.inference.decode_threads``, where the raw side keeps them all) and its OpenMP settings
(``runtime.WORKER_ENVIRONMENT``, set in this process too before llama.cpp loads). The runs are
interleaved and alternate which side goes first (engine then raw, raw then engine, ...), so that
the machine's noise hits both alike. Both are
timed the same way from the caller's side: prefill = prompt tokens / time to first token; decode
= (tokens - 1) / (last token - first token). The engine side is the whole product path: the chat
session (budget, template), the worker process and the pipe.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.cpu_backend import load_backends
from engine.inference.events import Token
from engine.inference.runtime import GenerationParams, LoadParams, apply_worker_environment
from engine.inference.session import ChatSession

DEFAULT_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how "
    "books were made, sold and read across Europe. Write a long essay about its consequences."
)


@dataclass(frozen=True)
class Run:
    """One timed generation."""

    side: str
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    prefill_tps: float
    decode_tps: float


@dataclass
class BenchReport:
    """All runs, and the median ratio engine/raw for prefill and decode."""

    model: str
    threads: int
    threads_batch: int
    environment: dict[str, str]
    n_ctx: int
    max_tokens: int
    runs: list[Run] = field(default_factory=list)

    def median(self, side: str, key: str) -> float:
        values = [getattr(r, key) for r in self.runs if r.side == side]
        return statistics.median(values) if values else 0.0

    def ratio(self, key: str) -> float:
        raw = self.median("raw", key)
        return self.median("engine", key) / raw if raw else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "threads": self.threads,
            "threads_batch": self.threads_batch,
            "environment": dict(self.environment),
            "n_ctx": self.n_ctx,
            "max_tokens": self.max_tokens,
            "engine": {k: self.median("engine", k) for k in ("prefill_tps", "decode_tps", "ttft_ms")},
            "raw": {k: self.median("raw", k) for k in ("prefill_tps", "decode_tps", "ttft_ms")},
            "prefill_ratio": round(self.ratio("prefill_tps"), 4),
            "decode_ratio": round(self.ratio("decode_tps"), 4),
            "runs": [asdict(r) for r in self.runs],
        }


def _timed(side: str, prompt_tokens: int, stamps: list[float], t0: float) -> Run:
    n = len(stamps)
    ttft = stamps[0] - t0 if stamps else 0.0
    decode_s = stamps[-1] - stamps[0] if n > 1 else 0.0
    return Run(
        side=side,
        prompt_tokens=prompt_tokens,
        completion_tokens=n,
        ttft_ms=ttft * 1000,
        prefill_tps=prompt_tokens / ttft if ttft else 0.0,
        decode_tps=(n - 1) / decode_s if decode_s else 0.0,
    )


def run_bench(
    model: Path,
    *,
    rounds: int = 5,
    max_tokens: int = 64,
    n_ctx: int = 2048,
    threads: int | None = None,
    prompt: str = DEFAULT_PROMPT,
) -> BenchReport:
    """Runs ``rounds`` interleaved pairs and returns the report."""
    # lazy: heavy (llama_cpp)
    import llama_cpp

    environment = apply_worker_environment()  # the worker's OpenMP settings, before llama.cpp loads here
    load_backends()  # the same CPU variant the worker chooses (no AMX until proven)

    load = LoadParams(model_path=model, n_ctx=n_ctx, n_threads=threads)
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    with ChatSession(load) as session:
        info = session.load()
        worker = session.worker
        assert worker is not None
        report = BenchReport(
            model=str(model),
            threads=info.n_threads,
            threads_batch=info.n_threads_batch,
            environment=dict(info.environment),
            n_ctx=n_ctx,
            max_tokens=max_tokens,
        )
        if report.environment != environment:
            raise RuntimeError(f"the worker runs {info.environment}, this process {environment}: not like for like")
        raw = llama_cpp.Llama(
            model_path=str(model),
            n_ctx=n_ctx,
            n_batch=load.n_batch,
            n_ubatch=load.n_batch,
            n_threads=info.n_threads,
            n_threads_batch=info.n_threads_batch,
            verbose=False,
        )
        try:
            list(session.stream([], prompt, params))  # the prompt's tokens, and warm caches on both sides
            tokens = list(session.last_prompt)
            _raw_run(raw, tokens, max_tokens)

            def engine_run() -> Run:
                worker.reset_cache()
                t0 = time.perf_counter()
                stamps = [time.perf_counter() for e in session.stream([], prompt, params) if isinstance(e, Token)]
                return _timed("engine", len(session.last_prompt), stamps, t0)

            for i in range(rounds):
                if i % 2 == 0:
                    engine = engine_run()
                    raw_side = _raw_run(raw, tokens, engine.completion_tokens)
                else:
                    raw_side = _raw_run(raw, tokens, max_tokens)
                    engine = engine_run()
                report.runs += [engine, raw_side]
        finally:
            raw.close()
    return report


def _raw_run(llm: Any, tokens: list[int], n_tokens: int) -> Run:
    """The same prompt tokens through ``Llama.generate``, greedy, stopping after as many tokens."""
    # lazy: heavy (llama_cpp)
    import llama_cpp

    llm.reset()
    llm._ctx.kv_cache_clear()
    stamps: list[float] = []
    t0 = time.perf_counter()
    for token in llm.generate(tokens, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0):
        stamps.append(time.perf_counter())
        if len(stamps) >= n_tokens or llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            break
    return _timed("raw", len(tokens), stamps, t0)
