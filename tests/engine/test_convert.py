"""Hugging Face safetensors checkpoint -> GGUF: the Python checks, and a real tiny conversion."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import threading
from pathlib import Path

import pytest
from tiny_models import cached_tiny_hf_llama, generate_in_subprocess, write_tiny_llama_gguf

from engine.convert.hf_to_gguf import (
    ConvertProgress,
    ConvertResult,
    PipelineProgress,
    check_hf_folder,
    convert_and_quantize,
    convert_checkpoint,
    default_convert_path,
    intermediate_outtype,
    read_safetensors_header,
)
from engine.convert.quantize import quantize_model
from engine.errors import Cancelled, ModelFileError, QuantizeError
from engine.gguf import read_gguf_info
from engine.library import ModelLibrary


def _safetensors(path: Path, header: object, data: bytes = b"", *, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _good_header() -> dict[str, object]:
    return {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, "__metadata__": {"format": "pt"}}


def _hf_folder(folder: Path, *, weights: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    if weights:
        _safetensors(folder / "model.safetensors", _good_header(), bytes(16))
    return folder


# --------------------------------------------------------------------------- header checks


def test_a_valid_header_is_read(tmp_path: Path) -> None:
    header = read_safetensors_header(_safetensors(tmp_path / "ok.safetensors", _good_header(), bytes(16)))
    assert (header.n_tensors, header.n_params, header.dtypes) == (1, 4, ("F32",))


@pytest.mark.parametrize(
    ("header", "data", "length", "why"),
    [
        (_good_header(), bytes(16), 10**12, r"header length 1000000000000 does not fit a file of \d+ bytes"),
        (_good_header(), bytes(16), 1, "header length 1 does not fit"),
        ("[1, 2]", b"", None, "the header is not a JSON object"),
        (
            {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 64]}},
            bytes(16),
            None,
            r"data offsets \[0, 64\] outside the 16 data bytes",
        ),
        (
            {"w": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 16]}},
            bytes(16),
            None,
            "16 bytes for 6 F32 values",
        ),
        ({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, bytes(1), None, "unknown dtype 'Q9'"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", None, "bad shape"),
        ({"__metadata__": {"a": 1}}, b"", None, "__metadata__ must map strings to strings"),
    ],
)
def test_bad_headers_are_refused_with_the_reason(
    tmp_path: Path, header: object, data: bytes, length: int | None, why: str
) -> None:
    path = tmp_path / "bad.safetensors"
    if isinstance(header, str):
        raw = header.encode()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    else:
        _safetensors(path, header, data, length=length)
    with pytest.raises(ModelFileError) as err:
        read_safetensors_header(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not a valid safetensors file (")
    assert "\n" not in message
    assert re.search(why, message), message


def test_truncated_and_non_json_headers(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(ModelFileError, match="only 2 bytes long"):
        read_safetensors_header(short)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 6) + b"\xff\xfe{}}}")
    with pytest.raises(ModelFileError, match="the header is not JSON"):
        read_safetensors_header(garbage)


# --------------------------------------------------------------------------- folder checks


def test_pickle_only_folders_are_refused(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m", weights=False)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelFileError) as err:
        check_hf_folder(folder)
    message = str(err.value)
    assert message.startswith(f"{folder}: only pickle weights (pytorch_model.bin)")
    assert "safetensors" in message
    assert "\n" not in message
    # convert_checkpoint refuses before any child starts, leaving nothing behind.
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ModelFileError, match="only pickle weights"):
        convert_checkpoint(folder, out / "m.gguf")
    assert list(out.iterdir()) == []


def test_folder_checks(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not a folder"):
        check_hf_folder(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelFileError, match=r"no config\.json"):
        check_hf_folder(empty)
    no_weights = _hf_folder(tmp_path / "nw", weights=False)
    with pytest.raises(ModelFileError, match=r"no model\*\.safetensors weights"):
        check_hf_folder(no_weights)
    bad_index = _hf_folder(tmp_path / "bi")
    (bad_index / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    with pytest.raises(ModelFileError, match="unsafe file name"):
        check_hf_folder(bad_index)
    bad_weights = _hf_folder(tmp_path / "bw", weights=False)
    _safetensors(bad_weights / "model.safetensors", _good_header(), b"", length=999)
    with pytest.raises(ModelFileError, match="not a valid safetensors file"):
        check_hf_folder(bad_weights)

    ok = check_hf_folder(_hf_folder(tmp_path / "ok"))
    assert (ok.architecture, ok.n_tensors, ok.n_params, ok.has_custom_code) == (
        "LlamaForCausalLM",
        1,
        4,
        False,
    )


def test_bad_outtype_and_default_name(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "My Model")
    with pytest.raises(QuantizeError, match="unknown conversion type 'q4_k_m'"):
        convert_checkpoint(folder, tmp_path / "x.gguf", outtype="q4_k_m")
    assert default_convert_path(folder, "q8_0", tmp_path / "models") == tmp_path / "models" / "My_Model-Q8_0.gguf"


def test_cancel_before_the_converter_finishes_leaves_no_file(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m")
    out = tmp_path / "out"
    out.mkdir()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled, match="conversion cancelled; no file was written"):
        convert_checkpoint(folder, out / "m.gguf", cancel=cancel)
    assert list(out.iterdir()) == []


# --------------------------------------------------------------------------- a real conversion


_CACHE = Path(os.environ.get("GLASSBOX_TEST_CACHE", Path(__file__).resolve().parents[2] / ".home" / "test-cache"))


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny transformers checkpoint, written once per machine (importing torch is the slow part)."""
    return cached_tiny_hf_llama(_CACHE, tmp_path_factory.mktemp("hf"))


