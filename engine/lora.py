"""LoRA adapters as GGUF files: what one is, which base it names, and whether it fits a base model.

A GGUF adapter (``general.type = adapter``, ``adapter.type = lora``: what llama.cpp's
``convert_lora_to_gguf.py`` writes) holds, for each base tensor it changes, two low-rank matrices
``<tensor>.lora_a`` (``ne = [n_in, rank]``) and ``<tensor>.lora_b`` (``ne = [rank, n_out]``);
llama.cpp adds ``scale * alpha / rank * B(A x)`` to that tensor's product (``scale`` alone when
the file has no alpha). :func:`check_adapter` applies llama.cpp's own checks
(``llama_adapter_lora_init`` in the pinned ``src/llama-adapter.cpp``: the type, the architecture,
every pair complete, every base tensor present, the shapes) to both headers before a worker loads
anything, so a mismatch is one line naming both files, not a line in llama.cpp's log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError, ModelFileError
from engine.gguf import GgufInfo
from engine.gguf_tensors import TensorShape, read_tensor_shapes
from engine.library import adapter_base_name

__all__ = [
    "AdapterInfo",
    "AdapterMismatch",
    "adapter_from_header",
    "check_adapter",
    "check_adapter_header",
    "fitting_adapters",
    "is_adapter",
    "read_adapter",
]

Pairs = dict[str, tuple[TensorShape | None, TensorShape | None]]

_NORM_SUFFIX = "_norm.weight"  # llama.cpp skips the norm vectors mergekit adds


class AdapterMismatch(EngineError):
    """An adapter that does not fit the model it was applied to.

    Args:
        adapter: the adapter file.
        base: the model file.
        reason: one line saying what differs.
    """

    def __init__(self, adapter: Path, base: Path, reason: str) -> None:
        self.adapter, self.base, self.reason = Path(adapter), Path(base), reason
        super().__init__(f"{self.adapter}: does not fit {self.base}: {reason}")


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter's header says.

    Attributes:
        path: the file.
        architecture: the base architecture it was made for (``general.architecture``).
        alpha: ``adapter.lora.alpha`` (0: none; the scale is then used as it is).
        rank: the rank of its first pair (None: no pairs).
        targets: the base tensors it changes, in file order.
        base_model: the base model the file names (its model card's ``base_model``), or None.
        name: ``general.name``, or None.
        size: the file's size in bytes.
    """

    path: Path
    architecture: str
    alpha: float
    rank: int | None
    targets: tuple[str, ...]
    base_model: str | None
    name: str | None
    size: int


def is_adapter(info: GgufInfo) -> bool:
    """Whether a header is an adapter's (``general.type = adapter``), not a model's."""
    return info.metadata.get("general.type") == "adapter"


def _pairs(path: Path, shapes: list[TensorShape]) -> dict[str, tuple[TensorShape | None, TensorShape | None]]:
    pairs: dict[str, tuple[TensorShape | None, TensorShape | None]] = {}
    for shape in shapes:
        if shape.name.endswith(".lora_a"):
            base = shape.name.removesuffix(".lora_a")
            pairs[base] = (shape, pairs.get(base, (None, None))[1])
        elif shape.name.endswith(".lora_b"):
            base = shape.name.removesuffix(".lora_b")
            pairs[base] = (pairs.get(base, (None, None))[0], shape)
        elif not shape.name.endswith(_NORM_SUFFIX):
            raise ModelFileError(path, f"adapter tensor {shape.name!r} is neither a .lora_a nor a .lora_b")
    return pairs


def _read(path: Path) -> tuple[AdapterInfo, Pairs]:
    info, shapes = read_tensor_shapes(path)
    return adapter_from_header(path, info, shapes)


