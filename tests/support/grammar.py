"""Checks the output grammar of ARCHITECTURE.md on a list of chunks (or their JSON)."""

from __future__ import annotations

import itertools
from typing import Any


def _get(chunk: Any, name: str) -> Any:
    return chunk[name] if isinstance(chunk, dict) else getattr(chunk, name)


RESUMED_RESULTS = ("tool-result", "tool-error", "tool-output-denied")


def check_grammar(chunks: list[Any], *, ending: str = "finish") -> None:
    """Assert ``start RESULT* (step-start CONTENT* (reset-step CONTENT*)* step-finish)+
    finish`` (RESULT: what a
    resumed turn's waiting calls give, docs/approval.md, with the ``tool-stream``
    chunks of an approved agent-as-tool running among them, and its
    ``tool-approval-request`` when its sub-agent asks again, or the ``tool-call`` of
    its sub-agent's next client tool, id ``<call id>.<sub call id>``: then ``finish``
    ``awaiting-input`` follows, no step; or cut short by
    ``error`` / ``abort`` when ``ending`` says so), matched part starts/finishes, unique
    part ids, ``object-delta`` only inside the text part it parses, and strictly
    increasing ``seq``. A continuation that a budget ends before its first step (the
    results it ran took the turn past it) is ``start RESULT+ finish``, its ``finish``
    ``budget``. And ``start finish`` alone (no result, no progress) is a hook on turn
    start ending the turn by its own budget (``budget``) or a takeover of a turn answered
    already (``stop``). No other turn goes without a step."""
    types = [_get(c, "type") for c in chunks]
    assert types[0] == "start", types[:3]
    assert types[-1] == ending, types[-3:]
    seqs = [_get(c, "seq") for c in chunks]
    assert all(b > a for a, b in itertools.pairwise(seqs)), "seq must strictly increase"
    in_step = False
    open_part: str | None = None
    seen_parts: set[str] = set()
    steps_seen = 0
    leading = True  # a resumed turn's results come before its first step (approval.md)
    results = asks = 0
    for c, t in zip(chunks[1:-1], types[1:-1], strict=True):
        if leading and t in RESUMED_RESULTS:
            results += 1
            continue
        if leading and t == "tool-approval-request":  # an agent-as-tool's, asking again
            asks += 1
            continue
        if leading and t == "tool-call" and "." in _get(c, "tool_call_id"):
            asks += 1  # its sub-agent's next client tool call, passed up (subclient)
            continue
        if leading and t == "tool-stream":  # an approved agent-as-tool's, as it runs
            continue
        leading = False
        if t == "step-start":
            assert not in_step, "step-start inside a step"
            in_step, steps_seen = True, steps_seen + 1
        elif t == "step-finish":
            assert in_step and open_part is None, "step-finish with a part open"
            in_step = False
        else:
            assert in_step, f"{t} outside a step"
            if t == "reset-step":
                assert open_part is None, "reset-step with a part open"
            elif t.endswith("-start") and t.split("-")[0] in ("text", "reasoning"):
                assert open_part is None, "a part opened while another is open"
                pid = _get(c, "part_id")
                assert pid not in seen_parts, f"part id {pid} reused"
                seen_parts.add(pid)
                open_part = pid
            elif t.endswith("-delta") and t.split("-")[0] in ("text", "reasoning"):
                assert _get(c, "part_id") == open_part, "delta outside its part"
            elif t == "object-delta":
                assert _get(c, "part_id") == open_part, "object-delta outside its text part"
            elif t.endswith("-finish"):
                assert _get(c, "part_id") == open_part, "finish of a part that is not open"
                open_part = None
    if ending == "finish":
        reason = _get(chunks[-1], "finish_reason")
        ended_by_budget = results >= 1 and reason == "budget"
        # (a hook's budget on turn start; a takeover of an answered turn)
        bare = len(chunks) == 2 and reason in ("budget", "stop")
        asks_again = asks >= 1 and steps_seen == 0 and reason == "awaiting-input"
        assert (steps_seen >= 1 or ended_by_budget or bare or asks_again) and not in_step, (
            "a turn with no step"
        )
        assert not asks or asks_again, "a leading tool-approval-request in a turn that goes on"
    else:
        assert open_part is None, "parts must be closed before error/abort"
