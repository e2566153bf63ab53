"""AG-UI snapshot ids stay distinct whatever ids a client gives its messages.

A user message is stored under the client's id (1-128 of letters, digits, ``_.:-``), and
a snapshot derives ids from an assistant message's: its reasoning messages'
(``<assistant id>.r<k>``) and its calls' results (``<wire id>.result``). A user message
named so shared its id with that reasoning or result message in one
``MESSAGES_SNAPSHOT`` (``@ag-ui/client`` keys messages by id: one replaced the other).
Such an id is written escaped in snapshots (``agui_wire.snapshot_id``: its dots as
``%2E``), stored as the client sent it; a run naming the thread's assistant message so
(``msg_<runId>`` on a worker front end) gets a run id of the server's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent
from runtime.app.web.agui import _queue_turn_id
from runtime.app.web.agui_wire import (
    agui_messages,
    reasoning_id,
    result_message_id,
    snapshot_id,
    stored_message_id,
)
from runtime.app.web.resend import client_turn_id
from runtime.chunks import ReasoningChunk
from runtime.messages import (
    AssistantMessage,
    ReasoningPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from tests.test_agui import run, run_input, user
from tests.test_web_http import lookup
from tests.web.harness import web_server

pytest.importorskip("ag_ui.core")

Run = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]

requests: list[int] = []
"""One entry per model request."""


def _think_then_look(request: Any) -> list[Any]:
    """Per turn: reasoning, ``lookup`` as ``call_0``, then the text of what it got."""
    requests.append(1)
    at = max(i for i, m in enumerate(request.messages) if isinstance(m, UserMessage))
    results = [m for m in request.messages[at:] if isinstance(m, ToolMessage)]
    if results:
        return [f"Got {results[-1].output}."]
    asked = request.messages[at].text
    return [ReasoningChunk(text="hm"), *tool_call("lookup", {"key": asked}, tool_call_id="call_0")]


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(responder=_think_then_look), tools=[lookup])


@pytest.fixture(autouse=True)
def _clear() -> None:
    requests.clear()


def _snapshot(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (found,) = [e for e in events if e["type"] == "MESSAGES_SNAPSHOT"]
    return found["messages"]  # type: ignore[no-any-return]


def _repeated(messages: list[dict[str, Any]]) -> list[str]:
    return [i for i, n in Counter(m["id"] for m in messages).items() if n > 1]


async def hostile_user_ids(run_: Run) -> list[str]:
    """Thread ``h``: turn 1, then a user message named as turn 1's reasoning message,
    then one named as its tool result (each run sends the last snapshot, as a client
    does). Every snapshot's ids distinct; returns the two hostile ids."""
    first = await run_(run_input("h", user("one", "m1"), runId="r1"))
    held = _snapshot(await run_(run_input("h", runId="r2")))
    (reasoning,) = [m["id"] for m in held if m["role"] == "reasoning"]
    (result,) = [m["id"] for m in held if m["role"] == "tool"]
    assert reasoning.endswith(".r0") and result.endswith(".result"), held
    assert any(e.get("messageId") == result for e in first)  # (the live id too)
    for n, hostile in enumerate((reasoning, result), start=3):
        await run_(run_input("h", *held, user(f"text{n}", hostile), runId=f"r{n}"))
        held = _snapshot(await run_(run_input("h", runId=f"s{n}")))
        assert _repeated(held) == [], held
        (mine,) = [m for m in held if m.get("content") == f"text{n}"]
        assert mine["id"] == snapshot_id(hostile) != hostile
    return [reasoning, result]


async def test_user_messages_named_as_a_reasoning_or_result_message_get_distinct_snapshot_ids():
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        hostile = await hostile_user_ids(partial(run, server))
        record = await server.host.store.load("h")
    assert record is not None
    stored = [m.id for m in record.messages if isinstance(m, UserMessage)]
    assert stored == ["m1", *hostile]  # stored as the client named them


async def test_a_client_holding_the_escaped_ids_is_not_resynced_nor_its_message_run_again():
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await hostile_user_ids(partial(run, server))
        held = _snapshot(await run(server, run_input("h", runId="s9")))
        asked = len(requests)
        # the snapshot sent back, its last message the escaped user message: no new turn
        again = await run(server, run_input("h", *held, runId="r9"))
        assert len(requests) == asked
        assert _snapshot(again) == held
        # a new message on top of it: the client holds the thread, nothing to resync
        more = await run(server, run_input("h", *held, user("more", "m10"), runId="r10"))
    assert [e for e in more if e["type"] == "MESSAGES_SNAPSHOT"] == []
    assert len(requests) == asked + 2


def test_a_run_id_that_names_the_answer_as_a_derived_id_is_not_the_turns():
    assert _queue_turn_id("r1") == "r1"
    assert _queue_turn_id("r1.r0") is None  # msg_r1.r0: run r1's reasoning message
    assert _queue_turn_id("r1.s0.call_0.result") is None  # run r1's call_0 result
    assert _queue_turn_id("r1.rx") == "r1.rx"
    assert client_turn_id({"turnId": "t1.r2"}) is None
    assert client_turn_id({"turnId": "t1"}) == "t1"


def test_the_snapshot_id_reads_back_to_the_stored_id():
    for stored in ("m1", "a.r0", "a.b.s0.c.result", "x%2Er0", "plain.dotted"):
        assert stored_message_id(snapshot_id(stored)) == stored
    assert snapshot_id("plain.dotted") == "plain.dotted"  # (not a derived shape: as it is)
    assert stored_message_id("x%2Ey") == "x%2Ey"  # (not an escape snapshot_id makes)


_id = st.text(alphabet="ab.r0s%_", min_size=1, max_size=10)


@given(st.lists(_id, max_size=4), _id)
def test_a_snapshots_ids_are_distinct_whatever_the_user_ids(names: list[str], assistant: str):
    """Any user ids, among them the assistant's derived ones (stored ids are distinct:
    the runner gives a held id a new one); the assistant's id as the runtime or a run
    id checked by ``_queue_turn_id`` makes it (no derived shape)."""
    assistant = f"msg_{assistant}"
    if snapshot_id(assistant) != assistant:
        return
    derived = [
        reasoning_id(assistant, 0),
        reasoning_id(assistant, 1),
        result_message_id(assistant, 0, "c"),
    ]
    ids = list(dict.fromkeys([*derived, *names]))
    if assistant in ids:
        ids.remove(assistant)
    reply = AssistantMessage(
        id=assistant,
        content=(
            ReasoningPart(text="x", step=0),
            ReasoningPart(text="y", step=0),
            ToolCallPart(tool_call_id="c", tool_name="lookup", input={}, step=0),
        ),
    )
    history = [
        reply,
        ToolMessage(tool_call_id="c", tool_name="lookup", step=0, output="v"),
        *(UserMessage(content="u", id=i) for i in ids),
    ]
    assert _repeated(agui_messages(history)) == []
