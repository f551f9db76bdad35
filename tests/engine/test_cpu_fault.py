"""A worker killed by SIGILL (as wrong CPU code kills it), on the real starter model: the crash is
explained, retried once on the safe CPU variant, remembered, and never retried in a loop; the AMX guard:
a probe of several runs, off on a virtual machine, and a SIGILL on the AMX variant mid-reply (after
its probe passed) flips the verdict for good while the reply goes on, whole, on the safe variant."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.cpu_backend import AMX_VM_NOTE, BackendInfo, CpuVariant, safe_variant, variant_files
from engine.errors import EngineCrashed
from engine.inference import session as session_module
from engine.inference.cpu_probe import PROBE_RUNS, probe_variant
from engine.inference.events import Finished, Stats, Token
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams
from engine.inference.session import ChatSession

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not variant_files(), reason="llama-cpp-python is not the portable (variants) build"),
]

GREEDY = GenerationParams(max_tokens=4, temperature=0.0)


def backend_here() -> BackendInfo:
    """What a fresh process loads on this machine (read in a child: this one stays clean)."""
    code = "import json; from engine.cpu_backend import load_backends; print(json.dumps(load_backends().to_dict()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    data = json.loads(done.stdout)
    return BackendInfo(
        data["build"],
        data["variant"],
        data["file"],
        tuple(data["features"]),
        tuple(CpuVariant(**v) for v in data["available"]),
    )


@pytest.fixture(scope="module")
def here() -> BackendInfo:
    return backend_here()


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The CPU variant each worker start asked for (None: chosen by the worker)."""
    seen: list[str | None] = []
    original = InferenceWorker.start

    def counting(self: InferenceWorker, cancel: Any = None) -> Any:
        seen.append(self.params.cpu_variant)
        return original(self, cancel)

    monkeypatch.setattr(InferenceWorker, "start", counting)
    return seen


def params(model: Path) -> LoadParams:
    return LoadParams(model_path=model, n_ctx=256, n_threads=2)


def test_sigill_before_the_first_token_retries_once_on_the_safe_variant(
    starter_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: BackendInfo, starts: list[str | None]
) -> None:
    safe = safe_variant(here.available)
    assert safe is not None
    if here.variant == safe.tag:
        pytest.skip(f"this CPU's best variant is already the safe one ({safe.tag})")
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL", "generate")
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL_SPARE", safe.tag)
    state = tmp_path / "cpu_backend.json"
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()
        assert chat.backend is not None and chat.backend.variant == here.variant
        events = list(chat.stream([], "Hello", GREEDY))
        assert isinstance(events[-1], Finished) and events[-1].stats.completion_tokens > 0
        assert chat.backend is not None and chat.backend.variant == safe.tag
        assert chat.backend_note == (
            f"llama.cpp's {here.variant} CPU code crashed here (SIGILL during generation); "
            f"running its safe {safe.tag} variant ({safe.file}) instead"
        )
    assert starts == [None, safe.tag]
    # Remembered: the next session on this machine never runs the variant that crashed.
    assert json.loads(state.read_text())["broken"] == {here.variant: "SIGILL during generation"}
    monkeypatch.delenv("GLASSBOX_TEST_SIGILL")
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()
        assert chat.backend is not None and chat.backend.variant != here.variant
        assert (here.variant, "crashed on this machine before") in chat.backend.skipped


def test_sigill_on_load_retries_on_the_safe_variant(
    starter_model: Path, monkeypatch: pytest.MonkeyPatch, here: BackendInfo, starts: list[str | None]
) -> None:
    safe = safe_variant(here.available)
    assert safe is not None
    if here.variant == safe.tag:
        pytest.skip(f"this CPU's best variant is already the safe one ({safe.tag})")
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL", "load")
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL_SPARE", safe.tag)
    with ChatSession(params(starter_model)) as chat:
        info = chat.load()
        assert info.cpu_backend is not None and info.cpu_backend.variant == safe.tag
    assert starts == [None, safe.tag]


