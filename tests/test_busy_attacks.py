"""Busy sessions attacked (docs/busy.md): floods, races and odd
values a careless or hostile client sends to a session whose turn runs."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing

from actors.providers.scripted import Sleep
from actors.stores import SQLiteStore
from runtime import Host, SessionBusy
from runtime.busy import INTERRUPTED_BY_NEW
from runtime.errors import TurnWithdrawn
from runtime.messages import UserMessage
from tests.support.redis import require_redis
from tests.test_busy import Script, agent_with, held, holding
from tests.test_busy_web import agent_of, post
from tests.test_frontend import LIMIT, deployment, slow_agent, wait_for_turn
from tests.test_frontend import body as worker_body
from tests.test_web_http import body
from tests.web.harness import wait_idle, web_server


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


class WaiterSteps(trio.abc.Instrument):
    """How many times each task named ``waiter-*`` ran a step."""

    def __init__(self) -> None:
        self.steps: Counter[str] = Counter()

    def before_task_step(self, task: Any) -> None:
        if task.name.startswith("waiter-"):
            self.steps[task.name] += 1


@pytest.mark.parametrize("on_busy", ["enqueue", "interrupt"])
async def test_a_flood_of_queued_messages_wakes_each_waiter_a_bounded_number_of_times(on_busy):
    # Every change of the session (a turn starting or ending) woke every queued caller,
    # which looked, saw it was not its turn, and slept again: n queued messages cost
    # n^2 wake-ups (ten thousand: 10^8, minutes of the one thread all sessions' turns
    # run on). Only the queue's head can start: only it is woken.
    n = 150
    script = Script(holding(), *[["done"]] * (n + 1))
    instrument = WaiterSteps()
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, on_busy), session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "first")
            await held["open"].wait()
            trio.lowlevel.add_instrument(instrument)
            for i in range(n):
                nursery.start_soon(session.run, f"m{i}", name=f"waiter-{i}")
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
        trio.lowlevel.remove_instrument(instrument)
        users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert users[0] == "first"  # (the tasks' start order is Trio's: not the order started)
    assert sorted(users[1:]) == sorted(f"m{i}" for i in range(n))  # every message, once
    assert len(instrument.steps) == n
    assert max(instrument.steps.values()) < 40, instrument.steps.most_common(3)
    assert session.queued == 0 and session.interrupting == 0


async def test_a_host_closing_with_many_queued_messages_refuses_every_one_and_stores_none(
    tmp_path,
):
    # Only the queue's head is woken now: each one refused must wake the next.
    script = Script(holding(), ["never"])
    refused: list[str] = []
    path = str(tmp_path / "s.db")

    async def send(session: Any, text: str) -> None:
        try:
            await session.run(text)
        except SessionBusy:
            refused.append(text)

    async with trio.open_nursery() as nursery:
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(agent_with(script, "enqueue"), session_id="s")
            nursery.start_soon(session.run, "first")
            await held["open"].wait()
            for i in range(20):
                nursery.start_soon(send, session, f"m{i}")
            await trio.testing.wait_all_tasks_blocked()
            assert session.queued == 20
    assert sorted(refused) == sorted(f"m{i}" for i in range(20))
    store = await SQLiteStore.open(path)
    try:
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None
    assert [m.text for m in record.messages if isinstance(m, UserMessage)] == ["first"]


async def test_an_interrupting_message_behind_an_enqueued_one_cuts_that_one_too():
    # The newest message wins: a turn that starts while a message that interrupts waits
    # behind it is cut before its model call, whatever its own strategy was.
    script = Script(holding(), ["third done"])
    results: dict = {}

    async def send(session: Any, text: str, on_busy: str) -> None:
        async with session.stream(text, on_busy=on_busy) as out:
            async for _ in out:
                pass
        results[text] = out.result

    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "reject"), session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, session, "first", "reject")
            await held["open"].wait()
            nursery.start_soon(send, session, "second", "enqueue")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(send, session, "third", "interrupt")
    assert [results[t].finish_reason for t in ("first", "second")] == ["aborted", "aborted"]
    assert results["second"].abort_reason == INTERRUPTED_BY_NEW
    assert results["third"].text == "third done"
    assert len(script.requests) == 2  # the second turn never called the model
    users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert users == ["first", "second", "third"]


# -- reject over HTTP: what the 409 says ------------------------------------------------


async def test_the_409_names_the_running_turn_and_how_to_wait_for_it_or_stop_it():
    # It said only "already running a turn": a client could neither follow the turn nor
    # stop it, so it retried blind, in a loop.
    script = Script(holding(), ["never"], ["second done"])
    async with (
        web_server(agent_of(script)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, client, "s", "first", replies)
            await held["open"].wait()
            running = server.host.sessions["s"].current.turn_id
            refused = [await client.post("/api/chat", json=body("s", "second")) for _ in range(20)]
            stop = await client.post("/api/chat/s/stop", json={})
        await wait_idle(server, "s")
        again = await client.post("/api/chat", json=body("s", "second"), timeout=30)
        stored = (await client.get("/api/sessions/s")).json()
    assert {r.status_code for r in refused} == {409}
    answer = refused[0].json()
    assert answer["turnId"] == running and answer["sessionId"] == "s"
    assert running in answer["error"]
    assert "GET /api/chat/s/stream" in answer["error"]
    assert "POST /api/chat/s/stop" in answer["error"]
    assert stop.status_code == 202
    assert again.status_code == 200
    users = [m["content"] for m in stored["messages"] if m["role"] == "user"]
    assert users == ["first", "second"]  # the twenty refused sends stored nothing


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_the_worker_deployments_409_names_the_running_turn(pg_url, redis_url):
    async with deployment(pg_url, redis_url, slow_agent(60), on_busy="reject") as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def first() -> None:
                    await client.post("/api/chat", json=worker_body("w1", "one", "u1"))

                nursery.start_soon(first)
                running = await wait_for_turn(d.queue, "w1", "running")
                refused = await client.post("/api/chat", json=worker_body("w1", "two", "u2"))
                stop = await client.post("/api/chat/w1/stop", json={})
        turns = await d.queue.turns("w1")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert running.turn_id in error and "POST /api/chat/w1/stop" in error
    assert stop.status_code == 202
    assert [t.input for t in turns] == ["one"]


# -- a resend while the session is busy ---------------------------------------------------


def ui_body(session_id: str, text: str, message_id: str) -> dict:
    part = {"type": "text", "text": text}
    message = {"id": message_id, "role": "user", "parts": [part]}
    return {"id": session_id, "messages": [message], "trigger": "submit-message"}


@pytest.mark.parametrize("on_busy", ["enqueue", "interrupt", "steer"])
async def test_a_message_sent_again_while_its_turn_runs_is_refused_not_stored_twice(on_busy):
    # A client that retries its POST (a timeout, a double click) while its turn runs: the
    # app skipped its resend check while busy, so the retry ran as a second turn
    # (enqueue), cut its own turn and ran again (interrupt) or joined its own turn as a
    # second copy (steer): two user messages with one id, the model asked twice.
    script = Script(holding(), ["first done"], ["again"])
    async with (
        web_server(agent_of(script), on_busy=on_busy) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}

        async def send(key: str) -> None:
            replies[key] = await client.post(
                "/api/chat", json=ui_body("s", "first", "u1"), timeout=30
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "first")
            await held["open"].wait()
            await send("retry")
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert replies["first"].status_code == 200
    assert replies["retry"].status_code == 409
    assert "'u1'" in replies["retry"].json()["error"]
    assert "POST /api/chat/s/stop" in replies["retry"].json()["error"]
    users = [m["id"] for m in stored["messages"] if m["role"] == "user"]
    assert users == ["u1"]
    assert len(script.requests) == 2  # the first turn's two model calls, no more


async def test_a_queued_message_sent_again_is_refused_and_a_new_one_still_queues():
    script = Script(holding(), ["1 done"], ["2 done"], ["3 done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "enqueue"), session_id="s")
        outcomes: dict = {}

        async def send(key: str, text: str, message_id: str) -> None:
            try:
                async with session.stream(text, user_message_id=message_id) as out:
                    async for _ in out:
                        pass
                outcomes[key] = out.result.text
            except SessionBusy as exc:
                outcomes[key] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "1", "one", "m1")
            await held["open"].wait()
            nursery.start_soon(send, "2", "two", "m2")
            await trio.testing.wait_all_tasks_blocked()
            await send("2 again", "two", "m2")  # waits already
            await send("1 again", "one", "m1")  # runs now
            nursery.start_soon(send, "3", "three", "m3")
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
    assert isinstance(outcomes["2 again"], SessionBusy) and "waits" in str(outcomes["2 again"])
    assert isinstance(outcomes["1 again"], SessionBusy) and "running" in str(outcomes["1 again"])
    assert (outcomes["1"], outcomes["2"], outcomes["3"]) == ("1 done", "2 done", "3 done")
    ids = [m.id for m in session.messages if isinstance(m, UserMessage)]
    assert ids == ["m1", "m2", "m3"]


# -- a steered message the turn hands back, and the messages after it --------------------


async def send_as(session: Any, text: str, results: dict, on_busy: str | None = None) -> None:
    async with session.stream(text, on_busy=on_busy) as out:
        async for _ in out:
            pass
    results[text] = out


async def test_an_interrupt_after_a_steer_answers_the_interrupt_the_newest_message():
    # The steered message, handed back by the turn the interrupt cut, queued behind the
    # interrupting message that arrived after it: that one then started with an older
    # message waiting, was cut as if a newer one waited, and the older message answered.
    script = Script(holding(), ["answer"])
    results: dict = {}
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_as, session, "first", results)
            await held["open"].wait()
            nursery.start_soon(send_as, session, "steer me", results)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(send_as, session, "stop, do this", results, "interrupt")
    cut = [results[t].result for t in ("first", "steer me")]
    assert [(r.finish_reason, r.abort_reason) for r in cut] == [("aborted", INTERRUPTED_BY_NEW)] * 2
    assert not results["steer me"].steered
    assert results["stop, do this"].result.text == "answer"
    users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert users == ["first", "steer me", "stop, do this"]  # kept, in arrival order
    assert len(script.requests) == 2  # the steered message's turn never called the model


async def test_a_steered_message_handed_back_runs_before_a_message_that_came_after_it(
    autojump_clock,
):
    script = Script([Sleep(10), "first done"], ["steered done"], ["later done"])
    results: dict = {}
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_as, session, "first", results)
            await trio.sleep(1)  # the last step streams: no boundary will take a steer
            nursery.start_soon(send_as, session, "steer me", results)
            await trio.sleep(1)
            nursery.start_soon(send_as, session, "later", results, "enqueue")
    texts = {t: results[t].result.text for t in ("first", "steer me", "later")}
    assert texts == {"first": "first done", "steer me": "steered done", "later": "later done"}
    users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert users == ["first", "steer me", "later"]


# -- how many messages may wait for one session's turn (embedded) -----------------------


async def waiting(session: Any, count: int) -> None:
    """Until ``count`` messages wait for the session's running turn (at most 10 s)."""
    with trio.fail_after(10):
        while True:
            if session.waiting_inputs >= count:
                return
            await trio.sleep(0.01)


