"""A model reply cannot load a local file into the chat view or open anything but a web or mail
link (ROBUSTNESS U3, I11; OWASP LLM05).

Each hostile reply is rendered by the real card (``app.gui.message_card.MessageCard``) offscreen. Two
things are checked on the HTML its labels hold: a ``QTextDocument`` that records every resource it
is asked for lays the HTML out and is asked for nothing (the spy is shown to work on an ``<img>``
first, so the check can fail), and the only link targets are http(s), mailto and the card's own
Copy links. Then every link is "clicked" (``linkActivated``, what Qt emits on a click) with the
desktop opener replaced by a recorder: only http(s) and mailto targets reach it, and a link
activated with any other scheme (as a future renderer bug would produce) is refused by the view
itself. Bound: a handful of small labels, well under a second.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QLabel

from app.gui import message_card
from app.gui.markdown_render import LIGHT_CODE, render_markdown
from app.gui.message_card import MessageCard
from app.gui.reply_links import link_dialog
from app.gui.workers.history_reads import DisplayMessage

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

HOSTILE = [
    "![x](file:///etc/passwd)",
    '<img src="file:///etc/passwd">',
    "<img src='file:///tmp/a.png' width=1>",
    "[click](javascript:alert(1))",
    "[x](file:///tmp/a)",
    "<file:///etc/passwd>",
    "[home](/etc/passwd)",
    "[rel](a.png) ![rel](a.png)",
    "[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[qrc](qrc:/icons/app.png) ![qrc](qrc:/icons/app.png)",
    "[copy](gb-copy:0) [source](gb-source:0)",
    '<a href="file:///etc/passwd">raw anchor</a>',
    '<div style="background-image: url(file:///etc/passwd)">styled</div>',
    '```\n<img src="file:///etc/passwd">\n```',
    "```<img src=file:///x>\ncode\n```",
]
ALLOWED = re.compile(r"^(?:https?://|mailto:|gb-copy:\d+$)", re.IGNORECASE)


class ResourceSpy(QTextDocument):
    """A text document that records every resource (image, stylesheet) its layout asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def loadResource(self, kind: int, name: QUrl) -> Any:
        self.asked.append(name.toString())
        return super().loadResource(kind, name)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def _tags(html: str) -> list[tuple[str, dict[str, str]]]:
    """The elements of ``html`` with their attributes (what Qt's rich text would act on)."""
    parser = _Tags()
    parser.feed(html)
    parser.close()
    return parser.tags


def _check_markup(html: str) -> list[str]:
    """Asserts there is no image, no resource URL in a style and no link target that is not a web,
    mail or Copy link; returns the link targets."""
    tags = _tags(html)
    assert [t for t, _ in tags if t in ("img", "link", "object", "iframe", "embed", "script", "style")] == []
    assert [a for _, a in tags if "url(" in a.get("style", "").lower() or "src" in a or "background" in a] == []
    hrefs = [a["href"] for t, a in tags if t == "a" and "href" in a]
    assert all(ALLOWED.match(href) for href in hrefs), hrefs
    return hrefs


def _resources(html: str) -> list[str]:
    spy = ResourceSpy()
    spy.setHtml(html)
    spy.setTextWidth(600)
    spy.size()  # lays it out: images are fetched here
    return spy.asked


def _card(qtbot: Any, text: str) -> MessageCard:
    message = DisplayMessage(1, None, "assistant", text, "complete", None, None, "m", None, (1,))
    card = MessageCard(message, LIGHT_CODE, "Assistant")
    qtbot.addWidget(card)
    card.show()
    return card


def _labels(card: MessageCard) -> list[QLabel]:
    return [label for label in card.findChildren(QLabel) if label.objectName() == "messageBody"]


def test_the_resource_spy_sees_a_local_image(qapp: Any) -> None:
    assert _resources('<p>x</p><img src="file:///etc/passwd">') == ["file:///etc/passwd"]


@pytest.mark.parametrize("reply", HOSTILE)
def test_a_hostile_reply_loads_nothing_and_links_only_to_the_web(
    qtbot: Any, monkeypatch: pytest.MonkeyPatch, reply: str
) -> None:
    opened: list[str] = []
    monkeypatch.setattr(message_card.QDesktopServices, "openUrl", lambda url: opened.append(url.toString()) or True)
    monkeypatch.setattr(message_card, "confirm_link", lambda parent, url: "open")  # the user says Open
    card = _card(qtbot, f"Before.\n\n{reply}\n\nAfter [ok](https://example.org/page).")
    labels = _labels(card)
    assert labels
    hrefs: list[str] = []
    for label in labels:
        html = label.text()
        assert _resources(html) == []
        hrefs += _check_markup(html)
    assert "https://example.org/page" in hrefs

    for label in labels:
        for href in _check_markup(label.text()):
            label.linkActivated.emit(href)
    assert opened == ["https://example.org/page"]


