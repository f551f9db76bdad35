"""The worker's prompt evaluation and decode loop (child side of :mod:`engine.inference.runtime`).

Contract: ARCHITECTURE.md, 'engine.inference.decoding'.
"""

from __future__ import annotations

import bisect
import codecs
import ctypes
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import EngineError
from engine.inference.decode_threads import DecodeThreads
from engine.inference.events import PrefillProgress, Token
from engine.inference.projector import Projector, is_placeholder
from engine.inference.sampling import ChainSampler
from engine.inference.seq_memory import SeqMemory
from engine.inference.speculative import DraftModel, SpeculationPolicy, make_drafter

_CONTINUE = ""


class StopStrings(Protocol):
    """What the loop needs of the stop-string matcher (engine.inference.runtime._StopMatcher)."""

    def feed(self, piece: str) -> int | None: ...

    @property
    def partial(self) -> int: ...

    @property
    def matched(self) -> str | None: ...


@dataclass
class DecodeOutcome:
    """What the decode loop did."""

    reason: str
    text: str
    completion_tokens: int
    t_first: float
    draft_tokens: int = 0
    accepted_tokens: int = 0
    stop_sequence: str | None = None  # the stop string that ended the reply (reason "stop"), if one did
    draft_restores: int = 0  # rejected drafts taken back by restoring a copy of the state (recurrent memory)
    speculation_note: str = ""  # why speculation was off for this reply although it was asked for


_STRLEN: list[int | None] = []


def _native_flag_check() -> int | None:
    """The address of C's ``strlen``, llama.cpp's abort check without Python (see AbortGuard), or None."""
    if not _STRLEN:
        address: int | None = None
        try:
            libc = ctypes.CDLL("msvcrt") if os.name == "nt" else ctypes.CDLL(None)
            address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
        except (OSError, AttributeError):
            address = None
        _STRLEN.append(address)
    return _STRLEN[0]


class AbortGuard:
    """llama.cpp's abort callback on one context, armed only while prefilling.

    llama.cpp calls it after every node of the graph, from the first compute thread, while the
    others wait at the node's barrier: about 1,400 calls for a 760-token prompt on the starter
    model. A Python callback there took 1.4% of the prefill's CPU on one thread and held up every
    barrier. So the check is C's ``strlen`` on a two-byte flag: it returns nonzero, which
    llama.cpp reads as "abort", once the first byte is set, and a thread that waits on the
    request's cancel event sets it. (Where libc's ``strlen`` cannot be found, a Python callback
    checks the event instead.)

    Args:
        lc: the ``llama_cpp`` module.
        ctx: the ``llama_context`` pointer.
        cancel: the request's cancel event (``is_set()`` and ``wait(timeout)``).
    """

    def __init__(self, lc: Any, ctx: Any, cancel: Any) -> None:
        self._lc, self._ctx, self._cancel = lc, ctx, cancel
        self._flag = ctypes.create_string_buffer(2)  # b"\0\0"; b"\1\0" once cancelled
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None
        self._fired = False
        address = _native_flag_check()
        if address is not None:
            self._callback = lc.ggml_abort_callback(address)
            self._data: Any = ctypes.cast(self._flag, ctypes.c_void_p)
        else:

            def check(_data: Any) -> bool:
                if cancel.is_set():
                    self._fired = True
                    return True
                return False

            self._callback = lc.ggml_abort_callback(check)  # kept alive while armed
            self._data = None

    @property
    def fired(self) -> bool:
        """Whether the check told llama.cpp to abort (Stop came while it was armed)."""
        return self._fired or self._flag.raw[0] != 0

    def _watch(self) -> None:
        while not self._done.is_set():
            if self._cancel.wait(0.05):
                self._flag.raw = b"\x01\x00"
                return

    def __enter__(self) -> AbortGuard:
        if self._data is not None:
            self._watcher = threading.Thread(target=self._watch, name="glassbox-abort-watch", daemon=True)
            self._watcher.start()
        self._lc.llama_set_abort_callback(self._ctx, self._callback, self._data)
        return self

    def __exit__(self, *exc: object) -> None:
        self._lc.llama_set_abort_callback(self._ctx, self._lc.ggml_abort_callback(), None)
        self._done.set()  # the watcher leaves at its next look (not waited for: the reply goes on)


