"""The models ``glassbox serve`` serves when it owns them: every chat model of the library by name
(and the aliases given), resident in a model pool (``engine.inference.pool``), several at once.

A request names a model; :meth:`ServedModels.resolve` says which (an alias is its target; an
unknown name is a 404 unless a default model for unknown names was set). :meth:`ServedModels.lease`
holds that model for the request (loading it if needed; 503 with ``Retry-After`` past its queue)
with the LoRA adapters the request asks for. A request's ``keep_alive`` (a number of seconds or a
duration such as ``"5m"``; 0 unloads the model after the reply, a negative number keeps it) is
read by :func:`keep_alive_of`, as Ollama reads it.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from app.server.errors import HttpError, http_error_for, model_not_found, overloaded
from engine.errors import Cancelled, EngineError
from engine.inference.adapters import LoraAdapter
from engine.inference.pool import KEEP_DEFAULT, ModelBusy, ModelPool, UnknownModel
from engine.lora import check_adapter

if TYPE_CHECKING:
    from engine.inference.session import ChatSession

KEEP_ALIVE_HEADER = "X-Glassbox-Keep-Alive"
"""A request's keep_alive may come as this header instead of a body field."""
_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_ADAPTER_SCALE = 100.0


class ModelCatalog(Protocol):
    """The chat models a request may name (the CLI passes the library's)."""

    def find(self, name: str) -> Path | None:
        """The chat model file called ``name`` (a name, never a path), or None."""
        ...

    def names(self) -> list[str]:
        """The ids of the chat models offered, for ``/v1/models``."""
        ...


def keep_alive_of(value: object, where: str = "keep_alive") -> float | None:
    """A request's ``keep_alive``: seconds (0: unload after the reply), None to keep the model
    loaded (a negative value), :data:`~engine.inference.pool.KEEP_DEFAULT` when not given.

    Raises:
        HttpError: 400 for anything but a number or a duration (``"30s"``, ``"5m"``, ``"1h"``).
    """
    if value is None:
        return KEEP_DEFAULT
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match is not None:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds is None or seconds != seconds or abs(seconds) > 10**9:
        raise HttpError(
            400, f"'{where}' must be a number of seconds or a duration such as \"5m\" (negative: keep it loaded)",
            param="keep_alive",
        )  # fmt: skip
    return None if seconds < 0 else seconds


@dataclass
class AdapterSlot:
    """One LoRA adapter the server offers (``GET /lora-adapters``): its id is its index."""

    path: Path
    scale: float  # the server's scale, which a request's ``lora`` field replaces for that request

    def to_dict(self, index: int) -> dict[str, object]:
        return {"id": index, "path": str(self.path), "scale": self.scale}