@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])
async def test_messages_over_the_sessions_cap_are_refused_429_and_wait_nowhere(on_busy):
    # The embedded app queued every message for a busy session, without a bound (serve's
    # --max-queued-per-session was a front end's option, ignored here): one client held
    # thousands of turns (or steered messages) waiting, each to run a model call.
    script = Script(holding(), *[["done"]] * 4)
    async with (
        web_server(agent_of(script), on_busy=on_busy, max_queued_per_session=3) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}

        async def send(key: str) -> None:
            replies[key] = await client.post(
                "/api/chat", json=ui_body("s", key, f"id-{key}"), timeout=30
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "first")
            await held["open"].wait()
            session = server.host.sessions["s"]
            for key in ("a", "b", "c"):
                nursery.start_soon(send, key)
            await waiting(session, 3)
            await send("over")
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert replies["over"].status_code == 429
    assert replies["over"].headers["retry-after"] == "5"
    assert "POST /api/chat/s/stop" in replies["over"].json()["error"]
    assert {replies[k].status_code for k in "abc"} <= {200, 202}
    users = sorted(m["content"] for m in stored["messages"] if m["role"] == "user")
    assert users == ["a", "b", "c", "first"]


def test_serve_gives_the_embedded_app_its_per_session_cap():
    from runtime.app.web.serve import _embedded_cap, add_serve_arguments

    parser = add_serve_arguments(argparse.ArgumentParser())
    assert _embedded_cap(parser.parse_args([])) == {}  # the app's default, 100
    assert _embedded_cap(parser.parse_args(["--max-queued-per-session", "7"])) == {
        "max_queued_per_session": 7
    }
    assert _embedded_cap(parser.parse_args(["--max-queued-per-session", "off"])) == {
        "max_queued_per_session": None
    }


