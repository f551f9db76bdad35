"""Screenshots of every panel of the real app, for the README: ``python tests/screenshots.py``.

Starts Xvfb (when there is no display and Xvfb is installed; otherwise Qt's offscreen platform),
opens Glassbox on a temporary home seeded with a sample chat and a small knowledge base, loads the
starter model and asks it one question (so the inspector shows real numbers), then saves PNGs of
the chat (light and dark), the inspector's token view, the Models page, the Knowledge page with a
test retrieval, and the settings dialog into ``resources/screenshots/``.

Options: ``--out DIR``, ``--no-model`` (skip loading the model: no live numbers), ``--size WxH``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SAMPLE_DOC = """# The lighthouse of Ardmore

The lighthouse was built in 1867 on the northern cliff. Its keeper climbed forty-two steps to the
lamp room every evening and trimmed the wick at midnight.

## The fog signal

In 1902 a compressed-air fog horn was added. It sounded twice every thirty seconds in thick weather
and could be heard eleven kilometres out at sea.
"""

SAMPLE_REPLY = """Here is a small Python function that counts words, with a table of its cost:

```python
def count_words(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
```

| Input size | Time    | Memory |
|-----------:|---------|--------|
| 1 KB       | 0.02 ms | tiny   |
| 1 MB       | 18 ms   | ~2 MB  |

