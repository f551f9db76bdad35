"""What the chat adapter tells the widgets it is doing, and what a turn is asked with.

Kept apart from :mod:`app.gui.workers.chat_adapter` so the adapter's collaborators (the model
slot, the conversations, the running turn) share them without importing the adapter.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.gui.workers.agent_tools import ToolsRequest
    from engine.inference.runtime import GenerationParams


class ChatState(enum.Enum):
    """What the chat is doing (gpt4all's ResponseState, CONTRIBUTING.md rule 12)."""

    IDLE = "Idle"
    LOADING_MODEL = "Loading model"
    RETRIEVING = "Searching documents"
    PROCESSING_PROMPT = "Reading the prompt"
    GENERATING = "Generating"
    CANCELLING = "Stopping"


class ModelState(enum.Enum):
    """Whether a model is loaded."""

    NONE = "No model"
    LOADING = "Loading"
    LOADED = "Loaded"
    FAILED = "Failed"


@dataclass(frozen=True)
class TurnContext:
    """What a chat turn needs besides the text.

    Attributes:
        system: the system prompt.
        params: the sampling parameters.
        knowledge_bases: the knowledge bases whose passages the turn is given.
        tools: set when the turn runs the agent loop.
        thinking: the template's thinking switch (None: its default).
        thinking_budget: the most thinking tokens (None: no cap).
    """

    system: str | None
    params: GenerationParams
    knowledge_bases: tuple[str, ...] = ()
    tools: ToolsRequest | None = None
    thinking: bool | None = None
    thinking_budget: int | None = None
