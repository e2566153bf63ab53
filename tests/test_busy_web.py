"""Busy sessions over HTTP (docs/busy.md): ``POST /api/chat`` for a session whose turn
runs answers by the session's strategy: 409, its own stream after the running turn, the
running turn interrupted, or 202 once the running turn took the message (steer)."""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, ConfigurationError, tool
from runtime.app.web.serve import add_serve_arguments
from runtime.busy import INTERRUPTED_BY_NEW
from runtime.events import TurnQueued
from tests.test_busy import Script, hold, holding, look, looking
from tests.test_web_http import body, events
from tests.web.harness import wait_idle, web_server

held: dict[str, trio.Event] = {}


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    from tests import test_busy

    test_busy.held["open"], test_busy.held["release"] = trio.Event(), trio.Event()
    held.update(test_busy.held)


def agent_of(script: Script, on_busy: str = "reject") -> Agent:
    return Agent(
        provider=ScriptedProvider(responder=script),
        tools=[hold, look],
        on_busy=on_busy,  # type: ignore[arg-type]
    )


async def post(client: httpx.AsyncClient, session_id: str, text: str, into: dict) -> None:
    into[text] = await client.post("/api/chat", json=body(session_id, text), timeout=30)


async def test_enqueue_streams_the_second_message_after_the_first_turn():
    script = Script(holding(), ["first done"], ["second done"])
    agent = agent_of(script)
    async with (
        web_server(agent, on_busy="enqueue") as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        queueing = server.host.bus.subscribe([TurnQueued])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, client, "s", "first", replies)
            await held["open"].wait()
            nursery.start_soon(post, client, "s", "second", replies)
            queued = await queueing.inbox.get()
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    first, second = (events(replies[t].content) for t in ("first", "second"))
    assert replies["second"].status_code == 200 and queued.ahead == 1
    assert _text(first) == "first done" and _text(second) == "second done"
    assert [m["role"] for m in stored["ui_messages"]] == ["user", "assistant"] * 2


async def test_interrupt_aborts_the_running_stream_and_answers_the_new_message():
    script = Script(holding(), ["second done"])
    async with (
        web_server(agent_of(script, "interrupt")) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, client, "s", "first", replies)
            await held["open"].wait()
            nursery.start_soon(post, client, "s", "second", replies)
        await wait_idle(server, "s")
    first, second = (events(replies[t].content) for t in ("first", "second"))
    assert [c for c in first if isinstance(c, dict) and c["type"] == "abort"] == [
        {"type": "abort", "reason": INTERRUPTED_BY_NEW}
    ]
    assert _text(second) == "second done"


