"""How a turn suspends for a person's input and how its continuation begins.

The turn runner asks :func:`hold_kind` of each call a step makes: a call that needs
approval (and no in-process approver decides it, see :func:`in_process_approver`) or
that runs on the client is *held*. The step's other calls run; the held ones are marked
on their parts (:func:`mark_held`), the step is committed, and the turn ends with
``awaiting-input``. The store then holds all there is of the wait (docs/approval.md).

When the decisions are recorded (:func:`runtime.approval.record_decision`), the turn is
resumed (``RunTurn(resume=True)`` on its message): :func:`resolution` says what each
decided call becomes, a call to run (approved) or a result at once (denied, or a client
tool's output), before the step loop goes on after the suspended step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from runtime.approval import APPROVAL, CLIENT, denial_text
from runtime.ids import new_id
from runtime.messages import Awaiting, Message, Part, ToolCallPart, ToolMessage
from runtime.protocol import ToolCallSpec, ToolOutcome
from runtime.tools import Tool, ToolContext, ToolInputError


def in_process_approver(host: Any) -> bool:
    """Whether an actor on ``host`` decides approvals in process (the
    :class:`~actors.plugins.ApprovalActor`, which says so with ``decides_approvals``):
    then a call that needs approval waits for it in memory, as before durable approval,
    instead of suspending its turn."""
    actors = getattr(host, "_actors", None) or ()
    return any(
        getattr(a, "decides_approvals", False) and not a.stopped.is_set() for a in list(actors)
    )


async def _no_emit(chunk: Any) -> None:
    """A held call streams nothing: it does not run here."""


def hold_kind(
    tool: Tool | None,
    call_input: Any,
    context: ToolContext[Any],
    approver_in_process: bool,
) -> str | None:
    """``"client"`` or ``"approval"`` when the call suspends the turn, else ``None``
    (it runs now; an unknown tool or bad input runs too, into its error result)."""
    if tool is None:
        return None
    try:
        arguments = tool.validate(call_input)
    except ToolInputError:
        return None
    if tool.is_client:
        return CLIENT
    if not approver_in_process and tool.requires_approval(arguments, context):
        return APPROVAL
    return None


def hold_context(
    host: Any, session_id: str, turn_id: str, step: int, call: Any, deps: Any
) -> ToolContext[Any]:
    """The :class:`ToolContext` a per-call approval rule is given."""
    return ToolContext(
        host=host,
        session_id=session_id,
        turn_id=turn_id,
        step=step,
        tool_call_id=call.tool_call_id,
        tool_name=call.tool_name,
        emit=_no_emit,
        deps=deps,
    )


def awaiting(kind: str, tool_call_id: str, turn_id: str) -> Awaiting:
    """The stored wait of a held call (an approval gets an id of its own)."""
    return Awaiting(
        kind=kind,
        id=new_id("approval") if kind == APPROVAL else tool_call_id,
        turn_id=turn_id,
    )


def mark_held(parts: list[Part], held: Mapping[str, Awaiting]) -> None:
    """Put each held call's :class:`Awaiting` on its part (in place)."""
    for i, p in enumerate(parts):
        if isinstance(p, ToolCallPart) and p.tool_call_id in held:
            parts[i] = attrs.evolve(p, awaiting=held[p.tool_call_id])


def held_approvals(
    parts: list[Part], held: Mapping[str, Awaiting]
) -> list[tuple[ToolCallPart, Awaiting]]:
    """The held calls that wait for a person's approval, in call order."""
    return [
        (p, held[p.tool_call_id])
        for p in parts
        if isinstance(p, ToolCallPart)
        and p.tool_call_id in held
        and held[p.tool_call_id].kind == APPROVAL
    ]


def waiting_parts(parts: list[Part], results: Mapping[str, Any]) -> list[ToolCallPart]:
    """A resumed turn's calls that waited and have no result yet, in call order."""
    return [
        p
        for p in parts
        if isinstance(p, ToolCallPart) and p.awaiting is not None and p.tool_call_id not in results
    ]


def resolution(part: ToolCallPart) -> ToolCallSpec | ToolOutcome:
    """What a decided waiting call becomes in its turn's continuation: an approved call
    to run (once: marked approved, it does not ask again), or its result at once."""
    w = part.awaiting
    assert w is not None and w.decided
    if w.kind == APPROVAL and w.approved:
        return ToolCallSpec(
            tool_call_id=part.tool_call_id,
            tool_name=part.tool_name,
            input=part.input,
            approved=True,
        )
    if w.kind == APPROVAL:
        return ToolOutcome(
            tool_call_id=part.tool_call_id, tool_name=part.tool_name, error=denial_text(w.reason)
        )
    return ToolOutcome(
        tool_call_id=part.tool_call_id,
        tool_name=part.tool_name,
        output=None if w.error is not None else w.output,
        error=w.error,
    )


def in_call_order(messages: list[Message], a_index: int) -> None:
    """Put the tool messages after the assistant message ``a_index`` in the order of its
    calls (a continuation adds the waiting calls' results after the others of their
    step): results are stored in call order."""
    assistant = messages[a_index]
    order = {
        p.tool_call_id: i
        for i, p in enumerate(getattr(assistant, "content", ()))
        if isinstance(p, ToolCallPart)
    }
    end = a_index + 1
    while end < len(messages) and isinstance(messages[end], ToolMessage):
        end += 1
    tools = messages[a_index + 1 : end]
    tools.sort(key=lambda m: order.get(getattr(m, "tool_call_id", ""), len(order)))
    messages[a_index + 1 : end] = tools