# -- a regenerate that waited -------------------------------------------------------------


@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])
async def test_a_regenerate_that_waited_for_a_later_turn_cuts_nothing(on_busy):
    # The client regenerates the answer to u1 while the turn of its next message u2 runs
    # (another tab, a stale page). It waited, then cut the last turn, which was u2's: the
    # message "two" and its answer vanished, and u1 was stored a second time. Idle, the
    # same request is a 409: u1 is not the last user message.
    script = Script(["one done"], holding(), ["two done"], ["one again"])
    async with (
        web_server(agent_of(script), on_busy=on_busy) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        await client.post("/api/chat", json=ui_body("s", "one", "u1"), timeout=30)
        two = ui_body("s", "two", "u2")
        two["messages"].insert(0, ui_body("s", "one", "u1")["messages"][0])
        regenerate = {**ui_body("s", "one", "u1"), "trigger": "regenerate-message"}

        async def send(key: str, sent: dict) -> None:
            replies[key] = await client.post("/api/chat", json=sent, timeout=30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "two", two)
            await held["open"].wait()
            nursery.start_soon(send, "regenerate", regenerate)
            await waiting(server.host.sessions["s"], 1)
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert replies["two"].status_code == 200
    assert replies["regenerate"].status_code == 409
    assert "'u1' is no longer the last user message" in replies["regenerate"].json()["error"]
    users = [(m["id"], m["content"]) for m in stored["messages"] if m["role"] == "user"]
    assert users == [("u1", "one"), ("u2", "two")]
    assert len(script.requests) == 3  # "one", and the two steps of "two"


# -- a stop naming a queued message -------------------------------------------------------


async def test_a_stop_naming_a_queued_message_takes_it_out_and_the_running_turn_goes_on():
    # POST /api/chat/{id}/stop stopped only the running turn: a message waiting behind
    # it (enqueue) could be stopped only by its client hanging up, while a front end's
    # stop cancels a queued turn. Named (its client's id, or its turn id), it is taken out
    # of the queue: its client's stream ends with an abort, nothing of it is stored, the
    # running turn and the other waiting messages go on.
    script = Script(holding(), ["first done"], ["third done"])
    async with (
        web_server(agent_of(script), on_busy="enqueue") as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}

        async def send(key: str, sent: dict) -> None:
            replies[key] = await client.post("/api/chat", json=sent, timeout=30)

        session = server.host.sessions
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "first", ui_body("s", "first", "u1"))
            await held["open"].wait()
            nursery.start_soon(send, "second", ui_body("s", "second", "u2"))
            await waiting(session["s"], 1)
            nursery.start_soon(send, "third", ui_body("s", "third", "u3"))
            await waiting(session["s"], 2)
            nursery.start_soon(send, "fourth", ui_body("s", "fourth", "u4"))
            await waiting(session["s"], 3)
            fourth = session["s"].waiting_stream(message_id="u4", turn_id=None).turn_id
            unknown = await client.post("/api/chat/s/stop", json={"messageId": "u9"})
            stop = await client.post("/api/chat/s/stop", json={"messageId": "u2"})
            by_turn = await client.post("/api/chat/s/stop", json={"turnId": fourth})
            with trio.fail_after(LIMIT):
                while "second" not in replies or "fourth" not in replies:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert session["s"].current is not None  # the running turn was not stopped
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert unknown.status_code == 204  # names no waiting nor running message: stops nothing
    assert stop.status_code == 202 and stop.json()["queued"] is True
    assert by_turn.status_code == 202 and by_turn.json()["turn_id"] == fourth
    for stopped in ("second", "fourth"):
        assert replies[stopped].status_code == 200
        assert [line for line in replies[stopped].text.split("\n\n") if line] == [
            'data: {"type":"abort","reason":"stopped by user"}',
            "data: [DONE]",
        ]
    users = [m["content"] for m in stored["messages"] if m["role"] == "user"]
    assert users == ["first", "third"]
    assert len(script.requests) == 3  # the two steps of "first", and "third"


