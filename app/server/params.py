"""The request fields every generating endpoint shares, checked and turned into
:class:`~engine.inference.runtime.GenerationParams`.

Contract: ARCHITECTURE.md, 'app.server.params'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping

from pydantic import ValidationError

from app.server.errors import HttpError
from engine.inference import sampling
from engine.inference.runtime import GenerationParams

MAX_STOP_STRINGS = 16
"""Most stop strings per request (OpenAI allows 4)."""

MAX_STOP_CHARS = 256
"""Longest stop string, in characters."""

MAX_N = 16
"""Most choices one request may ask for (``n``); they are generated one after another."""

MAX_LOGIT_BIAS = 1024
"""Most entries in ``logit_bias`` (OpenAI allows 300)."""

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token (``top_logprobs``), OpenAI's own limit."""

MAX_GRAMMAR_CHARS = 256 * 1024
"""Longest GBNF grammar or JSON schema, in characters (building the grammar costs time in its size)."""

NEUTRAL: dict[str, tuple[object, ...]] = {
    "modalities": (["text"],),
    "best_of": (1,),
    "background": (False,),
}
"""Fields accepted only at the value that changes nothing (the server cannot honour any other)."""

LABELS = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key", "cache_prompt"})
"""Fields that label a request and change nothing in its output: accepted everywhere."""

NO_EFFECT: dict[str, str] = {
    "store": "this server stores no chat completions",
    "service_tier": "",
    "verbosity": "verbosity is a hint this server does not follow",
    "prediction": "",
    "prompt_cache_retention": "",
    "cache_control": "",
}
"""Fields clients send that change nothing in what this server answers, accepted where the endpoint
lists them: hints (``verbosity``), service and caching options (``service_tier``,
``prompt_cache_retention``, Anthropic's ``cache_control``: the KV cache is reused anyway), a
predicted output (``prediction``: it only speeds up a server that uses it), ``store`` on chat
completions (nothing is stored). The text, when there is one, is a warning sent with the answer
(the ``X-Glassbox-Warning`` header; :func:`no_effect_warnings`)."""

SAMPLING = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repeat_penalty",
        "frequency_penalty",
        "presence_penalty",
        "typical_p",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "seed",
        "stop",
        "logit_bias",
    }
)
"""The sampling fields :func:`generation_params` reads (``top_k``, ``min_p``, ``repeat_penalty``,
``typical_p`` and ``mirostat``/``mirostat_tau``/``mirostat_eta`` are llama.cpp's extensions)."""

PENALTIES_AND_SAMPLERS = (
    "frequency_penalty",
    "presence_penalty",
    "typical_p",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
)

CONSTRAINTS = frozenset({"response_format", "grammar", "json_schema"})
"""The constrained-output fields :func:`constraint` reads."""


def present(body: Mapping[str, object]) -> dict[str, object]:
    """``body`` without its ``null`` fields (``null`` means "not given")."""
    return {key: value for key, value in body.items() if value is not None}


def check_fields(
    body: Mapping[str, object], known: Collection[str], endpoint: str, no_effect: Collection[str] = ()
) -> None:
    """Refuses fields this endpoint does not implement.

    Args:
        body: the request body, without its nulls.
        known: the fields the endpoint reads.
        endpoint: its path, for the message.
        no_effect: the fields of :data:`NO_EFFECT` this endpoint accepts.

    Raises:
        HttpError: 400 naming the first field that is unknown, or given at a value the server
            cannot honour (``param`` is the field).
    """
    for key, value in body.items():
        if key in known or key in LABELS:
            continue
        if key in no_effect:
            _check_no_effect(key, value)
            continue
        if key in NEUTRAL:
            if value in NEUTRAL[key]:
                continue
            allowed = " or ".join(json.dumps(v) for v in NEUTRAL[key])
            raise HttpError(
                400,
                f"'{key}' is not supported by this server (only {allowed}, which changes nothing)",
                code="unsupported_parameter",
                param=key,
            )
        raise HttpError(
            400,
            f"{endpoint} does not support the field {key[:64]!r}; remove it",
            code="unsupported_parameter",
            param=key[:64],
        )


