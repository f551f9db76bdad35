"""Safe, bounded inspection of GGUF model files.

This reader never trusts the file. It is pure Python (not the ``gguf`` package, which memory-maps
the file and trusts its counts), it never recurses, it caps every count and length before acting
on it, it checks every offset and size against the file's real size with exact integer arithmetic,
and it never loads tensor data. Large arrays (a 262,144-token vocabulary) are walked, not
materialised: only small scalars, the chat template and a few token strings (BOS/EOS) are kept.

Contract: ARCHITECTURE.md, 'engine.gguf'.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from engine.errors import ModelFileError
from engine.gguf_file import describe_non_gguf, open_model_file, os_error
from engine.gguf_format import (
    FILE_TYPE_GUESSED,
    FILE_TYPE_NAMES,
    GGML_TYPES,
    LLAMA_CPP_ARCHITECTURES,
    NOT_CHAT_ARCHITECTURES,
    SUPPORTED_VERSIONS,
    T_ARRAY,
    T_STRING,
    VALUE_TYPES,
)
from engine.gguf_reader import (
    MAX_STRING_LEN,
    TOKEN_CHECKPOINT_EVERY,
    HeaderReader,
    Malformed,
    StringArray,
    Truncated,
)

__all__ = [
    "MAX_CHAT_TEMPLATE_BYTES",
    "GgufHeaderNeedsMoreBytes",
    "GgufInfo",
    "parse_gguf_prefix",
    "read_gguf_info",
    "unsupported_reason",
]

_P = TypeVar("_P", bound="_Parser")  # a header parser (subclasses keep more than GgufInfo)

# Caps. Real models stay far below each; a file above one is rejected as malformed before the
# reader allocates or loops on the count it claims.
MAX_KV = 1 << 13  # real models have under 200 keys
MAX_TENSORS = 1 << 16
MAX_KEY_LEN = (1 << 16) - 1
MAX_ARRAY_LEN = 1 << 24
MAX_TENSOR_NAME = 63  # GGML_MAX_NAME (64) including the terminating NUL
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ALIGNMENT = 1 << 20
MAX_BLOCK_COUNT = 512
MAX_INT64 = (1 << 63) - 1
MAX_PLAUSIBLE_BYTES = 1 << 50
METADATA_STRING_CHARS = 256
MAX_KEPT_STRING_BYTES = 4 * METADATA_STRING_CHARS + 3  # always decodes to >= METADATA_STRING_CHARS chars
MAX_CHAT_TEMPLATE_BYTES = 64 << 10  # real templates are 1-17 KB; engine.inference.templates refuses longer ones too
MAX_METADATA_BYTES = 16 << 20  # keys + kept values + template + kept arrays (8 bytes an entry); real: < 1 MiB
MAX_ARRAY_STRINGS = 1 << 21  # strings walked in all; real: vocabulary + merges, under 700,000
MAX_KEPT_ARRAY_ITEMS = 1 << 16  # integer/float/bool array entries kept in all; real: a few per-layer arrays
SMALL_ARRAY_LEN = 4096  # integer/bool arrays up to this length are kept (per-layer head counts)

_BLOCK_RE = re.compile(r"blk\.(\d+)\.")
_ARCH_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

Scalar = str | int | float | bool


class GgufHeaderNeedsMoreBytes(ModelFileError):
    """Raised by :func:`parse_gguf_prefix` when the header reaches past the bytes it was given.

    Args:
        path: the file or URL the prefix came from.
        needed: how many leading bytes of the file are needed (at least).
    """

    def __init__(self, path: Path | str, needed: int) -> None:
        self.needed = needed
        super().__init__(path, f"the header needs at least {needed} bytes; fetch more of the file")


@dataclass(frozen=True)
class GgufInfo:
    """What the header says about a model, without loading it.

    ``layer_bytes[i]`` is the size of the tensors of block ``i`` (``blk.i.*``); ``other_bytes`` is
    everything else (token embedding, output norm and head). ``expert_bytes`` is the part of
    ``tensor_bytes`` in mixture-of-experts tensors (``*_exps``), of which only
    ``expert_used_count / expert_count`` is read per token. ``notes`` says what the reader left
    out because the file broke one of its limits (a chat template too long to keep, arrays past the
    budget of kept entries), one line each.
    """

    path: Path
    file_size: int
    version: int
    architecture: str
    name: str | None
    n_params: int
    n_layers: int | None
    n_heads: int | None
    n_kv_heads: int | None
    head_dim_k: int | None
    head_dim_v: int | None
    embedding_length: int | None
    context_length: int | None
    sliding_window: int | None
    file_type: str
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    n_tensors: int
    tensor_data_offset: int
    tensor_bytes: int
    layer_bytes: list[int]
    other_bytes: int
    expert_count: int | None
    metadata: dict[str, Scalar]
    expert_used_count: int | None = None
    expert_bytes: int = 0
    embedding_bytes: int = 0
    tied_embeddings: bool = False
    vocab_size: int | None = None
    kv_heads_per_layer: list[int] | None = None
    sliding_window_pattern: list[bool] | None = None
    alignment: int = 32
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_chat_template(self) -> bool:
        """Whether the file carries its own chat template."""
        return bool(self.chat_template)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as strings)."""
        out = asdict(self)
        out["path"] = str(self.path)
        out["has_chat_template"] = self.has_chat_template
        out.pop("extra", None)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GgufInfo:
        """Rebuilds an instance from :meth:`to_dict` output (e.g. a cache).

        Raises:
            TypeError, ValueError, KeyError: the dict is not a well-formed ``to_dict`` result.
        """
        names = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["path"] = Path(str(data["path"]))
        if not isinstance(kwargs.get("layer_bytes"), list) or not isinstance(kwargs.get("metadata"), dict):
            raise ValueError("layer_bytes and metadata must be a list and a dict")
        for key in ("file_size", "n_params", "tensor_bytes", "n_tensors", "other_bytes"):
            if not isinstance(kwargs.get(key), int):
                raise TypeError(f"{key} must be an integer")
        notes = kwargs.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise TypeError("notes must be a list of strings")
        return cls(**kwargs)


