"""Axon: a Trio actor runtime that streams multi-step, tool-calling LLM agent turns.

The public namespace is flat: ``from runtime import Host, Agent, tool`` and the value
types of the three vocabularies (stream chunks, output chunks, messages and parts).
"""

from runtime.actor import Actor, RestartPolicy, Supervisor
from runtime.agent import Agent, Hooks
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
from runtime.errors import (
    ActorFailed,
    AuthenticationFailed,
    AxonError,
    BadRequest,
    BudgetExceeded,
    ConfigurationError,
    ConnectionLost,
    ContextTooLong,
    InvalidMedia,
    InvalidSessionId,
    MalformedStream,
    MediaError,
    MediaTooLarge,
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
    ToolDefinitionError,
    UnsupportedMedia,
)
from runtime.events import Event
from runtime.host import Host, validate_session_id
from runtime.inbox import Inbox
from runtime.logging import configure_logging
from runtime.media import MediaLimits
from runtime.messages import (
    AssistantMessage,
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
from runtime.protocol import TurnResult
from runtime.provider import Provider
from runtime.retry import RetryPolicy
from runtime.session import Session, TurnStream
from runtime.store import SessionInfo, SessionRecord, Store
from runtime.tools import Tool, tool

__all__ = [
    "Actor",
    "ActorFailed",
    "Agent",
    "AssistantMessage",
    "AuthenticationFailed",
    "AxonError",
    "BadRequest",
    "Budget",
    "BudgetExceeded",
    "Bus",
    "ConfigurationError",
    "ConnectionLost",
    "ContextTooLong",
    "Event",
    "File",
    "FinishChunk",
    "Hooks",
    "Host",
    "Image",
    "Inbox",
    "InvalidMedia",
    "InvalidSessionId",
    "MalformedStream",
    "MediaError",
    "MediaLimits",
    "MediaTooLarge",
    "Message",
    "OutputChunk",
    "Overloaded",
    "Part",
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
    "StreamChunk",
    "Subscription",
    "Supervisor",
    "SystemMessage",
    "TextChunk",
    "TextPart",
    "Tool",
    "ToolCallChunk",
    "ToolCallPart",
    "ToolDefinitionError",
    "ToolInputDeltaChunk",
    "ToolInputStartChunk",
    "ToolMessage",
    "TurnResult",
    "TurnStream",
    "UnsupportedMedia",
    "Usage",
    "UsageChunk",
    "UserMessage",
    "UserPart",
    "configure_logging",
    "tool",
    "validate_session_id",
]
