"""The composition root (app/compose.py), Qt-free: model references and their saved text (the old
``glassbox-remote/...`` pseudo path still read), settings and flags to load parameters, the automatic
GPU layer count (one engine computation, once per load, over every part of a split model), and the
backend a reference opens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app import compose
from app.compose import BackendOptions, LoadSettings, LocalModel, RemoteModel
from app.settings import Settings, load_settings, save_settings
from engine import fit, hardware
from engine.errors import EngineError
from engine.gguf import read_gguf_info
from engine.inference.endpoints import EndpointStore
from engine.library import read_model_info
from tests.engine.gguf_fixtures import UINT16, build, default_kvs, default_tensors, kv

GIB = 1 << 30


def machine(free_vram: int, *, offload: bool = True) -> hardware.HardwareInfo:
    gpu = hardware.GpuInfo(name="test GPU", vendor="nvidia", total_vram=free_vram, free_vram=free_vram)
    return hardware.HardwareInfo(
        total_ram=32 * GIB,
        available_ram=30 * GIB,
        cpu_count_physical=4,
        cpu_count_logical=8,
        cpu_name="test CPU",
        gpu_offload_supported=offload,
        gpus=[gpu],
    )


class Probes(list[hardware.HardwareInfo]):
    """The hardware probes made (each answered with :attr:`answer`)."""

    answer: hardware.HardwareInfo = machine(8 * GIB)


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> Probes:
    """Counts the hardware probes; each answers with ``probes.answer`` (default: an 8 GiB GPU)."""
    calls = Probes()

    def probe() -> hardware.HardwareInfo:
        calls.append(calls.answer)
        return calls.answer

    monkeypatch.setattr(hardware, "probe_hardware", probe)
    return calls


@pytest.fixture
def computations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Counts the engine's automatic layer computations (``engine.fit.auto_gpu_layers``)."""
    calls: list[tuple[Any, ...]] = []
    real = fit.auto_gpu_layers

    def counted(*args: Any, **kwargs: Any) -> int:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(fit, "auto_gpu_layers", counted)
    return calls


