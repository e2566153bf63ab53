"""History helpers the providers share: the repair pass and the split into steps.

These operate on :mod:`runtime.messages` values only; turning them into an SDK's request
format is each provider's job (``map_messages``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from runtime.messages import (
    AssistantMessage,
    Message,
    Part,
    TextPart,
    ToolCallPart,
    ToolMessage,
)

INTERRUPTED = "interrupted: the tool call did not complete (the turn was cut short)"


def repair(messages: Sequence[Message]) -> list[Message]:
    """Make a history valid for any provider.

    * every tool call gets a result: one without gets an ``interrupted`` error result,
      placed with the other results of its assistant message;
    * a tool result whose call is not in the assistant message before it is dropped;
    * a second result for the same call is dropped;
    * empty and whitespace-only text parts are removed.
    """
    out: list[Message] = []
    i = 0
    n = len(messages)
    while i < n:
        msg = messages[i]
        if isinstance(msg, ToolMessage):  # orphan: no assistant message claimed it
            i += 1
            continue
        if not isinstance(msg, AssistantMessage):
            out.append(msg)
            i += 1
            continue
        parts = tuple(
            p for p in msg.content if not (isinstance(p, TextPart) and not p.text.strip())
        )
        assistant = msg if len(parts) == len(msg.content) else attrs.evolve(msg, content=parts)
        out.append(assistant)
        calls = {p.tool_call_id: p for p in parts if isinstance(p, ToolCallPart)}
        i += 1
        results: dict[str, ToolMessage] = {}
        while i < n and isinstance(messages[i], ToolMessage):
            tm = messages[i]
            assert isinstance(tm, ToolMessage)
            if tm.tool_call_id in calls and tm.tool_call_id not in results:
                results[tm.tool_call_id] = tm
            i += 1
        for call_id, call in calls.items():
            out.append(
                results.get(call_id)
                or ToolMessage(
                    tool_call_id=call_id,
                    tool_name=call.tool_name,
                    step=call.step,
                    error=INTERRUPTED,
                )
            )
    return out


def split_steps(
    assistant: AssistantMessage, results: Sequence[ToolMessage]
) -> list[tuple[list[Part], list[ToolMessage]]]:
    """One ``(parts, tool results)`` pair per step, in step order: exactly what the model
    saw on each call. Results are placed with the step of their call, in call order."""
    steps: dict[int, list[Part]] = {}
    for part in assistant.content:
        steps.setdefault(part.step, []).append(part)
    by_id = {r.tool_call_id: r for r in results}
    out: list[tuple[list[Part], list[ToolMessage]]] = []
    for step in sorted(steps):
        parts = steps[step]
        step_results = [
            by_id[p.tool_call_id]
            for p in parts
            if isinstance(p, ToolCallPart) and p.tool_call_id in by_id
        ]
        out.append((parts, step_results))
    return out


def iter_turns(messages: Sequence[Message]):
    """Yield each message, except that an assistant message comes with its tool results:
    ``("message", msg)`` or ``("assistant", assistant, [tool results])``."""
    i, n = 0, len(messages)
    while i < n:
        msg = messages[i]
        if isinstance(msg, AssistantMessage):
            j = i + 1
            results: list[ToolMessage] = []
            while j < n and isinstance(messages[j], ToolMessage):
                results.append(messages[j])  # type: ignore[arg-type]
                j += 1
            yield ("assistant", msg, results)
            i = j
        else:
            yield ("message", msg, [])
            i += 1
