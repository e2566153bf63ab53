"""The provider-to-engine vocabulary: :data:`StreamChunk`.

A provider actor turns its SDK's raw stream into these and nothing else, so that every
stage downstream is provider-agnostic. The rules they encode come from peers' bugs:

* :class:`ToolCallChunk` is emitted exactly once per call and only after the provider's
  block (or the whole stream) has ended, never when partial JSON first parses.
* :class:`ReasoningChunk` with a ``signature`` or ``redacted_data`` *closes* its reasoning
  block; the next reasoning chunk starts a new one.
* :class:`FinishChunk` is the last chunk of a successful response.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from operator import attrgetter
from typing import Any, ClassVar, Literal

import attrs

from runtime import attrs_cache

attrs_cache.install()  # the first of the contract's modules to build classes: see its docstring

_repring = threading.local()
"""The ids of the values whose repr is being made on this thread (see :func:`_repr`)."""


def _repr(self: Any) -> str:
    """The ``__repr__`` the contract's value classes share: attrs' own would be compiled
    once per class at import, and a hundred of them were most of ``import runtime``'s
    time (issue 24). Same text as attrs': each field as ``name=value!r`` (or its field's
    ``repr=`` callable; ``repr=False`` fields left out), an unset ``init=False`` field as
    ``NOTHING``, and ``...`` for a value met again inside its own repr (a mutable one
    that holds itself)."""
    seen: set[int] | None = getattr(_repring, "ids", None)
    if seen is None:
        seen = _repring.ids = set()
    if id(self) in seen:
        return "..."
    seen.add(id(self))
    try:
        parts = []
        for a in attrs.fields(type(self)):
            if a.repr is False:
                continue
            value = getattr(self, a.name, attrs.NOTHING)
            parts.append(f"{a.name}={a.repr(value)}" if callable(a.repr) else f"{a.name}={value!r}")
        return f"{type(self).__qualname__}({', '.join(parts)})"
    finally:
        seen.discard(id(self))


_KEYS: dict[type, Callable[[Any], Any]] = {}
"""Each value class's equality key (see :func:`_key`), built the first time it is needed."""


def _key(cls: type) -> Callable[[Any], Any]:
    """What :func:`_eq` and :func:`_hash` compare for ``cls``: the values of its fields
    that take part in equality (``eq=False`` fields left out), in attrs' field order."""
    key = _KEYS.get(cls)
    if key is None:  # the first time (the callers look in _KEYS first themselves)
        fields = attrs.fields(cls)
        if any(a.eq_key is not None for a in fields):
            raise TypeError(f"{cls.__qualname__}: the shared __eq__ takes no eq= callables")
        names = [a.name for a in fields if a.eq]
        key = _KEYS[cls] = attrgetter(*names) if names else _no_fields
    return key


def _no_fields(value: Any) -> tuple[()]:
    return ()


def _eq(self: Any, other: object) -> bool:
    """The ``__eq__`` the contract's frozen value classes share, like :func:`_repr` and for
    the same reason: attrs compiles an ``__eq__`` and a ``__hash__`` per class at import,
    and they were a quarter of the contract's import time (issue 24). The same meaning as
    attrs': equal when of the very same class and every ``eq`` field equal, in field order
    (the values are compared as one tuple, so a field that *is* the other's, a NaN
    included, counts as equal, as it already did inside any tuple field)."""
    cls = self.__class__
    if other.__class__ is not cls:
        return NotImplemented  # type: ignore[no-any-return]
    key = _KEYS.get(cls) or _key(cls)
    return bool(key(self) == key(other))


def _hash(self: Any) -> int:
    """The ``__hash__`` that goes with :func:`_eq`: the class and the same fields, as
    attrs' hashes its class's seed and the fields (so it raises the same ``TypeError``
    for an unhashable field value). Only for frozen classes, as attrs does."""
    cls = self.__class__
    return hash((cls, (_KEYS.get(cls) or _key(cls))(self)))


FinishReason = Literal["stop", "tool-calls", "length", "content-filter", "error", "other"]
"""The unified finish reasons every provider maps onto."""

FINISH_REASONS: tuple[str, ...] = (
    "stop",
    "tool-calls",
    "length",
    "content-filter",
    "error",
    "other",
)


@attrs.frozen(kw_only=True, slots=True)
class TextChunk:
    """A piece of answer text, as it arrived."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "text"
    text: str
    """The delta; may be any slice of the text, even one character of a multi-byte tag."""
    refusal: bool = False
    """True when the provider marked this text as a refusal (OpenAI ``refusal`` deltas)."""


@attrs.frozen(kw_only=True, slots=True)
class ReasoningChunk:
    """A piece of reasoning (thinking) text, or the end of a reasoning block."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "reasoning"
    text: str = ""
    """The delta; empty on the closing chunk that carries only a signature."""
    signature: str | None = None
    """The provider's signature over the whole block; its arrival closes the block."""
    redacted_data: str | None = None
    """Opaque encrypted reasoning (Anthropic ``redacted_thinking``), kept verbatim."""
    provider: str | None = None
    """Which provider produced the block; a signature is only ever sent back to it."""


