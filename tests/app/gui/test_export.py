"""Conversation export to Markdown, HTML, JSON and PDF."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from app.gui.export import export_conversation, to_html, to_markdown
from app.gui.workers.history_reads import DisplayMessage

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
    with_code = to_html("Code", [*MESSAGES[:1], dataclasses.replace(MESSAGES[1], content="```python\nprint(1)\n```")])
    assert "print(1)" in with_code and "gb-copy" not in with_code and ">Copy<" not in with_code


def test_json_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "chat.json"
    export_conversation(out, "json", "Maths", MESSAGES)
    data = json.loads(out.read_text())
    assert data["messages"][1]["sources"] == [{"path": "/d/a.pdf", "page": 3}]
    assert data["messages"][1]["state"] == "partial"


def test_unknown_format_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown export format") as info:
        export_conversation(tmp_path / "x.docx", "docx", "t", MESSAGES)
    assert "\n" not in str(info.value)


def test_pdf_is_searchable_text_and_is_written_off_the_gui_thread(qapp: Any, tmp_path: Path) -> None:
    """Exports run on the history worker: the PDF is laid out in another thread."""
    import threading

    from pypdf import PdfReader

    long_reply = DisplayMessage(3, 2, "assistant", "\n\n".join(f"Paragraph {i} about harbours." for i in range(120)),
                                "complete", None, None, "tiny", None, (3,))  # fmt: skip
    out = tmp_path / "chat.pdf"
    failures: list[BaseException] = []

    def export() -> None:
        try:
            export_conversation(out, "pdf", "Maths", [*MESSAGES, long_reply], "Be exact.")
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failures.append(exc)

    worker = threading.Thread(target=export)
    worker.start()
    worker.join(60)
    assert not worker.is_alive() and not failures, failures
    assert out.read_bytes().startswith(b"%PDF")
    reader = PdfReader(out)
    assert len(reader.pages) >= 3  # 120 paragraphs do not fit on one A4 page
    text = " ".join(" ".join(page.extract_text().split()) for page in reader.pages)
    assert "Maths" in text and "What is <b>2+2</b>?" in text and "Be exact." in text
    assert "Paragraph 119 about harbours." in text
    assert reader.metadata is not None and reader.metadata.title == "Maths"
    assert not list(tmp_path.glob(".chat.pdf.tmp-*"))


def test_images_are_embedded_in_markdown_and_html_and_referenced_in_json(tmp_path: Path) -> None:
    import base64

    from engine.media import read_media
    from tests.engine.media_fixtures import good_image

    image = read_media(good_image("png", (8, 6)), name="dot.png")
    asked = dataclasses.replace(MESSAGES[0], media=(image,))
    encoded = base64.b64encode(image.data).decode()
    markdown = to_markdown("Pic", [asked, MESSAGES[1]])
    assert f"![dot.png](data:image/png;base64,{encoded})" in markdown
    page = to_html("Pic", [asked, MESSAGES[1]])
    assert f"<img src='data:image/png;base64,{encoded}' alt='dot.png'" in page
    assert "img-src data:" in page and "http" not in page.split("<body>")[1]  # nothing loaded from elsewhere
    out = tmp_path / "chat.json"
    export_conversation(out, "json", "Pic", [asked, MESSAGES[1]])
    (record,) = json.loads(out.read_text())["messages"][0]["media"]
    assert record["digest"] == image.digest and record["name"] == "dot.png" and record["bytes"] == len(image.data)
    assert record["file"] == f"media/{image.digest[:2]}/{image.digest}.png" and "data" not in record


def test_a_pdf_export_carries_the_images(qapp: Any, tmp_path: Path) -> None:
    from pypdf import PdfReader

    from engine.media import read_media
    from tests.engine.media_fixtures import good_image

    image = read_media(good_image("png", (80, 60)), name="dot.png")
    asked = dataclasses.replace(MESSAGES[0], media=(image,))
    export_conversation(tmp_path / "pic.pdf", "pdf", "Pic", [asked, MESSAGES[1]])
    export_conversation(tmp_path / "none.pdf", "pdf", "Pic", MESSAGES)
    (page,) = PdfReader(tmp_path / "pic.pdf").pages
    (shown,) = page.images  # laid out from the page's data: URL, nothing fetched
    assert shown.image is not None and shown.image.size == (80, 60)
    assert [len(p.images) for p in PdfReader(tmp_path / "none.pdf").pages] == [0]
