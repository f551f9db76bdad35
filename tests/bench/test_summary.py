"""The ``make bench`` plumbing: what benchmarks record, the budget check, and the table the summary prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench import results, summary
from tests.bench.results import RESULTS_ENV, BudgetMissed, budgets, record

ROOT = Path(__file__).resolve().parents[2]


def test_records_go_to_the_named_file_one_json_line_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out" / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(target))
    record("engine vs raw: decode", 0.991, at_least=0.97, detail="61 vs 61.5 tok/s", bench="bench_engine.py")
    with pytest.raises(BudgetMissed, match=r"^query p95 at 50k chunks: 61 ms, budget <= 50 ms$"):
        record("query p95 at 50k chunks", 61.0, unit="ms", at_most=50, bench="bench_rag.py")
    record("draft model vs plain", 0.6, detail="reported only")
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(e["name"], e["passed"]) for e in lines] == [
        ("engine vs raw: decode", True),
        ("query p95 at 50k chunks", False),  # written before the check raised
        ("draft model vs plain", None),  # no budget: no verdict
    ]


def test_without_the_variable_a_record_is_only_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    entry = record("x vs y", 1.5)
    assert entry["passed"] is None
    assert capsys.readouterr().out.startswith("BENCH {")
    assert list(tmp_path.iterdir()) == []


def test_a_known_miss_is_marked_with_its_issue_and_does_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(results.KNOWN_MISSES, "engine vs raw: prefill", "issue 99")
    missed = record("engine vs raw: prefill", 0.9, at_least=0.97)
    assert missed["passed"] is False and missed["known_miss"] == "issue 99"
    passing = record("engine vs raw: prefill", 0.99, at_least=0.97)  # passes again: no issue shown
    assert passing["passed"] is True and passing["known_miss"] is None


def test_inside_budgets_every_figure_is_recorded_then_all_misses_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(target))

    def three_figures() -> None:
        with budgets():
            record("a", 0.5, at_least=0.97)
            record("b", 1.0, at_least=0.97)
            record("c", 2.0, at_most=1.0)

    with pytest.raises(BudgetMissed) as raised:
        three_figures()
    assert str(raised.value).startswith("a: 0.5x, budget >= 0.97") and "c: 2x, budget <= 1" in str(raised.value)
    assert [json.loads(line)["name"] for line in target.read_text().splitlines()] == ["a", "b", "c"]
    with budgets():  # nothing missed: nothing raised
        record("d", 1.0, at_least=0.97)


def _write(path: Path, entries: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\nnot json\n")
    return summary.read_records(path)


def test_the_summary_separates_budgets_from_reports_and_keeps_the_last_value(tmp_path: Path) -> None:
    records = _write(
        tmp_path / "results.jsonl",
        [
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
            {
                "name": "engine vs raw: prefill",
                "value": 0.9,
                "at_least": 0.97,
                "passed": False,
                "known_miss": "issue 23",
            },
            {"name": "draft model vs plain", "value": 0.617, "unit": "x", "passed": None, "detail": "394 of 468"},
        ],
    )
    budgeted, reported = summary.rows(records)
    table = {row[0]: row for row in budgeted}
    assert [row[0] for row in budgeted[: len(summary.EXPECTED)]] == list(summary.EXPECTED)
    assert table["KV restore vs cold prefill: TTFT"][1:4] == ("0.031x", "<= 0.1", "ok")
    assert table["query p95 at 50k chunks"][1:4] == ("61.2 ms", "<= 50 ms", "MISSED")
    assert table["engine vs raw: prefill"][3] == "missed: issue 23"
    assert table["engine vs raw: decode"][1] == "not run"
    # A figure without a budget has no verdict, and is listed apart.
    assert reported == [("draft model vs plain", "0.617x", "", summary.NO_VERDICT, "394 of 468", "")]
    assert "draft model vs plain" not in table
    failed = summary.failures(records)
    assert "query p95 at 50k chunks" in failed and "engine vs raw: decode" in failed  # missed; not run
    assert "engine vs raw: prefill" not in failed and "KV restore vs cold prefill: TTFT" not in failed
    text = summary.render(records, markdown=False)
    first = text.splitlines()[0]
    assert "cores" in first and "load average" in first
    assert "known misses: engine vs raw: prefill" in text and "FAILED: " in text
    markdown = summary.render(records, markdown=True).splitlines()
    assert markdown[4].startswith("| Comparison |") and markdown[5] == "|---|---|---|---|---|---|"
    assert sum(line.startswith("| draft model vs plain |") for line in markdown) == 1
    assert markdown.index("**Reported, no budget**") > markdown.index("**With a budget**")


def test_the_summary_command_exits_1_on_an_unexpected_miss_and_0_otherwise(tmp_path: Path) -> None:
    def run(entries: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "r.jsonl"
        _write(path, entries)
        return subprocess.run(
            [sys.executable, "tests/bench/summary.py", str(path)], capture_output=True, text=True, cwd=ROOT
        )

    every = [{"name": n, "value": 1.0, "at_least": 0.5, "passed": True} for n in summary.EXPECTED]
    assert run(every).returncode == 0
    known = [*every, {"name": "x", "value": 0.1, "at_least": 0.5, "passed": False, "known_miss": "issue 1"}]
    assert run(known).returncode == 0
    missed = [*every, {"name": "x", "value": 0.1, "at_least": 0.5, "passed": False}]
    done = run(missed)
    assert done.returncode == 1 and "FAILED: x" in done.stdout
    assert run(every[1:]).returncode == 1  # an expected figure not reported


def test_the_summary_command_says_when_there_is_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "tests/bench/summary.py", str(tmp_path / "none.jsonl")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 1 and "no benchmark results" in done.stderr
