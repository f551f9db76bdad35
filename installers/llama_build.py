"""The one place that says how llama-cpp-python is built: the Makefile, CI and the installers use it.

A build made with llama.cpp's defaults (``GGML_NATIVE=ON``, i.e. ``-march=native``) runs only on
CPUs like the one that built it: shipped, or copied to another machine, it dies with SIGILL on the
first token. So Glassbox builds llama.cpp the way llama.cpp's own releases are built: no native
flags, the CPU backend as one library per CPU generation (``GGML_BACKEND_DL`` +
``GGML_CPU_ALL_VARIANTS``), and ``engine/cpu_backend.py`` loads the best one this CPU runs.

pip caches built wheels by version, not by build flags, so a wheel built with other flags could be
reused silently. This script never uses pip's cache: it builds into a folder named after a hash of
the version and the flags, installs from there, and leaves a marker in the installed package that
``check`` (and ``installers/build.py``) compare with the flags asked for::

    python installers/llama_build.py flags                 the CMake flags for this platform
    python installers/llama_build.py install [--gpu cuda]  build (once per flag set) and install
    python installers/llama_build.py check                 exit 1 unless the installed build is ours
    python installers/llama_build.py sdist                 the path of the source the build was made from

The wheel is built from the llama-cpp-python sdist, kept beside it in the same folder: the tests read
the published artifacts it carries (llama.cpp's chat templates, its own format tests, its model
converter) from there, never from copies in the repository.

``--gpu`` adds a GPU backend (cuda, metal, vulkan, hip) to the same portable CPU flags, and
``--cmake-arg=-DNAME=VALUE`` any other flag (CUDA architectures, say); both are part of the key.
Environment: ``GLASSBOX_WHEEL_CACHE`` (default ``~/.cache/glassbox-wheels``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = "glassbox-build.json"
GPU_FLAGS = {
    "cuda": ["-DGGML_CUDA=ON"],
    "metal": ["-DGGML_METAL=ON"],
    "vulkan": ["-DGGML_VULKAN=ON"],
    "hip": ["-DGGML_HIP=ON"],
}


class BuildError(Exception):
    """One line for stderr."""


def pinned_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The llama-cpp-python version pinned in pyproject.toml (the one source of the pin)."""
    with pyproject.open("rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    for dep in deps:
        match = re.fullmatch(r"llama-cpp-python==([0-9][0-9A-Za-z.]*)", dep.replace(" ", ""))
        if match:
            return match[1]
    raise BuildError(f"{pyproject}: no llama-cpp-python==VERSION pin in [project] dependencies")


def cmake_flags(
    system: str | None = None, machine: str | None = None, gpu: str | None = None, extra: list[str] | None = None
) -> list[str]:
    """The CMake flags for ``system``/``machine`` (default: this one), GPU backend optional.

    - Linux and Windows, x86-64 and arm64: runtime CPU dispatch. Every CPU variant llama.cpp
      knows is built (x86-64: from SSE4.2 to AVX-512 and AMX; arm64: armv8.0 to armv9.2), and the
      app loads the best one the CPU runs.
    - macOS: ``GGML_NATIVE=OFF`` with llama.cpp's Apple defaults (NEON on Apple Silicon) and Metal,
      which llama-cpp-python turns on there; one CPU backend, linked in.
    """
    system = system or platform.system()
    machine = (machine or platform.machine()).lower()
    flags = ["-DGGML_NATIVE=OFF"]
    if system in ("Linux", "Windows") and machine in ("x86_64", "amd64", "aarch64", "arm64"):
        flags += ["-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib"]
    if gpu is not None:
        if gpu not in GPU_FLAGS:
            raise BuildError(f"--gpu {gpu}: not one of {', '.join(sorted(GPU_FLAGS))}")
        flags += GPU_FLAGS[gpu]
    for flag in extra or []:
        name = flag.split("=", 1)[0].split(":", 1)[0]
        if not flag.startswith("-D") or name in ("-DGGML_NATIVE", "-DGGML_BACKEND_DL"):
            raise BuildError(f"--cmake-arg {flag}: only -DNAME=VALUE, and not one that undoes the portable build")
        flags.append(flag)
    return flags


def build_key(version: str, flags: list[str], system: str | None = None, machine: str | None = None) -> str:
    text = json.dumps([version, system or platform.system(), (machine or platform.machine()).lower(), flags])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def wheel_folder(key: str, version: str) -> Path:
    base = Path(os.environ.get("GLASSBOX_WHEEL_CACHE") or Path.home() / ".cache" / "glassbox-wheels")
    return base / f"llama-cpp-python-{version}-{key}"


def installed_lib_dir(python: str) -> Path | None:
    """``llama_cpp/lib`` in ``python``'s environment, found without importing the package."""
    code = (
        "import importlib.util as u; s = u.find_spec('llama_cpp'); "
        "print(list(s.submodule_search_locations)[0] if s else '')"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    folder = out.stdout.strip()
    return Path(folder) / "lib" if out.returncode == 0 and folder else None


def _libs_digest(lib_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(lib_dir.iterdir()):
        if "ggml" in path.name and path.is_file():
            digest.update(path.name.encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def installed_build(python: str) -> dict[str, object] | None:
    """The marker of the installed build, or None when it is not ours or was changed since."""
    lib = installed_lib_dir(python)
    if lib is None or not (lib / MARKER).is_file():
        return None
    try:
        marker = json.loads((lib / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("libs") != _libs_digest(lib):
        return None  # rebuilt or reinstalled by other means: the marker is stale
    return marker


def sdist_file(folder: Path, version: str) -> Path:
    """Where the sdist of ``version`` is kept in a wheel folder."""
    return folder / f"llama_cpp_python-{version}.tar.gz"


def fetch_sdist(version: str, folder: Path, python: str) -> Path:
    """The sdist of ``version`` in ``folder``, downloaded from the package index when absent."""
    target = sdist_file(folder, version)
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    say(f"llama_build: fetching the llama-cpp-python {version} source")
    cmd = [
        python,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--no-binary",
        ":all:",
        "-d",
        str(folder),
        f"llama-cpp-python=={version}",
    ]
    if subprocess.run(cmd, check=False).returncode != 0 or not target.is_file():
        raise BuildError(f"llama-cpp-python {version}: could not download its source into {folder}")
    return target


def build_wheel(version: str, flags: list[str], folder: Path, python: str) -> Path:
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if wheels:
        return wheels[-1]
    sdist = fetch_sdist(version, folder, python)
    env = dict(os.environ, CMAKE_ARGS=" ".join(flags))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    say(f"llama_build: building llama-cpp-python {version} with {' '.join(flags)} (a few minutes)")
    cmd = [
        python,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "wheel",
        "--no-deps",
        "--no-cache-dir",
        "-w",
        str(folder),
        str(sdist),
    ]
    if subprocess.run(cmd, env=env, check=False).returncode != 0:
        raise BuildError(f"llama-cpp-python {version}: the build failed (flags: {' '.join(flags)})")
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if not wheels:
        raise BuildError(f"{folder}: pip reported success but left no wheel")
    return wheels[-1]


def install(python: str, gpu: str | None, extra: list[str] | None = None) -> dict[str, object]:
    version = pinned_version()
    flags = cmake_flags(gpu=gpu, extra=extra)
    key = build_key(version, flags)
    folder = wheel_folder(key, version)
    current = installed_build(python)
    if current is not None and current.get("key") == key:
        fetch_sdist(version, folder, python)  # a folder from before the sdist was kept gets it now
        say(f"llama_build: llama-cpp-python {version} is installed with these flags ({key})")
        return current
    wheel = build_wheel(version, flags, folder, python)
    cmd = [python, "-m", "pip", "--disable-pip-version-check", "install", "--no-deps", "--force-reinstall", str(wheel)]
    if subprocess.run(cmd, check=False).returncode != 0:
        raise BuildError(f"{wheel}: pip could not install it")
    lib = installed_lib_dir(python)
    if lib is None:
        raise BuildError(f"{wheel}: installed, but {python} cannot find llama_cpp")
    marker: dict[str, object] = {"key": key, "version": version, "cmake_args": flags, "libs": _libs_digest(lib)}
    (lib / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    fetch_sdist(version, folder, python)  # a wheel reused from before the sdist was kept
    say(f"llama_build: installed {wheel.name} ({key})")
    return marker


def check(python: str, gpu: str | None = None, extra: list[str] | None = None) -> str:
    """Raises BuildError unless the installed build is the portable one asked for."""
    version = pinned_version()
    flags = cmake_flags(gpu=gpu, extra=extra)
    marker = installed_build(python)
    if marker is None:
        raise BuildError(
            "llama-cpp-python was not built by installers/llama_build.py (or was rebuilt since): "
            "its CPU code may be native-only; run: python installers/llama_build.py install"
        )
    if marker.get("key") != build_key(version, flags):
        raise BuildError(
            f"llama-cpp-python was built with {' '.join(map(str, marker.get('cmake_args', [])))}, "
            f"not {' '.join(flags)}; run: python installers/llama_build.py install"
        )
    return f"llama-cpp-python {version}, portable build ({' '.join(flags)})"


def installed_sdist(python: str) -> Path:
    """The sdist the installed build was made from (fetched into its wheel folder when missing)."""
    marker = installed_build(python)
    if marker is None:
        raise BuildError("llama-cpp-python was not built by installers/llama_build.py: run make test")
    version, key = str(marker.get("version")), str(marker.get("key"))
    return fetch_sdist(version, wheel_folder(key, version), python)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llama_build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("flags", "install", "check", "sdist"))
    parser.add_argument("--python", default=sys.executable, help="the environment to install into")
    parser.add_argument("--gpu", choices=sorted(GPU_FLAGS), default=os.environ.get("GLASSBOX_LLAMA_GPU") or None)
    parser.add_argument(
        "--cmake-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more CMake flag, e.g. --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=75;80;86;89;90 (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "flags":
            say(" ".join(cmake_flags(gpu=args.gpu, extra=args.cmake_arg)))
        elif args.command == "install":
            install(args.python, args.gpu, args.cmake_arg)
        elif args.command == "sdist":
            say(str(installed_sdist(args.python)))
        else:
            say(check(args.python, args.gpu, args.cmake_arg))
    except BuildError as exc:
        sys.stderr.write(f"llama_build.py: error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
