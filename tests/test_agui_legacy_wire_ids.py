"""AG-UI wire ids as spelled before aguiwire escaped their message part are still read.

Before, a call's wire id was ``<message id>.s<step>.<call id>`` spelled plainly; now the
message part has its ``.`` and ``%`` escaped (``agui_wire.wire_call_id``). For a message
id with a dot (a worker front end's ``msg_<runId>`` of a dotted run id) the two
spellings differ, and a client that stored the old one (a call asked before the upgrade,
answered after it) was told 404 ``unknown_tool_call``. The old spelling is read as the
call it names when it names one call (``agui_wire.legacy_wire_ids``): answering a
waiting call, and as the call id of a thread started from an old snapshot."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from runtime.app.web.agui_wire import legacy_wire_ids, stored_call_id, wire_call_id
from runtime.messages import AssistantMessage, ToolCallPart
from tests.test_agui import COLOR_TOOL, run, run_input, user
from tests.test_agui_call_ids import _clear as _clear  # the fixture
from tests.test_agui_call_ids import _text, agent, requests
from tests.web.harness import web_server

pytest.importorskip("ag_ui.core")

Run = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]


def _calls(message_id: str, *call_ids: str, step: int = 0) -> AssistantMessage:
    return AssistantMessage(
        id=message_id,
        content=tuple(
            ToolCallPart(tool_call_id=c, tool_name="lookup", input={}, step=step) for c in call_ids
        ),
    )


def test_an_old_spelling_names_the_call_of_the_dotted_message():
    messages = [_calls("msg_r.x", "call_0"), _calls("msg_plain", "call_0")]
    assert legacy_wire_ids(messages) == {
        "msg_r.x.s0.call_0": wire_call_id("msg_r.x", 0, "call_0")  # msg_r%2Ex.s0.call_0
    }


def test_an_old_spelling_that_is_another_calls_wire_id_now_is_that_calls():
    # message S's call p.s0.call_0 and message S.s0.p's call_0 were one plain id
    messages = [_calls("S", "p.s0.call_0"), _calls("S.s0.p", "call_0")]
    assert "S.s0.p.s0.call_0" == wire_call_id("S", 0, "p.s0.call_0")
    assert legacy_wire_ids(messages) == {}


def test_an_old_spelling_two_calls_share_names_neither():
    # message a.b's call c.s0.d and message a.b.s0.c's call d: both a.b.s0.c.s0.d plainly
    messages = [_calls("a.b", "c.s0.d"), _calls("a.b.s0.c", "d")]
    assert legacy_wire_ids(messages) == {}


def test_a_seeded_calls_old_spelling_reads_back_to_its_call_id():
    assert stored_call_id("msg_r.x", "msg_r.x.s0.call_0") == "call_0"
    assert stored_call_id("msg_r.x", "msg_r%2Ex.s0.call_0") == "call_0"
    assert stored_call_id("msg_r.x", "msg_q.s0.call_0") == "msg_q.s0.call_0"  # another's


async def old_spelling_answers_the_waiting_call(run_: Run) -> None:
    """A run named ``r.x`` (its message ``msg_r.x`` on a worker front end) waits for the
    client's ``pick_color``; the client answers it by the plain spelling of its wire id:
    the call runs on with that answer."""
    first = await run_(run_input("t", user("pick", "m1"), tools=[COLOR_TOOL], runId="r.x"))
    (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
    (parent,) = [e["parentMessageId"] for e in first if e["type"] == "TOOL_CALL_START"]
    assert parent == "msg_r.x" and wire == "msg_r%2Ex.s0.call_0"
    old = f"{parent}.s0.call_0"
    answer = {"id": "a1", "role": "tool", "toolCallId": old, "content": "blue"}
    last = await run_(run_input("t", user("pick", "m1"), answer, tools=[COLOR_TOOL], runId="r2"))
    assert _text(last) == "Got blue."
    sent = [(m.tool_call_id, m.output) for m in requests[-1] if m.role == "tool"]
    assert sent == [("call_0", "blue")]


async def test_a_thread_started_from_an_old_snapshot_replays_the_call_as_made():
    """An old snapshot of a worker thread: message ``msg_r.x`` with call
    ``msg_r.x.s0.call_0`` (plain), answered; posted to start a new thread (here on the
    embedded app): the model is sent ``call_0`` (the dotted id was kept, which Anthropic's
    ``tool_use`` ids refuse)."""
    old = "msg_r.x.s0.call_0"
    seed = [
        user("one", "m0"),
        {
            "id": "msg_r.x",
            "role": "assistant",
            "toolCalls": [
                {
                    "id": old,
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"key": "one"}'},
                }
            ],
        },
        {"id": "t0", "role": "tool", "toolCallId": old, "content": "value of one"},
    ]
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        events = await run(server, run_input("u", *seed, user("two", "m1"), runId="r1"))
    assert _text(events) == "Got value of two."
    sent = [(m.tool_call_id, m.output) for m in requests[0] if m.role == "tool"]
    assert sent[0] == ("call_0", "value of one")
