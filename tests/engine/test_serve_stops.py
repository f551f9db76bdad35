"""Stop strings in the worker (``engine.inference.runtime._StopMatcher``), as ``glassbox serve`` passes them:
the same answers as scanning every stop string at every token, at a cost per token that grows with
neither their number nor the length of the reply."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from types import CodeType, FrameType

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


def lines_run(code: CodeType, fn: Callable[[], object]) -> int:
    """Python lines that ``code``, and what it calls, ran during ``fn()``: its work, counted, not
    timed (a loop that went over every stop string at every token would run a line per stop
    string per token)."""
    lines = [0]

    def count(frame: FrameType, event: str, arg: object) -> object:
        if event == "line":
            lines[0] += 1
        return count

    def calls(frame: FrameType, event: str, arg: object) -> object:
        caller: FrameType | None = frame
        while caller is not None:
            if caller.f_code is code:
                return count
            caller = caller.f_back
        return None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return lines[0]


def test_cost_per_token_does_not_grow_with_the_stop_strings() -> None:
    """1,000 stop strings of 64 characters, 20,000 pieces. Bound, counted, not timed: at most 16
    Python lines per character of the reply in ``feed`` (7.5 here) and 32 per character of the stop
    strings to build (16.8 here), whatever their number. Scanning every stop string at every token
    runs a line per stop string per token (over 250 a character here), and took 16 CPU-s for the
    first 2,000 pieces."""
    rng = random.Random(9)
    stops = ["".join(rng.choices("abcd", k=64)) for _ in range(1000)]
    pieces = ["".join(rng.choices("abcd ", k=rng.randint(1, 6))) for _ in range(20_000)]
    built: list[_StopMatcher] = []
    build_lines = lines_run(_StopMatcher.__init__.__code__, lambda: built.append(_StopMatcher(stops)))
    matcher = built[0]
    partials: list[int] = []

    def feed_all() -> None:
        for piece in pieces:
            matcher.feed(piece)
            partials.append(matcher.partial)

    feed_lines = lines_run(_StopMatcher.feed.__code__, feed_all)
    characters = sum(map(len, pieces))
    print(f"{feed_lines / characters:.1f} lines a reply character, {build_lines / (64 * 1000):.1f} a stop character")
    assert max(partials) <= 63
    assert feed_lines <= 16 * characters, f"{feed_lines} lines for {characters} characters"
    assert build_lines <= 32 * 64 * 1000, f"{build_lines} lines to build"
