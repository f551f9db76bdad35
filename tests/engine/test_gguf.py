"""The bounded GGUF reader: real files parse, every malformed shape gets its own one-line error."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf_fixtures import (
    ARRAY,
    F16,
    F32,
    FLOAT32,
    INT32,
    Q4_0,
    STRING,
    TEMPLATE,
    UINT32,
    build,
    default_kvs,
    default_tensors,
    gstr,
    kv,
    tensor_info,
    u32,
    u64,
    write_with_gguf_package,
)

from engine.errors import ModelFileError
from engine.gguf import (
    GgufHeaderNeedsMoreBytes,
    parse_gguf_prefix,
    read_gguf_info,
    unsupported_reason,
)
from engine.gguf_file import describe_non_gguf, sniff_model_file


# ------------------------------------------------------------------ valid files
@pytest.mark.model
def test_starter_model_header(starter_model: Path) -> None:
    info = read_gguf_info(starter_model)
    assert info.architecture == "gemma3"
    assert info.version == 3
    # Exact figures, cross-checked once against gguf.GGUFReader (too slow to run every time: it
    # materialises the 262,144-token vocabulary).
    assert info.n_params == 268_098_176
    assert info.tensor_data_offset == 6_525_120
    assert info.tensor_bytes == 246_587_904
    assert info.n_tensors == 236
    assert info.n_layers == 18
    assert (info.n_heads, info.n_kv_heads) == (4, 1)
    assert (info.head_dim_k, info.head_dim_v) == (256, 256)
    assert info.embedding_length == 640
    assert info.context_length == 32768
    assert info.sliding_window == 512
    assert info.file_type == "Q4_K_M"
    # The bundled starter is the *base* model: it has no chat template of its own.
    assert info.chat_template is None
    assert not info.has_chat_template
    assert (info.bos_token, info.eos_token) == ("<bos>", "<eos>")
    assert info.vocab_size == 262144
    assert len(info.layer_bytes) == 18
    assert all(b > 0 for b in info.layer_bytes)
    assert sum(info.layer_bytes) + info.other_bytes == info.tensor_bytes
    assert info.tied_embeddings
    assert info.embedding_bytes > 0
    # The data runs exactly to the end of the file.
    assert info.tensor_data_offset + info.tensor_bytes == info.file_size == starter_model.stat().st_size
    assert info.metadata["general.name"] == "Gemma 3 270m"
    assert info.to_dict()["path"] == str(starter_model)


def test_tiny_files_agree_with_the_gguf_package(tmp_path: Path) -> None:
    import gguf

    for path in (build().write(tmp_path / "a.gguf"), write_with_gguf_package(tmp_path / "b.gguf")):
        reference = gguf.GGUFReader(str(path))
        info = read_gguf_info(path)
        assert info.tensor_data_offset == reference.data_offset
        assert info.n_tensors == len(reference.tensors)
        assert info.n_params == sum(int(t.n_elements) for t in reference.tensors)
        assert info.tensor_bytes == sum(int(t.n_bytes) for t in reference.tensors)


def test_valid_file_from_the_gguf_package(tmp_path: Path) -> None:
    path = write_with_gguf_package(tmp_path / "tiny.gguf")
    info = read_gguf_info(path)
    assert info.architecture == "llama"
    assert info.name == "Tiny Package Model"
    assert info.n_layers == 2
    assert (info.n_heads, info.n_kv_heads, info.head_dim_k) == (4, 2, 8)
    assert info.context_length == 128
    assert info.file_type == "F32"
    assert info.chat_template == TEMPLATE
    assert (info.bos_token, info.eos_token) == ("<s>", "</s>")
    assert info.n_params == 8 * 32 + 2 * (32 * 32 + 64 * 32) + 32
    assert info.tensor_bytes == 4 * info.n_params
    assert info.layer_bytes == [4 * (32 * 32 + 64 * 32)] * 2


def test_valid_file_from_the_byte_writer(tmp_path: Path) -> None:
    path = build().write(tmp_path / "tiny.gguf")
    info = read_gguf_info(path)
    assert info.n_tensors == len(default_tensors())
    assert info.file_type == "F16"
    assert not info.tied_embeddings
    assert info.extra["array_lengths"]["tokenizer.ggml.tokens"] == 8


def test_our_block_sizes_match_the_gguf_package() -> None:
    from gguf.constants import GGML_QUANT_SIZES

    from engine.gguf_format import GGML_TYPES

    for qtype, sizes in GGML_QUANT_SIZES.items():
        assert int(qtype) in GGML_TYPES, f"{qtype.name} is unknown to engine.gguf_format"
        if qtype.name == "Q8_1":  # gguf-py's table is stale here; ggml's block_q8_1 is 36 bytes
            continue
        assert GGML_TYPES[int(qtype)] == (qtype.name, *sizes)


def test_file_type_guessed_from_tensors_when_missing(tmp_path: Path) -> None:
    kvs = [k for k in default_kvs() if b"general.file_type" not in k]
    info = read_gguf_info(build(kvs).write(tmp_path / "m.gguf"))
    # F16 holds the most bytes in the default tensors
    assert info.file_type == "F16"


def test_per_layer_head_counts_take_the_maximum(tmp_path: Path) -> None:
    kvs = [k for k in default_kvs() if b"head_count_kv" not in k]
    kvs.append(kv("llama.attention.head_count_kv", ARRAY, (INT32, [2, 0])))
    info = read_gguf_info(build(kvs).write(tmp_path / "m.gguf"))
    assert info.n_kv_heads == 2
    assert info.kv_heads_per_layer == [2, 0]


def test_architectures_the_engine_cannot_run(tmp_path: Path) -> None:
    assert unsupported_reason(read_gguf_info(build().write(tmp_path / "ok.gguf"))) is None
    future = [kv("general.architecture", STRING, "llama9"), *default_kvs(arch="llama9")[1:]]
    info = read_gguf_info(build(future).write(tmp_path / "future.gguf"))  # a valid file...
    assert unsupported_reason(info) == "model needs a newer engine (architecture 'llama9', GGUF v3)"
    projector = read_gguf_info(build([kv("general.architecture", STRING, "clip")]).write(tmp_path / "p.gguf"))
    reason = unsupported_reason(projector)
    assert reason is not None
    assert "vision projector" in reason


def test_header_from_a_prefix(tmp_path: Path) -> None:
    image = build().data
    info = parse_gguf_prefix(image[:4096], len(image), "repo/tiny.gguf")
    assert info.architecture == "llama"
    with pytest.raises(GgufHeaderNeedsMoreBytes) as caught:
        parse_gguf_prefix(image[:100], len(image), "repo/tiny.gguf")
    assert 100 < caught.value.needed <= len(image)
    info = parse_gguf_prefix(image[: caught.value.needed + 4096], len(image), "repo/tiny.gguf")
    assert info.n_layers == 2


# ------------------------------------------------------------------ malformed files
def _tensors_with(name: str, dims: list[int], ttype: int) -> list[tuple[str, list[int], int]]:
    return [*default_tensors()[:-1], (name, dims, ttype)]


def _without(key: str) -> list[bytes]:
    return [k for k in default_kvs() if gstr(key) not in k]


def _one_tensor(info: bytes) -> bytes:
    return build(raw_tensor_infos=info, n_tensors=1, tensors=[]).data


CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    "bad magic": (lambda: build(magic=b"GGUX").data, "not a GGUF file"),
    "future version": (lambda: build(version=4).data, "model needs a newer engine (GGUF v4)"),
    "version 1": (lambda: build(version=1).data, "GGUF v1 is too old"),
    "version 0": (lambda: build(version=0).data, "model file is malformed: GGUF version 0"),
    "big endian": (lambda: build(version=3 << 24).data, "big-endian GGUF"),
    "absurd tensor count": (lambda: build(n_tensors=2**64 - 1).data, "tensors (limit"),
    "absurd kv count": (lambda: build(n_kv=2**63).data, "metadata keys (limit"),
    "huge key length": (
        lambda: build([u64(2**63) + b"general.architecture"]).data,
        "claims a string of 9223372036854775808 bytes",
    ),
    "huge value string": (
        lambda: build([*default_kvs(), gstr("x") + u32(STRING) + u64(2**40)]).data,
        "claims a string of",
    ),
    "huge array length": (
        lambda: build([*default_kvs(), gstr("x") + u32(ARRAY) + u32(UINT32) + u64(2**40)]).data,
        "claims 1099511627776 entries",
    ),
    "huge string in array": (
        lambda: build([*default_kvs(), gstr("x") + u32(ARRAY) + u32(STRING) + u64(1) + u64(2**62)]).data,
        "claims a string of",
    ),
    "bad kv type": (lambda: build([*default_kvs(), gstr("x") + u32(13) + u32(0)]).data, "invalid type 13"),
    "bad array element type": (
        lambda: build([*default_kvs(), gstr("x") + u32(ARRAY) + u32(99) + u64(0)]).data,
        "invalid element type 99",
    ),
    "nested array": (
        lambda: build([*default_kvs(), gstr("x") + u32(ARRAY) + u32(ARRAY) + u64(1)]).data,
        "contains arrays",
    ),
    "duplicate key": (
        lambda: build([*default_kvs(), kv("general.name", STRING, "again")]).data,
        "duplicate metadata key 'general.name'",
    ),
    "missing architecture": (lambda: build(default_kvs()[1:]).data, "general.architecture is missing"),
    "tokens not strings": (
        lambda: build([*_without("tokenizer.ggml.tokens"), kv("tokenizer.ggml.tokens", ARRAY, (INT32, [1, 2]))]).data,
        "tokenizer.ggml.tokens must be an array of STRING",
    ),
    "tokens as a scalar": (
        lambda: build([*_without("tokenizer.ggml.tokens"), kv("tokenizer.ggml.tokens", STRING, "a b")]).data,
        "tokenizer.ggml.tokens must be an array of STRING",
    ),
    "scores of another length": (
        lambda: build([*_without("tokenizer.ggml.scores"), kv("tokenizer.ggml.scores", ARRAY, (FLOAT32, [0.0]))]).data,
        "tokenizer.ggml.scores has 1 entries for 8 tokens",
    ),
    "architecture with a newline": (
        lambda: build([kv("general.architecture", STRING, "llama\n"), *default_kvs()[1:]]).data,
        "general.architecture 'llama\\n' is not a valid name",
    ),
    "absurd block count": (
        lambda: build([*default_kvs()[:3], kv("llama.block_count", UINT32, 100000), *default_kvs()[4:]]).data,
        "block_count is 100000",
    ),
    "bad n_dims": (
        lambda: build(raw_tensor_infos=gstr("t") + u32(0xFFFFFFFF), n_tensors=1, tensors=[]).data,
        "4294967295 dimensions (limit 4)",
    ),
    "zero dim": (
        lambda: build(tensors=_tensors_with("output.weight", [64, 0], F32)).data,
        "invalid dimension 0",
    ),
    "negative dim": (
        lambda: build(raw_tensor_infos=tensor_info("t", [2**64 - 2], F32, 0), n_tensors=1, tensors=[]).data,
        "invalid dimension 18446744073709551614",
    ),
    "shape product overflow": (
        lambda: _one_tensor(tensor_info("t", [2**32, 2**32, 4], F32, 0)),
        "whose size overflows",
    ),
    "absurd data size": (
        lambda: _one_tensor(tensor_info("t", [2**31, 2**31], F32, 0)),
        "claims data up to byte",
    ),
    "bad tensor type": (
        lambda: build(raw_tensor_infos=tensor_info("t", [32], 1000, 0), n_tensors=1, tensors=[]).data,
        "invalid type 1000",
    ),
    "removed tensor type": (
        lambda: build(raw_tensor_infos=tensor_info("t", [32], 4, 0), n_tensors=1, tensors=[]).data,
        "invalid type 4",
    ),
    "row not a multiple of the block": (
        lambda: build(tensors=_tensors_with("output.weight", [33, 2], Q4_0)).data,
        "not a multiple of the Q4_0 block",
    ),
    "alignment 2^31": (
        lambda: build([*default_kvs(), kv("general.alignment", UINT32, 0x80000000)]).data,
        "general.alignment 2147483648 is not a power of two",
    ),
    "alignment not a power of two": (
        lambda: build([*default_kvs(), kv("general.alignment", UINT32, 48)]).data,
        "general.alignment 48",
    ),
    "alignment zero": (
        lambda: build([*default_kvs(), kv("general.alignment", UINT32, 0)]).data,
        "general.alignment 0",
    ),
    "alignment wrong type": (
        lambda: build([*default_kvs(), kv("general.alignment", STRING, "32")]).data,
        "general.alignment is not an integer",
    ),
    "misaligned offset": (
        lambda: build(tensors=[("a", [32], F32), ("b", [32], F32)], offsets=[0, 129]).data,
        "offset 129 is not aligned",
    ),
    "offset past the end": (
        lambda: build(tensors=[("a", [32], F32), ("b", [32], F32)], offsets=[0, 2**40]).data,
        "offset 1099511627776 should be 128",
    ),
    "overlapping tensors": (
        lambda: build(tensors=[("a", [64], F32), ("b", [32], F32)], offsets=[0, 128]).data,
        "offset 128 should be 256",
    ),
    "duplicate tensor": (
        lambda: build(tensors=[("a", [32], F32), ("a", [32], F32)]).data,
        "duplicate tensor 'a'",
    ),
    "tensor name too long": (
        lambda: build(tensors=[("x" * 70, [32], F32)]).data,
        "longer than 63 bytes",
    ),
    "block index beyond the count": (
        lambda: build(tensors=[*default_tensors(), ("blk.7.attn_q.weight", [64], F32)]).data,
        "belongs to block 7",
    ),
    "lfs pointer": (
        lambda: b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12345\n",
        "this is a Git LFS pointer, not the model: download the real file",
    ),
    "html page": (
        lambda: b"<!DOCTYPE html>\n<html><head><title>404</title></head></html>",
        "this is an HTML page",
    ),
    "html page, no doctype": (lambda: b"\n\n  <HTML><body>nope</body></HTML>", "this is an HTML page"),
    "empty": (lambda: b"", "the file is empty (0 bytes)"),
    "safetensors": (
        lambda: u64(27) + b'{"__metadata__":{"a":"b"}} ' + b"\0" * 64,
        "this is a safetensors file, not GGUF",
    ),
    "zip": (lambda: b"PK\x03\x04" + b"\0" * 100, "this is a zip archive"),
    "ggjt": (lambda: u32(0x67676A74) + u32(3) + b"\0" * 100, "old GGML format (ggjt), not supported"),
    "ggml": (lambda: u32(0x67676D6C) + b"\0" * 100, "old GGML format (ggml)"),
    "ggla": (lambda: b"ggla" + b"\0" * 100, "old GGML format (ggla)"),
    "pickle": (lambda: b"\x80\x02}q\x00" + b"\0" * 20, "pickle"),
    "text": (lambda: b"hello, this is a readme\n" * 4, "this is a text file"),
    "random bytes": (lambda: bytes(range(1, 200)), "not a GGUF file (it starts with 0x01020304)"),
    "magic only": (lambda: b"GGUF", "model file is incomplete (4 of at least 8 bytes)"),
    "truncated in header": (lambda: build().data[:20], "model file is incomplete (20 of at least 24 bytes)"),
    "truncated in kv": (lambda: build().data[:60], "model file is incomplete (60 of at least"),
    "truncated in token array": (
        lambda: build().data[: build().data.index(b"hello") + 2],
        "model file is incomplete",
    ),
    "truncated in tensor infos": (
        lambda: build().data[: build().tensor_info_start + 30],
        "model file is incomplete",
    ),
    "truncated in data": (
        lambda: build().data[: build().data_start + 100],
        "of {full} bytes): download it again",
    ),
    "truncated by one byte": (lambda: build().data[:-1], "of {full} bytes)"),
}


def _expected(message: str) -> str:
    full = build()
    last = default_tensors()[-1]
    from gguf_fixtures import nbytes

    end_of_data = len(full.data) - (-nbytes(last[1], last[2]) % 32)
    return message.format(full=end_of_data)


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_file_gives_its_own_message(case: str, tmp_path: Path) -> None:
    make, message = CASES[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(make())
    with pytest.raises(ModelFileError) as caught:
        read_gguf_info(path)
    text = str(caught.value)
    assert _expected(message) in text
    assert text.startswith(f"{path}: ")
    assert "\n" not in text
    assert caught.value.path == path


def test_at_least_fifteen_malformed_variants() -> None:
    assert len(CASES) >= 15


def test_missing_folder_and_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such file"):
        read_gguf_info(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="is a folder"):
        read_gguf_info(tmp_path)


def test_sniffing_without_parsing(tmp_path: Path) -> None:
    lfs = tmp_path / "lfs.gguf"
    lfs.write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    assert sniff_model_file(lfs) == "this is a Git LFS pointer, not the model: download the real file"
    assert sniff_model_file(build().write(tmp_path / "ok.gguf")) is None
    assert describe_non_gguf(b"", 0) == "the file is empty (0 bytes): download it again"


def test_fuzzed_files_never_escape_as_other_exceptions(tmp_path: Path) -> None:
    """Random byte flips and cuts of a valid file: success or ModelFileError, nothing else."""
    rng = random.Random(1234)
    original = build().data
    path = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    messages: list[str] = []
    for _ in range(300):
        data = bytearray(original)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            data[at] = rng.randrange(256) if rng.random() < 0.7 else 0xFF
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        path.write_bytes(bytes(data))
        try:
            read_gguf_info(path)
        except ModelFileError as exc:
            messages.append(str(exc))
            outcomes["error"] += 1
        else:
            outcomes["ok"] += 1
    assert outcomes["error"] > 50  # the fuzzing really breaks files
    assert all("\n" not in m for m in messages)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
def test_malformed_files_under_a_one_gigabyte_address_space(tmp_path: Path) -> None:
    """No claimed count or length makes the reader allocate: all cases pass under RLIMIT_AS=1 GiB."""
    for i, name in enumerate(sorted(CASES)):
        (tmp_path / f"{i}.gguf").write_bytes(CASES[name][0]())
    script = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from engine.errors import ModelFileError
        from engine.gguf import read_gguf_info
        bad = 0
        for path in sorted(Path({str(tmp_path)!r}).glob("*.gguf")):
            try:
                read_gguf_info(path)
            except ModelFileError:
                bad += 1
        print(bad)
        """
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(CASES)


def test_tiny_writer_round_trip_of_offsets(tmp_path: Path) -> None:
    tensors = [("a", [32], F32), ("b", [64, 2], F16)]
    built = build(tensors=tensors, alignment=64, kvs=[*default_kvs(), kv("general.alignment", UINT32, 64)])
    info = read_gguf_info(built.write(tmp_path / "m.gguf"))
    assert info.alignment == 64
    assert info.tensor_data_offset == built.data_start
    assert info.tensor_data_offset % 64 == 0
    assert info.tensor_bytes == 32 * 4 + 128 * 2