def prefill(
    llm: Any,
    lc: Any,
    tokens: Sequence[int],
    n_batch: int,
    cancel: Any,
    send: Callable[[object], None],
    memory: SeqMemory | None = None,
    pause: tuple[int, Callable[[], None]] | None = None,
    media: Projector | None = None,
) -> bool:
    """Evaluates ``tokens`` after the cached prefix, reporting progress; False when cancelled.

    Stop does not wait for a chunk: llama.cpp's abort callback (armed here) ends the evaluation
    inside the graph on the CPU backends. So the chunks are as large as llama.cpp batches best,
    ``n_batch`` each, as llama-cpp-python's own ``eval`` splits a prompt; progress moves once a
    chunk (a first chunk of 128 tokens, so that it moved sooner, made the starter's 760-token
    prefill 6-8% slower on a 2-core Zen 5, measured side by side). The schedule is fixed, not timed:
    the KV values depend on how the prompt is batched, and a schedule taken from the machine's load
    would make greedy replies depend on it (measured: sized ~0.25 s chunks cost 10% of prefill speed
    against whole ones). A GPU backend does not check the callback; there one ``n_batch`` chunk
    bounds Stop, a fraction of a second.

    An aborted chunk is taken back out of the memory (``memory``, made here when not given): on a
    recurrent model, whose state the aborted graph may have half written, from a copy of the state
    taken before the chunk. With ``pause=(n, callback)``, a chunk ends after ``n`` of the tokens
    and ``callback()`` is called there (a recurrent memory copies its state at a point the next
    prompt will start with). With ``media`` (the worker's projector), a run of placeholder tokens
    is an image or a clip: it is encoded and read in on its own (``PrefillProgress.encoding`` says
    so first), between the text batches.
    """
    memory = memory if memory is not None else SeqMemory(lc, llm)
    total = len(tokens)
    done = 0
    send(PrefillProgress(0, total))
    hold, at_hold = pause if pause is not None and 0 <= pause[0] < total else (total, None)
    # Where image and audio chunks sit (their placeholder tokens): text batches stop before them.
    placed = [i for i, token in enumerate(tokens) if is_placeholder(token)] if media is not None else []
    with AbortGuard(lc, llm._ctx.ctx, cancel) as guard:
        while done < total:
            if cancel.is_set():
                return False
            if done == hold and at_hold is not None:
                at_hold()
            if placed and is_placeholder(tokens[done]):
                assert media is not None
                read = _media_chunk(llm, media, tokens, done, guard, memory, send, total)
                if read == 0:
                    return False
                done += read
                send(PrefillProgress(done, total))
                continue
            end = min(done + n_batch, hold if done < hold else total)
            if placed:
                after = bisect.bisect_left(placed, done)
                end = min(end, placed[after]) if after < len(placed) else end
            batch = tokens[done:end]
            checkpoint = memory.checkpoint() if llm.n_tokens else None  # None for a KV cache
            try:
                llm.eval(batch)
            except RuntimeError:
                if not guard.fired:
                    raise
                # Aborted: llama.cpp keeps what it wrote of the chunk; the cache must end where
                # the evaluated tokens do, or the next turn would reuse half a chunk.
                llm.n_tokens = memory.rewind(llm.n_tokens, checkpoint)
                return False
            done += len(batch)
            send(PrefillProgress(done, total))
    return not cancel.is_set()


def _media_chunk(
    llm: Any,
    media: Projector,
    tokens: Sequence[int],
    at: int,
    guard: AbortGuard,
    memory: SeqMemory,
    send: Callable[[object], None],
    total: int,
) -> int:
    """Encodes the image or audio chunk whose placeholders start at ``tokens[at]`` and reads it
    into the KV cache after the tokens evaluated so far; returns its length, 0 when Stop aborted it
    (the cache then ends where it did before the chunk).

    Raises:
        EngineError: no chunk read by this worker has that run, or llama.cpp failed.
    """
    found = media.chunk_at(tokens, at)
    if found is None:
        raise EngineError("the prompt holds an image or a clip this worker has not read (send it again)")
    length, chunk = found
    send(PrefillProgress(at, total, encoding=length))
    start = int(llm.n_tokens)
    status = media.evaluate(chunk, start)
    if status != 0:
        llm.n_tokens = memory.rewind(start)  # whatever the decode wrote of the chunk goes
        if guard.fired:
            return 0
        raise EngineError(f"llama.cpp could not read the image into the context (error {status})")
    llm.input_ids[start : start + length] = tokens[at : at + length]
    llm.n_tokens = start + length
    return length


