"""A knowledge base on a real Chroma server (``chroma run`` on loopback), through ``--chroma-url``."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from standins import MakeKbs, write

from rag.errors import KnowledgeBaseError
from rag.store import VectorStore, parse_chroma_url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _chroma_binary() -> str | None:
    beside = Path(sys.executable).with_name("chroma")
    return str(beside) if beside.exists() else shutil.which("chroma")


@pytest.fixture(scope="module")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Starts ``chroma run`` on a free loopback port; yields its URL; stops it."""
    binary = _chroma_binary()
    if binary is None:
        pytest.skip("the chroma command (shipped with chromadb) is not installed")
    port = _free_port()
    data = tmp_path_factory.mktemp("chroma-server")
    log = (data / "server.log").open("wb")
    server = subprocess.Popen(
        [binary, "run", "--path", str(data / "db"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                log.close()
                pytest.fail(f"chroma run did not come up: {(data / 'server.log').read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        log.close()


def test_parse_chroma_url() -> None:
    assert parse_chroma_url("http://10.0.0.5:9000") == ("10.0.0.5", 9000, False)
    assert parse_chroma_url("https://chroma.example.org") == ("chroma.example.org", 443, True)
    assert parse_chroma_url("localhost:8001") == ("localhost", 8001, False)
    for bad in ("ftp://x:1", "http://", "http://host:notaport"):
        with pytest.raises(KnowledgeBaseError):
            parse_chroma_url(bad)


def test_unreachable_server_is_one_line_error() -> None:
    port = _free_port()  # nothing listens there
    with pytest.raises(KnowledgeBaseError) as info:
        VectorStore(url=f"http://127.0.0.1:{port}").connect()
    message = str(info.value)
    assert message.startswith(f"http://127.0.0.1:{port}: cannot open the Chroma store")
    assert "\n" not in message


def test_create_add_query_remove_on_a_server(tmp_path: Path, make_kbs: MakeKbs, chroma_server: str) -> None:
    write(tmp_path / "docs", "otters.txt", "Sea otters hold hands while sleeping so they do not drift apart.")
    write(tmp_path / "docs", "owls.txt", "Owls can rotate their heads about 270 degrees.")
    kbs = make_kbs(chroma_url=chroma_server)
    kb = kbs.create("team")
    assert kbs.add("team", [tmp_path / "docs"]).indexed == 2
    top = kbs.query("team", "why do otters hold hands?", k=1)[0]
    assert Path(top.path).name == "otters.txt"
    assert not (tmp_path / "kb" / "chroma").exists()  # the vectors live on the server

    # A second client sees the same collection on the server.
    other = VectorStore(url=chroma_server)
    assert other.count(kb.collection) == 2
    assert kbs.remove("team", tmp_path / "docs" / "owls.txt") == 1
    assert other.count(kb.collection) == 1
    kbs.drop("team")
    names = {getattr(c, "name", c) for c in other._client.list_collections()}
    assert kb.collection not in names


def test_a_second_home_on_the_same_server_searches_the_kb_and_cannot_make_a_twin(
    tmp_path: Path, make_kbs: MakeKbs, chroma_server: str
) -> None:
    """A knowledge base on a server carries its chunks' texts and places and its settings (model,
    dimension, owner) with the vectors. Another home sees it, searches it by meaning (its keyword
    index is in the home that made it), is told it cannot change it, and cannot make a second,
    empty one of the same name beside it."""
    from rag.knowledge import retrieve_context

    write(tmp_path / "docs", "otters.txt", "Sea otters hold hands while sleeping so they do not drift apart.")
    write(tmp_path / "docs", "owls.txt", "Owls can rotate their heads about 270 degrees.")
    alice = make_kbs(root=tmp_path / "alice", chroma_url=chroma_server)
    bob = make_kbs(root=tmp_path / "bob", chroma_url=chroma_server)
    kb = alice.create("shared-team")
    alice.add("shared-team", [tmp_path / "docs"])
    assert "shared-team" not in alice.foreign()
    assert "shared-team" in bob.foreign()

    # Bob searches it: the passages come with their texts and places from the server.
    top = bob.query("shared-team", "why do otters hold hands?", k=1)[0]
    assert Path(top.path).name == "otters.txt" and "hold hands" in top.text
    assert top.kb == "shared-team" and top.dense_score is not None and top.bm25_score is None
    block = retrieve_context(bob, ["shared-team"], "How far can owls turn their heads?", 200, lambda t: len(t.split()))
    assert "270 degrees" in block.text and Path(block.sources[0].path).name == "owls.txt"
    assert bob.searchable(["shared-team"]) == []  # none of them is Bob's own
    with pytest.raises(KnowledgeBaseError, match=r"^nope: no such knowledge base$"):
        bob.searchable(["nope"])

    # ... and cannot change it, nor make an empty twin of it.
    with pytest.raises(KnowledgeBaseError, match="belongs to another Glassbox home"):
        bob.add("shared-team", [tmp_path / "docs"])
    before = {getattr(c, "name", c) for c in VectorStore(url=chroma_server)._client.list_collections()}
    with pytest.raises(KnowledgeBaseError) as refused:
        bob.create("shared-team")
    message = str(refused.value)
    assert message.startswith(f"shared-team: the Chroma server {chroma_server} has a knowledge base of this name")
    assert "changed only by the Glassbox home that made it" in message and "\n" not in message
    after = {getattr(c, "name", c) for c in VectorStore(url=chroma_server)._client.list_collections()}
    assert after == before  # no second, empty collection
    assert [s.info.name for s in bob.list()] == []

    # The command line says so in `kb list`.
    listed = subprocess.run(
        [sys.executable, "-m", "app", "kb", "list", "--chroma-url", chroma_server, "--home", str(tmp_path / "carol")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "shared-team" in listed.stderr and "to search only" in listed.stderr
    assert listed.stdout.startswith("no knowledge bases")

    # What Alice removes is gone for Bob too; when she drops it, Bob may make his own.
    alice.remove("shared-team", tmp_path / "docs" / "owls.txt")
    assert all(Path(p.path).name != "owls.txt" for p in bob.query("shared-team", "owls heads", k=5))
    alice.drop("shared-team")
    assert "shared-team" not in bob.foreign()
    assert bob.create("shared-team").collection != kb.collection
