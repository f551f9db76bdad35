"""Speculative decoding: where the draft tokens come from, and how many to verify.

Decoding is memory bound: every step reads all the weights to produce one token. The decode loop
(:mod:`engine.decoding`) can instead verify several guessed tokens in one batch and keep the
prefix the model agrees with: each accepted token is one read of the weights saved. Two sources of
guesses:

* :class:`LookupDrafter` (prompt lookup, no second model): the last n-gram of the sequence is
  looked up in the prompt and the reply so far, and what followed it there is the draft. It pays
  where the reply quotes its context (answers from documents, code edits, summaries).
* :class:`DraftModel`: a smaller model of the same vocabulary, in the same worker, drafts greedily.

:class:`SpeculationPolicy` decides how many tokens to draft from what verifying really costs on
this machine (a batch of ``m`` tokens, measured as it runs) and how often drafts have been accepted
(per kind of match): it drafts only when the expected tokens per second beat plain decoding, so a
conversation that never quotes decodes as it would without speculation.

Verification is exact: each position of the batch is sampled by the reply's own sampler chain
and a draft token is kept only if it is what was sampled. For greedy decoding the output is the
output without speculation; under sampling the draft is a point guess, for which "sample, accept
if equal" is standard speculative sampling (acceptance probability p(draft), the residual is the
target distribution without the draft), so the target distribution is kept.

Child side only: nothing here is imported by the parent process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import EngineError, ModelLoadError

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
                model_path=str(path), n_ctx=n_ctx, n_batch=256, n_ubatch=256, n_threads=n_threads,
                n_threads_batch=n_threads, n_gpu_layers=n_gpu_layers, verbose=False,
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
        self.tokens: list[int] = []

    def extend(self, tokens: Sequence[int]) -> None:
        """Appends tokens to the sequence the draft follows."""
        self.tokens.extend(tokens)

    def sync(self, cancel: Any | None = None, chunk: int = 256) -> bool:
        """Brings the draft's KV cache to the sequence but its last token; False when cancelled."""
        llm, seq = self.llm, self.tokens
        target = len(seq) - 1
        prefix = 0
        for a, b in zip(llm._input_ids[: llm.n_tokens], seq, strict=False):
            if a != b:
                break
            prefix += 1
        prefix = min(prefix, target)
        if prefix < llm.n_tokens and not llm._ctx.kv_cache_seq_rm(-1, prefix, -1):
            llm._ctx.kv_cache_clear()
            prefix = 0
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
    """How many tokens to draft: the count with the best expected tokens per second.

    ``cost(m)`` is the measured time of a decode step that evaluates ``m`` tokens and samples them
    (an average per ``m``; unmeasured sizes are interpolated); the expected number of tokens a step
    with ``d`` drafts yields is ``(1 - a**(d+1)) / (1 - a)`` for a per-token acceptance ``a``.

    Args:
        draft_max: the most tokens drafted at once.
        draft_cost_s: the time to draft one token (0 for lookup; measured for a draft model).
    """

    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max
        self.alpha = dict(_BUCKET_PRIORS)
        self._cost: dict[int, float] = {}
        self.draft_cost_s = 0.0

    def record_cost(self, m: int, seconds: float) -> None:
        """A decode step of ``m`` tokens took ``seconds``."""
        old = self._cost.get(m)
        self._cost[m] = seconds if old is None else old + _EMA * (seconds - old)

    def record_draft_cost(self, tokens: int, seconds: float) -> None:
        """Drafting ``tokens`` tokens took ``seconds`` (a draft model)."""
        if tokens > 0:
            per = seconds / tokens
            self.draft_cost_s = per if not self.draft_cost_s else self.draft_cost_s + _EMA * (per - self.draft_cost_s)

    def record_acceptance(self, bucket: str, drafted: int, accepted: int) -> None:
        """Of ``drafted`` tokens from a ``bucket`` match, the first ``accepted`` were kept."""
        if drafted <= 0:
            return
        trials = accepted + (1 if accepted < drafted else 0)
        observed = accepted / trials
        self.alpha[bucket] += _EMA * (observed - self.alpha[bucket])

    def estimate(self, m: int) -> float | None:
        """The expected time of a step of ``m`` tokens."""
        cost = self._cost
        if m in cost:
            return cost[m]
        if 1 not in cost:
            return None
        t1 = cost[1]
        batches = sorted(k for k in cost if k > 1)
        if not batches:
            return t1 * (1 + 0.3 * (m - 1))  # a first guess, replaced by the first measurement
        below = [k for k in batches if k < m]
        above = [k for k in batches if k > m]
        if above:  # between two measured sizes (1 is always measured)
            lo, hi = (below[-1] if below else 1), above[0]
            return cost[lo] + (cost[hi] - cost[lo]) * (m - lo) / (hi - lo)
        points = [1, *batches]  # past the largest: along the line through the last two
        a, b = points[-2], points[-1]
        slope = max((cost[b] - cost[a]) / (b - a), 0.0)
        return cost[b] + slope * (m - b)

    def choose(self, bucket: str, available: int) -> int:
        """How many of ``available`` draft tokens to verify (0: decode one token plainly)."""
        t1 = self.estimate(1)
        if t1 is None or available <= 0:
            return 0
        alpha = min(self.alpha[bucket], 0.99)
        best, best_rate = 0, 1.0 / t1
        expected = 1.0
        power = 1.0
        for d in range(1, min(available, self.draft_max) + 1):
            power *= alpha
            expected += power
            cost = self.estimate(1 + d)
            assert cost is not None
            rate = expected / (cost + d * self.draft_cost_s)
            if rate > best_rate * 1.03:
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
