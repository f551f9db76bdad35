"""How many threads decode a token: chosen by timing the candidates on this machine, in the reply.

Which is fastest differs by machine (ARCHITECTURE.md, "Threads and processes"): a decoded token reads every
weight once and needs little compute, so a thread more can gain bandwidth or lose it to the
barriers of a thread whose core is shared. So the worker does not guess: while the first tokens
of a reply are decoded, the candidates take turns in short blocks, and once each has enough
timed steps the fastest (median) is kept for every later token and reply (sooner when the
difference is beyond doubt, ``SURE_ROUNDS``). The choice is kept per "busy" level (other
programs' threads running when the reply starts, ``others_running``), so a machine that gets busy
is measured again. The split of the work among threads does not change
the arithmetic, so the text does not depend on it; only single-token steps are timed (a draft's
verification is a prompt batch and runs on the batch threads).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

BLOCK = 3  # steps per turn of a candidate; the first of each is not counted (the switch)
ROUNDS = 6  # turns per candidate before choosing
SURE_ROUNDS = 3
"""Turns per candidate after which the choice is made at once when it is beyond doubt: every timed
step of the fastest faster than every step of the others (beside a busy program, two threads took
4x one thread's time per token, and each of their steps costs the reply)."""


def candidates(cores: int) -> list[int]:
    """The thread counts worth timing on ``cores`` physical cores: all of them, one fewer (the
    window, the pipe and other programs keep a core busy now and then), and on 6 cores or more
    half of them (decoding is bandwidth bound: past some threads, more only wait)."""
    found = {max(1, cores), max(1, cores - 1)}
    if cores >= 6:
        found.add(cores // 2)
    return sorted(found, reverse=True)


@dataclass
class _Trial:
    """The timed steps of each candidate at one busy level, and the choice once made."""

    steps: dict[int, list[float]] = field(default_factory=dict)
    turns: int = 0  # blocks run so far
    chosen: int | None = None


class DecodeThreads:
    """Sets the decode threads before each single-token step (``before_step``), times the step
    (``after_step``) and, once each candidate has run ``ROUNDS`` blocks, keeps the fastest.

    Args:
        apply: sets the decode threads in llama.cpp (``llama_set_n_threads`` with the batch
            threads left as they are).
        choices: the candidates (:func:`candidates`); one candidate means nothing to measure.
    """

    def __init__(self, apply: Callable[[int], None], choices: Sequence[int]) -> None:
        self._apply = apply
        self.choices = list(choices)
        self._trials: dict[int, _Trial] = {}
        self._trial = self._trial_for(0)
        self._now: int | None = None  # what llama.cpp is set to
        self._in_block = 0  # steps of the current block so far
        self._current = self.choices[0]

    def _trial_for(self, busy: int) -> _Trial:
        trial = self._trials.get(busy)
        if trial is None:
            trial = self._trials[busy] = _Trial({n: [] for n in self.choices})
            if len(self.choices) == 1:
                trial.chosen = self.choices[0]
        return trial

    def begin_reply(self, busy: int | None) -> None:
        """A reply starts with ``busy`` other threads running: its level's choice, or its trial."""
        level = min(busy or 0, max(self.choices) - 1) if self.choices else 0
        self._trial = self._trial_for(max(level, 0))
        self._in_block = 0

    @property
    def chosen(self) -> int | None:
        """The thread count kept at the current busy level (None while it is being measured)."""
        return self._trial.chosen

    @property
    def current(self) -> int:
        """The threads the next step runs on."""
        return self._trial.chosen if self._trial.chosen is not None else self._current

    def timings(self) -> dict[int, float]:
        """The median seconds per step of each candidate measured at the current level."""
        return {n: statistics.median(times) for n, times in self._trial.steps.items() if times}

    def before_step(self) -> None:
        trial = self._trial
        if trial.chosen is None and self._in_block == 0:
            # Each round runs the candidates in turn, in the opposite order to the round before,
            # so that a trend (a longer context, a program starting) weighs on all alike.
            order = self.choices if (trial.turns // len(self.choices)) % 2 == 0 else self.choices[::-1]
            self._current = order[trial.turns % len(self.choices)]
        wanted = self.current
        if wanted != self._now:
            self._apply(wanted)
            self._now = wanted

    def after_step(self, seconds: float) -> None:
        trial = self._trial
        if trial.chosen is not None:
            return
        if self._in_block > 0:  # the first step of a block pays for the change of threads
            trial.steps[self._current].append(seconds)
        self._in_block += 1
        if self._in_block < BLOCK:
            return
        self._in_block = 0
        trial.turns += 1
        rounds = trial.turns / len(self.choices)
        if rounds < SURE_ROUNDS:
            return
        medians = self.timings()
        fastest = min(medians, key=lambda n: (medians[n], -n))
        # Beyond doubt: the fastest's slowest timed step beats every other candidate's fastest.
        if rounds >= ROUNDS or all(max(trial.steps[fastest]) < min(t) for n, t in trial.steps.items() if n != fastest):
            trial.chosen = fastest