@pytest.mark.parametrize("stream", [True, False])
async def test_a_stopped_queued_openai_request_gets_openais_abort_not_a_409(stream):
    # An OpenAI request waiting behind the session's running turn, taken out of the
    # queue by a stop, was answered with the AI SDK endpoint's 409 JSON (streamed) or
    # a 500 (whole): now as a turn stopped while it ran is, in OpenAI's shape (an
    # error event and [DONE]; a 503 error object, code "aborted"). Nothing is stored.
    script = Script(holding(), ["first done"])
    async with (
        web_server(agent_of(script, "enqueue"), protocols=("ai-sdk", "openai")) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        replies: dict = {}

        async def ask() -> None:
            replies["openai"] = await client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "second"}]}
                | ({"stream": True} if stream else {}),
                headers={"X-Axon-Session": "s"},
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, replies, "first", ui_body("s", "first", "u1"))
            await held["open"].wait()
            nursery.start_soon(ask)
            session = server.host.sessions["s"]
            await waiting(session, 1)
            queued = session.queue_head.turn_id
            stop = await client.post("/api/chat/s/stop", json={"turnId": queued})
            with trio.fail_after(LIMIT):
                while "openai" not in replies:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert stop.status_code == 202 and stop.json()["queued"] is True
    reply = replies["openai"]
    error = {
        "message": "the turn was cut off: stopped by user",
        "type": "server_error",
        "param": None,
        "code": "aborted",
    }
    if stream:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert [b for b in reply.text.split("\n\n") if b] == [
            "data: " + json.dumps({"error": error}, separators=(",", ":")),
            "data: [DONE]",
        ]
    else:
        assert reply.status_code == 503 and reply.json() == {"error": error}
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == ["first"]


