"""The context budget, with a fake tokenizer: a token per word, 3 per header, 1 BOS, 2 for the reply."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from engine.errors import ContextOverflow, EngineError
from engine.inference.context import (
    BREAKDOWN_KEYS,
    ContextPlan,
    Message,
    documents_band,
    effective_reserve,
    fit_documents,
    plan_context,
)

HEADER, BOS, REPLY_HEADER = 3, 1, 2


def words(text: str) -> int:
    return len(text.split())


class FakeTokenizer:
    """Counts like a chat template would: BOS + per-message header + words + the reply header."""

    def __init__(self) -> None:
        self.calls = 0

    def count_tokens(self, messages: Sequence[Message]) -> int:
        self.calls += 1
        return BOS + sum(HEADER + words(m.content) for m in messages) + REPLY_HEADER


def turn(i: int, size: int = 10) -> list[Message]:
    return [
        Message("user", " ".join([f"q{i}"] * size)),
        Message("assistant", " ".join([f"a{i}"] * size)),
    ]


def history_of(n: int, size: int = 10) -> list[Message]:
    return [m for i in range(n) for m in turn(i, size)]


class Block:
    """One passage whose block is ``text``: kept whole or left out by the documents band."""

    def __init__(self, text: str) -> None:
        self.block = text

    @property
    def count(self) -> int:
        return 1

    def text(self, kept: int) -> str:
        return self.block if kept else ""


def plan(history: Sequence[Message], *, n_ctx: int, reserve: int = 0, **kwargs: object) -> ContextPlan:
    tok = kwargs.pop("tok", None) or FakeTokenizer()
    assert isinstance(tok, FakeTokenizer)
    args: dict[str, object] = {"system": "be kind", "documents": None, "user": "hello there", **kwargs}
    return plan_context(
        history=history,
        n_ctx=n_ctx,
        reply_reserve=reserve,
        count_tokens=tok.count_tokens,
        count_text=words,
        **args,  # type: ignore[arg-type]
    )


def check_breakdown(result: ContextPlan, n_ctx: int) -> None:
    assert tuple(result.breakdown) == BREAKDOWN_KEYS
    assert sum(result.breakdown.values()) == n_ctx
    parts = sum(result.breakdown[k] for k in ("system", "documents", "history", "current"))
    assert parts == result.prompt_tokens
    assert all(v >= 0 for v in result.breakdown.values())


def test_everything_fits_and_the_breakdown_is_exact() -> None:
    history = history_of(2)
    result = plan(history, n_ctx=1000, reserve=100, documents=Block("doc one two three"))
    assert result.evicted == 0
    assert result.messages[0] == Message("system", "be kind\n\ndoc one two three")
    assert result.messages[1:-1] == history
    assert result.messages[-1] == Message("user", "hello there")
    # BOS + system(3+6) + 4 history messages (3+10 each) + user (3+2) + reply header
    assert result.prompt_tokens == 1 + 9 + 4 * 13 + 5 + 2
    assert result.breakdown == {
        "system": 2,
        "documents": 4,
        "tools": 0,
        "history": 52,
        "tool_results": 0,
        "media": 0,
        "current": result.prompt_tokens - 2 - 4 - 52,
        "reserve": 100,
        "free": 1000 - result.prompt_tokens - 100,
    }
    check_breakdown(result, 1000)


def test_no_system_and_no_documents_means_no_system_message() -> None:
    result = plan([], n_ctx=100, system=None)
    assert result.messages == [Message("user", "hello there")]
    assert result.breakdown["system"] == 0
    assert result.breakdown["history"] == 0
    check_breakdown(result, 100)


def test_documents_without_system_prompt_form_the_system_message() -> None:
    result = plan([], n_ctx=100, system=None, documents=Block("some passage"))
    assert result.messages[0] == Message("system", "some passage")
    assert result.breakdown["documents"] == 2
    check_breakdown(result, 100)


def test_rolling_drops_the_oldest_whole_turns_and_reports_them() -> None:
    history = history_of(10)  # each turn costs 26 tokens
    # fixed part: BOS 1 + system 5 + user 5 + reply 2 = 13; budget 150 - 20 = 130 -> 4 turns fit
    result = plan(history, n_ctx=150, reserve=20)
    assert result.evicted == 12
    assert result.messages[1:-1] == history[12:]
    assert result.prompt_tokens == 13 + 4 * 26
    assert result.prompt_tokens <= 150 - 20
    check_breakdown(result, 150)


def test_rolling_keeps_as_much_history_as_fits() -> None:
    rng = random.Random(7)
    for _ in range(200):
        history = [
            Message("user" if i % 2 == 0 else "assistant", " ".join(["w"] * rng.randint(0, 30)))
            for i in range(rng.randint(0, 30))
        ]
        n_ctx = rng.randint(40, 600)
        reserve = rng.randint(0, 80)
        try:
            result = plan(history, n_ctx=n_ctx, reserve=reserve)
        except ContextOverflow:
            assert n_ctx - effective_reserve(n_ctx, reserve) < 1 + 5 + 5 + 2
            continue
        budget = n_ctx - effective_reserve(n_ctx, reserve)
        assert result.prompt_tokens <= budget
        kept = result.messages[1:-1]
        assert kept == history[result.evicted :]
        assert not kept or kept[0].role == "user"
        if result.evicted:
            # Keeping the newest dropped turn as well would not have fitted.
            previous_start = max(i for i in range(result.evicted) if history[i].role == "user")
            more = [result.messages[0], *history[previous_start:], result.messages[-1]]
            assert FakeTokenizer().count_tokens(more) > budget
        check_breakdown(result, n_ctx)


def test_count_tokens_is_called_a_logarithmic_number_of_times() -> None:
    tok = FakeTokenizer()
    result = plan(history_of(1000), n_ctx=2000, reserve=100, tok=tok)
    assert result.evicted > 0
    assert tok.calls <= 2 + math.ceil(math.log2(1000)) + 1


def test_a_turn_with_several_replies_is_dropped_as_a_whole() -> None:
    history = [
        Message("assistant", "greeting before any question"),
        Message("user", "one two"),
        Message("assistant", "three four"),
        Message("assistant", "five six"),
        Message("user", "seven"),
        Message("assistant", "eight"),
    ]
    # fixed 13, last turn 3+1+3+1 = 8, middle turn 5+5+5 = 15, first 3+4 = 7; budget 13+8+15 = 36
    result = plan(history, n_ctx=36)
    assert result.evicted == 1
    result = plan(history, n_ctx=35)
    assert result.evicted == 4
    assert result.messages[1:-1] == history[4:]


def test_refuse_policy_raises_with_the_numbers() -> None:
    with pytest.raises(ContextOverflow) as caught:
        plan(history_of(10), n_ctx=150, reserve=20, policy="refuse")
    assert str(caught.value) == (
        "conversation needs 273 tokens but the context window is 150 (reserve 20): start a new chat, "
        "raise the context length or switch the overflow policy to rolling"
    )


def test_refuse_policy_is_fine_when_everything_fits() -> None:
    result = plan(history_of(2), n_ctx=500, policy="refuse")
    assert result.evicted == 0


def test_documents_past_the_band_are_left_out_and_counted_not_refused() -> None:
    result = plan([], n_ctx=128, reserve=32, documents=Block(" ".join(["passage"] * 200)))
    assert (result.documents_kept, result.documents_dropped) == (0, 1)
    assert result.messages[0] == Message("system", "be kind") and result.breakdown["documents"] == 0
    check_breakdown(result, 128)


def test_a_tiny_windows_band_larger_than_its_budget_is_refused_with_the_numbers() -> None:
    # A 64-token window: the band is its minimum, 64 tokens, but only 48 are left past the reserve.
    with pytest.raises(ContextOverflow, match=r"documents block needs 60 tokens but the context window is 64"):
        plan([], n_ctx=64, reserve=16, documents=Block(" ".join(["passage"] * 60)))


def test_pinned_parts_that_cannot_fit_are_refused_even_when_rolling() -> None:
    with pytest.raises(ContextOverflow, match=r"need 67 tokens but the context window is 64 \(reserve 16\)"):
        plan(history_of(3), n_ctx=64, reserve=100, user=" ".join(["w"] * 56))


def test_tiny_window_caps_the_reserve_at_a_quarter() -> None:
    result = plan([], n_ctx=40, reserve=512)
    assert result.breakdown["reserve"] == 10
    assert result.reserve == 10
    check_breakdown(result, 40)


def test_breakdown_stays_exact_when_pieces_tokenize_longer_than_the_prompt() -> None:
    # count_text overestimates (e.g. merges across boundaries in the joined prompt).
    tok = FakeTokenizer()
    result = plan_context(
        system="a b c",
        documents=Block("d e f g"),
        history=history_of(1),
        user="h",
        n_ctx=200,
        reply_reserve=10,
        count_tokens=tok.count_tokens,
        count_text=lambda text: words(text) + 20,
    )
    check_breakdown(result, 200)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_ctx": 0}, "context window must be positive"),
        ({"n_ctx": 100, "reserve": -1}, "reply reserve must not be negative"),
        ({"n_ctx": 100, "policy": "truncate"}, "unknown overflow policy"),
    ],
)
def test_bad_arguments_are_typed_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        plan([], **kwargs)  # type: ignore[arg-type]


def test_plan_with_a_real_template_renderer_fits_and_adds_up() -> None:
    from engine.inference.templates import fallback_template

    template = fallback_template("gemma", "test", "<bos>", "<eos>")

    def count_rendered(messages: Sequence[Message]) -> int:
        # A whitespace "tokenizer" over the real rendered prompt (headers and BOS included).
        rendered = template.render([{"role": m.role, "content": m.content} for m in messages])
        return len(rendered.replace("<", " <").replace(">", "> ").split())

    history = history_of(30)
    result = plan_context(
        system="You are terse.",
        documents=Block("[1] notes.md: the sky is blue"),
        history=history,
        user="what colour is the sky?",
        n_ctx=300,
        reply_reserve=64,
        count_tokens=count_rendered,
        count_text=lambda text: len(text.split()),
    )
    assert 0 < result.evicted < len(history)
    assert result.evicted % 2 == 0
    assert result.prompt_tokens == count_rendered(result.messages) <= 300 - 64
    check_breakdown(result, 300)


Counters = tuple[Callable[[Sequence[Message]], int], Callable[[str], int]]


@pytest.fixture(scope="module")
def starter_counters(starter_model: Path) -> Iterator[Counters]:
    """``count_tokens`` and ``count_text`` as the session has them: the starter model's real
    template and vocabulary (llama.cpp loads only the vocabulary)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from engine.inference.templates import select_template

    model = llama_cpp.Llama(str(starter_model), vocab_only=True, verbose=False)
    template = select_template(None, "gemma3", "<bos>", "<eos>")

    def count_tokens(messages: Sequence[Message]) -> int:
        prompt = template.render([{"role": m.role, "content": m.content} for m in messages])
        return len(model.tokenize(prompt.encode(), add_bos=False, special=True))

    def count_text(text: str) -> int:
        return len(model.tokenize(text.encode(), add_bos=False, special=False))

    try:
        yield count_tokens, count_text
    finally:
        model.close()


