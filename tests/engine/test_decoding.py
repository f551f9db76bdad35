"""The worker's decode loop on the starter model: constrained output, logit bias, logprobs, Stop
while the prompt is read, and speculative decoding (the same greedy output with it on and off)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.errors import EngineError, ModelLoadError
from engine.inference.events import PrefillProgress, Token
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams, WorkerResult
from engine.inference.speculative import DraftModel
from tests.near_tie import NEAR_TIE_NATS, divergences

pytestmark = pytest.mark.model

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a tin of oil "
    "and a cloth for the great lens. From the gallery he could see the fishing boats returning, "
    "their lamps swinging like fireflies over the dark water, and the long pale line of the beach "
    "where the tide had left its ribbons of weed. "
)


@pytest.fixture(scope="module")
def worker(starter_model: Path) -> Iterator[InferenceWorker]:
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=2048, n_threads=2, n_batch=512)) as w:
        w.start()
        yield w


def _run(
    worker: InferenceWorker, prompt: str, params: GenerationParams, cancel: threading.Event | None = None
) -> tuple[list[object], WorkerResult]:
    """One reply from a cold cache: a reused prefix ends the prompt with a one-token batch, whose
    arithmetic differs from a longer batch's in the last bits, enough to flip a near tie."""
    worker.reset_cache()
    tokens = worker.tokenize(prompt, add_bos=True)
    return _drain(worker.generate(tokens, params, cancel))


def _drain(
    gen: Generator[object, None, WorkerResult], on_event: Callable[[object], None] = lambda event: None
) -> tuple[list[object], WorkerResult]:
    """Every event of one generation, and its result; ``on_event`` sees each event as it comes
    (a test presses Stop from it)."""
    events: list[object] = []
    while True:
        try:
            event = next(gen)
        except StopIteration as done:
            return events, done.value
        events.append(event)
        on_event(event)


def _tokens(events: list[object]) -> list[Token]:
    return [e for e in events if isinstance(e, Token)]


