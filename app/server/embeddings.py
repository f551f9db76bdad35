"""``POST /v1/embeddings``: the sentence-transformers embedding model, loaded on first use.

Inputs longer than the model's window (256 tokens for the starter embedder) are not cut: the text
is split into windows of the model's tokens, each window embedded, and the vectors averaged
(weighted by their tokens) and normalized again, so every token counts and ``usage`` reports the
tokens that were embedded; an input that took more than one window says how many in its
``chunks`` field. Inputs may be text or token ids (a list of ids, or a list of such lists, as
OpenAI's clients send): ids are read with the embedding model's own tokenizer, and an id outside
its vocabulary is a 400 (ids from another tokenizer, e.g. tiktoken's, would silently embed other
text).
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from app.server import params as fields
from app.server.errors import HttpError, map_errors

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from transformers import PreTrainedTokenizerBase

    from app.server.handler import Handler

MAX_EMBED_INPUTS = 2048
"""Most inputs in one request."""

MAX_INPUT_TOKENS = 65536
"""Most tokens (or characters, for text) of one input: each window of it is embedded."""

EMBEDDING_FIELDS = frozenset({"input", "model", "encoding_format", "dimensions"})


class Embeddings:
    """The embedding model with its tokenizer: windows long inputs and reads token ids.

    Args:
        folder: the sentence-transformers model folder.
    """

    def __init__(self, folder: Path) -> None:
        from rag.embeddings import SentenceTransformerEmbedder

        self.embedder = SentenceTransformerEmbedder(folder)
        self.folder = folder
        self.model_id = self.embedder.model_id
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._lock = threading.Lock()  # a fast tokenizer is not safe to share between threads

    def _tokenizer_for(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        with self._lock:
            return len(self._tokenizer_for())

    def ids(self, text: str) -> list[int]:
        """The model's tokens of ``text``, without its special tokens."""
        with self._lock:
            return list(self._tokenizer_for()(text, add_special_tokens=False, verbose=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return str(self._tokenizer_for().decode(ids, skip_special_tokens=True))

    def windows(self, text: str) -> list[tuple[str, int]]:
        """``text`` as (window text, its tokens), each window fitting the model (one when it fits)."""
        ids = self.ids(text)
        room = max(self.embedder.max_tokens - 2, 1)  # the model adds its [CLS] and [SEP]
        if len(ids) <= room:
            return [(text, len(ids))]
        parts = [ids[start : start + room] for start in range(0, len(ids), room)]
        return [(self.decode(part), len(part)) for part in parts]

    def embed(self, texts: list[str]) -> tuple[NDArray[np.float32], list[int], list[int]]:
        """Vectors for ``texts`` (one row each, normalized), their tokens and their windows."""
        import numpy as np

        pieces: list[tuple[int, str, int]] = []
        for index, text in enumerate(texts):
            pieces.extend((index, window, count) for window, count in self.windows(text))
        vectors = self.embedder.encode([window for _, window, _ in pieces])
        dimension = vectors.shape[1]
        pooled = np.zeros((len(texts), dimension), dtype=np.float32)
        tokens = [0] * len(texts)
        windows = [0] * len(texts)
        for (index, _, count), vector in zip(pieces, vectors, strict=True):
            pooled[index] += vector * max(count, 1)
            tokens[index] += count
            windows[index] += 1
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.where(norms > 0, norms, 1.0)).astype(np.float32), tokens, windows


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _inputs(value: object) -> list[str | list[int]]:
    """The inputs as texts or token-id lists.

    Raises:
        HttpError: 400 for anything else, an empty list, or more than :data:`MAX_EMBED_INPUTS`.
    """
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(_is_id(v) for v in value):
        return [list(value)]
    if isinstance(value, list) and value:
        if len(value) > MAX_EMBED_INPUTS:
            raise HttpError(400, f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
        items: list[str | list[int]] = []
        for item in value:
            if isinstance(item, str):
                items.append(item)
            elif isinstance(item, list) and item and all(_is_id(v) for v in item):
                items.append(list(item))
            else:
                break
        else:
            return items
    raise HttpError(
        400,
        "'input' must be a string, a list of strings, a list of token ids, or a list of token-id lists",
        code="invalid_input",
        param="input",
    )


def _texts(embeddings: Embeddings, inputs: list[str | list[int]]) -> list[str]:
    texts: list[str] = []
    vocab = None
    for index, item in enumerate(inputs):
        if len(item) > MAX_INPUT_TOKENS:
            raise HttpError(
                400, f"input[{index}] is longer than {MAX_INPUT_TOKENS} tokens or characters", param="input"
            )
        if isinstance(item, str):
            texts.append(item)
            continue
        vocab = vocab if vocab is not None else embeddings.vocab_size
        if any(t >= vocab for t in item):
            raise HttpError(
                400,
                f"input[{index}] holds a token id outside the embedding model's vocabulary of {vocab}: send "
                "text, or ids of this model's tokenizer (LangChain: check_embedding_ctx_length=False)",
                code="invalid_input",
                param="input",
            )
        texts.append(embeddings.decode(item))
    return texts


def handle(handler: Handler) -> None:
    """Answers ``POST /v1/embeddings``."""
    state = handler.state
    body = fields.present(handler.read_json())
    fields.check_fields(body, EMBEDDING_FIELDS, "/v1/embeddings")
    inputs = _inputs(body.get("input"))
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise HttpError(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    if state.embedder_path is None:
        raise HttpError(501, "no embedding model is installed", "server_error")
    state.check_model(body, embeddings=True)
    embeddings = map_errors(state.embedder)
    texts = map_errors(lambda: _texts(embeddings, inputs))
    vectors, tokens, windows = map_errors(lambda: embeddings.embed(texts))
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != vectors.shape[1]:
        raise HttpError(
            400, f"this model makes {vectors.shape[1]}-dimensional vectors, not {dimensions}", param="dimensions"
        )
    data = []
    for index, vector in enumerate(vectors):
        if encoding == "base64":
            value: str | list[float] = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        else:
            value = [float(x) for x in vector]
        entry: dict[str, object] = {"object": "embedding", "index": index, "embedding": value}
        if windows[index] > 1:
            entry["chunks"] = windows[index]
        data.append(entry)
    total = sum(tokens)
    handler.send_json(
        200,
        {
            "object": "list",
            "data": data,
            "model": state.embedder_id,  # the id /v1/models lists, which a request may name
            "usage": {"prompt_tokens": total, "total_tokens": total},
        },
    )
