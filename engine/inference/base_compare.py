"""A reply compared with the base model: the same prompt decoded greedily with the chat's LoRA
adapters and without them, where the two replies first differ, and how far the adapters moved the
probability of the token they chose (ARCHITECTURE.md, "Threads and processes": LoRA adapters).

:class:`BaseComparison` is what crosses back from the inference worker: plain frozen data, with the
one line every front end shows (:meth:`BaseComparison.summary`). The runs themselves are the
worker's (``engine.inference.runtime._Worker.compare_base``: the chat's state is put back after
them); :func:`score_token` is the one extra evaluation they need, in the worker too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.inference.decoding import settle
from engine.inference.sampling import ChainSampler

__all__ = [
    "TOP_ALTERNATIVES",
    "BaseComparison",
    "ComparedToken",
    "first_divergence",
    "first_logprob",
    "probability_text",
    "score_token",
]

TOP_ALTERNATIVES = 5
"""The most likely alternatives kept for each token of both replies (at least)."""


@dataclass(frozen=True)
class ComparedToken:
    """One token of a greedy reply.

    Attributes:
        token_id: the token.
        text: its piece (control tokens: their text, maybe empty).
        logprob: its log-probability in its own run (after the logit bias, as ``Token.logprob``).
        top: the most likely tokens there, as text and log-probability, best first.
    """

    token_id: int
    text: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    @property
    def p(self) -> float:
        """Its probability in its own run."""
        return math.exp(self.logprob)


def first_divergence(adapted: Sequence[int], base: Sequence[int]) -> int | None:
    """The first index where two token streams differ (the shorter one's length when one is the
    other's beginning), or None when they are the same."""
    for i, (a, b) in enumerate(zip(adapted, base, strict=False)):
        if a != b:
            return i
    return None if len(adapted) == len(base) else min(len(adapted), len(base))


@dataclass(frozen=True)
class BaseComparison:
    """The last reply's prompt decoded greedily twice: with the adapters, and with none.

    Attributes:
        adapters: the adapters of the first run, ``file:scale`` each ("" when none is above 0).
        adapted: the reply with the adapters.
        base: the reply of the base model.
        adapted_reason, base_reason: how each ended (``stop`` or ``length``).
        divergence: the index of the first token where they differ, or None.
        base_logprobs: for each token of ``adapted`` up to the divergence (and at it), its
            log-probability under the base model; None where the base's reply had ended.
        prompt_tokens: the prompt's tokens.
        adapted_ms, base_ms: what each run took (its prefill and its decode).
        restore_ms: putting the chat's adapters and KV cache back as they were.
        restored: whether the KV cache was put back (False: it was emptied, and the next turn
            reads its prompt again).
    """

    adapters: str
    adapted: tuple[ComparedToken, ...]
    base: tuple[ComparedToken, ...]
    adapted_reason: str
    base_reason: str
    divergence: int | None
    base_logprobs: tuple[float | None, ...]
    prompt_tokens: int
    adapted_ms: float = 0.0
    base_ms: float = 0.0
    restore_ms: float = 0.0
    restored: bool = True

    @property
    def same(self) -> int:
        """How many leading tokens the two replies share."""
        return len(self.adapted) if self.divergence is None else self.divergence

    def moved(self, index: int) -> tuple[float, float | None]:
        """The probability of the adapted reply's token ``index`` with the adapters and under the
        base model (None where that is not known: past the divergence, or after the base ended)."""
        token = self.adapted[index]
        base = self.base_logprobs[index] if index < len(self.base_logprobs) else None
        return token.p, (math.exp(base) if base is not None else None)

    def summary(self) -> str:
        """One line: where the adapters changed the reply, and by how much.

        E.g. "Same as base for 12 tokens; at token 13 the adapter chose ' cat' (p=0.71, base
        p=0.08); base chose ' dog' (p=0.64)".
        """
        d = self.divergence
        if d is None:
            if not self.adapted:
                return "Both replies are empty: the adapter changed nothing here"
            return f"Same as base for all {_tokens(len(self.adapted))}: the adapter did not change this greedy reply"
        head = f"Same as base for {_tokens(d)}" if d else "Different from the first token"
        if d < len(self.adapted):
            p, base_p = self.moved(d)
            chosen = f"at token {d + 1} the adapter chose {self.adapted[d].text!r} (p={probability_text(p)}"
            chosen += f", base p={probability_text(base_p)})" if base_p is not None else ")"
            if d < len(self.base):
                other = self.base[d]
                return f"{head}; {chosen}; base chose {other.text!r} (p={probability_text(other.p)})"
            return f"{head}; {chosen}; base's reply ended there"
        other = self.base[d]
        went_on = f"{other.text!r} (p={probability_text(other.p)})"
        return f"{head}; then the adapter's reply ended, where base went on with {went_on}"

    def largest_move(self) -> int | None:
        """The shared token (before the divergence, or anywhere when there is none) whose
        probability the adapters moved most, or None when none moved by as much as 0.005."""
        best: tuple[float, int] | None = None
        for i in range(self.same):
            p, base = self.moved(i)
            if base is not None and abs(p - base) >= 0.005 and (best is None or abs(p - base) > best[0]):
                best = (abs(p - base), i)
        return best[1] if best is not None else None

    def move_line(self) -> str:
        """The :meth:`largest_move` in words ("" when there is none)."""
        i = self.largest_move()
        if i is None:
            return ""
        p, base = self.moved(i)
        where = "before the replies part" if self.divergence is not None else "in the reply"
        return (
            f"Largest move {where}: token {i + 1} {self.adapted[i].text!r}, "
            f"base p={probability_text(base)} → with the adapter p={probability_text(p)}"
        )


def _tokens(n: int) -> str:
    return f"{n} token{'s' if n != 1 else ''}"


def probability_text(p: float | None) -> str:
    """A probability in two decimals, or in scientific notation below 0.01 (never a bare 0.00);
    "—" when unknown."""
    if p is None:
        return "—"
    return f"{p:.2f}" if p >= 0.01 or p == 0.0 else f"{p:.1e}"


def score_token(llm: Any, lc: Any, memory: Any, sequence: Sequence[int], at: int, token: int, params: Any) -> float:
    """The log-probability of ``token`` at position ``at`` of ``sequence`` (after its first ``at``
    tokens), with the model as its context now computes. Child side: the memory must hold a
    beginning of ``sequence`` (``llm.input_ids``) at least ``at - 1`` tokens long; it is cut to
    ``at - 1`` tokens and the one before ``at`` evaluated again, which gives its logits.

    Args:
        llm: the ``llama_cpp.Llama``.
        lc: the ``llama_cpp`` module.
        memory: the worker's ``engine.inference.seq_memory.SeqMemory``.
        sequence: the prompt and the reply so far.
        at: the position scored (at least 1).
        token: the token whose log-probability is wanted.
        params: the run's GenerationParams (its logit bias counts, as in ``Token.logprob``).
    """
    keep = at - 1
    settle(llm, memory, keep)
    llm.eval([int(sequence[keep])])
    return first_logprob(llm, lc, token, params)


def first_logprob(llm: Any, lc: Any, token: int, params: Any) -> float:
    """The log-probability of ``token`` after the last token evaluated (its logits are current),
    after the run's logit bias (child side)."""
    with ChainSampler(lc, llm, params.model_copy(update={"grammar": None, "json_schema": None}), 0) as sampler:
        logprob, _ = sampler.logprobs(-1, token, 0, str)
    return logprob
