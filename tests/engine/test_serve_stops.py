"""Stop strings in the worker (``engine.inference.runtime._StopMatcher``), as ``glassbox serve`` passes them:
the same answers as scanning every stop string at every token, at a cost per token that grows with
neither their number nor the length of the reply."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from engine.inference.runtime import _StopMatcher


def find_by_scan(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string begins (the check the worker made before, at every token)."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def partial_by_scan(text: str, stops: Sequence[str]) -> int:
    """The longest tail of ``text`` that begins a stop string (ditto)."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                best = max(best, n)
                break
    return best


def test_matches_scanning_every_stop_string() -> None:
    rng = random.Random(5)
    for trial in range(5000):
        alphabet = "ab" if trial % 2 else "abc"
        stops = ["".join(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(rng.randint(0, 5))]
        matcher = _StopMatcher(stops)
        text = ""
        while len(text) < 40:
            piece = "".join(rng.choices(alphabet, k=rng.randint(0, 5)))
            text += piece
            hit = matcher.feed(piece)
            assert hit == find_by_scan(text, stops), (stops, text)
            if hit is not None:
                break
            assert matcher.partial == partial_by_scan(text, stops), (stops, text)


def test_the_earliest_stop_in_one_piece_wins() -> None:
    matcher = _StopMatcher(["bc", "abcd", ""])
    assert matcher.feed("xx") is None
    assert matcher.feed("abcdef") == 2  # "abcd" begins before "bc" although it ends later
    matcher = _StopMatcher(["world"])
    assert matcher.feed("hello wor") is None
    assert matcher.partial == 3
    assert matcher.feed("ld!") == 6
    assert _StopMatcher([]).feed("anything") is None


def test_cost_per_token_does_not_grow_with_the_stop_strings() -> None:
    """1,000 stop strings of 64 characters, 20,000 pieces: bound 1 CPU-s in all (build included;
    0.14 s here). Scanning every stop string at every token took 16 CPU-s for the first 2,000 pieces."""
    rng = random.Random(9)
    stops = ["".join(rng.choices("abcd", k=64)) for _ in range(1000)]
    pieces = ["".join(rng.choices("abcd ", k=rng.randint(1, 6))) for _ in range(20_000)]
    started = time.process_time()
    matcher = _StopMatcher(stops)
    for piece in pieces:
        matcher.feed(piece)
        assert matcher.partial <= 63
    spent = time.process_time() - started
    assert spent < 1.0, f"{spent:.2f} CPU-s"
