"""Export a conversation (its current branch) to Markdown, HTML, JSON or PDF. Qt-free except PDF
(:mod:`app.gui.export_pdf`, imported only for a PDF).

A user message's images are embedded in Markdown and HTML (``data:`` URLs: the file stands alone,
nothing is loaded from elsewhere) and referenced in JSON (their SHA-256, type and size, and where
the data folder keeps them: ``media/<aa>/<sha256>.<ext>``)."""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.gui.markdown_render import COPY_SCHEME, render_markdown
from engine.atomic import write_bytes_atomic, write_text_atomic

if TYPE_CHECKING:
    from app.gui.workers.history_reads import DisplayMessage
    from engine.media import Media

_COPY_LINK = re.compile(rf'(?:&nbsp;)*<a href="{COPY_SCHEME}:\d+"[^>]*>Copy</a>')
FORMATS = {"md": "Markdown (*.md)", "html": "HTML (*.html)", "json": "JSON (*.json)", "pdf": "PDF (*.pdf)"}


def export_file_name(title: str, conversation_id: int, fmt: str) -> str:
    """A file name for an export: the chat's title made safe for every file system, else ``chat-<id>``.

    >>> export_file_name('Plan: Q3 / "budget"?', 7, "md")
    'Plan Q3 budget.md'
    """
    name = re.sub(r'[\\/:*?"<>|\x00-\x1f]+', " ", title or "")
    name = " ".join(name.split()).strip(" .")[:80].rstrip(" .")
    if not name or name.upper() in _RESERVED:
        name = f"chat-{conversation_id}"
    return f"{name}.{fmt}"


_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def _state_note(m: DisplayMessage) -> str:
    if m.state != "partial":
        return ""
    return " *(interrupted, partial)*" if m.error else " *(stopped, partial)*"


def _role(role: str) -> str:
    return {"user": "You", "assistant": "Assistant", "system": "System"}.get(role, role)


def to_markdown(title: str, messages: Sequence[DisplayMessage], system_prompt: str | None = None) -> str:
    """The conversation as Markdown: a heading per message, sources as a list."""
    lines = [f"# {title}", ""]
    if system_prompt:
        lines += ["> **System prompt:** " + system_prompt.replace("\n", "\n> "), ""]
    for m in messages:
        who = _role(m.role) if m.role != "assistant" or not m.model else f"Assistant ({m.model})"
        suffix = _state_note(m)
        lines += [f"## {who}{suffix}", ""]
        for item in m.media:
            if item.kind == "image":
                alt = item.name.replace("]", "").replace("[", "") or "image"
                lines += [f"![{alt}]({_data_url(item)})", ""]
            else:
                lines += [f"*(audio clip: {item.name or item.label})*", ""]
        lines += [m.content, ""]
        for i, source in enumerate(m.sources or [], 1):
            page = f", p. {source['page']}" if source.get("page") else ""
            lines.append(f"{i}. `{source.get('path', '?')}`{page}")
        if m.sources:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def to_html(title: str, messages: Sequence[DisplayMessage], system_prompt: str | None = None) -> str:
    """A standalone HTML page (no scripts, no remote resources)."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">',
        "<style>body{font-family:system-ui,sans-serif;max-width:760px;margin:2em auto;color:#1f2328}"
        ".user{background:#eef2ff;border-radius:10px;padding:8px 14px}.role{color:#6b7280;font-weight:600}"
        "pre{background:#f3f4f6;padding:8px;overflow:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #d1d5db;padding:4px}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if system_prompt:
        parts.append(f"<p><i>System prompt:</i> {html.escape(system_prompt)}</p>")
    for m in messages:
        if m.role == "user":
            images = "".join(
                f"<p><img src='{_data_url(item)}' alt='{html.escape(item.name, quote=True)}' "
                "style='max-width:100%;max-height:320px'></p>"
                for item in m.media
                if item.kind == "image"
            )
            body = images + "<p>" + html.escape(m.content).replace("\n", "<br>") + "</p>"
        else:
            body = _COPY_LINK.sub("", render_markdown(m.content).html)  # no Copy links in a file
        cls = "user" if m.role == "user" else "assistant"
        parts.append(f"<div class='{cls}'><p class='role'>{html.escape(_role(m.role))}</p>{body}</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def to_json(title: str, messages: Sequence[DisplayMessage], system_prompt: str | None = None) -> str:
    """Everything we know about each message, as JSON."""
    data = {
        "title": title,
        "system_prompt": system_prompt,
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "messages": [
            {
                "id": m.id,
                "parent_id": m.parent_id,
                "role": m.role,
                "content": m.content,
                "state": m.state,
                "model": m.model,
                "stats": m.stats,
                "sources": m.sources,
                **({"media": [_media_record(item) for item in m.media]} if m.media else {}),
            }
            for m in messages
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _data_url(media: Media) -> str:
    return f"data:{media.media_type};base64,{base64.b64encode(media.data).decode('ascii')}"


def _media_record(media: Media) -> dict[str, object]:
    """An attachment in the JSON export: what it is and where the data folder keeps it."""
    return {
        **media.ref.to_dict(),
        "media_type": media.media_type,
        "bytes": len(media.data),
        "file": f"media/{media.digest[:2]}/{media.digest}{media.suffix}",
    }


def export_conversation(
    path: Path, fmt: str, title: str, messages: Sequence[DisplayMessage], system_prompt: str | None = None
) -> None:
    """Writes the export atomically.

    Raises:
        ValueError: unknown format.
        OSError: the file cannot be written.
    """
    render = {"md": to_markdown, "html": to_html, "json": to_json, "pdf": to_html}.get(fmt)
    if render is None:
        raise ValueError(f"{path}: unknown export format {fmt!r}")
    text = render(title, messages, system_prompt)
    if fmt != "pdf":
        write_text_atomic(path, text)  # owner-only, like every file that holds a chat
        return
    # lazy: start-up (+6 ms)
    from app.gui.export_pdf import write_pdf

    # QPdfWriter writes a file of its own: lay it out beside the target, then replace atomically.
    layout = path.with_name(f".{path.name}.layout-{os.getpid()}")
    try:
        write_pdf(layout, text, title)
        write_bytes_atomic(path, layout.read_bytes())
    finally:
        layout.unlink(missing_ok=True)