def model_file(folder: Path, name: str = "model.gguf", n_layers: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return build(default_kvs(n_layers), default_tensors(n_layers)).write(folder / name)


def split_model(folder: Path, stem: str, total: int, n_layers: int = 8) -> list[Path]:
    """A model split like gguf-split does: part 1 has the metadata, the others only split.* keys."""
    tensors = default_tensors(n_layers)
    per_part = -(-len(tensors) // total)
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(total):
        kvs = [kv("split.no", UINT16, i), kv("split.count", UINT16, total)]
        if i == 0:
            kvs = default_kvs(n_layers) + kvs
        path = folder / f"{stem}-{i + 1:05d}-of-{total:05d}.gguf"
        parts.append(build(kvs, tensors[i * per_part : (i + 1) * per_part]).write(path))
    return parts


# ---------------------------------------------------------------------------- model references


@pytest.mark.parametrize(
    "model",
    [
        LocalModel(Path("/models/owner/repo/qwen-7b.Q4_K_M.gguf")),
        RemoteModel("lab", "org/Model-7B:q4"),
        RemoteModel("box-8000", "model with spaces%and/slashes"),
        RemoteModel("lab", ""),
    ],
)
def test_a_reference_survives_its_saved_text(model: compose.ModelRef) -> None:
    text = compose.model_key(model)
    assert compose.model_ref(text) == model
    assert compose.LEGACY_REMOTE_ROOT not in text
    assert compose.model_ref(model) is model


def test_a_local_model_is_saved_as_its_path_as_before() -> None:
    path = Path("/models/qwen.gguf")
    assert compose.model_key(path) == compose.model_key(LocalModel(path)) == "/models/qwen.gguf"
    assert compose.model_ref("/models/qwen.gguf") == LocalModel(path)
    assert compose.model_ref(path) == LocalModel(path)
    assert compose.model_key(RemoteModel("lab", "org/m:q4")) == "remote:lab/org%2Fm%3Aq4"
    assert RemoteModel("lab", "org/m").name == "org/m" and LocalModel(path).name == "qwen.gguf"


def test_the_old_pseudo_path_is_still_read_and_never_written_again(tmp_path: Path) -> None:
    old = "glassbox-remote/lab/org%2FModel-7B%3Aq4"  # what 0.x saved as settings.last_model
    assert compose.model_ref(old) == RemoteModel("lab", "org/Model-7B:q4")
    assert compose.model_ref(Path(old)) == RemoteModel("lab", "org/Model-7B:q4")
    settings_file = tmp_path / "settings.json"
    save_settings(Settings(last_model=old), settings_file)
    saved = load_settings(settings_file).settings.last_model
    assert saved is not None
    model = compose.model_ref(saved)
    assert model == RemoteModel("lab", "org/Model-7B:q4")
    assert compose.model_key(model) == "remote:lab/org%2FModel-7B%3Aq4"
    # a path that only looks alike is still a file
    assert compose.model_ref("/data/glassbox-remote/lab/m") == LocalModel(Path("/data/glassbox-remote/lab/m"))
    assert compose.model_ref("remote:") == LocalModel(Path("remote:"))


# ---------------------------------------------------------------------------- load parameters


def test_settings_map_to_load_settings_with_the_models_draft(tmp_path: Path) -> None:
    model, draft, other = tmp_path / "big.gguf", tmp_path / "small.gguf", tmp_path / "other.gguf"
    settings = Settings(n_ctx=2048, n_threads=3, gpu_layers=7, draft_models={str(model): str(draft)})
    assert compose.load_settings_from(settings, model) == LoadSettings(2048, 3, 7, draft)
    assert compose.load_settings_from(settings, other) == LoadSettings(2048, 3, 7, None)
    assert compose.load_settings_from(Settings(), other).gpu_layers == "auto"


def test_a_layer_count_is_used_as_given_without_probing(tmp_path: Path, probes: Probes) -> None:
    model = model_file(tmp_path)
    params = compose.load_params(model, LoadSettings(n_ctx=1024, n_threads=2, gpu_layers=5))
    assert (params.model_path, params.n_ctx, params.n_threads, params.n_gpu_layers) == (model, 1024, 2, 5)
    assert params.draft_model_path is None
    assert compose.load_params(model, LoadSettings(gpu_layers=-1)).n_gpu_layers == -1
    assert probes == []


def test_auto_layers_are_computed_once_per_load_by_the_engine(
    tmp_path: Path, probes: Probes, computations: list[Any]
) -> None:
    model = model_file(tmp_path, n_layers=4)
    info = read_model_info(model)
    probes.answer = machine(info.tensor_bytes // 2 + fit.VRAM_RESERVE + 300 * (1 << 20))
    expected = fit.estimate_fit(info, probes.answer, 512).gpu_layers
    assert expected > 0
    params = compose.load_params(model, LoadSettings(n_ctx=512, gpu_layers="auto"))
    assert params.n_gpu_layers == expected
    assert len(probes) == 1 and len(computations) == 1
    assert computations[0][0][1] == 512  # at the context asked for
    compose.load_params(model, LoadSettings(n_ctx=512, gpu_layers="auto"))
    assert len(probes) == 2 and len(computations) == 2  # once per load, never twice


def test_a_split_model_gets_the_same_count_as_the_whole_file(tmp_path: Path, probes: Probes) -> None:
    whole = model_file(tmp_path / "whole", n_layers=8)
    parts = split_model(tmp_path / "split", "big", 3, n_layers=8)
    whole_info = read_model_info(whole)
    assert read_model_info(parts[0]).tensor_bytes == whole_info.tensor_bytes
    # VRAM for the whole model but one byte: the first part alone would fit, the whole does not
    full = fit.estimate_fit(whole_info, machine(1 << 40), 4096)
    hw = machine(full.gpu_bytes + fit.VRAM_RESERVE - 1)
    probes.answer = hw
    first_part_only = fit.auto_gpu_layers(read_gguf_info(parts[0]), 4096, hw)
    whole_count = fit.auto_gpu_layers(whole_info, 4096, hw)
    assert first_part_only != whole_count, "the check below could not tell the two readings apart"
    assert compose.auto_gpu_layers_for(parts[0], 4096) == whole_count


def test_auto_layers_count_the_draft_model_beside_it(tmp_path: Path, probes: Probes) -> None:
    model, draft = model_file(tmp_path, "big.gguf", n_layers=8), model_file(tmp_path, "small.gguf", n_layers=4)
    info = read_model_info(model)
    alone = fit.estimate_fit(info, machine(1 << 40), 512)
    probes.answer = machine(alone.gpu_bytes + fit.VRAM_RESERVE + 1024)
    without = compose.resolve_gpu_layers("auto", model, 512)
    with_draft = compose.resolve_gpu_layers("auto", model, 512, draft)
    assert with_draft < without == len(info.layer_bytes) + 1
    assert with_draft == fit.auto_gpu_layers(info, 512, probes.answer, draft=read_model_info(draft))
    assert compose.resolve_gpu_layers("auto", model, 512, tmp_path / "missing.gguf") == without


@pytest.mark.model
def test_auto_layers_count_the_projector_beside_it(
    tiny_vision_model: tuple[Path, Path], tmp_path: Path, probes: Probes
) -> None:
    import shutil

    model = Path(shutil.copy(tiny_vision_model[0], tmp_path / tiny_vision_model[0].name))
    mmproj = Path(shutil.copy(tiny_vision_model[1], tmp_path / tiny_vision_model[1].name))
    info, projector = read_model_info(model), read_gguf_info(mmproj)
    alone = fit.estimate_fit(info, machine(1 << 40), 512)
    probes.answer = machine(alone.gpu_bytes + fit.VRAM_RESERVE + 1024)  # the model, not its projector too
    without = compose.resolve_gpu_layers("auto", model, 512)
    with_projector = compose.resolve_gpu_layers("auto", model, 512, None, mmproj)
    assert with_projector < without == len(info.layer_bytes) + 1
    assert with_projector == fit.auto_gpu_layers(info, 512, probes.answer, projector=projector)
    # A load finds the projector beside the model and counts it; text only, it is not counted.
    assert compose.load_params(model, LoadSettings(n_ctx=512, gpu_layers="auto")).n_gpu_layers == with_projector
    assert compose.load_params(model, LoadSettings(n_ctx=512, gpu_layers="auto", mmproj=None)).n_gpu_layers == without
    # The window's load: the projector found once, counted, and handed on to the load as is.
    from app.gui.workers.llm_loading import resolve_layers
    from app.gui.workers.llm_requests import LoadRequest

    found = resolve_layers(LoadRequest(model, n_ctx=512, n_gpu_layers="auto"))
    assert (found.n_gpu_layers, found.mmproj_path) == (with_projector, mmproj)
    blind = resolve_layers(LoadRequest(model, n_ctx=512, n_gpu_layers="auto", mmproj_path=None))
    assert (blind.n_gpu_layers, blind.mmproj_path) == (without, None)


def test_auto_is_zero_without_offload_for_remote_models_and_when_unknown(tmp_path: Path, probes: Probes) -> None:
    model = model_file(tmp_path)
    probes.answer = machine(80 * GIB, offload=False)
    assert compose.resolve_gpu_layers("auto", model, 4096) == 0
    count = len(probes)
    assert compose.resolve_gpu_layers("auto", RemoteModel("lab", "m"), 4096) == 0
    assert len(probes) == count, "a remote model probes nothing"
    probes.answer = machine(80 * GIB)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    assert compose.resolve_gpu_layers("auto", broken, 4096) == 0  # advisory: the load says what is wrong


def test_gpu_layers_flag() -> None:
    assert compose.parse_gpu_layers("auto") == "auto"
    assert compose.parse_gpu_layers("12") == 12
    assert compose.parse_gpu_layers("-1") == -1
    with pytest.raises(ValueError, match=r"--gpu-layers must be a number or 'auto', not 'all'"):
        compose.parse_gpu_layers("all")


# ---------------------------------------------------------------------------- backends


@pytest.fixture
def endpoints_file(tmp_path: Path) -> Path:
    store = EndpointStore(tmp_path / "endpoints.json")
    store.add("http://10.9.8.7:8000", name="lab", api_key="sk-lab-secret-0001")
    return store.path


def test_a_remote_model_opens_a_session_on_its_saved_endpoint(endpoints_file: Path) -> None:
    from engine.inference.remote import RemoteSession

    options = BackendOptions(overflow_policy="refuse", reply_reserve=256, n_ctx=2048)
    session = compose.open_backend(RemoteModel("lab", "m-1"), LoadSettings(), options, endpoints_file)
    try:
        assert isinstance(session, RemoteSession)
        assert session.model == "m-1" and session.base_url.startswith("http://10.9.8.7:8000")
        assert (session.overflow_policy, session.reply_reserve) == ("refuse", 256)
    finally:
        session.close()
    first = compose.open_backend(RemoteModel("lab", ""), LoadSettings(), BackendOptions(), endpoints_file)
    try:
        assert isinstance(first, RemoteSession) and first.model == ""  # the server's first model
    finally:
        first.close()


def test_a_remote_model_without_its_endpoint_is_one_line(endpoints_file: Path) -> None:
    with pytest.raises(EngineError, match=r"gone: no saved endpoint by that name \(lab\)"):
        compose.open_backend(RemoteModel("gone", "m"), LoadSettings(), BackendOptions(), endpoints_file)
    with pytest.raises(EngineError, match="lab: no saved endpoints in this window"):
        compose.open_backend(RemoteModel("lab", "m"), LoadSettings(), BackendOptions(), None)


def test_a_local_model_opens_a_session_with_its_load_parameters(tmp_path: Path, probes: Probes) -> None:
    from engine.inference.session import ChatSession

    model = model_file(tmp_path)
    options = BackendOptions(overflow_policy="refuse", reply_reserve=128, backend_state=tmp_path / "cpu.json")
    session = compose.open_backend(LocalModel(model), LoadSettings(n_ctx=256, gpu_layers=0), options, None)
    try:
        assert isinstance(session, ChatSession)
        assert (session.load_params.model_path, session.load_params.n_ctx) == (model, 256)
        assert (session.overflow_policy, session.reply_reserve) == ("refuse", 128)
        assert session.kv_cache is None
    finally:
        session.close()
    assert probes == []