@attrs.frozen(kw_only=True, slots=True)
class ToolInputStartChunk:
    """A tool call began streaming its input."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "tool-input-start"
    tool_call_id: str
    tool_name: str


@attrs.frozen(kw_only=True, slots=True)
class ToolInputDeltaChunk:
    """A fragment of a tool call's JSON input, exactly as the provider streamed it."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "tool-input-delta"
    tool_call_id: str
    delta: str


@attrs.frozen(kw_only=True, slots=True)
class ToolCallChunk:
    """A complete tool call. Emitted once, only when the provider's block ended."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "tool-call"
    tool_call_id: str
    tool_name: str
    input: Any
    """The parsed JSON input (``{}`` for an empty one); the raw text when it did not parse."""
    input_error: str | None = None
    """Why the input is unusable (invalid JSON, truncated by ``length``); such a call is
    never executed: the model receives this as a tool error instead."""


@attrs.frozen(kw_only=True, slots=True)
class ProviderDataChunk:
    """An opaque provider block (a server-side tool use or result) kept for round-trip."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "provider-data"
    provider: str
    data: dict[str, Any]


@attrs.frozen(kw_only=True, slots=True)
class CitationsChunk:
    """The sources cited for the text just streamed (Anthropic's ``citations`` of a text
    block), sent at the end of that text: the text part closes and is stored with them
    (:attr:`~runtime.messages.TextPart.citations`). Never streamed to a client. With no
    citations it only ends the text part: an uncited text block that another text block
    follows, so each block is a part of its own and goes back as that block."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "citations"
    citations: tuple[dict[str, Any], ...]
    """Each citation as the provider gave it."""


@attrs.frozen(kw_only=True, slots=True)
class Usage:
    """Token usage and its cost; summable. Optional counters stay ``None`` when the
    provider is silent.

    Token counts are as the provider reports them: OpenAI's ``input_tokens`` include the
    cached ones (``cache_read``), Anthropic's leave the cache reads and writes out.
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cache_read: int | None = None
    cache_write: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None
    """What the tokens cost, in US dollars: each model call priced from the
    ``genai-prices`` table for the provider, endpoint and model that made it
    (:mod:`runtime.pricing`). ``None`` means unknown, never zero: a model, provider or
    endpoint the table does not list (a local server, the scripted provider), and so any
    sum holding such a call. Usage with no tokens at all adds nothing, priced or not."""

    @property
    def empty(self) -> bool:
        """No tokens and no cost: what a sum starts from (``Usage()``)."""
        return (
            self.cost is None
            and self.input_tokens == 0
            and self.output_tokens == 0
            and self.total_tokens == 0
        )

    def __add__(self, other: Usage) -> Usage:
        def opt(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        if self.cost is not None and other.cost is not None:
            cost: float | None = self.cost + other.cost
        elif self.empty or other.empty:
            cost = other.cost if self.empty else self.cost
        else:
            cost = None  # a call of unknown price: the sum is unknown too
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cache_read=opt(self.cache_read, other.cache_read),
            cache_write=opt(self.cache_write, other.cache_write),
            reasoning_tokens=opt(self.reasoning_tokens, other.reasoning_tokens),
            cost=cost,
        )


@attrs.frozen(kw_only=True, slots=True)
class UsageChunk:
    """Usage reported by the provider; several may arrive and the last one wins."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "usage"
    usage: Usage


@attrs.frozen(kw_only=True, slots=True)
class FinishChunk:
    """The response ended normally."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "finish"
    reason: str
    """One of :data:`FINISH_REASONS`."""
    raw_reason: str | None = None
    """The provider's own word for it (``end_turn``, ``tool_calls``, ...)."""
    resume: bool = False
    """The model paused its turn before its end (Anthropic's ``pause_turn``: server
    tools ran long; a ``compaction`` pause): a call that sends the conversation as it
    stands, the paused answer last, continues it. The turn runner makes that call as its
    next step when the paused one made no tool call (at most
    :data:`actors.turn.runner.MAX_RESUMES` times a turn)."""


StreamChunk = (
    TextChunk
    | ReasoningChunk
    | ToolInputStartChunk
    | ToolInputDeltaChunk
    | ToolCallChunk
    | ProviderDataChunk
    | CitationsChunk
    | UsageChunk
    | FinishChunk
)
"""Everything a provider may emit for one model call."""
