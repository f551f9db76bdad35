"""llama.cpp's published artifacts, read from the llama-cpp-python sdist the build was made from.

`installers/llama_build.py` keeps the sdist beside the wheel it built. The tests read the chat
templates llama.cpp keeps (`models/templates/`), its grammars (`grammars/`), its own format and grammar
tests (`tests/test-chat.cpp`, `tests/test-grammar-*.cpp`), its
converters (`convert_hf_to_gguf.py` with `conversion/` and `gguf-py/`, `convert_lora_to_gguf.py`)
and its server tests from there, never from copies in this repository. The parts the tests use are
unpacked once per version into the test cache.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tarfile
from functools import cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
_CACHE = Path(os.environ.get("GLASSBOX_TEST_CACHE", ROOT / ".home" / "test-cache"))
# What the tests read, relative to vendor/llama.cpp in the sdist.
_PARTS = (
    "models/templates/",
    "tests/",
    "conversion/",
    "gguf-py/",
    "convert_hf_to_gguf.py",
    "convert_lora_to_gguf.py",
    "tools/server/tests/",
    "grammars/",
)


def _llama_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("glassbox_llama_build_sdist", ROOT / "installers" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def llama_cpp_source() -> Path:
    """The unpacked `vendor/llama.cpp` of the installed build's sdist (the parts in `_PARTS`).

    Raises:
        RuntimeError: llama-cpp-python was not installed by `installers/llama_build.py`.
    """
    build = _llama_build()
    try:
        sdist = build.installed_sdist(sys.executable)
    except build.BuildError as exc:
        raise RuntimeError(str(exc)) from exc
    name = sdist.name.removesuffix(".tar.gz")
    target = _CACHE / "llama-sdist" / name
    done = target / ".unpacked"
    marker = f"{sdist}\n{' '.join(_PARTS)}"  # a part added since: unpacked again
    if not done.is_file() or done.read_text(encoding="utf-8") != marker:
        prefix = f"{name}/vendor/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                if member.name.startswith(prefix) and member.name[len(prefix) :].startswith(_PARTS):
                    member.name = member.name[len(prefix) :]
                    members.append(member)
            archive.extractall(target, members=members, filter="data")
        done.write_text(marker, encoding="utf-8")
    return target
