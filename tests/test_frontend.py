"""``serve`` as a stateless front end: turns queued in PostgreSQL, run by a worker,
streamed from the Redis relay. Real PostgreSQL, real Redis, real HTTP over loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import orjson
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.relays import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, Host
from runtime import output as o
from runtime.app.web.frontend import idempotency_key
from runtime.app.web.resume import RelayEncoder
from runtime.app.web.writer import NOT_READING, BodyPump
from runtime.app.worker import Worker
from runtime.messages import AssistantMessage, TextPart, UserMessage
from tests.support.redis import require_redis, unique_prefix
from tests.test_relay_web import sse_events
from tests.test_web_slow_clients import chat_request, connect, read_to_end

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 30


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def slow_agent(words: int = 40, delay: float = 0.02) -> Agent:
    return Agent(name="a", provider=ScriptedProvider([" ".join(["w"] * words)], delay=delay))


def body(session_id: str, text: str = "go", message_id: str = "u1") -> dict[str, Any]:
    return {
        "id": session_id,
        "messages": [{"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}],
        "trigger": "submit-message",
    }


def data(events: list[tuple[str | None, Any]]) -> list[Any]:
    return [d for _, d in events if d != "[DONE]"]


def streamed_text(events: list[tuple[str | None, Any]]) -> str:
    return "".join(d["delta"] for d in data(events) if d["type"] == "text-delta")


def stored_text(message: AssistantMessage) -> str:
    return "".join(p.text for p in message.content if isinstance(p, TextPart))


@attrs.define
class Deployment:
    """Front ends over one PostgreSQL schema and one relay prefix, and maybe a worker."""

    pg_url: str
    redis_url: str
    prefix: str
    agent: Agent
    store: PostgresStore
    queue: TurnQueue
    nursery: trio.Nursery
    urls: list[str] = attrs.Factory(list)
    hosts: list[Host] = attrs.Factory(list)
    """The front ends' hosts, in the order of :attr:`urls` (their buses, for observers)."""
    workers: list[Worker] = attrs.Factory(list)
    workers_ended: trio.Event = attrs.Factory(trio.Event)
    send_timeout: float | None = None
    """The front ends' ``send_timeout`` (``None``: the app's default)."""
    protocols: tuple[str, ...] = ("ai-sdk",)
    """What the front ends serve (``serve --protocols``)."""
    queue_caps: dict[str, Any] = attrs.Factory(dict)
    """The front ends' queue caps (``max_queued_per_session``, ``max_queued``)."""
    on_busy: str | None = None
    """The front ends' busy strategy (``serve --on-busy``; ``None``: enqueue)."""
    relays: list[RedisRelay] = attrs.Factory(list)
    """The front ends' relays."""
    fronts: list[Any] = attrs.Factory(list)
    """The front ends' :class:`~runtime.app.web.frontend.FrontEnd` s (their ``close``)."""
    app_options: dict[str, Any] = attrs.Factory(dict)
    """More ``create_app`` options of the front ends started from now on."""

    async def start_worker(self) -> Worker:
        return await self.nursery.start(self._worker)

    async def _worker(self, task_status: trio.TaskStatus[Worker]) -> None:
        async with (
            RedisRelay.open(self.redis_url, prefix=self.prefix) as relay,
            trio.open_nursery() as nursery,
        ):
            worker = Worker(store=self.store, relay=relay, agent=self.agent, poll=0.1, grace=1)
            self.workers.append(worker)
            task_status.started(await nursery.start(worker.run))
        self.workers_ended.set()

    async def stop_workers(self) -> None:
        """Stop the workers the way their command does (cancelling one mid-subscription
        is not what a deployment does to it)."""
        for worker in self.workers:
            worker.stop()
        while self.workers:
            self.workers_ended = trio.Event()
            self.workers = [w for w in self.workers if w.host is not None]
            if self.workers:
                await self.workers_ended.wait()

    async def start_front_end(self) -> str:
        url = await self.nursery.start(self._front_end)
        self.urls.append(url)
        return url

    async def _front_end(self, task_status: trio.TaskStatus[str]) -> None:
        from runtime.app.web.app import create_app
        from runtime.app.web.serve import serve_app

        async with (
            RedisRelay.open(self.redis_url, prefix=self.prefix) as relay,
            Host.open(store=self.pg_url, log_tap=False) as host,
        ):
            queue = TurnQueue(host.store, **self.queue_caps)
            self.hosts.append(host)
            self.relays.append(relay)
            try:
                limits = {} if self.send_timeout is None else {"send_timeout": self.send_timeout}
                app = create_app(
                    host,
                    self.agent,
                    relay=relay,
                    queue=queue,
                    protocols=self.protocols,
                    on_busy=self.on_busy,
                    **limits,
                    **self.app_options,
                )
                self.fronts.append(app.state.axon.front)
                binds = await self.nursery.start(partial(serve_app, app, host="127.0.0.1", port=0))
                task_status.started(binds[0])
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await queue.aclose()

    async def assistant(self, session_id: str) -> AssistantMessage:
        record = await self.store.load(session_id)
        assert record is not None
        message = record.messages[-1]
        assert isinstance(message, AssistantMessage)
        return message