class ServedModels:
    """The pool of the models a server owns, their names and aliases, and the adapters it offers.

    Args:
        pool: the model pool (its sessions are ``ChatSession``).
        catalog: the library's chat models.
        first: the name and file of the model the server started with (served to requests that
            name no model).
        aliases: other names for catalog models (``gpt-4o`` -> a model's name).
        default_model: the model for names the server does not know (None: a 404).
        adapters: the LoRA adapters offered, with their starting scales.
    """

    def __init__(
        self,
        pool: ModelPool[ChatSession],
        catalog: ModelCatalog,
        first: tuple[str, Path],
        *,
        aliases: Mapping[str, str] | None = None,
        default_model: str | None = None,
        adapters: Sequence[LoraAdapter] = (),
    ) -> None:
        self.pool = pool
        self.catalog = catalog
        self.first = first
        self.aliases = dict(aliases or {})
        self.default_model = default_model
        self.adapters = [AdapterSlot(a.path, a.scale) for a in adapters]
        self._fits: dict[tuple[Path, Path], str | None] = {}  # (adapter, model) -> why not, or None
        self._lock = threading.Lock()

    # names ----------------------------------------------------------------------------------
    def path_of(self, name: str) -> Path | None:
        """The file of the model ``name`` (the first one, or a catalog model; never a path)."""
        if name == self.first[0]:
            return self.first[1]
        if "/" in name or "\\" in name:
            return None
        return self.catalog.find(name)

    def names(self) -> list[str]:
        """The models offered, the first one first (aliases apart)."""
        out = [self.first[0]]
        out.extend(n for n in self.catalog.names() if n not in out)
        return out

    def resolve(self, name: str | None) -> str:
        """The model a request naming ``name`` gets.

        Raises:
            HttpError: 404 ``model_not_found`` for a name not served (and no default model).
        """
        if not name:
            return self.first[0]
        target = self.aliases.get(name, name)
        if self.path_of(target) is not None:
            return target
        if self.default_model is not None:
            return self.default_model
        offered = ", ".join(self.names()[:8])
        raise model_not_found(name, f"the model {name[:200]!r} does not exist here; this server serves {offered}")

    # requests -------------------------------------------------------------------------------
    def session(self, name: str) -> ChatSession:
        """The session of ``name`` without loading it (for what a request checks first)."""
        try:
            return self.pool.session(name)
        except UnknownModel:
            raise model_not_found(name, f"the model {name[:200]!r} does not exist here") from None
        except EngineError as exc:
            raise http_error_for(exc) from None

    @contextlib.contextmanager
    def lease(
        self,
        name: str,
        cancel: threading.Event,
        keep_alive: float | None = KEEP_DEFAULT,
        lora: object = None,
    ) -> Iterator[ChatSession]:
        """Holds ``name`` for one request, loaded, with the request's adapters (``lora``: llama.cpp's
        per-request field, a list of ``{"id", "scale"}``; adapters not listed get scale 0).

        Raises:
            HttpError: 503 with ``Retry-After`` (the model's queue is full or the wait was too long,
                or the server is stopping), 404 for an unknown model, 400 for a bad ``lora``
                field or an adapter that does not fit the model, the load's own error.
        """
        scales = self._scales(lora)
        with contextlib.ExitStack() as stack:
            try:
                session = stack.enter_context(self.pool.lease(name, cancel=cancel, keep_alive=keep_alive))
            except ModelBusy as exc:
                raise overloaded(str(exc), exc.retry_after_s) from None
            except UnknownModel:
                raise model_not_found(name, f"the model {name[:200]!r} does not exist here") from None
            except Cancelled:
                raise HttpError(503, "the server is shutting down", "server_error") from None
            except EngineError as exc:
                raise http_error_for(exc) from None
            self._apply(session, scales, explicit=lora is not None)
            yield session

    def _scales(self, lora: object) -> list[float]:
        with self._lock:
            if lora is None:
                return [slot.scale for slot in self.adapters]
        return parse_lora(lora, len(self.adapters))

    def _apply(self, session: ChatSession, scales: list[float], *, explicit: bool) -> None:
        model = session.load_params.model_path
        chosen: list[LoraAdapter] = []
        for slot, scale in zip(self.adapters, scales, strict=True):
            if scale == 0:
                continue
            why = self._fit(slot.path, model)
            if why is not None:
                if explicit:
                    raise HttpError(400, f"lora: {why}", code="invalid_value", param="lora")
                continue  # the server's own scales apply to the models each adapter fits
            chosen.append(LoraAdapter(slot.path, scale))
        try:
            session.set_adapters(chosen)
        except EngineError as exc:
            raise HttpError(400, f"lora: {exc}", code="invalid_value", param="lora") from None

    def _fit(self, adapter: Path, model: Path) -> str | None:
        key = (adapter, model)
        with self._lock:
            if key in self._fits:
                return self._fits[key]
        try:
            check_adapter(adapter, model)
            why = None
        except EngineError as exc:
            why = str(exc)
        with self._lock:
            self._fits[key] = why
        return why

    # /lora-adapters -------------------------------------------------------------------------
    def adapter_documents(self) -> list[dict[str, object]]:
        with self._lock:
            return [slot.to_dict(index) for index, slot in enumerate(self.adapters)]

    def set_scales(self, body: object) -> None:
        """``POST /lora-adapters``: the server's scales (adapters not listed: 0, as llama.cpp)."""
        scales = parse_lora(body, len(self.adapters), where="the body")
        with self._lock:
            for slot, scale in zip(self.adapters, scales, strict=True):
                slot.scale = scale


def parse_lora(value: object, count: int, where: str = "lora") -> list[float]:
    """llama.cpp's adapter list, ``[{"id": 0, "scale": 0.5}, ...]``, as one scale per adapter.

    Raises:
        HttpError: 400 for anything else, an unknown id, or a scale out of range.
    """
    if not isinstance(value, list):
        raise HttpError(400, f'{where} must be a list of {{"id", "scale"}} objects', param="lora")
    scales = [0.0] * count
    for item in value:
        if not isinstance(item, dict) or set(item) - {"id", "scale"} or "id" not in item:
            raise HttpError(400, f'{where}: each adapter is {{"id": N, "scale": X}}', param="lora")
        index, scale = item["id"], item.get("scale", 1.0)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise HttpError(400, f"{where}: no adapter with id {index!r} (GET /lora-adapters lists them)", param="lora")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not abs(scale) <= MAX_ADAPTER_SCALE:
            raise HttpError(400, f"{where}: a scale is a number from -100 to 100", param="lora")
        scales[index] = float(scale)
    return scales
