"""Resume and stop through the web app, from a front end that does not run the turn."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.relays import RedisRelay, attach_relay
from runtime import Agent
from runtime.messages import AssistantMessage
from tests.support.redis import require_redis, unique_prefix
from tests.web.harness import wait_idle, web_server

JSON = {"content-type": "application/json"}


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def chat_body(session_id: str, text: str = "go") -> dict[str, Any]:
    return {
        "id": session_id,
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}],
        "trigger": "submit-message",
    }


def sse_events(raw: str) -> list[tuple[str | None, Any]]:
    """``(id, data)`` per SSE event (keep-alive comments skipped)."""
    out: list[tuple[str | None, Any]] = []
    for block in raw.strip().split("\n\n"):
        if block.startswith(":"):
            continue
        event_id, data = None, None
        for line in block.split("\n"):
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((event_id, data if data == "[DONE]" else json.loads(data)))
    return out


async def wait_streaming(client: httpx.AsyncClient, url: str) -> None:
    """Wait until ``GET url`` (a resume endpoint) has a turn to stream (headers only)."""
    with trio.fail_after(10):
        while True:
            async with client.stream("GET", url) as response:
                if response.status_code == 200:
                    return
            await trio.sleep(0.02)


async def wait_for_seq(relay: Any, session_id: str, seq: int) -> None:
    """Wait until the session's streaming turn's relay stream holds ``seq``."""
    with trio.fail_after(10):
        while True:
            turn_id = await relay.active_turn(session_id)
            key = relay.turn_key(turn_id or "")
            last = await relay.client.xrevrange(key, "+", "-", count=1)
            if last:
                fields = last[0].field_values
                if int(fields[b"first"]) + len(json.loads(fields[b"items"])) - 1 >= seq:
                    return
            await trio.sleep(0.01)


@asynccontextmanager
async def two_front_ends(
    url: str, agent: Agent, *, shared_store: bool = False
) -> AsyncIterator[tuple[Any, Any]]:
    """Front end A runs turns (publishing to the relay); B shares only Redis with it, or,
    ``shared_store``, Redis and a SQLite file (as two ``serve`` of one deployment do: a
    resume of a turn that ended asks the store whether its session is still there)."""
    prefix = unique_prefix()
    with tempfile.TemporaryDirectory() as tmp:
        stores = [str(Path(tmp) / "sessions.db")] * 2 if shared_store else [None, None]
        async with (
            RedisRelay.open(url, prefix=prefix) as relay_a,
            RedisRelay.open(url, prefix=prefix) as relay_b,
            web_server(agent, relay=relay_a, store=stores[0]) as a,
            web_server(agent, relay=relay_b, store=stores[1]) as b,
        ):
            await attach_relay(a.host, relay_a)
            yield a, b


async def test_resume_is_204_when_no_turn_runs(redis_url: str) -> None:
    async with two_front_ends(redis_url, Agent(name="a")) as (_, b):
        async with httpx.AsyncClient(base_url=b.url) as client:
            response = await client.get("/api/chat/s1/stream")
    assert response.status_code == 204


async def test_another_front_end_replays_and_resumes_a_running_turn(redis_url: str) -> None:
    agent = Agent(name="a", provider=ScriptedProvider(["one two three four"], delay=0.05))
    async with two_front_ends(redis_url, agent, shared_store=True) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            async with trio.open_nursery() as nursery:
                direct: list[Any] = []

                async def run_on_a() -> None:
                    response = await client.post(f"{a.url}/api/chat", json=chat_body("s1"))
                    direct.extend(sse_events(response.text))

                nursery.start_soon(run_on_a)
                await wait_streaming(client, f"{b.url}/api/chat/s1/stream")
                replay = await client.get(f"{b.url}/api/chat/s1/stream")
            replayed = sse_events(replay.text)
            events = [e for e in replayed if e[1] != "[DONE]"]
            after = events[3][0]
            tail = await client.get(f"{b.url}/api/chat/s1/stream", headers={"last-event-id": after})
            last = {"last-event-id": events[-1][0]}
            done = await client.get(f"{b.url}/api/chat/s1/stream", headers=last)
    assert [d for _, d in replayed] == [d for _, d in direct]  # the same UI stream, from B
    assert [int(i) for i, _ in events] == sorted({int(i) for i, _ in events})
    # By then the turn had ended: a client that left it after seq ``after`` still gets
    # the rest (it was a 204, and its answer stayed cut short); one that had it all, 204.
    assert tail.status_code == 200
    assert sse_events(tail.text) == [e for e in replayed if e[0] is None or int(e[0]) > int(after)]
    assert done.status_code == 204


async def test_last_event_id_resumes_after_that_seq(redis_url: str) -> None:
    agent = Agent(name="a", provider=ScriptedProvider(["w " * 60], delay=0.03))
    async with two_front_ends(redis_url, agent) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: client.post(f"{a.url}/api/chat", json=chat_body("s1")))
                await wait_streaming(client, f"{b.url}/api/chat/s1/stream")
                # A client can have seen seq 5 only once the stream holds it (a stream
                # that ends before the client's seq is another one: not resumed).
                await wait_for_seq(b.app.state.axon.relay, "s1", 5)
                full_task: list[Any] = []

                async def full() -> None:
                    r = await client.get(f"{b.url}/api/chat/s1/stream")
                    full_task.extend(sse_events(r.text))

                async def partial() -> None:
                    r = await client.get(
                        f"{b.url}/api/chat/s1/stream", headers={"last-event-id": "5"}
                    )
                    partial_task.extend(sse_events(r.text))

                partial_task: list[Any] = []
                nursery.start_soon(full)
                nursery.start_soon(partial)
    with_ids = [e for e in full_task if e[0] is not None]
    assert [e for e in with_ids if int(e[0]) > 5] == [e for e in partial_task if e[0] is not None]


async def test_a_bad_last_event_id_is_a_400(redis_url: str) -> None:
    async with two_front_ends(redis_url, Agent(name="a")) as (_, b):
        async with httpx.AsyncClient(base_url=b.url) as client:
            response = await client.get("/api/chat/s1/stream", headers={"last-event-id": "x"})
    assert response.status_code == 400
    assert "non-negative integer" in response.json()["error"]


async def test_stop_on_another_front_end_cancels_the_turn_and_saves_it(redis_url: str) -> None:
    agent = Agent(name="a", provider=ScriptedProvider(["w " * 400], delay=0.02))
    async with two_front_ends(redis_url, agent) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            async with trio.open_nursery() as nursery:
                result: list[Any] = []

                async def run_on_a() -> None:
                    response = await client.post(f"{a.url}/api/chat", json=chat_body("s1"))
                    result.extend(sse_events(response.text))

                nursery.start_soon(run_on_a)
                await wait_streaming(client, f"{b.url}/api/chat/s1/stream")
                stop = await client.post(f"{b.url}/api/chat/s1/stop", json={})
            await wait_idle(a, "s1")
            saved = (await a.host.store.load("s1")).messages[-1]
            again = await client.post(f"{b.url}/api/chat/s1/stop", json={})
    assert stop.status_code == 202 and stop.json()["turn_id"]
    assert {"type": "abort", "reason": "stopped by user"} in [d for _, d in result]
    assert isinstance(saved, AssistantMessage) and saved.interrupted
    assert again.status_code == 204


JUNK_STREAMS = {
    "bad fields": {"first": "1", "items": "not json"},
    "an unknown chunk type": {"first": "1", "items": '[{"type": "bogus"}]'},
    "a key of another type": None,
}


async def plant_junk_stream(relay: Any, session_id: str, turn_id: str, fields: Any) -> None:
    """The session's active turn is ``turn_id``, whose relay key holds junk."""
    key = relay.turn_key(turn_id)
    await relay.client.delete([key])
    if fields is None:
        await relay.client.set(key, "not a stream")
    else:
        await relay.client.xadd(key, fields, identifier="1-1")
    await relay.client.set(relay.active_key(session_id), turn_id)


