"""``GET /v1/models`` and ``GET /v1/models/{id}``: the chat models served (and the embedding model),
each saying whether it is loaded; and what only Glassbox answers about them: ``GET /glassbox/ps``
(the resident models, their memory, their idle time and why models left) and ``POST
/glassbox/unload`` (``{"model": NAME}`` or ``{"all": true}``), which ``glassbox ps`` and
``glassbox unload`` call.

With the models the server owns, every chat model of the library is listed, the one loaded or not
(``loaded``, and llama.cpp's ``status.value``, ``loaded`` or ``unloaded``), and each alias as an
entry of its own naming its model (``alias_of``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import unquote

from app.server import params as fields
from app.server.errors import HttpError, model_not_found
from engine.inference.pool import ModelBusy

if TYPE_CHECKING:
    from app.server.exchange import Exchange


def _entry(handler: Exchange, model_id: str, *, loaded: bool, **more: object) -> dict[str, object]:
    document: dict[str, object] = {
        "id": model_id,
        "object": "model",
        "created": handler.state.created,
        "owned_by": "glassbox",
        "loaded": loaded,
        "status": {"value": "loaded" if loaded else "unloaded"},
    }
    document.update(more)
    return document


def _documents(handler: Exchange) -> list[dict[str, object]]:
    state = handler.state
    served = state.served
    data: list[dict[str, object]] = []
    if served is None:
        data.append(_entry(handler, state.model_id, loaded=True, context_length=state.n_ctx))
    else:
        pool = served.pool
        for name in served.names():
            session = pool.session(name) if pool.is_resident(name) else None
            extra: dict[str, object] = {}
            if session is not None and session.n_ctx:
                extra["context_length"] = session.n_ctx
            data.append(_entry(handler, name, loaded=session is not None, **extra))
        for alias, target in served.aliases.items():
            data.append(_entry(handler, alias, loaded=pool.is_resident(target), alias_of=target))
    if state.embedder_id is not None:
        data.append(_entry(handler, state.embedder_id, loaded=state.embedder_loaded))
    return data


def listing(handler: Exchange) -> None:
    """Answers ``GET /v1/models``."""
    handler.send_json(200, {"object": "list", "data": _documents(handler)})


def one(handler: Exchange, model_id: str) -> None:
    """Answers ``GET /v1/models/{id}``: the model (loaded or not), or 404 ``model_not_found``."""
    wanted = unquote(model_id)
    for document in _documents(handler):
        if document["id"] == wanted:
            handler.send_json(200, document)
            return
    raise model_not_found(wanted, f"the model {wanted[:200]!r} does not exist here")


def ps(handler: Exchange) -> None:
    """Answers ``GET /glassbox/ps``: the resident models, the budget, and why models left."""
    served = handler.state.served
    if served is None:
        raise HttpError(404, "this server serves the window's model: it has no model pool", code="not_found")
    pool = served.pool
    handler.send_json(
        200,
        {
            "models": [r.to_dict() for r in pool.resident()],
            "memory_budget": pool.budget,
            "max_resident": pool.settings.max_resident,
            "evictions": [e.to_dict() for e in pool.evictions()],
        },
    )


def unload(handler: Exchange) -> None:
    """Answers ``POST /glassbox/unload``: ``{"model": NAME}`` (a name or an alias) or ``{"all": true}``."""
    served = handler.state.served
    body = fields.present(handler.read_json())
    fields.check_fields(body, {"model", "all"}, "/glassbox/unload")
    if served is None:
        raise HttpError(404, "this server serves the window's model: it has no model pool", code="not_found")
    if body.get("all") is True:
        handler.send_json(200, {"unloaded": served.pool.unload_all("unloaded by request (glassbox unload --all)")})
        return
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise HttpError(400, "give 'model' (a name) or 'all': true", param="model")
    target = served.aliases.get(name, name)
    if served.path_of(target) is None:
        raise model_not_found(name, f"the model {name[:200]!r} does not exist here")
    try:
        done = served.pool.unload(target, "unloaded by request (glassbox unload)")
    except ModelBusy as exc:
        raise HttpError(409, str(exc), code="model_busy", param="model") from None
    handler.send_json(200, {"unloaded": [target] if done else []})


def load(handler: Exchange) -> None:
    """Answers llama.cpp's ``POST /models/load`` (``{"model": NAME}``): loads it now, as a request
    naming it would, and says whether it is resident."""
    state = handler.state
    body = fields.present(handler.read_json())
    fields.check_fields(body, {"model"}, "/models/load")
    if state.served is None:
        raise HttpError(404, "this server serves the window's model: it has no model pool", code="not_found")
    if not isinstance(body.get("model"), str):
        raise HttpError(400, "give 'model' (a name)", param="model")
    wanted = state.check_model(body)
    with handler.use_model(wanted):
        pass
    handler.send_json(200, {"success": True, "model": state.model_id, "loaded": True})
