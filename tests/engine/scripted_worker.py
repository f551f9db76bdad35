"""A ChatSession over a scripted inference worker: real templates, budget and reply shaping, no model.

The worker tokenizes by UTF-8 bytes (so a prompt's text can be read back from its tokens), records
every prompt it is sent, and streams the scripted replies in pieces of a chosen size.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import engine.inference.session as session_module
from engine.inference.events import PrefillProgress, Token
from engine.inference.runtime import GenerationParams, LoadParams, ModelInfo, WorkerResult
from engine.inference.session import ChatSession
from tests.engine.gguf_fixtures import build


@dataclass
class Script:
    """What the scripted worker answers, and what it was sent."""

    replies: list[str] = field(default_factory=list)
    piece: int = 3
    prompts: list[str] = field(default_factory=list)
    params: list[GenerationParams] = field(default_factory=list)
    control: dict[str, int] = field(default_factory=dict)
    """Control tokens of the vocabulary (text -> id): one token when tokenized, and streamed with
    no text, as llama.cpp renders generated control tokens."""


def scripted_session(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    template: str | None,
    script: Script,
    *,
    architecture: str = "qwen3",
    n_ctx: int = 4096,
) -> ChatSession:
    """A ChatSession whose worker is scripted; ``template`` is the model's chat template."""
    model = tmp_path / "scripted.gguf"
    model.write_bytes(build().data)

    class ScriptedWorker:
        def __init__(self, params: LoadParams) -> None:
            self.params = params
            self.alive = True
            self.backend = None

        def start(self, cancel: object = None) -> ModelInfo:
            return ModelInfo(
                str(model), architecture, n_ctx, n_ctx, 256, 1, 1000, 2, 0, False, "<s>", "</s>", False, template
            )

        def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
            if special and text in script.control:
                return [script.control[text]]
            return list(text.encode("utf-8"))

        def pieces(self, tokens: Sequence[int]) -> list[str]:
            return [bytes([t]).decode("utf-8", errors="replace") for t in tokens]

        def configure_kv_cache(self, request: Any) -> None:
            pass

        def generate(
            self, tokens: Sequence[int], params: GenerationParams, cancel: threading.Event | None = None
        ) -> Generator[PrefillProgress | Token, None, WorkerResult]:
            script.prompts.append(bytes(tokens).decode("utf-8"))
            script.params.append(params)
            reply = script.replies.pop(0) if script.replies else "ok"
            yield PrefillProgress(len(tokens), len(tokens))
            count, sent = 0, ""
            for piece in _pieces(reply, script.piece, script.control):
                if cancel is not None and cancel.is_set():
                    return WorkerResult("cancelled", sent, len(tokens), 0, count, len(tokens) + count, 1.0, 1.0, 1.0)
                count += 1
                if piece in script.control:
                    yield Token("", script.control[piece])
                    continue
                sent += piece
                # one byte per piece: its token id is the byte, as tokenize() would give
                yield Token(piece, piece.encode()[0] if len(piece.encode()) == 1 else count)
            return WorkerResult("stop", reply, len(tokens), 0, count, len(tokens) + count, 1.0, 1.0, 1.0)

        def close(self, kill: bool = False) -> None:
            self.alive = False

    monkeypatch.setattr(session_module, "InferenceWorker", ScriptedWorker)
    session = ChatSession(LoadParams(model_path=model, n_ctx=n_ctx))
    session.load()
    return session


def _pieces(reply: str, size: int, control: dict[str, int]) -> list[str]:
    """The reply in pieces of ``size`` characters, each control token a piece of its own."""
    out: list[str] = []
    rest = reply
    while rest:
        found = [(rest.find(marker), marker) for marker in control if marker in rest]
        at, marker = min(found) if found else (len(rest), "")
        text, rest = rest[:at], rest[at + len(marker) :]
        out.extend(text[i : i + size] for i in range(0, len(text), size))
        if marker:
            out.append(marker)
    return out
