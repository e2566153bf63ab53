"""One structured-output turn: partial objects while the answer streams, then its verdict.

:class:`StructuredTurn` is what the turn runner keeps for a turn of an agent with an
``output_type`` (:mod:`runtime.output_schema` has the schema side and the decisions). The
turn runner makes it when the turn starts (:meth:`StructuredTurn.start`), hands its
:func:`output_value` to the turn's result, and otherwise calls it at three spots and
nowhere else: :func:`observe` on what it forwards to the stream controller (partial
objects as :class:`~runtime.actor_messages.ObjectUpdate` markers, rendered as
``object-delta`` chunks), :func:`with_feedback` on a request's messages (the validation
error of a rejected answer, as a :class:`~runtime.actor_messages.RetryPrompt`), and
:meth:`StructuredTurn.ask_again` when a step ends with no tool calls (accept, ask again,
or fail with :class:`~runtime.errors.OutputValidationError` once ``output_retries`` are
spent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from runtime.actor_messages import ObjectUpdate, PartBegin, PartEnd, RetryPrompt
from runtime.chunks import TextChunk
from runtime.errors import OutputValidationError
from runtime.messages import AssistantMessage, Message, ToolCallPart
from runtime.output_schema import OutputSchema, unfence_partial
from runtime.provider import TextRun

PARSE_EVERY_BATCH = 8192
"""Characters of an answer up to which every batch of it is parsed for a partial object
(past them, once it grew by an eighth: :meth:`StructuredTurn._flush`)."""

# -- one turn -----------------------------------------------------------------------------


class StructuredTurn:
    """One turn of an agent with an ``output_type``: partial objects while the answer
    streams, then the verdict on it. Owned by the turn runner's task."""

    __slots__ = (
        "_dirty",
        "_last",
        "_parsed",
        "_part",
        "_size",
        "_text",
        "feedback",
        "message_id",
        "retries",
        "schema",
        "value",
    )

    def __init__(self, schema: OutputSchema, *, retries: int, message_id: str) -> None:
        self.schema = schema
        self.retries = retries
        """Answers that may still be rejected before the turn fails."""
        self.message_id = message_id
        """The id of the turn's assistant message (where the rejected answers are)."""
        self.value: Any = None
        """The accepted, typed answer; ``None`` until one is accepted."""
        self.feedback: list[tuple[int, str]] = []
        """``(step, validation error)`` of each rejected answer, in order."""
        self._part: str | None = None
        self._text: list[str] = []
        self._size = 0
        """Characters in ``_text``."""
        self._parsed = 0
        """Characters of the part's text when it was last parsed."""
        self._last: Any = None
        self._dirty = False

    @classmethod
    def start(cls, agent: Any, message_id: str) -> StructuredTurn | None:
        """The state of a new turn of ``agent``; ``None`` when it has no output type."""
        schema = agent.output_schema
        if schema is None:
            return None
        return cls(schema, retries=agent.output_retries, message_id=message_id)

    # -- streaming -------------------------------------------------------------------

    def observe(self, forward: list[Any]) -> list[Any]:
        """``forward`` (what the turn runner sends the stream controller) with an
        :class:`ObjectUpdate` after the text of each part whose parsed value changed.

        The text so far is parsed once per batch (past :data:`PARSE_EVERY_BATCH`
        characters, once it grew by an eighth) and when its part ends, leniently:
        an incomplete string, array or object yields what is complete so far; text that
        is not JSON at all yields nothing. A refusal is not parsed. An answer in a
        fenced block is parsed inside its fence (:func:`runtime.output_schema.unfence_partial`).
        """
        out: list[Any] = []
        for item in forward:
            t = type(item)
            if t is TextChunk:
                if self._part is not None and not item.refusal:
                    self._text.append(item.text)
                    self._size += len(item.text)
                    self._dirty = True
            elif t is TextRun:  # text deltas, none a refusal (runtime.provider)
                if self._part is not None:
                    self._text.extend(item.texts)
                    self._size += sum(map(len, item.texts))
                    self._dirty = True
            elif t is PartEnd:
                self._flush(out, whole=True)
                self._part = None
            elif t is PartBegin:
                self._flush(out, whole=True)
                self._part = item.part_id if item.kind == "text" else None
                self._text, self._last, self._size, self._parsed = [], None, 0, 0
            out.append(item)
        self._flush(out)
        return out

    def discard(self) -> None:
        """Forget the part being parsed: its model call failed and the step starts
        over (a ``reset-step``); the next call's text is parsed afresh."""
        self._part, self._text, self._last, self._dirty = None, [], None, False
        self._size = self._parsed = 0

    def _flush(self, out: list[Any], *, whole: bool = False) -> None:
        """Parse the part's text so far and add an :class:`ObjectUpdate` if its value
        changed. Past :data:`PARSE_EVERY_BATCH` characters, a batch's end parses only
        once the text grew by an eighth since the last parse (the part's end always
        does): each parse reads the whole text, and parsing at every batch made a long
        answer cost the square of its length on the event loop (500 KB: 11 s of CPU)
        and send as many whole objects to the client."""
        if not self._dirty or self._part is None:
            return
        size = self._size
        if not whole and size > PARSE_EVERY_BATCH and size - self._parsed < self._parsed // 8:
            return  # stays dirty: a later batch, or the part's end, parses it
        self._dirty = False
        self._parsed = size
        from pydantic_core import from_json

        text = "".join(self._text)
        self._text = [text]
        try:
            value = from_json(unfence_partial(text), allow_partial="trailing-strings")
        except ValueError:
            return  # not JSON (yet): prose, or only whitespace so far
        if value != self._last:
            self._last = value
            out.append(ObjectUpdate(part_id=self._part, value=value))

    # -- the verdict -----------------------------------------------------------------

    def ask_again(self, parts: Sequence[Any], step: int, finish_reason: str) -> bool:
        """Judge the answer of ``step`` (a step that made no tool calls): ``False`` when
        it is accepted (:attr:`value` is set) or was a refusal, ``True`` when the model
        must be asked again. Raises :class:`OutputValidationError` once the retries are
        spent."""
        if finish_reason == "content-filter":
            return False
        text = "".join(
            p.text for p in parts if p.type == "text" and p.step == step and not p.refusal
        )
        try:
            if not text.strip():
                raise OutputValidationError(
                    "the answer was empty: it must be one JSON object", text=text
                )
            self.value = self.schema.parse(text)
            return False
        except OutputValidationError as exc:
            if finish_reason == "length":
                exc = OutputValidationError(
                    f"{exc.message} (the answer was cut by the output token limit)", text=text
                )
            if self.retries <= 0:
                raise
            self.retries -= 1
            self.feedback.append((step, exc.message))
            return True

    def rejudge(self, parts: Sequence[Any], before: int) -> None:
        """A turn that goes on from its stored steps (taken over from another worker, or
        resumed after a wait for input): judge again, in step order, the answers its
        committed steps before ``before`` gave without tool calls. The turn went on after
        each, so each was rejected: the feedback the model was shown and the retries left
        become what they were before (without this, the next request showed none of it,
        and the turn had ``output_retries`` afresh)."""
        called = {p.step for p in parts if isinstance(p, ToolCallPart)}
        for step in sorted({p.step for p in parts if p.step < before} - called):
            self.ask_again(parts, step, "stop")
        self.value = None  # (an answer judged valid here was not taken by the turn)

    def request_messages(self, messages: Sequence[Message]) -> Sequence[Message]:
        """The messages of the next request: ``messages`` (repaired), with the turn's
        assistant message split after each rejected answer and a user message saying
        what was wrong placed there, so the model sees exactly what it did wrong."""
        if not self.feedback:
            return messages
        at = next(
            (
                i
                for i in range(len(messages) - 1, -1, -1)
                if isinstance(messages[i], AssistantMessage) and messages[i].id == self.message_id  # type: ignore[union-attr]
            ),
            None,
        )
        if at is None:
            return messages
        assistant = messages[at]
        assert isinstance(assistant, AssistantMessage)
        end = at + 1
        while end < len(messages) and messages[end].role == "tool":
            end += 1
        results = list(messages[at + 1 : end])
        out = list(messages[:at])
        low = -1
        for step, error in self.feedback:
            parts = tuple(p for p in assistant.content if low < p.step <= step)
            out.append(attrs.evolve(assistant, content=parts))
            out.extend(_results_of(parts, results))
            out.append(RetryPrompt(content=retry_prompt(error)))
            low = step
        rest = tuple(p for p in assistant.content if p.step > low)
        if rest:
            out.append(attrs.evolve(assistant, content=rest))
            out.extend(_results_of(rest, results))
        out.extend(messages[end:])
        return tuple(out)


