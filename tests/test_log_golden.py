"""The log lines' bytes, pinned (issue 24): a representative turn's events (ids, kinds,
levels, a key in a field, in a nested value and in an error text, a key-named field, an
image) written by the log tap through :func:`runtime.configure_logging`'s chain, and a
line of the runtime's own, at a frozen time: a change to how a line is made must not
change one byte of it (branch ``logcost`` made lines without a dictionary of their own
against these; not merged, benchmarks/journal/pipeline.md says why)."""

# ruff: noqa: E501 (the pinned lines are written whole, one a line)
from __future__ import annotations

from typing import ClassVar

import attrs
import pytest

import runtime.logging as runtime_logging
import runtime.redact as redaction
from actors.log_tap import LogTap
from runtime import messages
from runtime.chunks import Usage
from runtime.events import (
    ActorCrashed,
    MessageAdded,
    SessionSaved,
    StepFinished,
    StepStarted,
    ToolCallCompleted,
    ToolCallRequested,
    TurnFinished,
    TurnStarted,
)
from runtime.output import ErrorInfo, TextDelta, ToolCall
from runtime.redact import register_secret
from tests.test_log_tap import KEY, PNG, handle, logging_to


def golden_events() -> list[object]:
    usage = Usage(input_tokens=10, output_tokens=3, total_tokens=13, cost=0.5)
    ids = {"session_id": "s-1", "turn_id": "turn_9f00"}
    reply = messages.AssistantMessage(
        id="msg_2",
        content=(messages.TextPart(text=f"your key {KEY} is wrong", step=0),),
        usage=usage,
    )
    image = messages.Image(data=PNG + b"pixels" * 40)
    return [
        TurnStarted(**ids, agent="a", input="héllo there", provider="openai", model="m"),
        StepStarted(**ids, step=0),
        ToolCallRequested(**ids, step=0, tool_call_id="call_1", tool_name="t", input={"q": KEY}),
        ToolCall(
            **ids,
            step=0,
            tool_call_id="call_1",
            tool_name="t",
            input={"api_key": "plain", "n": [1, 2.5, None, "Bearer " + KEY]},
            seq=3,
        ),
        ToolCallCompleted(
            **ids, step=0, tool_call_id="call_1", tool_name="t", error=f"401: key {KEY} refused"
        ),
        StepFinished(**ids, step=0, finish_reason="stop", usage=usage),
        MessageAdded(**ids, index=1, message=reply),
        MessageAdded(**ids, index=0, message=messages.UserMessage(id="msg_1", content=(image,))),
        SessionSaved(**ids, message_count=2, step=0),
        TextDelta(**ids, step=0, part_id="p", text="hi", seq=4),
        TurnFinished(
            **ids,
            finish_reason="error",
            usage=usage,
            steps=1,
            error=ErrorInfo(kind="provider", message=f"rejected {KEY}"),
        ),
        ActorCrashed(actor="x", error="boom 2026-12-04T09:55:17Z", error_type="E", restarts=1),
    ]


def written(level: str) -> list[str]:
    with logging_to(level) as out:
        tap = LogTap()
        for event in golden_events():
            handle(tap, event)
        runtime_logging.get_logger("axon").warning("own.line", n=1, token="t0ken-value")
    return out.getvalue().splitlines()


