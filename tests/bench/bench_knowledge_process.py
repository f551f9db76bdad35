"""What running the knowledge bases in a worker process (``rag.service.KnowledgeService``) costs
against running them in the caller's process (``KnowledgeBases``, as the GUI did before), measured
side by side in one run, interleaved, printed as ratios (issue 15).

Run: ``python -m pytest tests/bench/bench_knowledge_process.py -s``.

* per indexed chunk: ``add`` of the same corpora, in-process and through the service, alternating
  which goes first; total seconds over total chunks and the ratio service / in-process.
  Budget <= 1.10.
* per query: hybrid ``query_many`` (k=6) on equal knowledge bases, alternating call by call;
  median and p95 and the ratio of medians. Budget <= 1.15. The round trip of a call that does
  nothing is printed beside it (the pipe's own cost).
* restarting it: the first query after the process stopped for being idle (a new process, the
  embedding model and the store loaded again) against a query to the running one. Reported.
* the GUI process's RSS: the main window offscreen, before and after using the Knowledge page
  (create, add, a test search, a chat's retrieval), with the knowledge bases in-process (before)
  and in the worker process (now). Budget: now < 250 MB (ARCHITECTURE.md).
* the whole app's RSS (the GUI and every process under it) after the Knowledge page, once the
  knowledge process stopped for being idle (Settings' idle time, short here). Budget < 300 MB.

Numbers from a busy machine are provisional; quote them from a quiet one (``lscpu``).
"""

from __future__ import annotations

import random
import shutil
import statistics
import time
from pathlib import Path

import pytest

from rag.knowledge import KnowledgeBases
from rag.service import KnowledgeService
from tests.app.gui.knowledge_memory_probe import APP_BUDGET_MB, GUI_BUDGET_MB, run_probe
from tests.bench.results import budgets, record

pytestmark = [pytest.mark.model, pytest.mark.slow]

RESOURCES = Path(__file__).resolve().parents[2] / "resources" / "retrieval"
ROUNDS = 4
QUERIES = 120


def _sentences() -> list[str]:
    text = (RESOURCES / "harbour_town.md").read_text(encoding="utf-8")
    body = " ".join(line for line in text.splitlines() if line and not line.startswith("#"))
    return [s.strip() + "." for s in body.split(". ") if len(s.split()) > 4]


def _corpus(folder: Path, seed: int, n_docs: int = 8, sentences_per_doc: int = 50) -> Path:
    rng = random.Random(seed)
    sentences = _sentences()
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        picked = [rng.choice(sentences) for _ in range(sentences_per_doc)]
        paragraphs = [" ".join(picked[j : j + 6]) for j in range(0, len(picked), 6)]
        (folder / f"doc{i:03}.md").write_text(f"# Document {i}\n\n" + "\n\n".join(paragraphs), encoding="utf-8")
    return folder


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_the_worker_process_costs_per_chunk_and_per_query(tmp_path: Path, embedder_path: Path) -> None:
    local = KnowledgeBases(tmp_path / "local", embedder_path)
    service = KnowledgeService(tmp_path / "service", embedder_path)
    try:
        local.create("kb")
        service.call("create", "kb")
        warm = _corpus(tmp_path / "warm", 99, n_docs=1)
        local.add("kb", [warm])  # loads the model, its threads and Chroma on both sides
        service.call("add", "kb", [warm])
        seconds_of: dict[str, float] = {"in-process": 0.0, "service": 0.0}
        chunks_of: dict[str, int] = {"in-process": 0, "service": 0}
        for r in range(ROUNDS):
            docs = _corpus(tmp_path / f"round{r}", r)
            sides = [("in-process", lambda d=docs: local.add("kb", [d])),
                     ("service", lambda d=docs: service.call("add", "kb", [d]))]  # fmt: skip
            for name, add in sides if r % 2 == 0 else reversed(sides):
                start = time.perf_counter()
                report = add()
                seconds = time.perf_counter() - start
                assert report.chunks_added > 0
                seconds_of[name] += seconds
                chunks_of[name] += report.chunks_added
            shutil.rmtree(docs.parent / f"round{r}", ignore_errors=True)

        questions = [s.rstrip(".") + "?" for s in _sentences()[:40]]
        latency: dict[str, list[float]] = {"in-process": [], "service": []}
        for i in range(QUERIES):
            q = questions[i % len(questions)]
            calls = [("in-process", lambda q=q: local.query_many(["kb"], q, k=6)),
                     ("service", lambda q=q: service.query_many(["kb"], q, k=6))]  # fmt: skip
            for name, query in calls if i % 2 == 0 else reversed(calls):
                start = time.perf_counter()
                found = query()
                latency[name].append(time.perf_counter() - start)
                assert found
        # The pipe alone: a call that does almost nothing (a count in the registry).
        ping: dict[str, list[float]] = {"in-process": [], "service": []}
        for i in range(QUERIES):
            calls = [("in-process", local.pending), ("service", lambda: service.call("pending"))]
            for name, call in calls if i % 2 == 0 else reversed(calls):
                start = time.perf_counter()
                call()
                ping[name].append(time.perf_counter() - start)
    finally:
        service.close()
        local.close()

    chunk_local = seconds_of["in-process"] / chunks_of["in-process"]
    chunk_service = seconds_of["service"] / chunks_of["service"]
    chunk_ratio = chunk_service / chunk_local
    q_local = statistics.median(latency["in-process"])
    q_service = statistics.median(latency["service"])
    q_ratio = q_service / q_local
    print(
        f"\nper indexed chunk: in-process {chunk_local * 1e3:.2f} ms, service {chunk_service * 1e3:.2f} ms, "
        f"ratio {chunk_ratio:.3f} (budget <= 1.10)"
        f"\nper query (k=6): in-process median {q_local * 1e3:.2f} ms p95 {_pct(latency['in-process'], 0.95) * 1e3:.2f}"
        f" ms, service median {q_service * 1e3:.2f} ms p95 {_pct(latency['service'], 0.95) * 1e3:.2f} ms, "
        f"ratio {q_ratio:.3f}, +{(q_service - q_local) * 1e3:.2f} ms (budget <= 1.15)"
        f"\na call that does nothing: in-process median {statistics.median(ping['in-process']) * 1e3:.3f} ms, "
        f"service median {statistics.median(ping['service']) * 1e3:.3f} ms (the pipe's round trip)"
    )
    ping_ms = statistics.median(ping["service"]) * 1e3
    with budgets():
        record(
            "knowledge process vs in-process: per indexed chunk",
            chunk_ratio,
            at_most=1.10,
            detail=f"in-process {chunk_local * 1e3:.1f} ms, process {chunk_service * 1e3:.1f} ms per chunk",
        )
        record(
            "knowledge process vs in-process: per query",
            q_ratio,
            at_most=1.15,
            detail=f"median {q_local * 1e3:.1f} vs {q_service * 1e3:.1f} ms; a call's round trip {ping_ms:.2f} ms",
        )


