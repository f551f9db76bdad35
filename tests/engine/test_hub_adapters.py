"""LoRA adapters on the Hub (engine.hub.adapters) against the loopback fake Hub: the search by the
``lora`` and ``base_model:adapter:`` tags with the base each adapts, the headers read by range
request before download and matched against the library's starter model, and a download through
the model download code that the library lists as an adapter with its base, not as a chat model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import FakeHub
from lora_fixtures import write_gguf_lora
from tiny_models import write_tiny_llama_gguf

from engine.errors import DownloadError
from engine.hub.adapters import adapter_base_from_tags, inspect_adapter_repo, search_adapters
from engine.hub.model_download import FileJob, download_files, model_folder
from engine.library import ModelLibrary

STARTER_BASE = "google/gemma-3-270m"
GEMMA_REPO = "acme/gemma-3-270m-style-lora-GGUF"
LLAMA_REPO = "acme/tiny-llama-pirate-lora-GGUF"
MODEL_REPO = "acme/gemma-3-270m-style-GGUF"  # a model repo with the same words: not an adapter
MISLABELLED_REPO = "acme/not-really-a-lora-GGUF"  # tagged lora, holds a model


@pytest.fixture(scope="module")
def files(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("adapters")
    tiny = write_tiny_llama_gguf(folder / "tiny-llama.gguf", n_layer=2)
    return {
        "tiny": tiny,
        "gemma": write_gguf_lora(folder / "style-lora-f16.gguf", starter_model, base_model=STARTER_BASE),
        "llama": write_gguf_lora(folder / "pirate-lora.gguf", tiny),
    }


@pytest.fixture
def hub(files: dict[str, Path]) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(
            GEMMA_REPO,
            {"style-lora-f16.gguf": files["gemma"].read_bytes(), "README.md": b"# a style\n"},
            tags=["lora", f"base_model:{STARTER_BASE}", f"base_model:adapter:{STARTER_BASE}"],
            card_data={"base_model": STARTER_BASE},
            downloads=50,
        )
        server.add_repo(
            LLAMA_REPO,
            {"pirate-lora.gguf": files["llama"].read_bytes()},
            tags=["lora"],
            card_data={"base_model": ["acme/tiny-llama"]},
            downloads=5,
        )
        server.add_repo(MODEL_REPO, {"style-Q4_K_M.gguf": files["tiny"].read_bytes()}, downloads=900)
        server.add_repo(MISLABELLED_REPO, {"model-Q8_0.gguf": files["tiny"].read_bytes()}, tags=["lora"])
        yield server


def test_the_search_finds_adapter_repos_only_each_with_the_base_it_adapts(hub: FakeHub) -> None:
    hits = search_adapters(endpoint=hub.url)
    assert [(h.id, h.base_model) for h in hits] == [
        (GEMMA_REPO, STARTER_BASE),  # from its base_model:adapter: tag
        (LLAMA_REPO, "acme/tiny-llama"),  # no tag: from the model card
        (MISLABELLED_REPO, None),
    ]
    assert [h.id for h in search_adapters("gemma", endpoint=hub.url)] == [GEMMA_REPO]  # not the model repo
    query = next(path for _m, path, _h in hub.requests if "search=gemma" in path)
    assert "filter=gguf" in query and "filter=lora" in query and "expand=tags" in query


def test_the_search_for_one_base_asks_for_its_adapter_tag(hub: FakeHub) -> None:
    hits = search_adapters(base_model=STARTER_BASE, endpoint=hub.url)
    assert [h.id for h in hits] == [GEMMA_REPO]
    assert hits[0].to_dict()["base_model"] == STARTER_BASE
    assert search_adapters(base_model="acme/other", endpoint=hub.url) == []
    with pytest.raises(DownloadError, match="not a Hugging Face repository id"):
        search_adapters(base_model="not a repo", endpoint=hub.url)


def test_base_model_tags_win_over_the_card_and_odd_tags_are_ignored() -> None:
    assert adapter_base_from_tags(["base_model:a/b", "base_model:adapter:c/d"]) == "c/d"
    assert adapter_base_from_tags(["base_model:quantized:a/b"], {"base_model": "e/f"}) == "e/f"
    assert adapter_base_from_tags([3, "lora"], {"base_model": [None, "g/h"]}) == "g/h"
    assert adapter_base_from_tags([], None) is None


def test_headers_are_read_by_range_request_and_matched_against_the_library(
    hub: FakeHub, files: dict[str, Path], starter_model: Path
) -> None:
    library = [starter_model, files["tiny"]]
    gemma = inspect_adapter_repo(GEMMA_REPO, library, endpoint=hub.url)
    [adapter] = gemma.adapters
    assert adapter.is_adapter and adapter.note is None
    assert (adapter.architecture, adapter.rank, adapter.base_model) == ("gemma3", 4, STARTER_BASE)
    assert adapter.fits == (starter_model,)
    size = files["gemma"].stat().st_size
    ranges = [h.get("Range") for _m, path, h in hub.requests if path.startswith("/cdn/")]
    assert size > 256 * 1024 and ranges == ["bytes=0-262143"]  # the header only, not the file

    [llama] = inspect_adapter_repo(LLAMA_REPO, library, endpoint=hub.url).adapters
    assert (llama.is_adapter, llama.architecture, llama.fits) == (True, "llama", (files["tiny"],))
    [other] = inspect_adapter_repo(LLAMA_REPO, [starter_model], endpoint=hub.url).adapters
    assert other.fits == ()  # another architecture than the starter's

    [model] = inspect_adapter_repo(MISLABELLED_REPO, library, endpoint=hub.url).adapters
    assert not model.is_adapter and model.note == "a model file, not a LoRA adapter"
    assert model.to_dict()["fits"] == []


def test_an_unreadable_header_keeps_its_row_with_the_reason(hub: FakeHub, starter_model: Path) -> None:
    hub.faults.status.append(("/cdn/", 500, 1, None))
    [adapter] = inspect_adapter_repo(GEMMA_REPO, [starter_model], endpoint=hub.url).adapters
    assert not adapter.is_adapter and adapter.note is not None and "HTTP 500" in adapter.note


def test_a_downloaded_adapter_is_listed_with_its_base_and_not_as_a_chat_model(
    hub: FakeHub, files: dict[str, Path], starter_model: Path, tmp_path: Path
) -> None:
    models_dir = tmp_path / "models"
    library = ModelLibrary(models_dir, [starter_model.parent], models_dir / "manifest.json")
    repo = inspect_adapter_repo(GEMMA_REPO, [starter_model], endpoint=hub.url)
    choice = repo.adapters[0].choice
    [file] = choice.files
    dest = model_folder(models_dir, GEMMA_REPO, [file.filename])
    job = FileJob(GEMMA_REPO, file.filename, dest, repo.files.commit or "main", hub.url, file.sha256, file.size)
    outcome = download_files([job], disk_margin_bytes=0)
    assert outcome.complete and outcome.downloaded[0].sha256 == hashlib.sha256(files["gemma"].read_bytes()).hexdigest()

    by_path = {e.path: e for e in library.scan()}
    entry = by_path[dest / file.filename]
    assert entry.kind == "adapter" and entry.architecture == "gemma3"
    assert entry.base_model == STARTER_BASE
    assert entry.chat_problem() is not None and "LoRA adapter for google/gemma-3-270m" in entry.chat_problem()
    assert by_path[starter_model].kind == "chat"
