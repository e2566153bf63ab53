"""Axon: a Trio actor runtime that streams multi-step, tool-calling LLM agent turns.

The public namespace is flat: ``from runtime import Host, Agent, tool, run_sync`` and the value
types of the three vocabularies (stream chunks, output chunks, messages and parts).

This package holds the contract layer (events, chunks, messages, bus, actor base,
protocols), the application layer (:mod:`runtime.app.host`, :mod:`runtime.app.session`, the CLI,
:mod:`runtime.app.web`, the demo) and the stores (:mod:`actors.stores`); see
docs/architecture.md. Importing any ``runtime.x`` runs this file first, so it imports
nothing: every name is resolved on first use (:pep:`562`), from the module :data:`_MODULES`
says. Two reasons. The application names (``Host``, ``Session``, ``TurnStream``,
``run_sync``, ``AsyncHost``): otherwise every actor, which imports the contract, would
import the host that assembles it, and the layers would be one import cycle. The contract's
names: its modules define about a hundred attrs classes, and creating one (attrs compiles
its methods) costs about as much as importing a small module, so a program pays only for
the part of the vocabulary it uses (``from runtime import Agent, tool`` builds none of the
stream's, events' or actors' messages), and an actor that imports ``runtime.chunks`` does
not build the whole facade first (issue 24).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.actor import Actor, RestartPolicy, Supervisor
    from runtime.agent import Agent, Hooks
    from runtime.app.aio import AsyncHost
    from runtime.app.blocking import run_sync
    from runtime.app.host import Host
    from runtime.app.session import Session, TurnStream
    from runtime.approval import PendingCall
    from runtime.budget import Budget
    from runtime.bus import Bus, Subscription
    from runtime.chunks import (
        CitationsChunk,
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
        CallerDecides,
        CallerWaits,
        CallTimeout,
        ClosedWhileWaiting,
        ConfigurationError,
        ConnectionLost,
        ContextTooLong,
        DecisionError,
        EditTooLarge,
        HostClosed,
        IdleTimeout,
        InvalidCursor,
        InvalidDecision,
        InvalidHistory,
        InvalidMedia,
        InvalidMeta,
        InvalidSessionId,
        InvalidTurnId,
        MalformedStream,
        MediaError,
        MediaTooLarge,
        NothingToResume,
        OutputCapTooLarge,
        Overloaded,
        ProviderError,
        ProviderTimeout,
        ProviderUnavailable,
        RateLimited,
        SessionBusy,
        SessionDeleted,
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
        WaitExpired,
    )
    from runtime.inbox import Inbox
    from runtime.lifecycle import Event
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
    from runtime.output import OutputChunk, TurnResult
    from runtime.provider import FallbackProvider, Provider
    from runtime.retry import RetryPolicy
    from runtime.store import (
        SessionInfo,
        SessionPage,
        SessionRecord,
        Store,
        list_page,
        validate_session_id,
    )
    from runtime.tools import Tool, ToolContext, tool

_MODULES: dict[str, tuple[str, ...]] = {
    "runtime.actor": ("Actor", "RestartPolicy", "Supervisor"),
    "runtime.agent": ("Agent", "Hooks"),
    "runtime.approval": ("PendingCall",),
    "runtime.budget": ("Budget",),
    "runtime.bus": ("Bus", "Subscription"),
    "runtime.chunks": (
        "CitationsChunk",
        "FinishChunk",
        "ProviderDataChunk",
        "ReasoningChunk",
        "StreamChunk",
        "TextChunk",
        "ToolCallChunk",
        "ToolInputDeltaChunk",
        "ToolInputStartChunk",
        "Usage",
        "UsageChunk",
    ),
    "runtime.compaction": ("CompactionContext", "DropToolResults", "KeepTurns", "Summarize"),
    "runtime.errors": (
        "ActorFailed",
        "AlreadyDecided",
        "AuthenticationFailed",
        "AxonError",
        "BadRequest",
        "BudgetExceeded",
        "CallTimeout",
        "ConfigurationError",
        "ConnectionLost",
        "ContextTooLong",
        "DecisionError",
        "EditTooLarge",
        "HostClosed",
        "IdleTimeout",
        "InvalidDecision",
        "InvalidHistory",
        "InvalidMedia",
        "InvalidMeta",
        "InvalidCursor",
        "InvalidSessionId",
        "InvalidTurnId",
        "MalformedStream",
        "MediaError",
        "MediaTooLarge",
        "NothingToResume",
        "OutputCapTooLarge",
        "Overloaded",
        "ProviderError",
        "ProviderTimeout",
        "ProviderUnavailable",
        "RateLimited",
        "CallerDecides",
        "CallerWaits",
        "ClosedWhileWaiting",
        "SessionBusy",
        "SessionDeleted",
        "SessionError",
        "SessionNotLoaded",
        "StoreConflict",
        "StoreCorrupt",
        "StoreError",
        "StoreUnavailable",
        "ToolDefinitionError",
        "TooManyParts",
        "UnknownApproval",
        "WaitExpired",
        "UnsupportedMedia",
    ),
    "runtime.lifecycle": ("Event",),
    "runtime.inbox": ("Inbox",),
    "runtime.logging": ("configure_logging",),
    "runtime.media": ("InputLimits", "MediaLimits"),
    "runtime.messages": (
        "AssistantMessage",
        "Awaiting",
        "File",
        "Image",
        "Message",
        "Part",
        "ProviderDataPart",
        "ReasoningPart",
        "SystemMessage",
        "TextPart",
        "ToolCallPart",
        "ToolMessage",
        "UserMessage",
        "UserPart",
    ),
    "runtime.output": ("OutputChunk", "TurnResult"),
    "runtime.provider": ("FallbackProvider", "Provider"),
    "runtime.retry": ("RetryPolicy",),
    "runtime.store": (
        "SessionInfo",
        "SessionPage",
        "SessionRecord",
        "Store",
        "list_page",
        "validate_session_id",
    ),
    "runtime.tools": ("Tool", "ToolContext", "tool"),
    "runtime.app.aio": ("AsyncHost",),
    "runtime.app.blocking": ("run_sync",),
    "runtime.app.host": ("Host",),
    "runtime.app.session": ("Session", "TurnStream"),
}
"""Where each name of the facade lives, by module; imported on first use."""
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    "CallTimeout",
    "CallerDecides",
    "CallerWaits",
    "CitationsChunk",
    "ClosedWhileWaiting",
    "CompactionContext",
    "ConfigurationError",
    "ConnectionLost",
    "ContextTooLong",
    "DecisionError",
    "DropToolResults",
    "EditTooLarge",
    "Event",
    "FallbackProvider",
    "File",
    "FinishChunk",
    "Hooks",
    "Host",
    "HostClosed",
    "IdleTimeout",
    "Image",
    "Inbox",
    "InputLimits",
    "InvalidCursor",
    "InvalidDecision",
    "InvalidHistory",
    "InvalidMedia",
    "InvalidMeta",
    "InvalidSessionId",
    "InvalidTurnId",
    "KeepTurns",
    "MalformedStream",
    "MediaError",
    "MediaLimits",
    "MediaTooLarge",
    "Message",
    "NothingToResume",
    "OutputCapTooLarge",
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
    "SessionDeleted",
    "SessionError",
    "SessionInfo",
    "SessionNotLoaded",
    "SessionPage",
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
    "WaitExpired",
    "configure_logging",
    "list_page",
    "run_sync",
    "tool",
    "validate_session_id",
]