def test_a_crash_that_repeats_on_the_safe_variant_is_said_once(
    starter_model: Path, monkeypatch: pytest.MonkeyPatch, starts: list[str | None]
) -> None:
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL", "generate")  # every variant crashes
    with ChatSession(params(starter_model)) as chat:
        chat.load()
        with pytest.raises(EngineCrashed) as caught:
            list(chat.stream([], "Hello", GREEDY))
    crash = caught.value
    assert crash.will_repeat and crash.cpu_fault
    message = str(crash)
    assert message.startswith("the inference worker crashed during generation (killed by SIGILL): ")
    assert "llama.cpp was built for CPU instructions this machine cannot run (" in message
    assert "so sending again would crash the same way" in message
    assert len(starts) <= 2  # the first variant and the safe one: no retry loop


def test_the_probe_decodes_on_a_variant_and_reports_a_crash(
    starter_model: Path, monkeypatch: pytest.MonkeyPatch, here: BackendInfo
) -> None:
    assert here.variant is not None
    assert probe_variant(starter_model, here.variant, 2) == "ok"
    absent = next((v.tag for v in here.available if v.score == 0), None)
    if absent is not None:
        assert probe_variant(starter_model, absent, 2) == "this CPU cannot run it"
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL", "probe")
    assert probe_variant(starter_model, here.variant, 2) == f"crashed (SIGILL) in run 1 of {PROBE_RUNS}"
    # One run of several failing is the verdict: a passing first run proves nothing.
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL", f"probe:{PROBE_RUNS}")
    assert probe_variant(starter_model, here.variant, 2) == f"crashed (SIGILL) in run {PROBE_RUNS} of {PROBE_RUNS}"