async def post_into(client: httpx.AsyncClient, into: dict, key: str, sent: dict) -> None:
    into[key] = await client.post("/api/chat", json=sent, timeout=30)


# -- a stop naming a regenerate's answer, or a message waiting to be steered in -----------


def _regenerate(session_id: str, text: str, message_id: str, answer_id: str) -> dict:
    """The AI SDK's ``regenerate`` of ``answer_id`` (the answer to ``message_id``)."""
    return {**ui_body(session_id, text, message_id), "trigger": "regenerate-message",
            "messageId": answer_id}  # fmt: skip


async def _last_answer(client: httpx.AsyncClient, session_id: str) -> str:
    stored = (await client.get(f"/api/sessions/{session_id}")).json()
    return [m["id"] for m in stored["messages"] if m["role"] == "assistant"][-1]


async def test_a_stop_naming_the_answer_a_queued_regenerate_replaces_takes_it_out():
    # The AI SDK's regenerate names the answer it replaces (``messageId``), and so does a
    # stop of it; the app matched a stop's messageId against user messages only, so the
    # waiting regenerate was not found (204) and ran when its turn came.
    script = Script(["one done"], holding(), ["two done"])
    async with (
        web_server(agent_of(script), on_busy="enqueue") as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        await client.post("/api/chat", json=ui_body("s", "one", "u1"), timeout=30)
        answer = await _last_answer(client, "s")
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, replies, "two", ui_body("s", "two", "u2"))
            await held["open"].wait()
            regenerate = _regenerate("s", "one", "u1", answer)
            nursery.start_soon(post_into, client, replies, "regenerate", regenerate)
            await waiting(server.host.sessions["s"], 1)
            stop = await client.post("/api/chat/s/stop", json={"messageId": answer})
            with trio.fail_after(LIMIT):
                while "regenerate" not in replies:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert server.host.sessions["s"].current is not None  # "two" goes on
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert stop.status_code == 202 and stop.json()["queued"] is True
    assert [line for line in replies["regenerate"].text.split("\n\n") if line] == [
        'data: {"type":"abort","reason":"stopped by user"}',
        "data: [DONE]",
    ]
    assert replies["two"].status_code == 200
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == ["one", "two"]
    assert len(script.requests) == 3  # "one", and the two steps of "two"


