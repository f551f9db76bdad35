"""LoRA adapters on a loaded model: loaded once, applied, rescaled and removed without a reload.

The parent says which adapters a turn runs with (:class:`LoraAdapter`, a file and a scale); the
worker (:class:`AdapterSlots`) loads each file once with ``llama_adapter_lora_init`` (it stays
loaded while the model is, so switching back costs nothing) and sets the set on the context with
``llama_set_adapters_lora``. An adapter at scale 0 is kept loaded but not set on the context:
the model computes exactly as the base does.

What the KV cache holds was computed with the adapters of its turn, so a change of the set or of a
scale empties it; the next turn's result says how many of its tokens the cache would have kept and
what reading them again cost (:class:`Recompute`). The file's fit to the model is checked from both
headers before anything is loaded (:func:`engine.lora.check_adapter`).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.lora import check_adapter

__all__ = ["AdapterSlots", "LoraAdapter", "Recompute", "adapters_label"]

MAX_ADAPTERS = 16
"""Most adapters one model may have loaded at once."""
MAX_SCALE = 100.0
"""The largest scale (in absolute value) an adapter may be given."""


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter and its scale (picklable: it crosses to the worker)."""

    path: Path
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.scale) or abs(self.scale) > MAX_SCALE:
            raise EngineError(f"{self.path}: an adapter's scale must be a number from -{MAX_SCALE:g} to {MAX_SCALE:g}")

    @property
    def label(self) -> str:
        """``name:scale`` (what Stats and a log line show)."""
        return f"{self.path.name}:{self.scale:g}"


def adapters_label(adapters: Sequence[LoraAdapter]) -> str:
    """The adapters a turn ran with, as one line ("" for the base model alone)."""
    return ", ".join(a.label for a in adapters if a.scale != 0)


@dataclass(frozen=True)
class Recompute:
    """What a change of adapters cost the turn after it.

    Attributes:
        tokens: the prompt tokens the KV cache would have kept, read again.
        ms: the share of the prefill those tokens took.
    """

    tokens: int = 0
    ms: float = 0.0


class AdapterSlots:
    """The worker's adapters for one ``llama_cpp.Llama`` (runs in the inference worker).

    Args:
        llama_cpp: the bindings module.
        llm: the loaded model.
        log_line: reads llama.cpp's last error line (its log goes to a file), for a refusal that
            the header check did not foresee.
    """

    def __init__(self, llama_cpp: Any, llm: Any, log_line: Any = None) -> None:
        self._lc = llama_cpp
        self._llm = llm
        self._log_line = log_line
        self._loaded: dict[Path, Any] = {}
        self.active: tuple[LoraAdapter, ...] = ()
        self.invalidated: list[int] | None = None  # the tokens the cache held when a change emptied it

    @property
    def loaded(self) -> tuple[Path, ...]:
        """The adapter files loaded on this model (applied or not)."""
        return tuple(self._loaded)

    def apply(self, adapters: Sequence[LoraAdapter]) -> bool:
        """Runs the next turns with ``adapters`` (an empty list: the base model). Loads the files
        not loaded yet; empties the KV cache when what the context computes changes.

        Returns:
            Whether the context's adapters changed.

        Raises:
            ModelFileError, AdapterMismatch: a file is not an adapter, or not one for this model.
            EngineError: llama.cpp refused a file, or too many adapters.
        """
        wanted = tuple(a for a in adapters if a.scale != 0)
        seen = {a.path for a in adapters}
        if len(seen) != len(list(adapters)):
            raise EngineError("the same adapter is listed twice")
        if len(set(self._loaded) | seen) > MAX_ADAPTERS:
            raise EngineError(f"at most {MAX_ADAPTERS} adapters may be loaded on one model")
        for adapter in adapters:
            self._load(adapter.path)
        if wanted == self.active:
            return False
        llm = self._llm
        if wanted:
            pointers = (self._lc.llama_adapter_lora_p_ctypes * len(wanted))(*(self._loaded[a.path] for a in wanted))
            scales = (ctypes.c_float * len(wanted))(*(a.scale for a in wanted))
            status = self._lc.llama_set_adapters_lora(llm._ctx.ctx, pointers, len(wanted), scales)
        else:
            status = self._lc.llama_set_adapters_lora(llm._ctx.ctx, None, 0, None)
        if status != 0:
            raise EngineError(f"llama.cpp could not apply the adapters ({adapters_label(wanted)}): status {status}")
        self.active = wanted
        held = int(llm.n_tokens)
        if held:
            self.invalidated = llm.input_ids[:held].tolist()
        llm._ctx.kv_cache_clear()
        llm.n_tokens = 0
        return True

    def _load(self, path: Path) -> None:
        if path in self._loaded:
            return
        check_adapter(path, Path(self._llm.model_path))
        pointer = self._lc.llama_adapter_lora_init(self._llm.model, str(path).encode("utf-8"))
        if not pointer:
            said = self._log_line() if self._log_line is not None else None
            raise EngineError(f"{path}: llama.cpp could not load the adapter ({said or 'see its log'})")
        self._loaded[path] = pointer

    def recompute(self, tokens: Sequence[int], prefilled: int, prefill_ms: float) -> Recompute:
        """What the last change of adapters cost this turn (then forgotten): the tokens of
        ``tokens`` the emptied cache held, as a share of the ``prefilled`` tokens' ``prefill_ms``."""
        held, self.invalidated = self.invalidated, None
        if not held or prefilled <= 0:
            return Recompute()
        common = 0
        for a, b in zip(held, tokens, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, prefilled, len(tokens) - 1)
        if common <= 0:
            return Recompute()
        return Recompute(common, round(prefill_ms * common / prefilled, 2))