@pytest.mark.parametrize("fields", JUNK_STREAMS.values(), ids=JUNK_STREAMS.keys())
@pytest.mark.parametrize("last_event_id", [None, "3"])
async def test_a_junk_relay_stream_is_an_error_chunk_never_a_500(
    redis_url: str, fields: Any, last_event_id: str | None
) -> None:
    async with two_front_ends(redis_url, Agent(name="a")) as (_, b):
        await plant_junk_stream(b.app.state.axon.relay, "s1", "turn_junk", fields)
        headers = {"last-event-id": last_event_id} if last_event_id else {}
        async with httpx.AsyncClient(base_url=b.url, timeout=20) as client:
            response = await client.get("/api/chat/s1/stream", headers=headers)
    events = [d for _, d in sse_events(response.text)]
    assert response.status_code == 200
    assert events[-2]["type"] == "error" and "junk" in events[-2]["errorText"]
    assert events[-1] == "[DONE]"


async def written_active_turn(relay: RedisRelay, session_id: str) -> str:
    """The session's turn id in the relay's active key. The publisher flushes on its own
    task, so the key may land a moment after the session is idle: wait for it (bounded)."""
    with trio.fail_after(10):
        for _ in range(1000):  # the Redis key is polled: nothing here can signal it
            raw = await relay.client.get(relay.active_key(session_id))
            if raw is not None:
                return bytes(raw).decode()
            await trio.sleep(0.01)
    raise AssertionError(f"no active turn of {session_id} in the relay")