def _results_of(parts: Sequence[Any], results: Sequence[Any]) -> list[Any]:
    """The ``results`` of the calls among ``parts``, paired on id *and* step: a server
    that numbers calls per response (``call_0``) repeats an id in another step, whose
    result must not come here (the repair pairs them the same way)."""
    calls = {(p.tool_call_id, p.step) for p in parts if isinstance(p, ToolCallPart)}
    return [r for r in results if (r.tool_call_id, r.step) in calls]


def retry_prompt(error: str) -> str:
    """What the model is told after an answer was rejected."""
    return (
        f"Your answer was rejected: {error}. Answer again with only one JSON object that "
        "matches the required schema."
    )


def with_feedback(turn: StructuredTurn | None, messages: Sequence[Message]) -> tuple[Message, ...]:
    """:meth:`StructuredTurn.request_messages`, or ``messages`` for a turn without one."""
    return tuple(messages if turn is None else turn.request_messages(messages))


def output_value(turn: StructuredTurn | None) -> Any:
    """The turn's accepted answer (``None`` without an output type or an accepted answer)."""
    return None if turn is None else turn.value


def observe(turn: StructuredTurn | None, forward: list[Any]) -> list[Any]:
    """:meth:`StructuredTurn.observe`, or ``forward`` as it is for a turn without one."""
    return forward if turn is None else turn.observe(forward)
