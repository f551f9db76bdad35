"""What shaping a reply costs (issue 12): the thinking splitter and a tool-call parser on every token.

Run: ``make bench`` or ``pytest tests/bench/bench_reply_shaping.py -s``.

Every reply now goes through :class:`engine.inference.reply.ReplyShaper` in the parent process, token by
token. Side by side, interleaved, in one run: the starter model decodes a greedy reply (the
engine's own ``decode_ms``), and the shaper (with the Hermes tool-call parser, the most common
family, and the reasoning splitter) processes the same tokens, wrapped as a thinking block and a
tool call so that every state of both is exercised. The figure is the decode rate with the shaping
added over the decode rate alone; budget >= 0.99 (the shaping costs under 1% of decoding).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from engine.inference.events import Token
from engine.inference.reply import ReplyShaper
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from tests.bench.results import record

ROUNDS = 5
BUDGET = 0.99


def _shape(texts: list[str]) -> float:
    """Seconds to shape ``texts`` as one reply (repeated to time it well); per token."""
    repeats = 20
    started = time.perf_counter()
    for _ in range(repeats):
        shaper = ReplyShaper(family="hermes", tool_names=["add"])
        for index, text in enumerate(texts):
            shaper.on_token(Token(text, index))
        shaper.finish()
    return (time.perf_counter() - started) / (repeats * len(texts))


def test_reply_shaping_vs_decoding(starter_model: Path) -> None:
    decode: list[float] = []
    shaping: list[float] = []
    params = GenerationParams(max_tokens=96, temperature=0)
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=1024)) as session:
        session.load()
        for round_ in range(ROUNDS):
            events = list(session.stream([], f"Tell me a long story about the number {round_}.", params))
            tokens = [e.text for e in events if isinstance(e, Token)]
            stats = events[-1].stats  # type: ignore[union-attr]
            decode.append(stats.decode_ms / 1000 / max(stats.completion_tokens - 1, 1))
            reply = [
                "<think>",
                *tokens[: len(tokens) // 2],
                "</think>",
                "\n\n",
                *tokens[len(tokens) // 2 :],
                "<tool_call>",
                '\n{"name": "add", ',
                '"arguments": {"a": 1, "b": 2}}\n',
                "</tool_call>",
            ]
            shaping.append(_shape(reply))
    per_token_decode = statistics.median(decode)
    per_token_shaping = statistics.median(shaping)
    ratio = per_token_decode / (per_token_decode + per_token_shaping)
    record(
        "reply shaping: decode rate with it / without",
        ratio,
        at_least=BUDGET,
        detail=f"decode {per_token_decode * 1e3:.2f} ms/token, shaping {per_token_shaping * 1e6:.1f} us/token",
    )
