"""A task whose model call waits says so to its A2A client (docs/protocols-a2a.md):
a ``throttled`` (rate limit) or ``budget-wait`` (output tokens held beside it) chunk is a
``TASK_STATE_WORKING`` status update whose message says why (a text part and the
chunk's fields as a data part); the turn's next chunk of its own ends it with a
``WORKING`` update with no message. Before, both were dropped: the task just went
quiet. Checked with the official ``a2a-sdk`` client and its protobuf models."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.types.a2a_pb2 import StreamResponse, Task, TaskState
from google.protobuf.json_format import MessageToDict, ParseDict

from actors.a2a import A2AAgent, wire
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host
from runtime import output as o
from runtime.app.web.a2a_tasks import LiveTask
from runtime.ratelimit import RateLimit
from tests.support.grammar import check_grammar
from tests.test_a2a import BOTH, collect, last_state, lead_agent, sdk, user
from tests.test_agui_node import InstantClock, look
from tests.web.harness import web_server

WORKING = TaskState.TASK_STATE_WORKING


def statuses(events: list[Any]) -> list[tuple[int, list[Any]]]:
    """Each status update's state and its message's parts as JSON (``[]``: none)."""
    return [
        (
            e.status_update.status.state,
            [MessageToDict(p) for p in e.status_update.status.message.parts],
        )
        for e in events
        if e.HasField("status_update")
    ]


async def test_a_rate_limit_wait_is_a_working_status_the_sdk_reads_then_cleared():
    limit = RateLimit(requests_per_minute=1, clock=InstantClock())
    steps = [[*tool_call("look", {"q": "x"}, tool_call_id="L")], ["Found it."]]
    agent = Agent(name="slow", provider=ScriptedProvider(steps, rate_limit=limit), tools=[look])
    async with web_server(agent, protocols=BOTH) as server:
        events = await sdk(server, lambda c: collect(c, user("go")))
    said = statuses(events)
    waiting = [parts for state, parts in said if parts]
    assert waiting == [
        [
            {"text": "the model call waits about 60 s for its rate limit (requests per minute)"},
            {"data": {"throttled": {"step": 1, "wait": 60.0, "reason": "requests"}}},
        ]
    ]
    at = next(i for i, (_, parts) in enumerate(said) if parts)
    assert said[at][0] == WORKING and said[at + 1] == (WORKING, [])  # it went on: cleared
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED
    # the answer came after the wait ended
    kinds = ["status" if e.HasField("status_update") else e.WhichOneof("payload") for e in events]
    assert "artifact_update" in kinds[kinds.index("status", at) :]


def take_all(live: LiveTask, chunks: list[Any]) -> list[dict[str, Any]]:
    before = len(live.events)
    for chunk in chunks:
        live.take(chunk)
    return live.events[before:]


def test_a_wait_said_once_held_in_the_task_and_ended_by_the_turns_next_chunk():
    """The same wait tried again (a limiter polls every 0.25 s while every slot is taken)
    is not said again; the task's own status (``GetTask``, a resubscription's snapshot)
    says it while it holds; a tool's nested stream meanwhile does not end it, nor is a
    sub-agent's nested wait said; the next chunk of the turn's own does."""
    live = LiveTask("c~m", "c", "m")
    live.running = True  # (as the book's run of it: its events kept for followers)
    live.set_state(wire.WORKING)
    slot = o.Throttled(step=2, wait=0.25, reason="concurrency")
    budget = o.BudgetWait(step=2, want=90, available=10, held=80, ahead=1)
    nested = o.ToolStream(step=2, tool_call_id="c", tool_name="helper", chunk=budget)
    sent = take_all(live, [slot, slot, nested, slot])
    assert len(sent) == 1
    update = ParseDict(sent[0], StreamResponse()).status_update
    assert update.status.state == WORKING
    assert MessageToDict(update.status.message.parts[1]) == {
        "data": {"throttled": {"step": 2, "wait": 0.25, "reason": "concurrency"}}
    }
    snapshot = ParseDict(live.snapshot(), Task())
    assert snapshot.status.message.parts[0].text.endswith("(calls in flight)")
    # another kind of wait is said; then the turn goes on
    sent = take_all(live, [budget, o.TextStart(step=2, part_id="p")])
    first, cleared = (ParseDict(e, StreamResponse()).status_update for e in sent)
    assert MessageToDict(first.status.message.parts[1]) == {
        "data": {"budgetWait": {"step": 2, "want": 90, "available": 10, "held": 80, "ahead": 1}}
    }
    assert "it wants 90, 10 are free, 80 held" in first.status.message.parts[0].text
    assert cleared.status.state == WORKING and not cleared.status.HasField("message")
    assert "message" not in live.snapshot()["status"]
    # a text delta after that is an artifact update only: nothing left to clear
    (text,) = take_all(live, [o.TextDelta(step=2, part_id="p", text="Hi")])
    assert "artifactUpdate" in text
    # the same wait in a later step is said again
    assert len(take_all(live, [o.Throttled(step=3, wait=0.25, reason="concurrency")])) == 1


def test_a_wait_outside_a_running_task_is_not_said():
    """A notice read back after the task settled (a follower behind) changes nothing."""
    live = LiveTask("c~m", "c", "m")
    live.set_state(wire.COMPLETED)
    assert take_all(live, [o.Throttled(step=0, wait=1.0, reason="tokens")]) == []
    assert live.state == wire.COMPLETED


# -- A2AAgent: a remote Axon's wait, passed on ---------------------------------------------


async def test_a_remote_tasks_wait_comes_nested_under_the_call_as_the_chunk_it_was():
    """An agent delegating to a remote Axon agent whose model call waits for its rate
    limit gets the remote's ``throttled`` nested under the tool call, as a local
    sub-agent's (the web UI stream's nested ``budget-wait`` the same way)."""
    limit = RateLimit(requests_per_minute=1, clock=InstantClock())
    steps = [[*tool_call("look", {"q": "x"}, tool_call_id="L")], ["Trio is structured."]]
    researcher = Agent(
        name="researcher", provider=ScriptedProvider(steps, rate_limit=limit), tools=[look]
    )
    async with web_server(researcher, protocols=BOTH, token="tok") as server:
        remote = A2AAgent(server.url, token="tok").as_tool(name="researcher")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead_agent(remote), session_id="p")
            async with session.stream("explain trio") as out:
                chunks = [c async for c in out]
    check_grammar(chunks)
    inner = [c.chunk for c in chunks if c.type == "tool-stream"]
    check_grammar(inner)
    waits = [c for c in inner if c.type == "throttled"]
    assert [(c.step, c.wait, c.reason) for c in waits] == [(0, 60.0, "requests")]
    kinds = [c.type for c in inner]
    assert kinds.index("throttled") < kinds.index("text-delta")
    assert out.result.text == "Summary: Trio is structured."


class Nested:
    def __init__(self) -> None:
        self.started = True
        self.out: list[Any] = []

    async def _out(self, chunk_type: Any, **fields: Any) -> None:
        self.out.append(chunk_type(**fields))


@pytest.mark.parametrize(
    ("data", "passed"),
    [
        ({"throttled": {"wait": 2.5, "reason": "tokens"}}, ("throttled", 2.5)),
        ({"budgetWait": {"want": 9.0, "available": 1, "held": 8, "ahead": 0}}, ("budget-wait", 9)),
        ({"throttled": {"wait": float("nan"), "reason": "tokens"}}, None),
        ({"throttled": {"wait": -1, "reason": "tokens"}}, None),
        ({"throttled": {"wait": True, "reason": "tokens"}}, None),
        ({"throttled": {"wait": 1, "reason": "x" * 65}}, None),
        ({"throttled": {"wait": 1}}, None),
        ({"budgetWait": {"want": 1.5, "available": 1, "held": 8, "ahead": 0}}, None),
        ({"budgetWait": {"want": 2**60, "available": 1, "held": 8, "ahead": 0}}, None),
        ({"budgetWait": {"want": 1, "available": 1, "held": 8}}, None),
        ({"budgetWait": "soon"}, None),
        ({"progress": 0.5}, None),
        ("just data", None),
    ],
)
async def test_only_a_well_formed_remote_notice_is_passed_on(data, passed):
    """Another agent's status messages (progress of its own, or a hostile one's) pass
    on nothing and fail nothing: only a notice of the shape Axon sends, in bounds."""
    from actors.a2a.agent import _pass_notice

    nested = Nested()
    await _pass_notice(nested, {"parts": [{"text": "waiting"}, {"data": data}]})  # type: ignore[arg-type]
    if passed is None:
        assert nested.out == []
    else:
        (chunk,) = nested.out
        assert chunk.type == passed[0]
        assert (chunk.wait if chunk.type == "throttled" else chunk.want) == passed[1]
    said = len(nested.out)
    for junk in (None, "text", {"parts": "x"}, {"parts": [1, None, {"data": None}]}):
        await _pass_notice(nested, junk)  # type: ignore[arg-type]
    assert len(nested.out) == said


def test_a_wait_tried_again_with_other_numbers_is_said_again_not_left_at_the_first_try():
    """A limiter's next try whose wait changed (another caller took the slot the first
    try waited for) and a step's second reservation (its summary call's, then its own)
    each update the status: the task and a client keeping its last status show the wait
    as it is now. Before, both kept the first try's numbers ("about 60 s") for as long
    as the step waited; only the same numbers again (a ``concurrency`` poll) are not
    sent again."""
    live = LiveTask("c~m", "c", "m")
    live.running = True
    live.set_state(wire.WORKING)
    first = o.Throttled(step=1, wait=60.0, reason="requests")
    again = o.Throttled(step=1, wait=12.5, reason="requests")
    summary = o.BudgetWait(step=1, want=90, available=10, held=80, ahead=2)
    own = o.BudgetWait(step=1, want=40, available=5, held=35, ahead=0)
    sent = take_all(live, [first, first, again, summary, summary, own])
    data = [
        MessageToDict(ParseDict(e, StreamResponse()).status_update.status.message.parts[1])
        for e in sent
    ]
    assert data == [
        {"data": {"throttled": {"step": 1, "wait": 60.0, "reason": "requests"}}},
        {"data": {"throttled": {"step": 1, "wait": 12.5, "reason": "requests"}}},
        {"data": {"budgetWait": {"step": 1, "want": 90, "available": 10, "held": 80, "ahead": 2}}},
        {"data": {"budgetWait": {"step": 1, "want": 40, "available": 5, "held": 35, "ahead": 0}}},
    ]
    snapshot = ParseDict(live.snapshot(), Task())
    assert "it wants 40, 5 are free, 35 held" in snapshot.status.message.parts[0].text