async def test_steer_answers_202_and_the_running_stream_answers_the_message():
    script = Script(looking(), holding(), ["answer to both"])
    async with (
        web_server(agent_of(script, "steer")) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, client, "s", "first", replies)
            await held["open"].wait()
            nursery.start_soon(post, client, "s", "also this", replies)
            await trio.testing.wait_all_tasks_blocked(0.05)
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    steered = replies["also this"]
    assert steered.status_code == 202
    answer = steered.json()
    assert answer["steered"] is True and answer["messageId"].startswith("u")
    first = events(replies["first"].content)
    assert answer["turnId"] and _text(first) == "answer to both"
    # the running stream shows the steered message live, before the step that sees it
    types = [c["type"] for c in first if isinstance(c, dict)]
    at = types.index("data-steered")
    assert types[at + 1] == "start-step" and types.count("start-step") == 3
    assert types[:at].count("start-step") == 2
    assert first[at] == {
        "type": "data-steered",
        "id": answer["messageId"],
        "data": {
            "messageId": answer["messageId"],
            "text": "also this",
            "step": 2,
            "answerId": f"{first[0]['messageId']}-s2",
        },
        "transient": True,
    }
    roles = [m["role"] for m in stored["ui_messages"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert stored["ui_messages"][2]["id"] == answer["messageId"]


async def test_steer_from_the_client_that_shows_the_turn_streams_the_rest_as_its_answer():
    """A steering body whose message before the new one is the running turn's answer
    (``useChat`` sending while it streams): the running stream ends there (``finish``,
    ``steered``), and the steering POST streams the rest of the turn in a message named
    as stored after the steered message, instead of a 202 while the answer went on
    growing above the message the client had put after it."""
    script = Script(looking(), holding(), ["answer to both"])
    async with (
        web_server(agent_of(script, "steer")) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}

        async def send(key: str, sent: dict) -> None:
            replies[key] = await client.post("/api/chat", json=sent, timeout=30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "first", body("s", "first", message_id="u1"))
            await held["open"].wait()
            (shown,) = server.host.sessions["s"].current.answer_ids
            steer = body("s", "also this", message_id="u2")
            steer["messages"][-2]["id"] = shown  # the answer it shows, so far
            nursery.start_soon(send, "steer", steer)
            await trio.testing.wait_all_tasks_blocked(0.05)
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()["ui_messages"]
    first, rest = events(replies["first"].content), events(replies["steer"].content)
    assert replies["steer"].status_code == 200
    assert [c if c == "[DONE]" else c["type"] for c in first[-3:]] == [
        "data-steered",
        "finish",
        "[DONE]",
    ]
    assert first[-2]["messageMetadata"]["finishReason"] == "steered"
    assert _text(first) == "" and _text(rest) == "answer to both"
    assert rest[0] == {"type": "start", "messageId": f"{shown}-s2"}
    assert rest[-2]["type"] == "finish" and rest[-1] == "[DONE]"
    assert [(m["id"], m["role"]) for m in stored] == [
        ("u1", "user"),
        (shown, "assistant"),
        ("u2", "user"),
        (f"{shown}-s2", "assistant"),
    ]


again = {"open": trio.Event(), "release": trio.Event()}


@tool
async def hold_again() -> str:
    """Wait a second time until the test lets go."""
    again["open"].set()
    await again["release"].wait()
    return "held again"


async def test_a_second_steer_from_that_client_hands_over_the_stream_it_reads_now():
    """The client steers twice, at two boundaries: the first steer's stream (the one it
    reads now) ends at the second, whose stream shows the rest; each answer once."""
    again["open"], again["release"] = trio.Event(), trio.Event()
    script = Script(holding(), [*tool_call("hold_again", {}, tool_call_id="A")], ["answer"])
    agent = Agent(
        provider=ScriptedProvider(responder=script), tools=[hold, hold_again], on_busy="steer"
    )
    async with (
        web_server(agent) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}

        async def send(key: str, sent: dict) -> None:
            replies[key] = await client.post("/api/chat", json=sent, timeout=30)

        def steering(text: str, message_id: str, shown: str) -> dict:
            sent = body("s", text, message_id=message_id)
            sent["messages"][-2]["id"] = shown
            return sent

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "first", body("s", "first", message_id="u1"))
            await held["open"].wait()
            (shown,) = server.host.sessions["s"].current.answer_ids
            nursery.start_soon(send, "second", steering("second", "u2", shown))
            await trio.testing.wait_all_tasks_blocked(0.05)
            held["release"].set()
            await again["open"].wait()
            nursery.start_soon(send, "third", steering("third", "u3", f"{shown}-s1"))
            await trio.testing.wait_all_tasks_blocked(0.05)
            again["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()["ui_messages"]
    first, second, third = (events(replies[k].content) for k in ("first", "second", "third"))
    assert second[0] == {"type": "start", "messageId": f"{shown}-s1"}
    assert third[0] == {"type": "start", "messageId": f"{shown}-s2"}
    finishes = [
        [c["messageMetadata"]["finishReason"] for c in s if c != "[DONE]" and c["type"] == "finish"]
        for s in (first, second, third)
    ]
    assert finishes == [["steered"], ["steered"], ["stop"]]
    assert [_text(s) for s in (first, second, third)] == ["", "", "answer"]
    assert [m["id"] for m in stored] == ["u1", shown, "u2", f"{shown}-s1", "u3", f"{shown}-s2"]


async def test_reject_is_the_default_409():
    script = Script(holding(), ["first done"])
    async with (
        web_server(agent_of(script)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, client, "s", "first", replies)
            await held["open"].wait()
            await post(client, "s", "second", replies)
            held["release"].set()
    assert replies["second"].status_code == 409


def test_serve_takes_a_busy_strategy():
    parser = add_serve_arguments(argparse.ArgumentParser())
    assert parser.parse_args(["--on-busy", "steer"]).on_busy == "steer"
    assert parser.parse_args([]).on_busy is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--on-busy", "later"])


async def test_create_app_refuses_an_unknown_strategy():
    from runtime import Host
    from runtime.app.web.app import create_app

    async with Host.open(log_tap=False) as host:
        with pytest.raises(ConfigurationError, match="on_busy"):
            create_app(host, agent_of(Script()), on_busy="later")  # type: ignore[arg-type]


def _text(chunks: list[Any]) -> str:
    return "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")