@pytest.mark.model
def test_plan_with_the_starter_models_tokenizer_at_n_ctx_256(starter_counters: Counters) -> None:
    count_tokens, count_text = starter_counters
    history = [
        Message("user" if i % 2 == 0 else "assistant", f"Turn {i}: tell me something about the number {i}.")
        for i in range(40)
    ]
    result = plan_context(
        system="You are a helpful assistant.",
        documents=None,
        history=history,
        user="And what about the number forty?",
        n_ctx=256,
        reply_reserve=64,
        count_tokens=count_tokens,
        count_text=count_text,
    )
    assert 0 < result.evicted < len(history)
    assert result.prompt_tokens == count_tokens(result.messages) <= 256 - 64
    check_breakdown(result, 256)
    with pytest.raises(ContextOverflow, match="switch the overflow policy to rolling"):
        plan_context(
            system=None,
            documents=None,
            history=history,
            user="x",
            n_ctx=256,
            reply_reserve=64,
            count_tokens=count_tokens,
            count_text=count_text,
            policy="refuse",
        )


# ----------------------------------------------------------------------------- bounded work


class MeasuringTokenizer(FakeTokenizer):
    """A FakeTokenizer that records how much text each count was given (what a real tokenizer pays for)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.seen: list[set[str]] = []

    def count_tokens(self, messages: Sequence[Message]) -> int:
        self.sizes.append(sum(len(m.content) for m in messages))
        self.seen.append({m.content for m in messages})
        return super().count_tokens(messages)


def fewest_to_drop_by_scan(history: Sequence[Message], budget: int) -> int:
    """The reference answer: how many oldest messages rolling must drop, by trying every turn start."""
    starts = [i for i, m in enumerate(history) if m.role == "user" or i == 0]
    fixed = FakeTokenizer().count_tokens([Message("system", "be kind"), Message("user", "hello there")])
    answer, tokens = len(history), fixed  # the tokenizer adds up, so grow from the newest turn
    for start in reversed(starts):
        tokens += sum(HEADER + words(m.content) for m in history[start:answer])
        if tokens > budget:
            return answer
        answer = start
    return answer


def test_long_history_is_counted_in_window_sized_probes() -> None:
    """Many tiny messages: the text counted follows the window, not the history (bounds: the same
    probes for 1,000 and 100,000 turns, none over 3 windows' worth of text, O(log n) of them)."""
    n_ctx = 256
    counted = []
    for n_turns in (1_000, 100_000):
        tok = MeasuringTokenizer()
        history = [Message("user" if i % 2 == 0 else "assistant", "a") for i in range(2 * n_turns)]
        result = plan(history, n_ctx=n_ctx, tok=tok)
        assert result.evicted == fewest_to_drop_by_scan(history, n_ctx)
        assert result.prompt_tokens <= n_ctx
        assert max(tok.sizes) <= 3 * 8 * n_ctx  # characters of message text in any one count
        assert tok.calls <= 2 + math.ceil(math.log2(2 * n_turns)) + 1
        counted.append(tok.sizes)
    assert counted[0] == counted[1]


def test_a_huge_old_turn_is_counted_once() -> None:
    huge = " ".join(["w"] * 200_000)
    for history in (
        [Message("user", huge), Message("assistant", "ok"), *history_of(200)],  # oldest
        [*history_of(200), Message("user", huge), Message("assistant", "ok")],  # newest
        [*history_of(200), Message("user", huge), *history_of(3)],  # just past what fits
    ):
        tok = MeasuringTokenizer()
        result = plan(history, n_ctx=400, tok=tok)
        assert result.evicted == fewest_to_drop_by_scan(history, 400)
        assert sum(huge in seen for seen in tok.seen) <= 1


def test_sparse_text_grows_the_probes_until_they_stop_fitting() -> None:
    """Text with many characters per token (the first probe fits although more history waits)."""
    rng = random.Random(11)
    for _ in range(200):
        history = [
            Message(
                "user" if rng.random() < 0.6 else "assistant",
                " ".join("x" * rng.randint(1, 300) for _ in range(rng.randint(0, 12))),
            )
            for _ in range(rng.randint(1, 120))
        ]
        n_ctx = rng.randint(30, 900)
        try:
            result = plan(history, n_ctx=n_ctx)
        except ContextOverflow:
            continue
        assert result.evicted == fewest_to_drop_by_scan(history, n_ctx)
        check_breakdown(result, n_ctx)


@pytest.mark.model
def test_planning_8001_tiny_messages_on_the_starter_model_is_cheap(starter_counters: Counters) -> None:
    """The 8,001 one-letter messages of the issue at n_ctx 256: the planning renders and tokenizes
    only about what fits, never the whole history. Counted as work (messages rendered through the
    real template, characters tokenized with the real vocabulary), not as time: this machine is
    noisy, and a time bound in a unit test fails when it is loaded. Before the fix the planning
    rendered the whole history at every step (over 8,000 messages a call)."""
    count_tokens, count_text = starter_counters
    history = [Message("user", "a") for _ in range(8000)]
    rendered: list[int] = []
    tokenized: list[int] = []

    def counting_tokens(messages: Sequence[Message]) -> int:
        rendered.append(len(messages))
        return count_tokens(messages)

    def counting_text(text: str) -> int:
        tokenized.append(len(text))
        return count_text(text)

    result = plan_context(
        system=None,
        documents=None,
        history=history,
        user="a",
        n_ctx=256,
        reply_reserve=4,
        count_tokens=counting_tokens,
        count_text=counting_text,
    )
    kept = len(result.messages)
    assert 0 < kept - 1 < 100
    assert result.prompt_tokens == count_tokens(result.messages) <= 256 - 4
    # Every render holds at most a few times what fits, and there are few of them.
    assert max(rendered) <= 4 * kept, (max(rendered), kept)
    assert sum(rendered) <= 40 * kept, (sum(rendered), len(rendered), kept)
    assert sum(tokenized) <= 40 * kept * 20, sum(tokenized)


class Ranked:
    """Passages of ``words`` words each, best first, as ``rag.citations.CitedPassages`` gives them."""

    def __init__(self, *words: int) -> None:
        self.entries = [" ".join([f"p{n}"] * size) for n, size in enumerate(words, start=1)]
        self.rendered: list[int] = []

    @property
    def count(self) -> int:
        return len(self.entries)

    def text(self, kept: int) -> str:
        self.rendered.append(kept)
        return "HEADER " + " ".join(self.entries[:kept]) if kept else ""


def _words(text: str) -> int:
    return len(text.split())


def test_passages_that_fit_the_documents_band_are_all_kept_after_one_count() -> None:
    ranked = Ranked(10, 10, 10)
    fit = fit_documents(ranked, 1000, _words)  # a band of 350 words
    assert (fit.kept, fit.dropped, fit.tokens) == (3, 0, 31)
    assert fit.text == ranked.text(3)
    assert ranked.rendered[:-1] == [3, 3]  # counted once, rendered once more to hand it over


def test_passages_past_the_band_are_dropped_from_the_lowest_ranked_not_refused() -> None:
    ranked = Ranked(100, 100, 100, 100, 100, 100)
    band = documents_band(1000)
    fit = fit_documents(ranked, 1000, _words)
    assert band == 350 and (fit.kept, fit.dropped) == (3, 3)
    assert fit.text is not None and "p3" in fit.text and "p4" not in fit.text
    assert fit.tokens == _words(fit.text) <= band
    # The plan fits them the same way (the band is inside the budget) and says what it kept.
    plan = plan_context(
        system="Be brief.",
        documents=ranked,
        history=[],
        user="hi",
        n_ctx=1000,
        reply_reserve=100,
        count_tokens=lambda ms: sum(_words(m.content) + 2 for m in ms),
        count_text=_words,
    )
    assert plan.breakdown["documents"] == fit.tokens
    assert (plan.documents_kept, plan.documents_dropped) == (3, 3)
    assert plan.messages[0].content == f"Be brief.\n\n{fit.text}"


def test_when_not_even_the_best_passage_fits_none_is_kept_and_all_are_reported() -> None:
    fit = fit_documents(Ranked(500, 10), 1000, _words)
    assert (fit.text, fit.kept, fit.dropped, fit.tokens) == (None, 0, 2, 0)
    assert fit_documents(Ranked(), 1000, _words) == fit_documents(Ranked(), 64, _words)
    assert documents_band(10) == 64  # a tiny window still gets a small band