class _Emitter:
    """Turns sampled tokens into text and Token events: end of generation, stop strings, the
    token budget and Stop, for plain and drafted tokens alike."""

    def __init__(
        self,
        lc: Any,
        llm: Any,
        piece: Callable[[int], bytes],
        params: Any,
        stops: StopStrings,
        max_new: int,
        cancel: Any,
        send: Callable[[object], None],
    ) -> None:
        self._lc, self._vocab = lc, llm._model.vocab
        self._piece = piece
        self._params = params
        self._stops = stops
        self._max_new = max_new
        self._cancel = cancel
        self._send = send
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.emitted = 0
        self.n_out = 0
        self.t_first = 0.0
        self.stop_sequence: str | None = None

    def push(self, token: int, sampler: ChainSampler, idx: int, drafted: bool) -> str:
        """Handles one sampled token; returns "" to go on, else the finish reason."""
        if not self.t_first:
            self.t_first = time.perf_counter()
        if self._cancel.is_set():
            return "cancelled"
        if self._lc.llama_vocab_is_eog(self._vocab, token):
            return "stop"
        self.n_out += 1
        logprob: float | None = None
        tops: tuple[tuple[str, float], ...] = ()
        if self._params.logprobs:
            logprob, tops = sampler.logprobs(idx, token, self._params.logprobs, self._text_of)
        raw = self._piece(token)
        text = self.text + self._decoder.decode(raw)
        hit = self._stops.feed(text[len(self.text) :])
        self.text = text
        if hit is not None:
            self.text = text[:hit]
            self.stop_sequence = self._stops.matched
            if len(self.text) > self.emitted or self._params.logprobs:
                self._send(Token(self.text[self.emitted :], token, logprob, tops, drafted))
                self.emitted = len(self.text)
            return "stop"
        safe = len(self.text) - self._stops.partial
        if safe > self.emitted or self._params.logprobs or not raw:
            # With logprobs every token is reported, its text possibly empty (held back). A control
            # token (no text at all: llama.cpp renders none) is reported too, with its id, so the
            # reply shaper can give the parsers the markers they read (Mistral's [TOOL_CALLS]).
            piece = self.text[self.emitted : safe] if safe > self.emitted else ""
            self._send(Token(piece, token, logprob, tops, drafted))
            self.emitted = max(self.emitted, safe)
        if self.n_out >= self._max_new:
            return "length"
        return _CONTINUE

    def _text_of(self, token: int) -> str:
        return self._piece(token).decode("utf-8", errors="replace")

    def finish(self, reason: str) -> str:
        """The reply's text once the loop ended with ``reason`` (the held-back tail is sent
        unless the reply was stopped or cancelled)."""
        self.text += self._decoder.decode(b"", final=True)
        if reason == "cancelled":
            self.text = self.text[: self.emitted]  # nothing follows Stop
        elif reason != "stop" and len(self.text) > self.emitted:
            self._send(Token(self.text[self.emitted :], -1))
            self.emitted = len(self.text)
        return self.text


def sync_draft(lc: Any, drafter: DraftModel, cancel: Any) -> bool:
    """Brings the draft model's KV cache to the sequence, under the abort callback like a prefill;
    False when Stop came first (the draft's cache then keeps only what it had fully read)."""
    with AbortGuard(lc, drafter.llm._ctx.ctx, cancel) as guard:
        try:
            return drafter.sync(cancel)
        except RuntimeError:
            if not guard.fired:
                raise
            drafter.llm.n_tokens = drafter.memory.rewind(drafter.llm.n_tokens)
            return False