@pytest.mark.model
@pytest.mark.slow
def test_convert_tiny_llama_then_quantize_and_generate(hf_llama: Path, tmp_path: Path) -> None:
    events: list[ConvertProgress] = []
    result = convert_checkpoint(hf_llama, tmp_path / "tiny-F16.gguf", outtype="f16", progress=events.append)

    info = read_gguf_info(result.path)
    assert (info.architecture, info.file_type, result.outtype) == ("llama", "F16", "F16")
    assert info.n_layers == 2
    assert info.embedding_length == 64
    assert result.n_tensors == info.n_tensors == 2 * 9 + 3
    assert any(e.phase == "preparing" for e in events)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-F16.gguf"]

    quantized = quantize_model(result.path, tmp_path / "tiny-Q8_0.gguf", "Q8_0", threads=2)
    assert read_gguf_info(quantized.path).file_type == "Q8_0"
    out = generate_in_subprocess(quantized.path, prompt="the river", max_tokens=4)
    assert out["tokens"] == 4


@pytest.mark.model
@pytest.mark.slow
def test_custom_code_is_never_run(hf_llama: Path, tmp_path: Path) -> None:
    """The converter asks for ``trust_remote_code=True`` for this tokenizer class; the child says no."""
    folder = tmp_path / "custom"
    shutil.copytree(hf_llama, folder)
    marker = tmp_path / "ran.txt"
    (folder / "evil_tokenizer.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class HybridDNATokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "HybridDNATokenizer"
    config["auto_map"] = {"AutoTokenizer": [None, "evil_tokenizer.HybridDNATokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert check_hf_folder(folder).has_custom_code

    with pytest.raises(QuantizeError) as err:
        convert_checkpoint(folder, tmp_path / "evil.gguf", timeout=300)
    message = str(err.value)
    assert message.startswith(f"{folder}: conversion failed")
    assert "\n" not in message
    assert not marker.exists()
    assert not (tmp_path / "evil.gguf").exists()


@pytest.mark.model
@pytest.mark.slow
def test_an_unsupported_architecture_is_named(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "foo")
    (folder / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "foo"}))
    with pytest.raises(QuantizeError) as err:
        convert_checkpoint(folder, tmp_path / "foo.gguf", timeout=300)
    assert str(err.value) == f"{folder}: conversion failed: FooForCausalLM is not supported by the converter"
    assert not (tmp_path / "foo.gguf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["foo"]  # no temporary file either


# --------------------------------------------------------------------------- convert, then quantize


def test_the_intermediate_type_follows_the_checkpoint_dtype(tmp_path: Path) -> None:
    def folder_with(name: str, config: dict[str, object], dtype: str) -> Path:
        folder = _hf_folder(tmp_path / name, weights=False)
        (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
        header = {"w": {"dtype": dtype, "shape": [2, 2], "data_offsets": [0, 8 if dtype != "F32" else 16]}}
        _safetensors(folder / "model.safetensors", header, bytes(8 if dtype != "F32" else 16))
        return folder

    assert intermediate_outtype(check_hf_folder(folder_with("a", {"torch_dtype": "bfloat16"}, "BF16"))) == "bf16"
    assert intermediate_outtype(check_hf_folder(folder_with("b", {"dtype": "bfloat16"}, "F32"))) == "bf16"
    assert intermediate_outtype(check_hf_folder(folder_with("c", {"torch_dtype": "float16"}, "F16"))) == "f16"
    assert intermediate_outtype(check_hf_folder(folder_with("d", {"torch_dtype": "float32"}, "F32"))) == "f16"
    # No dtype in config.json: the weights decide.
    assert intermediate_outtype(check_hf_folder(folder_with("e", {}, "BF16"))) == "bf16"
    assert intermediate_outtype(check_hf_folder(folder_with("f", {}, "F32"))) == "f16"


def test_bad_requests_are_refused_before_converting(
    hf_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_conversion(*_args: object, **_kwargs: object) -> ConvertResult:
        raise AssertionError("the converter must not start")

    monkeypatch.setattr("engine.convert.hf_to_gguf.convert_checkpoint", no_conversion)
    out = tmp_path / "out"
    out.mkdir()
    existing = out / "tiny-Q4_K_M.gguf"
    existing.write_bytes(b"mine")
    with pytest.raises(QuantizeError, match="already exists"):
        convert_and_quantize(hf_llama, "Q4_K_M", dst=existing)
    assert existing.read_bytes() == b"mine"
    existing.unlink()

    with pytest.raises(QuantizeError) as err:
        convert_and_quantize(hf_llama, "IQ2_XXS", out_folder=out)
    assert str(err.value).startswith(f"{hf_llama}: IQ2_XXS needs an importance matrix")
    with pytest.raises(QuantizeError) as err:
        convert_and_quantize(hf_llama, "Q9_X", out_folder=out)
    assert str(err.value).startswith(f"{hf_llama}: unknown quantization type 'Q9_X'")

    # Free space is checked for the intermediate and the result together.
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: shutil._ntuple_diskusage(1, 1, 0))
    with pytest.raises(QuantizeError, match="not enough free space"):
        convert_and_quantize(hf_llama, "Q4_K_M", out_folder=out)
    assert list(out.iterdir()) == []


def test_a_failed_quantize_stage_removes_the_intermediate(
    hf_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Path] = []

    def fake_convert(folder: Path, dst: Path, **_kwargs: object) -> ConvertResult:
        write_tiny_llama_gguf(dst, dtype="F16")
        return ConvertResult(dst, folder, "F16", "llama", 21, dst.stat().st_size, 0.1)

    def failing_quantize(src: Path, dst: Path, qtype: str, **_kwargs: object) -> None:
        assert src.is_file()
        seen.append(src)
        raise QuantizeError(f"{src}: quantization to {qtype} failed after 3 of 21 tensors: out of luck")

    monkeypatch.setattr("engine.convert.hf_to_gguf.convert_checkpoint", fake_convert)
    monkeypatch.setattr("engine.convert.hf_to_gguf.quantize_model", failing_quantize)
    for keep in (False, True):
        with pytest.raises(QuantizeError) as err:
            convert_and_quantize(hf_llama, "Q4_K_M", out_folder=tmp_path, keep_intermediate=keep)
        # The message names the checkpoint, not the temporary file.
        assert str(err.value) == f"{hf_llama}: quantization to Q4_K_M failed after 3 of 21 tensors: out of luck"
        assert list(tmp_path.iterdir()) == []
    assert seen[0].name.startswith(".tiny-hf-llama-v1-Q4_K_M.F16-")
    assert seen[1] == tmp_path / "tiny-hf-llama-v1-F16.gguf"


@pytest.mark.model
@pytest.mark.slow
def test_convert_and_quantize_in_one_call_then_generate(hf_llama: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    library = ModelLibrary(models)
    events: list[PipelineProgress] = []
    result = convert_and_quantize(
        hf_llama, "q4_k_m", out_folder=models, library=library, threads=2, progress=events.append
    )

    assert result.path == models / "tiny-hf-llama-v1-Q4_K_M.gguf"
    info = read_gguf_info(result.path)
    assert (info.architecture, info.file_type, result.qtype) == ("llama", "Q4_K_M", "Q4_K_M")
    assert result.n_tensors == info.n_tensors == 21
    assert result.dst_bytes == result.path.stat().st_size
    assert (result.intermediate_type, result.intermediate) == ("F16", None)  # the checkpoint is float32
    assert result.intermediate_bytes > result.dst_bytes
    assert result.convert_seconds > 0
    assert result.quantize_seconds > 0
    # The intermediate is gone: only the result and the library manifest are left.
    assert sorted(p.name for p in models.iterdir()) == ["manifest.json", "tiny-hf-llama-v1-Q4_K_M.gguf"]
    # Progress names its stage; every converting report comes before the quantizing ones.
    stages = [e.stage for e in events]
    assert stages[0] == "converting"
    assert stages[-1] == "quantizing"
    assert stages == sorted(stages)
    assert {(e.stage, e.step, e.steps) for e in events} == {("converting", 1, 2), ("quantizing", 2, 2)}
    assert events[-1].text == "quantizing 21/21 tensors"
    entry = library.find(result.path)
    assert entry is not None
    assert entry.provenance["source"] == f"converted from {hf_llama.resolve()}, quantized to Q4_K_M"
    assert "quantized_from" not in entry.provenance  # the intermediate is gone

    out = generate_in_subprocess(result.path, prompt="the river", max_tokens=4)
    assert out["tokens"] == 4


@pytest.mark.model
@pytest.mark.slow
def test_cancel_during_the_quantize_stage_leaves_no_file(hf_llama: Path, tmp_path: Path) -> None:
    cancel = threading.Event()
    stages: list[str] = []

    def on_progress(p: PipelineProgress) -> None:
        stages.append(p.stage)
        if p.stage == "quantizing":
            cancel.set()

    with pytest.raises(Cancelled) as err:
        convert_and_quantize(
            hf_llama, "Q4_K_M", out_folder=tmp_path, keep_intermediate=True, cancel=cancel, progress=on_progress
        )
    assert str(err.value) == f"{hf_llama}: cancelled while quantizing; no file was written"
    assert "converting" in stages
    assert "quantizing" in stages
    assert list(tmp_path.iterdir()) == []  # neither the result nor the (kept) intermediate