It runs in **O(n)** time: every word is visited once."""


def start_display() -> subprocess.Popen[bytes] | None:
    """Starts Xvfb on a free display when there is no display; returns the process (or None)."""
    if os.environ.get("DISPLAY") or shutil.which("Xvfb") is None:
        if not os.environ.get("DISPLAY"):
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
        return None
    for number in range(99, 120):
        if not Path(f"/tmp/.X{number}-lock").exists():
            break
    proc = subprocess.Popen(
        ["Xvfb", f":{number}", "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ["DISPLAY"] = f":{number}"
    os.environ["QT_QPA_PLATFORM"] = "xcb"
    time.sleep(1.0)
    return proc


def wait_until(app: Any, predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.processEvents()
        if predicate():
            return True
        time.sleep(0.02)
    return False


def seed_history(home: Any) -> None:
    """A sample conversation with stats, a branch and sources, written through the real store."""
    from engine.history import HistoryStore

    stats = {
        "n_ctx": 4096,
        "prompt_tokens": 412,
        "cached_tokens": 380,
        "completion_tokens": 118,
        "context_used": 530,
        "evicted_messages": 0,
        "ttft_ms": 64.0,
        "prefill_tps": 512.0,
        "decode_tps": 41.5,
        "kv_cache_bytes": 37748736,
        "kv_used_bytes": 4882432,
        "model_bytes": 253000000,
        "bandwidth_gbps": 10.7,
        "machine_bandwidth_gbps": 14.2,
        "template": "gguf:gguf",
        "finish_reason": "stop",
        "budget": {
            "system": 18,
            "documents": 0,
            "history": 274,
            "current": 120,
            "reserve": 512,
            "free": 3172,
        },
    }
    with HistoryStore(home.history_db) as store:
        conv = store.create_conversation(title="Counting words in Python")
        store.add_message(conv.id, "user", "Write a function that counts words, and tell me what it costs.")
        store.add_message(conv.id, "assistant", SAMPLE_REPLY, model="Qwen2.5 0.5B Instruct Q4_K_M")
        reply = store.thread(conv.id)[-1]
        store.finish_message(reply.id, SAMPLE_REPLY, state="complete", stats=stats)
        other = store.create_conversation(title="Lighthouse keeper's routine")
        store.add_message(other.id, "user", "How many steps did the keeper climb?")
        store.add_message(other.id, "assistant", "Forty-two steps, every evening [1].", model="starter")
        store.create_conversation(title="Trip planning: Lisbon in spring")
        store.create_conversation(title="Explain KV cache reuse")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "resources" / "screenshots")
    parser.add_argument("--no-model", action="store_true")
    parser.add_argument("--size", default="1400x860")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    display = start_display()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return shoot(args.out, width, height, not args.no_model)
    finally:
        if display is not None:
            display.terminate()
            display.wait(5)


def shoot(out: Path, width: int, height: int, with_model: bool) -> int:
    from PySide6.QtWidgets import QApplication

    from app.gui.main_window import MainWindow
    from app.gui.theme import DARK, LIGHT, apply_theme
    from app.gui.workers.chat_state import ModelState
    from app.paths import Paths
    from app.settings import SamplingPreset, Settings

    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp(prefix="glassbox-shots-"))
    home = Paths.resolve(tmp).ensure()
    seed_history(home)
    from engine.starter import install_starter_model

    install_starter_model(home.models)  # the first-start copy, done up front so every page has it
    doc = home.data / "ardmore-lighthouse.md"
    doc.write_text(SAMPLE_DOC, encoding="utf-8")
    # The starter is a tiny base model: a little sampling variety and a repeat penalty keep its
    # continuation readable, and a short reply keeps the screenshot tidy.
    preset = SamplingPreset(name="Screenshot", temperature=0.8, repeat_penalty=1.3, max_tokens=90)
    settings = Settings(theme="light", auto_load_model=with_model, presets=[preset], default_preset="Screenshot")
    window = MainWindow(home, settings, probe_bandwidth=True)
    window.resize(width, height)
    window.show()
    window.start()
    saved: list[str] = []

    def save(name: str, widget: Any = None) -> None:
        wait_until(app, lambda: False, 0.3)
        target = widget or window
        target.grab().save(str(out / f"{name}.png"))
        saved.append(name)

    if with_model:
        loaded = wait_until(app, lambda: window.chat.model_state in (ModelState.LOADED, ModelState.FAILED), 300)
        if loaded and window.chat.model_state is ModelState.LOADED:
            wait_until(app, lambda: window.chat.conversation is not None, 10)
            before = window.chat.conversation.id if window.chat.conversation is not None else None
            window.conversations.new_chat()
            wait_until(app, lambda: window.chat.conversation is not None and window.chat.conversation.id != before, 10)
            window.composer.edit.setPlainText("Tell me a short story about a lighthouse keeper.")
            window.composer._on_edit_submitted()
            wait_until(app, lambda: window.chat.busy, 10)
            wait_until(app, lambda: not window.chat.busy, 300)
            wait_until(app, lambda: window.inspector.tokens_view.token_ids != [], 20)
    else:
        wait_until(app, lambda: window.chat.conversation is not None, 10)
        window.chat.conversations.open(1)
        wait_until(app, lambda: len(window.chat_view.cards) == 2, 10)
        stats = window.chat.thread_messages[-1].stats
        window.inspector.set_model(253000000, 4096, 14.2)
        window.inspector.set_stats(stats)
        window.inspector.chart.set_samples([30, 38, 41, 43, 40, 42, 44, 41, 42, 43, 41, 42])
    save("chat-light")

    window.inspector.tabs.setCurrentIndex(1)
    save("inspector-tokens")
    window.inspector.tabs.setCurrentIndex(0)

    window.show_page(1)
    wait_until(app, lambda: window.models_page.library.rowCount() > 0, 30)
    wait_until(app, lambda: window.models_adapter.hardware is not None, 30)
    save("models-library")

    window.show_page(2)
    window.knowledge.create("Lighthouse notes")
    wait_until(app, lambda: window.knowledge_page.kb_list.count() > 0, 240)
    window.knowledge.add("Lighthouse notes", [doc])
    done: list[Any] = []
    window.knowledge.job_finished.connect(lambda _job, report: done.append(report))
    wait_until(app, lambda: bool(done), 300)
    window.knowledge_page.kb_list.setCurrentRow(0)
    wait_until(app, lambda: window.knowledge_page.docs.rowCount() > 0, 30)
    window.knowledge_page.query.setText("when was the fog horn added?")
    window.knowledge_page._on_query_return_pressed()
    wait_until(app, lambda: "fused" in window.knowledge_page.results.toPlainText(), 60)
    save("knowledge")

    window.show_page(0)
    window.colors = DARK
    window.settings.theme = "dark"
    window.apply_colors()
    save("chat-dark")
    window.show_page(1)
    save("models-library-dark")
    window.show_page(2)
    save("knowledge-dark")
    window.show_page(0)

    from app.gui.settings_dialog import SettingsDialog

    apply_theme(app, LIGHT)
    window.colors = LIGHT
    window.settings.theme = "system"
    window.apply_colors()
    dialog = SettingsDialog(window.settings, window)
    dialog.show()
    save("settings", dialog)
    dialog.close()

    window.shutdown()
    window.close()
    print(f"saved {len(saved)} screenshots to {out}: {', '.join(saved)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
