"""Axon: a Trio actor runtime that streams multi-step, tool-calling LLM agent turns.

The public namespace is flat: ``from runtime import Host, Agent, tool, run_sync`` and the value
types of the three vocabularies (stream chunks, output chunks, messages and parts).

This package holds the contract layer (events, chunks, messages, bus, actor base,
protocols), the application layer (:mod:`runtime.app.host`, :mod:`runtime.app.session`, the CLI,
:mod:`runtime.app.web`, the demo) and the stores (:mod:`actors.stores`); see
docs/architecture.md. Importing any ``runtime.x`` runs this file first, so it imports only
the contract eagerly: the application names (``Host``, ``Session``, ``TurnStream``,
``run_sync``, ``AsyncHost``) are resolved on first use (:pep:`562`). Otherwise every actor,
which imports the contract, would import the host that assembles it, and the layers would be
one import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from runtime.actor import Actor, RestartPolicy, Supervisor
from runtime.actor_messages import TurnResult
from runtime.agent import Agent, Hooks
from runtime.approval import PendingCall
from runtime.budget import Budget
from runtime.bus import Bus, Subscription
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.compaction import CompactionContext, DropToolResults, KeepTurns, Summarize
from runtime.errors import (
    ActorFailed,
    AlreadyDecided,
    AuthenticationFailed,
    AxonError,
    BadRequest,
    BudgetExceeded,
    ConfigurationError,
    ConnectionLost,
    ContextTooLong,
    DecisionError,
    InvalidDecision,
    InvalidHistory,
    InvalidMedia,
    InvalidSessionId,
    InvalidTurnId,
    MalformedStream,
    MediaError,
    MediaTooLarge,
    NothingToResume,
    Overloaded,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    SessionBusy,
    SessionError,
    SessionNotLoaded,
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    ToolDefinitionError,
    TooManyParts,
    UnknownApproval,
    UnsupportedMedia,
)
from runtime.events import Event
from runtime.inbox import Inbox
from runtime.logging import configure_logging
from runtime.media import InputLimits, MediaLimits
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    File,
    Image,
    Message,
    Part,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    UserPart,
)
from runtime.output import OutputChunk
from runtime.provider import FallbackProvider, Provider
from runtime.retry import RetryPolicy
from runtime.store import SessionInfo, SessionRecord, Store, validate_session_id
from runtime.tools import Tool, ToolContext, tool

if TYPE_CHECKING:
    from runtime.app.aio import AsyncHost
    from runtime.app.blocking import run_sync
    from runtime.app.host import Host
    from runtime.app.session import Session, TurnStream

_APPLICATION = {
    "AsyncHost": "runtime.app.aio",
    "Host": "runtime.app.host",
    "Session": "runtime.app.session",
    "TurnStream": "runtime.app.session",
    "run_sync": "runtime.app.blocking",
}
"""The facade's names from the application layer, imported when first asked for."""


def __getattr__(name: str) -> Any:
    module = _APPLICATION.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


__all__ = [
    "Actor",
    "ActorFailed",
    "Agent",
    "AlreadyDecided",
    "AssistantMessage",
    "AsyncHost",
    "AuthenticationFailed",
    "Awaiting",
    "AxonError",
    "BadRequest",
    "Budget",
    "BudgetExceeded",
    "Bus",
    "CompactionContext",
    "ConfigurationError",
    "ConnectionLost",
    "ContextTooLong",
    "DecisionError",
    "DropToolResults",
    "Event",
    "FallbackProvider",
    "File",
    "FinishChunk",
    "Hooks",
    "Host",
    "Image",
    "Inbox",
    "InputLimits",
    "InvalidDecision",
    "InvalidHistory",
    "InvalidMedia",
    "InvalidSessionId",
    "InvalidTurnId",
    "KeepTurns",
    "MalformedStream",
    "MediaError",
    "MediaLimits",
    "MediaTooLarge",
    "Message",
    "NothingToResume",
    "OutputChunk",
    "Overloaded",
    "Part",
    "PendingCall",
    "Provider",
    "ProviderDataChunk",
    "ProviderDataPart",
    "ProviderError",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RateLimited",
    "ReasoningChunk",
    "ReasoningPart",
    "RestartPolicy",
    "RetryPolicy",
    "Session",
    "SessionBusy",
    "SessionError",
    "SessionInfo",
    "SessionNotLoaded",
    "SessionRecord",
    "Store",
    "StoreConflict",
    "StoreCorrupt",
    "StoreError",
    "StoreUnavailable",
    "StreamChunk",
    "Subscription",
    "Summarize",
    "Supervisor",
    "SystemMessage",
    "TextChunk",
    "TextPart",
    "TooManyParts",
    "Tool",
    "ToolCallChunk",
    "ToolCallPart",
    "ToolContext",
    "ToolDefinitionError",
    "ToolInputDeltaChunk",
    "ToolInputStartChunk",
    "ToolMessage",
    "TurnResult",
    "TurnStream",
    "UnknownApproval",
    "UnsupportedMedia",
    "Usage",
    "UsageChunk",
    "UserMessage",
    "UserPart",
    "configure_logging",
    "run_sync",
    "tool",
    "validate_session_id",
]