_TensorRow = tuple[str, int, int, int]  # name, element count, ggml type, data bytes


def read_gguf_info(path: Path | str) -> GgufInfo:
    """Reads and checks a GGUF file's header, without loading any tensor data.

    Args:
        path: the ``.gguf`` file.

    Returns:
        What the header says (see :class:`GgufInfo`).

    Raises:
        ModelFileError: the file is missing, unreadable, not GGUF, malformed or incomplete; its
            ``reason`` says which, in one line.
    """
    return _read_file(Path(path), _Parser)[0]


def _read_file(path: Path, parser_class: type[_P]) -> tuple[GgufInfo, _P]:
    """Reads and checks the header of the file at ``path`` with a ``parser_class`` parser (one
    that keeps more than :class:`GgufInfo` subclasses :class:`_Parser`); returns the info and the
    parser. Raises ModelFileError naming ``path``, as :func:`read_gguf_info`."""
    try:
        fh = open_model_file(path)
    except ModelFileError as exc:
        raise ModelFileError(path, exc.reason) from None
    try:
        with fh:
            return _parse(fh, os.fstat(fh.fileno()).st_size, path, prefix_only=False, parser_class=parser_class)
    except OSError as exc:
        raise os_error(path, exc) from None


def parse_gguf_prefix(prefix: bytes, file_size: int, source: Path | str) -> GgufInfo:
    """Parses a GGUF header from the first bytes of a (remote) file, e.g. an HTTP range request.

    Tensor data is not checked (it is not there); everything in the header is, against the real
    ``file_size``.

    Args:
        prefix: the first bytes of the file.
        file_size: the whole file's size (from the server).
        source: a name for messages (URL or repo/file).

    Raises:
        GgufHeaderNeedsMoreBytes: the header goes past ``prefix``; ``needed`` says how far (at
            least; call again with more).
        ModelFileError: the header is bad.
    """

    return _parse(
        io.BytesIO(prefix), file_size, Path(str(source)), prefix_only=True, prefix_len=len(prefix), parser_class=_Parser
    )[0]