async def test_a_stop_naming_the_answer_a_running_regenerate_replaces_stops_it():
    script = Script(["one done"], holding(), ["never"])
    async with (
        web_server(agent_of(script), on_busy="enqueue") as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        await client.post("/api/chat", json=ui_body("s", "one", "u1"), timeout=30)
        answer = await _last_answer(client, "s")
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            regenerate = _regenerate("s", "one", "u1", answer)
            nursery.start_soon(post_into, client, replies, "regenerate", regenerate)
            await held["open"].wait()
            stop = await client.post("/api/chat/s/stop", json={"messageId": answer})
            held["release"].set()  # (a turn not stopped ends on its own: no hang)
        await wait_idle(server, "s")
    assert stop.status_code == 202 and stop.json()["turn_id"]
    events = [line for line in replies["regenerate"].text.split("\n\n") if line]
    assert 'data: {"type":"abort","reason":"stopped by user"}' in events
    assert len(script.requests) == 2  # "one", and the regenerate's step it stopped in


async def test_a_stop_naming_a_message_waiting_to_be_steered_in_takes_it_out():
    # Under steer a message waits for the running turn's next step boundary; a stop
    # naming it found it in no queue (204) and the turn took it in anyway. Now it is
    # taken out before the turn takes it: its POST ends with abort, the model never sees
    # it, nothing of it is stored, and the running turn goes on untouched.
    script = Script(holding(), ["first done"])
    async with (
        web_server(agent_of(script), on_busy="steer") as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        session = server.host.sessions
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, replies, "first", ui_body("s", "first", "u1"))
            await held["open"].wait()
            nursery.start_soon(post_into, client, replies, "second", ui_body("s", "second", "u2"))
            await waiting(session["s"], 1)
            stop = await client.post("/api/chat/s/stop", json={"messageId": "u2"})
            with trio.fail_after(LIMIT):
                while "second" not in replies:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert session["s"].current is not None  # the running turn was not stopped
            assert session["s"].waiting_inputs == 0
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert stop.status_code == 202 and stop.json()["queued"] is True
    assert [line for line in replies["second"].text.split("\n\n") if line] == [
        'data: {"type":"abort","reason":"stopped by user"}',
        "data: [DONE]",
    ]
    assert "finish" in replies["first"].text and "abort" not in replies["first"].text
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == ["first"]
    assert len(script.requests) == 2
    assert "second" not in str(script.requests[1].messages)  # the model never saw it


async def test_a_stop_naming_a_message_the_running_turn_took_in_stops_that_turn():
    # Under steer the running turn took "second" in at a step boundary: the rest of the
    # turn is its answer (its client shows it so), but a stop naming it found it neither
    # waiting nor the turn's own message: 204, and the turn ran on to its end. It is the
    # turn's input now: the stop stops the turn (saved, marked interrupted), as a stop
    # naming the turn's first message does.
    script = Script(holding("H1"), holding("H2"), ["never"])
    async with (
        web_server(agent_of(script), on_busy="steer") as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        session = server.host.sessions
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, replies, "first", ui_body("s", "first", "u1"))
            await held["open"].wait()
            nursery.start_soon(post_into, client, replies, "second", ui_body("s", "second", "u2"))
            await waiting(session["s"], 1)
            first = held["release"]
            held["open"], held["release"] = trio.Event(), trio.Event()
            first.set()  # the step ends; the next one takes "second" in and holds
            await held["open"].wait()
            running = session["s"].current.turn_id
            stop = await client.post("/api/chat/s/stop", json={"messageId": "u2"})
            with trio.move_on_after(5):  # (before: it ran until released)
                while "first" not in replies:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert stop.status_code == 202 and stop.json() == {"turn_id": running}
    assert 'data: {"type":"abort","reason":"stopped by user"}' in replies["first"].text
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == [
        "first",
        "second",
    ]
    assert len(script.requests) == 2  # "never" was not asked for


# -- named stops and a long queue, another session's queue ------------------------------


async def _queue_behind_a_held_turn(
    nursery: trio.Nursery, session: Any, count: int, into: dict
) -> None:
    """Run "first" (held in its tool) and queue ``count`` messages ``m<i>`` (user message
    ids ``u<i>``) behind it, in that order; each one's outcome into ``into``."""

    async def send(i: int) -> None:
        try:
            async with session.stream(f"m{i}", user_message_id=f"u{i}") as out:
                await out.collect()
            into[i] = out.result
        except TurnWithdrawn as exc:
            into[i] = exc

    nursery.start_soon(session.run, "first")
    await held["open"].wait()
    for i in range(count):
        nursery.start_soon(send, i)
        await waiting(session, i + 1)  # (arrival order is the order sent)


async def test_a_stop_of_the_50th_of_100_queued_messages_takes_out_that_one_alone():
    script = Script(holding(), *[["done"]] * 101)
    outcomes: dict = {}
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "enqueue"), session_id="s")
        async with trio.open_nursery() as nursery:
            await _queue_behind_a_held_turn(nursery, session, 100, outcomes)
            fiftieth = session.waiting_stream(message_id="u49", turn_id=None)
            stopped = host.stop_named("s", message_id="u49", turn_id=None, reason="stopped")
            again = host.stop_named("s", message_id="u49", turn_id=None, reason="stopped")
            await trio.testing.wait_all_tasks_blocked()
            left = session.waiting_inputs
            held["release"].set()
        users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert fiftieth is not None and stopped == (fiftieth.turn_id, True)
    assert again == stopped  # a stop sent twice (before the first one's wake): the same answer
    assert left == 99
    assert isinstance(outcomes[49], TurnWithdrawn)
    assert users == ["first", *(f"m{i}" for i in range(100) if i != 49)]  # in order
    assert len(script.requests) == 2 + 99


async def test_a_stop_naming_a_queued_message_of_another_session_changes_nothing():
    script = Script(holding(), ["done"], ["done"])
    outcomes: dict = {}
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "enqueue"), session_id="s")
        await host.open_session(agent_with(script, "enqueue"), session_id="t")
        async with trio.open_nursery() as nursery:
            await _queue_behind_a_held_turn(nursery, session, 1, outcomes)
            queued = session.waiting_stream(message_id="u0", turn_id=None)
            assert queued is not None
            by_message = host.stop_named("t", message_id="u0", turn_id=None, reason="x")
            by_turn = host.stop_named("t", message_id=None, turn_id=queued.turn_id, reason="x")
            unknown = host.stop_named("nowhere", message_id="u0", turn_id=None, reason="x")
            assert session.waiting_inputs == 1 and session.current is not None
            held["release"].set()
        users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert (by_message, by_turn, unknown) == (None, None, None)
    assert users == ["first", "m0"] and outcomes[0].text == "done"


