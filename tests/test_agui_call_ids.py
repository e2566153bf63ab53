"""AG-UI tool call ids when a provider numbers each response's calls (``call_0`` in every
turn): on the wire every call goes by a thread-unique id, ``<assistant message
id>.s<step>.<call id>`` (``agui_wire.wire_call_id``), the same live and in every
snapshot; a client answers a waiting call by it, or (a client holding a snapshot from
before wire ids) by the call id alone; an id naming no call that waits is refused with
nothing recorded; a new thread seeded from a snapshot replays the calls to its provider
as the model made them. The scenarios take a run function, so the worker deployment's
front end runs them too (tests/test_worker_agui_call_ids.py)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import pytest

from actors.providers import anthropic, openai
from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.messages import Message
from tests.test_agui import COLOR_TOOL, post, run, run_input, user
from tests.test_agui_ids import _turn_calls
from tests.test_web_http import lookup
from tests.web.harness import web_server

pytest.importorskip("ag_ui.core")

Run = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]
Post = Callable[[dict[str, Any]], Awaitable[httpx.Response]]

requests: list[tuple[Message, ...]] = []
"""What the model was sent, request by request."""


def _recorded(request: Any) -> list[Any]:
    requests.append(tuple(request.messages))
    return _turn_calls(request)


def agent() -> Agent:
    """Per turn, ``lookup`` as ``call_0``, or in a turn saying "pick" the client's
    ``pick_color`` as ``call_0``; then the text of what it got. Its requests recorded."""
    return Agent(provider=ScriptedProvider(responder=_recorded), tools=[lookup])


@pytest.fixture(autouse=True)
def _clear() -> None:
    requests.clear()


def _of(events: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["toolCallId"] for e in events if e["type"] == kind]


def _snapshot(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (found,) = [e for e in events if e["type"] == "MESSAGES_SNAPSHOT"]
    return found["messages"]  # type: ignore[no-any-return]


def _calls(messages: list[dict[str, Any]]) -> list[str]:
    return [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("toolCalls", ())]


def _answers(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["toolCallId"], m["content"]) for m in messages if m["role"] == "tool"]


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


class Thread:
    """Thread ``t`` run as ``@ag-ui/client`` would: each run sends the last snapshot's
    messages and its own (``tools``: the client's ``pick_color``)."""

    def __init__(self, run_: Run, thread: str = "t") -> None:
        self.run = run_
        self.thread = thread
        self.n = 0
        self.held: list[dict[str, Any]] = []
        self.live: list[list[dict[str, Any]]] = []

    async def send(self, *messages: dict[str, Any]) -> list[dict[str, Any]]:
        self.n += 1
        body = run_input(self.thread, *self.held, *messages, tools=[COLOR_TOOL], runId=f"r{self.n}")
        events = await self.run(body)
        self.live.append(events)
        return events

    async def snapshot(self) -> list[dict[str, Any]]:
        """A reconnect's snapshot, held as the client's messages from now on."""
        self.n += 1
        self.held = _snapshot(await self.run(run_input(self.thread, runId=f"r{self.n}")))
        return self.held


async def three_turns(thread: Thread) -> list[list[dict[str, Any]]]:
    """Turns 1 and 2 call ``lookup`` as ``call_0``, turn 3 the client's ``pick_color``
    as ``call_0``, left waiting; the snapshot after each."""
    snapshots = []
    for i, text in enumerate(("one", "two", "pick")):
        await thread.send(user(text, f"m{i + 1}"))
        snapshots.append(await thread.snapshot())
    return snapshots


async def ids_unique_and_the_same_live_and_in_snapshots(run_: Run) -> None:
    thread = Thread(run_)
    snapshots = await three_turns(thread)
    live = [_of(events, "TOOL_CALL_START") for events in thread.live]
    assert [len(ids) for ids in live] == [1, 1, 1]
    ids = [i for (i,) in live]
    assert len(set(ids)) == 3 and all(i.endswith(".s0.call_0") for i in ids)
    for events, (wire,) in zip(thread.live, live, strict=True):
        for kind in ("TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"):
            assert set(_of(events, kind)) <= {wire}
        (parent,) = [e["parentMessageId"] for e in events if e["type"] == "TOOL_CALL_START"]
        assert wire == f"{parent}.s0.call_0"
    assert _of(thread.live[0], "TOOL_CALL_RESULT") == [ids[0]]
    assert [_calls(s) for s in snapshots] == [ids[:1], ids[:2], ids]  # the same every time
    assert [a for a, _ in _answers(snapshots[-1])] == ids[:2]
    assert thread.live[2][-1]["outcome"]["pendingToolCallIds"] == [ids[2]]
    all_ids = [m["id"] for m in snapshots[-1]]
    assert len(set(all_ids)) == len(all_ids)


async def answered_by(run_: Run, how: str) -> None:
    """Turn 3's ``pick_color`` answered by its wire id, or by its call id alone."""
    thread = Thread(run_)
    await three_turns(thread)
    (wire,) = thread.live[2][-1]["outcome"]["pendingToolCallIds"]
    call_id = wire if how == "wire" else "call_0"
    last = await thread.send({"id": "a1", "role": "tool", "toolCallId": call_id, "content": "blue"})
    assert _text(last) == "Got blue." and last[-1]["outcome"] == {"type": "success"}
    assert _of(last, "TOOL_CALL_RESULT") == []  # the client's own message already
    sent = [(m.tool_call_id, m.output) for m in requests[-1] if m.role == "tool"]
    assert sent == [("call_0", "value of one"), ("call_0", "value of two"), ("call_0", "blue")]
    held = await thread.snapshot()
    assert _answers(held)[-1] == (wire, "blue")
    assert len({m["id"] for m in held}) == len(held)


def foreign_ids(wire: str, first: str) -> list[tuple[str, int, str]]:
    """Ids that name no call the thread waits for, with the status and code each gets:
    another thread's wire id, the waiting call's with another step, and turn 1's call
    (its result is held: passed over, so the waiting call goes unanswered)."""
    return [
        ("msg_elsewhere_0.s0.call_0", 404, "unknown_tool_call"),
        (wire.replace(".s0.", ".s7."), 404, "unknown_tool_call"),
        (first, 409, "interrupt_pending"),
    ]


async def foreign_ids_refused(run_: Run, post_: Post) -> None:
    thread = Thread(run_)
    await three_turns(thread)
    (wire,) = thread.live[2][-1]["outcome"]["pendingToolCallIds"]
    (first,) = _of(thread.live[0], "TOOL_CALL_START")
    before = await thread.snapshot()
    asked = len(requests)
    for i, (call_id, status, code) in enumerate(foreign_ids(wire, first)):
        answer = {"id": f"x{i}", "role": "tool", "toolCallId": call_id, "content": "blue"}
        body = run_input("t", *before, answer, tools=[COLOR_TOOL], runId=f"x{i}")
        r = await post_(body)
        assert (r.status_code, r.json()["code"]) == (status, code), (call_id, r.text)
        if status == 409:  # it names the call that waits, by its wire id
            assert repr(wire) in r.json()["error"]
    assert await thread.snapshot() == before  # nothing recorded
    assert len(requests) == asked  # and nothing ran
    last = await thread.send({"id": "a1", "role": "tool", "toolCallId": wire, "content": "red"})
    assert _text(last) == "Got red."


TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+")
"""What Anthropic takes as a ``tool_use`` id (no dot)."""


async def forked_thread_replays_the_calls_as_made(run_: Run) -> None:
    """Thread ``t`` to its end, then its snapshot posted with a new user message to
    start thread ``u``: the request ``u``'s first turn sends holds the calls and results
    under the ids the model made (``call_0``), in the OpenAI and Anthropic bodies."""
    thread = Thread(run_)
    await three_turns(thread)
    (wire,) = thread.live[2][-1]["outcome"]["pendingToolCallIds"]
    await thread.send({"id": "a1", "role": "tool", "toolCallId": wire, "content": "blue"})
    held = await thread.snapshot()
    assert all(".s0." in i for i in _calls(held))
    requests.clear()
    events = await run_(run_input("u", *held, user("three", "m9"), runId="fork"))
    assert _text(events) == "Got value of three."
    sent = requests[0]
    body = openai.map_messages(None, sent)
    calls = [c for m in body if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        ("call_0", "lookup"),
        ("call_0", "lookup"),
        ("call_0", "pick_color"),
    ]
    results = [(m["tool_call_id"], m["content"]) for m in body if m["role"] == "tool"]
    assert results == [("call_0", "value of one"), ("call_0", "value of two"), ("call_0", "blue")]
    _, messages = anthropic.map_messages(None, sent)
    blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"]]
    uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
    answers = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
    assert uses == answers == ["call_0"] * 3
    assert all(TOOL_ID.fullmatch(i) for i in uses)


# -- the embedded host --------------------------------------------------------------------


async def test_call_ids_are_unique_in_a_thread_and_the_same_live_and_in_every_snapshot():
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await ids_unique_and_the_same_live_and_in_snapshots(partial(run, server))


@pytest.mark.parametrize("how", ["wire", "raw"])
async def test_a_waiting_client_call_is_answered_by_its_wire_id_or_its_call_id(how: str):
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await answered_by(partial(run, server), how)


async def test_an_id_naming_no_waiting_call_is_refused_and_nothing_recorded():
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await foreign_ids_refused(partial(run, server), partial(post, server))


async def test_a_thread_forked_from_a_snapshot_replays_the_calls_as_the_model_made_them():
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await forked_thread_replays_the_calls_as_made(partial(run, server))
