"""``GET /v1/models`` and ``GET /v1/models/{id}``: the chat model served (and the embedding model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.server.errors import model_not_found

if TYPE_CHECKING:
    from app.server.handler import Handler


def _documents(handler: Handler) -> list[dict[str, object]]:
    state = handler.state
    data: list[dict[str, object]] = [
        {
            "id": state.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "glassbox",
            "context_length": state.n_ctx,
        }
    ]
    if state.catalog is not None:
        first = state.first_model_id
        for name in ([first] if first != state.model_id else []) + state.catalog.names():
            if name != state.model_id and name not in [d["id"] for d in data]:
                data.append({"id": name, "object": "model", "created": state.created, "owned_by": "glassbox"})
    if state.embedder_id is not None:
        data.append({"id": state.embedder_id, "object": "model", "created": state.created, "owned_by": "glassbox"})
    return data


def listing(handler: Handler) -> None:
    """Answers ``GET /v1/models``."""
    handler.send_json(200, {"object": "list", "data": _documents(handler)})


def one(handler: Handler, model_id: str) -> None:
    """Answers ``GET /v1/models/{id}``: the model, or 404 ``model_not_found``."""
    from urllib.parse import unquote

    wanted = unquote(model_id)
    for document in _documents(handler):
        if document["id"] == wanted:
            handler.send_json(200, document)
            return
    raise model_not_found(wanted, f"the model {wanted[:200]!r} does not exist here")
