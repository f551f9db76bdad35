"""PyInstaller hook for llama-cpp-python: its native libraries and the Jinja chat templates.

``llama_cpp.llama_cpp`` loads ``lib/libllama.so`` (``llama.dll``, ``libllama.dylib``) through
ctypes from the folder next to its own ``__file__``, so the libraries must land in
``llama_cpp/lib`` inside the bundle, not at its top. PyInstaller's binary analysis then follows
their ``NEEDED`` entries (``libggml.so.0``, ``libggml-base.so.0``, ``libggml-cpu.so.0``) through
the ``$ORIGIN`` runpath and places them beside them.

The portable build (``installers/llama_build.py``) has no ``libggml-cpu``: one CPU library per CPU
generation (``libggml-cpu-haswell.so``, ``libggml-cpu-zen4.so``...), which ``engine.cpu_backend``
loads at run time; nothing links to them, so they are collected by name with the other ``ggml-*``
libraries. A GPU build adds backend libraries to the same folder (``libggml-cuda.so``,
``ggml-vulkan.dll``...), collected the same way, so one spec serves both.
"""

from pathlib import Path

from PyInstaller.utils.hooks import collect_data_files, copy_metadata, get_package_paths

# Library names that the ctypes loaders open by name (llama_cpp.py, mtmd_cpp.py, _ggml.py).
_LOADED = ("llama", "mtmd", "ggml", "ggml-base")
_SUFFIXES = (".so", ".dylib", ".dll")


def _native_libraries() -> list[tuple[str, str]]:
    _, package_dir = get_package_paths("llama_cpp")
    lib_dir = Path(package_dir) / "lib"
    if not lib_dir.is_dir():
        raise SystemExit(f"{lib_dir}: llama-cpp-python has no native libraries (was it built?)")
    found: list[tuple[str, str]] = []
    for path in sorted(lib_dir.iterdir()):
        name = path.name
        stem = name.removeprefix("lib")
        for suffix in _SUFFIXES:
            if not name.endswith(suffix):
                continue
            base = stem[: -len(suffix)]
            # The names ctypes opens, plus every ggml backend (a GPU build loads them by name too).
            if base in _LOADED or base.startswith("ggml-"):
                found.append((str(path), "llama_cpp/lib"))
    if not any(Path(src).name.startswith(("libllama.", "llama.")) for src, _ in found):
        raise SystemExit(f"{lib_dir}: no llama library in it (found: {sorted(p.name for p in lib_dir.iterdir())})")
    return found


binaries = _native_libraries()
# The portable build's marker (installers/llama_build.py): the self-test reports the flags from it.
_MARKER = Path(get_package_paths("llama_cpp")[1]) / "lib" / "glassbox-build.json"
# Chat-format helpers and the server's templates are data files inside the package.
datas = collect_data_files("llama_cpp", excludes=["**/lib/*", "**/*.pyi", "**/py.typed"])
datas += copy_metadata("llama_cpp_python")
if _MARKER.is_file():
    datas.append((str(_MARKER), "llama_cpp/lib"))
hiddenimports = ["llama_cpp.llama_cpp", "llama_cpp.mtmd_cpp", "llama_cpp._ggml", "llama_cpp.llama_chat_format"]
