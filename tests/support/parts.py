"""Rebuilds a turn's parts from its output stream, to compare with the stored message.

A client that renders a turn live and later reloads the session must see the same parts
both times. :func:`rebuild_parts` does what such a client does with the stream, and
:func:`stored_parts` puts a stored message's parts in the same shape, leaving out what
the stream does not carry: ``provider-data`` parts (opaque, never streamed) and the
fields only a provider needs back (signature, redacted data, refusal flag, provider).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runtime.messages import Part, ProviderDataPart, ReasoningPart, TextPart, ToolCallPart


def _get(chunk: Any, name: str) -> Any:
    return chunk[name] if isinstance(chunk, dict) else getattr(chunk, name)


def rebuild_parts(chunks: Iterable[Any]) -> list[tuple[Any, ...]]:
    """The parts a client sees in the stream, in order: ``(type, step, text)`` for a text
    or reasoning part (its deltas joined, from its ``*-start`` to its ``*-finish``) and
    ``(type, step, tool_call_id, tool_name, input)`` for a ``tool-call``."""
    parts: list[tuple[Any, ...]] = []
    open_id: str | None = None
    pieces: list[str] = []
    for chunk in chunks:
        t = _get(chunk, "type")
        if t in ("text-start", "reasoning-start"):
            assert open_id is None, "a part opened while another is open"
            open_id, pieces = _get(chunk, "part_id"), []
        elif t in ("text-delta", "reasoning-delta"):
            assert _get(chunk, "part_id") == open_id, "a delta outside its part"
            pieces.append(_get(chunk, "text"))
        elif t in ("text-finish", "reasoning-finish"):
            assert _get(chunk, "part_id") == open_id, "the finish of a part that is not open"
            parts.append((t.split("-")[0], _get(chunk, "step"), "".join(pieces)))
            open_id = None
        elif t == "tool-call":
            parts.append(
                (
                    "tool-call",
                    _get(chunk, "step"),
                    _get(chunk, "tool_call_id"),
                    _get(chunk, "tool_name"),
                    _get(chunk, "input"),
                )
            )
    return parts


def stored_parts(content: Iterable[Part]) -> list[tuple[Any, ...]]:
    """A stored assistant message's parts in the shape of :func:`rebuild_parts`."""
    out: list[tuple[Any, ...]] = []
    for p in content:
        if isinstance(p, TextPart | ReasoningPart):
            out.append((p.type, p.step, p.text))
        elif isinstance(p, ToolCallPart):
            out.append((p.type, p.step, p.tool_call_id, p.tool_name, p.input))
        else:
            assert isinstance(p, ProviderDataPart), p
    return out
