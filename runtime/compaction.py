"""Context compaction: history processors that run before every model call.

A long session outgrows the model's context window. ``Agent(history_processors=[...])``
lists processors that the turn runner applies, in order, to the messages of every model
call (after the repair pass, before the request is built): each takes the messages and a
:class:`CompactionContext` and returns the messages to send. The stored history is never
changed by them, with one exception that is the point of summarizing: a summary made by
:class:`Summarize` is *stored* (see below), so the next call and the next turn send it
instead of summarizing again.

The built-in processors:

* :class:`KeepTurns` keeps the last ``n`` turns;
* :class:`DropToolResults` replaces tool results longer than ``max_chars`` outside the
  last ``keep_turns`` turns with a short placeholder;
* :class:`Summarize` summarizes the older turns with a model call when the request counts
  more than ``max_tokens`` tokens.

The rules every built-in keeps (checked by property tests, ``tests/test_compaction.py``):

* a history is cut only where a turn begins (at a :class:`UserMessage`), so a tool call
  and its result are never separated, and a step's reasoning stays with its calls;
* the current turn (from the last user message on) is sent whole and unchanged: the
  reasoning a provider requires back while a tool loop runs (Anthropic's signed thinking
  blocks, OpenAI Responses reasoning items) is never dropped or rewritten;
* plain system messages of cut turns are kept (moved before the kept turns).

**How a summary is stored.** As a :class:`SystemMessage` whose ``summarizes_before``
names the first message it does not stand for (the first kept turn's user message). The
turn runner puts it in the history right before the current turn's user message, and it
is saved with the turn. Before the processors run, :func:`apply_summaries` puts the
latest such summary in place of every message before that one, so a stored summary
holds for every later request whatever the processors do; the store keeps every message
(``show`` and the UIs still list the whole conversation). Each provider sends it as it
sends any system message: Chat Completions a ``system`` message, Responses a ``system``
input item, Anthropic part of the ``system`` prompt (after the agent's instructions).

**Token counts.** :meth:`CompactionContext.count_tokens` asks the provider
(:meth:`runtime.provider.Provider.count_tokens`: Anthropic's ``messages.count_tokens``
endpoint, ``tiktoken`` for the OpenAI providers) once the local :func:`estimate_tokens`
says the request is near the limit; far below it, the estimate is enough and no counting
request is made. A provider that cannot count (or whose count fails) gets the estimate.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from runtime.chunks import _eq, _hash, _repr
from runtime.errors import ConfigurationError
from runtime.history import EDIT_NOTE
from runtime.messages import (
    AssistantMessage,
    File,
    Image,
    Message,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    is_media_output,
)

# -- estimating tokens ----------------------------------------------------------------------

BYTES_PER_TOKEN = 3.5
"""The estimate's rate: UTF-8 bytes per token. English prose runs about 4 characters a
token and code about 3; CJK text about one character (3 bytes) a token. Counting bytes,
not characters, keeps the estimate on the safe side for every script."""
MESSAGE_TOKENS = 4
"""Tokens the estimate adds per message (role and framing)."""
MEDIA_TOKENS = 1600
"""Tokens the estimate counts per image or non-text file: about what Anthropic charges for
a full-size image (OpenAI's high-detail 1024x1024 image is 765)."""
EXACT_FROM = 0.5
""":meth:`CompactionContext.count_tokens` asks the provider for an exact count only once
the estimate reaches this share of the limit in question; below it the estimate answers
(it would have to be off by half to hide an overflow)."""


def estimate_text(text: str) -> int:
    """Tokens ``text`` is estimated to take (:data:`BYTES_PER_TOKEN`)."""
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN)


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _estimate_content(content: Any) -> int:
    """A user message's content or a tool's output."""
    if isinstance(content, str):
        return estimate_text(content)
    if is_media_output(content) or (
        isinstance(content, tuple) and all(isinstance(p, TextPart | Image | File) for p in content)
    ):
        total = 0
        for p in content:
            if isinstance(p, TextPart):
                total += estimate_text(p.text)
            elif isinstance(p, File) and p.media_type == "text/plain" and p.data is not None:
                total += math.ceil(len(p.data) / BYTES_PER_TOKEN)
            else:
                total += MEDIA_TOKENS
        return total
    return estimate_text(_json(content))