@asynccontextmanager
async def deployment(
    pg_url: str,
    redis_url: str,
    agent: Agent,
    *,
    fronts: int = 1,
    worker: bool = True,
    send_timeout: float | None = None,
    protocols: tuple[str, ...] = ("ai-sdk",),
    queue_caps: dict[str, Any] | None = None,
    on_busy: str | None = None,
) -> AsyncIterator[Deployment]:
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                d = Deployment(pg_url, redis_url, unique_prefix(), agent, store, queue, nursery)
                d.send_timeout = send_timeout
                d.protocols = protocols
                d.queue_caps = dict(queue_caps or {})
                d.on_busy = on_busy
                for _ in range(fronts):
                    await d.start_front_end()
                if worker:
                    await d.start_worker()
                yield d
                await d.stop_workers()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await queue.aclose()
            await store.aclose()


class EventReader:
    """Reads a streaming response's SSE events a few at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.chunks = response.aiter_text()
        self.raw = ""

    def _complete(self) -> list[tuple[str | None, Any]]:
        complete = self.raw[: self.raw.rfind("\n\n") + 2]
        return sse_events(complete) if complete.strip() else []

    async def until(self, count: int) -> list[tuple[str | None, Any]]:
        """The first ``count`` events that carry an id."""
        async for text in self.chunks:
            self.raw += text
            events = [e for e in self._complete() if e[0] is not None]
            if len(events) >= count:
                return events[:count]
        raise AssertionError(f"the stream ended before {count} events: {self.raw!r}")

    async def all(self) -> list[tuple[str | None, Any]]:
        """Every event of the stream, once it ended."""
        async for text in self.chunks:
            self.raw += text
        return sse_events(self.raw)


async def wait_for_turn(queue: TurnQueue, session_id: str, status: str) -> Any:
    while True:
        turn = await queue.active(session_id)
        if turn is not None and turn.status == status:
            return turn
        await trio.sleep(0.02)


async def test_a_post_streams_the_workers_turn_with_what_the_store_then_holds(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(12, 0.005)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            response = await client.post("/api/chat", json=body("s1"))
            info = (await client.get("/api/info")).json()
            session = (await client.get("/api/sessions/s1")).json()
        stored = await d.assistant("s1")
        turns = await d.queue.turns("s1")
    events = sse_events(response.text)
    assert response.status_code == 200
    assert data(events)[0] == {"type": "start", "messageId": stored.id}
    assert stored.id == turns[0].message_id and turns[0].status == "done"
    assert streamed_text(events) == stored_text(stored) == " ".join(["w"] * 12)
    assert data(events)[-1]["type"] == "finish" and events[-1][1] == "[DONE]"
    assert info["mode"] == "front-end"
    assert session["title"] == "go" and session["busy"] is False


async def test_a_client_moving_to_another_front_end_misses_and_repeats_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(60), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with client.stream("POST", f"{a}/api/chat", json=body("s1")) as response:
                seen = await EventReader(response).until(6)  # then the client drops A
            last = seen[-1][0]
            assert last is not None
            rest = await client.get(f"{b}/api/chat/s1/stream", headers={"last-event-id": last})
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        stored = await d.assistant("s1")
    events = seen + [e for e in sse_events(rest.text) if e[0] is not None]
    ids = [int(i) for i, _ in events if i is not None]
    assert ids == sorted(set(ids))  # nothing repeated
    assert streamed_text(events) == stored_text(stored)  # nothing missing
    assert not stored.interrupted  # leaving A only stopped a viewer, never the turn


async def test_stop_on_another_front_end_cancels_a_running_turn(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(400), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with client.stream("POST", f"{a}/api/chat", json=body("s1")) as response:
                reader = EventReader(response)
                await reader.until(3)
                stop = await client.post(f"{b}/api/chat/s1/stop", json={})
                rest = await reader.all()
            turn = await d.queue.wait_finished(stop.json()["turn_id"], LIMIT)
            again = await client.post(f"{b}/api/chat/s1/stop", json={})
        stored = await d.assistant("s1")
    assert stop.status_code == 202
    assert {"type": "abort", "reason": "stopped by user"} in data(rest)
    assert turn is not None and turn.status == "cancelled"
    assert stored.interrupted
    assert again.status_code == 204


async def test_stop_cancels_a_queued_turn_that_then_never_runs(pg_url: str, redis_url: str) -> None:
    async with deployment(pg_url, redis_url, slow_agent(3), fronts=2, worker=False) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                posted: list[Any] = []

                async def post() -> None:
                    posted.append(await client.post(f"{a}/api/chat", json=body("s1")))

                nursery.start_soon(post)
                queued = await wait_for_turn(d.queue, "s1", "queued")
                stop = await client.post(f"{b}/api/chat/s1/stop", json={})
            await d.start_worker()
            other = await client.post(f"{a}/api/chat", json=body("s2"))  # the worker works
        record = await d.store.load("s1")
        turn = await d.queue.get(queued.turn_id)
    assert stop.status_code == 202 and stop.json()["turn_id"] == queued.turn_id
    assert data(sse_events(posted[0].text)) == [{"type": "abort", "reason": "stopped by user"}]
    assert other.status_code == 200 and "finish" in [
        e["type"] for e in data(sse_events(other.text))
    ]
    assert turn is not None and turn.status == "cancelled"
    assert record is None or not any(isinstance(m, AssistantMessage) for m in record.messages)


async def test_retrying_a_post_with_the_same_message_id_gives_one_turn(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(5, 0.005)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            first = await client.post("/api/chat", json=body("s1", message_id="u-7"))
            retry = await client.post("/api/chat", json=body("s1", message_id="u-7"))
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert len(turns) == 1
    assert data(sse_events(first.text))[0] == data(sse_events(retry.text))[0]  # same message
    assert record is not None
    assert [type(m) for m in record.messages] == [UserMessage, AssistantMessage]


async def test_a_second_post_while_busy_queues_and_streams_after_the_first(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(30)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                answers: dict[str, httpx.Response] = {}

                async def post(text: str, message_id: str) -> None:
                    answers[text] = await client.post(
                        "/api/chat", json=body("s1", text, message_id)
                    )

                nursery.start_soon(post, "first", "u1")
                await wait_for_turn(d.queue, "s1", "running")
                nursery.start_soon(post, "second", "u2")
        record = await d.store.load("s1")
        turns = await d.queue.turns("s1")
    assert [a.status_code for a in answers.values()] == [200, 200]  # no 409 any more
    assert [t.status for t in turns] == ["done", "done"]
    assert record is not None
    assert [(type(m).__name__, getattr(m, "id", None)) for m in record.messages] == [
        ("UserMessage", record.messages[0].id),
        ("AssistantMessage", turns[0].message_id),
        ("UserMessage", record.messages[2].id),
        ("AssistantMessage", turns[1].message_id),
    ]
    second = data(sse_events(answers["second"].text))
    assert second[0] == {"type": "start", "messageId": turns[1].message_id}
    assert streamed_text(sse_events(answers["second"].text)) == stored_text(record.messages[3])


async def test_a_stream_the_relay_lost_is_rebuilt_from_the_store(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(50)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.post, "/api/chat", json=body("s1")))
                turn = await wait_for_turn(d.queue, "s1", "running")
                async with RedisRelay.open(redis_url, prefix=d.prefix) as relay:
                    key = relay.turn_key(turn.turn_id)
                    while not await relay.client.exists([key]):  # noqa: ASYNC110
                        await trio.sleep(0.02)
                    await relay.client.delete([key])  # Redis lost the turn's stream
                rebuilt = await client.get("/api/chat/s1/stream")
        stored = await d.assistant("s1")
    events = data(sse_events(rebuilt.text))
    assert rebuilt.status_code == 200
    assert events[0] == {"type": "start", "messageId": stored.id}
    assert streamed_text(sse_events(rebuilt.text)) == stored_text(stored)
    assert events[-1]["type"] == "finish"


def _axon(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_serve_and_worker_commands_run_a_turn_end_to_end(pg_url: str, redis_url: str) -> None:
    """The deployment as a user starts it: one ``serve`` and one ``worker`` process."""
    prefix = ["--redis-prefix", unique_prefix()]
    serve = _axon(
        "serve", "--port", "0", "--store", pg_url, "--redis", redis_url, *prefix
    )  # fmt: skip
    worker = _axon(
        "worker", "--store", pg_url, "--redis", redis_url, *prefix,
        "--agent", "tests.support.worker_agent:agent", "--poll", "0.1",
    )  # fmt: skip
    try:
        assert serve.stdout is not None and worker.stdout is not None
        line = await trio.to_thread.run_sync(serve.stdout.readline)
        assert "front-end mode" in line, line + (serve.stderr.read() if serve.poll() else "")
        url = line.split()[4].rstrip("/")
        started = await trio.to_thread.run_sync(worker.stdout.readline)
        assert started.startswith("Axon worker"), started
        with trio.fail_after(LIMIT):
            async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as client:
                response = await client.post("/api/chat", json=body("cli", "hello"))
                session = (await client.get("/api/sessions/cli")).json()
    finally:
        for proc in (serve, worker):
            proc.terminate()
            proc.communicate(timeout=LIMIT)
    assert worker.returncode == 0  # SIGTERM: drained and gone, nothing running
    assert streamed_text(sse_events(response.text)) == "echo: hello"
    assert [m["role"] for m in session["messages"]] == ["user", "assistant"]
    assert session["busy"] is False


def test_a_takeovers_repeated_start_is_dropped_by_the_relay_encoder() -> None:

    encoder = RelayEncoder()
    first = encoder.events(o.Start(message_id="msg_t1", seq=1))
    again = encoder.events(o.Start(message_id="msg_t1", seq=9))
    assert b'"type":"start"' in first
    assert again == b""


def test_a_step_a_takeover_runs_again_numbers_its_reasoning_from_the_start() -> None:
    from runtime.relay import StepRestarted

    encoder = RelayEncoder()
    encoder.encode(o.Start(message_id="msg_t1", seq=1))
    encoder.encode(o.StepStart(step=0, seq=2))
    ids = []
    for part_id, seq in (("p1", 3), ("p2", 6)):  # p1 by the first worker, p2 by the next
        if part_id == "p2":
            encoder.encode(StepRestarted(step=0, seq=5))
        (ui,) = encoder.encode(o.ReasoningStart(step=0, part_id=part_id, seq=seq))
        encoder.encode(o.ReasoningFinish(step=0, part_id=part_id, seq=seq + 1))
        ids.append(ui["id"])
    assert ids == ["msg_t1.s0.r0"] * 2  # as the stored message has the re-run's part


def test_a_retried_post_and_a_regenerate_have_their_own_idempotency_keys() -> None:

    submit = body("s1", message_id="u-7")
    regenerate = {**submit, "trigger": "regenerate-message", "messageId": "msg_t1"}
    assert idempotency_key("s1", submit, False) == idempotency_key("s1", dict(submit), False)
    assert idempotency_key("s2", submit, False) != idempotency_key("s1", submit, False)
    assert idempotency_key("s1", regenerate, True) not in (
        None,
        idempotency_key("s1", submit, False),
    )
    assert idempotency_key("s1", {**submit, "messages": []}, False) is None


async def test_a_client_that_never_reads_is_dropped_and_the_turn_still_finishes(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ~10 MB of SSE: more than the kernel's socket buffers hold (4 MB at most here).
    words = " ".join(f"{'x' * 90}{i}" for i in range(60_000))
    agent = Agent(name="big", provider=ScriptedProvider(steps=[[words]]))
    # The front end gives up once it has filled the socket and then waited send_timeout;
    # the worker may finish the turn before that, and a client reading then would take
    # it all. So the test reads only once the front end has given up.
    dropped = trio.Event()
    write = BodyPump.write

    async def watched(pump: BodyPump, data: bytes) -> None:
        await write(pump, data)
        if pump.left == NOT_READING:
            dropped.set()

    monkeypatch.setattr(BodyPump, "write", watched)
    async with deployment(pg_url, redis_url, agent, send_timeout=0.5) as d:
        server = _AsServer(url=d.urls[0])
        sock = await connect(server, receive_buffer=4096)  # type: ignore[arg-type]
        with sock:
            payload = orjson.dumps(body("never-reads"))
            await sock.send(chat_request(server, payload))  # type: ignore[arg-type]
            turn = await wait_for_turn(d.queue, "never-reads", "running")
            done = await d.queue.wait_finished(turn.turn_id, LIMIT)
            assert done is not None and done.status == "done"  # a viewer never cancels it
            with trio.fail_after(LIMIT):
                await dropped.wait()
                received = await read_to_end(sock)  # the front end closed the connection
        assert b"[DONE]" not in received
        assert len(received) < len(words)
        assert stored_text(await d.assistant("never-reads")) == words


@attrs.define
class _AsServer:
    """What the raw-socket helpers of test_web_slow_clients need of a server."""

    url: str


async def test_the_sessions_list_says_which_sessions_have_a_turn_queued_or_running(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(3), worker=False) as d:
        for session_id in ("idle", "waiting"):
            await d.store.save(session_id, 0, [UserMessage(content="earlier")])
        await d.queue.submit("waiting", "next")
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            listed = (await client.get("/api/sessions")).json()["sessions"]
    assert {s["session_id"]: s["busy"] for s in listed} == {"idle": False, "waiting": True}


async def test_the_front_end_lists_sessions_by_the_page(pg_url: str, redis_url: str) -> None:
    """The deployment's front end pages its store as the single-process app does: a page
    of ``limit`` with the next cursor (none at the end), busy flags on every page, and a
    bad cursor or limit a 400."""
    async with deployment(pg_url, redis_url, slow_agent(3), worker=False) as d:
        for n in range(7):
            await d.store.save(f"s{n}", 0, [UserMessage(content="earlier")])
        await d.queue.submit("s1", "next")
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            listed, cursor, pages = [], None, 0
            while True:
                params = {"limit": "3"} | ({"cursor": cursor} if cursor else {})
                answer = (await client.get("/api/sessions", params=params)).json()
                listed += [(s["session_id"], s["busy"]) for s in answer["sessions"]]
                pages += 1
                cursor = answer["next_cursor"]
                if cursor is None:
                    break
            bad = [
                (await client.get("/api/sessions", params=params)).status_code
                for params in ({"limit": "0"}, {"cursor": "x"}, {"limit": "100000"})
            ]
    assert pages == 3 and bad == [400, 400, 400]
    assert listed == [(f"s{n}", n == 1) for n in reversed(range(7))]


async def test_a_stream_whose_worker_never_wrote_its_end_ends_once_the_turn_did(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker stops between the turn's last commit (``done``) and its stream's end,
    as a worker SIGKILLed there does (the chaos run, tests/support/chaos.py, found it):
    nobody ever ends that stream. Its viewers end once the queue says the turn ended and
    the stream showed nothing more: shown part of it, each is told to reload the
    session. Before, both waited for the stream's end until it expired, a day later."""
    from actors.relays.redis_writer import RedisRelayWriter
    from runtime.app.web import watch

    monkeypatch.setattr(watch, "IDLE_LOOK", 0.2)
    real_close = RedisRelayWriter.aclose

    async def dies_before_the_end(self: Any, *, final: bool = True, **options: Any) -> None:
        if not final:  # (options: ``paused``, and whatever else a worker passes)
            await real_close(self, final=final, **options)
        # else: the worker is gone before it writes the stream's end

    monkeypatch.setattr(RedisRelayWriter, "aclose", dies_before_the_end)
    async with deployment(pg_url, redis_url, slow_agent(30, 0.005)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            with trio.fail_after(20):
                live = await client.post("/api/chat", json=body("s1"))
                later = await client.get("/api/chat/s1/stream")
        stored = await d.assistant("s1")
        turn = (await d.queue.turns("s1"))[0]
    assert turn.status == "done"
    shown = data(sse_events(live.text))
    assert shown[0] == {"type": "start", "messageId": stored.id}
    assert shown[-1]["type"] == "error" and "reload the session" in shown[-1]["errorText"]
    replayed = data(sse_events(later.text))
    assert later.status_code == 200, later.text
    assert replayed[0] == {"type": "start", "messageId": stored.id}  # the stream's replay
    assert replayed[-1]["type"] == "error" and "reload the session" in replayed[-1]["errorText"]
