"""Speculative decoding in the app (issue 14, section 2): the draft model a load asks for, the mode a
chat turn decodes with, and the reply's tokens for the inspector's token view.

* :func:`draft_for` is the draft model Settings chose for a chat model (``settings.draft_models``).
* :func:`load_session` loads a model with its draft; a draft the engine refuses (another
  vocabulary, a file it cannot load) is dropped with a one-line note, and the chat model is loaded
  without it, so a bad choice in Settings never leaves the user without a model.
* :func:`speculative_mode` is ``GenerationParams.speculative`` for a turn: ``draft`` when the loaded
  model has its draft, ``off`` for a model on a remote server (it decodes on its own), else the
  setting (``lookup`` or ``off``).
* :class:`TokensView` is the prompt as the model saw it plus the reply's tokens, each marked when
  it was accepted from a draft (``engine.inference.events.Token.drafted``): the inspector tints those.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from app.gui.workers.model_routing import parse_remote_model
from engine.errors import ModelLoadError

if TYPE_CHECKING:
    from app.gui.workers.llm_loading import SessionFactory
    from app.gui.workers.llm_requests import LoadedModel, LoadRequest
    from app.settings import Settings
    from engine.inference.backends import ChatBackend
    from engine.inference.events import Token
    from engine.inference.remote import RemoteInfo
    from engine.inference.runtime import ModelInfo
    from engine.inference.session import PromptView

log = logging.getLogger(__name__)


def draft_for(settings: Settings, model: Path) -> Path | None:
    """The draft model chosen in Settings for ``model`` (a GGUF path), or None."""
    chosen = settings.draft_models.get(str(model))
    return Path(chosen) if chosen else None


def speculative_mode(loaded: LoadedModel | None, settings: Settings) -> Literal["off", "lookup", "draft"]:
    """``GenerationParams.speculative`` for a chat turn on ``loaded``."""

    if loaded is None or parse_remote_model(loaded.path) is not None:
        return "off"  # a remote server decodes on its own
    if loaded.draft_path is not None:
        return "draft"
    return settings.speculative


def is_draft_refusal(exc: BaseException, draft: Path) -> bool:
    """Whether a load failed because of its draft model (the engine names the draft's file first:
    ``engine.inference.speculative.DraftModel``), not because of the chat model itself."""

    return isinstance(exc, ModelLoadError) and str(exc).startswith(f"{draft}: ") and "draft" in str(exc)


def load_session(
    factory: SessionFactory, request: LoadRequest, bandwidth: float | None
) -> tuple[ChatBackend, ModelInfo | RemoteInfo, LoadRequest, str | None]:
    """Builds and loads the session for ``request``; without its draft when the draft is refused.

    Returns:
        ``(session, info, the request that loaded, note)``: the note is one line saying why the
        draft model was not used (None when it was, or when none was asked for).

    Raises:
        Exception: whatever the chat model's own load raises (the caller reports it).
    """
    draft = request.draft_model_path
    if draft is not None and not draft.is_file():
        note = f"Draft model not used: {draft} is missing; {request.model_path.name} loads without it"
        request = replace(request, draft_model_path=None)
        return *_load(factory, request, bandwidth), request, note
    try:
        return *_load(factory, request, bandwidth), request, None
    except Exception as exc:
        if draft is None or request.cancel.is_set() or not is_draft_refusal(exc, draft):
            raise
        reason = str(exc)[len(f"{draft}: ") :]
        log.info("draft model %s refused: %s", draft, reason)
        note = f"Draft model {draft.name} not used: {reason}; {request.model_path.name} loads without it"
    request = replace(request, draft_model_path=None)
    return *_load(factory, request, bandwidth), request, note


def _load(
    factory: SessionFactory, request: LoadRequest, bandwidth: float | None
) -> tuple[ChatBackend, ModelInfo | RemoteInfo]:
    session = factory(request, bandwidth)
    try:
        return session, session.load(request.cancel)
    except BaseException:
        try:
            session.close()
        except Exception as exc:  # noqa: BLE001 - the load's own error is the one to report
            log.info("closing a session that did not load failed: %s", exc)
        raise


@dataclass(frozen=True)
class TokensView:
    """The last prompt (``token_ids``, ``pieces``: as ``engine.inference.session.PromptView``) and the reply
    that followed it: its token ids, their text, and which were accepted from a draft."""

    token_ids: list[int]
    pieces: list[str]
    reply_ids: list[int] = field(default_factory=list)
    reply_pieces: list[str] = field(default_factory=list)
    reply_drafted: list[bool] = field(default_factory=list)


@dataclass
class ReplyTokens:
    """The reply's tokens as they stream (appended on the LLM thread, one per Token event)."""

    ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    drafted: list[bool] = field(default_factory=list)

    def add(self, token: Token) -> None:
        """Records an ``engine.inference.events.Token``."""
        self.ids.append(int(token.token_id))
        self.pieces.append(str(token.text))
        self.drafted.append(token.drafted)

    def view(self, prompt: PromptView) -> TokensView:
        """The prompt view with this reply after it."""
        return TokensView(
            list(prompt.token_ids),
            list(prompt.pieces),
            self.ids,
            self.pieces,
            self.drafted,
        )
