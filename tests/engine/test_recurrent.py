"""Recurrent memory under everything that takes tokens back out of the cache: rejected speculative
drafts, Stop in the middle of a prefill chunk, a second turn that reuses the first one's prefix,
and the KV cache saved on disk. The models are built in the test (tests/engine/tiny_arch.py): a
tiny Mamba (recurrent), a tiny Granite 4 hybrid (a Mamba-2 layer and an attention layer) and a
tiny Qwen 3.5 (a Gated DeltaNet layer and an attention layer).

Their state cannot drop its last tokens (llama.cpp refuses the removal); each case must still
leave the memory holding exactly the tokens the engine thinks it does, so greedy replies are the
ones a cold run gives. A tiny transformer (Qwen 2.5) runs the same mechanics where removal works.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.inference.decoding import DecodeOutcome, StopMatcher, decode, prefill
from engine.inference.events import Finished, Reasoning, Token
from engine.inference.kv_cache import KvCacheConfig, KvKey
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.seq_memory import SeqMemory
from engine.inference.speculative import DraftModel

pytestmark = pytest.mark.model

GREEDY = GenerationParams(max_tokens=40, temperature=0.0, logprobs=1)  # logprobs: every token is a Token


def _greedy(llm: Any, params: GenerationParams = GREEDY) -> GenerationParams:
    """``params`` with every end-of-generation token banned: a random model may pick one anywhere."""
    import llama_cpp

    vocab = llm._model.vocab
    eog = [t for t in range(int(llm.n_vocab())) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    return params.model_copy(update={"logit_bias": tuple((t, float("-inf")) for t in eog)})


# A prompt that repeats itself, so prompt lookup finds n-grams to draft from.
ECHO = "<|im_start|>user\n" + "the river runs past the old town and the boat is by the house. " * 6


@pytest.fixture(scope="module")
def in_process(tiny_model: Callable[[str], Path]) -> Iterator[Callable[[str], Any]]:
    """Tiny models loaded in this process, for the decode loop called directly."""
    import llama_cpp

    from engine.cpu_backend import load_backends

    assert load_backends().error is None
    loaded: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in loaded:
            path = tiny_model(name)
            loaded[name] = llama_cpp.Llama(
                str(path), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, verbose=False, seed=1
            )
        return loaded[name]

    yield get
    for llm in loaded.values():
        llm.close()


class _Oracle(DraftModel):
    """A drafter that knows the plain reply: it drafts its next tokens, and spoils one of every
    ``spoil`` drafts (the first token of one, a middle token of the next), so the loop accepts
    whole drafts, rejects at the first row and rejects in the middle, at known places."""

    def __init__(self, llm: Any, reply: list[int], prompt: int, spoil: int) -> None:
        self.llm = llm  # the loop arms its abort guard on this context (never read here)
        self.tokens = []
        self.relative_cost = 0.0
        self._reply, self._prompt, self._spoil = reply, prompt, spoil
        self.proposals = 0

    def sync(self, cancel: object = None, chunk: int = 256) -> bool:
        return True

    def propose(self, k: int) -> tuple[list[int], str]:
        done = len(self.tokens) - self._prompt  # reply tokens sampled so far
        draft = list(self._reply[done : done + k])
        self.proposals += 1
        if draft and self.proposals % self._spoil == 0:
            at = 0 if (self.proposals // self._spoil) % 2 else len(draft) // 2
            draft[at] = (draft[at] + 1) % int(self.llm.n_vocab())
        return draft, "model"


def _decode(
    llm: Any, prompt: list[int], params: GenerationParams, draft: DraftModel | None = None
) -> tuple[list[int], DecodeOutcome, SeqMemory]:
    import llama_cpp

    llm.reset()
    memory = SeqMemory(llama_cpp, llm)
    assert prefill(llm, llama_cpp, prompt, 64, threading.Event(), lambda event: None, memory)
    ids: list[int] = []

    def send(event: object) -> None:
        if isinstance(event, Token):
            ids.append(event.token_id)

    outcome = decode(
        llm,
        llama_cpp,
        lambda t: llm.detokenize([t]),
        params,
        prompt,
        512,
        64,
        StopMatcher([]),
        threading.Event(),
        send,
        draft,
        memory=memory,
    )
    return ids, outcome, memory


def _next_logits(llm: Any, token: int) -> np.ndarray:
    """The logits after one more token: they depend on everything the memory holds."""
    import llama_cpp

    llm.eval([token])
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).copy()


RECURRENT = ["mamba", "granite4-hybrid", "qwen3.5"]
KINDS = {"mamba": "recurrent", "granite4-hybrid": "hybrid", "qwen3.5": "hybrid", "qwen2.5": "kv"}


@pytest.mark.parametrize("family", [*RECURRENT, "qwen2.5"])
def test_rejected_drafts_are_taken_back_and_the_reply_is_the_plain_one(
    in_process: Callable[[str], Any], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp

    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", "4")
    llm = in_process(family)
    prompt = list(llm.tokenize(ECHO.encode(), add_bos=False, special=True))
    plain, plain_out, memory = _decode(llm, prompt, _greedy(llm))
    assert memory.kind == KINDS[family]
    assert len(plain) == plain_out.completion_tokens == 40
    after_plain = _next_logits(llm, plain[-1])

    oracle = _Oracle(llm, plain, len(prompt), spoil=3)
    fast, out, memory = _decode(llm, prompt, _greedy(llm).model_copy(update={"speculative": "draft"}), oracle)
    assert fast == plain
    assert out.draft_tokens > 30 and 0 < out.accepted_tokens < out.draft_tokens
    # Every rejection was taken back (and the last batch's rows past the token budget): by
    # restoring the state's copy on the recurrent models, by cutting the cache on the transformer.
    rejections = oracle.proposals // 3
    assert rejections >= 3
    if family in RECURRENT:
        assert rejections <= out.draft_restores <= rejections + 1
    else:
        assert out.draft_restores == 0
    assert memory.held() == llm.n_tokens == len(prompt) + len(plain) - 1
    assert int(llama_cpp.llama_memory_seq_pos_max(llm._ctx.memory, 0)) == llm.n_tokens - 1
    # The state is the plain run's: the next token sees the same history.
    after_fast = _next_logits(llm, plain[-1])
    assert int(after_fast.argmax()) == int(after_plain.argmax())
    np.testing.assert_allclose(after_fast, after_plain, atol=1e-3)


class _StopInsideTheGraph:
    """Stop, pressed so that prefill's check between chunks misses it and llama.cpp's abort
    check, between the nodes of the next chunk's graph, sees it: that chunk is aborted.

    Both of AbortGuard's checks see it: the native flag, set by the guard's watcher once
    ``wait`` says yes, and the Python callback, which asks ``is_set`` (the check before the
    chunk is the first question after arming: it says no)."""

    def __init__(self) -> None:
        self.armed = False
        self.calls = 0

    def is_set(self) -> bool:
        if not self.armed:
            return False
        self.calls += 1
        return self.calls > 1

    def wait(self, timeout: float | None = None) -> bool:
        if not self.armed:
            time.sleep(min(timeout or 0.01, 0.01))
        return self.armed


@pytest.mark.parametrize("family", [*RECURRENT, "qwen2.5"])
def test_stop_inside_a_prefill_chunk_leaves_the_memory_at_the_chunks_read(
    in_process: Callable[[str], Any], family: str
) -> None:
    import llama_cpp

    llm = in_process(family)
    prompt = list(llm.tokenize((ECHO * 2).encode(), add_bos=False, special=True))
    assert len(prompt) > 3 * 64
    cold, _, _ = _decode(llm, prompt, _greedy(llm))

    llm.reset()
    memory = SeqMemory(llama_cpp, llm)
    stop = _StopInsideTheGraph()
    reads: list[int] = []

    def progress(event: Any) -> None:
        reads.append(event.done)
        if event.done:
            stop.armed = True  # after the first chunk
            time.sleep(0.2)  # the guard's watcher sets the native flag before the next chunk

    assert not prefill(llm, llama_cpp, prompt, 64, stop, progress, memory)
    assert reads == [0, 64]  # the second chunk was aborted inside its graph
    assert llm.n_tokens == memory.held() == 64
    # The next turn reads the rest on top of what was kept and replies as a cold run does.
    if family in RECURRENT:
        assert memory.restores == 1  # the half-written state was replaced by the copy before the chunk
    assert prefill(llm, llama_cpp, prompt[64:], 64, threading.Event(), lambda event: None, memory)
    ids: list[int] = []
    decode(
        llm,
        llama_cpp,
        lambda t: llm.detokenize([t]),
        _greedy(llm),
        prompt,
        512,
        64,
        StopMatcher([]),
        threading.Event(),
        lambda event: ids.append(event.token_id) if isinstance(event, Token) else None,
        memory=memory,
    )
    assert ids == cold


# --------------------------------------------------------------------------- through the worker process


def _session(model: Path, folder: Path | None = None) -> Any:
    from engine.inference.session import ChatSession

    config = KvCacheConfig(folder) if folder is not None else None
    return ChatSession(LoadParams(model_path=model, n_ctx=1024, n_threads=2, n_batch=64), kv_cache=config)


def _turn(session: Any, history: list[Any], user: str, params: GenerationParams, **options: Any) -> Finished:
    [finished] = [e for e in session.stream(history, user, params, **options) if isinstance(e, Finished)]
    return finished


def _no_eos(session: Any, params: GenerationParams) -> GenerationParams:
    """``params`` with the end-of-generation tokens banned (a random model may pick one anywhere):
    the model's EOS and the template's own end tokens."""
    from tests.engine.tiny_arch import FAMILIES

    session.load()
    [family] = [f for f in FAMILIES.values() if session.load_params.model_path.name.startswith(f"{f.name}-")]
    ends = {session.info.eos_token, family.eos, family.pad, *family.eos_extra} - {None}
    banned = [session.worker.tokenize(text, add_bos=False, special=True)[0] for text in sorted(ends)]
    return params.model_copy(update={"logit_bias": tuple((t, float("-inf")) for t in banned)})


USER_1 = "Copy this: " + "the river runs past the old town and the boat is by the house. " * 4
USER_2 = "And what is the weather in Paris today?"


@pytest.mark.parametrize("family", RECURRENT)
def test_prompt_lookup_gives_the_plain_greedy_reply(
    tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", "4")  # drafts whenever lookup finds a match
    with _session(tiny_model(family)) as session:
        assert session.load().memory == KINDS[family]
        # A random model's reply repeats itself now and then: long enough, lookup finds n-grams in it.
        params = _no_eos(session, GenerationParams(max_tokens=300, temperature=0.0))
        plain = _turn(session, [], USER_1, params)
        session.worker.reset_cache()
        fast = _turn(session, [], USER_1, params.model_copy(update={"speculative": "lookup"}))
    assert fast.text == plain.text and fast.reason == plain.reason
    assert plain.stats.draft_tokens == 0
    assert fast.stats.draft_tokens > 0 and fast.stats.draft_restores > 0
    assert fast.stats.speculation_note == ""


@pytest.mark.parametrize("family", RECURRENT)
def test_a_second_turn_reuses_the_first_and_replies_as_a_cold_run_and_a_new_process_restores_it(
    tiny_model: Callable[[str], Path], tmp_path: Path, family: str
) -> None:
    from engine.inference.context import Message

    folder = tmp_path / "kv"
    with _session(tiny_model(family), folder) as session:
        params = _no_eos(session, GenerationParams(max_tokens=24, temperature=0.0, speculative="lookup"))
        first = _turn(session, [], USER_1, params, cache_key=KvKey("1", "a"))
        history = [Message("user", USER_1), Message("assistant", first.text)]
        warm = _turn(session, history, USER_2, params, cache_key=KvKey("1", "b"))
        session.worker.reset_cache()
        cold = _turn(session, history, USER_2, params)
    # The reply's tokens need not spell its text the same way again, nor the template its header:
    # the copy of the state where the first conversation ended (before the reply's header) is
    # what the second turn starts from.
    header = first.stats.prompt_tokens - warm.stats.cached_tokens
    assert 0 < header <= 8
    assert cold.stats.cached_tokens == 0
    assert warm.text == cold.text
    # A new worker process: the saved state of the first prompt's end is loaded, not prefilled.
    with _session(tiny_model(family), folder) as session:
        restored = _turn(session, history, USER_2, params, cache_key=KvKey("1", "c"))
    assert restored.stats.kv_restored_tokens == warm.stats.prompt_tokens - header  # all but the header
    assert restored.stats.cached_tokens == restored.stats.kv_restored_tokens
    assert restored.text == warm.text


@pytest.mark.parametrize("family", RECURRENT)
def test_stop_mid_reply_then_the_same_turn_again_is_the_cold_reply(
    tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", "4")
    with _session(tiny_model(family)) as session:
        params = _no_eos(session, GenerationParams(max_tokens=48, temperature=0.0, speculative="lookup"))
        cancel = threading.Event()
        seen = 0
        for event in session.stream([], USER_1, params, cancel=cancel):
            if isinstance(event, Token | Reasoning):  # a thinking model's reply starts as Reasoning
                seen += 1
                if seen == 5:
                    cancel.set()
            if isinstance(event, Finished):
                assert event.reason == "cancelled"
        again = _turn(session, [], USER_1, params)
        assert again.stats.cached_tokens > 0  # the prompt read before Stop is kept
        session.worker.reset_cache()
        cold = _turn(session, [], USER_1, params)
    assert again.text == cold.text
