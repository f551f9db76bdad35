"""What an image costs, and what Glassbox's image path adds to llama.cpp's mtmd (issue 25).

Run: ``make bench`` or ``pytest tests/bench/bench_vision.py -s``.

The model is the tiny random-weight Gemma 3 vision model and its projector built by the tests
(tests/engine/tiny_vision.py: 64 × 64 images, 16 tokens each), the only vision model this machine
has; its numbers are the mechanics' cost, not a real model's encode time. Two sides, interleaved,
each round with a new image (so neither side reuses a decoded or tokenized image) and the KV cache
cleared, greedy, the same threads, batch and context:

* **the image path**: ``ChatSession.stream`` with the image attached, the whole product path (the
  header check, the budget, the template, the worker process and its pipe, Pillow in the worker,
  mtmd's tokenizer, the prefill that encodes the image between the text batches), timed from the
  call to the first token;
* **mtmd called directly**: in this process, the same image decoded by the same function, a bitmap,
  ``mtmd_tokenize`` of the same rendered prompt, ``mtmd_helper_eval_chunks``, one greedy sample.

Reported: the time to first token both ways (their ratio, and the image path's extra ms, budget
<= 25 ms: a turn's fixed costs), the projector's encode time per image after its first (the first
pays the encoder's set-up) and the tokens per image (mtmd's own count, checked equal on both sides).
"""

from __future__ import annotations

import ctypes
import io
import os
import statistics
import time
from pathlib import Path
from typing import Any

from engine.inference.events import Finished, Token
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from engine.media import Media, read_media
from engine.media_decode import decode_image
from tests.bench.results import budgets, record

ROUNDS = int(os.environ.get("BENCH_VISION_ROUNDS", "9"))
THREADS = 2
N_CTX, N_BATCH = 512, 64
QUESTION = "What is in this image?"
OVERHEAD_BUDGET_MS = 25.0


def _image(seed: int) -> Media:
    from PIL import Image

    image = Image.new("RGB", (64, 48))
    image.putdata([((x * 13 + seed * 29) % 256, (y * 7 + seed) % 256, (x ^ y ^ seed) % 256)
                   for y in range(48) for x in range(64)])  # fmt: skip
    out = io.BytesIO()
    image.save(out, "PNG")
    return read_media(out.getvalue(), name=f"bench-{seed}.png")


class _Direct:
    """mtmd in this process: the raw side."""

    def __init__(self, model: Path, mmproj: Path) -> None:
        import llama_cpp
        from llama_cpp import mtmd_cpp

        from engine.cpu_backend import load_backends

        load_backends()
        self.lc, self.m = llama_cpp, mtmd_cpp
        # mtmd logs every image to stderr; quiet here (the worker's go to its log file).
        self._quiet = llama_cpp.llama_log_callback(lambda _level, _text, _data: None)
        mtmd_cpp.mtmd_log_set(self._quiet, None)
        mtmd_cpp.mtmd_helper_log_set(self._quiet, None)
        self.llm = llama_cpp.Llama(
            str(model), n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=THREADS,
            n_threads_batch=THREADS, verbose=False,
        )  # fmt: skip
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu, params.warmup, params.print_timings, params.n_threads = False, False, False, THREADS
        self.ctx = mtmd_cpp.mtmd_init_from_file(str(mmproj).encode(), self.llm._model.model, params)
        assert self.ctx
        sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
        self.sampler = sampler

    def first_token(self, prompt: str, media: Media) -> tuple[float, int, int]:
        """(ms to the first token, image tokens, the token) for ``prompt`` (mtmd's marker in it)."""
        m, lc = self.m, self.lc
        self.llm._ctx.kv_cache_clear()
        self.llm.n_tokens = 0
        started = time.perf_counter()
        decoded = decode_image(media, max_side=64)
        pixels = (ctypes.c_uint8 * len(decoded.rgb)).from_buffer_copy(decoded.rgb)
        bitmap = m.mtmd_bitmap_init(decoded.width, decoded.height, pixels)
        chunks = m.mtmd_input_chunks_init()
        text = prompt.encode()
        inp = m.mtmd_input_text(text, len(text), False, True)
        assert m.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        n_past = lc.llama_pos(0)
        assert (
            m.mtmd_helper_eval_chunks(self.ctx, self.llm._ctx.ctx, chunks, 0, 0, N_BATCH, True, ctypes.byref(n_past))
            == 0
        )
        token = int(lc.llama_sampler_sample(self.sampler, self.llm._ctx.ctx, -1))
        elapsed = (time.perf_counter() - started) * 1000
        image_tokens = sum(
            int(m.mtmd_input_chunk_get_n_tokens(m.mtmd_input_chunks_get(chunks, i)))
            for i in range(m.mtmd_input_chunks_size(chunks))
            if m.mtmd_input_chunk_get_type(m.mtmd_input_chunks_get(chunks, i)) != m.MTMD_INPUT_CHUNK_TYPE_TEXT
        )
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        return elapsed, image_tokens, token

    def close(self) -> None:
        self.lc.llama_sampler_free(self.sampler)
        self.m.mtmd_free(self.ctx)
        self.llm.close()