def estimate_message(message: Message) -> int:
    """Tokens one message is estimated to take (:func:`estimate_tokens`)."""
    total = MESSAGE_TOKENS
    if isinstance(message, SystemMessage):
        return total + estimate_text(message.content)
    if isinstance(message, UserMessage):
        return total + _estimate_content(message.content)
    if isinstance(message, ToolMessage):
        body = message.error if message.error is not None else message.output
        return total + _estimate_content(body)
    for part in message.content:
        if isinstance(part, TextPart | ReasoningPart):
            total += estimate_text(part.text)
            if isinstance(part, ReasoningPart) and part.redacted_data:
                total += estimate_text(part.redacted_data)
        elif isinstance(part, ToolCallPart):
            total += (
                MESSAGE_TOKENS + estimate_text(part.tool_name) + estimate_text(_json(part.input))
            )
            waiting = part.awaiting
            if waiting is not None and waiting.edit_in_result:  # (approved with edits)
                total += _edit_replay_tokens(waiting.original_input)
        elif isinstance(part, ProviderDataPart):
            total += estimate_text(_json(part.data))
    return total


EDIT_NOTE_TOKENS = estimate_text(EDIT_NOTE.format(input="") + "\n\n")
"""The estimate of :data:`~runtime.history.EDIT_NOTE` (and the blank line after it),
without the edit it gives."""


def _edit_replay_tokens(original: Any) -> int:
    """What a call approved with edits adds to a request beyond its stored input (the
    edit, counted as the call's): it is replayed with the model's own input
    (``original``), and the edit is told again at the head of its result
    (:func:`runtime.history.replay_edits`). Counted as the edit alone, a request whose
    one call the model wrote with 200,000 characters of input, edited down to 24, was
    estimated at 37 tokens, what it sends at 57,233: the estimate decides whether a
    request is counted exactly before it is sent (:data:`EXACT_FROM`) and what a rate
    limit reserves for it."""
    return EDIT_NOTE_TOKENS + (0 if original is None else estimate_text(_json(original)))


def estimate_tokens(
    instructions: str | None, messages: Sequence[Message], tools: Sequence[Any] = ()
) -> int:
    """A provider-independent estimate of a request's input tokens: the instructions,
    every message (:func:`estimate_message`) and the tools' definitions, at
    :data:`BYTES_PER_TOKEN`, images and files at :data:`MEDIA_TOKENS` each.

    What a provider without a counting method (or whose counting failed) is measured by;
    the OpenAI providers' too when ``tiktoken`` is not installed or cannot load its
    encoding (it downloads it once; offline, it is missing). Typically within 10-30% of
    the real count for prose and code, above it rather than below."""
    total = estimate_text(instructions) if instructions else 0
    total += sum(estimate_message(m) for m in messages)
    for tool in tools:
        spec = tool.spec() if hasattr(tool, "spec") else tool
        total += MESSAGE_TOKENS + estimate_text(_json(spec))
    return total


# -- stored summaries ---------------------------------------------------------------------


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a summary stored by compaction."""
    return isinstance(message, SystemMessage) and message.summarizes_before is not None


def apply_summaries(messages: Sequence[Message]) -> tuple[Message, ...]:
    """``messages`` as a request sends them once compacted: the latest stored summary in
    place of every message before the one it names (``summarizes_before``), those
    messages' plain system messages kept before it; earlier summaries dropped.

    A summary whose named message is no longer in the history (a turn regenerated since)
    stands for every message before its own place, where it was stored: right before the
    user message of the turn that made it."""
    at = len(messages) - 1
    while at >= 0 and not is_summary(messages[at]):
        at -= 1
    if at < 0:
        return tuple(messages)
    summary = messages[at]
    assert isinstance(summary, SystemMessage)
    anchor = next((i for i, m in enumerate(messages) if m.id == summary.summarizes_before), None)
    cut = at if anchor is None else anchor
    pinned = [m for m in messages[:cut] if isinstance(m, SystemMessage) and not is_summary(m)]
    rest = [m for m in messages[cut:] if not is_summary(m)]
    return (*pinned, summary, *rest)


# -- turns --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True)
class Turns:
    """A history cut where turns begin (:func:`split_turns`)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    head: tuple[SystemMessage, ...]
    """The system messages before the first turn (a summary among them)."""
    turns: tuple[tuple[Message, ...], ...]
    """Each turn: a user message and what followed it up to the next one (the first may
    begin with something else, in a history seeded without a user message)."""

    @property
    def summary(self) -> SystemMessage | None:
        """The stored summary in force, if any."""
        return next((m for m in reversed(self.head) if is_summary(m)), None)

    def join(self, cut: int, summary: SystemMessage | None = None) -> tuple[Message, ...]:
        """The history without its first ``cut`` turns: their plain system messages are
        kept, after the head's, then ``summary`` (or the head's own), then the rest."""
        summary = summary or self.summary
        out: list[Message] = [m for m in self.head if not is_summary(m)]
        for turn in self.turns[:cut]:
            out += [m for m in turn if isinstance(m, SystemMessage) and not is_summary(m)]
        if summary is not None:
            out.append(summary)
        for turn in self.turns[cut:]:
            out.extend(turn)
        return tuple(out)