def decode(
    llm: Any,
    lc: Any,
    piece: Callable[[int], bytes],
    params: Any,
    prompt: Sequence[int],
    n_ctx: int,
    n_batch: int,
    stops: StopStrings,
    cancel: Any,
    send: Callable[[object], None],
    draft_model: DraftModel | None = None,
    offloaded: bool = False,
    memory: SeqMemory | None = None,
    resume: int = 0,
    threads: DecodeThreads | None = None,
) -> DecodeOutcome:
    """Generates the reply after a prefilled prompt (the logits of its last token are current).

    ``memory`` (made here when not given) takes a rejected draft's tail back out of the cache.
    ``resume``: the prompt's last ``resume`` tokens are the reply so far (begun by a worker that
    crashed): the grammar takes them as generated before the reply goes on. ``threads`` sets and
    times the threads of each single-token step (:mod:`engine.inference.decode_threads`).
    """
    seed = params.seed if params.seed is not None else llm._seed
    max_new = min(params.max_tokens, n_ctx - llm.n_tokens)
    emitter = _Emitter(lc, llm, piece, params, stops, max_new, cancel, send)
    memory = memory if memory is not None else SeqMemory(lc, llm)
    restores_before = memory.restores
    note = ""
    if params.speculative != "off" and not memory.trimmable and memory.checkpoint() is None:
        # A memory that cannot be cut and whose state cannot be copied: a rejected draft could
        # not be taken back, so this reply decodes plainly.
        note = f"speculative decoding is off for this model: {memory.broken}"
    drafter = make_drafter(params.speculative if not note else "off", prompt, draft_model)
    draft_synced = False
    draft_cost = drafter.relative_cost if isinstance(drafter, DraftModel) else 0.0
    # GLASSBOX_TEST_DRAFT_FIXED=N: always draft N tokens, so tests and benchmarks can exercise a
    # draft model the policy would rightly not use (one as costly as its target).
    fixed = int(os.environ.get("GLASSBOX_TEST_DRAFT_FIXED") or 0)
    head_share = llm.n_vocab() * llm.n_embd() / max(int(llm._model.n_params()), 1)
    policy = SpeculationPolicy(
        min(params.draft_max, max(n_batch - 1, 1)),
        offloaded=offloaded,
        draft_cost=draft_cost,
        fixed=fixed,
        head_share=head_share,
        restore_cost=not memory.trimmable,
    )
    drafted_total = accepted_total = 0
    reason = _CONTINUE
    with ChainSampler(lc, llm, params, seed) as sampler:
        sampler.prime(prompt)
        if resume > 0:
            sampler.resume(list(prompt)[-resume:])
        token = sampler.sample(-1)
        reason = emitter.push(token, sampler, -1, False)
        while not reason:
            if drafter is not None:
                drafter.extend([token])
            room = min(max_new - emitter.n_out, n_ctx - llm.n_tokens - 2, n_batch - 1, policy.draft_max)
            draft: list[int] = []
            bucket = ""
            if drafter is not None and room > 0:
                if isinstance(drafter, DraftModel):
                    k = policy.choose("model", room)
                    if k and not draft_synced:
                        # The draft reads the prompt only once the policy first drafts (a draft the
                        # policy declines costs nothing), as abortable as the model's prefill.
                        if not sync_draft(lc, drafter, cancel):
                            reason = "cancelled"
                            break
                        draft_synced = True
                    if k:
                        draft, bucket = drafter.propose(k)
                else:
                    candidates, bucket = drafter.propose(room)
                    if candidates:
                        draft = candidates[: policy.choose(bucket, len(candidates))]
            if not draft:
                if threads is not None:
                    threads.before_step()
                step_start = time.perf_counter()
                llm.eval([token])
                if threads is not None:
                    threads.after_step(time.perf_counter() - step_start)
                token = sampler.sample(-1)
                reason = emitter.push(token, sampler, -1, False)
                continue
            token, reason, accepted = _verify(llm, sampler, emitter, token, draft, memory)
            policy.record_acceptance(bucket, len(draft), accepted)
            drafted_total += len(draft)
            accepted_total += accepted
            if drafter is not None:
                drafter.extend(draft[:accepted])
    if drafter is not None and drafter is not draft_model:
        drafter.close()
    text = emitter.finish(reason)
    return DecodeOutcome(
        reason,
        text,
        emitter.n_out,
        emitter.t_first or time.perf_counter(),
        drafted_total,
        accepted_total,
        emitter.stop_sequence if reason == "stop" else None,
        memory.restores - restores_before,
        note,
    )