async def test_a_finished_turns_junk_relay_stream_is_rebuilt_from_the_store(
    redis_url: str,
) -> None:
    agent = Agent(name="a", provider=ScriptedProvider(["one two three"]))
    async with two_front_ends(redis_url, agent) as (a, _):
        async with httpx.AsyncClient(base_url=a.url, timeout=20) as client:
            await client.post("/api/chat", json=chat_body("s1"))
            await wait_idle(a, "s1")
            relay = a.app.state.axon.relay
            turn_id = await written_active_turn(relay, "s1")
            await plant_junk_stream(relay, "s1", turn_id, JUNK_STREAMS["a key of another type"])
            response = await client.get("/api/chat/s1/stream")
        stored = (await a.host.store.load("s1")).messages[-1]
    events = [d for _, d in sse_events(response.text) if d != "[DONE]"]
    assert response.status_code == 200
    assert events[0] == {"type": "start", "messageId": stored.id}
    assert "".join(e["delta"] for e in events if e["type"] == "text-delta") == "one two three"
    assert events[-1]["type"] == "finish"


async def test_a_session_key_of_another_type_in_the_relay_is_no_turn(redis_url: str) -> None:
    async with two_front_ends(redis_url, Agent(name="a")) as (_, b):
        relay = b.app.state.axon.relay
        await relay.client.hset(relay.active_key("s1"), {"turn": "t"})
        async with httpx.AsyncClient(base_url=b.url) as client:
            response = await client.get("/api/chat/s1/stream")
    assert response.status_code == 204


