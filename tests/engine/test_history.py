"""Chat history: round trips, the message tree, search, durability under kill -9, migrations, bad files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import HistoryError
from engine.history import HistoryStore
from engine.history_db import SQLITE_MAGIC
from engine.history_schema import MIGRATIONS, fts_query
from tests.engine.history_fixtures import previous_version_history

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "history.sqlite3"


@pytest.fixture
def store(db_path: Path) -> Iterator[HistoryStore]:
    with HistoryStore(db_path) as opened:
        yield opened


def test_conversation_round_trip(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        first = store.create_conversation("Cooking", system_prompt="Be a chef.", settings={"temperature": 0.2})
        second = store.create_conversation()
        store.rename(first.id, "Baking")
        store.update_conversation(first.id, knowledge_bases=["recipes"], settings={"temperature": 0.7})
        store.update_conversation(second.id, system_prompt=None)
    with HistoryStore(db_path) as store:
        loaded = store.get_conversation(first.id)
        assert loaded.title == "Baking"
        assert loaded.system_prompt == "Be a chef."
        assert loaded.settings == {"temperature": 0.7}
        assert loaded.knowledge_bases == ["recipes"]
        assert loaded.deleted_at is None
        assert loaded.current_leaf_id is None
        assert store.get_conversation(second.id).title == "New chat"
        assert store.get_conversation(second.id).settings == {}


def test_list_is_newest_updated_first_and_soft_delete_can_be_undone(store: HistoryStore) -> None:
    a = store.create_conversation("a")
    store.create_conversation("b")
    c = store.create_conversation("c")
    store.add_message(a.id, "user", "bump a")
    assert [conv.title for conv in store.list_conversations()] == ["a", "c", "b"]
    store.delete(c.id)
    assert [conv.title for conv in store.list_conversations()] == ["a", "b"]
    assert [conv.title for conv in store.list_conversations(include_deleted=True)] == ["a", "c", "b"]
    assert store.get_conversation(c.id).deleted_at is not None
    store.restore(c.id)
    assert [conv.title for conv in store.list_conversations()] == ["a", "c", "b"]


def test_purge_removes_deleted_conversations_and_their_messages(store: HistoryStore) -> None:
    keep = store.create_conversation("keep")
    gone = store.create_conversation("gone")
    store.add_message(gone.id, "user", "ephemeral zebra")
    store.delete(gone.id)
    assert store.purge_deleted(older_than_s=3600) == 0
    assert store.purge_deleted() == 1
    assert [conv.id for conv in store.list_conversations(include_deleted=True)] == [keep.id]
    with pytest.raises(HistoryError, match=f"no conversation with id {gone.id}"):
        store.get_conversation(gone.id)
    assert store.search("zebra") == []
    assert store.integrity_check() == "ok"


def test_streamed_reply_round_trip(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        conv = store.create_conversation()
        question = store.add_message(conv.id, "user", "What is a GGUF file?")
        reply = store.add_message(conv.id, "assistant", "", state="pending", model="gemma")
        assert reply.parent_id == question.id
        store.append_text(reply.id, "A model ")
        store.append_text(reply.id, "file format.")
        assert store.get_message(reply.id).content == "A model file format."
        assert store.get_message(reply.id).state == "pending"
        store.finish_message(
            reply.id,
            "A model file format.",
            state="complete",
            stats={"decode_tps": 41.5, "prompt_tokens": 12},
            sources=[{"file": "notes.md", "page": 2}],
        )
    with HistoryStore(db_path) as store:
        thread = store.thread(conv.id)
        assert [(m.role, m.content, m.state) for m in thread] == [
            ("user", "What is a GGUF file?", "complete"),
            ("assistant", "A model file format.", "complete"),
        ]
        assert thread[1].stats == {"decode_tps": 41.5, "prompt_tokens": 12}
        assert thread[1].sources == [{"file": "notes.md", "page": 2}]
        assert thread[1].model == "gemma"
        assert store.get_conversation(conv.id).current_leaf_id == reply.id


def test_stopped_reply_is_saved_as_partial_and_crashed_ones_recovered(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        conv = store.create_conversation()
        store.add_message(conv.id, "user", "count to ten")
        stopped = store.add_message(conv.id, "assistant", "", state="pending")
        store.finish_message(stopped.id, "one two thr", state="partial")
        store.add_message(conv.id, "user", "again")
        crashed = store.add_message(conv.id, "assistant", "one", state="pending")
        failed = store.add_message(conv.id, "assistant", "", parent_id=crashed.parent_id, state="pending")
        store.finish_message(failed.id, "", state="error", error="the inference worker crashed")
    with HistoryStore(db_path) as store:
        assert store.get_message(stopped.id).state == "partial"
        assert store.get_message(stopped.id).content == "one two thr"
        assert store.get_message(failed.id).error == "the inference worker crashed"
        assert store.recover_pending() == 1
        assert store.get_message(crashed.id).state == "partial"
        assert store.get_message(crashed.id).content == "one"
        assert store.recover_pending() == 0


def test_editing_and_regenerating_add_siblings_and_keep_old_branches(store: HistoryStore) -> None:
    conv = store.create_conversation()
    q1 = store.add_message(conv.id, "user", "Name a fruit")
    a1 = store.add_message(conv.id, "assistant", "Apple")
    q2 = store.add_message(conv.id, "user", "Another")
    a2 = store.add_message(conv.id, "assistant", "Banana")
    # Regenerate the last reply: a sibling of a2.
    a2b = store.add_message(conv.id, "assistant", "Cherry", parent_id=q2.id)
    assert [m.content for m in store.thread(conv.id)] == ["Name a fruit", "Apple", "Another", "Cherry"]
    assert [m.id for m in store.siblings(a2.id)] == [a2.id, a2b.id]
    # Edit the first question: a sibling of q1 and a fresh branch.
    q1b = store.add_message(conv.id, "user", "Name a vegetable", parent_id=q1.parent_id)
    a1b = store.add_message(conv.id, "assistant", "Carrot")
    assert [m.content for m in store.thread(conv.id)] == ["Name a vegetable", "Carrot"]
    assert [m.id for m in store.siblings(q1.id)] == [q1.id, q1b.id]
    assert [m.id for m in store.siblings(q1b.id)] == [q1.id, q1b.id]
    assert [m.id for m in store.children(q1.id)] == [a1.id]
    # The old branch is still there: select it, and its newest leaf (the regenerated reply) shows.
    store.select_branch(q1.id)
    assert [m.id for m in store.thread(conv.id)] == [q1.id, a1.id, q2.id, a2b.id]
    store.select_branch(a2.id)
    assert [m.content for m in store.thread(conv.id)] == ["Name a fruit", "Apple", "Another", "Banana"]
    store.select_branch(q1b.id)
    assert [m.id for m in store.thread(conv.id)] == [q1b.id, a1b.id]
    # Appending goes under the current leaf of the selected branch.
    store.select_branch(a2.id)
    follow = store.add_message(conv.id, "user", "Thanks")
    assert follow.parent_id == a2.id


def test_add_message_checks_its_arguments(store: HistoryStore) -> None:
    mine = store.create_conversation()
    other = store.create_conversation()
    foreign = store.add_message(other.id, "user", "hi")
    with pytest.raises(HistoryError, match="is not a message of conversation"):
        store.add_message(mine.id, "assistant", "x", parent_id=foreign.id)
    with pytest.raises(HistoryError, match="is not a message of conversation"):
        store.add_message(mine.id, "assistant", "x", parent_id=999_999)
    with pytest.raises(HistoryError, match="unknown message role 'robot'"):
        store.add_message(mine.id, "robot", "x")
    with pytest.raises(HistoryError, match="unknown message state 'done'"):
        store.add_message(mine.id, "user", "x", state="done")
    with pytest.raises(HistoryError, match="no conversation with id 424242"):
        store.add_message(424242, "user", "x")
    with pytest.raises(HistoryError, match="no message with id 5555"):
        store.finish_message(5555, "x", state="complete")
    with pytest.raises(HistoryError, match="no message with id 5555"):
        store.select_branch(5555)
    assert store.thread(mine.id) == []


def test_search_finds_words_across_conversations(store: HistoryStore) -> None:
    travel = store.create_conversation("Travel")
    code = store.create_conversation("Code")
    store.add_message(travel.id, "user", "Which trains go from Zürich to Milano?")
    store.add_message(travel.id, "assistant", "The EuroCity trains run every two hours.")
    store.add_message(code.id, "user", "How do I write a Python generator for trains of tokens?")
    hits = store.search("trains")
    assert {(hit.conversation_title, hit.role) for hit in hits} == {
        ("Travel", "user"),
        ("Travel", "assistant"),
        ("Code", "user"),
    }
    assert all("**" in hit.snippet for hit in hits)
    assert [hit.conversation_id for hit in store.search("python generator")] == [code.id]
    assert [hit.conversation_id for hit in store.search("zurich")] == [travel.id]  # diacritics folded
    assert [hit.conversation_id for hit in store.search("gener")] == [code.id]  # last word is a prefix
    assert len(store.search("trains", limit=2)) == 2
    store.delete(code.id)
    assert {hit.conversation_id for hit in store.search("trains")} == {travel.id}


def test_search_follows_edits_of_message_text(store: HistoryStore) -> None:
    conv = store.create_conversation()
    reply = store.add_message(conv.id, "assistant", "", state="pending")
    store.append_text(reply.id, "quokka ")
    assert [hit.message_id for hit in store.search("quokka")] == [reply.id]
    store.finish_message(reply.id, "wombat", state="complete")
    assert store.search("quokka") == []
    assert [hit.message_id for hit in store.search("wombat")] == [reply.id]


@pytest.mark.parametrize(
    "query",
    [
        "foo AND (",
        '"',
        '""',
        "'",
        "*",
        "foo*",
        "NEAR(foo bar)",
        "content:foo",
        "-foo",
        "^foo",
        "foo OR",
        "NOT",
        "(((",
        "a\"b'c",
        "café ünïcödé 日本語",
        "🙂",
        "",
        "   ",
        "\x00",
        "{col1 col2}: x",
    ],
)
def test_odd_search_queries_never_raise(store: HistoryStore, query: str) -> None:
    conv = store.create_conversation()
    store.add_message(conv.id, "user", "foo bar café 日本語 a\"b'c")
    hits = store.search(query)
    assert isinstance(hits, list)
    assert all(hit.conversation_id == conv.id for hit in hits)


def test_fts_query_quotes_every_word() -> None:
    assert fts_query('foo AND ("bar') == '"foo" "AND" "(""bar"*'
    assert fts_query("( * )") == ""
    assert fts_query("to be") == '"to" "be"'  # short last word: no prefix


def test_database_uses_wal_full_sync_and_foreign_keys(store: HistoryStore, db_path: Path) -> None:
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.schema_version == len(MIGRATIONS)


def test_concurrent_writers_from_several_threads(store: HistoryStore) -> None:
    conversations = [store.create_conversation(f"t{i}") for i in range(4)]
    errors: list[BaseException] = []

    def write(conversation_id: int) -> None:
        try:
            for n in range(25):
                store.add_message(conversation_id, "user", f"message {n}")
        except HistoryError as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(conv.id,)) for conv in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    for conv in conversations:
        assert [m.content for m in store.thread(conv.id)] == [f"message {n}" for n in range(25)]


def test_closed_store_gives_a_typed_error(db_path: Path) -> None:
    store = HistoryStore(db_path)
    store.close()
    with pytest.raises(HistoryError, match="closed"):
        store.list_conversations()


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from engine.history import HistoryStore

    store = HistoryStore(Path(sys.argv[1]))
    conv = store.create_conversation("crash test")
    n = 0
    while True:
        role = "user" if n % 2 == 0 else "assistant"
        message = store.add_message(conv.id, role, f"message number {n} " * 20)
        print(message.id, flush=True)
        if n % 3 == 0:
            store.append_text(message.id, " more")
        n += 1
    """
)


