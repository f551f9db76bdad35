"""Comparing a speculative greedy reply with plain greedy decoding, token by token, to its end.

llama.cpp's CPU arithmetic depends on the shape of the batch a token is evaluated in (single-token
steps and batches of 2 to 13 tokens gave logits up to 3.4 apart on the starter model, though the
gap between the two most likely tokens moves far less), so a speculative reply, whose drafts are
verified in batches, may pick the other of two nearly tied tokens and go on from there. Such a
reply is still a greedy reply of the model: every one of its tokens is the most likely one, or
within the noise of it, given the tokens before it. A logic error (a draft kept that the model
did not choose) shows as a token far from the most likely one. :func:`divergences` walks the
whole reply: where it leaves plain decoding, the gap is measured, and plain decoding is run again
from the speculative reply's own prefix, to the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.inference.events import Token

NEAR_TIE_NATS = 1.0
"""The most two tokens' log-probabilities may differ where a speculative greedy reply leaves plain
decoding (the tests accepted 1.5 before it was measured). Measured: between single-token steps and
batches of 2 to 13 tokens and of a whole reply, the gap between the two most likely tokens moved by
at most 0.94 nats (p99 0.49) over 3,456 positions of the starter model's replies to five kinds of
prompt (zen4 CPU code), so a flip needs a gap below that. ``tests/bench/bench_speculative.py``
measures it again on every run and fails when it exceeds this bound."""

ALTERNATIVES = 5
"""Top log-probabilities asked for in the reruns: enough to find the speculative reply's token."""


@dataclass(frozen=True)
class Divergence:
    """Where a speculative reply left plain greedy decoding of its own prefix."""

    index: int  # the token's position in the reply
    gap: float  # log-probability of plain's choice minus that of the speculative reply's token
    plain: str  # plain decoding's token there
    fast: str  # the speculative reply's


def _generate(worker: Any, tokens: list[int], params: Any) -> list[Token]:
    out: list[Token] = []
    gen = worker.generate(tokens, params)
    while True:
        try:
            event = next(gen)
        except StopIteration:
            return out
        if isinstance(event, Token) and event.token_id >= 0:
            out.append(event)


def divergences(worker: Any, prompt: Sequence[int], fast: Sequence[Token], params: Any) -> list[Divergence]:
    """Every token of ``fast`` (a speculative greedy reply to ``prompt``, with its token ids) where
    plain greedy decoding of the prompt and the reply so far would have chosen another token.

    Args:
        worker: an ``InferenceWorker`` with the model.
        prompt: the prompt's tokens.
        fast: the speculative reply's tokens (``Token.token_id``).
        params: the reply's GenerationParams (greedy; ``speculative`` and ``logprobs`` are replaced).

    Returns:
        The divergences, in order (empty: ``fast`` is plain greedy decoding's reply).
    """
    plain_params = params.model_copy(update={"speculative": "off", "logprobs": ALTERNATIVES})
    ids = [t.token_id for t in fast]
    found: list[Divergence] = []
    start = 0
    while start < len(ids):
        budget = plain_params.model_copy(update={"max_tokens": len(ids) - start})
        plain = _generate(worker, [*prompt, *ids[:start]], budget)
        offset = next(
            (i for i, (a, b) in enumerate(zip(plain, ids[start:], strict=False)) if a.token_id != b),
            min(len(plain), len(ids) - start),
        )
        index = start + offset
        if index >= len(ids):
            break  # the rest is plain decoding's
        if offset >= len(plain):
            # Plain decoding ended here (end of generation) where the speculative reply went on.
            rerun = _generate(worker, [*prompt, *ids[:index]], budget.model_copy(update={"max_tokens": 1}))
            top = rerun[0].top_logprobs if rerun else ()
            chosen = "<end>"
        else:
            top = plain[offset].top_logprobs
            chosen = plain[offset].text
        mine = fast[index].text
        theirs = dict(top)
        best = top[0][1] if top else 0.0
        gap = best - theirs[mine] if mine in theirs else float("inf")  # not even among the top few
        found.append(Divergence(index, gap, chosen, mine))
        start = index + 1
    return found
