"""The local model library: scanning in place, bad files, duplicates, missing folders, provenance,
ownership-checked removal."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from gguf_fixtures import STRING, UINT16, build, default_kvs, default_tensors, kv

from engine import library as library_module
from engine.errors import ModelFileError
from engine.gguf import read_gguf_info
from engine.library import ModelLibrary, read_model_info, split_parts


def _model(path: Path, name: str = "Tiny Test") -> Path:
    kvs = [k if b"general.name" not in k else kv("general.name", STRING, name) for k in default_kvs()]
    path.parent.mkdir(parents=True, exist_ok=True)
    return build(kvs).write(path)


@pytest.fixture
def lib(tmp_path: Path) -> ModelLibrary:
    return ModelLibrary(
        tmp_path / "data" / "models",
        [],
        tmp_path / "data" / "models" / "manifest.json",
        folders_file=tmp_path / "config" / "model_folders.json",
    )


def test_scan_lists_models_and_bad_files_without_crashing(lib: ModelLibrary) -> None:
    good = _model(lib.models_dir / "tiny.gguf")
    _model(lib.models_dir / "publisher" / "repo" / "nested.gguf", name="Nested")
    (lib.models_dir / "lfs.gguf").write_text("version https://git-lfs.github.com/spec/v1\nsize 9\n")
    (lib.models_dir / "empty.gguf").write_bytes(b"")
    (lib.models_dir / "notes.txt").write_text("not a model")
    (lib.models_dir / ".hidden.gguf").write_bytes(b"junk")
    entries = {e.name: e for e in lib.scan()}
    assert set(entries) == {"tiny.gguf", "nested.gguf", "lfs.gguf", "empty.gguf"}
    tiny = entries["tiny.gguf"]
    assert tiny.path == good
    assert (tiny.architecture, tiny.quant, tiny.context_length) == ("llama", "F16", 128)
    assert tiny.info is not None
    assert tiny.params == tiny.info.n_params
    assert tiny.owned
    assert tiny.available
    assert tiny.error is None
    assert tiny.has_chat_template
    assert tiny.size == good.stat().st_size
    assert entries["nested.gguf"].title == "Nested"
    assert entries["lfs.gguf"].error == "this is a Git LFS pointer, not the model: download the real file"
    assert entries["lfs.gguf"].architecture is None
    assert entries["empty.gguf"].error is not None
    assert "empty" in entries["empty.gguf"].error
    assert json.dumps([e.to_dict() for e in entries.values()])  # JSON-ready


def test_extra_folders_are_indexed_in_place(lib: ModelLibrary, tmp_path: Path) -> None:
    extra = tmp_path / "lmstudio"
    outside = _model(extra / "pub" / "repo" / "other.gguf", name="Other")
    assert lib.add_folder(extra) == extra
    (entry,) = lib.scan()
    assert entry.path == outside
    assert not entry.owned
    assert entry.folder == extra
    assert not lib.models_dir.exists() or not any(lib.models_dir.rglob("*.gguf"))  # nothing copied
    # persisted for the next instance
    again = ModelLibrary(lib.models_dir, [], lib.manifest_path, folders_file=lib.folders_file)
    assert again.extra_dirs == [extra]
    with pytest.raises(ModelFileError, match="no such folder"):
        lib.add_folder(tmp_path / "nope")
    lib.remove_folder(extra)
    assert lib.scan() == []
    assert outside.exists()
    with pytest.raises(ModelFileError, match="not a library folder"):
        lib.remove_folder(extra)


def test_missing_folder_is_unavailable_not_dropped(lib: ModelLibrary, tmp_path: Path) -> None:
    drive = tmp_path / "usb"
    _model(drive / "big.gguf")
    lib.add_folder(drive)
    lib.record_provenance(drive / "big.gguf", repo="org/big-GGUF")
    assert lib.scan()[0].available
    drive.rename(tmp_path / "usb-unplugged")
    (entry,) = lib.scan()
    assert not entry.available
    assert entry.error is not None
    assert "unavailable" in entry.error
    assert entry.architecture == "llama"  # remembered from the last scan
    assert entry.provenance["repo"] == "org/big-GGUF"
    status = {f.path: f for f in lib.folders()}
    assert not status[drive].available
    assert lib.extra_dirs == [drive]  # still in the library
    (tmp_path / "usb-unplugged").rename(drive)
    assert lib.scan()[0].available


def test_duplicates_are_shown_once(lib: ModelLibrary, tmp_path: Path) -> None:
    owned = _model(lib.models_dir / "tiny.gguf")
    extra = tmp_path / "hf-cache"
    copy = extra / "snapshots" / "abc" / "tiny-copy.gguf"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(owned, copy)
    different = _model(extra / "different.gguf", name="Different")
    lib.add_folder(extra)
    entries = lib.scan()
    by_name = {e.name: e for e in entries}
    assert set(by_name) == {"tiny.gguf", "different.gguf"}
    assert by_name["different.gguf"].path == different
    assert by_name["tiny.gguf"].duplicates == [copy]
    assert by_name["tiny.gguf"].owned  # the owned copy is the one shown


def test_duplicates_by_sha256_join_fingerprint_copies(lib: ModelLibrary, tmp_path: Path) -> None:
    owned = _model(lib.models_dir / "a.gguf")
    extra = tmp_path / "x"
    extra.mkdir()
    shutil.copyfile(owned, extra / "b.gguf")
    lib.add_folder(extra)
    lib.record_provenance(owned, sha256="ab" * 32, repo="org/repo")
    (entry,) = lib.scan()
    assert entry.path == owned
    assert entry.duplicates == [extra / "b.gguf"]
    assert entry.provenance["sha256"] == "ab" * 32


def test_provenance_is_kept_relative_for_owned_files(lib: ModelLibrary, tmp_path: Path) -> None:
    path = _model(lib.models_dir / "q.gguf")
    lib.record_provenance(
        path, repo="org/r", revision="main", sha256="cd" * 32, quantized_from="src.gguf", label="My model"
    )
    manifest = json.loads(lib.manifest_path.read_text())
    assert manifest["models"]["q.gguf"]["repo"] == "org/r"
    (entry,) = lib.scan()
    assert entry.label == "My model"
    assert entry.provenance["quantized_from"] == "src.gguf"
    # the whole data folder moves (a new GLASSBOX_HOME): provenance follows
    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "data"), moved)
    other = ModelLibrary(moved / "models", [], moved / "models" / "manifest.json")
    (entry,) = other.scan()
    assert entry.provenance["repo"] == "org/r"
    with pytest.raises(ValueError, match="unknown provenance fields: colour"):
        lib.record_provenance(path, colour="red")
    lib.record_provenance(moved / "models" / "q.gguf", label=None)


def test_find_by_name_stem_path_and_label(lib: ModelLibrary) -> None:
    path = _model(lib.models_dir / "Tiny-Q4.gguf")
    lib.record_provenance(path, label="Starter")
    for spec in ("Tiny-Q4.gguf", "tiny-q4", str(path), "starter"):
        found = lib.find(spec)
        assert found is not None
        assert found.path == path
    assert lib.find("nothing") is None


def test_remove_only_deletes_owned_files(lib: ModelLibrary, tmp_path: Path) -> None:
    owned = _model(lib.models_dir / "mine.gguf")
    lib.record_provenance(owned, repo="org/mine")
    extra = tmp_path / "theirs"
    theirs = _model(extra / "theirs.gguf", name="Theirs")
    lib.add_folder(extra)
    with pytest.raises(ModelFileError, match="only deletes files it owns"):
        lib.remove("theirs")
    assert theirs.exists()
    with pytest.raises(ModelFileError, match="no such model"):
        lib.remove("ghost")
    assert lib.remove("mine") == [owned]
    assert not owned.exists()
    assert "mine.gguf" not in json.loads(lib.manifest_path.read_text())["models"]
    assert [e.name for e in lib.scan()] == ["theirs.gguf"]


def test_a_duplicate_outside_is_found_by_name_but_never_deleted(lib: ModelLibrary, tmp_path: Path) -> None:
    mine = _model(lib.models_dir / "mine.gguf")
    extra = tmp_path / "elsewhere"
    extra.mkdir()
    theirs = extra / "theirs.gguf"
    shutil.copyfile(mine, theirs)
    lib.add_folder(extra)
    found = lib.find("theirs")
    assert found is not None
    assert (found.path, found.owned, found.folder, found.duplicates) == (theirs, False, extra, [mine])
    with pytest.raises(ModelFileError, match="only deletes files it owns"):
        lib.remove("theirs")
    with pytest.raises(ModelFileError, match="only deletes files it owns"):
        lib.remove(theirs)
    assert mine.exists()
    assert theirs.exists()
    assert lib.remove("mine") == [mine]
    assert theirs.exists()
    (entry,) = lib.scan()
    assert entry.path == theirs


def test_remove_refuses_ambiguous_names(lib: ModelLibrary) -> None:
    _model(lib.models_dir / "a" / "same.gguf")
    _model(lib.models_dir / "b" / "same.gguf", name="Other bytes")
    with pytest.raises(ModelFileError, match="2 models have that name"):
        lib.remove("same.gguf")
    assert lib.remove(lib.models_dir / "b" / "same.gguf") == [lib.models_dir / "b" / "same.gguf"]


def _split(folder: Path, stem: str, total: int) -> list[Path]:
    """A model split like gguf-split does: part 1 has the metadata, the others only split.* keys."""
    tensors = default_tensors()
    per_part = -(-len(tensors) // total)
    paths = []
    for i in range(total):
        kvs = [kv("split.no", UINT16, i), kv("split.count", UINT16, total)]
        if i == 0:
            kvs = default_kvs() + kvs
        path = folder / f"{stem}-{i + 1:05d}-of-{total:05d}.gguf"
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(build(kvs, tensors[i * per_part : (i + 1) * per_part]).write(path))
    return paths


def test_split_models_are_one_entry_and_a_missing_part_is_named(lib: ModelLibrary) -> None:
    parts = _split(lib.models_dir, "big", 3)
    half = _split(lib.models_dir, "half", 2)
    half[1].unlink()
    whole = read_gguf_info(build().write(lib.models_dir.parent / "whole.gguf"))
    entries = {e.name: e for e in lib.scan()}
    assert set(entries) == {"big-00001-of-00003.gguf", "half-00001-of-00002.gguf"}
    big = entries["big-00001-of-00003.gguf"]
    assert big.parts == parts
    assert big.size == sum(p.stat().st_size for p in parts)
    assert big.error is None
    assert big.info is not None
    # the merged header counts every part's tensors, as one file would
    assert (big.params, big.info.tensor_bytes, big.info.layer_bytes) == (
        whole.n_params,
        whole.tensor_bytes,
        whole.layer_bytes,
    )
    assert read_model_info(parts[0]).n_params == whole.n_params
    assert read_gguf_info(parts[1]).architecture == ""  # a later part alone has no metadata
    assert split_parts(parts[2]) == parts
    assert entries["half-00001-of-00002.gguf"].error == "part 2 of 2 is missing"
    with pytest.raises(ModelFileError, match="part 2 of 2 is missing"):
        read_model_info(half[0])
    assert len(lib.remove("big-00001-of-00003.gguf")) == 3
    assert not any(lib.models_dir.glob("big-*"))


def test_header_cache_avoids_rereading_unchanged_files(lib: ModelLibrary, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _model(lib.models_dir / "m.gguf")
    assert lib.scan()[0].architecture == "llama"

    def boom(_path: Path) -> None:
        raise AssertionError("header read again")

    monkeypatch.setattr(library_module, "read_gguf_info", boom)
    assert lib.scan()[0].architecture == "llama"
    monkeypatch.undo()
    path.write_bytes(b"<html>replaced by an error page</html>")
    (entry,) = lib.scan()
    assert entry.error is not None
    assert "HTML" in entry.error


def test_corrupt_manifest_is_moved_aside(lib: ModelLibrary) -> None:
    _model(lib.models_dir / "m.gguf")
    lib.manifest_path.write_text("{broken")
    assert len(lib.scan()) == 1
    assert list(lib.models_dir.glob("manifest.json.corrupt-*"))
    assert json.loads(lib.manifest_path.read_text())["version"] == 1


def test_no_temporary_files_left_after_writes(lib: ModelLibrary) -> None:
    path = _model(lib.models_dir / "m.gguf")
    for i in range(5):
        lib.record_provenance(path, revision=str(i))
    assert sorted(p.name for p in lib.models_dir.iterdir()) == ["m.gguf", "manifest.json"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symlinks")
def test_dangling_symlink_is_skipped(lib: ModelLibrary, tmp_path: Path) -> None:
    lib.models_dir.mkdir(parents=True)
    (lib.models_dir / "gone.gguf").symlink_to(tmp_path / "nowhere.gguf")
    assert lib.scan() == []


@pytest.mark.model
def test_starter_model_in_the_library(lib: ModelLibrary, starter_model: Path) -> None:
    lib.models_dir.mkdir(parents=True)
    (lib.models_dir / starter_model.name).symlink_to(starter_model)
    (entry,) = lib.scan()
    assert (entry.architecture, entry.quant) == ("gemma3", "Q4_K_M")
    assert entry.params == 268_098_176
    assert not entry.has_chat_template


def test_embedders_and_projectors_are_marked_and_not_offered_for_chat(lib: ModelLibrary) -> None:
    from tiny_models import write_tiny_llama_gguf

    lib.models_dir.mkdir(parents=True)
    write_tiny_llama_gguf(lib.models_dir / "chat.gguf")
    write_tiny_llama_gguf(lib.models_dir / "minilm.gguf", arch="bert")
    write_tiny_llama_gguf(lib.models_dir / "mmproj.gguf", arch="clip")
    by_name = {e.name: e for e in lib.scan()}
    assert by_name["chat.gguf"].kind == "chat"
    assert by_name["chat.gguf"].chat_problem() is None
    assert by_name["minilm.gguf"].kind == "embedding"
    assert "embedding model (bert)" in (by_name["minilm.gguf"].chat_problem() or "")
    assert by_name["mmproj.gguf"].kind == "projector"
    assert "vision projector" in (by_name["mmproj.gguf"].chat_problem() or "")
    assert by_name["minilm.gguf"].to_dict()["kind"] == "embedding"


def test_lora_adapters_are_listed_with_their_base_and_never_offered_for_chat(lib: ModelLibrary) -> None:
    from lora_fixtures import write_gguf_lora
    from tiny_models import write_tiny_llama_gguf

    from engine.lora import fitting_adapters

    lib.models_dir.mkdir(parents=True)
    base = write_tiny_llama_gguf(lib.models_dir / "chat.gguf")
    other = write_tiny_llama_gguf(lib.models_dir / "wide.gguf", n_embd=512, n_ff=1024)
    adapter = write_gguf_lora(lib.models_dir / "style-lora.gguf", base)
    lib.record_provenance(adapter, base_model="chat.gguf")
    by_name = {e.name: e for e in lib.scan()}
    entry = by_name["style-lora.gguf"]
    assert entry.kind == "adapter" and entry.architecture == "llama"  # a chat architecture, still not a chat model
    assert entry.base_model == "chat.gguf"
    assert entry.chat_problem() == (
        "a LoRA adapter for chat.gguf: it changes a chat model's replies (apply it with --lora), it cannot chat alone"
    )
    assert entry.to_dict()["base_model"] == "chat.gguf"
    assert by_name["chat.gguf"].base_model is None
    assert fitting_adapters([adapter], base) == [adapter]
    assert fitting_adapters([adapter], other) == []