@pytest.mark.parametrize(
    "link",
    ["file:///etc/passwd", "file:///tmp/a", "javascript:alert(1)", "JavaScript:alert(1)", "/etc/passwd",
     "data:text/html,x", "qrc:/x", "gb-source:0", "smb://host/share", ""],
)  # fmt: skip
def test_the_view_refuses_to_open_other_schemes_even_if_a_link_got_through(
    qtbot: Any, monkeypatch: pytest.MonkeyPatch, link: str
) -> None:
    opened: list[str] = []
    monkeypatch.setattr(message_card.QDesktopServices, "openUrl", lambda url: opened.append(url.toString()) or True)
    monkeypatch.setattr(message_card, "confirm_link", lambda parent, url: "open")  # the user says Open
    card = _card(qtbot, "A reply with a [web link](https://example.org).")
    (label,) = _labels(card)
    label.linkActivated.emit(link)
    assert opened == []
    label.linkActivated.emit("https://example.org")
    label.linkActivated.emit("mailto:someone@example.org")
    assert opened == ["https://example.org", "mailto:someone@example.org"]


def test_a_copy_link_copies_and_opens_nothing(qtbot: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(message_card.QDesktopServices, "openUrl", lambda url: opened.append(url.toString()) or True)
    monkeypatch.setattr(message_card, "confirm_link", lambda parent, url: "open")  # the user says Open
    card = _card(qtbot, "```\nprint('hi')\n```")
    (label,) = _labels(card)
    label.linkActivated.emit("gb-copy:0")
    label.linkActivated.emit("gb-copy:7")  # out of range: ignored
    assert opened == []
    assert card.copy_code(0) == "print('hi')\n"


@pytest.mark.parametrize("reply", HOSTILE)
def test_the_renderer_alone_never_emits_a_local_target(reply: str) -> None:
    html = render_markdown(reply).html
    _check_markup(html)
    assert _tags(html)  # it rendered something the check looked at


def test_the_markup_check_catches_what_it_looks_for() -> None:
    for bad in ('<img src="file:///etc/passwd">', '<a href="file:///tmp/a">x</a>', '<p style="x:url(file:///a)">y</p>'):
        with pytest.raises(AssertionError):
            _check_markup(bad)
    assert _check_markup('<a href="https://example.org">x</a>') == ["https://example.org"]


def test_a_link_opens_only_after_the_user_saw_its_whole_address(qtbot: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's link text can say anything: the question shows the real address, and only Open
    opens it; Copy link copies it; Cancel (the default) does nothing."""
    opened: list[str] = []
    monkeypatch.setattr(message_card.QDesktopServices, "openUrl", lambda url: opened.append(url.toString()) or True)
    answers = iter(["cancel", "copy", "open"])
    asked: list[str] = []

    def confirm(parent: object, url: Any) -> str:
        asked.append(url.toString())
        return next(answers)

    monkeypatch.setattr(message_card, "confirm_link", confirm)
    card = _card(qtbot, "Log in at [your bank](https://elsewhere.example/login?x=1).")
    (label,) = _labels(card)
    target = "https://elsewhere.example/login?x=1"
    label.linkActivated.emit(target)
    assert opened == []
    label.linkActivated.emit(target)
    assert opened == [] and message_card.QGuiApplication.clipboard().text() == target
    label.linkActivated.emit(target)
    assert opened == [target] and asked == [target] * 3


def test_the_link_question_names_the_host_and_the_whole_address_and_defaults_to_cancel(qtbot: Any) -> None:
    from PySide6.QtCore import QUrl

    box = link_dialog(None, QUrl("https://elsewhere.example/login?x=1"))
    qtbot.addWidget(box)
    assert "elsewhere.example" in box.text()
    assert box.informativeText() == "https://elsewhere.example/login?x=1"
    assert box.defaultButton() is box.escapeButton()
    assert box.defaultButton().text() not in ("Open", "Copy link")
    assert sorted(b.text() for b in box.buttons() if b.objectName()) == ["Copy link", "Open"]
