"""What a turn taken over by another worker keeps: the steps its first worker committed.

A durable turn runs on a worker over a shared store, and the turn runner saves the
history at the end of every step. A worker that dies mid-turn leaves that history behind:
the turn's user message, its assistant message holding the parts of the steps that
finished, and their tool messages. The worker that takes the turn over must run again
ONLY the step that was in flight, so that the history ends with every part and every
tool result exactly once. :func:`find_committed` reads what the history holds of the
turn into a :class:`Committed`, which the turn runner continues from.

A turn cut from outside (cancelled, or ended by an error) is saved once more as it ends,
with what the step in flight had produced and an ``interrupted`` result for each of its
calls that did not complete: that step did not finish either, so it is dropped here and
run again, like the step a dead worker left behind. Only the last step can be such a
step: every earlier one was committed whole before the next began.

A step the model paused (Anthropic's ``pause_turn`` and ``compaction`` stops) makes no
calls, yet the turn goes on after it (:data:`actors.turn.runner.MAX_RESUMES`): its save
writes :data:`PAUSED_META` into the session's meta, naming the step and the pauses the
turn continued so far. A takeover reads it (:func:`paused_mark`): a last committed step
it names is continued, not taken for the turn's answer, and the count goes on from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from runtime.chunks import Usage
from runtime.history import INTERRUPTED
from runtime.liveness import PAUSED_META
from runtime.messages import (
    AssistantMessage,
    Message,
    Part,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)


def paused_mark(meta: Mapping[str, Any], turn_id: str) -> tuple[int, int] | None:
    """``(step, resumed)`` of :data:`PAUSED_META` in a session's ``meta`` when it names
    the turn ``turn_id``: its last paused step and the pauses it continued; else ``None``."""
    mark = meta.get(PAUSED_META)
    if not isinstance(mark, Mapping) or mark.get("turn_id") != turn_id:
        return None
    step, resumed = mark.get("step"), mark.get("resumed")
    if type(step) is not int or type(resumed) is not int:
        return None
    return step, resumed


@attrs.frozen(kw_only=True, slots=True)
class Committed:
    """The committed steps of a turn found in a history (see :func:`find_committed`)."""

    message_id: str
    """The id of the turn's assistant message the steps are in (its last one)."""
    user_index: int
    """Index of the turn's user message (the assistant message's, if it has none)."""
    assistant_index: int
    """Index of the turn's assistant message."""
    parts: tuple[Part, ...]
    """The parts of the committed steps, in order (those of a cut step left out)."""
    tool_messages: tuple[ToolMessage, ...]
    """The tool messages of the committed steps, in history order."""
    next_step: int
    """The number of the step to run next: one more than the last committed step's."""
    finished: bool
    """The turn needs no more steps: its last committed step made no tool calls and was
    not paused, or later turns follow it in the history. Nothing is to be changed then."""
    usage: Usage = attrs.field(factory=Usage)
    """What the turn's model calls used (and cost) as of its last save: every call that
    had ended by then, sub-agents' included, a cut step's too (it was paid for, and is
    run again). ``Usage()`` for a message stored before usage was."""

    earlier_calls: int = 0
    """Tool calls of the turn's assistant messages before this one (a turn that messages
    were steered into has one after each)."""
    earlier_ids: frozenset[str] = frozenset()
    """Their call ids: a call of the steps from here on gets none of them
    (:class:`actors.turn.parts.CallIds`), as it did not from the worker that began."""

    @property
    def calls(self) -> int:
        """How many tool calls the committed steps made (for the tool-call budget), those
        before a steered message included."""
        return self.earlier_calls + sum(isinstance(p, ToolCallPart) for p in self.parts)


STEERED_MARK = "-s"
"""What :func:`steered_message_id` puts between the first message's id and the step."""


def steered_message_id(first: str, step: int) -> str:
    """The id of the assistant message a turn's steps go to from ``step`` on, once a
    message steered into the turn joined it there (``first``: the id of the turn's
    first assistant message). Derived, not random, so a worker that takes the turn over
    finds the message its predecessor saved last (:func:`find_committed`)."""
    return f"{first}{STEERED_MARK}{step}"


