"""installers/llama_build.py: the portable flags, a wheel folder per flag set, and the check that
refuses a build made otherwise (a native build must never be shipped or silently reused)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("glassbox_llama_build", ROOT / "installers" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


lb = _load()


@pytest.mark.parametrize(
    ("system", "machine"), [("Linux", "x86_64"), ("Windows", "AMD64"), ("Linux", "aarch64"), ("Darwin", "arm64")]
)
def test_no_platform_is_built_native(system: str, machine: str) -> None:
    flags = lb.cmake_flags(system, machine)
    assert flags[0] == "-DGGML_NATIVE=OFF"
    assert not any(f.startswith("-DGGML_NATIVE=ON") for f in flags)
    dispatch = {"-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON"}
    if system == "Darwin":
        assert not dispatch & set(flags)  # one CPU backend with llama.cpp's Apple defaults
    else:
        assert dispatch <= set(flags)


def test_gpu_and_extra_flags_keep_the_portable_ones_and_change_the_key() -> None:
    base = lb.cmake_flags("Linux", "x86_64")
    cuda = lb.cmake_flags("Linux", "x86_64", gpu="cuda", extra=["-DCMAKE_CUDA_ARCHITECTURES=75;80"])
    assert cuda[: len(base)] == base
    assert cuda[len(base) :] == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=75;80"]
    keys = {lb.build_key("0.3.36", f, "Linux", "x86_64") for f in (base, cuda)}
    keys.add(lb.build_key("0.3.37", base, "Linux", "x86_64"))
    assert len(keys) == 3  # another version or other flags: another wheel folder, never a reused wheel
    for bad in ("-DGGML_NATIVE=ON", "-DGGML_BACKEND_DL:BOOL=OFF", "GGML_AVX512=ON"):
        with pytest.raises(lb.BuildError):
            lb.cmake_flags("Linux", "x86_64", extra=[bad])
    with pytest.raises(lb.BuildError):
        lb.cmake_flags("Linux", "x86_64", gpu="opencl-ish")


def test_the_version_comes_from_the_pin_in_pyproject() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"llama-cpp-python=={lb.pinned_version()}"' in text


def _fake_install(site: Path, marker: dict[str, object] | None) -> Path:
    lib = site / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (site / "llama_cpp" / "__init__.py").write_text("", encoding="utf-8")
    (lib / "libggml-base.so").write_bytes(b"\x7fELF base")
    (lib / "libggml-cpu-haswell.so").write_bytes(b"\x7fELF haswell")
    if marker is not None:
        (lib / lb.MARKER).write_text(json.dumps(marker), encoding="utf-8")
    return lib


def test_check_refuses_a_build_it_did_not_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    lib = _fake_install(tmp_path, None)
    with pytest.raises(lb.BuildError, match=r"not built by installers/llama_build\.py"):
        lb.check(sys.executable)
    flags = lb.cmake_flags()
    key = lb.build_key(lb.pinned_version(), flags)
    marker = {"key": key, "version": lb.pinned_version(), "cmake_args": flags, "libs": lb._libs_digest(lib)}
    (lib / lb.MARKER).write_text(json.dumps(marker), encoding="utf-8")
    assert "portable build" in lb.check(sys.executable)
    # Built with other flags: named, with the command that fixes it.
    (lib / lb.MARKER).write_text(json.dumps({**marker, "key": "0" * 16, "cmake_args": ["-DGGML_NATIVE=ON"]}))
    with pytest.raises(lb.BuildError, match="was built with -DGGML_NATIVE=ON"):
        lb.check(sys.executable)
    # Rebuilt by other means since (e.g. pip --force-reinstall): the marker no longer matches the files.
    (lib / lb.MARKER).write_text(json.dumps(marker), encoding="utf-8")
    (lib / "libggml-cpu-haswell.so").write_bytes(b"\x7fELF native")
    with pytest.raises(lb.BuildError, match="or was rebuilt since"):
        lb.check(sys.executable)


def test_install_reuses_only_the_wheel_of_its_own_flag_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLASSBOX_WHEEL_CACHE", str(tmp_path / "wheels"))
    version = lb.pinned_version()
    portable = lb.wheel_folder(lb.build_key(version, lb.cmake_flags()), version)
    cuda = lb.wheel_folder(lb.build_key(version, lb.cmake_flags(gpu="cuda")), version)
    assert portable != cuda and portable.parent == cuda.parent == tmp_path / "wheels"
    cuda.mkdir(parents=True)
    (cuda / f"llama_cpp_python-{version}-py3-none-any.whl").write_bytes(b"")
    built: list[Path] = []

    def fake_build(version: str, flags: list[str], folder: Path, python: str) -> Path:
        built.append(folder)
        return folder / "x.whl"

    # A folder's own wheel is reused, without building...
    wheel = lb.build_wheel(version, lb.cmake_flags(gpu="cuda"), cuda, sys.executable)
    assert wheel.parent == cuda
    # ...but with the portable flags asked for, the CUDA wheel is not taken: its own folder is built.
    monkeypatch.setattr(lb, "build_wheel", fake_build)
    monkeypatch.setattr(lb, "installed_build", lambda python: None)
    monkeypatch.setattr(lb.subprocess, "run", lambda *a, **k: type("Done", (), {"returncode": 1})())
    with pytest.raises(lb.BuildError):
        lb.install(sys.executable, None)
    assert built == [portable]


def test_workflows_build_llama_cpp_portable_and_run_the_tests() -> None:
    import yaml

    workflows = ROOT / ".github" / "workflows"
    installers = yaml.safe_load((workflows / "installers.yml").read_text(encoding="utf-8"))
    script = "\n".join(step.get("run", "") for step in installers["jobs"]["build"]["steps"])
    assert script.index("installers/llama_build.py install") < script.index('pip install -e ".[demo,dev]"')
    test = yaml.safe_load((workflows / "test.yml").read_text(encoding="utf-8"))
    # PyYAML reads the bare key `on` as True.
    assert {"push", "pull_request"} <= set(test.get("on", test.get(True)))
    runs = [step.get("run", "") for step in test["jobs"]["test"]["steps"]]
    assert any(run.startswith("make test") for run in runs)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "installers/llama_build.py install" in makefile


def test_the_sdist_is_kept_beside_the_wheel_and_fetched_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = lb.pinned_version()
    folder = tmp_path / "wheels" / "key"
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **_: object) -> object:
        calls.append(cmd)
        (folder / f"llama_cpp_python-{version}.tar.gz").write_bytes(b"sdist")
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(lb.subprocess, "run", fake_run)
    first = lb.fetch_sdist(version, folder, sys.executable)
    assert first == lb.sdist_file(folder, version) and first.read_bytes() == b"sdist"
    assert calls and "download" in calls[0] and f"llama-cpp-python=={version}" in calls[0]
    assert lb.fetch_sdist(version, folder, sys.executable) == first
    assert len(calls) == 1  # kept: the second call downloads nothing
    # A download that leaves no file is an error naming the folder, not a missing file later.
    monkeypatch.setattr(lb.subprocess, "run", lambda *a, **k: type("Done", (), {"returncode": 0})())
    with pytest.raises(lb.BuildError, match="could not download its source"):
        lb.fetch_sdist("0.0.1", tmp_path / "other", sys.executable)


def test_the_installed_builds_sdist_carries_llamacpps_published_artifacts(llama_cpp_source: Path) -> None:
    templates = sorted((llama_cpp_source / "models" / "templates").glob("*.jinja"))
    assert len(templates) >= 60
    assert (llama_cpp_source / "tests" / "test-chat.cpp").is_file()
    assert (llama_cpp_source / "convert_hf_to_gguf.py").is_file()
    assert (llama_cpp_source / "gguf-py" / "gguf" / "__init__.py").is_file()