def _verify(
    llm: Any, sampler: ChainSampler, emitter: _Emitter, token: int, draft: list[int], memory: SeqMemory
) -> tuple[int, str, int]:
    """Evaluates ``[token, *draft]`` in one batch and samples each row in order.

    The rows after the last one kept are taken back out of the memory; where it cannot be cut (a
    recurrent state), the copy taken before the batch is restored and the kept rows are evaluated
    again, so the memory holds what plain decoding would have put there.

    Returns:
        the last token sampled (not yet evaluated), the finish reason ("" to go on), and how many
        draft tokens were accepted.
    """
    batch = [token, *draft]
    n_past = llm.n_tokens
    settle(llm, memory, n_past)
    checkpoint = memory.checkpoint()  # None for a KV cache, which cuts
    llm._batch.set_batch(batch, n_past, logits_all=True)
    llm._ctx.decode(llm._batch)
    llm.input_ids[n_past : n_past + len(batch)] = batch
    accepted = 0
    reason = _CONTINUE
    kept = len(batch)
    for i in range(len(batch)):
        sampled = sampler.sample(i)
        hit = i < len(draft) and sampled == draft[i]
        before = emitter.n_out
        reason = emitter.push(sampled, sampler, i, hit)
        token = sampled
        if hit and emitter.n_out > before:
            accepted += 1  # a draft token the reply kept (also the last one, when it ends it)
        if reason or not hit:
            kept = i + 1
            break
    # The cache keeps the batch up to the row whose prediction was taken last.
    llm.n_tokens = n_past + len(batch)
    if kept < len(batch):
        settle(llm, memory, n_past + kept, checkpoint)
    return token, reason, accepted


def settle(llm: Any, memory: SeqMemory, keep: int, checkpoint: Any = None) -> None:
    """Makes the memory hold exactly the sequence's first ``keep`` tokens (``llm.input_ids``):
    the tail is taken out and, where the memory could only go back further, the rest is
    evaluated again."""
    held = memory.rewind(keep, checkpoint)
    llm.n_tokens = held
    if held < keep:
        llm.eval([int(t) for t in llm.input_ids[held:keep]])


class StopMatcher:
    """Finds the stop strings in a reply that grows a piece at a time (an Aho-Corasick automaton).

    The reply costs time in proportion to its length (amortized over its pieces), whatever the
    number and length of the stop strings; building the automaton costs their total length, once.
    Replaces scanning every stop string over the whole text at every token.

    Args:
        stops: the stop strings; empty ones are ignored.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        # A trie of the stop strings: _goto[node][char] is the child, _depth[node] its text's length.
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        ends: dict[int, str] = {}
        for stop in stops:
            node = 0
            for char in stop:
                child = self._goto[node].get(char)
                if child is None:
                    child = len(self._goto)
                    self._goto[node][char] = child
                    self._goto.append({})
                    self._depth.append(self._depth[node] + 1)
                node = child
            if stop:
                ends[node] = stop
        # _fail[node]: the node of the longest proper suffix of node's text that begins a stop string;
        # _match[node]: the length of the longest stop string that node's text ends with (0: none),
        # _stop[node]: that stop string ("": none).
        self._fail = [0] * len(self._goto)
        self._match = [0] * len(self._goto)
        self._stop = [""] * len(self._goto)
        queue = list(self._goto[0].values())  # breadth first: a node's suffixes come before it
        for node in queue:
            self._match[node] = self._depth[node] if node in ends else self._match[self._fail[node]]
            self._stop[node] = ends[node] if node in ends else self._stop[self._fail[node]]
            for char, child in self._goto[node].items():
                fallback = self._fail[node]
                while fallback and char not in self._goto[fallback]:
                    fallback = self._fail[fallback]
                self._fail[child] = self._goto[fallback].get(char, 0) if node else 0
                queue.append(child)
        self._state = 0
        self._length = 0
        self._matched: str | None = None

    def feed(self, piece: str) -> int | None:
        """Adds ``piece`` to the text; returns where the earliest stop string in the text begins, if any
        (the text before ``piece`` held none: it ends in ``piece``); :attr:`matched` is then that stop string."""
        goto, fail, match = self._goto, self._fail, self._match
        state = self._state
        hit: int | None = None
        for offset, char in enumerate(piece, start=self._length + 1):
            while state and char not in goto[state]:
                state = fail[state]
            state = goto[state].get(char, 0)
            if match[state]:
                start = offset - match[state]
                if hit is None or start < hit:
                    hit, self._matched = start, self._stop[state]
        self._state = state
        self._length += len(piece)
        return hit

    @property
    def partial(self) -> int:
        """Length of the longest tail of the text that could still grow into a stop string."""
        return self._depth[self._state]

    @property
    def matched(self) -> str | None:
        """The stop string found by the last :meth:`feed` that found one (None before any)."""
        return self._matched