STAMP = '"timestamp":"2025-12-03T18:20:28.844091Z"}'
GOLDEN = [
    '{"logger":"axon.events","agent":"a","input":"héllo there","provider":"openai","model":"m","resumed":false,"suspended_trace":null,"session_id":"s-1","turn_id":"turn_9f00","causation_id":"turn_9f00","event":"turn.started","level":"info",'
    + STAMP,
    '{"logger":"axon.events","step":0,"session_id":"s-1","turn_id":"turn_9f00","causation_id":"turn_9f00","event":"step.started","level":"info",'
    + STAMP,
    '{"logger":"axon.events","step":0,"tool_call_id":"call_1","tool_name":"t","input":{"q":"[redacted]"},"session_id":"s-1","turn_id":"turn_9f00","causation_id":"call_1","event":"tool.call-requested","level":"info",'
    + STAMP,
    '{"logger":"axon.events","step":0,"tool_call_id":"call_1","tool_name":"t","input":{"api_key":"[redacted]","n":[1,2.5,null,"Bearer [redacted]"]},"seq":3,"session_id":"s-1","turn_id":"turn_9f00","causation_id":"call_1","event":"output.tool-call","level":"info",'
    + STAMP,
    '{"logger":"axon.events","step":0,"tool_call_id":"call_1","tool_name":"t","output":null,"error":"401: key [redacted] refused","duration":0.0,"session_id":"s-1","turn_id":"turn_9f00","causation_id":"call_1","event":"tool.call-completed","level":"info",'
    + STAMP,
    '{"logger":"axon.events","step":0,"finish_reason":"stop","usage":{"input_tokens":10,"output_tokens":3,"total_tokens":13,"cache_read":null,"cache_write":null,"reasoning_tokens":null,"cost":0.5},"session_id":"s-1","turn_id":"turn_9f00","causation_id":"turn_9f00","event":"step.finished","level":"info",'
    + STAMP,
    '{"logger":"axon.events","index":1,"message":{"content":[{"text":"your key [redacted] is wrong","step":0,"refusal":false,"type":"text"}],"id":"msg_2","interrupted":false,"usage":{"input_tokens":10,"output_tokens":3,"total_tokens":13,"cache_read":null,"cache_write":null,"reasoning_tokens":null,"cost":0.5},"role":"assistant"},"session_id":"s-1","turn_id":"turn_9f00","causation_id":"turn_9f00","event":"message.added","level":"info",'
    + STAMP,
    '{"logger":"axon.events","index":0,"message":{"content":[{"data":"<248 bytes>","url":null,"media_type":"image/png","type":"image"}],"id":"msg_1","role":"user"},"session_id":"s-1","turn_id":"turn_9f00","causation_id":"turn_9f00","event":"message.added","level":"info",'
    + STAMP,
    '{"logger":"axon.events","message_count":2,"step":0,"session_id":"s-1","turn_id":"turn_9f00","causation_id":"turn_9f00","event":"session.saved","level":"info",'
    + STAMP,
    '{"logger":"axon.events","step":0,"part_id":"p","text":"hi","seq":4,"session_id":"s-1","turn_id":"turn_9f00","causation_id":"p","event":"output.text-delta","level":"debug",'
    + STAMP,
    '{"logger":"axon.events","finish_reason":"error","usage":{"input_tokens":10,"output_tokens":3,"total_tokens":13,"cache_read":null,"cache_write":null,"reasoning_tokens":null,"cost":0.5},"steps":1,"error":{"kind":"provider","message":"rejected [redacted]","retryable":false},"abort_reason":null,"budget":null,"saved":true,"session_id":"s-1","turn_id":"turn_9f00","causation_id":"turn_9f00","event":"turn.finished","level":"info",'
    + STAMP,
    '{"logger":"axon.events","actor":"x","error":"boom 2026-12-04T09:55:17Z","error_type":"E","restarts":1,"session_id":null,"turn_id":null,"causation_id":null,"event":"actor.crashed","level":"warning",'
    + STAMP,
    '{"logger":"axon","n":1,"token":"[redacted]","event":"own.line","level":"warning",' + STAMP,
]


@pytest.mark.parametrize("level", ["info", "debug"])
def test_the_lines_are_the_pinned_bytes(level):
    expected = [line for line in GOLDEN if level == "debug" or '"level":"debug"' not in line]
    assert written(level) == expected


def test_the_pinned_events_are_what_they_say():
    """The golden events hold what the lines must hide (so the bytes above show it
    hidden), and each class's fields are plain attrs fields (no chain key)."""
    text = repr(golden_events())
    assert KEY in text and KEY not in repr(GOLDEN)
    assert all(attrs.has(type(e)) for e in golden_events())


@attrs.frozen(kw_only=True)
class _Noted:
    kind: ClassVar[str] = "app.noted-by-hand"
    session_id: str
    note: str


def test_a_name_or_kind_registered_after_its_frame_was_made_is_redacted():
    """The tap makes a line's head (the logger's name) and tail (the kind) once and keeps
    them while the registered secrets stay the same: a name or a kind found clean, then
    registered as a secret, is redacted from the next line on, as the chain does, and so
    is a field's value first seen clean under another key."""
    from tests.test_redact import isolated_secrets

    name = "axon.events-by-hand"
    event = _Noted(session_id="s-1", note="quietly-noted-value")
    with isolated_secrets():
        got = []
        for way in ("tap", "chain"):
            with logging_to("info") as out:
                log = runtime_logging.get_logger(name)
                tap = LogTap(logger=log)
                for secret in (None, name, _Noted.kind, "quietly-noted-value"):
                    if secret is not None:
                        register_secret(secret)
                    if way == "tap":
                        handle(tap, event)
                    else:
                        fields = {**attrs.asdict(event), "causation_id": None}
                        log.info(_Noted.kind, **fields)
            got.append(out.getvalue().splitlines())
            redaction._checked, redaction._secrets = {}, frozenset()  # the second way anew
            redaction._pattern = None
    tap_lines, chain_lines = got
    assert tap_lines == chain_lines and len(tap_lines) == 4
    assert name in tap_lines[0] and _Noted.kind in tap_lines[0]
    assert name not in tap_lines[1] and '"logger":"[redacted]"' in tap_lines[1]
    assert _Noted.kind not in tap_lines[2] and '"event":"[redacted]"' in tap_lines[2]
    assert "quietly" not in tap_lines[3] and '"note":"[redacted]"' in tap_lines[3]
