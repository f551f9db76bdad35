"""``glassbox chat --kb``: the passages found are fitted by the engine's documents band, as in the
app: the best-ranked that fit are kept, the rest left out, said on stderr and saved with the reply.

In-process, against the scripted OpenAI-shaped server of ``tests/engine/test_remote.py`` (no model):
its session counts about four characters a token. The knowledge bases are a fake ranking of six
passages of 70 words: at ``--n-ctx 1024`` the band is 358 tokens, two passages take 282 and three
393, so two are kept and four dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import knowledge_glue
from app.cli.main import main
from app.paths import Paths
from engine.history import HistoryStore
from engine.inference.endpoints import EndpointStore
from tests.app.documents_band_support import RankedKnowledgeBases, passages_in, ranked_passages
from tests.engine.test_remote import ScriptedServer, delta, models_route, sse


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer(
        {
            "/v1/models": models_route("tiny-a"),
            "/v1/chat/completions": lambda body: (200, sse(delta("Blue."), delta(finish="stop"))),
        }
    )
    yield scripted
    scripted.close()


def _chat(
    server: ScriptedServer, home: Path, kbs: RankedKnowledgeBases, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> int:
    paths = Paths.resolve(str(home))
    paths.config.mkdir(parents=True, exist_ok=True)
    EndpointStore(paths.config / "endpoints.json").add(server.url, name="lab")
    monkeypatch.setattr(knowledge_glue, "open_knowledge_bases", lambda *args, **kwargs: kbs)
    argv = ["chat", "--endpoint", "lab", "--kb", "notes", "--n-ctx", "1024", "--prompt", "Which colour?"]
    return main([*argv, *extra, "--home", str(home)])


def _prompt_text(server: ScriptedServer) -> str:
    body = next(body for path, body, _ in server.requests if path == "/v1/chat/completions")
    return "\n".join(str(message["content"]) for message in body["messages"])


def test_oversized_passages_keep_the_best_ranked_and_say_how_many_went(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kbs = RankedKnowledgeBases(ranked_passages(6, 70))
    code = _chat(server, tmp_path, kbs, monkeypatch, "--json")
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["text"] == "Blue."
    assert doc["documents_dropped"] == 4
    assert [source["n"] for source in doc["sources"]] == [1, 2]  # the sources of the passages kept
    assert passages_in(_prompt_text(server)) == [1, 2]  # the best-ranked reached the model, the rest did not
    assert kbs.queries == [(["notes"], "Which colour?", knowledge_glue.CHAT_PASSAGES)]
    with HistoryStore(Paths.resolve(str(tmp_path)).history_db) as store:
        reply = store.thread(doc["conversation_id"])[-1]
    assert reply.stats is not None and reply.stats["documents_dropped"] == 4  # saved as the app saves it
    assert [source["n"] for source in reply.sources or []] == [1, 2]


def test_the_dropped_passages_are_one_line_on_stderr(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _chat(server, tmp_path, RankedKnowledgeBases(ranked_passages(6, 70)), monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out == "Blue.\n"
    lines = out.err.splitlines()
    assert lines.count("[4 passages did not fit the context window and were left out]") == 1
    assert [line.split("]")[0].strip() for line in lines if line.startswith("  [")] == ["[1", "[2"]  # Sources


def test_passages_that_fit_are_all_kept_and_nothing_is_said(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _chat(server, tmp_path, RankedKnowledgeBases(ranked_passages(2, 70)), monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "did not fit" not in out.err
    assert passages_in(_prompt_text(server)) == [1, 2]
    with HistoryStore(Paths.resolve(str(tmp_path)).history_db) as store:
        conversation = store.list_conversations()[0]
        reply = store.thread(conversation.id)[-1]
    assert reply.stats is not None and "documents_dropped" not in reply.stats
