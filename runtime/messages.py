"""Conversation messages and the parts of an assistant message.

One user input produces exactly one :class:`AssistantMessage`, whose ``content`` holds the
parts of every step of the turn in stream order, each tagged with its ``step``. Tool
results are :class:`ToolMessage` s placed right after it, in call order. Providers split
this back into one request message per step ("restoration"); the core never does.

Everything here is a frozen value: persisted data holds no references to live actors.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from runtime.output import ErrorInfo


def _new_id() -> str:
    from runtime.ids import new_id

    return new_id("msg")


@attrs.frozen(kw_only=True, slots=True)
class TextPart:
    """Answer text produced in one step."""

    type: ClassVar[str] = "text"
    text: str
    step: int
    refusal: bool = False
    """The provider marked this text as a refusal."""


@attrs.frozen(kw_only=True, slots=True)
class ReasoningPart:
    """Reasoning produced in one step; signed reasoning round-trips only to its signer."""

    type: ClassVar[str] = "reasoning"
    text: str
    step: int
    signature: str | None = None
    """The provider's signature; ``None`` for unsigned or interrupted blocks."""
    redacted_data: str | None = None
    """Opaque encrypted reasoning, sent back verbatim (Anthropic ``redacted_thinking``)."""
    provider: str | None = None
    """The provider that produced the block (``"anthropic"``, ``"openai"``, ...)."""


@attrs.frozen(kw_only=True, slots=True)
class ToolCallPart:
    """A complete tool call the model made in one step."""

    type: ClassVar[str] = "tool-call"
    tool_call_id: str
    tool_name: str
    input: Any
    step: int


@attrs.frozen(kw_only=True, slots=True)
class ProviderDataPart:
    """An opaque provider block (server-side tool use/result), replayed only to its provider."""

    type: ClassVar[str] = "provider-data"
    provider: str
    data: dict[str, Any]
    step: int


Part = TextPart | ReasoningPart | ToolCallPart | ProviderDataPart


@attrs.frozen(kw_only=True, slots=True)
class SystemMessage:
    role: ClassVar[str] = "system"
    content: str
    id: str = attrs.field(factory=_new_id)


@attrs.frozen(kw_only=True, slots=True)
class UserMessage:
    role: ClassVar[str] = "user"
    content: str
    id: str = attrs.field(factory=_new_id)


@attrs.frozen(kw_only=True, slots=True)
class AssistantMessage:
    """Everything the model produced for one user input, across all its steps."""

    role: ClassVar[str] = "assistant"
    content: tuple[Part, ...] = ()
    id: str = attrs.field(factory=_new_id)
    interrupted: bool = False
    """The turn was cut short from outside (cancelled, aborted, out of time) after this
    content was streamed. A turn that failed is not interrupted: see :attr:`error`."""
    error: ErrorInfo | None = None
    """Why the turn failed (authentication, a bad request, a provider failure after its
    retries...), its message redacted; ``None`` unless it failed. Stored with the message,
    so a restored conversation still says the answer is missing because of an error."""

    @property
    def failed(self) -> bool:
        """The turn ended because of an error (:attr:`error`)."""
        return self.error is not None

    @property
    def status(self) -> str:
        """``"failed"``, ``"interrupted"`` or ``"complete"``."""
        if self.error is not None:
            return "failed"
        return "interrupted" if self.interrupted else "complete"

    def steps(self) -> list[list[Part]]:
        """The parts grouped by step, in step order (empty steps omitted)."""
        groups: dict[int, list[Part]] = {}
        for part in self.content:
            groups.setdefault(part.step, []).append(part)
        return [groups[s] for s in sorted(groups)]

    @property
    def text(self) -> str:
        """All answer text of the message, joined."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


@attrs.frozen(kw_only=True, slots=True)
class ToolMessage:
    """The result of one tool call; exactly one of ``output`` / ``error`` is meaningful."""

    role: ClassVar[str] = "tool"
    tool_call_id: str
    tool_name: str
    step: int
    output: Any = None
    error: str | None = None
    """A message the model sees instead of an output (exception, bad input, interrupted)."""
    id: str = attrs.field(factory=_new_id)

    @property
    def is_error(self) -> bool:
        return self.error is not None


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage
