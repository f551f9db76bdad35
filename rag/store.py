"""The vector index: Chroma, local (``PersistentClient``) or remote (``HttpClient``).

Chroma holds ``id -> vector`` for the chunks the registry marks as embedded; texts and metadata
live in the registry, so the store can be dropped and rebuilt at any time. On a server the chunks'
texts and places are kept beside the vectors too, and each collection is labelled with its
knowledge base, model and owning registry, so that other Glassbox homes can find and search it
(``rag.knowledge.KnowledgeBases.foreign``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np

from rag.embeddings import Vectors
from rag.errors import KnowledgeBaseError

T = TypeVar("T")
log = logging.getLogger(__name__)

_PAGE = 5000  # ids fetched per request when listing a collection


def parse_chroma_url(url: str) -> tuple[str, int, bool]:
    """Splits ``http://host:port`` into ``(host, port, ssl)``.

    Raises:
        KnowledgeBaseError: the URL is not http(s) with a host.
    """
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise KnowledgeBaseError(f"{url}: a Chroma URL looks like http://host:port")
    ssl = parts.scheme == "https"
    try:
        port = parts.port or (443 if ssl else 8000)
    except ValueError:
        raise KnowledgeBaseError(f"{url}: bad port in the Chroma URL") from None
    return parts.hostname, port, ssl


class VectorStore:
    """One Chroma client; collections are named by the caller.

    Args:
        root: folder of a local persistent Chroma (used when ``url`` is None).
        url: ``http://host:port`` of a Chroma server.

    The client is opened on first use (or by :meth:`connect`); every method raises
    :class:`KnowledgeBaseError` when the store cannot be opened, reached or written.

    Raises:
        KnowledgeBaseError: ``url`` is malformed.
    """

    def __init__(self, root: Path | None = None, *, url: str | None = None) -> None:
        if root is None and url is None:
            raise KnowledgeBaseError("chroma: give a folder or a server URL")
        self.where = url or str(root)
        self._root = root
        self._server = parse_chroma_url(url) if url is not None else None
        self._lock = threading.RLock()
        self._collections: dict[str, Any] = {}
        self._client_instance: Any = None
        self.had_errors = False  # a call failed since it was opened: the folder is not vouched for

    @property
    def local(self) -> bool:
        """True for a folder on this machine, False for a server."""
        return self._server is None

    @property
    def connected(self) -> bool:
        """True once the client was opened (and not closed since)."""
        return self._client_instance is not None

    def connect(self) -> None:
        """Opens the client now (it is otherwise opened on first use, so that listing knowledge
        bases never pays for importing Chroma).

        Raises:
            KnowledgeBaseError: the store cannot be opened or the server does not answer.
        """
        with self._lock:
            if self._client_instance is not None:
                return
            with self._guard("cannot open the Chroma store"):
                # lazy: heavy (chromadb)
                import chromadb
                from chromadb.config import Settings

                settings = Settings(anonymized_telemetry=False, allow_reset=False)
                if self._server is not None:
                    host, port, ssl = self._server
                    client: Any = chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=settings)
                    client.heartbeat()
                else:
                    assert self._root is not None
                    self._root.mkdir(parents=True, exist_ok=True)
                    client = chromadb.PersistentClient(path=str(self._root), settings=settings)
                self._client_instance = client

    @property
    def _client(self) -> Any:
        if self._client_instance is None:
            self.connect()
        return self._client_instance

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except KnowledgeBaseError:
            raise
        # Chroma and its HTTP stack raise many unrelated exception types; at this boundary they
        # all mean "the store failed", and callers need one typed, one-line error.
        except Exception as exc:
            self.had_errors = True
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise KnowledgeBaseError(f"{self.where}: {what} ({reason[:300]})") from exc

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        with self._lock, self._guard(what):
            return fn()

    def _collection(self, name: str) -> Any:
        coll = self._collections.get(name)
        if coll is None:
            coll = self._call(
                f"cannot open collection {name}",
                lambda: self._client.get_or_create_collection(name=name, metadata={"hnsw:space": "cosine"}),
            )
            self._collections[name] = coll
        return coll

    def ensure(self, name: str, *, dimension: int, model_id: str, labels: Mapping[str, str] | None = None) -> None:
        """Creates the collection if needed, recording the model and dimension it holds.

        A collection holding vectors of another dimension is dropped and recreated empty: the
        registry then re-embeds into it, and no query ever raises a dimension error.

        Args:
            name: the collection.
            dimension: the vectors' dimension.
            model_id: the embedding model's id.
            labels: more metadata to record on it (which knowledge base and registry own it).
        """
        coll = self._collection(name)
        meta = dict(coll.metadata or {})
        if meta.get("dimension") not in (None, dimension) or meta.get("model_id") not in (None, model_id):
            self.drop(name)
            coll = self._collection(name)
            meta = {}
        wanted = dict(labels or {})
        if "dimension" not in meta or any(meta.get(k) != v for k, v in wanted.items()):
            meta.update({"hnsw:space": "cosine", "dimension": dimension, "model_id": model_id, **wanted})
            self._call(f"cannot label collection {name}", lambda: coll.modify(metadata=_mutable(meta)))

    def labelled(self, key: str) -> list[tuple[str, dict[str, Any]]]:
        """Every collection whose metadata has ``key``, as ``(name, metadata)``."""
        found = self._call("cannot list collections", self._client.list_collections)
        out: list[tuple[str, dict[str, Any]]] = []
        for coll in found:
            meta = dict(getattr(coll, "metadata", None) or {})
            if key in meta:
                out.append((str(getattr(coll, "name", coll)), meta))
        return out

    def upsert(
        self,
        name: str,
        ids: Sequence[int],
        vectors: Vectors,
        *,
        documents: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, str | int]] | None = None,
    ) -> None:
        """Adds or replaces vectors (idempotent: a retried batch is stored once).

        Args:
            name: the collection.
            ids: the chunks' ids.
            vectors: one vector per id.
            documents: the chunks' texts, kept beside the vectors (a collection on a server, so
                that other Glassbox homes can search it).
            metadatas: where each chunk comes from (path, page, heading, offsets), likewise.
        """
        if not ids:
            return
        coll = self._collection(name)
        extra: dict[str, Any] = {}
        if documents is not None:
            extra["documents"] = list(documents)
        if metadatas is not None:
            extra["metadatas"] = [dict(m) for m in metadatas]
        self._call("cannot write vectors", lambda: coll.upsert(ids=[str(i) for i in ids], embeddings=vectors, **extra))

    def delete(self, name: str, ids: Sequence[int]) -> None:
        """Removes vectors (unknown ids are ignored)."""
        coll = self._collection(name)
        for start in range(0, len(ids), _PAGE):
            part = [str(i) for i in ids[start : start + _PAGE]]
            self._call("cannot delete vectors", lambda part=part: coll.delete(ids=part))  # type: ignore[misc]

    def query(self, name: str, vector: Vectors, k: int) -> list[tuple[int, float]]:
        """Nearest neighbours of one vector.

        Returns:
            ``(chunk_id, cosine similarity)``, best first.
        """
        ids, distances, _ = self._query(name, vector, k, [])
        return [(int(i), 1.0 - float(d)) for i, d in zip(ids, distances, strict=False)]

    def query_with_texts(self, name: str, vector: Vectors, k: int) -> list[tuple[int, float, str, dict[str, Any]]]:
        """Nearest neighbours with the texts and metadata kept beside them (see :meth:`upsert`).

        Returns:
            ``(chunk_id, cosine similarity, text, metadata)``, best first; hits stored without a
            text are left out.
        """
        ids, distances, result = self._query(name, vector, k, ["documents", "metadatas"])
        texts = (result.get("documents") or [[]])[0] or [None] * len(ids)
        metas = (result.get("metadatas") or [[]])[0] or [None] * len(ids)
        return [
            (int(i), 1.0 - float(d), str(t), dict(m or {}))
            for i, d, t, m in zip(ids, distances, texts, metas, strict=False)
            if t
        ]

    def _query(self, name: str, vector: Vectors, k: int, include: list[str]) -> tuple[list[Any], list[Any], Any]:
        """One nearest-neighbour query: the hit ids, their cosine distances and the whole result.

        Args:
            name: the collection.
            vector: the query vector.
            k: how many hits at most.
            include: what to bring back beside the distances (``documents``, ``metadatas``).
        """
        coll = self._collection(name)
        result = self._call(
            "cannot query vectors",
            lambda: coll.query(
                query_embeddings=np.asarray(vector, dtype=np.float32).reshape(1, -1),
                n_results=k,
                include=["distances", *include],
            ),
        )
        ids = result["ids"][0] if result["ids"] else []
        distances = (result.get("distances") or [[]])[0] or [0.0] * len(ids)
        return ids, distances, result

    def count(self, name: str) -> int:
        """How many vectors the collection holds."""
        coll = self._collection(name)
        return int(self._call("cannot count vectors", coll.count))

    def ids(self, name: str) -> set[int]:
        """Every chunk id the collection holds."""
        coll = self._collection(name)
        found: set[int] = set()
        offset = 0
        while True:
            page = self._call(
                "cannot list vectors",
                lambda offset=offset: coll.get(include=[], limit=_PAGE, offset=offset),  # type: ignore[misc]
            )
            found.update(int(i) for i in page["ids"])
            if len(page["ids"]) < _PAGE:
                return found
            offset += _PAGE

    def drop(self, name: str) -> None:
        """Deletes the collection (missing is fine)."""
        self._collections.pop(name, None)
        names = self._call("cannot list collections", self._client.list_collections)
        if name in {getattr(c, "name", c) for c in names}:
            self._call(f"cannot delete collection {name}", lambda: self._client.delete_collection(name=name))

    def close(self) -> None:
        """Closes the client and forgets its collection handles.

        Closing matters for a local folder: chromadb caches one system per path in the process,
        and a folder moved aside and recreated must not be served by the old one.
        """
        with self._lock:
            client, self._client_instance = self._client_instance, None
            self._collections.clear()
            close = getattr(client, "close", None)
            if close is not None:
                try:
                    close()
                # Closing happens at shutdown or before a rebuild; a failure there changes nothing.
                except Exception as exc:  # noqa: BLE001
                    log.warning("%s: closing the Chroma client failed (%s)", self.where, exc)


def _mutable(meta: dict[str, Any]) -> dict[str, Any]:
    # Chroma refuses to change "hnsw:space" after creation; it was set when the collection was made.
    return {k: v for k, v in meta.items() if not k.startswith("hnsw:")}
