"""rag.calls.KnowledgeCalls: each typed method is one call the service answers, with its arguments."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag.calls import KnowledgeCalls
from rag.service import CALLS, JOB_CALLS, dispatch


class Recorder:
    """A ``rag.service.Service`` that runs each call on a fake ``KnowledgeBases`` through the real
    :func:`rag.service.dispatch`, recording what reached it."""

    def __init__(self) -> None:
        self.kbs = FakeKbs()

    def call(
        self,
        method: str,
        *args: Any,
        progress: Any = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
        **kwargs: Any,
    ) -> Any:
        if method in JOB_CALLS:
            kwargs.update(progress=progress, cancel=cancel, pause=pause)
        return dispatch(self.kbs, method, args, kwargs)

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]:
        return list(self.call("query_many", list(names), text, k=k))

    def close(self) -> None:
        pass


class FakeKbs:
    """Answers every ``KnowledgeBases`` method the service may call with what it was given."""

    recovered = None

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        if method not in CALLS:
            raise AttributeError(method)

        def run(*args: Any, **kwargs: Any) -> Any:
            self.seen.append((method, args, kwargs))
            if method in ("pending", "remove"):
                return 3
            if method in ("list", "foreign", "searchable", "query_many", "documents"):
                return [method, *args]
            return (method, args)

        return run


def test_every_typed_call_reaches_the_knowledge_bases_method_with_its_arguments(tmp_path: Path) -> None:
    service = Recorder()
    calls = KnowledgeCalls(service)
    cancel, pause = threading.Event(), threading.Event()
    progress: list[object] = []

    assert calls.list() == ["list"]
    assert calls.get("notes") == ("get", ("notes",))
    assert calls.documents("notes") == ["documents", "notes"]
    assert calls.foreign() == ["foreign"]
    assert calls.searchable(("a", "b")) == ["searchable", ["a", "b"]]
    assert calls.pending(["a"]) == 3 and calls.pending() == 3
    assert calls.status() == (None, 3)  # (the store's recovery, the chunks pending)
    assert calls.query_many(("a",), "cats", k=2) == ["query_many", ["a"], "cats"]
    assert calls.create("new") == ("create", ("new",))
    assert calls.ensure("notes") == ("get", ("notes",))  # it exists: no create
    calls.drop("old")
    assert calls.remove("notes", tmp_path / "a.txt") == 3
    calls.add("notes", (tmp_path,), progress=progress.append, cancel=cancel, pause=pause)
    calls.reindex("notes", cancel=cancel)
    calls.rebuild(["notes"], pause=pause)

    seen = [(method, args) for method, args, _ in service.kbs.seen]
    assert ("drop", ("old",)) in seen and ("remove", ("notes", tmp_path / "a.txt")) in seen
    assert ("add", ("notes", [tmp_path])) in seen and ("rebuild", (["notes"],)) in seen
    jobs = {method: kwargs for method, _, kwargs in service.kbs.seen if method in JOB_CALLS}
    assert jobs["add"] == {"progress": progress.append, "cancel": cancel, "pause": pause}
    assert jobs["reindex"]["cancel"] is cancel and jobs["rebuild"]["pause"] is pause
    assert {method for method, _, _ in service.kbs.seen} <= CALLS


def test_create_unique_takes_the_first_free_name() -> None:
    class Named(FakeKbs):
        def list(self) -> list[Any]:
            class Info:
                def __init__(self, name: str) -> None:
                    self.name = name

            class Summary:
                def __init__(self, name: str) -> None:
                    self.info = Info(name)

            return [Summary("Documents"), Summary("Documents 2")]

    service = Recorder()
    service.kbs = Named()
    assert KnowledgeCalls(service).create_unique("Documents") == ("create", ("Documents 3",))
