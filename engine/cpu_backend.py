"""Which CPU code llama.cpp runs: the portable build's variants, the choice among them, the AMX guard.

Contract: ARCHITECTURE.md, 'engine.cpu_backend'.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "AMX_TAGS",
    "AMX_VM_NOTE",
    "BUILD_MARKER",
    "BackendInfo",
    "BackendPolicy",
    "BackendState",
    "CpuVariant",
    "amx_kernel_problem",
    "build_marker",
    "choose_variant",
    "cpu_name",
    "describe_crash",
    "is_cpu_fault",
    "is_virtual_machine",
    "lib_dir",
    "load_backends",
    "load_backends_for",
    "safe_variant",
    "variant_files",
    "xcomp_supported",
]

# Variants whose kernels run AMX tiles; guarded until proven on this machine.
AMX_TAGS = frozenset({"sapphirerapids"})
# The variant a crash falls back to: the most capable one without AVX-512 or AMX that the CPU
# supports (AVX2+FMA+F16C covers every x86-64 CPU since 2013), else the next older one.
SAFE_ORDER = ("haswell", "piledriver", "ivybridge", "sandybridge", "sse42", "x64")
_VARIANT_RE = re.compile(r"^(?:lib)?ggml-cpu-(?P<tag>[A-Za-z0-9_.]+?)\.(?:so|dll|dylib)$")
_GPU_RE = re.compile(
    r"^(?:lib)?ggml-(?P<name>cuda|hip|vulkan|metal|sycl|opencl|musa|cann|blas|webgpu)\.(?:so|dll|dylib)$"
)
# Signals that say "the CPU code is wrong for this machine" when they come on load or first token.
_FAULT_SIGNALS: dict[int, str] = {int(signal.SIGILL): "SIGILL", int(signal.SIGSEGV): "SIGSEGV"}
if hasattr(signal, "SIGBUS"):
    _FAULT_SIGNALS[int(signal.SIGBUS)] = "SIGBUS"


@dataclass(frozen=True)
class CpuVariant:
    """One CPU variant library and its score on this CPU (0: cannot run here)."""

    tag: str
    file: str
    score: int


@dataclass(frozen=True)
class BackendPolicy:
    """What the caller allows. Picklable: it crosses to the worker process.

    Args:
        variant: run exactly this variant (a tag such as ``"haswell"``); None chooses.
        avoid: tags never to choose (variants that crashed here).
        allow_amx: AMX variants may be chosen (only once proven on this machine).
    """

    variant: str | None = None
    avoid: tuple[str, ...] = ()
    allow_amx: bool = False


@dataclass(frozen=True)
class BackendInfo:
    """What a process runs llama.cpp on; shown in the inspector, ``models fit`` and the self-test."""

    build: str  # "variants" (portable, chosen at run time) | "single" (CPU backend linked in) | "missing"
    variant: str | None  # the tag, e.g. "zen4"; None for a single build
    file: str | None  # the library, e.g. "libggml-cpu-zen4.so"
    features: tuple[str, ...]  # what the running CPU code uses, e.g. ("AVX2", "AVX512", ...)
    available: tuple[CpuVariant, ...] = ()  # every variant present, best first
    skipped: tuple[tuple[str, str], ...] = ()  # (tag, why) for better variants not chosen
    gpu: tuple[str, ...] = ()  # GPU backends loaded, e.g. ("CUDA",)
    gpu_unavailable: tuple[str, ...] = ()  # present but not usable here (driver missing)
    error: str | None = None

    @property
    def isa(self) -> str:
        """The widest instruction set the CPU code uses, in a user's words."""
        return isa_label(self.features)

    @property
    def label(self) -> str:
        """E.g. ``"AVX-512 (zen4)"``, or ``"AVX2 (single build)"``."""
        if self.build == "missing":
            return "no CPU backend"
        where = self.variant if self.build == "variants" else "single build"
        return f"{self.isa} ({where})"

    @property
    def amx_untested(self) -> bool:
        """A better AMX variant exists but was held back until it is proven here."""
        return any(tag in AMX_TAGS and "not yet proven" in why for tag, why in self.skipped)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["label"] = self.label
        data["available"] = [asdict(v) for v in self.available]
        data["skipped"] = [{"variant": tag, "why": why} for tag, why in self.skipped]
        return data


def isa_label(features: Sequence[str]) -> str:
    have = set(features)
    for feature, label in (
        ("AMX_INT8", "AMX"),
        ("AVX512", "AVX-512"),
        ("AVX_VNNI", "AVX-VNNI"),
        ("AVX2", "AVX2"),
        ("AVX", "AVX"),
        ("SME", "NEON+SME"),
        ("SVE", "NEON+SVE"),
        ("DOTPROD", "NEON+dotprod"),
        ("NEON", "NEON"),
        ("SSSE3", "SSSE3"),
        ("SSE3", "SSE3"),
    ):
        if feature in have:
            return label
    return "baseline"


# ------------------------------------------------------------------------------ choosing


def choose_variant(
    scored: Sequence[CpuVariant], policy: BackendPolicy
) -> tuple[CpuVariant | None, list[tuple[str, str]]]:
    """The variant to run, and why better ones were skipped. Pure: the tests call it with fakes.

    A forced ``policy.variant`` is honoured if this CPU can run it; otherwise (or with none forced)
    the best-scoring variant that is neither avoided nor an unproven AMX one.
    """
    runnable = sorted((v for v in scored if v.score > 0), key=lambda v: v.score, reverse=True)
    skipped: list[tuple[str, str]] = []
    if policy.variant is not None:
        for variant in runnable:
            if variant.tag == policy.variant:
                return variant, skipped
        skipped.append((policy.variant, "asked for, but this CPU cannot run it or it is not installed"))
    for variant in runnable:
        if variant.tag in policy.avoid:
            skipped.append((variant.tag, "crashed on this machine before"))
            continue
        if variant.tag in AMX_TAGS and not policy.allow_amx:
            skipped.append((variant.tag, "AMX not yet proven on this machine (llama.cpp bug)"))
            continue
        return variant, skipped
    return None, skipped


def safe_variant(scored: Sequence[CpuVariant]) -> CpuVariant | None:
    """The variant to fall back to after a crash: no AVX-512, no AMX, the best of the rest."""
    runnable = {v.tag: v for v in scored if v.score > 0}
    for tag in SAFE_ORDER:
        if tag in runnable:
            return runnable[tag]
    # Another architecture: its lowest-scoring runnable variant is the most conservative.
    return min(runnable.values(), key=lambda v: v.score) if runnable else None


# ------------------------------------------------------------------------------ the libraries


def lib_dir() -> Path | None:
    """The folder with llama-cpp-python's libraries (``LLAMA_CPP_LIB_PATH`` overrides, as it does
    for llama-cpp-python), found without importing the package."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


BUILD_MARKER = "glassbox-build.json"
"""What ``installers/llama_build.py`` leaves in ``llama_cpp/lib``: the key and flags of the build."""


def build_marker(folder: Path | None = None) -> dict[str, object] | None:
    """The marker of the installed build (its CMake flags), or None when there is none or it is
    unreadable (llama-cpp-python installed by other means)."""
    folder = folder or lib_dir()
    if folder is None:
        return None
    try:
        data = json.loads((folder / BUILD_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def variant_files(folder: Path | None = None) -> dict[str, Path]:
    """The CPU variant libraries in ``folder`` (default: :func:`lib_dir`), by tag."""
    folder = folder or lib_dir()
    if folder is None or not folder.is_dir():
        return {}
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        match = _VARIANT_RE.match(path.name)
        if match:
            found[match["tag"]] = path
    return found


def _ggml_library(folder: Path) -> ctypes.CDLL:
    """The ggml library that libllama links to.

    A wheel cannot hold symlinks, so ``libggml.so``, ``libggml.so.0`` and ``libggml.so.0.25.3``
    are three copies of one file, and opening another name than the one libllama's ``NEEDED``
    entry (the soname, ``libggml.so.0``) resolves to would load a second ggml with a registry of
    its own. So the soname's file comes first.
    """
    if sys.platform == "win32":
        names: tuple[str, ...] = ("ggml.dll", "libggml.dll")
    else:
        sonames = sorted(p.name for p in folder.glob("libggml.so.*") if re.fullmatch(r"libggml\.so\.\d+", p.name))
        names = (*sonames, "libggml.so", "libggml.dylib")
    for name in names:
        if (folder / name).exists():
            return ctypes.CDLL(str(folder / name))
    raise OSError(f"{folder}: no ggml library")


class _Feature(ctypes.Structure):
    _fields_ = (("name", ctypes.c_char_p), ("value", ctypes.c_char_p))


def _bind(ggml: ctypes.CDLL) -> None:
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


@contextlib.contextmanager
def _quiet(ggml: ctypes.CDLL, lines: list[str]) -> Iterator[None]:
    """ggml's log while loading goes to ``lines`` (quoted in errors), not to the user's stderr."""

    def keep(_level: int, text: bytes | None, _data: int | None) -> None:
        if text:
            lines.append(text.decode("utf-8", "replace").strip())

    callback = _LOG_CALLBACK(keep)
    ggml.ggml_log_set.argtypes = [_LOG_CALLBACK, ctypes.c_void_p]
    ggml.ggml_log_set.restype = None
    ggml.ggml_log_set(callback, None)
    try:
        yield
    finally:
        ggml.ggml_log_set(_LOG_CALLBACK(), None)  # back to ggml's default logger


def _score(path: Path) -> int:
    """``ggml_backend_score()`` of one variant library (what ``ggml_backend_load_best`` asks too);
    the feature check it runs is compiled without the variant's own instruction flags."""
    try:
        lib = ctypes.CDLL(str(path))
        fn = lib.ggml_backend_score
    except (OSError, AttributeError):
        return 0
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return int(fn())


def _features(ggml: ctypes.CDLL, reg: int) -> tuple[str, ...]:
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
    if not address:
        return ()
    getter = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(address)
    out: list[str] = []
    array = getter(reg)
    i = 0
    while array and array[i].name:
        name = array[i].name.decode("ascii", "replace")
        value = (array[i].value or b"").decode("ascii", "replace")
        out.append(name if value in ("", "1") else f"{name}={value}")
        i += 1
    return tuple(out)


_loaded: BackendInfo | None = None


def load_backends(policy: BackendPolicy | None = None, folder: Path | None = None) -> BackendInfo:
    """Loads llama.cpp's CPU variant (and any GPU backends) into this process, once.

    Call it before the first model load in any process that runs llama.cpp. A second call returns
    what the first one loaded, whatever its policy: a process cannot swap its CPU code.
    Never raises: a problem is reported in ``BackendInfo.error`` (model loads then fail with
    llama.cpp's "no backends are loaded").
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    policy = policy or BackendPolicy()
    folder = folder or lib_dir()
    if folder is None:
        return BackendInfo("missing", None, None, (), error="llama-cpp-python is not installed")
    try:
        ggml = _ggml_library(folder)
        _bind(ggml)
    except (OSError, AttributeError) as exc:
        return BackendInfo("missing", None, None, (), error=f"{folder}: cannot load ggml ({exc})")
    log: list[str] = []
    with _quiet(ggml, log):
        _loaded = _load(ggml, folder, policy, log)
    return _loaded


def cpu_name() -> str:
    """The CPU's marketing name where the OS says it, else the machine type (what a
    :class:`BackendState` is kept for: a crash taught on one CPU says nothing of another)."""
    system = platform.system()
    if system == "Linux":
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                    return value.strip()
    elif system == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=3.0,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def load_backends_for(state_file: Path | None) -> BackendInfo:
    """:func:`load_backends` with what this machine taught us (``state_file``: a
    :class:`BackendState`), so an in-process caller reports the variant the worker will run."""
    return load_backends(BackendState.open(state_file, cpu_name()).policy())


def _load(ggml: ctypes.CDLL, folder: Path, policy: BackendPolicy, log: list[str]) -> BackendInfo:
    cpu_reg = ggml.ggml_backend_reg_by_name(b"CPU")
    if cpu_reg:  # the CPU backend is linked in: nothing to choose, nothing to load
        return BackendInfo("single", None, None, _features(ggml, cpu_reg), gpu=_gpu_names(ggml))
    files = variant_files(folder)
    scored = sorted(
        (CpuVariant(tag, path.name, _score(path)) for tag, path in files.items()),
        key=lambda v: v.score,
        reverse=True,
    )
    chosen, skipped = choose_variant(scored, policy)
    if chosen is None:
        why = "no CPU variant of llama.cpp runs on this CPU" if scored else f"{folder}: no CPU backend library"
        return BackendInfo("missing", None, None, (), tuple(scored), tuple(skipped), error=why)
    reg = ggml.ggml_backend_load(str(files[chosen.tag]).encode())
    if not reg:
        return BackendInfo(
            "missing",
            chosen.tag,
            chosen.file,
            (),
            tuple(scored),
            tuple(skipped),
            error=f"{files[chosen.tag]}: llama.cpp could not load its CPU backend ({(log or ['no reason given'])[-1]})",
        )
    gpu, unavailable = _load_gpu_backends(ggml, folder)
    return BackendInfo(
        "variants", chosen.tag, chosen.file, _features(ggml, reg), tuple(scored), tuple(skipped), gpu, unavailable
    )


def _load_gpu_backends(ggml: ctypes.CDLL, folder: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    loaded: list[str] = []
    unavailable: list[str] = []
    for path in sorted(folder.iterdir()):
        match = _GPU_RE.match(path.name)
        if not match:
            continue
        reg = ggml.ggml_backend_load(str(path).encode())
        if reg and ggml.ggml_backend_reg_dev_count(reg) > 0:
            loaded.append(ggml.ggml_backend_reg_name(reg).decode("utf-8", "replace"))
        else:
            unavailable.append(match["name"])
    return tuple(loaded), tuple(unavailable)


def _gpu_names(ggml: ctypes.CDLL) -> tuple[str, ...]:
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_reg_get.restype = ctypes.c_void_p
    names = []
    for i in range(int(ggml.ggml_backend_reg_count())):
        name = ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode("utf-8", "replace")
        if name not in ("CPU", "BLAS"):
            names.append(name)
    return tuple(names)


# ------------------------------------------------------------------------------ AMX: the kernel and the machine

# Linux's x86 ABI for the AMX tile state (arch/x86/include/uapi/asm/prctl.h): the features the kernel
# saves and restores for a process, and the per-process permission to use tile data.
_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_GET_XCOMP_SUPP = 0x1021
_ARCH_GET_XCOMP_PERM = 0x1022
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

AMX_VM_NOTE = (
    "AMX is off on this virtual machine (the CPU reports the hypervisor flag): a hypervisor may not keep "
    "the tile state across the host's context switches, and llama.cpp's AMX code then dies at random; "
    "set GLASSBOX_AMX=probe to test it here"
)


def amx_kernel_problem() -> str | None:
    """Why the kernel would not let this process keep AMX tile state, or None when it does.

    Linux (5.16 and later) saves and restores the tiles only for a process that asked
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``), and only when it supports the
    feature at all (``ARCH_GET_XCOMP_SUPP``); the permission granted is what ``ARCH_GET_XCOMP_PERM``
    reports. This asks, in the calling process (the probe's child). Elsewhere (another OS or CPU
    architecture) there is nothing to ask: None.
    """

    if not sys.platform.startswith("linux") or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_uint64(0)
    if libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_GET_XCOMP_SUPP), ctypes.byref(mask)) != 0:
        return (
            f"the kernel cannot report the AMX tile state ({os.strerror(ctypes.get_errno())}; Linux 5.16 or later can)"
        )
    if not mask.value & (1 << _XFEATURE_XTILEDATA):
        return "the kernel does not keep the AMX tile state (no XTILEDATA among the features it saves)"
    if libc.syscall(
        ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM), ctypes.c_long(_XFEATURE_XTILEDATA)
    ):
        return f"the kernel refused the AMX tile permission ({os.strerror(ctypes.get_errno())})"
    granted = ctypes.c_uint64(0)
    libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_GET_XCOMP_PERM), ctypes.byref(granted))
    if not granted.value & (1 << _XFEATURE_XTILEDATA):
        return "the kernel did not grant the AMX tile permission"
    return None


def xcomp_supported() -> int | None:
    """The XSAVE features the kernel saves for a process (``ARCH_GET_XCOMP_SUPP``), or None where it
    cannot be asked (not Linux on x86-64, or a kernel before 5.16)."""

    if not sys.platform.startswith("linux") or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_uint64(0)
    if libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_GET_XCOMP_SUPP), ctypes.byref(mask)) != 0:
        return None
    return int(mask.value)


def is_virtual_machine(cpuinfo: str | None = None) -> bool:
    """Whether this runs in a virtual machine: the ``hypervisor`` flag of ``/proc/cpuinfo`` (Linux;
    elsewhere, or unreadable: False). ``cpuinfo`` is its text, for the tests."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return "hypervisor" in value.split()
    return False


# ------------------------------------------------------------------------------ crashes


def is_cpu_fault(exitcode: int | None) -> bool:
    """The worker died of a signal that wrong CPU code raises (SIGILL, SIGSEGV, SIGBUS)."""
    return exitcode is not None and exitcode < 0 and -exitcode in _FAULT_SIGNALS


def describe_crash(exitcode: int | None, backend: BackendInfo | None) -> str:
    """The cause of a load or first-token crash, in a user's words."""
    where = f"in {backend.file}" if backend is not None and backend.file else "in llama.cpp's CPU code"
    if exitcode is not None and -exitcode == signal.SIGILL:
        isa = "AMX tile" if backend is not None and backend.isa == "AMX" else (backend.isa if backend else "")
        what = f"{isa}, {where}" if isa and isa != "baseline" else where
        return f"llama.cpp was built for CPU instructions this machine cannot run ({what})"
    name = _FAULT_SIGNALS.get(-(exitcode or 0), "a signal")
    return f"llama.cpp crashed with {name} {where} before its first token"


# ------------------------------------------------------------------------------ what this machine taught us


@dataclass
class BackendState:
    """What this machine has shown about the variants, kept in a small JSON file.

    Keyed by the CPU model and the libraries' fingerprint: another CPU (a moved home folder) or
    another build (an upgrade) starts from nothing. A file that cannot be read is ignored.
    """

    path: Path | None
    key: str
    broken: dict[str, str] = field(default_factory=dict)
    amx: str | None = None  # None: not probed; "ok"; or why it failed

    @classmethod
    def open(cls, path: Path | None, cpu: str, folder: Path | None = None) -> BackendState:
        key = f"{cpu}|{library_fingerprint(folder)}"
        state = cls(path, key)
        if path is None:
            return state
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("key") == key:
                state.broken = {str(k): str(v) for k, v in dict(data.get("broken", {})).items()}
                amx = data.get("amx")
                state.amx = str(amx) if amx is not None else None
        return state

    def policy(self) -> BackendPolicy:
        return BackendPolicy(avoid=tuple(sorted(self.broken)), allow_amx=self.amx == "ok")

    def mark_broken(self, tag: str, why: str) -> None:
        self.broken[tag] = why
        if tag in AMX_TAGS:
            self.amx = why
        self._save()

    def set_amx(self, verdict: str) -> None:
        self.amx = verdict
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        # lazy: start-up (+17 ms)
        from engine.atomic import write_text_atomic

        text = json.dumps({"key": self.key, "broken": self.broken, "amx": self.amx}, indent=2)
        with contextlib.suppress(OSError):
            write_text_atomic(self.path, text + "\n")


def library_fingerprint(folder: Path | None = None) -> str:
    """Names, sizes and modification times of the ggml libraries: changes with any rebuild."""
    folder = folder or lib_dir()
    if folder is None or not folder.is_dir():
        return "none"
    parts = []
    for path in sorted(folder.iterdir()):
        if "ggml" in path.name:
            with contextlib.suppress(OSError):
                st = path.stat()
                parts.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    # lazy: start-up (+5 ms)
    import hashlib

    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
