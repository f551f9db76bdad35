"""Speculative decoding through the app's LLM worker on the real engine (issue 14, section 2): the
engine's refusal of a draft model of another vocabulary is recognised (the model loads without it,
with the one-line reason), and a reply drafted by a draft model reaches the token view's data with
its accepted tokens marked."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from app.gui.workers.llm_requests import GenerateRequest, LoadedModel, LoadRequest
from app.gui.workers.llm_worker import LlmWorker
from engine.inference.runtime import GenerationParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from tiny_models import write_tiny_llama_gguf

from app.turn import TurnRequest

pytestmark = [pytest.mark.model]

PASSAGE = (
    "The river runs north past the old mill, then east under the stone bridge, and the town "
    "grew up on both of its banks. "
) * 3


def _load(worker: LlmWorker, request: LoadRequest) -> LoadedModel:
    loaded: list[LoadedModel] = []
    failed: list[BaseException] = []
    worker.model_loaded.connect(loaded.append)
    worker.model_load_failed.connect(failed.append)
    worker._on_load_requested(request)
    assert not failed, failed
    return loaded[-1]


def _generate(worker: LlmWorker, params: GenerationParams) -> tuple[Any, Any]:
    views: list[Any] = []
    outcomes: list[Any] = []
    errors: list[Any] = []
    worker.prompt_view_ready.connect(views.append)
    worker.generation_finished.connect(outcomes.append)
    worker.generation_failed.connect(lambda _rid, exc: errors.append(exc))
    worker._on_generate_requested(GenerateRequest(1, TurnRequest((), f"Repeat this: {PASSAGE}", params)))
    assert not errors, errors
    return outcomes[-1], views[-1]


def test_a_draft_of_another_vocabulary_is_refused_and_the_model_loads_without_it(
    starter_model: Path, tmp_path: Path
) -> None:
    other = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    worker = LlmWorker()
    try:
        loaded = _load(worker, LoadRequest(model_path=starter_model, n_ctx=512, draft_model_path=other))
        assert loaded.draft_path is None
        note = loaded.draft_note or ""
        assert "tiny.gguf" in note and "vocabular" in note and "loads without it" in note and "\n" not in note
        outcome, view = _generate(worker, GenerationParams(max_tokens=8, temperature=0.0, speculative="lookup"))
        assert outcome.reason in ("stop", "length") and len(view.reply_ids) == outcome.stats.completion_tokens
    finally:
        worker._close_session()


def test_a_reply_drafted_by_a_draft_model_marks_its_accepted_tokens(
    starter_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The starter drafting for itself costs as much as it saves, so the policy would not draft:
    # a fixed draft length exercises the path (engine.inference.decoding, GLASSBOX_TEST_DRAFT_FIXED).
    monkeypatch.setenv("GLASSBOX_TEST_DRAFT_FIXED", "4")
    worker = LlmWorker()
    try:
        loaded = _load(worker, LoadRequest(model_path=starter_model, n_ctx=1024, draft_model_path=starter_model))
        assert loaded.draft_path == starter_model and loaded.draft_note is None
        outcome, view = _generate(worker, GenerationParams(max_tokens=16, temperature=0.0, speculative="draft"))
        stats = outcome.stats
        assert stats.draft_tokens > 0 and stats.accepted_tokens > 0
        assert len(view.reply_ids) == len(view.reply_drafted) == stats.completion_tokens
        assert sum(view.reply_drafted) == stats.accepted_tokens
        assert "".join(view.reply_pieces) == outcome.text
    finally:
        worker._close_session()
