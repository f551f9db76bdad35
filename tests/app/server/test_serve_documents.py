"""``glassbox serve`` with ``knowledge_base``: the passages found are fitted by the engine's documents
band, as in the app; the reply says how many of the lowest-ranked were left out
(``documents_dropped``, beside ``sources``; absent when all fit, so an OpenAI client sees nothing new).

The backend is the scripted one of ``serve_support`` (one token a word) at a window of 800: the
band is 280 words; the fake knowledge bases rank six passages of 70 words, three of which take 254
words and four 328, so three are kept and three dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.events import Event
from tests.app.documents_band_support import RankedKnowledgeBases, passages_in, ranked_passages
from tests.app.server.serve_support import KEY, ScriptedBackend, client, post
from tests.fake_backend import StreamCall

CHAT = "/v1/chat/completions"


class DocumentsBackend(ScriptedBackend):
    """The scripted backend, recording the documents block each reply was given."""

    def __init__(self, n_ctx: int) -> None:
        super().__init__(n_ctx)
        self.documents: list[str | None] = []

    def script(self, call: StreamCall) -> Iterator[Event]:
        self.documents.append(call.documents)
        return super().script(call)


def _serve(tmp_path: Path, count: int) -> Iterator[tuple[ServerHandle, DocumentsBackend, RankedKnowledgeBases]]:
    backend = DocumentsBackend(n_ctx=800)
    kbs = RankedKnowledgeBases(ranked_passages(count, 70))
    with start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, backend=backend, knowledge=kbs) as handle:
        yield handle, backend, kbs


@pytest.fixture
def oversized(tmp_path: Path) -> Iterator[tuple[ServerHandle, DocumentsBackend, RankedKnowledgeBases]]:
    yield from _serve(tmp_path, 6)


@pytest.fixture
def fitting(tmp_path: Path) -> Iterator[tuple[ServerHandle, DocumentsBackend, RankedKnowledgeBases]]:
    yield from _serve(tmp_path, 2)


def _body(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "which colour"}], "knowledge_base": "notes", **extra}


def test_a_whole_reply_keeps_the_best_ranked_and_says_how_many_went(
    oversized: tuple[ServerHandle, DocumentsBackend, RankedKnowledgeBases],
) -> None:
    handle, backend, kbs = oversized
    status, reply = post(handle, CHAT, _body())
    assert status == 200, reply
    assert reply["documents_dropped"] == 3
    assert [source["n"] for source in reply["sources"]] == [1, 2, 3]  # the sources of the passages kept
    assert passages_in(backend.documents[0] or "") == [1, 2, 3]  # what reached the model
    assert kbs.queries[0][:2] == (["notes"], "which colour")
    completion = client(handle).chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "which colour"}],
        extra_body={"knowledge_base": "notes"},
    )
    assert completion.choices[0].message.content == "colour which"
    assert (completion.model_extra or {})["documents_dropped"] == 3  # the official client keeps it


def test_a_stream_says_it_in_the_last_chunk_beside_the_sources(
    oversized: tuple[ServerHandle, DocumentsBackend, RankedKnowledgeBases],
) -> None:
    handle, backend, _ = oversized
    status, events = post(handle, CHAT, _body(stream=True, n=2))
    assert status == 200
    chunks = [event.data for event in events if isinstance(event.data, dict)]
    carrying = [chunk for chunk in chunks if "documents_dropped" in chunk]
    assert len(carrying) == 1 and carrying[0] is chunks[-1]  # once, with the last choice's end
    assert carrying[0]["documents_dropped"] == 3
    assert [source["n"] for source in carrying[0]["sources"]] == [1, 2, 3]
    assert [passages_in(documents or "") for documents in backend.documents] == [[1, 2, 3], [1, 2, 3]]


def test_passages_that_fit_add_no_field_and_the_openai_client_reads_the_reply(
    fitting: tuple[ServerHandle, DocumentsBackend, RankedKnowledgeBases],
) -> None:
    handle, backend, _ = fitting
    status, reply = post(handle, CHAT, _body())
    assert status == 200, reply
    assert "documents_dropped" not in reply
    assert [source["n"] for source in reply["sources"]] == [1, 2]
    completion = client(handle).chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "which colour"}],
        extra_body={"knowledge_base": "notes"},
    )
    assert completion.choices[0].message.content == "colour which"
    assert passages_in(backend.documents[-1] or "") == [1, 2]
