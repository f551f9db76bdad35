"""Speculative decoding: where the draft tokens come from, and how many to verify.

Contract: ARCHITECTURE.md, 'engine.inference.speculative'.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import EngineError, ModelLoadError
from engine.inference.seq_memory import Checkpoint, SeqMemory

# Priors of the per-token acceptance rate by how long the match is (tokens that agree before the
# draft): a long match is a quote, a short one is often a common phrase.
_BUCKET_PRIORS = {"short": 0.5, "medium": 0.7, "long": 0.9, "model": 0.7}
_EMA = 0.3
_RECOVERY = 0.02  # how fast an unused bucket's estimate drifts back to its prior
_LONG_MATCH = 8
_MEDIUM_MATCH = 4
_MATCH_SCAN = 32


class LookupDrafter:
    """Prompt lookup: an index of the sequence's n-grams and what followed each, most recent wins.

    Args:
        tokens: the sequence so far (the prompt).
        n_max: the longest n-gram looked up.
        n_min: the shortest.
    """

    kind = "lookup"

    def __init__(self, tokens: Sequence[int], n_max: int = 4, n_min: int = 2) -> None:
        self.tokens: list[int] = []
        self._sizes = range(n_max, n_min - 1, -1)
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._sizes}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Appends tokens to the sequence."""
        seq, index = self.tokens, self._index
        for token in tokens:
            pos = len(seq)
            for n in self._sizes:
                if pos >= n:
                    index[n][tuple(seq[pos - n : pos])] = pos
            seq.append(token)

    def propose(self, k: int) -> tuple[list[int], str]:
        """Up to ``k`` draft tokens and the bucket of their match (``[]`` when nothing matches)."""
        seq = self.tokens
        for n in self._sizes:
            if len(seq) < n:
                continue
            cont = self._index[n].get(tuple(seq[-n:]))
            if cont is None:
                continue
            length = n
            while length < _MATCH_SCAN and cont - length - 1 >= 0 and seq[cont - length - 1] == seq[-length - 1]:
                length += 1
            bucket = "long" if length >= _LONG_MATCH else "medium" if length >= _MEDIUM_MATCH else "short"
            return seq[cont : cont + k], bucket
        return [], ""

    def close(self) -> None:
        """Nothing to free."""


class DraftModel:
    """A smaller model of the same vocabulary that drafts greedily, in the worker's process.

    Args:
        lc: the ``llama_cpp`` module.
        path: the draft model's GGUF.
        target: the target ``llama_cpp.Llama`` (its vocabulary must be the same).
        n_ctx, n_threads, n_gpu_layers: as for the target.

    Raises:
        ModelLoadError: the draft does not load, or its vocabulary differs from the target's.
    """

    kind = "draft"

    def __init__(self, lc: Any, path: Path, target: Any, n_ctx: int, n_threads: int | None, n_gpu_layers: int) -> None:
        self._lc = lc
        try:
            self.llm: Any = lc.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_batch=256,
                n_ubatch=256,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                n_gpu_layers=n_gpu_layers,
                verbose=False,
            )
        except Exception as exc:  # noqa: BLE001 - any load failure is one line for the user
            raise ModelLoadError(f"{path}: the draft model could not be loaded ({exc})") from None
        try:
            reason = vocabulary_difference(target, self.llm)
        except BaseException:
            self.llm.close()
            raise
        if reason is not None:
            self.llm.close()
            raise ModelLoadError(f"{path}: cannot draft for this model: {reason}")
        self._greedy = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(self._greedy, lc.llama_sampler_init_greedy())
        self.memory = SeqMemory(lc, self.llm)
        self._checkpoint: Checkpoint | None = None  # a recurrent draft's state before its last draft
        self.tokens: list[int] = []
        # Drafting a token costs about the draft's share of the target's bytes read per token.
        self.relative_cost = min(1.0, Path(path).stat().st_size / max(int(target._model.size()), 1))

    def extend(self, tokens: Sequence[int]) -> None:
        """Appends tokens to the sequence the draft follows."""
        self.tokens.extend(tokens)

    def sync(self, cancel: Any | None = None, chunk: int = 256) -> bool:
        """Brings the draft's KV cache to the sequence but its last token; False when cancelled.

        A recurrent draft model cannot cut its state back to where the target disagreed: the copy
        taken before its last draft is restored, and what follows is read again."""
        llm, seq = self.llm, self.tokens
        target = len(seq) - 1
        prefix = 0
        for a, b in zip(llm._input_ids[: llm.n_tokens], seq, strict=False):
            if a != b:
                break
            prefix += 1
        prefix = min(prefix, target)
        if prefix < llm.n_tokens:
            prefix = self.memory.rewind(prefix, self._checkpoint)
        self._checkpoint = None
        llm.n_tokens = prefix
        while llm.n_tokens < target:
            if cancel is not None and cancel.is_set():
                return False
            llm.eval(seq[llm.n_tokens : min(target, llm.n_tokens + chunk)])
        return True

    def propose(self, k: int) -> tuple[list[int], str]:
        """Up to ``k`` greedy draft tokens after the sequence."""
        llm, lc = self.llm, self._lc
        if len(self.tokens) + k >= len(llm.input_ids):
            return [], ""
        self.sync()
        self._checkpoint = self.memory.checkpoint(keep_tokens=True)  # None for a KV cache
        draft: list[int] = []
        token = self.tokens[-1]
        for _ in range(k):
            llm.eval([token])
            token = int(lc.llama_sampler_sample(self._greedy, llm._ctx.ctx, -1))
            draft.append(token)
        return draft, "model"

    def close(self) -> None:
        """Frees the draft model."""
        if self._greedy is not None:
            self._lc.llama_sampler_free(self._greedy)
            self._greedy = None
        self.llm.close()


