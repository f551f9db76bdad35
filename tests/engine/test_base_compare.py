"""A reply compared with the base model (engine/inference/base_compare.py): the first divergence and
its line, then on the real starter model with a LoRA adapter: at scale 0 the two runs are the same,
at scale 1 they part where plain greedy replies with and without the adapter part, the base's
probability of the adapter's token there is the model's own, Stop lands, and the chat's adapters and
KV cache are put back (the next turn reuses its prompt and replies as before).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from lora_fixtures import write_gguf_lora

from engine.errors import Cancelled
from engine.inference.adapters import LoraAdapter
from engine.inference.base_compare import BaseComparison, ComparedToken, first_divergence
from engine.inference.events import Finished, PrefillProgress, Token
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession

QUESTION = "Write one sentence about the sea."
GREEDY = GenerationParams(max_tokens=24, temperature=0.0, logprobs=1)


# --------------------------------------------------------------------------- the divergence and its line


def _tok(text: str, p: float) -> ComparedToken:
    return ComparedToken(len(text), text, math.log(p))


def test_the_first_divergence_is_the_first_differing_token_or_where_one_stream_ends() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([], []) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([9], [1]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([1, 2, 3], [1, 2]) == 2


def test_the_line_says_where_the_adapter_chose_otherwise_and_how_far_it_moved_the_probability() -> None:
    the, cat, dog = _tok(" the", 0.9), _tok(" cat", 0.71), _tok(" dog", 0.64)
    parted = BaseComparison(
        "a.gguf:1", (the, cat), (the, dog), "length", "length", 1, (math.log(0.88), math.log(0.08)), 7
    )
    assert parted.summary() == (
        "Same as base for 1 token; at token 2 the adapter chose ' cat' (p=0.71, base p=0.08); "
        "base chose ' dog' (p=0.64)"
    )
    assert parted.moved(0) == pytest.approx((0.9, 0.88))
    assert parted.moved(1) == pytest.approx((0.71, 0.08))
    assert parted.same == 1
    same = BaseComparison("a.gguf:0.5", (the, cat), (the, cat), "stop", "stop", None, (0.0, 0.0), 7)
    assert same.summary() == "Same as base for all 2 tokens: the adapter did not change this greedy reply"
    unlikely = BaseComparison("a.gguf:1", (cat,), (dog,), "stop", "stop", 0, (math.log(0.0004),), 7)
    assert unlikely.summary() == (
        "Different from the first token; at token 1 the adapter chose ' cat' (p=0.71, base p=4.0e-04); "
        "base chose ' dog' (p=0.64)"
    )
    ended = BaseComparison("a.gguf:1", (the,), (the, dog), "stop", "length", 1, (0.0,), 7)
    assert ended.summary() == (
        "Same as base for 1 token; then the adapter's reply ended, where base went on with ' dog' (p=0.64)"
    )
    base_ended = BaseComparison("a.gguf:1", (the, cat), (the,), "length", "stop", 1, (0.0, None), 7)
    assert base_ended.summary() == (
        "Same as base for 1 token; at token 2 the adapter chose ' cat' (p=0.71); base's reply ended there"
    )


# --------------------------------------------------------------------------- on the real starter model


@pytest.fixture(scope="module")
def starter_lora(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf_lora(tmp_path_factory.mktemp("lora") / "starter-lora.gguf", starter_model, strength=1.0)


@pytest.fixture
def session(starter_model: Path) -> Iterator[ChatSession]:
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=1024, n_threads=2), reply_reserve=64) as s:
        s.load()
        yield s


def _greedy(session: ChatSession, params: GenerationParams = GREEDY) -> tuple[list[Token], Finished]:
    events = list(session.stream([], QUESTION, params))
    finished = events[-1]
    assert isinstance(finished, Finished)
    return [e for e in events if isinstance(e, Token) and e.token_id >= 0], finished


@pytest.mark.model
def test_at_scale_zero_the_adapter_changes_nothing(session: ChatSession, starter_lora: Path) -> None:
    session.set_adapters([LoraAdapter(starter_lora, 0.0)])
    plain, _ = _greedy(session)
    comparison = session.compare_base([], QUESTION, GREEDY)
    assert comparison.divergence is None
    assert [t.token_id for t in comparison.adapted] == [t.token_id for t in comparison.base]
    assert [t.token_id for t in comparison.adapted] == [t.token_id for t in plain]
    assert comparison.adapters == ""  # nothing above scale 0
    assert comparison.summary().startswith(f"Same as base for all {len(plain)} tokens")


@pytest.mark.model
def test_at_scale_one_the_replies_part_where_plain_greedy_replies_part(
    session: ChatSession, starter_lora: Path
) -> None:
    base, _ = _greedy(session)
    session.set_adapters([LoraAdapter(starter_lora, 1.0)])
    adapted, _ = _greedy(session)
    a_ids, b_ids = [t.token_id for t in adapted], [t.token_id for t in base]
    expected = next((i for i in range(min(len(a_ids), len(b_ids))) if a_ids[i] != b_ids[i]), None)
    assert expected is not None, "the test adapter must change the starter's greedy reply"

    comparison = session.compare_base([], QUESTION, GREEDY)
    assert [t.token_id for t in comparison.adapted] == a_ids
    assert [t.token_id for t in comparison.base] == b_ids
    assert comparison.divergence == expected
    assert comparison.adapters == "starter-lora.gguf:1"
    for mine, plain in zip(comparison.adapted, adapted, strict=True):
        assert plain.logprob is not None and mine.logprob == pytest.approx(plain.logprob, abs=1e-3)
    # Before the divergence both runs chose the same token: its base probability is the base run's.
    for i in range(expected):
        assert comparison.base_logprobs[i] == pytest.approx(comparison.base[i].logprob)
        assert base[i].logprob is not None and comparison.base_logprobs[i] == pytest.approx(base[i].logprob, abs=1e-3)
    # At the divergence: the base's probability of the adapter's token, checked against the base's
    # own distribution there: a raw completion of the same prompt, 20 alternatives per token (the
    # prompt read from an empty cache and the tokens one by one, as the comparison reads them).
    at = comparison.base_logprobs[expected]
    assert at is not None and at < comparison.base[expected].logprob  # base preferred its own token
    prompt = session.prompt_view().token_ids  # the last turn's prompt: the same question
    session.set_adapters([])  # the base model (the next call empties the cache)
    wide = GREEDY.model_copy(update={"max_tokens": expected + 1, "logprobs": 20})
    raw = [e for e in session.complete(prompt, wide) if isinstance(e, Token) and e.token_id >= 0]
    assert [t.token_id for t in raw] == b_ids[: expected + 1]
    tops = dict(raw[expected].top_logprobs)
    piece = comparison.adapted[expected].text
    if piece in tops:
        assert at == pytest.approx(tops[piece], abs=1e-3)
    else:
        assert at < min(tops.values())
    line = comparison.summary()
    assert line.startswith(f"Same as base for {expected} token") or (expected == 0 and line.startswith("Different"))
    assert f"at token {expected + 1} the adapter chose {piece!r}" in line


@pytest.mark.model
def test_the_chat_keeps_its_adapters_and_its_cache_after_a_comparison(session: ChatSession, starter_lora: Path) -> None:
    session.set_adapters([LoraAdapter(starter_lora, 1.0)])
    _greedy(session)  # the prompt read whole; the replies after it read its last token alone
    before, first = _greedy(session)
    view = session.prompt_view().token_ids
    comparison = session.compare_base([], QUESTION, GREEDY)
    assert comparison.restored and comparison.restore_ms >= 0
    assert session.prompt_view().token_ids == view  # the last prompt is still the last turn's
    after, again = _greedy(session)
    assert [t.token_id for t in after] == [t.token_id for t in before]
    assert again.stats.adapters == "starter-lora.gguf:1"
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1  # the chat's cache, put back
    assert again.stats.recomputed_tokens == 0
    assert first.stats.prompt_tokens == comparison.prompt_tokens


@pytest.mark.model
def test_stop_ends_a_comparison_and_the_chat_goes_on_as_before(session: ChatSession, starter_lora: Path) -> None:
    session.set_adapters([LoraAdapter(starter_lora, 1.0)])
    _greedy(session)
    before, _ = _greedy(session)
    cancel = threading.Event()
    starts: list[PrefillProgress] = []

    def progress(event: PrefillProgress) -> None:
        if event.done == 0:
            starts.append(event)
            if len(starts) == 2:  # the base run begins: Stop while it reads the prompt
                cancel.set()

    with pytest.raises(Cancelled):
        session.compare_base([], QUESTION, GREEDY, cancel=cancel, progress=progress)
    assert len(starts) == 2
    after, again = _greedy(session)
    assert [t.token_id for t in after] == [t.token_id for t in before]
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1
    assert again.stats.adapters == "starter-lora.gguf:1"