def split_turns(messages: Sequence[Message]) -> Turns:
    """Cut ``messages`` (a repaired history, stored summaries applied) where each user
    message begins a turn. In a repaired history every tool result follows its call's
    assistant message with no user message between, so no cut separates them."""
    i, n = 0, len(messages)
    head: list[SystemMessage] = []
    while i < n and isinstance(messages[i], SystemMessage):
        head.append(messages[i])  # type: ignore[arg-type]
        i += 1
    turns: list[tuple[Message, ...]] = []
    start = i
    for j in range(i + 1, n):
        if isinstance(messages[j], UserMessage):
            turns.append(tuple(messages[start:j]))
            start = j
    if start < n:
        turns.append(tuple(messages[start:n]))
    return Turns(head=tuple(head), turns=tuple(turns))


# -- what a processor is given -----------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True)
class StoredSummary:
    """A summary a processor asked to store (:meth:`CompactionContext.store`)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    message: SystemMessage
    tokens_before: int
    """The request's tokens before the summary."""
    tokens_after: int
    """The request's tokens with it."""
    covered: int
    """How many messages of the request it stands for."""


Counter = Callable[[Sequence[Message]], Awaitable[int]]
"""Counts a request's input tokens for ``messages`` (with the call's instructions and tools)."""
Summarizer = Callable[[str, str, Mapping[str, Any]], Awaitable[str]]
"""Makes a model call ``(instructions, text, settings)`` and returns its answer text."""


@attrs.define(kw_only=True, slots=True, eq=False)
class CompactionContext:
    """What a history processor may use: the call it prepares, a token counter, a model
    call for summaries, and where to put a summary to store."""

    __repr__ = _repr

    session_id: str
    turn_id: str
    step: int
    instructions: str | None = None
    """The call's system prompt (counted with the messages)."""
    tools: tuple[Any, ...] = ()
    """The call's tools (their definitions count too)."""
    counter: Counter | None = None
    """The provider's count (``None``: the estimate only)."""
    summarizer: Summarizer | None = None
    """A model call on the session's provider (``None``: summaries are not possible)."""
    stored: list[StoredSummary] = attrs.field(factory=list)
    """What the processors asked to store, in order; the turn runner stores them."""

    def estimate(self, messages: Sequence[Message]) -> int:
        """:func:`estimate_tokens` of a request with ``messages``."""
        return estimate_tokens(self.instructions, messages, self.tools)

    async def count_tokens(self, messages: Sequence[Message], *, limit: int | None = None) -> int:
        """The input tokens of a request with ``messages``: the provider's count, or the
        estimate when the provider has none. With ``limit``, the estimate answers while
        it is below :data:`EXACT_FROM` of ``limit`` (no counting request is made)."""
        estimate = self.estimate(messages)
        if self.counter is None or (limit is not None and estimate < limit * EXACT_FROM):
            return estimate
        return await self.counter(messages)

    async def summarize(
        self, text: str, *, instructions: str, settings: Mapping[str, Any] | None = None
    ) -> str:
        """The model's answer to ``text`` under ``instructions`` (one call on the
        session's provider, no tools); its usage counts toward the turn's."""
        if self.summarizer is None:
            raise ConfigurationError("this history processor needs a model call; none is given")
        return await self.summarizer(instructions, text, settings or {})

    def store(self, summary: StoredSummary) -> None:
        """Store ``summary.message`` in the history (before the current turn's user
        message), so later requests send it in place of what it summarizes."""
        if not is_summary(summary.message):
            raise ValueError("a stored summary is a SystemMessage with summarizes_before set")
        self.stored.append(summary)


HistoryProcessor = Callable[
    [tuple[Message, ...], CompactionContext], Awaitable[Sequence[Message]] | Sequence[Message]
]
"""A function (or callable object), async or not, from the messages of a model call and
the :class:`CompactionContext` to the messages to send."""


def check_processors(value: Sequence[Any]) -> tuple[HistoryProcessor, ...]:
    """``value`` as a tuple of processors (the ``Agent.history_processors`` converter):
    each must be callable; a single processor is a :class:`ConfigurationError`."""
    if callable(value) or isinstance(value, str | bytes):
        raise ConfigurationError("history_processors is a list of processors: [Summarize(...)]")
    processors = tuple(value)
    for p in processors:
        if not callable(p):
            raise ConfigurationError(f"a history processor must be callable, not {p!r}")
    return processors


