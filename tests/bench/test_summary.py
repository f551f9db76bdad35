"""The ``make bench`` plumbing: what benchmarks record, and the table the summary prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench import summary
from tests.bench.results import RESULTS_ENV, record


def test_records_go_to_the_named_file_one_json_line_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out" / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(target))
    record("engine vs raw: decode", 0.991, at_least=0.97, detail="61 vs 61.5 tok/s", bench="bench_engine.py")
    record("query p95 at 50k chunks", 61.0, unit="ms", at_most=50, bench="bench_rag.py")
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(e["name"], e["passed"]) for e in lines] == [
        ("engine vs raw: decode", True),
        ("query p95 at 50k chunks", False),
    ]


def test_without_the_variable_a_record_is_only_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    entry = record("x vs y", 1.5)
    assert entry["passed"] is True
    assert capsys.readouterr().out.startswith("BENCH {")
    assert list(tmp_path.iterdir()) == []


def test_the_summary_shows_every_expected_row_the_last_value_and_the_misses(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    entries = [
        {"name": "KV restore vs cold prefill: TTFT", "value": 0.5, "unit": "x", "at_most": 0.1, "passed": False},
        {
            "name": "KV restore vs cold prefill: TTFT",
            "value": 0.031,
            "unit": "x",
            "at_most": 0.1,
            "passed": True,
            "detail": "90 ms vs 2900 ms",
            "bench": "tests/bench/bench_kv_restore.py",
        },
        {"name": "query p95 at 50k chunks", "value": 61.24, "unit": "ms", "at_most": 50, "passed": False},
        {"name": "download vs durable plain copy", "value": 0.93, "unit": "x", "at_least": 0.8, "passed": True},
    ]
    results.write_text("\n".join(json.dumps(e) for e in entries) + "\nnot json\n")
    table = {row[0]: row for row in summary.rows(summary.read_records(results))}
    assert set(summary.EXPECTED) <= set(table)
    assert table["KV restore vs cold prefill: TTFT"][1:4] == ("0.031x", "<= 0.1", "ok")
    assert table["query p95 at 50k chunks"][1:4] == ("61.2 ms", "<= 50 ms", "MISSED")
    assert table["engine vs raw: decode"][1] == "not run"
    assert "download vs durable plain copy" in table
    text = summary.render(summary.read_records(results), markdown=False)
    assert "cores" in text.splitlines()[0] and "over budget: query p95 at 50k chunks" in text
    markdown = summary.render(summary.read_records(results), markdown=True).splitlines()
    assert markdown[2].startswith("| Comparison |") and len(markdown) == 4 + len(table)


def test_the_summary_command_says_when_there_is_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "tests/bench/summary.py", str(tmp_path / "none.jsonl")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 1 and "no benchmark results" in done.stderr
