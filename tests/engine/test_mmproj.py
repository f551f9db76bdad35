"""A model's projector found next to it (the Hub's naming), read from its header, matched to the
model, chosen by hand in the library, and counted in the fit verdict."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.compose import LoadSettings, load_params, projector_for
from engine.errors import ModelFileError
from engine.fit import estimate_fit, projector_bytes
from engine.gguf import read_gguf_info
from engine.hardware import HardwareInfo
from engine.library import ModelLibrary
from engine.mmproj import find_projector, read_projector
from tests.engine.tiny_vision import IMAGE_SIZE


@pytest.mark.parametrize(
    ("model", "files", "chosen"),
    [
        ("gemma-3-4b-it-Q4_K_M.gguf", ["mmproj-model-f16.gguf"], "mmproj-model-f16.gguf"),
        (
            "gemma-3-4b-it-Q4_K_M.gguf",
            ["mmproj-gemma-3-4b-it-F32.gguf", "mmproj-gemma-3-4b-it-F16.gguf", "mmproj-gemma-3-4b-it-Q8_0.gguf"],
            "mmproj-gemma-3-4b-it-F16.gguf",
        ),
        (
            "SmolVLM2-2.2B-Instruct-Q4_K_M.gguf",
            ["mmproj-SmolVLM2-500M-Video-Instruct-f16.gguf", "mmproj-SmolVLM2-2.2B-Instruct-f16.gguf"],
            "mmproj-SmolVLM2-2.2B-Instruct-f16.gguf",
        ),
        (
            "Qwen2.5-VL-7B-Instruct-Q4_K_M-00001-of-00002.gguf",
            ["Qwen2.5-VL-7B-Instruct-mmproj-bf16.gguf"],
            "Qwen2.5-VL-7B-Instruct-mmproj-bf16.gguf",
        ),
        ("llama-3.1-8b-instruct-Q4_K_M.gguf", ["notes.gguf", "llama-3.1-8b-instruct-Q8_0.gguf"], None),
    ],
    ids=["generic", "best-type", "closest-name", "split-model", "none"],
)
def test_the_projector_is_found_by_the_hubs_naming(model: str, files: list[str], chosen: str | None) -> None:
    folder = Path("/models/owner/repo")
    found = find_projector(folder / model, [folder / f for f in files] + [Path("/elsewhere/mmproj-F16.gguf")])
    assert found == (folder / chosen if chosen else None)


def test_the_header_says_what_the_projector_reads(tiny_vision_model: tuple[Path, Path]) -> None:
    model, mmproj = tiny_vision_model
    facts = read_projector(mmproj)
    assert (facts.vision, facts.audio, facts.projector_type, facts.sees) == (True, False, "gemma3", "images")
    assert (facts.image_size, facts.max_side, facts.max_pixels, facts.mrope) == (IMAGE_SIZE, IMAGE_SIZE, None, False)
    assert facts.projection_dim == read_gguf_info(model).embedding_length == 64
    with pytest.raises(ModelFileError) as info:
        read_projector(model)
    assert "not a vision projector (mmproj): its architecture is gemma3" in str(info.value)


def test_the_library_pairs_a_model_with_the_projector_that_fits_it(
    tiny_vision_model: tuple[Path, Path], starter_model: Path, tmp_path: Path
) -> None:
    model, mmproj = tiny_vision_model
    repo = tmp_path / "models" / "owner" / "repo"
    repo.mkdir(parents=True)
    for path in (model, mmproj):
        shutil.copy(path, repo / path.name)
    shutil.copy(starter_model, repo / "gemma-3-270m-Q4_K_M.gguf")  # another width: not its projector
    library = ModelLibrary(tmp_path / "models")
    by_name = {e.name: e for e in library.scan()}
    vision, text, proj = by_name[model.name], by_name["gemma-3-270m-Q4_K_M.gguf"], by_name[mmproj.name]
    assert vision.projector == repo / mmproj.name and vision.sees == "images"
    assert vision.to_dict()["mmproj"] == str(repo / mmproj.name) and vision.to_dict()["sees"] == "images"
    assert text.projector is None and text.sees == ""
    assert proj.kind == "projector" and proj.chat_problem() is not None
    # The composition root finds the same one for a load, and none for the other model.
    assert projector_for(repo / model.name) == repo / mmproj.name
    assert projector_for(repo / "gemma-3-270m-Q4_K_M.gguf") is None
    assert load_params(repo / model.name, LoadSettings(n_ctx=512)).mmproj_path == repo / mmproj.name
    assert load_params(repo / model.name, LoadSettings(n_ctx=512, mmproj=None)).mmproj_path is None
    # Chosen by hand: kept in the manifest; another model's projector is refused naming both widths.
    elsewhere = tmp_path / "other" / "projector.gguf"
    elsewhere.parent.mkdir()
    shutil.copy(mmproj, elsewhere)
    assert library.chosen_projector(repo / model.name) is None
    library.set_projector(repo / model.name, elsewhere)
    assert library.find(model.name).projector == elsewhere  # type: ignore[union-attr]
    assert library.chosen_projector(repo / model.name) == elsewhere  # read without a scan
    with pytest.raises(ModelFileError) as info:
        library.set_projector(repo / "gemma-3-270m-Q4_K_M.gguf", elsewhere)
    assert "is the projector of another model: it makes embeddings of width 64" in str(info.value)
    library.set_projector(repo / model.name, None)
    assert library.find(model.name).projector == repo / mmproj.name  # type: ignore[union-attr]
    assert library.chosen_projector(repo / model.name) is None
    # A chosen file that is gone: the one found beside the model again, in the scan and for a load.
    library.set_projector(repo / model.name, elsewhere)
    elsewhere.unlink()
    assert library.find(model.name).projector == repo / mmproj.name  # type: ignore[union-attr]
    assert library.chosen_projector(repo / model.name) is None


def test_the_fit_verdict_counts_the_projector(tiny_vision_model: tuple[Path, Path]) -> None:
    model, mmproj = tiny_vision_model
    info, proj = read_gguf_info(model), read_gguf_info(mmproj)
    hw = HardwareInfo(16 * 2**30, 16 * 2**30, 2, 2, "test CPU", gpu_offload_supported=False)
    alone = estimate_fit(info, hw, 512)
    both = estimate_fit(info, hw, 512, projector=proj)
    patches = (IMAGE_SIZE // 8) ** 2
    assert projector_bytes(proj) == proj.tensor_bytes + patches * (8 * 32 + 2 * 64) * 4
    assert both.projector_bytes == projector_bytes(proj)
    assert both.total_bytes == alone.total_bytes + both.projector_bytes
    assert "+ projector " in both.message and "+ projector " not in alone.message
