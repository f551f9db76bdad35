"""Conversation export to Markdown, HTML and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.export import export_conversation, to_html, to_markdown
from app.workers.history_service import DisplayMessage

MESSAGES = [
    DisplayMessage(1, None, "user", "What is <b>2+2</b>?", "complete", None, None, None, None, (1,)),
    DisplayMessage(
        2,
        1,
        "assistant",
        "It is **4**.",
        "partial",
        {"decode_tps": 9.5},
        [{"path": "/d/a.pdf", "page": 3}],
        "tiny",
        None,
        (2,),
    ),
]


def test_markdown_has_roles_sources_and_partial_marker() -> None:
    text = to_markdown("Maths", MESSAGES, "Be exact.")
    assert text.startswith("# Maths\n")
    assert "## You" in text
    assert "## Assistant (tiny) *(stopped, partial)*" in text
    assert "`/d/a.pdf`, p. 3" in text
    assert "Be exact." in text


def test_html_is_standalone_and_inert() -> None:
    page = to_html("Maths", MESSAGES)
    assert "<script" not in page
    assert "&lt;b&gt;2+2&lt;/b&gt;" in page
    assert "<strong>4</strong>" in page
    assert "Content-Security-Policy" in page


def test_json_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "chat.json"
    export_conversation(out, "json", "Maths", MESSAGES)
    data = json.loads(out.read_text())
    assert data["messages"][1]["sources"] == [{"path": "/d/a.pdf", "page": 3}]
    assert data["messages"][1]["state"] == "partial"


def test_unknown_format_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown export format") as info:
        export_conversation(tmp_path / "x.pdf", "pdf", "t", MESSAGES)
    assert "\n" not in str(info.value)