def test_kill_9_mid_write_loses_nothing_that_was_committed(db_path: Path, tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    committed: list[int] = []
    for round_number in range(3):
        child = subprocess.Popen(
            [sys.executable, str(script), str(db_path)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert child.stdout is not None
        try:
            target = 15 + 7 * round_number
            for _ in range(target):
                line = child.stdout.readline()
                assert line, "the writer stopped before it was killed"
                committed.append(int(line))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        with HistoryStore(db_path) as store:
            assert store.integrity_check() == "ok"
            present = {m.id for conv in store.list_conversations() for m in store.thread(conv.id)}
            assert set(committed) <= present
            assert len(store.list_conversations()) == round_number + 1
    assert len(committed) == 15 + 22 + 29


def _old_schema_db(path: Path) -> None:
    """A database as the first released schema wrote it, with data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    conn.execute("BEGIN")
    MIGRATIONS[0].apply(conn)
    conn.execute("INSERT INTO migrations VALUES (?, 0)", (MIGRATIONS[0].name,))
    conn.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES (1, 'Old chat', 1, 1)")
    conn.execute(
        "INSERT INTO messages (id, conversation_id, parent_id, role, content, state, created_at)"
        " VALUES (1, 1, NULL, 'user', 'an archaeopteryx question', 'complete', 1)"
    )
    conn.execute("UPDATE conversations SET current_leaf_id = 1 WHERE id = 1")
    conn.execute("COMMIT")
    conn.close()


def test_migrating_an_old_schema_backs_it_up_first(db_path: Path) -> None:
    _old_schema_db(db_path)
    backup = db_path.with_name("history.sqlite3.bak-v1")
    assert not backup.exists()
    with HistoryStore(db_path) as store:
        assert store.schema_version == len(MIGRATIONS)
        assert [m.content for m in store.thread(1)] == ["an archaeopteryx question"]
        assert [hit.message_id for hit in store.search("archaeopteryx")] == [1]  # FTS built from old rows
    assert backup.exists()
    old = sqlite3.connect(backup)
    try:
        assert old.execute("SELECT name FROM migrations").fetchall() == [("m001_initial",)]
        assert old.execute("SELECT content FROM messages").fetchall() == [("an archaeopteryx question",)]
    finally:
        old.close()
    # Opening again migrates nothing and makes no new backup.
    with HistoryStore(db_path) as store:
        assert store.schema_version == len(MIGRATIONS)
    assert sorted(p.name for p in db_path.parent.glob("*.bak-*")) == ["history.sqlite3.bak-v1"]


def test_a_chat_remembers_its_model_across_a_restart(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        local = store.create_conversation("Local", model="/models/qwen3-0.6b-q4_k_m.gguf")
        remote = store.create_conversation("Remote")
        assert remote.model is None
        store.update_conversation(remote.id, model="remote:lab/llama-3.1-8b")
        store.update_conversation(local.id, settings={"preset": "precise"})  # another field leaves it alone
    with HistoryStore(db_path) as store:
        assert store.get_conversation(local.id).model == "/models/qwen3-0.6b-q4_k_m.gguf"
        assert store.get_conversation(local.id).settings == {"preset": "precise"}
        assert store.get_conversation(remote.id).model == "remote:lab/llama-3.1-8b"
        assert [c.id for c in store.list_conversations()] == [remote.id, local.id]  # not moved by the write
        store.update_conversation(remote.id, model=None)
        assert store.get_conversation(remote.id).model is None


def test_a_history_of_the_previous_version_opens_without_a_model_and_takes_one(db_path: Path) -> None:
    previous_version_history(db_path)
    with HistoryStore(db_path) as store:
        old = store.get_conversation(1)
        assert old.model is None and old.settings == {"adapters": [], "preset": "precise"}
        assert [m.content for m in store.thread(1)] == ["an answer"]
        store.update_conversation(1, model="/models/a.gguf")
    backup = db_path.with_name("history.sqlite3.bak-v3")
    assert backup.exists()  # the previous version's file, kept before the step
    old_file = sqlite3.connect(backup)
    try:
        columns = [row[1] for row in old_file.execute("PRAGMA table_info(conversations)")]
        assert "model" not in columns
    finally:
        old_file.close()
    with HistoryStore(db_path) as store:
        assert store.get_conversation(1).model == "/models/a.gguf"


def test_a_damaged_model_value_costs_only_itself(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        chat = store.create_conversation("Chat", system_prompt="Be brief.")
    conn = sqlite3.connect(db_path)
    # a blob where the text was, as a flipped bit in the record can make it
    conn.execute("UPDATE conversations SET model = x'fffe00' WHERE id = ?", (chat.id,))
    conn.commit()
    conn.close()
    with HistoryStore(db_path) as store:
        read = store.get_conversation(chat.id)
        assert read.model is None and read.system_prompt == "Be brief." and read.title == "Chat"


def test_new_database_needs_no_backup(db_path: Path) -> None:
    with HistoryStore(db_path):
        pass
    assert list(db_path.parent.glob("*.bak-*")) == []


@pytest.mark.parametrize(
    "content",
    [
        b"this is a text file that someone renamed history.sqlite3\n",
        b"\x89PNG\r\n\x1a\n" + bytes(200),
        SQLITE_MAGIC + b"\xff" * 4000,
    ],
    ids=["text", "png", "sqlite-header-garbage"],
)
def test_a_file_that_is_not_a_usable_database_is_reported_and_left_alone(db_path: Path, content: bytes) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(content)
    with pytest.raises(HistoryError) as caught:
        HistoryStore(db_path)
    message = str(caught.value)
    assert message.startswith(f"{db_path}: ")
    assert "\n" not in message
    assert db_path.read_bytes() == content
    assert sorted(p.name for p in db_path.parent.iterdir()) == ["history.sqlite3"]


def test_a_full_disk_is_reported_and_earlier_messages_survive(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        conv = store.create_conversation()
        kept = store.add_message(conv.id, "user", "saved before the disk filled up")
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages + 2}")  # simulates SQLITE_FULL
        with pytest.raises(HistoryError, match="could not save: the disk is full"):
            store.add_message(conv.id, "assistant", "x" * 200_000)
        assert [m.id for m in store.thread(conv.id)] == [kept.id]
    with HistoryStore(db_path) as store:
        assert [m.content for m in store.thread(conv.id)] == ["saved before the disk filled up"]
        assert store.integrity_check() == "ok"


def test_a_folder_that_cannot_be_created_is_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(HistoryError, match="cannot create the folder"):
        HistoryStore(blocker / "data" / "history.sqlite3")
