"""Taking tokens back out of a sequence's memory: rejected draft tokens, an aborted prefill chunk,
a cached prompt the next one leaves.

Contract: ARCHITECTURE.md, 'engine.inference.seq_memory'.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Literal

MemoryKind = Literal["kv", "recurrent", "hybrid"]

#: ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: only the partial states (recurrent, sliding window).
_PARTIAL_ONLY = 1


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A copy of sequence 0's state when it held its first ``n_tokens`` tokens.

    Attributes:
        n_tokens: the tokens the state covers.
        state: llama.cpp's serialized sequence state.
        full: the whole state (every cell); otherwise only the recurrent part.
        tokens: the tokens it covers, when kept (a checkpoint that outlives the batch it was taken
            for is checked against the sequence before it is restored).
    """

    n_tokens: int
    state: bytearray
    full: bool = False
    tokens: tuple[int, ...] | None = None


class SeqMemory:
    """Sequence 0 of a ``llama_cpp.Llama``: what its memory is, and taking tokens back out of it.

    Args:
        lc: the ``llama_cpp`` module.
        llm: the ``llama_cpp.Llama``.
    """

    def __init__(self, lc: Any, llm: Any) -> None:
        self._lc, self._llm = lc, llm
        model = llm._model.model
        kind: MemoryKind = "kv"
        if lc.llama_model_is_hybrid(model):
            kind = "hybrid"
        elif lc.llama_model_is_recurrent(model):
            kind = "recurrent"
        self.kind: MemoryKind = kind
        self.trimmable = kind == "kv"
        """Whether a removal at any position is expected to work (learned false on a refusal)."""
        self.restores = 0
        """How many times a checkpoint was restored (counted for the reply's stats)."""
        self.broken: str | None = None
        """Why checkpoints cannot be taken here (speculation then stays off), or None."""

    def held(self) -> int:
        """How many leading tokens of the sequence the memory holds (its last position, plus one)."""
        return int(self._lc.llama_memory_seq_pos_max(self._llm._ctx.memory, 0)) + 1

    def checkpoint(self, *, full: bool = False, keep_tokens: bool = False) -> Checkpoint | None:
        """A copy of the state as it is now; None where none is needed (a memory that trims, unless
        ``full``) or none can be taken (then :attr:`broken` says why).

        Args:
            full: copy every cell (a state the KV cache on disk can save), not only the recurrent part.
            keep_tokens: keep the tokens it covers, for a checkpoint restored later.
        """
        if (self.trimmable and not full) or self.broken is not None:
            return None
        lc, llm = self._lc, self._llm
        n_tokens = int(llm.n_tokens)
        flags = 0 if full else _PARTIAL_ONLY
        size = int(lc.llama_state_seq_get_size_ext(llm._ctx.ctx, 0, flags))
        state = bytearray(size)
        written = 0
        if size:
            buffer = (ctypes.c_uint8 * size).from_buffer(state)
            written = int(lc.llama_state_seq_get_data_ext(llm._ctx.ctx, buffer, size, 0, flags))
            del buffer  # release the export before the bytearray may be resized
        if written == 0:
            self.broken = "llama.cpp could not copy this model's sequence state"
            return None
        del state[written:]
        tokens = tuple(int(t) for t in llm.input_ids[:n_tokens]) if keep_tokens else None
        return Checkpoint(n_tokens, state, full, tokens)

    def rewind(self, keep: int, checkpoint: Checkpoint | None = None) -> int:
        """Takes every token at position ``keep`` or later out of the memory.

        Returns:
            How many leading tokens of the sequence the memory then holds: ``keep``; or fewer where
            the memory could not be cut there (the checkpoint's count, or 0 when the memory was
            cleared), and the caller evaluates ``input_ids[returned:keep]`` again.
        """
        llm = self._llm
        held = self.held()
        if held <= keep:
            return held
        if llm._ctx.kv_cache_seq_rm(0, keep, -1):
            return keep
        self.trimmable = False  # a refusal: checkpoint before the batches that may be taken back
        if checkpoint is not None and self.usable(checkpoint, keep) and self._restore(checkpoint):
            self.restores += 1
            return checkpoint.n_tokens
        llm._ctx.kv_cache_clear()
        return 0

    def usable(self, checkpoint: Checkpoint, keep: int) -> bool:
        """Whether restoring ``checkpoint`` gives a prefix of the sequence's first ``keep`` tokens."""
        if checkpoint.n_tokens > keep:
            return False
        if checkpoint.tokens is None:
            return True
        held = self._llm.input_ids[: checkpoint.n_tokens]
        return len(held) == checkpoint.n_tokens and tuple(int(t) for t in held) == checkpoint.tokens

    def put_back(self, checkpoint: Checkpoint) -> bool:
        """Makes the memory hold exactly what a full checkpoint kept with its tokens holds (a
        state put back after other work on the context: a comparison with the base model).

        Returns:
            Whether it does; when not, the memory is empty (the next prompt is read again).
        """
        llm = self._llm
        llm._ctx.kv_cache_clear()
        llm.n_tokens = 0
        if not checkpoint.full or checkpoint.tokens is None or not self._restore(checkpoint):
            llm._ctx.kv_cache_clear()
            return False
        llm.input_ids[: checkpoint.n_tokens] = checkpoint.tokens
        llm.n_tokens = checkpoint.n_tokens
        return True

    def _restore(self, checkpoint: Checkpoint) -> bool:
        """Loads the checkpoint's state, then trims the cells after it (a hybrid's attention part)."""
        lc, llm = self._lc, self._llm
        flags = 0 if checkpoint.full else _PARTIAL_ONLY
        state = checkpoint.state
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        try:
            loaded = int(lc.llama_state_seq_set_data_ext(llm._ctx.ctx, buffer, len(state), 0, flags))
        finally:
            del buffer
        if loaded == 0:
            return False
        return bool(llm._ctx.kv_cache_seq_rm(0, checkpoint.n_tokens, -1)) and self.held() == checkpoint.n_tokens