def find_committed(
    messages: Sequence[Message], message_id: str, paused: int | None = None
) -> Committed | None:
    """The committed steps of the turn whose assistant message has id ``message_id``, or
    ``None`` when ``messages`` holds no such message (nothing of the turn was committed).
    A turn that messages were steered into has an assistant message after each
    (:func:`steered_message_id`): its last one is read, the steps from that steer on.

    The turn's tool messages are those right after its assistant message. A last step
    whose calls lack a result, or carry the ``interrupted`` one, was cut; so was a last
    step without calls of a message marked interrupted or failed (its answer is partial).
    Such a step is left out of the result, parts and tool messages alike.

    ``paused``: the turn's last paused step (:func:`paused_mark`). Its save was written
    after it ended, so it is whole (a message marked interrupted after it, its writer
    dead, cut nothing of it); the last committed step, it leaves the turn unfinished.
    """
    a = _last_index(messages, message_id)
    if a is None:
        return None
    msg = messages[a]
    assert isinstance(msg, AssistantMessage)
    u = next((i for i in range(a - 1, -1, -1) if isinstance(messages[i], UserMessage)), a)
    end = a + 1
    while end < len(messages) and isinstance(messages[end], ToolMessage):
        end += 1
    tools = tuple(m for m in messages[a + 1 : end] if isinstance(m, ToolMessage))
    parts = msg.content
    steps = sorted({p.step for p in parts})
    over = end < len(messages)  # later turns follow: this one is long over
    if not over and steps and steps[-1] != paused and _was_cut(msg, steps[-1], tools):
        cut = steps.pop()
        parts = tuple(p for p in parts if p.step != cut)
        tools = tuple(t for t in tools if t.step != cut)
    last_calls = steps and any(isinstance(p, ToolCallPart) and p.step == steps[-1] for p in parts)
    earlier = _earlier_calls(messages, a, message_id) if msg.id != message_id else []
    return Committed(
        earlier_calls=len(earlier),
        earlier_ids=frozenset(earlier),
        message_id=msg.id,
        user_index=u,
        assistant_index=a,
        parts=parts,
        tool_messages=tools,
        next_step=steps[-1] + 1 if steps else 0,
        finished=over or (bool(steps) and not last_calls and steps[-1] != paused),
        usage=msg.usage or Usage(),
    )


def _last_index(messages: Sequence[Message], message_id: str) -> int | None:
    """Index of the turn's last assistant message: ``message_id``'s, or one of a message
    steered into the turn (:func:`steered_message_id`)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, AssistantMessage) and _of_turn(m.id, message_id):
            return i
    return None


def _earlier_calls(messages: Sequence[Message], a: int, message_id: str) -> list[str]:
    """The call ids of the turn's assistant messages before the one at ``a`` (a steered
    one): read back to the turn's first message, ``message_id``'s, not from the session's
    start. Steered messages follow the first (their ids are made from it as they join),
    so none is before it; a continuation after each approval of a long session read all
    of it, per step."""
    calls: list[str] = []
    for i in range(a - 1, -1, -1):
        m = messages[i]
        if isinstance(m, AssistantMessage) and _of_turn(m.id, message_id):
            calls += [p.tool_call_id for p in m.content if isinstance(p, ToolCallPart)]
            if m.id == message_id:
                break
    return calls


def _of_turn(id: str, message_id: str) -> bool:
    """Whether ``id`` is the turn's first assistant message's or a steered one's."""
    if id == message_id:
        return True
    steered = message_id + STEERED_MARK
    return id.startswith(steered) and id[len(steered) :].isdigit()


def _was_cut(msg: AssistantMessage, step: int, tools: Sequence[ToolMessage]) -> bool:
    """Whether ``step``, the message's last, did not finish."""
    calls = [p for p in msg.content if isinstance(p, ToolCallPart) and p.step == step]
    if not calls:
        return msg.interrupted or msg.error is not None
    results = {t.tool_call_id: t for t in tools}
    return any(
        (c.tool_call_id not in results and c.awaiting is None)  # a waiting call is no cut
        or (c.tool_call_id in results and results[c.tool_call_id].error == INTERRUPTED)
        for c in calls
    )