def _engine_turn(session: ChatSession, media: Media) -> tuple[float, Any, int]:
    assert session.worker is not None
    session.worker.reset_cache()
    params = GenerationParams(temperature=0.0, max_tokens=1)
    started = time.perf_counter()
    first = 0.0
    token = -1
    finished = None
    for event in session.stream([], QUESTION, params, media=(media,)):
        if isinstance(event, Token) and not first:
            first, token = (time.perf_counter() - started) * 1000, event.token_id
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return first or finished.stats.ttft_ms, finished.stats, token


def test_image_path_vs_mtmd_direct(tiny_vision_model: tuple[Path, Path]) -> None:
    model, mmproj = tiny_vision_model
    direct = _Direct(model, mmproj)
    load = LoadParams(model_path=model, mmproj_path=mmproj, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS)
    engine_ms: list[float] = []
    direct_ms: list[float] = []
    encode_ms: list[float] = []
    try:
        with ChatSession(load, reply_reserve=8) as session:
            session.load()
            assert session.template is not None
            prompt = session.template.render([{"role": "user", "content": f"<__media__>\n{QUESTION}"}])
            # One turn each first: the encoder's set-up (its compute graph) is paid once, apart.
            _, first_stats, _ = _engine_turn(session, _image(10_000))
            direct.first_token(prompt, _image(10_001))
            for i in range(ROUNDS):
                media = _image(i)
                sides = ["engine", "direct"] if i % 2 == 0 else ["direct", "engine"]
                for side in sides:
                    if side == "engine":
                        ms, stats, _token = _engine_turn(session, media)
                        engine_ms.append(ms)
                        encode_ms.append(stats.encode_ms)
                        engine_tokens = stats.media_tokens
                    else:
                        ms, direct_tokens, _token = direct.first_token(prompt, media)
                        direct_ms.append(ms)
    finally:
        direct.close()
    assert engine_tokens == direct_tokens  # the projector's count, both ways
    engine, raw = statistics.median(engine_ms), statistics.median(direct_ms)
    encode = statistics.median(encode_ms)
    print(f"\nTTFT with an image: image path {engine:.1f} ms, mtmd direct {raw:.1f} ms")
    print(f"encode: {encode:.2f} ms per image after the first ({first_stats.encode_ms:.0f} ms for the first)")
    with budgets():
        record(
            "image path vs mtmd direct: TTFT",
            raw / engine,
            detail=f"{engine:.1f} vs {raw:.1f} ms, tiny Gemma 3 vision, {engine_tokens} image tokens",
        )
        record(
            "image path overhead over mtmd direct",
            engine - raw,
            unit="ms",
            at_most=OVERHEAD_BUDGET_MS,
            detail=f"median of {ROUNDS}, a new 64×48 image each round",
        )
        record(
            "image encode (tiny test model)",
            encode,
            unit="ms",
            detail=f"per image after the first; the first {first_stats.encode_ms:.0f} ms (the encoder's set-up)",
        )
        record(
            "tokens per image (tiny test model)", engine_tokens, unit="tokens", detail="mtmd's count, equal both ways"
        )