def test_amx_is_used_only_after_a_passing_probe(
    starter_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This machine may have no AMX: the worker's report says it has one held back.
    probed: list[str] = []

    class Worker(InferenceWorker):
        def start(self, cancel: Any = None) -> Any:
            info = super().start(cancel)
            assert self.backend is not None
            held = () if self.params.allow_amx else (("sapphirerapids", "AMX not yet proven on this machine"),)
            self.backend = BackendInfo(
                self.backend.build,
                self.backend.variant,
                self.backend.file,
                self.backend.features,
                self.backend.available,
                held,
            )
            return info

    def probe(model: Path, tag: str, n_threads: int | None = None, cancel: Any = None) -> str:
        probed.append(tag)
        return verdict

    monkeypatch.setattr(session_module, "InferenceWorker", Worker)
    monkeypatch.setattr(session_module, "probe_variant", probe)
    monkeypatch.setattr(session_module, "is_virtual_machine", lambda: False)
    state = tmp_path / "cpu_backend.json"
    verdict = "crashed (SIGILL)"
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()
        assert not chat.load_params.allow_amx
        assert chat.backend_note is not None and "failed a probe" in chat.backend_note
    assert json.loads(state.read_text())["amx"] == "crashed (SIGILL)"
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()  # the verdict is kept: no second probe
    assert probed == ["sapphirerapids"]

    state.unlink()
    verdict = "ok"
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()
        assert chat.load_params.allow_amx
    assert json.loads(state.read_text())["amx"] == "ok"
    assert probed == ["sapphirerapids", "sapphirerapids"]


def _amx_worker(real_safe: str) -> type[InferenceWorker]:
    """A worker that reports what an AMX Xeon reports: the AMX variant held back until it is
    allowed, then run (this machine may have none: the worker really runs its best variant, and the
    injected SIGILL stands for the AMX code's). A forced variant (the safe one) is reported as it is."""

    class Worker(InferenceWorker):
        def start(self, cancel: Any = None) -> Any:
            info = super().start(cancel)
            real = self.backend
            assert real is not None
            if self.params.cpu_variant == real_safe:
                return info
            if self.params.allow_amx:
                self.backend = BackendInfo(
                    real.build, "sapphirerapids", "libggml-cpu-sapphirerapids.so", (*real.features, "AMX_INT8"),
                    real.available,
                )  # fmt: skip
            else:
                held = (("sapphirerapids", "AMX not yet proven on this machine (llama.cpp bug)"),)
                self.backend = BackendInfo(real.build, real.variant, real.file, real.features, real.available, held)
            return info

    return Worker


def test_amx_is_off_on_a_virtual_machine_unless_asked(
    starter_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: BackendInfo
) -> None:
    safe = safe_variant(here.available)
    assert safe is not None
    probed: list[str] = []
    monkeypatch.setattr(session_module, "InferenceWorker", _amx_worker(safe.tag))
    monkeypatch.setattr(session_module, "probe_variant", lambda *args, **kwargs: probed.append(args[1]) or "ok")
    monkeypatch.setattr(session_module, "is_virtual_machine", lambda: True)
    state = tmp_path / "cpu_backend.json"
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()
        assert not chat.load_params.allow_amx and chat.backend_note == AMX_VM_NOTE
    assert probed == [] and not state.exists()  # nothing probed, nothing concluded
    monkeypatch.setenv("GLASSBOX_AMX", "probe")
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()
        assert chat.load_params.allow_amx
    assert probed == ["sapphirerapids"]


def test_a_sigill_on_amx_after_its_probe_passed_flips_it_for_good_and_the_reply_goes_on(
    starter_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: BackendInfo, starts: list[str | None]
) -> None:
    safe = safe_variant(here.available)
    assert safe is not None
    probed: list[str] = []
    monkeypatch.setattr(session_module, "InferenceWorker", _amx_worker(safe.tag))
    monkeypatch.setattr(session_module, "probe_variant", lambda *args, **kwargs: probed.append(args[1]) or "ok")
    monkeypatch.setattr(session_module, "is_virtual_machine", lambda: False)
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL", "token:3")  # the probe passed; the 3rd token dies of SIGILL
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL_SPARE", safe.tag)
    state = tmp_path / "cpu_backend.json"
    reply = GenerationParams(max_tokens=10, temperature=0.0)
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()
        assert chat.backend is not None and chat.backend.variant == "sapphirerapids"  # proven, in use
        events = list(chat.stream([], "Tell me about lighthouses.", reply))
        finished = events[-1]
        assert isinstance(finished, Finished) and finished.reason == "length"
        shown = "".join(event.text for event in events if isinstance(event, Token))
        assert shown == finished.text and len([e for e in events if isinstance(e, Token)]) == 10  # whole, once
        assert finished.stats.completion_tokens == 10
        assert finished.stats.cpu_note == (
            f"llama.cpp's sapphirerapids CPU code crashed after 3 tokens of this reply (SIGILL); the reply went on "
            f"on the {safe.tag} variant, and sapphirerapids is not used on this machine again"
        )
        assert chat.backend is not None and chat.backend.variant == safe.tag
        again = list(chat.stream([], "And about the sea?", reply))
        stats = next(event for event in again if isinstance(event, Stats))
        assert stats.cpu_note == ""  # said once
    saved = json.loads(state.read_text())
    assert saved["amx"] == "SIGILL during generation" and "sapphirerapids" in saved["broken"]
    with ChatSession(params(starter_model), backend_state=state) as chat:
        chat.load()  # the verdict holds: no AMX, no second probe
        assert chat.backend is not None and chat.backend.variant != "sapphirerapids"
        assert not chat.load_params.allow_amx
    assert probed == ["sapphirerapids"]
    assert starts == [None, None, safe.tag, None]  # held back, proven, the retry, the next session


def test_a_constrained_reply_resumed_after_a_sigill_keeps_its_grammar(
    starter_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: BackendInfo
) -> None:
    safe = safe_variant(here.available)
    assert safe is not None
    monkeypatch.setattr(session_module, "InferenceWorker", _amx_worker(safe.tag))
    monkeypatch.setattr(session_module, "probe_variant", lambda *args, **kwargs: "ok")
    monkeypatch.setattr(session_module, "is_virtual_machine", lambda: False)
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL", "token:3")
    monkeypatch.setenv("GLASSBOX_TEST_SIGILL_SPARE", safe.tag)
    grammar = 'root ::= "[" ("ab" | "cd"){6,} "]"'  # the reply cannot end before its 7th token
    reply = GenerationParams(max_tokens=10, temperature=0.0, grammar=grammar)
    with ChatSession(params(starter_model), backend_state=tmp_path / "cpu_backend.json") as chat:
        events = list(chat.stream([], "Write the pattern.", reply))
    finished = events[-1]
    assert isinstance(finished, Finished) and "crashed after 3 tokens" in finished.stats.cpu_note
    text = finished.text
    # The new worker's grammar went on from where the reply was: one "[" (a grammar started over
    # would open a second), then only the items and the closing bracket.
    assert text.startswith("[") and text.count("[") == 1 and set(text[1:]) <= set("abcd]"), text
