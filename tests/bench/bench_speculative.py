"""Speculative decoding on the starter model: what prompt lookup gains, on which kinds of prompt,
and how often its greedy reply is the plain one.

Run: ``make bench`` or ``pytest tests/bench/bench_speculative.py -s``. Greedy decoding throughout,
decode tokens/s with and without, interleaved (the order alternates), in the app's worker.

* Kinds of prompt (the default is chosen from them, not from one): a document question answered
  by quoting it, an edit of a piece of code, a summary of a passage, ordinary chat and a story,
  each through the chat template, several prompts each. Budgets: >= 1.3x on the quoting answer,
  >= 0.97x on every other kind (lookup may never cost more than 3%). The starter is a *base*
  model that repeats itself; each row says how much of the plain reply repeats its own earlier
  text (a loop that prompt lookup drafts from), so a gain that comes from loops is visible.
* Greedy identity: of all those pairs, how many replies are the same text with lookup on and off
  (reported: llama.cpp's CPU arithmetic depends on the batch's shape, so identity is not promised).
  Every reply that differs is walked to its end (``tests/near_tie.py``): each token it chose
  against plain decoding of its own prefix must be within the batch-shape noise of the best one.
* The batch-shape noise itself: the same tokens evaluated one at a time and in batches of 2 to 13
  (what verification uses) and the prompt's batch; how far the gap between the two most likely
  tokens moves. Budget: <= ``tests.near_tie.NEAR_TIE_NATS``, the tolerance the tests use.
* Identity, at what cost: no batch of 2 or more tokens reproduces a single-token step here, but
  batches of 2 and 3 reproduce each other row for row. So a decoder that pads every single step
  to two rows and verifies at most two drafts at a time gives the same greedy reply with lookup on
  and off; measured: the replies, and what the padding costs plain decoding (reported).
* A draft model: the starter (Q4_K_M) as target, a smaller quantization of it as draft, built here
  with the project's quantizer. Reported: a draft pays only when it is several times cheaper than
  its target; this pair shares a 262k-token embedding and output layer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine.inference.events import Token
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams, WorkerResult
from engine.inference.session import ChatSession
from tests.bench.results import budgets, record
from tests.near_tie import NEAR_TIE_NATS, divergences

pytestmark = [pytest.mark.model, pytest.mark.slow]

_PASSAGE_FILE = Path(__file__).resolve().parents[2] / "resources" / "perplexity.txt"
MAX_TOKENS = 128
PAIRS_PER_PROMPT = 2
LOOP_NGRAM = 8
T = TypeVar("T")


def _text() -> str:
    return _PASSAGE_FILE.read_text(encoding="utf-8").strip()


def _paragraphs() -> list[str]:
    return [p for p in _text().split("\n\n") if len(p.split()) > 40]


CODE = """def mean_and_spread(values):
    total = 0.0
    for value in values:
        total += value
    mean = total / len(values)
    spread = 0.0
    for value in values:
        spread += (value - mean) ** 2
    return mean, (spread / len(values)) ** 0.5
