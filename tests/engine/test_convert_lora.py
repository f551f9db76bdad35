"""A PEFT LoRA folder converted to a GGUF adapter by llama.cpp's own ``convert_lora_to_gguf.py``
(from the pinned sdist), for the real starter model (its Hugging Face config written from its GGUF)
and for a tiny Hugging Face Llama folder; the folder checks; a base it does not fit refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from lora_fixtures import write_peft_adapter
from tiny_models import cached_tiny_hf_llama

from engine.convert.lora_to_gguf import (
    base_config_from_gguf,
    check_peft_folder,
    convert_lora,
    find_lora_converter,
)
from engine.errors import ModelFileError, QuantizeError
from engine.inference.adapters import LoraAdapter
from engine.inference.events import Finished
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from engine.library import read_model_info
from engine.lora import AdapterMismatch, read_adapter

_CACHE = Path(__file__).resolve().parent.parent.parent / ".home" / "test-cache"


def _starter_config(starter: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(base_config_from_gguf(read_model_info(starter))))
    return folder


def test_a_peft_folder_is_checked_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"no adapter_config\.json"):
        check_peft_folder(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    with pytest.raises(ModelFileError, match="a PREFIX_TUNING adapter: only LoRA adapters"):
        check_peft_folder(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelFileError, match=r"pickle \(adapter_model.bin\), which can run code"):
        check_peft_folder(tmp_path)


def test_a_base_of_an_architecture_without_a_config_is_asked_for_as_a_folder(tmp_path: Path) -> None:
    from tiny_models import write_tiny_llama_gguf

    mamba_like = write_tiny_llama_gguf(tmp_path / "m.gguf", arch="llama")
    info = read_model_info(mamba_like)
    config = base_config_from_gguf(info)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    with pytest.raises(QuantizeError, match="give the base model's Hugging Face folder"):
        base_config_from_gguf(type(info)(**{**info.__dict__, "architecture": "rwkv7"}))


def test_the_converter_is_found_in_the_installed_builds_sdist(tmp_path: Path, llama_cpp_source: Path) -> None:
    script = find_lora_converter(tmp_path / "cache")
    assert script.name == "convert_lora_to_gguf.py" and (script.parent / "conversion").is_dir()
    assert script.read_bytes() == (llama_cpp_source / "convert_lora_to_gguf.py").read_bytes()
    assert find_lora_converter(tmp_path / "cache") == script  # unpacked once
    with pytest.raises(QuantizeError, match=r"no convert_lora_to_gguf\.py there"):
        find_lora_converter(tmp_path, override=tmp_path)


@pytest.mark.model
@pytest.mark.slow
def test_a_peft_adapter_for_the_starter_converts_checks_and_changes_its_replies(
    starter_model: Path, llama_cpp_source: Path, tmp_path: Path
) -> None:
    peft = write_peft_adapter(tmp_path / "peft", _starter_config(starter_model, tmp_path / "cfg"), strength=0.08)
    dst = tmp_path / "starter-lora.gguf"
    result = convert_lora(peft, dst, base=starter_model, converter=find_lora_converter(tmp_path, llama_cpp_source))
    assert result.checked_against == starter_model and result.path == dst
    adapter = read_adapter(dst)
    assert (adapter.architecture, adapter.rank, adapter.alpha) == ("gemma3", 4, 8.0)
    assert len(adapter.targets) == 2 * 18  # q and v of every layer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg", "peft", "starter-lora.gguf"]  # nothing left over

    greedy = GenerationParams(max_tokens=10, temperature=0.0)
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=512, n_threads=2), reply_reserve=32) as session:

        def reply() -> str:
            finished = list(session.stream([], "Write one sentence about the sea.", greedy))[-1]
            assert isinstance(finished, Finished)
            return finished.text

        base = reply()
        session.set_adapters([LoraAdapter(dst, 1.0)])
        assert reply() != base
        session.set_adapters([LoraAdapter(dst, 0.0)])
        assert reply() == base


@pytest.mark.model
@pytest.mark.slow
def test_an_adapter_for_a_hugging_face_folder_converts(llama_cpp_source: Path, tmp_path: Path) -> None:
    hf = cached_tiny_hf_llama(_CACHE, tmp_path)
    peft = write_peft_adapter(tmp_path / "peft", hf, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    result = convert_lora(peft, tmp_path / "a.gguf", base=hf, converter=find_lora_converter(tmp_path, llama_cpp_source))
    assert result.checked_against is None
    adapter = read_adapter(result.path)
    assert adapter.architecture == "llama"
    assert set(adapter.targets) == {f"blk.{i}.attn_{t}.weight" for i in (0, 1) for t in ("q", "k", "v", "output")}


@pytest.mark.model
@pytest.mark.slow
def test_an_adapter_that_does_not_fit_the_base_gguf_is_not_kept(
    starter_model: Path, tiny_model: Callable[[str], Path], llama_cpp_source: Path, tmp_path: Path
) -> None:
    other = tiny_model("qwen3")  # 2 layers of width 64
    converter = find_lora_converter(tmp_path, llama_cpp_source)
    dst = tmp_path / "out" / "a.gguf"
    dst.parent.mkdir()
    # The starter's widths on two layers: llama.cpp's converter maps the names, the check refuses the shapes.
    config = tmp_path / "cfg"
    _starter_config(starter_model, config)
    wide = json.loads((config / "config.json").read_text())
    (config / "config.json").write_text(json.dumps({**wide, "num_hidden_layers": 2}))
    peft = write_peft_adapter(tmp_path / "peft-wide", config)
    with pytest.raises(AdapterMismatch) as caught:
        convert_lora(peft, dst, base=other, converter=converter)
    assert str(caught.value).startswith(f"{dst}: does not fit {other}: blk.0.attn_q.weight is 64x64 in the model")
    assert list(dst.parent.iterdir()) == []
    # All 18 of the starter's layers: the converter itself refuses, in one line.
    peft = write_peft_adapter(tmp_path / "peft-deep", _starter_config(starter_model, tmp_path / "cfg-deep"))
    with pytest.raises(QuantizeError, match=r"conversion failed: ValueError: Can not map tensor") as refused:
        convert_lora(peft, dst, base=other, converter=converter)
    assert "\n" not in str(refused.value)
    assert list(dst.parent.iterdir()) == []
