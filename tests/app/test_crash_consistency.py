"""``kill -9`` of the ``glassbox`` command in the middle of its work (ROBUSTNESS P1, L6, D6): the next
command works, nothing half-written sits at a final path, and what was interrupted is finished.

Each test runs the real command line (``python -m app ... --home DIR``) in a subprocess, waits until
it is visibly mid-way (rows in the registry, bytes in the temporary output, a MiB in the partial
download), sends SIGKILL to that process alone, and checks the state it left and the next run.
Children the killed command had started (the fork server, a quantization child) are waited for, and
killed by their pid if they outlive the bound.

The same faults are covered below the command line by
``tests/rag/test_ingest.py::test_kill_9_during_indexing_converges_without_duplicates`` (two kills,
fake embedder), ``tests/engine/test_quantize.py::test_a_killed_child_is_reported_with_its_signal``
(the child killed, not the command) and
``tests/engine/test_downloads.py::test_download_killed_with_sigkill_resumes_in_a_new_process``.

Bounds: 50 small notes (one chunk each) for ``kb add``; a 40 MB F16 model for ``quantize``; a
3 MiB file throttled to 1.5 MiB/s for ``download``; every subprocess has a timeout (``_RUN_S``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.disk_support import registry_counts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent / "engine"))
from hub_server import FakeHub, random_bytes  # noqa: E402
from tiny_models import write_tiny_llama_gguf  # noqa: E402

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and /proc are POSIX"),
    pytest.mark.timeout(300),
]

_RUN_S = 120.0  # the most any one command may take here


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("QT_QPA_PLATFORM", None)
    return env


def _run(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        env=env or _env(), capture_output=True, text=True, timeout=_RUN_S, cwd=ROOT,
    )  # fmt: skip


def _start(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


Proc = tuple[int, int]
"""A process as (pid, start time in clock ticks): a pid the kernel hands out again is another process."""


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _descendants(pid: int) -> set[Proc]:
    """Every process below ``pid`` (from /proc), so that orphans of a killed command can be found."""
    children: dict[int, list[Proc]] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[19])))
    found: set[Proc] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def _alive(proc: Proc) -> bool:
    fields = _stat(proc[0])
    return fields is not None and fields[0] != "Z" and int(fields[19]) == proc[1]


def _kill_when(process: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> set[Proc]:
    """SIGKILLs ``process`` (only it) as soon as ``ready()``; returns the processes it had started."""
    deadline = time.monotonic() + _RUN_S
    while process.poll() is None and time.monotonic() < deadline and not ready():
        time.sleep(0.005)
    if process.poll() is not None:
        _out, err = process.communicate()
        pytest.fail(f"the command ended before {what}: exit {process.returncode}, {err[-2000:]!r}")
    assert ready(), f"not {what} within {_RUN_S:g} s"
    below = _descendants(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    return below


@pytest.fixture
def orphans() -> Iterator[set[Proc]]:
    """Processes a killed command left running: waited for at the end, then killed by their pid
    (only while the pid is still that process)."""
    found: set[Proc] = set()
    yield found
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in found:
        if _alive(proc):
            os.kill(proc[0], signal.SIGKILL)


# ---------------------------------------------------------------------------------------- kb add


def _note(seed: int) -> str:
    words = ["river", "lantern", "orchard", "harbour", "meadow", "glacier", "compass", "violin", "ember",
             "thistle", "quarry", "falcon", "sandstone", "almanac", "tundra", "pepper"]  # fmt: skip
    paragraphs = []
    for p in range(2):  # about 40 words: one chunk, so the first batch (32 chunks) ends mid-way
        rng = hashlib.sha256(f"{seed}-{p}".encode()).digest()
        body = " ".join(words[b % len(words)] for b in rng[:20])
        paragraphs.append(f"Note {seed}, part {p}: {body}.")
    return "\n\n".join(paragraphs) + "\n"


@pytest.mark.model
@pytest.mark.slow
def test_kill_9_during_kb_add_of_50_files_then_the_next_add_finishes_it(tmp_path: Path, orphans: set[Proc]) -> None:
    home, docs = tmp_path / "home", tmp_path / "docs"
    docs.mkdir()
    for n in range(50):
        (docs / f"note-{n:02d}.txt").write_text(_note(n), encoding="utf-8")
    created = _run(home, "kb", "create", "notes")
    assert created.returncode == 0, created.stderr
    db = home / "data" / "knowledge" / "registry.sqlite3"
    assert db.is_file()

    adding = _start(home, "kb", "add", "notes", str(docs))
    orphans |= _kill_when(adding, lambda: registry_counts(db)[1] > 0, "it had embedded a batch")
    stored, embedded = registry_counts(db)
    assert embedded > 0 and stored <= 50

    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()
    listed = _run(home, "kb", "list", "--json")  # works at once on what the kill left
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == ""

    again = _run(home, "kb", "add", "notes", str(docs), "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["indexed"] + report["unchanged"] == 50, report
    assert report["duplicates"] == report["skipped"] == report["errors"] == 0, report

    listed = _run(home, "kb", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (summary,) = json.loads(listed.stdout)
    assert summary["documents"] == {"indexed": 50}
    assert summary["chunks"] == summary["embedded"] > 0

    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM contents").fetchone()[0] == 50
        assert con.execute("SELECT sum(n_chunks) FROM contents").fetchone()[0] == summary["chunks"]  # no duplicates
    finally:
        con.close()

    from rag.knowledge import KnowledgeBases

    with KnowledgeBases(home / "data" / "knowledge") as kbs:  # the vectors agree with the registry
        kb = kbs.get("notes")
        assert kbs.store.ids(kb.collection) == kbs.registry.embedded_ids(kb.id)
        assert kbs.store.count(kb.collection) == summary["chunks"]


# ---------------------------------------------------------------------------------------- quantize


@pytest.mark.model
def test_kill_9_during_quantize_leaves_no_file_at_the_final_path_and_the_next_run_works(
    tmp_path: Path, orphans: set[Proc]
) -> None:
    from engine.convert.quantize import sweep_work_files
    from engine.gguf import read_gguf_info

    home = tmp_path / "home"
    src = write_tiny_llama_gguf(tmp_path / "bigger-F16.gguf", dtype="F16", n_embd=512, n_ff=1536, n_layer=6)
    models = home / "data" / "models"
    final = models / "bigger-Q6_K.gguf"
    args = ("models", "quantize", str(src), "--type", "Q6_K", "--threads", "1")

    def writing() -> bool:
        return any(p.stat().st_size > 0 for p in models.glob("bigger-Q6_K.gguf.tmp-*")) if models.is_dir() else False

    quantizing = _start(home, *args)
    orphans |= _kill_when(quantizing, writing, "the quantization child was writing")
    assert not final.exists()  # never a half-written model at the final path
    deadline = time.monotonic() + 60  # a child that outlives the command must not rename it either
    while any(_alive(p) for p in orphans) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not final.exists()
    left = list(models.glob("bigger-Q6_K.gguf.tmp-*"))
    assert [p.name for p in left] == [f"bigger-Q6_K.gguf.tmp-{quantizing.pid}"]

    listed = _run(home, "models", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [m["path"] for m in json.loads(listed.stdout)["models"]] == []  # the work file is no model

    again = _run(home, *args, "--json")
    assert again.returncode == 0, again.stderr
    assert Path(json.loads(again.stdout)["path"]) == final
    info = read_gguf_info(final)
    assert info.file_type == "Q6_K"
    assert sweep_work_files(models, min_age_s=0) == left  # its writer is gone: swept
    assert sorted(p.name for p in models.iterdir() if p.suffix == ".gguf") == [final.name]


# ---------------------------------------------------------------------------------------- download


REPO, NAME = "acme/tiny-GGUF", "tiny-Q4_K_M.gguf"
SIZE = 3 * 2**20 + 12345
DATA = random_bytes(SIZE, 42)


def test_kill_9_during_models_download_leaves_no_half_file_and_the_next_run_resumes(tmp_path: Path) -> None:
    from engine.hub.partials import partial_paths, read_partial_meta

    home = tmp_path / "home"
    dest = home / "data" / "models" / "acme" / "tiny-GGUF"
    with FakeHub() as hub:
        hub.add_repo(REPO, {NAME: DATA})
        hub.faults.throttle_bps = 1.5 * 2**20
        env = _env(HF_HUB_OFFLINE="0", HF_ENDPOINT=hub.url)
        downloading = _start(home, "models", "download", REPO, NAME, env=env)

        def a_mib_in() -> bool:
            meta = read_partial_meta(dest, NAME)
            return meta is not None and meta["done"] >= 2**20

        _kill_when(downloading, a_mib_in, "a MiB was in")
        final, partial, _meta = partial_paths(dest, NAME)
        assert not final.exists()  # never a half file at the final path
        assert partial.exists()
        kept = read_partial_meta(dest, NAME)
        assert kept is not None and 2**20 <= kept["done"] < SIZE

        listed = _run(home, "models", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert [m["path"] for m in json.loads(listed.stdout)["models"]] == []  # not listed as installed

        hub.faults.throttle_bps = 0
        again = _run(home, "models", "download", REPO, NAME, "--json", env=env)
        assert again.returncode == 0, again.stderr
        ranges = [h.get("Range") for _m, path, h in hub.requests if path.startswith("/cdn/")]
    assert json.loads(again.stdout)["sha256"] == hashlib.sha256(DATA).hexdigest()
    assert final.read_bytes() == DATA
    assert not partial.exists()
    resumed_from = int(str(ranges[-1]).removeprefix("bytes=").rstrip("-"))
    assert resumed_from >= kept["done"]  # resumed, not started again