"""


def kinds() -> dict[str, list[str]]:
    """The user messages of each kind of prompt."""
    paragraphs = _paragraphs()
    return {
        "quoting answer": [
            f"Document:\n{' '.join(paragraphs[i : i + 3])}\n\nCopy the document above word for word.\n\n"
            f"{paragraphs[i].split('. ')[0]}."
            for i in (0, 3)
        ],
        "code edit": [
            f"Here is a function:\n\n{CODE}\nRename `values` to `samples` and return the result as a dict.",
            f"Here is a function:\n\n{CODE}\nAdd type hints and a docstring to it.",
        ],
        "summary": [f"Summarise this passage in three sentences:\n\n{paragraphs[i]}" for i in (1, 4)],
        "ordinary chat": [
            "Tell me about the ocean.",
            "Write a short poem about autumn leaves.",
            "What does a CPU do?",
            "Give me three tips for learning to cook.",
        ],
        "story": ["Write a story about a fox who learns to fly.", "Tell me a story set on a night train."],
    }


@dataclass
class Pair:
    """One prompt's plain and lookup runs (with their tokens) and its prompt's tokens."""

    kind: str
    prompt: list[int]
    plain: WorkerResult
    fast: WorkerResult
    plain_tokens: list[Token] = field(default_factory=list)
    fast_tokens: list[Token] = field(default_factory=list)


def _run(worker: InferenceWorker, tokens: list[int], params: GenerationParams) -> tuple[WorkerResult, list[Token]]:
    out: list[Token] = []
    gen = worker.generate(tokens, params)
    while True:
        try:
            event = next(gen)
        except StopIteration as done:
            return done.value, out
        if isinstance(event, Token) and event.token_id >= 0:
            out.append(event)


def _decode_tps(result: WorkerResult) -> float:
    return max(result.completion_tokens - 1, 0) / (result.decode_ms / 1000) if result.decode_ms else 0.0


def _interleaved(run_plain: Callable[[], T], run_fast: Callable[[], T], rounds: int) -> tuple[list[T], list[T]]:
    """Both sides ``rounds`` times, alternating which goes first: (plain runs, fast runs)."""
    plain: list[T] = []
    fast: list[T] = []
    for i in range(rounds):
        if i % 2 == 0:
            plain.append(run_plain())
            fast.append(run_fast())
        else:
            fast.append(run_fast())
            plain.append(run_plain())
    return plain, fast


def loop_share(tokens: list[int], n: int = LOOP_NGRAM) -> float:
    """The share of a reply's tokens that end an ``n``-gram the reply already had: the model
    repeating itself (what prompt lookup drafts from when the prompt has nothing to quote)."""
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for j in range(n, len(tokens) + 1):
        gram = tuple(tokens[j - n : j])
        if gram in seen:
            repeated += 1
        seen.add(gram)
    return repeated / max(len(tokens), 1)


@pytest.fixture(scope="module")
def session(starter_model: Path) -> Iterator[ChatSession]:
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=4096)) as chat:
        chat.load()
        yield chat


@pytest.fixture(scope="module")
def pairs(session: ChatSession) -> list[Pair]:
    """Every kind's prompts, each run plain and with prompt lookup, interleaved."""
    worker = session.worker
    assert worker is not None
    plain = GenerationParams(max_tokens=MAX_TOKENS, temperature=0.0)
    fast = plain.model_copy(update={"speculative": "lookup"})
    found: list[Pair] = []
    for kind, prompts in kinds().items():
        for text in prompts:
            list(session.stream([], text, plain.model_copy(update={"max_tokens": 1})))
            tokens = list(session.last_prompt)  # the prompt as the app renders it (the chat template)
            # Read from an empty cache, then cached: every measured run reuses the same prompt state
            # (how a prompt was batched changes its KV values in the last bits, and so a near tie).
            worker.reset_cache()
            _run(worker, tokens, plain)
            plain_runs, fast_runs = _interleaved(
                lambda t=tokens: _run(worker, t, plain), lambda t=tokens: _run(worker, t, fast), PAIRS_PER_PROMPT
            )
            for (p, pt), (f, ft) in zip(plain_runs, fast_runs, strict=True):
                found.append(Pair(kind, tokens, p, f, pt, ft))
    return found


def test_lookup_by_kind_of_prompt(pairs: list[Pair]) -> None:
    print(f"\nprompt lookup vs plain, greedy, {MAX_TOKENS} tokens, the app's worker")
    print(f"{'kind':16}{'ratio':>7}{'plain tok/s':>13}{'lookup tok/s':>13}{'accepted':>14}{'self-repeat':>13}")
    with budgets():
        for kind in kinds():
            mine = [p for p in pairs if p.kind == kind]
            ratio = statistics.median(_decode_tps(p.fast) / _decode_tps(p.plain) for p in mine)
            drafted = sum(p.fast.draft_tokens for p in mine)
            accepted = sum(p.fast.accepted_tokens for p in mine)
            loops = statistics.mean(loop_share([t.token_id for t in p.plain_tokens]) for p in mine)
            same = sum(p.fast.text == p.plain.text for p in mine)
            print(
                f"{kind:16}{ratio:7.2f}{statistics.median(_decode_tps(p.plain) for p in mine):13.1f}"
                f"{statistics.median(_decode_tps(p.fast) for p in mine):13.1f}{f'{accepted}/{drafted}':>14}"
                f"{loops:13.0%}"
            )
            record(
                f"lookup vs plain: {kind}",
                ratio,
                at_least=1.3 if kind == "quoting answer" else 0.97,
                detail=f"{accepted} of {drafted} drafts accepted; {loops:.0%} of the plain reply repeats itself; "
                f"{same} of {len(mine)} replies the same",
            )


def test_greedy_replies_with_lookup_on_and_off(pairs: list[Pair], session: ChatSession) -> None:
    worker = session.worker
    assert worker is not None
    params = GenerationParams(max_tokens=MAX_TOKENS, temperature=0.0)
    same = sum(p.fast.text == p.plain.text for p in pairs)
    walked: list[tuple[str, list[float]]] = []
    for p in pairs:
        if p.fast.text == p.plain.text:
            continue
        # Every token of the reply, with its id: with logprobs each one is sent (it changes nothing
        # in what is sampled), even one whose text is not whole UTF-8 yet; from the prompt state
        # the measured run had.
        worker.reset_cache()
        _run(worker, p.prompt, params)
        fast, fast_tokens = _run(worker, p.prompt, params.model_copy(update={"speculative": "lookup", "logprobs": 1}))
        assert fast.text == p.fast.text, "the speculative reply is not deterministic"
        found = divergences(worker, p.prompt, fast_tokens, params)
        walked.append((p.kind, [d.gap for d in found]))
        for d in found:
            print(f"  {p.kind}: left plain decoding at token {d.index} ({d.plain!r} vs {d.fast!r}, gap {d.gap:.3f})")
        assert found, f"{p.kind}: the replies differ but every token is plain decoding's"
        worst = max(d.gap for d in found)
        assert worst <= NEAR_TIE_NATS, f"{p.kind}: a speculative reply left plain decoding at a confident token"
    gaps = [g for _kind, found in walked for g in found]
    print(f"the same greedy reply in {same} of {len(pairs)} pairs; {len(gaps)} divergences, largest gap "
          f"{max(gaps, default=0.0):.3f} nats (tolerance {NEAR_TIE_NATS})")  # fmt: skip
    record(
        "lookup vs plain: greedy replies identical",
        same,
        unit="count",
        detail=f"of {len(pairs)}; the others leave plain decoding {len(gaps)} times, all at near ties "
        f"(gap <= {max(gaps, default=0.0):.2f} nats)",
    )


def _logits(llm: Any, lc: Any, positions: list[int]) -> list[Any]:
    """The logits of the batch's rows at ``positions`` (-1: the last)."""
    import numpy as np

    n_vocab, ctx = llm.n_vocab(), llm._ctx.ctx
    return [np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in positions]


class _Raw:
    """The starter model in this process, for evaluating token rows in batches of a chosen shape."""

    def __init__(self, model: Path) -> None:
        import llama_cpp

        from engine.cpu_backend import load_backends
        from engine.inference.runtime import default_threads

        load_backends()
        decode, batch = default_threads()
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(model), n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=decode,
            n_threads_batch=batch, verbose=False,
        )  # fmt: skip

    def prefill(self, tokens: list[int]) -> None:
        self.llm._ctx.kv_cache_clear()
        self.llm.n_tokens = 0
        self.llm.eval(tokens)

    def rows(self, tokens: list[int], pos: int, logits: tuple[bool, ...] | None = None) -> list[Any]:
        """Evaluates ``tokens`` at ``pos`` in one batch; the logits of the rows asked for."""
        llm = self.llm
        llm._ctx.kv_cache_seq_rm(-1, pos, -1)
        batch = llm._batch
        batch.set_batch(tokens, pos, logits_all=True)
        wanted = logits or (True,) * len(tokens)
        for i, want in enumerate(wanted):
            batch.batch.logits[i] = int(want)
        llm._ctx.decode(batch)
        return _logits(llm, self.lc, [i for i, want in enumerate(wanted) if want])

    def close(self) -> None:
        self.llm.close()