def _check_no_effect(key: str, value: object) -> None:
    """The shape of a field accepted with no effect (a wrong type is still a 400)."""
    shapes: dict[str, tuple[type, ...]] = {
        "store": (bool,),
        "service_tier": (str,),
        "verbosity": (str,),
        "prediction": (dict,),
        "prompt_cache_retention": (str,),
        "cache_control": (dict,),
    }
    if not isinstance(value, shapes.get(key, (object,))):
        raise HttpError(400, f"'{key}' has the wrong type", code="invalid_value", param=key)
    if key == "verbosity" and value not in ("low", "medium", "high"):
        raise HttpError(400, "'verbosity' must be low, medium or high", code="invalid_value", param=key)


def no_effect_warnings(body: Mapping[str, object], no_effect: Collection[str]) -> list[str]:
    """The warnings for the fields of ``body`` accepted with no effect (``store`` only when true)."""
    warnings = []
    for key in no_effect:
        text = NO_EFFECT.get(key, "")
        if key in body and text and (key != "store" or body[key] is True):
            warnings.append(f"{key}: {text}")
    return warnings


def max_tokens(body: Mapping[str, object], *names: str) -> object:
    """The first of ``names`` the body gives (so ``max_completion_tokens: null`` leaves ``max_tokens``)."""
    for name in names:
        if body.get(name) is not None:
            return body[name]
    return None


