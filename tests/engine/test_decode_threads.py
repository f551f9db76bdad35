"""The decode threads are timed and the fastest kept (engine.inference.decode_threads), and the
text a reply decodes does not depend on how many threads decoded it."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.inference.decode_threads import BLOCK, ROUNDS, SURE_ROUNDS, DecodeThreads, candidates
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams, WorkerResult, usable_cores


def test_the_candidates_are_every_core_one_fewer_and_half_on_many() -> None:
    assert candidates(1) == [1]
    assert candidates(2) == [2, 1]
    assert candidates(4) == [4, 3]
    assert candidates(8) == [8, 7, 4]


def _chosen(tuner: DecodeThreads) -> int | None:
    """The tuner's choice, read afresh (a property mypy would otherwise keep narrowed)."""
    return tuner.chosen


class _Machine:
    """A decoder whose step takes ``cost[threads]`` seconds, and ``switch`` more right after the
    threads changed (which the tuner must not count)."""

    def __init__(self, cost: dict[int, float], switch: float = 0.0) -> None:
        self.cost = cost
        self.switch = switch
        self.threads = 0
        self.changed = False
        self.applied: list[int] = []

    def apply(self, n: int) -> None:
        self.threads = n
        self.changed = True
        self.applied.append(n)

    def steps(self, tuner: DecodeThreads, n: int) -> list[int]:
        ran = []
        for _ in range(n):
            tuner.before_step()
            seconds = self.cost[self.threads] + (self.switch if self.changed else 0.0)
            self.changed = False
            ran.append(self.threads)
            tuner.after_step(seconds)
        return ran


@pytest.mark.parametrize("fast", [1, 2])
def test_the_fastest_candidate_is_kept_after_the_trial(fast: int) -> None:
    # Every step of one candidate beats every step of the other: beyond doubt after SURE_ROUNDS.
    machine = _Machine({fast: 0.010, 3 - fast: 0.014}, switch=0.050)
    tuner = DecodeThreads(machine.apply, candidates(2))
    tuner.begin_reply(0)
    trial = SURE_ROUNDS * 2 * BLOCK
    ran = machine.steps(tuner, trial - 1)
    assert _chosen(tuner) is None
    ran += machine.steps(tuner, 1)
    assert _chosen(tuner) == fast
    # Each candidate ran the same number of steps, in blocks, in turn.
    assert ran.count(1) == ran.count(2) == trial // 2
    assert ran[:BLOCK] == [ran[0]] * BLOCK and ran[BLOCK] != ran[0]
    assert machine.steps(tuner, 20) == [fast] * 20
    timings = tuner.timings()
    assert timings[fast] == pytest.approx(0.010) and timings[3 - fast] == pytest.approx(0.014)


def test_the_switch_after_a_change_of_threads_is_not_counted() -> None:
    # Two threads are faster per step, but every change of threads costs a slow step: counted, it
    # would make the candidate that runs after each change look slow.
    machine = _Machine({2: 0.010, 1: 0.012}, switch=0.5)
    tuner = DecodeThreads(machine.apply, [2, 1])
    tuner.begin_reply(0)
    machine.steps(tuner, ROUNDS * 2 * BLOCK)
    assert _chosen(tuner) == 2


class _NoisyMachine(_Machine):
    """Steps whose times overlap between candidates: each step's cost cycles through ``noise``."""

    def __init__(self, cost: dict[int, float], noise: list[float]) -> None:
        super().__init__(cost)
        self.noise = noise
        self.count = 0

    def steps(self, tuner: DecodeThreads, n: int) -> list[int]:
        ran = []
        for _ in range(n):
            tuner.before_step()
            seconds = self.cost[self.threads] + self.noise[self.count % len(self.noise)]
            self.count += 1
            ran.append(self.threads)
            tuner.after_step(seconds)
        return ran


def test_a_close_call_is_timed_for_every_round() -> None:
    # Two threads are faster by their medians, but some of their steps are slower than one
    # thread's: not beyond doubt, so the trial runs all ROUNDS before it keeps two.
    machine = _NoisyMachine({2: 0.010, 1: 0.011}, noise=[0.0, 0.004, 0.0, 0.001, 0.0])
    tuner = DecodeThreads(machine.apply, [2, 1])
    tuner.begin_reply(0)
    machine.steps(tuner, ROUNDS * 2 * BLOCK - 1)
    assert _chosen(tuner) is None
    machine.steps(tuner, 1)
    assert _chosen(tuner) == 2
    assert tuner.timings()[2] < tuner.timings()[1]


def test_a_trial_goes_on_across_short_replies_and_each_busy_level_has_its_own() -> None:
    machine = _Machine({2: 0.010, 1: 0.012})
    tuner = DecodeThreads(machine.apply, [2, 1])
    trial = SURE_ROUNDS * 2 * BLOCK  # the costs below never overlap: beyond doubt this soon
    # Replies of 4 tokens: each completes one block (a reply's first step follows a prompt batch,
    # which may have changed the threads, so a block does not run on into the next reply).
    for reply in range(SURE_ROUNDS * 2):
        assert _chosen(tuner) is None, reply
        tuner.begin_reply(0)
        machine.steps(tuner, BLOCK + 1)
    assert _chosen(tuner) == 2
    machine.cost = {2: 0.030, 1: 0.012}  # another program is busy: two threads wait for each other
    tuner.begin_reply(1)
    assert _chosen(tuner) is None  # measured again at this level
    machine.steps(tuner, trial)
    assert _chosen(tuner) == 1
    tuner.begin_reply(5)  # more busy programs than cores count as the top level
    assert _chosen(tuner) == 1
    tuner.begin_reply(0)
    assert _chosen(tuner) == 2
    assert machine.steps(tuner, 3) == [2, 2, 2]


def test_a_single_candidate_is_not_timed() -> None:
    machine = _Machine({3: 0.01})
    tuner = DecodeThreads(machine.apply, [3])
    tuner.begin_reply(0)
    assert _chosen(tuner) == 3
    assert machine.steps(tuner, 5) == [3] * 5
    assert machine.applied == [3] and tuner.timings() == {}


def _reply(worker: InferenceWorker, tokens: list[int]) -> WorkerResult:
    gen = worker.generate(tokens, GenerationParams(max_tokens=48, temperature=0.0))
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


@pytest.mark.model
@pytest.mark.slow
def test_a_reply_is_the_same_text_whatever_threads_decoded_it(starter_model: Path) -> None:
    prompt = "The lighthouse keeper wrote in his log every evening:"
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=512)) as timed:
        timed.start()
        tokens = timed.tokenize(prompt, add_bos=True)
        replies = []
        for _ in range(3):  # the trial (18 steps on 2 cores) spans the first reply, then the choice
            timed.reset_cache()
            replies.append(_reply(timed, tokens))
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=512, n_threads=1)) as fixed:
        fixed.start()
        one = _reply(fixed, tokens)
    assert one.decode_threads == 1
    assert all(r.decode_threads in candidates(usable_cores()) for r in replies)
    assert one.completion_tokens > 20
    assert {r.text for r in replies} == {one.text}
