"""Model output renders as safe rich text: no active HTML, no remote loads, copyable code."""

from __future__ import annotations

from app.gui.markdown_render import render_markdown


def test_raw_html_is_escaped() -> None:
    out = render_markdown('<script>alert(1)</script> <img src="http://evil/x.png"> <b>bold</b>').html
    assert "<script" not in out
    assert "<img" not in out
    assert "<b>" not in out
    assert "&lt;script&gt;" in out


def test_markdown_images_are_never_loaded() -> None:
    out = render_markdown("![tracker](https://evil.example/pixel.png)").html
    assert "<img" not in out
    assert "evil.example" not in out
    assert "[image: tracker]" in out


def test_only_safe_links_are_clickable() -> None:
    out = render_markdown("[ok](https://example.org) [bad](javascript:alert(1)) [file](file:///etc/passwd)").html
    assert 'href="https://example.org"' in out
    assert 'href="javascript' not in out
    assert 'href="file' not in out
    assert out.count("<a ") == 1


def test_code_blocks_have_copy_links_and_raw_text() -> None:
    rendered = render_markdown("Intro\n\n```python\nprint('<hi>')\n```\n\n```\nsecond\n```")
    assert rendered.code_blocks == ("print('<hi>')\n", "second\n")
    assert 'href="gb-copy:0"' in rendered.html
    assert 'href="gb-copy:1"' in rendered.html
    assert "print(&#x27;&lt;hi&gt;&#x27;)" in rendered.html or "print('&lt;hi&gt;')" in rendered.html


def test_tables_render_with_borders() -> None:
    out = render_markdown("| a | b |\n|---|---|\n| 1 | 2 |").html
    assert '<table border="1"' in out
    assert "<td>1</td>" in out


def test_unclosed_fence_while_streaming_does_not_break() -> None:
    rendered = render_markdown("Here:\n```py\nx = 1")
    assert rendered.code_blocks == ("x = 1\n",) or rendered.code_blocks == ("x = 1",)