def vocabulary_difference(target: Any, draft: Any) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (one line), or None when their vocabularies agree
    token for token."""
    n_target, n_draft = int(target.n_vocab()), int(draft.n_vocab())
    if n_target != n_draft:
        return f"its vocabulary has {n_draft} tokens, the model's has {n_target}"
    for name in ("token_bos", "token_eos"):
        if getattr(target, name)() != getattr(draft, name)():
            return f"its {name[6:]} token differs from the model's"
    text_t, text_d = target._model.token_get_text, draft._model.token_get_text
    for token in range(n_target):
        a, b = text_t(token), text_d(token)
        if a != b:
            return f"token {token} is {b!r} in it but {a!r} in the model"
    return None


class SpeculationPolicy:
    """How many tokens to draft: the count with the best expected tokens per unit of time.

    The cost of a step that evaluates ``m`` tokens, in units of a one-token step, is a fixed
    model, not a measurement: llama.cpp's arithmetic depends on the batch's shape, so a draft
    length chosen from timings would make a greedy reply depend on the machine's load. With a
    fixed model the same prompt gives the same reply every time. On a CPU a batch costs
    ``1 + jump + slope * (m - 1)``: matrix-vector kernels give way to matrix-matrix ones, and every
    row's logits are computed, so the slope grows with the output layer's share of the weights
    (``head_share``). Measured on the starter model (a 262k-token vocabulary, 62% of its weights
    in the output layer): 2.3x for 2 tokens, 4.4x for 8, 6.8x for 16. Offloaded to a GPU a batch
    costs little more than one token.

    The expected number of tokens a step with ``d`` drafts yields is ``(1 - a**(d+1)) / (1 - a)``
    for the per-token acceptance ``a``, estimated per kind of match from the replies so far (which
    are deterministic too).

    Args:
        draft_max: the most tokens drafted at once.
        offloaded: the model runs on a GPU.
        draft_cost: the cost of drafting one token with a draft model, in one-token steps of the
            target (about the ratio of their sizes; 0 for prompt lookup).
        fixed: > 0 drafts that many tokens whenever there are drafts, whatever they cost.
        head_share: the output layer's share of the model's weights (n_vocab * n_embd / n_params).
        restore_cost: a rejected draft is taken back by restoring the state and evaluating the
            kept tokens again (a recurrent model, engine.inference.seq_memory), not by cutting
            the KV cache: each rejection costs about one more step of the tokens it kept.
    """

    def __init__(
        self,
        draft_max: int,
        *,
        offloaded: bool = False,
        draft_cost: float = 0.0,
        fixed: int = 0,
        head_share: float = 0.62,
        restore_cost: bool = False,
    ) -> None:
        self.draft_max = draft_max
        self.fixed = fixed  # > 0: always draft this many (tests and benchmarks of the mechanics)
        self.alpha = dict(_BUCKET_PRIORS)
        share = min(max(head_share, 0.0), 1.0)
        self.jump, self.slope = (0.1, 0.03) if offloaded else (1.0, 0.1 + 0.37 * share)
        self.draft_cost = draft_cost
        self.restore_cost = restore_cost

    def cost(self, m: int) -> float:
        """A step that evaluates ``m`` tokens, in one-token steps."""
        return 1.0 if m <= 1 else 1.0 + self.jump + self.slope * (m - 1)

    def record_acceptance(self, bucket: str, drafted: int, accepted: int) -> None:
        """Of ``drafted`` tokens from a ``bucket`` match, the first ``accepted`` were kept."""
        if drafted <= 0:
            return
        trials = accepted + (1 if accepted < drafted else 0)
        observed = accepted / trials
        self.alpha[bucket] += _EMA * (observed - self.alpha[bucket])

    def choose(self, bucket: str, available: int) -> int:
        """How many of ``available`` draft tokens to verify (0: decode one token plainly)."""
        if available <= 0:
            return 0
        if self.fixed:
            return min(self.fixed, available, self.draft_max)
        alpha = min(self.alpha[bucket], 0.99)
        best, best_rate = 0, 1.0
        expected = 1.0
        power = 1.0
        for d in range(1, min(available, self.draft_max) + 1):
            power *= alpha
            expected += power
            step = self.cost(1 + d) + d * self.draft_cost
            if self.restore_cost:
                # Rejected (1 - alpha**d of the time): the kept tokens are evaluated again.
                step += (1.0 - power) * self.cost(max(round(expected), 1))
            rate = expected / step
            if rate > best_rate * 1.05:
                best, best_rate = d, rate
        if best == 0:
            self.alpha[bucket] += _RECOVERY * (_BUCKET_PRIORS[bucket] - self.alpha[bucket])
        return best


def make_drafter(kind: str, tokens: Sequence[int], draft: DraftModel | None) -> LookupDrafter | DraftModel | None:
    """The drafter for GenerationParams.speculative (``off`` gives None)."""
    if kind == "off":
        return None
    if kind == "lookup":
        return LookupDrafter(tokens)
    if draft is None:
        raise EngineError("speculative decoding with a draft model needs one: load the model with a draft model")
    draft.tokens = list(tokens)
    return draft
