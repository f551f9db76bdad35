"""``glassbox models quantize | convert | quant-types``: exit codes, JSON, one-line errors."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from tiny_models import cached_tiny_hf_llama, write_tiny_llama_gguf

from app.cli.main import main
from engine.gguf import read_gguf_info


@pytest.fixture(scope="module")
def tiny_f16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("cli") / "tiny-F16.gguf", dtype="F16")


_CACHE = Path(os.environ.get("GLASSBOX_TEST_CACHE", Path(__file__).resolve().parents[3] / ".home" / "test-cache"))


@pytest.fixture
def hf_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny transformers checkpoint, labelled bfloat16 in its config.json."""
    folder = tmp_path_factory.mktemp("hf") / "tiny-bf16"
    shutil.copytree(cached_tiny_hf_llama(_CACHE, tmp_path_factory.mktemp("scratch")), folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_quant_types_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "models", "quant-types", "--json", "--home", str(tmp_path))
    assert code == 0
    types = {t["name"]: t for t in json.loads(out)}
    assert types["Q4_K_M"]["available"] is True
    assert types["IQ2_XXS"]["needs_imatrix"] is True
    assert types["IQ2_XXS"]["available"] is False

    code, out, _ = _run(capsys, "models", "quant-types", "--home", str(tmp_path))
    assert code == 0
    assert any(line.startswith("Q4_K_M") for line in out.splitlines())


@pytest.mark.model
def test_quantize_into_the_models_folder_with_quality_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_f16: Path
) -> None:
    home = tmp_path / "home"
    code, out, err = _run(
        capsys, "models", "quantize", str(tiny_f16), "--type", "q8_0", "--check-quality", "--threads", "1",
        "--json", "--home", str(home),
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)  # exactly one JSON document on stdout: the child's log went elsewhere
    path = Path(document["path"])
    assert path == home / "data" / "models" / "tiny-Q8_0.gguf"
    assert path.is_file()
    assert document["qtype"] == "Q8_0"
    assert document["source_type"] == "F16"
    # The library knows where it came from.
    from app.cli.commands.model_resolver import open_library
    from app.paths import Paths

    entry = open_library(Paths.resolve(home)).find(path)
    assert entry is not None
    assert entry.provenance["quantized_from"] == str(tiny_f16.resolve())
    assert entry.provenance["source"] == "quantized"
    quality = document["quality"]
    assert math.isfinite(quality["source_perplexity"])
    assert math.isfinite(quality["result_perplexity"])
    assert quality["summary"].startswith("Q8_0: ")

    # The same output again is refused, in one line, without touching the file.
    before = path.stat().st_mtime_ns
    code, out, err = _run(capsys, "models", "quantize", str(tiny_f16), "--type", "Q8_0", "--home", str(home))
    assert code == 1
    assert out == ""
    assert err.startswith("glassbox: error: ")
    assert err.count("\n") == 1
    assert "already exists" in err
    assert path.stat().st_mtime_ns == before

    # An already quantized source needs --allow-requantize. A name in the models folder will do.
    code, _, err = _run(capsys, "models", "quantize", "tiny-Q8_0", "--type", "Q4_K_M", "--home", str(home))
    assert code == 1
    assert "already quantized (Q8_0)" in err
    code, out, err = _run(
        capsys, "models", "quantize", str(path), "--type", "Q4_K_M", "--allow-requantize", "--home", str(home)
    )
    assert code == 0, err
    assert "Q4_K_M:" in out


@pytest.mark.model
@pytest.mark.slow
def test_convert_and_quantize_in_one_command(capsys: pytest.CaptureFixture[str], tmp_path: Path, hf_bf16: Path) -> None:
    home = tmp_path / "home"
    code, out, err = _run(
        capsys, "models", "convert", str(hf_bf16), "--quantize", "Q4_K_M", "--keep-intermediate", "--threads", "2",
        "--json", "--home", str(home),
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    models = home / "data" / "models"
    path = Path(document["path"])
    assert path == models / "tiny-bf16-Q4_K_M.gguf"
    assert read_gguf_info(path).file_type == document["qtype"] == "Q4_K_M"
    assert document["dst_bytes"] == path.stat().st_size
    # A bfloat16 checkpoint goes through BF16, which --keep-intermediate keeps beside the result.
    kept = Path(document["intermediate"])
    assert kept == models / "tiny-bf16-BF16.gguf"
    assert read_gguf_info(kept).file_type == document["intermediate_type"] == "BF16"
    assert document["intermediate_bytes"] == kept.stat().st_size
    assert document["convert_seconds"] > 0
    assert document["quantize_seconds"] > 0
    assert document["seconds"] >= document["convert_seconds"] + document["quantize_seconds"]
    assert document["warnings"] == []
    assert sorted(p.name for p in models.iterdir()) == ["manifest.json", kept.name, path.name]
    from app.cli.commands.model_resolver import open_library
    from app.paths import Paths

    library = open_library(Paths.resolve(home))
    entry = library.find(path)
    assert entry is not None
    assert entry.provenance["source"] == f"converted from {hf_bf16.resolve()}, quantized to Q4_K_M"
    assert entry.provenance["quantized_from"] == str(kept)
    kept_entry = library.find(kept)
    assert kept_entry is not None
    assert kept_entry.provenance["source"] == f"converted from {hf_bf16.resolve()}"

    # Again: refused in one line before anything runs, files untouched.
    before = path.stat().st_mtime_ns
    code, out, err = _run(capsys, "models", "convert", str(hf_bf16), "--quantize", "q4_k_m", "--home", str(home))
    assert (code, out) == (1, "")
    assert err == f"glassbox: error: {path}: already exists; choose another name or remove it first\n"
    assert path.stat().st_mtime_ns == before

    code, out, err = _run(capsys, "models", "convert", str(hf_bf16), "--quantize", "IQ2_XXS", "--home", str(home))
    assert (code, out) == (1, "")
    assert err.startswith(f"glassbox: error: {hf_bf16}: IQ2_XXS needs an importance matrix")
    assert err.count("\n") == 1


def test_bad_input_is_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    code, _, err = _run(capsys, "models", "quantize", str(junk), "--type", "Q4_K_M", "--home", str(tmp_path))
    assert code == 1
    assert err.startswith(f"glassbox: error: {junk}: ")
    assert err.count("\n") == 1

    code, _, err = _run(capsys, "models", "quantize", str(junk), "--type", "Q9_X", "--home", str(tmp_path))
    assert code == 1
    assert "unknown quantization type 'Q9_X'" in err

    pickles = tmp_path / "pickles"
    pickles.mkdir()
    (pickles / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (pickles / "pytorch_model.bin").write_bytes(b"\x80\x04")
    code, out, err = _run(capsys, "models", "convert", str(pickles), "--json", "--home", str(tmp_path))
    assert code == 1
    assert out == ""
    assert "only pickle weights" in err
    assert err.count("\n") == 1


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["models", "quantize", "x.gguf", "--home", str(tmp_path)])  # --type is required
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["models", "convert", "d", "--outtype", "q4_0", "--home", str(tmp_path)])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:  # one output type or the other
        main(["models", "convert", "d", "--outtype", "f16", "--quantize", "Q4_K_M", "--home", str(tmp_path)])
    assert exc.value.code == 2
    capsys.readouterr()