async def run_processors(
    processors: Sequence[HistoryProcessor],
    messages: Sequence[Message],
    context: CompactionContext,
) -> tuple[Message, ...]:
    """``messages`` with the stored summaries applied (:func:`apply_summaries`), then
    passed through each processor in order."""
    out = apply_summaries(messages)
    for processor in processors:
        result = processor(out, context)
        if inspect.isawaitable(result):
            result = await result
        out = tuple(result)
    return out


# -- the built-in processors -------------------------------------------------------------


def _at_least_one(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{attribute.name} must be a whole number >= 1, not {value!r}")


@attrs.frozen(kw_only=True, slots=True)
class KeepTurns:
    """Keep the last ``n`` turns (the current one counts); older turns are not sent,
    except their system messages (and a stored summary, which stays)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    n: int = attrs.field(validator=_at_least_one)

    def __call__(
        self, messages: tuple[Message, ...], context: CompactionContext
    ) -> tuple[Message, ...]:
        turns = split_turns(messages)
        cut = max(0, len(turns.turns) - self.n)
        return messages if cut == 0 else turns.join(cut)


TOOL_RESULT_PLACEHOLDER = (
    "[the result of {tool_name} ({size} characters) was removed to save context; "
    "call the tool again if it is needed]"
)
"""What :class:`DropToolResults` sends in place of a long old result (``{tool_name}``,
``{size}``)."""


def _size(value: Any) -> int:
    """Characters of a tool's output as sent (bytes, for media)."""
    if isinstance(value, str):
        return len(value)
    if is_media_output(value):
        return sum(len(p.text) if isinstance(p, TextPart) else p.size for p in value)
    return len(_json(value))


@attrs.frozen(kw_only=True, slots=True)
class DropToolResults:
    """Replace every tool result longer than ``max_chars`` outside the last
    ``keep_turns`` turns with ``placeholder``. The result stays (its call still has it,
    as the APIs require); only its output is shortened. Errors are kept."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    max_chars: int = attrs.field(default=2000, validator=attrs.validators.ge(0))
    keep_turns: int = attrs.field(default=2, validator=_at_least_one)
    placeholder: str = TOOL_RESULT_PLACEHOLDER

    def __call__(
        self, messages: tuple[Message, ...], context: CompactionContext
    ) -> tuple[Message, ...]:
        turns = split_turns(messages)
        old = len(turns.turns) - self.keep_turns
        if old <= 0:
            return messages
        out: list[Message] = list(turns.head)
        for i, turn in enumerate(turns.turns):
            if i >= old:
                out.extend(turn)
                continue
            for m in turn:
                if isinstance(m, ToolMessage) and m.error is None:
                    size = _size(m.output)
                    if size > self.max_chars:
                        text = self.placeholder.format(tool_name=m.tool_name, size=size)
                        m = attrs.evolve(m, output=text)
                out.append(m)
        return tuple(out)


SUMMARY_INSTRUCTIONS = """\
You compact a conversation between a user and an AI assistant, so that the assistant can \
go on without the full transcript. Write a concise summary that keeps what the assistant \
needs: the user's goals and requests, decisions and answers given, facts learned (tool \
results that matter, with names, numbers and identifiers exactly), and what was in \
progress or left open. If an earlier summary is given, fold it in. Write plain notes in \
the conversation's language, with no preamble."""
"""The default instructions of the summary call (:attr:`Summarize.instructions`)."""

SUMMARY_PREFIX = "Summary of the earlier conversation (older turns were compacted):\n\n"
"""Put before the model's summary in the stored message, so the model reading it later
knows what it is."""

TRANSCRIPT_RESULT_CHARS = 2000
"""A tool result is cut to this many characters in the transcript a summary is made from."""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, tuple):
        out = []
        for p in content:
            if isinstance(p, TextPart):
                out.append(p.text)
            elif isinstance(p, Image):
                out.append("[image]")
            elif isinstance(p, File):
                out.append(f"[file {p.filename or p.media_type}]")
        if out:
            return " ".join(out)
    return _json(content)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]} [... {len(text) - limit} more]"


def transcript(
    previous: SystemMessage | None,
    turns: Sequence[Sequence[Message]],
    *,
    result_chars: int = TRANSCRIPT_RESULT_CHARS,
) -> str:
    """The text a summary is made from: the previous summary, then the turns as lines
    (``User:``, ``Assistant:``, calls and results, results cut to ``result_chars``).
    Reasoning is left out: the summary keeps what was said and done."""
    lines: list[str] = []
    if previous is not None:
        earlier = previous.content.removeprefix(SUMMARY_PREFIX)
        lines += ["Earlier summary:", earlier, "", "The conversation since:"]
    for turn in turns:
        for m in turn:
            if isinstance(m, UserMessage):
                lines.append(f"User: {_content_text(m.content)}")
            elif isinstance(m, SystemMessage):
                lines.append(f"System: {m.content}")
            elif isinstance(m, AssistantMessage):
                for p in m.content:
                    if isinstance(p, TextPart) and p.text.strip():
                        lines.append(f"Assistant: {p.text}")
                    elif isinstance(p, ToolCallPart):
                        lines.append(f"Assistant called {p.tool_name}({_json(p.input)})")
            elif isinstance(m, ToolMessage):
                if m.error is not None:
                    lines.append(f"{m.tool_name} failed: {_clip(m.error, result_chars)}")
                else:
                    body = _clip(_content_text(m.output), result_chars)
                    lines.append(f"{m.tool_name} returned: {body}")
    return "\n".join(lines)


@attrs.frozen(kw_only=True, slots=True)
class Summarize:
    """When a request counts more than ``max_tokens`` input tokens, summarize all but
    the last ``keep_turns`` turns with a model call on the session's provider, and store
    the summary (it replaces them in every later request; see the module docstring).

    If the request is still over ``max_tokens`` with the summary, one more turn goes into
    a new summary, and so on down to the current turn alone, which is always sent whole:
    a single turn larger than the window is not cut (pair this with
    :class:`DropToolResults` for turns of many large tool results). A summary that is
    empty, or leaves the request no smaller than it was, is not used: the request goes
    as it is, and the next one tries again. The summary call's
    usage counts toward the turn's; ``settings`` are request options for it
    (``{"max_tokens": 1024}`` on Anthropic, say)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    max_tokens: int = attrs.field(validator=_at_least_one)
    keep_turns: int = attrs.field(default=4, validator=_at_least_one)
    instructions: str = SUMMARY_INSTRUCTIONS
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    result_chars: int = attrs.field(default=TRANSCRIPT_RESULT_CHARS, validator=_at_least_one)
    """Tool results are cut to this many characters in the text summarized."""

    async def __call__(
        self, messages: tuple[Message, ...], context: CompactionContext
    ) -> tuple[Message, ...]:
        before = await context.count_tokens(messages, limit=self.max_tokens)
        if before <= self.max_tokens:
            return messages
        turns = split_turns(messages)
        n = len(turns.turns)
        previous = turns.summary
        out, after, cut = messages, before, 0
        made: SystemMessage | None = None
        for keep in range(min(self.keep_turns, n - 1), 0, -1):
            text = transcript(previous, turns.turns[: n - keep], result_chars=self.result_chars)
            answer = await context.summarize(
                text, instructions=self.instructions, settings=self.settings
            )
            if not answer.strip():
                break  # nothing to stand for the turns: the last summary made, if any
            cut = n - keep
            made = SystemMessage(
                content=SUMMARY_PREFIX + answer.strip(),
                summarizes_before=turns.turns[cut][0].id,
            )
            out = turns.join(cut, made)
            after = await context.count_tokens(out)
            if after <= self.max_tokens:
                break
        # Not an empty answer (it stood for the older turns in every later request:
        # all they said was lost), nor one that made the request no smaller (it was
        # stored, and sent with every later request, ever larger).
        if made is None or after >= before:
            from runtime.logging import get_logger  # only here: a rare line

            get_logger("axon.compaction").warning(
                "compaction.summary-unused",
                session_id=context.session_id,
                turn_id=context.turn_id,
                reason="empty answer" if made is None else "no smaller",
                tokens_before=before,
                tokens_after=None if made is None else after,
            )
            return messages
        covered = sum(len(t) for t in turns.turns[:cut]) + (previous is not None)
        context.store(
            StoredSummary(message=made, tokens_before=before, tokens_after=after, covered=covered)
        )
        return out


__all__ = [
    "EXACT_FROM",
    "SUMMARY_INSTRUCTIONS",
    "SUMMARY_PREFIX",
    "TOOL_RESULT_PLACEHOLDER",
    "CompactionContext",
    "DropToolResults",
    "HistoryProcessor",
    "KeepTurns",
    "StoredSummary",
    "Summarize",
    "Turns",
    "apply_summaries",
    "estimate_tokens",
    "is_summary",
    "run_processors",
    "split_turns",
    "transcript",
]