@pytest.fixture(scope="module")
def raw(starter_model: Path) -> Iterator[_Raw]:
    model = _Raw(starter_model)
    yield model
    model.close()


def test_batch_shape_noise(pairs: list[Pair], raw: _Raw) -> None:
    """The plain replies' tokens, evaluated one at a time and in batches of 2 to 13 (verification)
    and of the whole reply (a prompt's batch): how far the gap between the two best moves."""
    import numpy as np

    shifts: list[float] = []
    largest = 0.0
    flips = 0
    seen: set[tuple[int, ...]] = set()
    for p in pairs:
        reply = [t.token_id for t in p.plain_tokens][:48]
        if tuple(p.prompt) in seen or len(reply) < 8:
            continue
        seen.add(tuple(p.prompt))
        raw.prefill(p.prompt)
        start = len(p.prompt)
        single = [raw.rows([t], start + j)[0] for j, t in enumerate(reply)]
        for size in (2, 3, 4, 8, 13, len(reply)):
            raw.prefill(p.prompt)
            batched: list[Any] = []
            for j in range(0, len(reply), size):
                batched += raw.rows(reply[j : j + size], start + j)
            for a, b in zip(single, batched, strict=True):
                first, second = np.argsort(a)[-2:][::-1]
                shifts.append(abs(float((a[first] - a[second]) - (b[first] - b[second]))))
                largest = max(largest, float(np.max(np.abs(a - b))))
                flips += int(np.argmax(b)) != int(first)
    worst = max(shifts)
    print(
        f"\nbatch-shape noise over {len(shifts)} positions: logits up to {largest:.2f} apart; the top-2 gap moved "
        f"up to {worst:.3f} nats (p99 {float(np.quantile(shifts, 0.99)):.3f}); the best token changed {flips} times"
    )
    record(
        "batch-shape noise: top-2 gap shift",
        worst,
        unit="nats",
        at_most=NEAR_TIE_NATS,
        detail=f"{len(shifts)} positions, batches of 1-13 and the reply; logits up to {largest:.2f} apart",
    )


def _greedy(raw: _Raw, prompt: list[int], n: int, *, pad: bool, lookup: bool) -> tuple[list[int], float]:
    """A greedy reply decoded here: single steps (padded to two rows when ``pad``) and, with
    ``lookup``, prompt-lookup drafts of at most two tokens verified in one batch. Returns the
    tokens and the decode time."""
    import numpy as np

    from engine.inference.speculative import LookupDrafter

    raw.prefill(prompt)
    token = int(np.argmax(_logits(raw.llm, raw.lc, [-1])[0]))
    out = [token]
    drafter = LookupDrafter(prompt)
    pos = len(prompt)
    started = time.perf_counter()
    while len(out) < n:
        drafter.extend([token])
        draft = drafter.propose(2)[0][: n - len(out)] if lookup else []
        if draft:
            rows = raw.rows([token, *draft], pos)
            kept = 0
            for i, row in enumerate(rows):
                best = int(np.argmax(row))
                out.append(best)
                if i < len(draft) and best == draft[i] and len(out) < n:
                    kept += 1
                    continue
                break
            drafter.extend(draft[:kept])
            pos += 1 + kept
            token = out[-1]
            continue
        rows = raw.rows([token, token], pos, (True, False)) if pad else raw.rows([token], pos)
        token = int(np.argmax(rows[0]))
        out.append(token)
        pos += 1
    return out[:n], time.perf_counter() - started