def _parse(
    fh: BinaryIO,
    file_size: int,
    path: Path,
    *,
    prefix_only: bool,
    prefix_len: int | None = None,
    parser_class: type[_P],
) -> tuple[GgufInfo, _P]:
    head = fh.read(4096)
    fh.seek(0)
    reason = describe_non_gguf(head, file_size)
    if reason is not None:
        raise ModelFileError(path, reason)
    limit = file_size if prefix_len is None else min(file_size, prefix_len)
    parser = parser_class(HeaderReader(fh, limit), path, file_size, prefix_only)
    try:
        return parser.parse(), parser
    except Truncated as exc:
        if prefix_len is not None and prefix_len < file_size and exc.needed <= file_size:
            raise GgufHeaderNeedsMoreBytes(path, exc.needed) from None
        raise ModelFileError(path, _incomplete(file_size, exc.needed, header=True)) from None
    except Malformed as exc:
        raise ModelFileError(path, f"model file is malformed: {exc}") from None


def _incomplete(have: int, need: int, *, header: bool) -> str:
    of = f"{have} of at least {need}" if header else f"{have} of {need}"
    return f"model file is incomplete ({of} bytes): download it again"


class _Parser:
    """One pass over header, key/values and tensor infos."""

    def __init__(self, reader: HeaderReader, path: Path, file_size: int, prefix_only: bool) -> None:
        self.r = reader
        self.path = path
        self.file_size = file_size
        self.prefix_only = prefix_only
        self.scalars: dict[str, Scalar] = {}
        self.small_arrays: dict[str, list[int | float | bool]] = {}
        self.string_arrays: dict[str, StringArray] = {}
        self.array_lengths: dict[str, int] = {}
        self.array_types: dict[str, int] = {}
        self.chat_template: str | None = None
        self.seen_keys: set[str] = set()
        self.notes: list[str] = []
        self.held = 0  # bytes of metadata held (MAX_METADATA_BYTES)
        self.strings_walked = 0  # strings of string arrays walked (MAX_ARRAY_STRINGS)
        self.kept_items = 0  # array entries kept (MAX_KEPT_ARRAY_ITEMS)
        self.skipped_arrays = 0  # arrays not kept because the budget of kept entries was spent

    # -- header and key/values -------------------------------------------------------------
    def parse(self) -> GgufInfo:
        r = self.r
        r.skip(4)  # magic, already checked
        version = r.u32()
        if version not in SUPPORTED_VERSIONS:
            raise ModelFileError(self.path, _version_reason(version))
        n_tensors = r.u64()
        n_kv = r.u64()
        if n_tensors > MAX_TENSORS:
            raise Malformed(f"it claims {n_tensors} tensors (limit {MAX_TENSORS})")
        if n_kv > MAX_KV:
            raise Malformed(f"it claims {n_kv} metadata keys (limit {MAX_KV})")
        for _ in range(n_kv):
            self._read_kv()
        if self.skipped_arrays:
            self.notes.append(
                f"{self.skipped_arrays} metadata arrays were not kept: the header holds more than "
                f"{MAX_KEPT_ARRAY_ITEMS} array entries in all"
            )
        arch = self.scalars.get("general.architecture")
        split_no = self.scalars.get("split.no")
        if arch is None and isinstance(split_no, int) and split_no > 0:
            arch = ""  # parts 2.. of a split model carry only split.* keys (gguf-split)
        elif not isinstance(arch, str) or not arch:
            raise Malformed("general.architecture is missing")
        elif not _ARCH_RE.fullmatch(arch):
            raise Malformed(f"general.architecture {arch[:40]!r} is not a valid name")
        self._check_tokenizer()
        alignment = self._alignment()
        tensors = self._read_tensor_infos(n_tensors, alignment)
        data_offset = _align(r.pos, alignment)
        return self._build(version, arch, alignment, tensors, data_offset)

    def _read_kv(self) -> None:
        r = self.r
        key = r.string(MAX_KEY_LEN, "a metadata key")
        if not key:
            raise Malformed("a metadata key is empty")
        if key in self.seen_keys:
            raise Malformed(f"duplicate metadata key {key!r}")
        self.seen_keys.add(key)
        self._hold(len(key))  # str length: a close enough count of what the key costs
        vtype = r.u32()
        if vtype not in VALUE_TYPES:
            raise Malformed(f"metadata key {key!r} has invalid type {vtype}")
        if vtype == T_ARRAY:
            self._read_array(key)
        elif vtype == T_STRING and key == "tokenizer.chat_template":
            self._read_template()
        elif vtype == T_STRING:
            value, _length = r.string_prefix(MAX_KEPT_STRING_BYTES, MAX_STRING_LEN, f"metadata key {key!r}")
            self._hold(len(value))
            self.scalars[key] = value
        else:
            self.scalars[key] = r.scalar(vtype)

    def _read_template(self) -> None:
        """The chat template, kept only up to MAX_CHAT_TEMPLATE_BYTES (a longer one is noted)."""
        r = self.r
        length = r.u64()
        if length > MAX_STRING_LEN:
            what, limit = "metadata key 'tokenizer.chat_template'", MAX_STRING_LEN
            raise Malformed(f"{what} claims a string of {length} bytes (limit {limit})")
        if length > MAX_CHAT_TEMPLATE_BYTES:
            r.skip(length)
            self.notes.append(
                f"tokenizer.chat_template is {length} bytes, over the {MAX_CHAT_TEMPLATE_BYTES}-byte limit: "
                "not kept (a built-in chat format is used)"
            )
            return
        self.chat_template = r.raw(length).decode("utf-8", errors="replace")
        self._hold(len(self.chat_template))

    def _hold(self, n: int) -> None:
        self.held += n
        if self.held > MAX_METADATA_BYTES:
            raise Malformed(
                f"its metadata needs more than {MAX_METADATA_BYTES >> 20} MiB to hold "
                "(a real model's needs well under 1 MiB)"
            )

    def _read_array(self, key: str) -> None:
        r = self.r
        etype = r.u32()
        if etype not in VALUE_TYPES:
            raise Malformed(f"array {key!r} has invalid element type {etype}")
        if etype == T_ARRAY:
            raise Malformed(f"array {key!r} contains arrays (not supported)")
        count = r.u64()
        if count > MAX_ARRAY_LEN:
            raise Malformed(f"array {key!r} claims {count} entries (limit {MAX_ARRAY_LEN})")
        self.array_lengths[key] = count
        self.array_types[key] = etype
        if etype == T_STRING:
            if self.strings_walked + count > MAX_ARRAY_STRINGS:
                raise Malformed(
                    f"array {key!r} claims {count} strings, past the {MAX_ARRAY_STRINGS} strings a header may "
                    f"hold in all ({self.strings_walked} before it)"
                )
            self.strings_walked += count
            marks = r.skip_strings(count, key)
            self.string_arrays[key] = StringArray(count, marks)
            self._hold(8 * len(marks))
            return
        size = VALUE_TYPES[etype][1]
        if count > SMALL_ARRAY_LEN:
            r.skip(count * size)
        elif self.kept_items + count > MAX_KEPT_ARRAY_ITEMS:
            self.skipped_arrays += 1
            r.skip(count * size)
        else:
            self.kept_items += count
            self._hold(8 * count)
            self.small_arrays[key] = r.scalars(etype, count)

    def _check_tokenizer(self) -> None:
        """Wrongly typed tokenizer arrays abort llama.cpp (a failed type assertion): refuse them."""
        expected = {"tokens": T_STRING, "merges": T_STRING, "scores": 6, "token_type": 5}
        for name, etype in expected.items():
            key = f"tokenizer.ggml.{name}"
            if key in self.scalars or (key in self.array_types and self.array_types[key] != etype):
                raise Malformed(f"{key} must be an array of {VALUE_TYPES[etype][0]}")
        n_tokens = self.array_lengths.get("tokenizer.ggml.tokens")
        for name in ("scores", "token_type"):
            count = self.array_lengths.get(f"tokenizer.ggml.{name}")
            if count is not None and count != n_tokens:
                raise Malformed(f"tokenizer.ggml.{name} has {count} entries for {n_tokens} tokens")

    def _alignment(self) -> int:
        if "general.alignment" not in self.scalars:
            return 32
        value = self.scalars["general.alignment"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise Malformed("general.alignment is not an integer")
        if value <= 0 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise Malformed(f"general.alignment {value} is not a power of two up to {MAX_ALIGNMENT}")
        return value

    # -- tensors ------------------------------------------------------------------------------
    def _read_tensor_infos(self, n_tensors: int, alignment: int) -> list[_TensorRow]:
        """Returns (name, n_elements, type, nbytes) per tensor, checking offsets as it goes."""
        r = self.r
        seen: set[str] = set()
        out: list[_TensorRow] = []
        expected_offset = 0
        for _ in range(n_tensors):
            name = r.string(MAX_TENSOR_NAME * 4, "a tensor name")
            if len(name.encode()) > MAX_TENSOR_NAME:
                raise Malformed(f"tensor name {name[:40]!r}... is longer than {MAX_TENSOR_NAME} bytes")
            if name in seen:
                raise Malformed(f"duplicate tensor {name!r}")
            seen.add(name)
            n_dims = r.u32()
            if n_dims > MAX_DIMS:
                raise Malformed(f"tensor {name!r} has {n_dims} dimensions (limit {MAX_DIMS})")
            dims = [r.u64() for _ in range(n_dims)]
            n_elements = 1
            for d in dims:
                if d == 0 or d > MAX_INT64:
                    raise Malformed(f"tensor {name!r} has an invalid dimension {d}")
                n_elements *= d
                if n_elements > MAX_INT64:
                    raise Malformed(f"tensor {name!r} has a shape whose size overflows ({dims})")
            ttype = r.u32()
            if ttype not in GGML_TYPES:
                raise Malformed(f"tensor {name!r} has an invalid type {ttype}")
            tname, block, block_bytes = GGML_TYPES[ttype]
            if dims and dims[0] % block:
                raise Malformed(f"tensor {name!r} row of {dims[0]} is not a multiple of the {tname} block")
            nbytes = n_elements // block * block_bytes
            offset = r.u64()
            if offset % alignment:
                raise Malformed(f"tensor {name!r} data offset {offset} is not aligned to {alignment}")
            if offset != expected_offset:
                raise Malformed(f"tensor {name!r} data offset {offset} should be {expected_offset}")
            expected_offset = offset + _align(nbytes, alignment)
            if expected_offset > MAX_PLAUSIBLE_BYTES:  # a lie, not a cut: no model is a petabyte
                raise Malformed(f"tensor {name!r} claims data up to byte {expected_offset}")
            out.append((name, n_elements, ttype, nbytes))
        return out

    def _check_data(self, tensors: list[_TensorRow], data_offset: int, alignment: int) -> int:
        """Returns the end of the last tensor's data; raises if it is past the file's end."""
        end = self.r.pos
        offset = 0
        for _name, _n, _t, nbytes in tensors:
            end = data_offset + offset + nbytes
            offset += _align(nbytes, alignment)
        if end > self.file_size and not self.prefix_only:
            raise ModelFileError(self.path, _incomplete(self.file_size, end, header=False))
        return end

    # -- result ---------------------------------------------------------------------------------
    def _int(self, key: str) -> int | None:
        value = self.scalars.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            values = self.small_arrays.get(key)
            ints = [v for v in values or [] if isinstance(v, int) and not isinstance(v, bool)]
            return max(ints) if ints else None
        return value

    def _build(self, version: int, arch: str, alignment: int, tensors: list[_TensorRow], data_offset: int) -> GgufInfo:
        self._check_data(tensors, data_offset, alignment)
        n_layers = self._int(f"{arch}.block_count")
        if n_layers is not None and not 0 <= n_layers <= MAX_BLOCK_COUNT:
            raise Malformed(f"{arch}.block_count is {n_layers} (limit {MAX_BLOCK_COUNT})")
        layer_bytes: list[int] = [0] * (n_layers or 0)
        other = expert = embedding = 0
        type_bytes: dict[int, int] = {}
        n_params = 0
        names: set[str] = set()
        for name, n_elements, ttype, nbytes in tensors:
            names.add(name)
            n_params += n_elements
            type_bytes[ttype] = type_bytes.get(ttype, 0) + nbytes
            if "_exps" in name:
                expert += nbytes
            if name == "token_embd.weight":
                embedding = nbytes
            m = _BLOCK_RE.match(name)
            if m is None:
                other += nbytes
                continue
            index = int(m.group(1))
            if index >= MAX_BLOCK_COUNT or (n_layers is not None and index >= n_layers):
                raise Malformed(f"tensor {name!r} belongs to block {index}, beyond the block count")
            if index >= len(layer_bytes):
                layer_bytes.extend([0] * (index + 1 - len(layer_bytes)))
            layer_bytes[index] += nbytes
        n_heads = self._int(f"{arch}.attention.head_count")
        n_kv_heads = self._int(f"{arch}.attention.head_count_kv")
        if n_kv_heads is None and n_heads is not None:
            n_kv_heads = n_heads
        embd = self._int(f"{arch}.embedding_length")
        per_head = embd // n_heads if embd and n_heads else None
        head_k = self._int(f"{arch}.attention.key_length") or per_head
        head_v = self._int(f"{arch}.attention.value_length") or per_head
        ftype_value = self._int("general.file_type")
        if ftype_value is not None and ftype_value != FILE_TYPE_GUESSED:
            file_type = FILE_TYPE_NAMES.get(ftype_value, f"type {ftype_value}")
        elif type_bytes:
            file_type = GGML_TYPES[max(type_bytes, key=lambda t: type_bytes[t])][0]
        else:
            file_type = "unknown"
        kv_layers = self.small_arrays.get(f"{arch}.attention.head_count_kv")
        pattern = self.small_arrays.get(f"{arch}.attention.sliding_window_pattern")
        tokens = self.string_arrays.get("tokenizer.ggml.tokens")
        cut = METADATA_STRING_CHARS
        model_name = self.scalars.get("general.name")
        metadata = {k: v[:cut] if isinstance(v, str) else v for k, v in self.scalars.items()}
        return GgufInfo(
            path=self.path,
            file_size=self.file_size,
            version=version,
            architecture=arch,
            name=model_name[:cut] if isinstance(model_name, str) else None,
            n_params=n_params,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim_k=head_k,
            head_dim_v=head_v,
            embedding_length=embd,
            context_length=self._int(f"{arch}.context_length"),
            sliding_window=self._int(f"{arch}.attention.sliding_window"),
            file_type=file_type,
            chat_template=self.chat_template,
            bos_token=self._token("tokenizer.ggml.bos_token_id"),
            eos_token=self._token("tokenizer.ggml.eos_token_id"),
            n_tensors=len(tensors),
            tensor_data_offset=data_offset,
            tensor_bytes=sum(t[3] for t in tensors),
            layer_bytes=layer_bytes,
            other_bytes=other,
            expert_count=self._int(f"{arch}.expert_count"),
            metadata=metadata,
            expert_used_count=self._int(f"{arch}.expert_used_count"),
            expert_bytes=expert,
            embedding_bytes=embedding,
            tied_embeddings="output.weight" not in names,
            vocab_size=tokens.count if tokens else None,
            kv_heads_per_layer=[int(v) for v in kv_layers] if kv_layers and len(kv_layers) > 1 else None,
            sliding_window_pattern=[bool(v) for v in pattern] if pattern and len(pattern) > 1 else None,
            alignment=alignment,
            notes=list(self.notes),
            extra={"array_lengths": dict(self.array_lengths)},
        )

    def _token(self, id_key: str) -> str | None:
        """The token string for the id in ``id_key``, walking at most one checkpoint's strings."""
        token_id = self._int(id_key)
        tokens = self.string_arrays.get("tokenizer.ggml.tokens")
        if token_id is None or tokens is None or not 0 <= token_id < tokens.count:
            return None
        r = self.r
        saved = r.pos
        try:
            r.pos = tokens.marks[token_id // TOKEN_CHECKPOINT_EVERY]
            for _ in range(token_id % TOKEN_CHECKPOINT_EVERY):
                r.skip(r.u64())
            text, _length = r.string_prefix(MAX_KEPT_STRING_BYTES, MAX_STRING_LEN, "a token")
        except Truncated:
            return None
        finally:
            r.pos = saved
        return text[:METADATA_STRING_CHARS]


def unsupported_reason(info: GgufInfo) -> str | None:
    """Why the bundled llama.cpp cannot chat with this model, or None when it can.

    The header itself may be perfectly valid: this is about the engine (issue M4 in
    ROBUSTNESS.md), so :func:`read_gguf_info` does not raise for it.
    """
    arch = info.architecture
    if arch in NOT_CHAT_ARCHITECTURES:
        return f"this is {NOT_CHAT_ARCHITECTURES[arch]}, not a model to chat with"
    if arch not in LLAMA_CPP_ARCHITECTURES:
        return f"model needs a newer engine (architecture {arch!r}, GGUF v{info.version})"
    return None


def _version_reason(version: int) -> str:
    if version == 1:
        return "GGUF v1 is too old, not supported: convert the model again with a current llama.cpp"
    if version == 0:
        return "model file is malformed: GGUF version 0"
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if swapped in (1, 2, 3):
        return f"this is a big-endian GGUF (v{swapped}), not supported on this machine"
    if version < 1000:
        return f"model needs a newer engine (GGUF v{version})"
    return f"model file is malformed: GGUF version {version}"


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment
