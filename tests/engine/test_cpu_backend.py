"""llama.cpp's CPU variants: the choice, the AMX guard, what a crash says, and the built libraries."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu_backend import (
    BUILD_MARKER,
    BackendInfo,
    BackendPolicy,
    BackendState,
    CpuVariant,
    amx_kernel_problem,
    build_marker,
    choose_variant,
    describe_crash,
    is_cpu_fault,
    is_virtual_machine,
    safe_variant,
    variant_files,
    xcomp_supported,
)

# What llama.cpp's scores look like on an AMX Xeon (sapphirerapids is the best it can run).
XEON = (
    CpuVariant("sapphirerapids", "libggml-cpu-sapphirerapids.so", 2400),
    CpuVariant("zen4", "libggml-cpu-zen4.so", 0),
    CpuVariant("icelake", "libggml-cpu-icelake.so", 1472),
    CpuVariant("skylakex", "libggml-cpu-skylakex.so", 192),
    CpuVariant("haswell", "libggml-cpu-haswell.so", 64),
    CpuVariant("sse42", "libggml-cpu-sse42.so", 5),
    CpuVariant("x64", "libggml-cpu-x64.so", 1),
)


def tags(skipped: list[tuple[str, str]]) -> list[str]:
    return [tag for tag, _ in skipped]


# ------------------------------------------------------------------------------ choosing


def test_amx_is_held_back_until_proven() -> None:
    chosen, skipped = choose_variant(XEON, BackendPolicy())
    assert chosen is not None and chosen.tag == "icelake"
    assert tags(skipped) == ["sapphirerapids"]
    assert "not yet proven" in skipped[0][1]
    proven, skipped = choose_variant(XEON, BackendPolicy(allow_amx=True))
    assert proven is not None and proven.tag == "sapphirerapids"
    assert skipped == []


def test_a_variant_that_crashed_is_avoided_and_a_forced_one_is_honoured() -> None:
    chosen, skipped = choose_variant(XEON, BackendPolicy(avoid=("icelake",)))
    assert chosen is not None and chosen.tag == "skylakex"
    assert tags(skipped) == ["sapphirerapids", "icelake"]
    forced, _ = choose_variant(XEON, BackendPolicy(variant="haswell"))
    assert forced is not None and forced.tag == "haswell"
    # A variant this CPU cannot run (score 0) is never forced on it.
    refused, skipped = choose_variant(XEON, BackendPolicy(variant="zen4"))
    assert refused is not None and refused.tag == "icelake"
    assert skipped[0][0] == "zen4"


def test_nothing_runnable_chooses_nothing() -> None:
    chosen, _ = choose_variant([CpuVariant("haswell", "libggml-cpu-haswell.so", 0)], BackendPolicy())
    assert chosen is None


def test_the_safe_variant_has_no_avx512_or_amx() -> None:
    safe = safe_variant(XEON)
    assert safe is not None and safe.tag == "haswell"
    # An old CPU without AVX2: the best of what is left in the safe order.
    old = [CpuVariant("haswell", "h", 0), CpuVariant("sandybridge", "s", 21), CpuVariant("sse42", "q", 5)]
    safe = safe_variant(old)
    assert safe is not None and safe.tag == "sandybridge"
    # Another architecture: the lowest-scoring runnable variant.
    arm = [CpuVariant("armv8.2_2", "a", 30), CpuVariant("armv8.0_1", "b", 2), CpuVariant("armv9.2_1", "c", 0)]
    safe = safe_variant(arm)
    assert safe is not None and safe.tag == "armv8.0_1"


# ------------------------------------------------------------------------------ crashes


def test_a_sigill_is_explained_in_a_users_words() -> None:
    amx = BackendInfo("variants", "sapphirerapids", "libggml-cpu-sapphirerapids.so", ("AVX512", "AMX_INT8"))
    text = describe_crash(-signal.SIGILL, amx)
    assert text == (
        "llama.cpp was built for CPU instructions this machine cannot run (AMX tile, in libggml-cpu-sapphirerapids.so)"
    )
    avx512 = BackendInfo("variants", "skylakex", "libggml-cpu-skylakex.so", ("AVX2", "AVX512"))
    assert "(AVX-512, in libggml-cpu-skylakex.so)" in describe_crash(-signal.SIGILL, avx512)
    assert "SIGSEGV in libggml-cpu-skylakex.so" in describe_crash(-signal.SIGSEGV, avx512)
    assert is_cpu_fault(-signal.SIGILL) and is_cpu_fault(-signal.SIGSEGV)
    assert not is_cpu_fault(-signal.SIGKILL) and not is_cpu_fault(1) and not is_cpu_fault(None)


# ------------------------------------------------------------------------------ what the machine taught us


def test_state_is_kept_per_cpu_and_build(tmp_path: Path) -> None:
    path = tmp_path / "cpu_backend.json"
    state = BackendState.open(path, "Intel Xeon Platinum 8488C", folder=tmp_path)
    assert state.policy() == BackendPolicy()
    state.mark_broken("icelake", "SIGILL during generation")
    state.set_amx("ok")
    again = BackendState.open(path, "Intel Xeon Platinum 8488C", folder=tmp_path)
    assert again.policy() == BackendPolicy(avoid=("icelake",), allow_amx=True)
    # Another CPU (a home folder moved to another machine) starts from nothing.
    other = BackendState.open(path, "AMD EPYC 9R14", folder=tmp_path)
    assert other.policy() == BackendPolicy()
    # A crashed AMX variant is also the AMX verdict.
    other.mark_broken("sapphirerapids", "SIGILL during generation")
    assert other.amx == "SIGILL during generation"
    assert not other.policy().allow_amx


def test_an_unreadable_state_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "cpu_backend.json"
    for junk in ("{not json", json.dumps([1, 2]), json.dumps({"key": 5, "broken": "x"})):
        path.write_text(junk, encoding="utf-8")
        assert BackendState.open(path, "cpu", folder=tmp_path).policy() == BackendPolicy()


# ------------------------------------------------------------------------------ the installed build

_PORTABLE = pytest.mark.skipif(not variant_files(), reason="llama-cpp-python is not the portable (variants) build")


@_PORTABLE
def test_the_build_has_a_baseline_variant_and_the_process_loads_an_existing_one() -> None:
    files = variant_files()
    assert {"x64", "haswell"} <= set(files), sorted(files)
    code = "import json; from engine.cpu_backend import load_backends; print(json.dumps(load_backends().to_dict()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # ggml's loading chatter stays out of the user's terminal
    info = json.loads(done.stdout)
    assert info["build"] == "variants" and info["error"] is None
    assert info["variant"] in files and files[info["variant"]].name == info["file"]
    scores = {v["tag"]: v["score"] for v in info["available"]}
    assert scores[info["variant"]] > 0
    assert "AVX2" in info["features"] or "NEON" in info["features"]  # x86-64 or arm64
    assert info["label"].endswith(f"({info['variant']})")


def _instructions(library: Path) -> list[str]:
    """The disassembled instructions of ``library`` (mnemonic and operands, one per line)."""
    done = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True, timeout=120, check=True
    )
    return [m[1] for m in re.finditer(r"^\s*[0-9a-f]+:\t(.+)$", done.stdout, re.MULTILINE)]


def _uses_avx512(code: list[str]) -> bool:
    return any("%zmm" in line for line in code)


def _uses_amx(code: list[str]) -> bool:
    return any(line.split()[0] in AMX_MNEMONICS or line.startswith("tdp") for line in code)


AMX_MNEMONICS = {"ldtilecfg", "sttilecfg", "tileloadd", "tileloaddt1", "tilestored", "tilerelease", "tilezero"}


@_PORTABLE
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads ELF libraries")
def test_a_variant_runs_on_an_avx2_only_cpu() -> None:
    files = variant_files()
    if "haswell" not in files:
        pytest.skip("not an x86-64 build")
    haswell = _instructions(files["haswell"])
    assert any("%ymm" in line for line in haswell)  # AVX2 code is there...
    assert not _uses_avx512(haswell)  # ...and no AVX-512 register is touched
    assert not _uses_amx(haswell)  # ...nor an AMX tile instruction
    # The same checks find what they look for where it is: they can fail.
    assert _uses_avx512(_instructions(files["skylakex"]))
    if "sapphirerapids" in files:
        assert _uses_amx(_instructions(files["sapphirerapids"]))


def test_the_marker_of_the_build_names_its_flags() -> None:
    marker = build_marker()
    if marker is None:
        pytest.skip("llama-cpp-python was not installed by installers/llama_build.py")
    flags = marker["cmake_args"]
    assert isinstance(flags, list) and "-DGGML_NATIVE=OFF" in flags


def test_the_engine_reads_the_marker_the_build_script_writes() -> None:
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("glassbox_llama_build_marker", root / "installers" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.MARKER == BUILD_MARKER


def test_the_kernel_is_asked_for_the_amx_tile_state() -> None:
    supported = xcomp_supported()
    if supported is None:
        pytest.skip("not Linux on x86-64 (no arch_prctl to ask)")
    assert supported & 0b11 == 0b11  # x87 and SSE state: every x86-64 kernel saves them
    problem = amx_kernel_problem()
    if not supported & (1 << 18):
        assert problem == "the kernel does not keep the AMX tile state (no XTILEDATA among the features it saves)"
    else:
        assert problem is None or problem.startswith("the kernel refused the AMX tile permission")


@pytest.mark.parametrize(
    ("flags", "virtual"),
    [
        ("fpu vme de pse tsc msr pae mce cx8 apic sep hypervisor amx_tile amx_int8", True),
        ("fpu vme de pse tsc msr amx_tile amx_bf16 amx_int8", False),
    ],
)
def test_a_virtual_machine_is_known_by_its_hypervisor_flag(flags: str, virtual: bool) -> None:
    cpuinfo = f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\nbugs\t\t: spectre_v1\n"
    assert is_virtual_machine(cpuinfo) is virtual
    assert is_virtual_machine("no flags line here") is False