def adapter_from_header(path: Path, info: GgufInfo, shapes: list[TensorShape]) -> tuple[AdapterInfo, Pairs]:
    """What an adapter's header says, and its pairs by base tensor, from a header already read
    (a local file's, or the first bytes of one on the Hub before it is downloaded).

    Raises:
        ModelFileError: a model rather than an adapter, an adapter that is not a LoRA, or a pair
            missing one of its matrices.
    """
    kind = info.metadata.get("general.type")
    if kind != "adapter":
        raise ModelFileError(path, f"not a LoRA adapter (general.type is {kind or 'model'!r}): a model file")
    adapter_type = info.metadata.get("adapter.type")
    if adapter_type != "lora":
        raise ModelFileError(path, f"an adapter of type {adapter_type!r}, not a LoRA")
    pairs = _pairs(path, shapes)
    for name, (a, b) in pairs.items():
        if a is None or b is None:
            missing = "lora_a" if a is None else "lora_b"
            raise ModelFileError(path, f"the LoRA pair of {name!r} is missing its {missing}")
    first = next(iter(pairs.values()), (None, None))[0]
    alpha = info.metadata.get("adapter.lora.alpha", 0.0)
    return (
        AdapterInfo(
            path=path,
            architecture=info.architecture,
            alpha=float(alpha) if isinstance(alpha, (int, float)) else 0.0,
            rank=first.dims[1] if first is not None and len(first.dims) > 1 else None,
            targets=tuple(pairs),
            base_model=adapter_base_name(info),
            name=info.name,
            size=info.file_size,
        ),
        pairs,
    )


def read_adapter(path: Path | str) -> AdapterInfo:
    """Reads an adapter's header.

    Raises:
        ModelFileError: not GGUF, a bad header, a model rather than an adapter, an adapter that is
            not a LoRA, or a pair missing one of its matrices (one line naming the file).
    """
    return _read(Path(path))[0]


def _dims(shape: TensorShape) -> str:
    return "x".join(str(d) for d in shape.dims[:2])


def check_adapter(adapter: Path | str, base: Path | str) -> AdapterInfo:
    """Checks that ``adapter`` fits the model ``base`` as llama.cpp will check it on load.

    Returns:
        The adapter's header.

    Raises:
        ModelFileError: either file is not what it should be (see :func:`read_adapter`).
        AdapterMismatch: the adapter was made for another model (the architecture, a tensor the
            model lacks, or a shape), one line naming both files.
    """
    adapter, base = Path(adapter), Path(base)
    info, pairs = _read(adapter)
    model, shapes = read_tensor_shapes(base)
    check_adapter_header(info, pairs, base, model, shapes)
    return info


def check_adapter_header(
    info: AdapterInfo, pairs: Pairs, base: Path, model: GgufInfo, shapes: list[TensorShape]
) -> None:
    """:func:`check_adapter` on headers already read: ``info`` and ``pairs`` from
    :func:`adapter_from_header`, ``model`` and ``shapes`` the model ``base``'s.

    Raises:
        ModelFileError: ``base`` is an adapter too.
        AdapterMismatch: the adapter was made for another model (one line naming both).
    """
    adapter = info.path
    if model.metadata.get("general.type") == "adapter":
        raise ModelFileError(base, "this is a LoRA adapter, not a model to apply one to")
    if info.architecture != model.architecture:
        raise AdapterMismatch(
            adapter, base, f"it is for the {info.architecture} architecture, the model is {model.architecture}"
        )
    tensors = {shape.name: shape for shape in shapes}
    for name, (a, b) in pairs.items():
        assert a is not None and b is not None
        target = tensors.get(name)
        if target is None:
            raise AdapterMismatch(adapter, base, f"it changes {name}, which the model does not have")
        a_dims, b_dims, t_dims = (*a.dims, 1), (*b.dims, 1), (*target.dims, 1)
        if name.endswith("token_embd.weight"):  # A and B are flipped there (llm_build_inp_embd)
            fits = t_dims[0] == b_dims[1] and t_dims[1] == a_dims[1]
        else:
            fits = t_dims[0] == a_dims[0] and t_dims[1] == b_dims[1]
        if not fits:
            raise AdapterMismatch(
                adapter,
                base,
                f"{name} is {_dims(target)} in the model, the adapter's pair is for "
                f"{a_dims[0]}x{b_dims[1]} (lora_a {_dims(a)}, lora_b {_dims(b)})",
            )
        if not name.endswith("token_embd.weight") and a_dims[1] != b_dims[0]:
            raise AdapterMismatch(adapter, base, f"{name}: lora_a {_dims(a)} and lora_b {_dims(b)} differ in rank")


def fitting_adapters(adapters: Sequence[Path], base: Path) -> list[Path]:
    """Of ``adapters``, those that fit the model ``base`` (:func:`check_adapter`), in order."""
    fitting = []
    for adapter in adapters:
        try:
            check_adapter(adapter, base)
        except EngineError:
            continue
        fitting.append(adapter)
    return fitting