def test_identity_at_what_cost(pairs: list[Pair], raw: _Raw) -> None:
    """Padding single steps to two rows and verifying at most two drafts: identity, and its cost."""
    prompts: list[list[int]] = []
    for p in pairs:
        if p.prompt not in prompts:
            prompts.append(p.prompt)
    n = 64
    same_padded = same_plain = 0
    plain_s: list[float] = []
    padded_s: list[float] = []
    for i, prompt in enumerate(prompts):
        if i % 2 == 0:  # alternate which side goes first
            plain, t_plain = _greedy(raw, prompt, n, pad=False, lookup=False)
            padded, t_padded = _greedy(raw, prompt, n, pad=True, lookup=False)
        else:
            padded, t_padded = _greedy(raw, prompt, n, pad=True, lookup=False)
            plain, t_plain = _greedy(raw, prompt, n, pad=False, lookup=False)
        plain_s.append(t_plain)
        padded_s.append(t_padded)
        same_plain += _greedy(raw, prompt, n, pad=False, lookup=True)[0] == plain
        same_padded += _greedy(raw, prompt, n, pad=True, lookup=True)[0] == padded
    cost = statistics.median(a / b for a, b in zip(plain_s, padded_s, strict=True))
    print(
        f"\nidentity: lookup (2 drafts at most) gives plain decoding's reply in {same_plain} of {len(prompts)} "
        f"prompts with single-token steps, {same_padded} of {len(prompts)} with steps padded to two rows; "
        f"padded plain decoding runs at {cost:.3f}x unpadded"
    )
    record(
        "identity by padded steps: plain decode vs unpadded",
        cost,
        detail=f"replies identical with lookup on and off: {same_padded} of {len(prompts)} padded, "
        f"{same_plain} of {len(prompts)} unpadded",
    )
    assert same_padded == len(prompts), "padded steps and 2-3-row batches did not give the same replies"


@pytest.fixture(scope="module")
def draft_model(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.convert.quantize import quantize_model

    out = tmp_path_factory.mktemp("draft") / "starter-q2_k.gguf"
    quantize_model(starter_model, out, "Q2_K", allow_requantize=True, threads=2)
    return out


@pytest.mark.parametrize("fixed", ["", "4"], ids=["policy", "always-4"])
def test_draft_model_ratio(starter_model: Path, draft_model: Path, fixed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``policy``: the draft-length policy decides (with this pair it should decline: the draft costs
    most of a target step); ``always-4``: four draft tokens per step whatever they cost, to show
    what drafting with this pair would do."""
    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", fixed)
    load = LoadParams(model_path=starter_model, n_ctx=2048, draft_model_path=draft_model)
    with ChatSession(load) as chat:
        chat.load()
        worker = chat.worker
        assert worker is not None
        plain = GenerationParams(max_tokens=MAX_TOKENS, temperature=0.0)
        fast = plain.model_copy(update={"speculative": "draft"})
        results: dict[str, list[WorkerResult]] = {"plain": [], "fast": []}
        for text in kinds()["ordinary chat"][:2]:
            list(chat.stream([], text, plain.model_copy(update={"max_tokens": 1})))
            tokens = list(chat.last_prompt)
            _run(worker, tokens, plain)
            plain_runs, fast_runs = _interleaved(
                lambda t=tokens: _run(worker, t, plain)[0], lambda t=tokens: _run(worker, t, fast)[0], 2
            )
            results["plain"] += plain_runs
            results["fast"] += fast_runs
    ratio = statistics.median(
        _decode_tps(f) / _decode_tps(p) for p, f in zip(results["plain"], results["fast"], strict=True)
    )
    drafted = sum(f.draft_tokens for f in results["fast"])
    accepted = sum(f.accepted_tokens for f in results["fast"])
    print(
        f"\nchat, draft model ({fixed or 'policy'}): ratio {ratio:.2f}, {accepted} of {drafted} drafts accepted; "
        f"draft {draft_model.stat().st_size / 2**20:.0f} MiB, target {starter_model.stat().st_size / 2**20:.0f} MiB"
    )
    if fixed:  # the draft is the same model requantized: it must mostly agree with the target
        assert drafted > 0 and accepted / drafted >= 0.6
        record("draft model vs plain (4 draft tokens)", ratio, detail=f"{accepted} of {drafted} drafts accepted")
    else:  # this draft costs nearly a target step: the policy must decline to draft
        assert drafted == 0
        record("draft model vs plain (the policy declines)", ratio, detail="0 drafts: the draft costs most of a step")