async def test_a_stop_that_overtakes_its_queued_message_on_one_host_takes_it_out(monkeypatch):
    # The client's POST of "two" and its stop naming "two" race on two connections to one
    # host: the stop came while "two" was not in the queue yet (its POST on the way),
    # found nothing (204), and "two" then queued and ran to its answer. The stop is kept,
    # and "two" is taken out as it would wait: nothing of it run or stored.
    from runtime.app.session import TurnStream

    script = Script(holding(), ["first done"], ["never"])
    arrived, go = trio.Event(), trio.Event()
    enter = TurnStream.__aenter__

    async def on_the_way(stream: Any) -> Any:
        if stream.user_message_id == "u2":
            arrived.set()
            await go.wait()
        return await enter(stream)

    monkeypatch.setattr(TurnStream, "__aenter__", on_the_way)
    async with (
        web_server(agent_of(script), on_busy="enqueue") as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, replies, "first", ui_body("s", "first", "u1"))
            await held["open"].wait()
            nursery.start_soon(post_into, client, replies, "second", ui_body("s", "two", "u2"))
            await arrived.wait()
            stop = await client.post("/api/chat/s/stop", json={"messageId": "u2"})
            go.set()
            with trio.move_on_after(5):  # (before: it waited for "first")
                while "second" not in replies:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            left = server.host.sessions["s"].waiting_inputs
            held["release"].set()
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert stop.status_code == 204  # nothing so named here yet
    assert left == 0
    assert [line for line in replies["second"].text.split("\n\n") if line] == [
        'data: {"type":"abort","reason":"stopped by user"}',
        "data: [DONE]",
    ]
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == ["first"]
    assert len(script.requests) == 2  # "never" was not asked for


