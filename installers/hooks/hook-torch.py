"""PyInstaller hook for torch, CPU build (overrides pyinstaller-hooks-contrib's hook-torch).

Differences from the contrib hook: no NVIDIA/CUDA hidden imports (the app bundles the CPU wheel;
README.md explains the GPU variant), and no headers, CMake files, test libraries or the
``torch.testing._internal`` test suite. Like the contrib hook, modules are collected as both
bytecode and source (``pyz+py``), because TorchScript and ``inspect`` read the source.
"""

import os

from PyInstaller import compat
from PyInstaller.utils.hooks import PY_DYLIB_PATTERNS, collect_data_files, collect_dynamic_libs, collect_submodules

module_collection_mode = "pyz+py"
warn_on_missing_hiddenimports = False

_SKIP_MODULES = (
    "torch.testing._internal",
    "torch.utils.tensorboard",
    "torch.utils.benchmark",
    "torch.utils.bottleneck",
    "torch.distributed.elastic",
    "torch.onnx._internal.exporter",
    "torch.ao.pruning",
)
_SKIP_FILES = [
    "**/*.h",
    "**/*.hpp",
    "**/*.cuh",
    "**/*.lib",
    "**/*.cpp",
    "**/*.pyi",
    "**/*.cmake",
    "**/include/**",
    "**/share/cmake/**",
    "**/testing/_internal/**",
    # torch's C++ test programs (about 120 MB); bin/torch_shm_manager stays: `import torch` checks it.
    "test/**",
    "bin/protoc*",
    "bin/test_*",
    "bin/*Test",
    "bin/*.ptl",
    "bin/upgrader_models/**",
]
# Shared libraries only used by torch's own C++ tests.
_TEST_LIBS = ("libjitbackend_test", "libtorchbind_test", "libbackend_with_compiler", "libaoti_custom_ops")


def _wanted(name: str) -> bool:
    return not name.startswith(_SKIP_MODULES)


hiddenimports = collect_submodules("torch", filter=_wanted)
datas = collect_data_files("torch", excludes=_SKIP_FILES)
binaries = [
    (src, dest)
    for src, dest in collect_dynamic_libs("torch", search_patterns=[*PY_DYLIB_PATTERNS, "*.so.*"])
    if not os.path.basename(src).startswith(_TEST_LIBS)
]
if compat.is_linux:
    # As in the contrib hook: symlinks from torch/lib to the bundle's top confuse torch's own
    # library lookup (requires PyInstaller >= 6.11).
    bindepend_symlink_suppression = ["**/torch/lib/*.so*"]