async def test_a_resume_after_a_takeover_does_not_repeat_start(redis_url: str) -> None:
    from runtime import output as o
    from runtime.chunks import Usage

    usage = Usage(input_tokens=1, output_tokens=1, total_tokens=2)
    async with two_front_ends(redis_url, Agent(name="a")) as (_, b):
        relay = b.app.state.axon.relay
        dead = relay.writer(session_id="s1", turn_id="t1")
        for chunk in (o.Start(message_id="m1"), o.StepStart(step=0)):
            dead.append(chunk)
        await dead.flushed()
        taker = relay.writer(session_id="s1", turn_id="t1", takeover=True)
        taker.append(o.Start(message_id="m1"))
        await taker.restart_step(0)
        for chunk in (
            o.StepStart(step=0),
            o.TextStart(step=0, part_id="p"),
            o.TextDelta(step=0, part_id="p", text="hi"),
            o.TextFinish(step=0, part_id="p"),
            o.StepFinish(step=0, finish_reason="stop", usage=usage),
            o.Finish(finish_reason="stop", usage=usage),
        ):
            taker.append(chunk)
        await taker.flushed()
        async with httpx.AsyncClient(base_url=b.url, timeout=20) as client:
            async with trio.open_nursery() as nursery:
                got: list[Any] = []

                async def resume(task_status: trio.TaskStatus[None]) -> None:
                    headers = {"last-event-id": "2"}  # had the dead worker's start, step-start
                    async with client.stream(
                        "GET", "/api/chat/s1/stream", headers=headers
                    ) as response:
                        task_status.started()  # the turn is the one streaming: read to its end
                        got.extend(d for _, d in sse_events((await response.aread()).decode()))

                await nursery.start(resume)
                await taker.aclose()
    types = [d["type"] for d in got if d != "[DONE]"]
    assert types[0] == "reset-step" and "start" not in types
    assert types[-1] == "finish"


async def turns_ended(relay: Any, prefix: str, count: int) -> set[str]:
    """The keys of the turn streams under ``prefix``, once ``count`` turn ends are written
    in them (however many streams hold them)."""
    from actors.relays.redis_entries import END

    with trio.fail_after(10):
        while True:
            raw = await relay.client.keys(prefix + "turn:*")
            keys = {k.decode() if isinstance(k, bytes) else k for k in raw}
            ends = 0
            for key in keys:
                for entry in await relay.client.xrange(key, "-", "+"):
                    items = json.loads(entry.field_values[b"items"])
                    ends += sum(1 for item in items if item.get("type") == END)
            if ends >= count:
                return keys
            await trio.sleep(0.01)


async def test_an_agui_run_id_used_again_after_its_turn_ended_gets_a_stream_of_its_own(
    redis_url: str,
) -> None:
    """Embedded with a relay (``serve --redis``): a careless client's constant ``runId``,
    used again by another thread after the first turn ended, kept the id, so the new turn
    appended to the first turn's relay stream (until its TTL) and a reader of that stream
    (``turn:run-1``) saw both threads' turns. Now the relay is asked first: a taken id
    gets a new turn id (as in a worker deployment), the client still sees its runId."""
    from tests.test_agui import parse_sse, run_input, user

    agent = Agent(name="a", provider=ScriptedProvider(["Hello"]))
    prefix = unique_prefix()
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as relay,
        web_server(agent, relay=relay, protocols=("ag-ui",)) as server,
    ):
        await attach_relay(server.host, relay)
        key = relay.turn_key("run-1")
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            first = await client.post("/ag-ui", json=run_input("alice", user("x"), runId="run-1"))
            # The answer may be sent before the writer's last flush (the stream may not
            # exist yet): wait for its end, as a reader that came that soon is rebuilt
            # from the store instead.
            await turns_ended(relay, prefix, 1)
            with trio.fail_after(10):  # the first turn's stream, ended
                alone = [c async for c in relay.read("run-1")]
            before = await relay.client.xrange(key, "-", "+")
            again = await client.post("/ag-ui", json=run_input("bob", user("y"), runId="run-1"))
            await wait_idle(server, "bob")
        keys = await turns_ended(relay, prefix, 2)  # both turns' streams written whole
        others = {k.removeprefix(relay.turn_key("")) for k in keys} - {"run-1"}
        after = await relay.client.xrange(key, "-", "+")
        assert after == before  # nothing of bob's turn in run-1's stream
        (bob_turn,) = others  # bob's turn has a stream of its own
        with trio.fail_after(10):
            bobs = [c async for c in relay.read(bob_turn)]
    said = ["".join(e.get("delta", "") for e in parse_sse(r.text)) for r in (first, again)]
    assert said == ["Hello", "Hello"]
    assert all(e.get("runId", "run-1") == "run-1" for e in parse_sse(again.text))
    assert {c.session_id for c in alone} == {"alice"}
    assert {c.session_id for c in bobs} == {"bob"}
