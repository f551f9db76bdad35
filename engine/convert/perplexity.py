"""Perplexity of a model on a short text, and the before/after quality check for quantization.

Perplexity is ``exp(mean negative log-likelihood)`` of each token given the ones before it. The
text is split into windows of ``n_ctx`` tokens that overlap by half, so every token after the
first is scored exactly once with at least ``n_ctx / 2`` tokens of context (the first window
scores from its start); each window after the first begins with BOS, as the model was trained.

It runs in a spawned child (llama.cpp can abort), through llama.cpp's low-level API: logits are
requested only for the scored positions, in batches of 64, so memory stays small even for a
262k-token vocabulary. The app ships ``resources/perplexity.txt`` (about 3 KB of plain English
prose written for Glassbox and dedicated to the public domain) for the quality check, which shows
"Q4_K_M: 3.6x smaller, perplexity +4.1%".
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.convert.child_entry import import_native_bindings
from engine.convert.quantize import describe_exit, run_logged_child, size_change
from engine.errors import Cancelled, EngineError, ModelLoadError

MAX_TEXT_CHARS = 200_000
_BATCH = 64
_PROGRESS = "\x1eglassbox-perplexity "
"""How the child says how far it got: a line ``<mark>SCORED TOTAL`` on its output, read by the parent."""


@dataclass(frozen=True)
class QualityReport:
    """Source vs quantized result: size and perplexity."""

    qtype: str
    size_ratio: float
    source_perplexity: float
    result_perplexity: float

    @property
    def perplexity_change_pct(self) -> float:
        """Relative perplexity change in percent (+4.1 means 4.1 % worse)."""
        return (self.result_perplexity / self.source_perplexity - 1.0) * 100.0

    def summary(self) -> str:
        """``"Q4_K_M: 3.6x smaller, perplexity +4.1%"``; a larger result says ``"2.0x larger"``, as the CLI does."""
        return f"{self.qtype}: {size_change(self.size_ratio)}, perplexity {self.perplexity_change_pct:+.1f}%"

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "perplexity_change_pct": self.perplexity_change_pct,
            "summary": self.summary(),
        }


def _perplexity_child(model_path: str, text: str, n_ctx: int, threads: int) -> tuple[float, int]:
    """Child side: load, tokenize, score the windows; returns (perplexity, scored tokens)."""
    native = import_native_bindings()

    native.llama_backend_init()
    model, ctx = _open_context(native, model_path, n_ctx, threads)
    batch = None
    try:
        vocab = native.llama_model_get_vocab(model)
        tokens = _tokenize(native, vocab, text)
        batch = native.llama_batch_init(_BATCH, 0, 1)
        nll, scored = _score(native, ctx, vocab, batch, tokens, n_ctx)
    finally:
        if batch is not None:
            native.llama_batch_free(batch)
        native.llama_free(ctx)
        native.llama_model_free(model)
    return math.exp(nll / scored), scored


def _open_context(native: Any, model_path: str, n_ctx: int, threads: int) -> tuple[Any, Any]:
    """Child side: the model (on the CPU) and a context of ``n_ctx`` tokens in batches of ``_BATCH``."""
    mparams = native.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = native.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        raise RuntimeError("llama.cpp could not load the model")
    cparams = native.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = _BATCH
    cparams.n_ubatch = _BATCH
    if threads <= 0:
        # llama.cpp's compute threads spin while they wait: more threads than physical cores is
        # much slower, not faster.
        # lazy: child process (+16 ms: psutil)
        import psutil

        threads = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    ctx = native.llama_init_from_model(model, cparams)
    if not ctx:
        native.llama_model_free(model)
        raise RuntimeError("llama.cpp could not create a context")
    return model, ctx


def _tokenize(native: Any, vocab: Any, text: str) -> list[int]:
    """Child side: ``text``'s tokens (with the model's special tokens); at least two."""
    raw = text.encode("utf-8")
    buf = (native.llama_token * (len(raw) + 16))()
    n = native.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
    if n < 0:
        raise RuntimeError("tokenization failed")
    tokens = [int(t) for t in buf[:n]]
    if len(tokens) < 2:
        raise ValueError(f"the text has only {len(tokens)} tokens")
    return tokens


def _score(native: Any, ctx: Any, vocab: Any, batch: Any, tokens: list[int], n_ctx: int) -> tuple[float, int]:
    """Child side: the summed negative log-likelihood of every token but the first, and how many
    were scored, over windows of ``n_ctx`` that overlap by half."""
    add_bos = bool(native.llama_vocab_get_add_bos(vocab))
    bos = int(native.llama_vocab_bos(vocab))
    memory = native.llama_get_memory(ctx)
    nll = 0.0
    scored = 0
    half = n_ctx // 2
    start = 0
    done_upto = 0  # tokens[0..done_upto] are predicted (token 0 never is)
    while done_upto < len(tokens) - 1:
        prefix = [bos] if add_bos and start > 0 else []
        end = min(start + n_ctx - len(prefix), len(tokens))
        window = prefix + tokens[start:end]
        # window[i] predicts window[i + 1]; score the ones not yet scored.
        first = len(prefix) + (done_upto - start)
        native.llama_memory_clear(memory, True)
        for b0 in range(0, len(window), _BATCH):
            for term in _score_batch(native, ctx, vocab, batch, window, b0, first):
                nll += term  # one token at a time, in order: the sum is the same to the last bit
                scored += 1
            os.write(1, f"{_PROGRESS}{scored} {len(tokens) - 1}\n".encode())  # the parent's progress
        done_upto = end - 1
        start = max(end - half, 0)
    return nll, scored


def _score_batch(native: Any, ctx: Any, vocab: Any, batch: Any, window: list[int], b0: int, first: int) -> list[float]:
    """Child side: decodes ``window[b0 : b0 + _BATCH]``; the negative log-likelihood of each
    position from ``first`` on (of the token after it)."""
    # lazy: child process (+4 ms)
    import ctypes

    # lazy: child process (+109 ms: numpy)
    import numpy as np

    n_vocab = native.llama_vocab_n_tokens(vocab)
    chunk = window[b0 : b0 + _BATCH]
    batch.n_tokens = len(chunk)
    wanted = []
    for j, tok in enumerate(chunk):
        i = b0 + j
        batch.token[j] = tok
        batch.pos[j] = i
        batch.n_seq_id[j] = 1
        batch.seq_id[j][0] = 0
        want = first <= i < len(window) - 1
        batch.logits[j] = 1 if want else 0
        if want:
            wanted.append((j, window[i + 1]))
    if native.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    terms = []
    for j, target in wanted:
        ptr = native.llama_get_logits_ith(ctx, j)
        logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
        top = float(logits.max())
        terms.append(top + math.log(float(np.exp(logits - top).sum())) - float(logits[target]))
    return terms


def perplexity(
    model_path: Path,
    text: str,
    n_ctx: int = 256,
    threads: int | None = None,
    *,
    cancel: threading.Event | None = None,
    timeout: float = 1800.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> float:
    """Perplexity of the GGUF ``model_path`` on ``text`` (lower is better).

    Args:
        model_path: a GGUF model.
        text: plain text, at most :data:`MAX_TEXT_CHARS` characters.
        n_ctx: window size in tokens (>= 16).
        threads: CPU threads; None means one per physical core.
        cancel: set it to stop (the child is terminated).
        timeout: seconds before the child is killed.
        on_progress: called with ``(tokens scored, tokens to score)`` as the child goes (after
            each batch of :data:`_BATCH` tokens), in the calling thread.

    Raises:
        ModelLoadError: llama.cpp could not load the model.
        EngineError: the text is empty or too long, or the child crashed, failed or timed out.
        Cancelled: ``cancel`` was set.
    """
    model_path = Path(model_path)
    if n_ctx < 16:
        raise EngineError(f"perplexity needs a window of at least 16 tokens, not {n_ctx}")
    if not text.strip():
        raise EngineError("perplexity needs some text")
    if len(text) > MAX_TEXT_CHARS:
        raise EngineError(f"the perplexity text is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    if not model_path.is_file():
        raise ModelLoadError(f"{model_path}: no such file")

    def on_line(line: str) -> None:
        if on_progress is not None and line.startswith(_PROGRESS):
            scored, _, total = line[len(_PROGRESS) :].partition(" ")
            if scored.isdigit() and total.strip().isdigit():
                on_progress(int(scored), int(total))

    try:
        outcome = run_logged_child(
            _perplexity_child,
            (str(model_path), text, n_ctx, threads or 0),
            on_line=on_line,
            cancel=cancel,
            timeout=timeout,
        )
    except TimeoutError:
        raise EngineError(f"{model_path}: perplexity took longer than {timeout:g} s and was stopped") from None
    except Cancelled:
        raise Cancelled(f"{model_path}: perplexity cancelled") from None
    if outcome.crashed:
        raise EngineError(f"{model_path}: the perplexity process crashed ({describe_exit(outcome.exitcode)})")
    if outcome.exitcode != 0 or outcome.value is None:
        message = outcome.error or outcome.last_error_line() or describe_exit(outcome.exitcode)
        if "could not load" in message:
            raise ModelLoadError(f"{model_path}: llama.cpp could not load the model")
        raise EngineError(f"{model_path}: perplexity failed: {message.split(': ', 1)[-1]}")
    value, _count = outcome.value
    return float(value)


def quality_check(
    source: Path,
    result: Path,
    text: str,
    *,
    qtype: str,
    n_ctx: int = 256,
    threads: int | None = None,
    cancel: threading.Event | None = None,
    size_ratio: float | None = None,
) -> QualityReport:
    """Compares the perplexity of ``source`` and its quantized ``result`` on ``text``.

    ``size_ratio`` defaults to the two files' sizes; pass the quantization's own ratio for a split
    source.

    Raises:
        ModelLoadError, EngineError, Cancelled: as :func:`perplexity`.
    """
    source = Path(source)
    result = Path(result)
    before = perplexity(source, text, n_ctx, threads, cancel=cancel)
    after = perplexity(result, text, n_ctx, threads, cancel=cancel)
    ratio = size_ratio if size_ratio is not None else source.stat().st_size / max(result.stat().st_size, 1)
    return QualityReport(qtype=qtype, size_ratio=ratio, source_perplexity=before, result_perplexity=after)