async def test_a_stop_that_overtakes_the_message_of_an_idle_session_stops_its_turn():
    # No relay, the session idle: the client's stop naming "u1" came before u1's POST,
    # found nothing (204) and was kept, but only a message that would wait asked for
    # it: u1's turn, started at once, ran to its answer.
    script = Script(["never"])
    async with (
        web_server(agent_of(script)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        stop = await client.post("/api/chat/s/stop", json={"messageId": "u1"})
        reply = await client.post("/api/chat", json=ui_body("s", "go", "u1"))
        await wait_idle(server, "s")
        stored = (await client.get("/api/sessions/s")).json()
    assert stop.status_code == 204
    assert '"type":"abort","reason":"stopped by user"' in reply.text
    assert "never" not in reply.text and script.requests == []
    assert [m["role"] for m in stored["messages"]][:1] == ["user"]  # kept, as a stop after
    assert not server.host.held_stops  # used


async def test_a_stop_that_overtakes_a_regenerate_naming_the_answer_it_replaces_stops_it():
    # "go" answered; the client regenerates that answer (the AI SDK's messageId: the
    # answer's id, by which a stop names a regenerate) and presses Stop, whose POST
    # overtakes the regenerate's: kept, but no regenerate asked for it (a stop naming
    # the user message it carries may be a late stop of the turn before), so the
    # regenerate ran to its answer. The answer's id names no turn before it.
    script = Script(["first"], ["never"])
    async with (
        web_server(agent_of(script)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        first = await client.post("/api/chat", json=ui_body("s", "go", "u1"))
        answer = orjson.loads(first.text.split("data: ", 2)[1].split("\n")[0])["messageId"]
        stop = await client.post("/api/chat/s/stop", json={"messageId": answer})
        again = {**ui_body("s", "go", "u1"), "trigger": "regenerate-message", "messageId": answer}
        reply = await client.post("/api/chat", json=again)
        await wait_idle(server, "s")
    assert stop.status_code == 204
    assert '"type":"abort","reason":"stopped by user"' in reply.text
    assert "never" not in reply.text and len(script.requests) == 1


async def test_a_stop_kept_for_one_session_takes_out_no_message_of_another():
    script = Script(holding(), ["first done"], ["done"])
    outcomes: dict = {}
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "enqueue"), session_id="s")
        host.hold_stop("t", message_id="u0", turn_id=None, reason="stopped")
        async with trio.open_nursery() as nursery:
            await _queue_behind_a_held_turn(nursery, session, 1, outcomes)
            held["release"].set()
        assert host.stopped_before("t", "u0", "turn") == "stopped"  # still kept for "t"
    assert outcomes[0].text == "done"


async def test_a_kept_stop_is_used_once_and_dropped_after_a_minute(autojump_clock):
    # (HeldStops' bounds: tests/test_held_stops.py; here the host's own clock.)
    async with Host.open(log_tap=False) as host:
        host.hold_stop("s", message_id="u1", turn_id=None, reason="r")
        assert host.stopped_before("s", "u1", "t1") == "r"
        assert host.stopped_before("s", "u1", "t1") is None  # used once
        host.hold_stop("s", message_id="u3", turn_id=None, reason="r")
        await trio.sleep(host.held_stops.held_for + 1)
        assert host.stopped_before("s", "u3", "t3") is None


async def test_a_stop_naming_a_ten_megabyte_id_is_not_kept():
    # A careless (or hostile) client's stop naming an id of 10 MB that nothing has:
    # 204 and kept for a minute, 1024 of them a host (and every host of a relay): 10 GB.
    # Not kept past HELD_STOP_ID_MAX characters, as the worker deployment's table.
    huge = "u" * (10 << 20)
    async with (
        web_server(agent_of(Script())) as server,
        httpx.AsyncClient(base_url=server.url, timeout=60) as client,
    ):
        by_message = await client.post("/api/chat/s/stop", json={"messageId": huge})
        by_turn = await client.post("/api/chat/s/stop", json={"turnId": huge})
        kept = len(server.host.held_stops)
    assert (by_message.status_code, by_turn.status_code) == (204, 204)
    assert kept == 0


async def test_a_stop_sent_twice_before_its_message_stops_it_once_and_keeps_nothing():
    script = Script(["second"])
    async with (
        web_server(agent_of(script)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        stops = [await client.post("/api/chat/s/stop", json={"messageId": "u1"}) for _ in "ab"]
        reply = await client.post("/api/chat", json=ui_body("s", "go", "u1"))
        await wait_idle(server, "s")
        left = len(server.host.held_stops)
        after = await client.post("/api/chat", json=ui_body("s", "next", "u2"))
    assert [s.status_code for s in stops] == [204, 204]
    assert '"type":"abort","reason":"stopped by user"' in reply.text
    assert left == 0 and "abort" not in after.text
    assert len(script.requests) == 1  # the second message's: not stopped by the repeat


async def test_a_stop_naming_another_sessions_running_message_leaves_it_running():
    script = Script(holding(), ["first done"])
    out: dict = {}
    async with (
        web_server(agent_of(script)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):

        async def post() -> None:
            out["reply"] = await client.post("/api/chat", json=ui_body("s", "go", "u1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            await held["open"].wait()
            stop = await client.post("/api/chat/t/stop", json={"messageId": "u1"})
            held["release"].set()
    assert stop.status_code == 204
    assert '"finishReason":"stop"' in out["reply"].text and "abort" not in out["reply"].text
    assert len(script.requests) == 2  # it ran on to its answer


async def test_a_stop_naming_a_turn_not_there_yet_stops_the_regenerate_that_has_that_id():
    # A regenerate (or an edit) carries a message id the turn before had: a stop naming
    # it cannot be told from a late one. Its turn id, when the client chose it (an AG-UI
    # run's runId), names it alone: kept, and it stops that turn as it starts.
    script = Script(["first"], ["never"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "enqueue"), session_id="s")
        async with session.stream("go", user_message_id="u1") as out:
            await out.collect()
        host.hold_stop("s", message_id=None, turn_id="turn_again", reason="stopped by user")
        async with session.stream(
            "go", regenerate=True, user_message_id="u1", turn_id="turn_again"
        ) as out:
            chunks = await out.collect()
    assert any(getattr(c, "reason", None) == "stopped by user" for c in chunks)
    assert len(script.requests) == 1


async def test_a_stop_naming_the_turn_id_an_ai_sdk_edit_sends_stops_it_before_its_post():
    # The AI SDK's /api/chat sends no turn id; an edit carries the id u1's turn had, so a
    # stop naming u1 may be that turn's late one. The body's ``turnId`` (sent by
    # ``prepareSendMessagesRequest``) names the edit's turn alone: a stop before it lands.
    script = Script(["first"], ["never"])
    async with (
        web_server(agent_of(script)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        first = await client.post("/api/chat", json=ui_body("s", "go", "u1"))
        stop = await client.post("/api/chat/s/stop", json={"turnId": "t_edit"})
        edit = await client.post(
            "/api/chat", json={**ui_body("s", "went", "u1"), "turnId": "t_edit"}
        )
    assert "first" in first.text and stop.status_code == 204
    assert "stopped by user" in edit.text
    assert "never" not in edit.text and len(script.requests) == 1