def stop_strings(body: Mapping[str, object]) -> tuple[str, ...] | None:
    """``stop`` as a tuple, checked against :data:`MAX_STOP_STRINGS` and :data:`MAX_STOP_CHARS`.

    Raises:
        HttpError: 400 for too many or too long strings, or a value that is not strings.
    """
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise HttpError(400, "'stop' must be a string or a list of strings", code="invalid_value", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise HttpError(
            400, f"'stop' has {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed", code="invalid_value"
        )
    for index, string in enumerate(stop):
        if len(string) > MAX_STOP_CHARS:
            raise HttpError(
                400,
                f"stop[{index}] is {len(string)} characters long; at most {MAX_STOP_CHARS} are allowed",
                code="invalid_value",
            )
    return tuple(stop)


def logit_bias(body: Mapping[str, object], n_vocab: int | None) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` (``{"token id": bias}``, bias in -100..100) as (id, bias) pairs.

    Raises:
        HttpError: 400 for a key that is not a token id of this model, or a bias out of range.
    """
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise HttpError(
            400, "'logit_bias' must be an object of token id: bias", code="invalid_value", param="logit_bias"
        )
    if len(bias) > MAX_LOGIT_BIAS:
        raise HttpError(400, f"'logit_bias' has more than {MAX_LOGIT_BIAS} entries", code="invalid_value")
    pairs: list[tuple[int, float]] = []
    for key, value in bias.items():
        token = key.strip()
        if not token.isdigit() or len(token) > 9:
            raise HttpError(
                400, f"logit_bias: {key[:32]!r} is not a token id", code="invalid_value", param="logit_bias"
            )
        token_id = int(token)
        if n_vocab is not None and token_id >= n_vocab:
            raise HttpError(
                400,
                f"logit_bias: token id {token_id} is not in this model's vocabulary of {n_vocab}",
                code="invalid_value",
                param="logit_bias",
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise HttpError(
                400, f"logit_bias[{token_id}]: the bias must be a number from -100 to 100", code="invalid_value"
            )
        # OpenAI: -100 bans the token; the engine bans with -inf.
        pairs.append((token_id, -math.inf if value <= -100 else float(value)))
    return tuple(pairs)


def constraint(body: Mapping[str, object]) -> dict[str, str]:
    """The ``grammar`` or ``json_schema`` a request asks for, as GenerationParams fields.

    Raises:
        HttpError: 400 for an unknown ``response_format`` type, a ``json_schema`` without its
            schema, two constraints at once, or one over :data:`MAX_GRAMMAR_CHARS`.
    """
    found: dict[str, str] = {}
    response_format = body.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict):
            raise HttpError(400, "'response_format' must be an object", code="invalid_value", param="response_format")
        kind = response_format.get("type")
        if kind == "json_object":
            found["json_schema"] = '{"type": "object"}'
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise HttpError(
                    400,
                    "response_format.json_schema.schema must be a JSON schema object",
                    code="invalid_value",
                    param="response_format.json_schema.schema",
                )
            found["json_schema"] = json.dumps(schema)
        elif kind != "text":
            raise HttpError(
                400,
                f"response_format.type {str(kind)[:40]!r} is not supported (text, json_object, json_schema)",
                code="invalid_value",
                param="response_format.type",
            )
    for name in ("grammar", "json_schema"):
        value = body.get(name)
        if value is None:
            continue
        if name == "json_schema" and isinstance(value, dict):
            value = json.dumps(value)
        if not isinstance(value, str) or not value.strip():
            raise HttpError(400, f"'{name}' must be non-empty text", code="invalid_value", param=name)
        if found:
            raise HttpError(
                400,
                f"'{name}' cannot be combined with another output constraint ({', '.join(sorted(found))})",
                code="invalid_value",
                param=name,
            )
        found[name] = value
    for name, value in found.items():
        if len(value) > MAX_GRAMMAR_CHARS:
            raise HttpError(400, f"'{name}' is longer than {MAX_GRAMMAR_CHARS} characters", code="invalid_value")
    if "json_schema" in found:
        _check_enforceable(found["json_schema"], "response_format" if response_format is not None else "json_schema")
    return found


def _check_enforceable(schema_text: str, param: str) -> None:
    """Refuses a schema the grammar cannot enforce (``minimum``, ``multipleOf``, ...) before the model
    is touched: the decode loop would refuse it only after the prompt, mid-stream.

    Raises:
        HttpError: 400 naming the keyword and where it is.
    """

    # WORKAROUND: the engine's check has no public name yet (engine/inference/sampling.py); the decode loop
    # runs the same check, so a miss here still ends as a 400 (errors.REQUEST_FIELDS).
    find = getattr(sampling, "unsupported_keyword", None) or getattr(sampling, "_unsupported_keyword", None)
    if find is None:
        return
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return  # GenerationParams says why
    unsupported = find(schema, "")
    if unsupported is not None:
        raise HttpError(
            400,
            f"json_schema: {unsupported} cannot be enforced by the grammar it is turned into; remove it",
            code="invalid_value",
            param=param,
        )


def generation_params(
    body: Mapping[str, object], max_new: object, n_vocab: int | None, **extra: int
) -> GenerationParams:
    """The GenerationParams of a request: sampling, ``max_new`` tokens, constraint, ``extra``.

    Raises:
        HttpError: 400 naming the field GenerationParams refuses.
    """

    options: dict[str, object] = {
        "max_tokens": max_new,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "top_k": body.get("top_k"),
        "min_p": body.get("min_p"),
        "repeat_penalty": body.get("repeat_penalty"),
        **{name: body.get(name) for name in PENALTIES_AND_SAMPLERS},
        "seed": body.get("seed"),
        "stop": stop_strings(body),
        "logit_bias": logit_bias(body, n_vocab) or None,
        **constraint(body),
        **extra,
    }
    try:
        return GenerationParams.model_validate({k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "request"
        param = where if where != "request" else None
        raise HttpError(
            400, f"{where}: {first.get('msg', 'invalid value')}", code="invalid_value", param=param
        ) from None


def choices(body: Mapping[str, object]) -> int:
    """``n``: how many choices (1 when absent or null).

    Raises:
        HttpError: 400 for anything but an integer from 1 to :data:`MAX_N`.
    """
    n = body.get("n", 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise HttpError(400, f"'n' must be an integer from 1 to {MAX_N}", code="invalid_value", param="n")
    return n


def flag(body: Mapping[str, object], name: str) -> bool:
    """A boolean field (false when absent).

    Raises:
        HttpError: 400 when it is not a boolean.
    """
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise HttpError(400, f"'{name}' must be true or false", code="invalid_value", param=name)
    return value


def seeded(params: GenerationParams, index: int) -> GenerationParams:
    """The params of choice ``index``: a given seed becomes ``seed + index``, so choices differ yet
    repeat from one run to the next."""
    if index == 0 or params.seed is None:
        return params
    return params.model_copy(update={"seed": params.seed + index})
