"""The sampler the decode loop runs in the worker: llama.cpp's sampler chain, built from GenerationParams.

Contract: ARCHITECTURE.md, 'engine.inference.sampling'.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

from engine.errors import EngineError


class ChainSampler:
    """One reply's sampler chain in the worker.

    Args:
        lc: the ``llama_cpp`` module.
        llm: the ``llama_cpp.Llama`` whose vocabulary and context it samples from.
        params: the reply's GenerationParams (duck-typed: this module never imports engine.inference.runtime).
        seed: the seed of the random draw (when sampling).

    Raises:
        EngineError: the grammar or JSON schema does not compile (one line).
    """

    def __init__(self, lc: Any, llm: Any, params: Any, seed: int) -> None:
        self._lc = lc
        self._llm = llm
        self.n_vocab = int(llm.n_vocab())
        self.bias: dict[int, float] = {}
        for token_id, bias in params.logit_bias:
            if token_id >= self.n_vocab:
                raise EngineError(f"logit_bias: token id {token_id} is outside the vocabulary of {self.n_vocab}")
            self.bias[int(token_id)] = self.bias.get(int(token_id), 0.0) + float(bias)
        grammar = _grammar_text(params)
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        self._chain: Any = chain
        self._grammar: Any = None
        try:
            self._build(params, grammar, seed)
        except BaseException:
            self.close()
            raise
        self.constrained = grammar is not None
        if self.constrained:
            # Candidate arrays for sampling by hand (see sample): the whole vocabulary, and one.
            # lazy: start-up (+151 ms: numpy)
            import numpy as np

            self._data = (lc.llama_token_data * self.n_vocab)()
            self._view = np.ctypeslib.as_array(self._data)
            self._ids = np.arange(self.n_vocab, dtype=self._view["id"].dtype)
            self._one = (lc.llama_token_data * 1)()

    def _build(self, params: Any, grammar: str | None, seed: int) -> None:
        lc, chain = self._lc, self._chain
        frequency, presence = _penalty(params, "frequency_penalty"), _penalty(params, "presence_penalty")
        self._penalized = params.repeat_penalty != 1.0 or frequency != 0.0 or presence != 0.0
        if self._penalized:
            lc.llama_sampler_chain_add(
                chain,
                lc.llama_sampler_init_penalties(
                    self.n_vocab, self._llm.last_n_tokens_size, params.repeat_penalty, frequency, presence
                ),
            )
        if self.bias:
            array = (lc.llama_logit_bias * len(self.bias))()
            for slot, (token_id, bias) in zip(array, self.bias.items(), strict=True):
                slot.token, slot.bias = token_id, bias
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(self.n_vocab, len(self.bias), array))
        if grammar is not None:
            vocab = self._llm._model.vocab
            sampler, said = _with_stderr(lambda: lc.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root"))
            if not sampler:
                # lazy: start-up (+23 ms)
                from engine.inference.grammar_bounds import describe_parse_error

                what = "json_schema" if params.json_schema is not None else "grammar"
                reason = describe_parse_error(said, grammar) or "llama.cpp refused it (no reason given)"
                raise EngineError(f"{what}: {reason}")
            self._grammar = sampler  # kept out of the chain: see sample
        if params.temperature == 0.0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
            return
        mirostat = int(getattr(params, "mirostat", 0))
        if mirostat:
            # llama.cpp's order (common/sampling.cpp): the temperature, then Mirostat, which draws.
            tau, eta = float(params.mirostat_tau), float(params.mirostat_eta)
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temperature))
            if mirostat == 1:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_mirostat(self.n_vocab, seed, tau, eta, 100))
            else:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_mirostat_v2(seed, tau, eta))
            return
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(params.top_k))
        typical = float(getattr(params, "typical_p", 1.0))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_typical(typical, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(params.min_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temperature))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))

    def prime(self, prompt: Any) -> None:
        """Feeds the prompt's last tokens (the penalties' window) to the penalties, as llama.cpp's
        server does: a token the prompt holds counts as having occurred. Nothing else in the chain
        keeps state from accepted tokens (the grammar is kept apart)."""
        if not getattr(self, "_penalized", False):
            return
        window = int(self._llm.last_n_tokens_size)
        for token in list(prompt)[-window:] if window > 0 else []:
            self._lc.llama_sampler_accept(self._chain, int(token))

    def resume(self, reply: Any) -> None:
        """Takes the tokens of a reply begun elsewhere as generated: the grammar advances over them
        (the penalties saw them in the prompt), so the reply goes on where it stopped."""
        if self._grammar is None:
            return
        for token in reply:
            self._lc.llama_sampler_accept(self._grammar, int(token))

    def sample(self, idx: int) -> int:
        """Samples the token after row ``idx`` of the last batch's logits (-1: the last row) and
        accepts it into the chain (and the grammar)."""
        if self._grammar is None:
            return int(self._lc.llama_sampler_sample(self._chain, self._llm._ctx.ctx, idx))
        return self._sample_constrained(idx)

    def _sample_constrained(self, idx: int) -> int:
        """Grammar last, as llama.cpp's own samplers do: checking a grammar against the whole
        vocabulary costs ~100 ms a token with a 262k-token vocabulary, so the token is first
        sampled without it and kept if the grammar accepts it; only when it does not is the
        grammar applied to every candidate and the token sampled again. Under greedy decoding
        that is exactly the best token the grammar allows; under sampling, a token the grammar
        allows is drawn with its unconstrained probability, the rest renormalized."""
        lc = self._lc
        token = self._apply(idx, grammar=False)
        one = self._one
        one[0].id, one[0].logit, one[0].p = token, 1.0, 0.0
        single = lc.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        lc.llama_sampler_apply(self._grammar, ctypes.byref(single))
        if one[0].logit == float("-inf"):
            token = self._apply(idx, grammar=True)
        lc.llama_sampler_accept(self._grammar, token)
        lc.llama_sampler_accept(self._chain, token)
        return token

    def _apply(self, idx: int, grammar: bool) -> int:
        """Runs the chain (after the grammar, if ``grammar``) over row ``idx``; returns its choice."""
        # lazy: start-up (+134 ms: numpy)
        import numpy as np

        lc = self._lc
        pointer = lc.llama_get_logits_ith(self._llm._ctx.ctx, idx)
        logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        view = self._view
        view["id"] = self._ids
        view["logit"] = logits
        view["p"] = 0.0
        candidates = lc.llama_token_data_array(data=self._data, size=self.n_vocab, selected=-1, sorted=False)
        if grammar:
            lc.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        lc.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        if candidates.selected < 0:
            raise EngineError("sampling chose no token (the grammar allows none here)")
        return int(candidates.data[candidates.selected].id)

    def logprobs(self, idx: int, token: int, top: int, piece: Any) -> tuple[float, tuple[tuple[str, float], ...]]:
        """The log-probability of ``token`` at row ``idx`` and the ``top`` most likely tokens there.

        Args:
            idx: the row of the last batch's logits (-1: the last).
            token: the token that was chosen.
            top: how many alternatives (0..20).
            piece: ``piece(token_id) -> str``, a token's text.
        """
        # lazy: start-up (+120 ms: numpy)
        import numpy as np

        pointer = self._lc.llama_get_logits_ith(self._llm._ctx.ctx, idx)
        logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        row = logits.astype(np.float64)
        for token_id, bias in self.bias.items():
            row[token_id] += bias
        peak = float(np.max(row))
        log_z = peak + float(np.log(np.sum(np.exp(row - peak))))
        chosen = float(row[token]) - log_z
        alternatives: tuple[tuple[str, float], ...] = ()
        if top > 0:
            best = np.argpartition(-row, top - 1)[:top]
            best = best[np.argsort(-row[best], kind="stable")]
            alternatives = tuple((piece(int(t)), float(row[t]) - log_z) for t in best)
        return chosen, alternatives

    def close(self) -> None:
        """Frees the chain (and the samplers it owns)."""
        if self._chain is not None:
            self._lc.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            self._lc.llama_sampler_free(self._grammar)
            self._grammar = None

    def __enter__(self) -> ChainSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _penalty(params: Any, name: str) -> float:
    return float(getattr(params, name, 0.0))


def _grammar_text(params: Any) -> str | None:
    """The GBNF text the reply is constrained by, if any, within the limits of
    :mod:`engine.inference.grammar_bounds` (checked before the converter runs, and on what it made)."""
    # lazy: start-up (+19 ms)
    from engine.inference.grammar_bounds import check_grammar, check_json_schema

    if params.grammar is not None:
        check_grammar(str(params.grammar))
        return str(params.grammar)
    if params.json_schema is None:
        return None

    # lazy: heavy (llama_cpp)
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    check_json_schema(params.json_schema)
    unsupported = unsupported_keyword(json.loads(params.json_schema), "")
    if unsupported is not None:
        raise EngineError(f"json_schema: {unsupported} cannot be enforced by the grammar it is turned into")
    try:
        grammar = str(json_schema_to_gbnf(params.json_schema))
    except Exception as exc:  # noqa: BLE001 - the converter raises many kinds; the user needs one line
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EngineError(f"json_schema: it cannot be turned into a grammar ({reason})") from None
    check_grammar(grammar, "json_schema")
    return grammar


def _with_stderr(call: Any) -> tuple[Any, str]:
    """``call()``'s value and what native code wrote on file descriptor 2 meanwhile: llama.cpp prints
    a grammar's parse error there, and its log (a left-recursive rule) goes there through
    llama-cpp-python's callback, opened to every level for the call (WORKAROUND: llama-cpp-python maps
    ggml's ERROR level to DEBUG, so a quiet Llama drops llama.cpp's errors). Written on to the real
    stderr as well (its start: the worker's log keeps it)."""
    # lazy: start-up (+20 ms)
    import logging
    import tempfile

    sys.stderr.flush()
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    saved = os.dup(2)
    python_stderr = sys.stderr
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        # The log callback prints through sys.stderr, which need not be descriptor 2 (a test runner's).
        sys.stderr = open(capture.fileno(), "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        logger.setLevel(logging.DEBUG)
        try:
            value = call()
        finally:
            logger.setLevel(level)
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = python_stderr
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        said = capture.read(4 * 1024 * 1024)  # the reason, then the whole grammar (bounded by its limit)
    if said:
        os.write(2, said[:4096])  # the worker's log keeps what llama.cpp said (not a whole grammar)
    return value, said.decode("utf-8", "replace")


# What llama-cpp-python's JSON-schema-to-grammar converter enforces, and the annotations that need
# no enforcing. Anything else (minimum, multipleOf, uniqueItems, not, if/then, ...) would be
# silently ignored by it, and the reply could break the schema: it is refused instead.
ENFORCED_KEYWORDS = frozenset(
    {
        "type",
        "$ref",
        "oneOf",
        "anyOf",
        "allOf",
        "const",
        "enum",
        "properties",
        "additionalProperties",
        "required",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "pattern",
        "minLength",
        "maxLength",
        "format",
        "$defs",
        "definitions",
    }
)
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
ENFORCED_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
SCHEMA_LISTS = ("oneOf", "anyOf", "allOf", "prefixItems")
SCHEMA_MAPS = ("properties", "$defs", "definitions")


def unsupported_keyword(schema: object, where: str) -> str | None:
    """The first keyword of ``schema`` the grammar cannot enforce, as "'minimum' at properties.n"."""
    if not isinstance(schema, dict):
        return None
    at = f" at {where}" if where else ""
    for key, value in schema.items():
        if key not in ENFORCED_KEYWORDS and key not in _ANNOTATIONS:
            return f"{key!r}{at}"
        if key == "format" and value not in ENFORCED_FORMATS:
            return f"format {value!r}{at}"
    nested: list[tuple[object, str]] = []
    for key in SCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            nested.append((sub, f"{where}.{key}[{i}]".lstrip(".")))
    for key in SCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            nested.append((sub, f"{where}.{key}.{name}".lstrip(".")))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            nested.append((schema[key], f"{where}.{key}".lstrip(".")))
    for sub, path in nested:
        found = unsupported_keyword(sub, path)
        if found is not None:
            return found
    return None
