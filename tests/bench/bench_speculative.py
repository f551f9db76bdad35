"""Speculative decoding on the starter model: decode tokens/s with and without, interleaved, ratios.

Run: ``pytest tests/bench/bench_speculative.py -s``. Three measurements, greedy decoding:

* quoting a ~1,000-token passage (a document question): prompt lookup vs plain, budget >= 1.3x;
* ordinary chat through the chat template: prompt lookup vs plain, budget >= 0.97x (this decides
  the default: lookup unless ordinary chat gets slower);
* a draft model: the starter (Q4_K_M) as target, a smaller quantization of it as draft, built here
  with the project's quantizer (requantized). Reported, not budgeted: a draft pays only when it is
  several times cheaper than its target; this pair shares a 262k-token embedding and output layer,
  which is most of the starter's work per token.

Every pair must also give the same text (greedy output is the same with speculation on and off).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.inference.events import Stats, Token
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams, WorkerResult
from engine.inference.session import ChatSession
from tests.bench.results import record

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROUNDS = 4
_PASSAGE_FILE = Path(__file__).resolve().parents[2] / "resources" / "perplexity.txt"
CHAT_PROMPTS = (
    "Tell me about the ocean.",
    "Write a short poem about autumn leaves.",
    "What does a CPU do?",
    "Give me three tips for learning to cook.",
)


def _passage(worker: InferenceWorker, tokens: int = 1000) -> str:
    text = _PASSAGE_FILE.read_text(encoding="utf-8").strip()
    words = text.split()
    out: list[str] = []
    i = 0
    while len(worker.tokenize(" ".join(out))) < tokens:
        out.extend(words[i : i + 40])
        i += 40
        if i >= len(words):  # the file is ~750 tokens: go on with its paragraphs reversed
            words = list(reversed(text.split("\n\n")))
            words = " ".join(words).split()
            i = 0
    return " ".join(out)


def _run(worker: InferenceWorker, tokens: list[int], params: GenerationParams) -> WorkerResult:
    gen = worker.generate(tokens, params)
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _tokens(worker: InferenceWorker, tokens: list[int], params: GenerationParams) -> list[Token]:
    out: list[Token] = []
    gen = worker.generate(tokens, params)
    while True:
        try:
            event = next(gen)
        except StopIteration:
            return out
        if isinstance(event, Token):
            out.append(event)


def _decode_tps(result: WorkerResult) -> float:
    return max(result.completion_tokens - 1, 0) / (result.decode_ms / 1000)


def _pairs(run_plain, run_fast, rounds: int = ROUNDS) -> Iterator[tuple[WorkerResult, WorkerResult]]:  # type: ignore[no-untyped-def]
    for i in range(rounds):
        if i % 2:  # alternate which side goes first
            fast = run_fast()
            plain = run_plain()
        else:
            plain = run_plain()
            fast = run_fast()
        yield plain, fast


def _report(name: str, pairs: list[tuple[WorkerResult, WorkerResult]]) -> float:
    plain = [_decode_tps(p) for p, _ in pairs]
    fast = [_decode_tps(f) for _, f in pairs]
    ratio = statistics.median(f / p for p, f in zip(plain, fast, strict=True))
    drafted = sum(f.draft_tokens for _, f in pairs)
    accepted = sum(f.accepted_tokens for _, f in pairs)
    rate = accepted / drafted if drafted else 0.0
    print(
        f"{name:28} plain {statistics.median(plain):7.1f} tok/s   speculative {statistics.median(fast):7.1f} tok/s"
        f"   ratio {ratio:5.2f}   drafted {drafted}, accepted {accepted} ({rate:.0%})"
    )
    same = sum(f.text == p.text for p, f in pairs)
    print(f"{'':28} the same greedy reply in {same} of {len(pairs)} pairs")
    return ratio


def _check_divergence(name: str, pairs: list[tuple[WorkerResult, WorkerResult]], rerun) -> None:  # type: ignore[no-untyped-def]
    """Where a speculative reply differs from the plain one, it must be at a near tie.

    llama.cpp's arithmetic depends on the batch's shape on this CPU (a 10-token batch and ten
    one-token steps give logits up to ~1.0 apart), so a verified batch can flip a near tie, as
    a reused prompt prefix already can. A logic error would diverge at a confident token.
    ``rerun(speculative) -> list[Token]`` repeats a pair's run with logprobs (which changes nothing
    in what is sampled).
    """
    for index, (plain, fast) in enumerate(pairs):
        if plain.text == fast.text:
            continue
        a, b = rerun(index, "off"), rerun(index, "fast")
        i = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x.token_id != y.token_id)
        top = a[i].top_logprobs
        gap = top[0][1] - top[1][1]
        print(
            f"{'':28} pair {index}: differs at token {i}, where the two best were {gap:.3f} apart "
            f"({top[0][0]!r} vs {top[1][0]!r})"
        )
        assert gap < 1.5, f"{name}: a speculative reply left the plain one at a confident token"


@pytest.fixture(scope="module")
def draft_model(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.convert.quantize import quantize_model

    out = tmp_path_factory.mktemp("draft") / "starter-q2_k.gguf"
    quantize_model(starter_model, out, "Q2_K", allow_requantize=True, threads=2)
    return out


def test_lookup_on_a_quoting_answer(starter_model: Path) -> None:
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=4096, n_threads=2)) as worker:
        worker.start()
        passage = _passage(worker)
        first = passage.split(". ")[0] + "."
        prompt = f"Document:\n{passage}\n\nThe document above, copied out word for word:\n\n{first}"
        tokens = worker.tokenize(prompt, add_bos=True)
        print(f"\nquote: the passage is {len(worker.tokenize(passage))} tokens, the prompt {len(tokens)}")
        plain = GenerationParams(max_tokens=256, temperature=0.0)
        fast = plain.model_copy(update={"speculative": "lookup"})
        _run(worker, tokens, plain)  # prefill once; every run after reuses the cached prompt
        pairs = list(_pairs(lambda: _run(worker, tokens, plain), lambda: _run(worker, tokens, fast)))
        ratio = _report("quote, lookup vs plain", pairs)
        record("lookup vs plain: quoting answer", ratio, at_least=1.3, detail=_detail(pairs))
        _check_divergence(
            "quote",
            pairs,
            lambda i, side: _tokens(
                worker, tokens, (fast if side == "fast" else plain).model_copy(update={"logprobs": 2})
            ),
        )
    assert ratio >= 1.3


def _detail(pairs: list[tuple[WorkerResult, WorkerResult]]) -> str:
    drafted = sum(fast.draft_tokens for _plain, fast in pairs)
    accepted = sum(fast.accepted_tokens for _plain, fast in pairs)
    return f"{accepted} of {drafted} drafted tokens accepted"


def _chat_tokens(session: ChatSession, prompt: str, params: GenerationParams) -> list[Token]:
    return [e for e in session.stream([], prompt, params.model_copy(update={"logprobs": 2})) if isinstance(e, Token)]


def _chat(session: ChatSession, prompt: str, params: GenerationParams) -> WorkerResult:
    text = ""
    stats: Stats | None = None
    for event in session.stream([], prompt, params):
        if isinstance(event, Token):
            text += event.text
        elif isinstance(event, Stats):
            stats = event
    assert stats is not None
    return WorkerResult(
        "stop",
        text,
        stats.prompt_tokens,
        stats.cached_tokens,
        stats.completion_tokens,
        stats.context_used,
        stats.ttft_ms,
        stats.prefill_ms,
        stats.decode_ms,
        stats.draft_tokens,
        stats.accepted_tokens,
    )


def test_lookup_on_ordinary_chat(starter_model: Path) -> None:
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=2048, n_threads=2)) as session:
        session.load()
        plain = GenerationParams(max_tokens=128, temperature=0.0)
        fast = plain.model_copy(update={"speculative": "lookup"})
        pairs: list[tuple[WorkerResult, WorkerResult]] = []
        prompts: list[str] = []
        for prompt in CHAT_PROMPTS:
            _chat(session, prompt, plain)  # every measured run then reuses the cached prompt alike
            pairs.extend(_pairs(lambda p=prompt: _chat(session, p, plain), lambda p=prompt: _chat(session, p, fast), 2))
            prompts += [prompt, prompt]
        ratio = _report("ordinary chat, lookup vs plain", pairs)
        record("lookup vs plain: ordinary chat", ratio, at_least=0.97, detail=_detail(pairs))
        _check_divergence(
            "ordinary chat", pairs, lambda i, side: _chat_tokens(session, prompts[i], fast if side == "fast" else plain)
        )
    assert ratio >= 0.97


@pytest.mark.parametrize("fixed", ["", "4"], ids=["policy", "always-4"])
def test_draft_model_ratio(starter_model: Path, draft_model: Path, fixed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``policy``: the draft-length policy decides (with this pair it should decline: the draft costs
    most of a target step); ``always-4``: four draft tokens per step whatever they cost, to show
    what drafting with this pair would do."""
    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", fixed)
    load = LoadParams(model_path=starter_model, n_ctx=2048, n_threads=2, draft_model_path=draft_model)
    with ChatSession(load) as session:
        session.load()
        plain = GenerationParams(max_tokens=128, temperature=0.0)
        fast = plain.model_copy(update={"speculative": "draft"})
        pairs: list[tuple[WorkerResult, WorkerResult]] = []
        prompts: list[str] = []
        for prompt in CHAT_PROMPTS[:2]:
            _chat(session, prompt, plain)
            pairs.extend(_pairs(lambda p=prompt: _chat(session, p, plain), lambda p=prompt: _chat(session, p, fast), 2))
            prompts += [prompt, prompt]
        ratio = _report(f"chat, draft model ({fixed or 'policy'})", pairs)
        _check_divergence(
            "draft model", pairs, lambda i, side: _chat_tokens(session, prompts[i], fast if side == "fast" else plain)
        )
    print(
        f"{'':28} draft {draft_model.name}: {draft_model.stat().st_size / 2**20:.0f} MiB, "
        f"target {starter_model.stat().st_size / 2**20:.0f} MiB"
    )
    record(f"draft model vs plain ({fixed or 'policy'} draft length)", ratio, detail=_detail(pairs))
    drafted = sum(fast.draft_tokens for _plain, fast in pairs)
    accepted = sum(fast.accepted_tokens for _plain, fast in pairs)
    if fixed:  # the draft is the same model requantized: it must mostly agree with the target
        assert drafted > 0 and accepted / drafted >= 0.6
    else:  # this draft costs nearly a target step: the policy must decline to draft
        assert drafted == 0
