"""llama.cpp's ``POST /tokenize`` and ``POST /detokenize``, over the model a request names.

``/tokenize``: ``content`` (text), ``add_special`` (a BOS first where the model wants one; default
false), ``parse_special`` (special tokens' text read as those tokens; default true), ``with_pieces``
(each token as ``{"id", "piece"}``, the piece its text, or its bytes as a list where they are not
whole UTF-8). ``/detokenize``: ``tokens`` (ids of the model's vocabulary) back to ``content``.
Glassbox also reads ``model`` (a model it serves; default the one it started with). Other fields
are ignored, as llama.cpp's server ignores them: none changes a token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.server import params as fields
from app.server.errors import HttpError, map_errors
from app.server.wire import text_limit

if TYPE_CHECKING:
    from app.server.exchange import Exchange

MAX_DETOKENIZE = 1 << 20
"""Most token ids one ``/detokenize`` may send."""


def _flag(body: dict[str, object], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise HttpError(400, f"'{name}' must be true or false", param=name)
    return value


def tokenize(handler: Exchange) -> None:
    """Answers ``POST /tokenize``."""
    state = handler.state
    body = fields.present(handler.read_json())
    wanted = state.check_model(body)
    content = body.get("content")
    if not isinstance(content, str):
        raise HttpError(400, "'content' must be a string", param="content")
    add_special = _flag(body, "add_special", False)
    parse_special = _flag(body, "parse_special", True)
    with_pieces = _flag(body, "with_pieces", False)
    limit = text_limit(state.n_ctx)
    if len(content) > limit:
        raise HttpError(400, f"'content' is longer than {limit} characters, the most allowed per request")
    if state.backend.local is None:
        raise HttpError(404, "this backend has no tokenizer", code="not_found")
    with handler.use_model(wanted):
        local = state.backend.local
        assert local is not None
        tokens = map_errors(lambda: local.tokenize(content, add_bos=add_special, special=parse_special))
        if not with_pieces:
            handler.send_json(200, {"tokens": tokens})
            return
        raw = map_errors(lambda: local.token_bytes(tokens))
    pieces: list[dict[str, object]] = []
    for token, data in zip(tokens, raw, strict=True):
        try:
            piece: object = data.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(data)  # part of a character: its bytes, as llama.cpp answers
        pieces.append({"id": token, "piece": piece})
    handler.send_json(200, {"tokens": pieces})


def detokenize(handler: Exchange) -> None:
    """Answers ``POST /detokenize``."""
    state = handler.state
    body = fields.present(handler.read_json())
    wanted = state.check_model(body)
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise HttpError(400, "'tokens' must be a list of token ids", param="tokens")
    if len(tokens) > MAX_DETOKENIZE:
        raise HttpError(400, f"'tokens' holds more than {MAX_DETOKENIZE} ids", param="tokens")
    if state.backend.local is None:
        raise HttpError(404, "this backend has no tokenizer", code="not_found")
    with handler.use_model(wanted):
        local = state.backend.local
        assert local is not None
        n_vocab = state.backend.n_vocab
        bad = next((t for t in tokens if t < 0 or (n_vocab is not None and t >= n_vocab)), None)
        if bad is not None:
            raise HttpError(400, f"token id {bad} is not in this model's vocabulary of {n_vocab}", param="tokens")
        raw = map_errors(lambda: local.token_bytes(tokens))
    handler.send_json(200, {"content": b"".join(raw).decode("utf-8", errors="replace")})