def test_restarting_the_knowledge_process_after_an_idle_stop(tmp_path: Path, embedder_path: Path) -> None:
    """What the idle stop costs the next use: a first query that starts the process again, against
    queries to the running process (the same question, alternating cold and warm)."""
    docs = _corpus(tmp_path / "docs", 5, n_docs=3)
    cold: list[float] = []
    warm: list[float] = []
    with KnowledgeService(tmp_path / "kb", embedder_path, idle_stop_s=0.5) as service:
        service.call("create", "kb")
        service.call("add", "kb", [docs])
        question = _sentences()[3].rstrip(".") + "?"
        for _ in range(3):
            deadline = time.monotonic() + 60
            while service.pid is not None:  # the idle stop (a deadline against a hang)
                assert time.monotonic() < deadline
                time.sleep(0.05)
            start = time.perf_counter()
            assert service.query_many(["kb"], question, k=6)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert service.query_many(["kb"], question, k=6)
            warm.append(time.perf_counter() - start)
        assert service.idle_stops >= 3 and service.starts >= 4
    restart, running = statistics.median(cold), statistics.median(warm)
    print(f"\nfirst query after an idle stop {restart:.2f} s (median of 3), to the running one {running * 1e3:.0f} ms")
    record(
        "knowledge process restart: first query after an idle stop",
        restart,
        unit="s",
        detail=f"a query to the running process {running * 1e3:.0f} ms; median of {len(cold)}",
    )


def test_the_gui_process_rss_before_and_after(tmp_path: Path, embedder_path: Path) -> None:
    docs = _corpus(tmp_path / "docs", 1, n_docs=3)
    before = run_probe(tmp_path / "home-old", docs, embedder_path, in_process=True)
    now = run_probe(tmp_path / "home-new", docs, embedder_path, idle_s=2.0)
    print(
        f"\nGUI RSS, knowledge bases in-process (before): {before['before_mb']:.0f} -> {before['after_mb']:.0f} MB, "
        f"heavy modules {before['heavy']}"
        f"\nGUI RSS, knowledge process (now): {now['before_mb']:.0f} -> {now['after_mb']:.0f} MB, "
        f"heavy modules {now['heavy']}; the knowledge process {now['child_mb']:.0f} MB"
        f"\nratio of the GUI's RSS after use, now / before: {now['after_mb'] / before['after_mb']:.2f}"
    )
    print(
        f"whole app in use: {now['in_use_mb']:.0f} MB in {now['in_use_processes']} processes; idle (the knowledge "
        f"process stopped after {now['idle_wait_s']:.1f} s): {now['idle_mb']:.0f} MB in {now['idle_processes']}"
    )
    assert now["heavy"] == []
    assert now["in_use_processes"] >= len(now["idle_processes"]) + 2  # the knowledge process and its parser
    with budgets():
        record(
            "GUI RSS after the Knowledge page, knowledge process",
            now["after_mb"],
            unit="MB",
            at_most=GUI_BUDGET_MB,
            detail=f"in-process before: {before['after_mb']:.0f} MB; the knowledge process {now['child_mb']:.0f} MB",
        )
        record(
            "whole app RSS, idle after the Knowledge page",
            now["idle_mb"],
            unit="MB",
            at_most=APP_BUDGET_MB,
            detail=f"in use: {now['in_use_mb']:.0f} MB in {now['in_use_processes']} processes; idle: "
            f"{' + '.join(now['idle_processes'])}",
        )