# --------------------------------------------------------------------------- constrained output

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
        "city": {"type": "string", "maxLength": 16},
        "count": {"type": "integer"},
        "when": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["answer", "city", "count", "when", "tags"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_reply_parses_and_validates(worker: InferenceWorker, seed: int) -> None:
    params = GenerationParams(max_tokens=160, temperature=0.9, seed=seed, json_schema=json.dumps(SCHEMA))
    _, result = _run(worker, "Here is a record about a town, as JSON:\n", params)
    assert result.reason == "stop", result.text
    jsonschema.validate(json.loads(result.text), SCHEMA)


@pytest.mark.parametrize("prompt", ["Is water wet? Answer:", "Q: Are cats reptiles?\nA:", "Say something:"])
def test_grammar_restricts_the_reply(worker: InferenceWorker, prompt: str) -> None:
    params = GenerationParams(max_tokens=20, temperature=1.0, seed=7, grammar='root ::= "yes" | "no"')
    _, result = _run(worker, prompt, params)
    assert result.text in {"yes", "no"}
    assert result.reason == "stop"


def test_grammar_under_lookup_speculation_is_the_same_reply(worker: InferenceWorker) -> None:
    grammar = 'root ::= ("fox " | "dog " | "the ")+ "."'
    prompt = "the fox the dog the fox the dog the fox the dog the fox"
    plain = _run(worker, prompt, GenerationParams(max_tokens=40, temperature=0.0, grammar=grammar))[1]
    lookup = GenerationParams(max_tokens=40, temperature=0.0, grammar=grammar, speculative="lookup")
    fast = _run(worker, prompt, lookup)[1]
    assert fast.text == plain.text
    assert set(plain.text.replace(".", "").split()) <= {"fox", "dog", "the"}


def test_a_grammar_that_does_not_compile_is_one_line(worker: InferenceWorker) -> None:
    with pytest.raises(EngineError) as caught:
        _run(worker, "Hello", GenerationParams(max_tokens=4, grammar='root ::= "a" | undefined_rule'))
    assert "grammar" in str(caught.value) and "\n" not in str(caught.value)
    # The worker is fine afterwards.
    assert _run(worker, "Hello", GenerationParams(max_tokens=3, temperature=0.0))[1].completion_tokens == 3


def test_a_json_schema_that_cannot_become_a_grammar_is_one_line(worker: InferenceWorker) -> None:
    with pytest.raises(EngineError) as caught:
        _run(worker, "Hello", GenerationParams(max_tokens=4, json_schema='{"$ref": "#/definitions/missing"}'))
    assert "json_schema" in str(caught.value) and "\n" not in str(caught.value)


def test_a_json_schema_keyword_the_grammar_cannot_enforce_is_refused(worker: InferenceWorker) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    with pytest.raises(EngineError, match=r"'minimum' at properties\.n"):
        _run(worker, "Hello", GenerationParams(max_tokens=4, json_schema=json.dumps(schema)))


# --------------------------------------------------------------------------- logit bias and logprobs


def test_logit_bias_of_minus_infinity_bans_a_token(worker: InferenceWorker) -> None:
    prompt = "The capital of France is"
    greedy = GenerationParams(max_tokens=6, temperature=0.0, logprobs=1)
    first = _tokens(_run(worker, prompt, greedy)[0])[0].token_id
    banned = greedy.model_copy(update={"logit_bias": ((first, -math.inf),)})
    events, _ = _run(worker, prompt, banned)
    ids = [t.token_id for t in _tokens(events)]
    assert first not in ids
    # A positive bias forces a token that was not chosen.
    forced = greedy.model_copy(update={"logit_bias": ((ids[0], 100.0),), "max_tokens": 3})
    assert [t.token_id for t in _tokens(_run(worker, "Hello there", forced)[0])] == [ids[0]] * 3


# --------------------------------------------------------------------------- penalties, typical-p, Mirostat


def test_frequency_and_presence_penalties_stop_a_repetition(worker: InferenceWorker) -> None:
    # The starter is a base model: greedy, it says "the capital of the country of France ... the".
    prompt = "The capital of France is"
    greedy = GenerationParams(max_tokens=24, temperature=0.0)
    plain = [t.token_id for t in _tokens(_run(worker, prompt, greedy)[0])]
    for update in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalized = [t.token_id for t in _tokens(_run(worker, prompt, greedy.model_copy(update=update))[0])]
        assert penalized != plain, update
        # Each token is penalised once it has occurred: fewer repeats than the plain reply.
        assert len(set(penalized)) > len(set(plain)), update
    # A negative presence penalty rewards what occurred: still a reply, and a different one.
    rewarded = greedy.model_copy(update={"presence_penalty": -2.0})
    assert _tokens(_run(worker, prompt, rewarded)[0])


def test_typical_p_and_mirostat_sample_reproducibly_and_differently(worker: InferenceWorker) -> None:
    prompt = "Once upon a time"
    base = GenerationParams(max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    replies = {}
    for name, update in (
        ("plain", {}),
        ("typical", {"typical_p": 0.2}),
        ("mirostat1", {"mirostat": 1, "mirostat_tau": 2.0}),
        ("mirostat2", {"mirostat": 2, "mirostat_tau": 2.0}),
    ):
        params = base.model_copy(update=update)
        first = [t.token_id for t in _tokens(_run(worker, prompt, params)[0])]
        assert first == [t.token_id for t in _tokens(_run(worker, prompt, params)[0])], name  # seeded
        replies[name] = tuple(first)
    assert len(set(replies.values())) == len(replies), replies


def test_logit_bias_outside_the_vocabulary_is_an_error(worker: InferenceWorker) -> None:
    with pytest.raises(EngineError, match="outside the vocabulary"):
        _run(worker, "Hello", GenerationParams(max_tokens=2, logit_bias=((10**7, 1.0),)))


def test_logprobs_are_probabilities_and_greedy_picks_the_top(worker: InferenceWorker) -> None:
    events, result = _run(worker, "Once upon a time", GenerationParams(max_tokens=12, temperature=0.0, logprobs=5))
    tokens = _tokens(events)
    assert len(tokens) == result.completion_tokens == 12
    for token in tokens:
        assert token.logprob is not None and token.logprob <= 0.0
        assert len(token.top_logprobs) == 5
        values = [lp for _, lp in token.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert all(lp <= 0.0 for lp in values)
        assert sum(math.exp(lp) for lp in values) <= 1.0 + 1e-6
        # Greedy: the chosen token is the most likely one.
        assert token.top_logprobs[0][1] == pytest.approx(token.logprob)
        assert token.text == token.top_logprobs[0][0]
    plain = _run(worker, "Once upon a time", GenerationParams(max_tokens=12, temperature=0.0))[1]
    assert plain.text == result.text


def test_without_logprobs_tokens_carry_none(worker: InferenceWorker) -> None:
    events, _ = _run(worker, "Hello", GenerationParams(max_tokens=3, temperature=0.0))
    assert all(t.logprob is None and t.top_logprobs == () for t in _tokens(events))


# --------------------------------------------------------------------------- Stop while reading the prompt


def test_stop_during_prefill_reads_at_most_a_chunk_more_and_no_token_follows(worker: InferenceWorker) -> None:
    prompt = PASSAGE * 16  # ~1,500 tokens: seconds of prefill on two cores
    tokens = worker.tokenize(prompt, add_bos=True)
    assert len(tokens) > 1000
    worker.reset_cache()
    cancel = threading.Event()
    stopped_at: list[int] = []  # the prompt tokens reported read when Stop came
    read = [0]

    def stop() -> None:
        stopped_at.append(read[0])
        cancel.set()

    # Stop 0.3 s after the first progress report (on a busy machine the first chunk alone can
    # take longer than 0.3 s from the start).
    timer = threading.Timer(0.3, stop)

    def start_timer(event: object) -> None:
        if isinstance(event, PrefillProgress):
            read[0] = event.done
        if isinstance(event, PrefillProgress) and event.done > 0 and not timer.is_alive() and not stopped_at:
            timer.start()

    gen = worker.generate(tokens, GenerationParams(max_tokens=20, temperature=0.0), cancel)
    try:
        events, result = _drain(gen, start_timer)
    finally:
        timer.cancel()
    assert result.reason == "cancelled"
    assert not _tokens(events)
    assert stopped_at, "the prompt was read before Stop: make it longer"
    progress = [e.done for e in events if isinstance(e, PrefillProgress)]
    # Bound, counted, not timed: after Stop, at most the one chunk already on its way was read
    # (n_batch, 512 tokens; the chunk in flight is aborted, so usually none), never the ~1,500 of
    # the whole prompt.
    assert progress[-1] - stopped_at[0] <= 512, (stopped_at, progress)
    assert progress[-1] < len(tokens)
    # Real progress: a report after each chunk of n_batch (512) tokens read, the first among them.
    assert next(done for done in progress if done) == 512
    # The cache is consistent: it holds exactly the chunks read before Stop, and the next turn
    # reuses them and reads the rest.
    reused = _drain(worker.generate(tokens, GenerationParams(max_tokens=2, temperature=0.0)))[1].cached_tokens
    assert reused == progress[-1]


def test_stop_right_after_prefill_sends_no_token(worker: InferenceWorker) -> None:
    cancel = threading.Event()
    tokens = worker.tokenize(PASSAGE, add_bos=True)
    worker.reset_cache()

    def stop_after_prefill(event: object) -> None:
        if isinstance(event, PrefillProgress) and event.done == event.total:
            cancel.set()

    gen = worker.generate(tokens, GenerationParams(max_tokens=50, temperature=0.0), cancel)
    events, result = _drain(gen, stop_after_prefill)
    assert result.reason == "cancelled"
    assert not _tokens(events)  # one the worker sent before it saw Stop is not passed on
    assert result.text == ""


def test_stop_while_decoding_passes_no_token_on_and_the_text_is_what_was_shown(worker: InferenceWorker) -> None:
    cancel = threading.Event()
    tokens = worker.tokenize("Once upon a time", add_bos=True)
    worker.reset_cache()
    gen = worker.generate(tokens, GenerationParams(max_tokens=200, temperature=0.0, speculative="lookup"), cancel)
    seen: list[Token] = []
    after: list[Token] = []

    def stop_after_five(event: object) -> None:
        if isinstance(event, Token):
            (after if cancel.is_set() else seen).append(event)
            if len(seen) == 5:
                cancel.set()
                time.sleep(0.2)  # the worker goes on meanwhile: what it sends must not come through

    result = _drain(gen, stop_after_five)[1]
    assert result.reason == "cancelled"
    assert after == []
    assert result.text == "".join(t.text for t in seen)


# --------------------------------------------------------------------------- speculative decoding

QUOTE_PROMPT = "Passage:\n" + PASSAGE * 3 + "\nCopy the passage exactly.\nCopy:\n" + PASSAGE[:80]


def _same_up_to_a_near_tie(worker: InferenceWorker, prompt: str, plain: list[Token], fast: list[Token]) -> int:
    """Asserts that a speculative greedy reply is the plain one, or leaves plain decoding only at
    near ties, to its end (llama.cpp's arithmetic depends on the batch's shape: see
    tests/near_tie.py, which also says how the tolerance was measured); returns how many tokens
    agree with the plain reply."""
    tokens = worker.tokenize(prompt, add_bos=True)
    plain = [t for t in plain if t.token_id >= 0]
    fast = [t for t in fast if t.token_id >= 0]
    found = divergences(worker, tokens, fast, GenerationParams(max_tokens=len(fast), temperature=0.0))
    for d in found:
        assert d.gap <= NEAR_TIE_NATS, f"left plain decoding at token {d.index}, a confident one (gap {d.gap:.2f})"
    agree = next((i for i, (a, b) in enumerate(zip(plain, fast, strict=False)) if a.token_id != b.token_id), None)
    if agree is None:
        assert len(plain) == len(fast) and not found
        return len(plain)
    assert found and found[0].index == agree
    return agree


@pytest.mark.parametrize(
    "prompt",
    [QUOTE_PROMPT, "The three primary colours are red, yellow and", "def fib(n):\n    if n < 2:\n        return n\n"],
)
def test_lookup_gives_the_same_greedy_tokens(worker: InferenceWorker, prompt: str) -> None:
    params = GenerationParams(max_tokens=80, temperature=0.0, logprobs=2)
    plain_events, plain = _run(worker, prompt, params)
    fast_events, fast = _run(worker, prompt, params.model_copy(update={"speculative": "lookup"}))
    agree = _same_up_to_a_near_tie(worker, prompt, _tokens(plain_events), _tokens(fast_events))
    if agree == len(_tokens(plain_events)):
        assert fast.text == plain.text and fast.reason == plain.reason and fast.n_past == plain.n_past
    assert plain.draft_tokens == plain.accepted_tokens == 0
    assert fast.accepted_tokens <= fast.draft_tokens
    assert sum(t.drafted for t in _tokens(fast_events)) == fast.accepted_tokens


def test_lookup_accepts_drafts_when_the_reply_quotes(worker: InferenceWorker) -> None:
    _, fast = _run(worker, QUOTE_PROMPT, GenerationParams(max_tokens=80, temperature=0.0, speculative="lookup"))
    assert fast.accepted_tokens >= 30, fast
    assert fast.accepted_tokens / fast.draft_tokens > 0.7


def test_lookup_under_sampling_keeps_the_seeded_reply(worker: InferenceWorker) -> None:
    # Each position is sampled once, by the same chain, with or without drafts: a seeded reply
    # is the same (up to the batch's arithmetic, which is the same here on the CPU).
    params = GenerationParams(max_tokens=60, temperature=0.7, seed=11)
    plain = _run(worker, QUOTE_PROMPT, params)[1]
    fast = _run(worker, QUOTE_PROMPT, params.model_copy(update={"speculative": "lookup"}))[1]
    assert fast.text == plain.text


def test_a_draft_model_is_refused_without_one_loaded(worker: InferenceWorker) -> None:
    with pytest.raises(EngineError, match="no draft model"):
        _run(worker, "Hello", GenerationParams(max_tokens=2, speculative="draft"))


@pytest.mark.slow
def test_draft_model_gives_the_same_greedy_tokens(starter_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The starter as its own draft: the mechanics (sync, drafting, rollback) with full agreement.
    # It costs as much as the target, so the policy would never draft with it: force 4 at a time.
    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", "4")
    load = LoadParams(model_path=starter_model, n_ctx=1024, n_threads=2, draft_model_path=starter_model)
    with InferenceWorker(load) as w:
        w.start()
        params = GenerationParams(max_tokens=48, temperature=0.0, logprobs=2)
        drafting = params.model_copy(update={"speculative": "draft"})
        plain_events, _ = _run(w, "The history of the printing press", params)
        fast_events, fast = _run(w, "The history of the printing press", drafting)
        follow = _run(w, "The history of the printing press began", drafting)[1]
        prompt = "The history of the printing press"
        assert _same_up_to_a_near_tie(w, prompt, _tokens(plain_events), _tokens(fast_events)) >= 8
        assert fast.draft_tokens > 0 and fast.accepted_tokens / fast.draft_tokens > 0.8
        assert follow.completion_tokens > 0


def test_a_draft_model_of_another_vocabulary_is_refused(starter_model: Path, tmp_path: Path) -> None:
    from tests.engine.tiny_models import write_tiny_llama_gguf

    other = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    load = LoadParams(model_path=starter_model, n_ctx=256, draft_model_path=other)
    with pytest.raises(ModelLoadError) as caught, InferenceWorker(load) as w:
        w.start()
    message = str(caught.value)
    assert "tiny.gguf" in message and "vocabulary" in message and "\n" not in message


@pytest.mark.slow
def test_stop_while_the_draft_model_reads_the_prompt(starter_model: Path) -> None:
    load = LoadParams(model_path=starter_model, n_ctx=2048, n_threads=2, draft_model_path=starter_model)
    with InferenceWorker(load) as w:
        w.start()
        tokens = w.tokenize(PASSAGE * 16, add_bos=True)
        cancel = threading.Event()
        stopped_at: list[float] = []

        def stop_while_the_draft_reads(event: object) -> None:
            if isinstance(event, PrefillProgress) and event.done == event.total:
                time.sleep(0.3)  # the draft model is reading the same ~1,500 tokens now
                stopped_at.append(time.perf_counter())
                cancel.set()

        gen = w.generate(tokens, GenerationParams(max_tokens=20, temperature=0.0, speculative="draft"), cancel)
        events, result = _drain(gen, stop_while_the_draft_reads)
        assert result.reason == "cancelled"
        assert not _tokens(events)
        # A hang guard, not the latency target (that is bench_prefill_stop's): the draft model's
        # reading is not reported, so no count shows it stopped; 5 s is over 14x the former 0.35 s
        # bound, which the stop met here.
        assert stopped_at and time.perf_counter() - stopped_at[-1] < 5.0
        # The draft's cache is consistent: the next reply drafts and finishes.
        again = _run(
            w, "The history of the printing press", GenerationParams(max_tokens=8, temperature=0.0, speculative="draft")
        )[1]
        assert again.completion_tokens == 8


class _RecordingDraft(DraftModel):
    """A draft model that only records what the decode loop asks of it: how many times it was
    brought to the sequence, and how many drafts it was asked for (it proposes nothing)."""

    def __init__(self, llm: Any, relative_cost: float) -> None:
        self.llm = llm  # a context for the abort guard the loop arms around the draft's prefill
        self.tokens = []
        self.relative_cost = relative_cost
        self.syncs = 0
        self.proposals = 0

    def sync(self, cancel: object = None, chunk: int = 256) -> bool:
        self.syncs += 1
        return True

    def propose(self, k: int) -> tuple[list[int], str]:
        self.proposals += 1
        return [], ""


@pytest.fixture(scope="module")
def target(starter_model: Path) -> Iterator[object]:
    """The starter model in this process, for the decode loop called directly."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from engine.cpu_backend import load_backends

    backend = load_backends()
    assert backend.error is None, backend.error
    llm = llama_cpp.Llama(str(starter_model), n_ctx=256, n_batch=256, n_threads=2, verbose=False)
    try:
        yield llm
    finally:
        llm.close()


def _decode_with(target: object, draft: _RecordingDraft) -> None:
    import llama_cpp

    from engine.inference.decoding import StopMatcher, decode

    llm: Any = target
    tokens = llm.tokenize(PASSAGE.encode())
    llm.reset()
    llm.eval(tokens)
    params = GenerationParams(max_tokens=8, temperature=0.0, speculative="draft")
    outcome = decode(
        llm,
        llama_cpp,
        lambda t: llm.detokenize([t]),
        params,
        tokens,
        256,
        256,
        StopMatcher([]),
        threading.Event(),
        lambda event: None,
        draft,
    )
    assert outcome.reason == "length" and outcome.completion_tokens == 8


def test_a_draft_model_the_policy_declines_never_reads_the_prompt(
    target: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draft as costly as its target is never worth drafting with: the loop then never brings
    its KV cache to the prompt (before, every reply prefilled the whole prompt into the draft)."""
    monkeypatch.delenv("GLASSBOX_TEST_DRAFT_FIXED", raising=False)
    draft = _RecordingDraft(target, relative_cost=1.0)
    _decode_with(target, draft)
    assert (draft.syncs, draft.proposals) == (0, 0)


def test_a_draft_model_reads_the_prompt_once_when_the_policy_first_drafts(
    target: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", "2")
    draft = _RecordingDraft(target, relative_cost=1.0)
    _decode_with(target, draft)
    assert draft.syncs == 1 and draft.proposals >= 7
