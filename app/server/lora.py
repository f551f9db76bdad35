"""llama.cpp's ``GET /lora-adapters`` and ``POST /lora-adapters``: the LoRA adapters the server
offers (``--lora FILE[:SCALE]`` and the library's adapters, at scale 0), each with its id and
scale; a POST sets the scales (``[{"id": 0, "scale": 0.5}, ...]``; an adapter not listed gets 0).
A request's own ``lora`` field replaces them for that request (:mod:`app.server.served`); an
adapter applies to the models it fits (``engine.lora.check_adapter``), switched in the model's
worker without a reload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.server.errors import HttpError

if TYPE_CHECKING:
    from app.server.exchange import Exchange


def listing(handler: Exchange) -> None:
    """Answers ``GET /lora-adapters``."""
    served = handler.state.served
    handler.send_json_value(200, served.adapter_documents() if served is not None else [])


def set_scales(handler: Exchange) -> None:
    """Answers ``POST /lora-adapters``."""
    served = handler.state.served
    body = handler.read_document()
    if served is None:
        raise HttpError(404, "this server serves the window's model: its adapters are the chat's", code="not_found")
    served.set_scales(body)
    handler.send_json_value(200, served.adapter_documents())
