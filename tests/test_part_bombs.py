"""Messages of very many parts, as an attacker sends them: refused by count before anything
is decoded, stored or queued, parsed without holding up other requests, and never making
a worker lose the lease of the turn it runs. Real ``serve`` and ``worker`` processes,
real HTTP, real PostgreSQL and Redis for the worker deployment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, Host, InputLimits, TooManyParts
from runtime.app.web import chat_body
from runtime.app.web.chat_input import INLINE_BODY
from runtime.app.worker import LeaseKeeper, Worker
from runtime.errors import ConfigurationError, StoreCorrupt
from runtime.messages import File, TextPart
from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import read_ledger
from tests.test_workers import Workers, finished, sql

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 30


def file_part(text: str = "x") -> dict[str, Any]:
    return {"type": "file", "mediaType": "text/plain", "url": f"data:,{text}"}


def chat(session_id: str, parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": session_id,
        "messages": [{"id": "u1", "role": "user", "parts": parts}],
        "trigger": "submit-message",
        **extra,
    }


def texts(n: int) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "x"} for _ in range(n)]


class Serve:
    """A ``python -m runtime serve`` process on a free loopback port."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", "serve", "--port", "0", "--delay", "0", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr = ""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("Axon web UI on"):
            self.close()
            raise AssertionError(f"serve did not start: {line}{self.stderr}")
        self.url = line.split()[4].rstrip("/")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        _, self.stderr = self.proc.communicate(timeout=LIMIT)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """An embedded ``serve`` on an SQLite store, with small caps set on its command line."""
    server = Serve("--store", str(tmp_path / "s.db"), "--max-parts", "5", "--max-files", "2")
    try:
        yield server
    finally:
        server.close()


async def test_more_parts_than_max_parts_is_413_and_nothing_is_stored(serve: Serve) -> None:
    async with httpx.AsyncClient(base_url=serve.url, timeout=LIMIT) as client:
        refused = await client.post("/api/chat", json=chat("s", texts(6)))
        sessions = (await client.get("/api/sessions")).json()["sessions"]
        session = await client.get("/api/sessions/s")
    assert refused.status_code == 413
    assert refused.json() == {
        "error": "the last user message has 6 parts; the limit is 5 parts per message"
    }
    assert sessions == [] and session.status_code == 404


async def test_more_files_than_max_files_is_413_and_nothing_is_stored(serve: Serve) -> None:
    async with httpx.AsyncClient(base_url=serve.url, timeout=LIMIT) as client:
        refused = await client.post("/api/chat", json=chat("s", [file_part()] * 3))
        sessions = (await client.get("/api/sessions")).json()["sessions"]
    assert refused.status_code == 413
    assert "3 file parts" in refused.json()["error"]
    assert "limit is 2 images and files" in refused.json()["error"]
    assert sessions == []


async def test_a_message_within_the_caps_still_runs_its_turn(serve: Serve) -> None:
    async with httpx.AsyncClient(base_url=serve.url, timeout=LIMIT) as client:
        answered = await client.post("/api/chat", json=chat("s", [*texts(3), *[file_part()] * 2]))
        session = (await client.get("/api/sessions/s")).json()
    assert answered.status_code == 200
    assert session["messages"][0]["role"] == "user"
    assert len(session["messages"][0]["content"]) == 5


async def test_a_large_body_parsed_in_the_child_keeps_every_character(serve: Serve) -> None:
    text = 'naïve 🦉 \u2028 "quoted" ' * 40_000  # over INLINE_BODY: parsed by the child
    async with httpx.AsyncClient(base_url=serve.url, timeout=LIMIT) as client:
        answered = await client.post("/api/chat", json=chat("s", [{"type": "text", "text": text}]))
        session = (await client.get("/api/sessions/s")).json()
    assert len(orjson.dumps(chat("s", [{"type": "text", "text": text}]))) > INLINE_BODY
    assert answered.status_code == 200
    assert session["messages"][0]["content"] == text


def test_bad_caps_on_the_command_line_are_one_line_and_exit_2() -> None:
    for command in ("serve", "worker"):
        done = subprocess.run(
            [sys.executable, "-m", "runtime", command, "--store", "x", "--max-parts", "0"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=LIMIT,
        )
        assert done.returncode == 2
        assert "--max-parts: '0' is not a positive int" in done.stderr


# -- the host ----------------------------------------------------------------------------


async def test_host_input_limits_refuse_a_turn_before_anything_is_stored() -> None:
    async with Host.open(input_limits=InputLimits(max_parts=3, max_files=1)) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider.demo()), session_id="s")
        with pytest.raises(TooManyParts, match="4 parts; the limit is 3"):
            session.stream(["a", "b", "c", "d"])
        with pytest.raises(TooManyParts, match="2 images and files; the limit is 1"):
            session.stream(["a", File(url="data:,x"), File(url="data:,y")])
        assert await host.store.load("s") is None


async def test_the_default_caps_are_1000_parts_and_100_files() -> None:
    async with Host.open() as host:
        assert host.input_limits == InputLimits(max_parts=1000, max_files=100)
        session = await host.open_session(Agent(provider=ScriptedProvider.demo()), session_id="s")
        with pytest.raises(TooManyParts):
            session.stream(["x"] * 1001)
        with pytest.raises(TooManyParts):
            session.stream([File(url="data:,x")] * 101)


def test_input_limits_below_one_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="max_files must be an int >= 1"):
        InputLimits(max_files=0)


# -- a bystander while a large body is parsed ----------------------------------------------


def _request(host: str, method: str, path: str, body: bytes = b"") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _answer(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while piece := await stream.receive_some(1 << 16):
        data += piece
    return bytes(data)


async def test_a_bystander_is_answered_while_a_body_of_many_parts_is_parsed() -> None:
    """The attack of the issue at the largest body the server takes: ~700,000 one-byte
    ``data:`` files in 48 MiB. While it is parsed, ``/api/info`` on another connection is
    answered; before, the event loop was held for the whole parse and the bystander
    waited for it. (The body's trigger is bad, so that the old server also answered it
    right after the parse and the order of the two answers tells the two apart.)"""
    server = Serve()
    try:
        parts = [file_part()] * 700_000
        body = orjson.dumps(chat("bomb", parts, trigger="not-a-trigger"))
        assert len(body) < 48 << 20
        address = server.url.removeprefix("http://")
        host, port = address.rsplit(":", 1)
        order: list[str] = []
        answers: dict[str, bytes] = {}
        big = await trio.open_tcp_stream(host, int(port))
        request = _request(address, "POST", "/api/chat", body)
        await big.send_all(request[:-1])  # the server waits for the last byte

        async def bomb() -> None:
            await big.send_all(request[-1:])
            answers["bomb"] = await _answer(big)
            order.append("bomb")

        async def bystander() -> None:
            await trio.sleep(0.1)  # the server has the whole body: it is parsing it
            async with await trio.open_tcp_stream(host, int(port)) as stream:
                await stream.send_all(_request(address, "GET", "/api/info"))
                answers["bystander"] = await _answer(stream)
            order.append("bystander")

        with trio.fail_after(LIMIT * 2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(bomb)
                nursery.start_soon(bystander)
        await big.aclose()
    finally:
        server.close()
    assert order == ["bystander", "bomb"]
    assert answers["bystander"].startswith(b"HTTP/1.1 200")
    assert answers["bomb"].startswith(b"HTTP/1.1 413")
    assert b"700000 file parts" in answers["bomb"]


# -- the worker deployment --------------------------------------------------------------


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_front_end_refuses_too_many_files_with_413_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    server = Serve(
        "--store", pg_url, "--redis", redis_url, "--redis-prefix", unique_prefix(),
        "--max-files", "2",
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            refused = await client.post("/api/chat", json=chat("s", [file_part()] * 3))
    finally:
        server.close()
    assert refused.status_code == 413
    assert "3 file parts" in refused.json()["error"]
    assert sql(pg_url, "SELECT count(*) FROM axon_turns") == [(0,)]


async def test_status_reads_never_decode_a_turns_input(pg_url: str) -> None:
    """A turn whose ``input`` column holds junk (as if it were millions of parts: too
    costly to decode) still has a status for the front end's polls."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        turn = await queue.submit("s", "hi")
        sql(
            pg_url,
            "UPDATE axon_turns SET input = 'junk' WHERE turn_id = %s RETURNING 1",
            turn.turn_id,
        )
        with pytest.raises(StoreCorrupt):
            await queue.get(turn.turn_id)  # the junk is there
        status = await queue.get_status(turn.turn_id)
        active = await queue.active("s")
        cancelled = await queue.request_cancel(turn.turn_id, "stop")
    finally:
        await queue.aclose()
        await store.aclose()
    assert status is not None and (status.turn_id, status.status) == (turn.turn_id, "queued")
    assert active is not None and active.turn_id == turn.turn_id
    assert cancelled is not None and cancelled.status == "cancelled"


async def test_a_worker_fails_a_turn_over_its_caps_without_running_it(pg_url: str) -> None:
    """A turn queued by other means than a front end (which would have refused it)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        async with trio.open_nursery() as nursery:
            worker = Worker(
                store=store,
                agent=Agent(provider=ScriptedProvider.demo()),
                poll=0.1,
                input_limits=InputLimits(max_parts=2),
            )
            await nursery.start(worker.run)
            turn = await queue.submit("s", (TextPart(text="a", step=0),) * 3)
            done = await queue.wait_finished(turn.turn_id, LIMIT)
            worker.stop()
        stored = await store.load("s")
    finally:
        await queue.aclose()
        await store.aclose()
    assert done is not None and done.status == "failed"
    assert "3 parts; the limit is 2" in (done.error or "")
    assert stored is None


@pytest.fixture
def workers(pg_url: str, redis_url: str) -> Iterator[Workers]:
    pool = Workers(pg_url, redis_url, unique_prefix())
    try:
        yield pool
    finally:
        pool.close()


async def test_a_worker_keeps_the_lease_of_a_turn_whose_input_holds_up_its_event_loop(
    pg_url: str, workers: Workers
) -> None:
    """50,000 parts, accepted (the workers' caps are raised): decoding and handling them
    holds each worker's event loop for longer than the lease. Two workers: had the one
    running the turn missed a renewal, the other would have taken the turn over and run
    its tools again. It runs once."""
    caps = ["--max-parts", "60000", "--max-files", "60000"]
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        parts = (TextPart(text="tools many parts", step=0), *[File(url="data:,x")] * 49_999)
        turn = await queue.submit("bomb", parts)
        for name in ("w1", "w2"):
            workers.start(name, lease=1.0, extra_args=caps)
        done = await finished(queue, turn.turn_id, LIMIT * 2)
    finally:
        await queue.aclose()
        await store.aclose()
    assert done.status == "done", done.error
    effects, attempts = read_ledger(pg_url)
    assert sorted(effects.values()) == sorted(attempts.values()) == [1, 1]  # each ran once
    assert sql(pg_url, "SELECT attempts, epoch FROM axon_turns") == [(1, 1)]  # never taken over


# -- the reduced body and how it leaves the child ----------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(value=json_values)
def test_what_the_child_packs_unpacks_to_the_same_value(value: Any) -> None:
    reduced = {"body": {"id": "s", "messages": [{"role": "user", "parts": [value]}]}}
    blob_chars = chat_body.BLOB_CHARS
    chat_body.BLOB_CHARS = 3  # short strings travel as blobs too
    try:
        assert chat_body.unpack(chat_body.pack(reduced)) == reduced
    finally:
        chat_body.BLOB_CHARS = blob_chars


def test_a_clients_object_cannot_pose_as_a_blob() -> None:
    raw = orjson.dumps(chat("s", [{"type": "text", "text": {"$blob": [0, 3]}}]))
    reduced = chat_body.reduce_chat_body(raw, 10, 10)
    assert reduced["messages"][0]["parts"] == [{"type": "text", "text": {}}]


def test_the_reduced_body_is_the_last_user_message_and_the_scalar_fields() -> None:
    body = {
        "id": "s",
        "trigger": "submit-message",
        "junk": [[], [[]]],
        "messages": [
            {"id": "u0", "role": "user", "parts": [{"type": "text", "text": "old"}]},
            {"id": "a0", "role": "assistant", "parts": []},
            {"id": "u1", "role": "user", "parts": [
                {"type": "text", "text": "new", "extra": [1, 2]}, {"type": "reasoning"},
            ]},
        ],
    }  # fmt: skip
    assert chat_body.reduce_chat_body(orjson.dumps(body), 10, 10) == {
        "id": "s",
        "trigger": "submit-message",
        "junk": [],
        "messages": [
            {"id": "a0", "role": "assistant"},  # the answer the client shows before it
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "new"}]},
        ],
    }


def test_a_long_assistant_id_before_the_last_user_message_is_not_kept() -> None:
    body = {
        "id": "s",
        "messages": [
            {"id": "a" * 10_000, "role": "assistant", "parts": []},
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "new"}]},
        ],
    }
    reduced = chat_body.reduce_chat_body(orjson.dumps(body), 10, 10)
    assert [m["id"] for m in reduced["messages"]] == ["u1"]


def test_a_continuation_keeps_its_assistant_messages_answers() -> None:
    approval = {"id": "ap_1", "approved": True}
    body = {
        "id": "s",
        "messageId": "a1",
        "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]},
            {"id": "a1", "role": "assistant", "parts": [
                {"type": "text", "text": "calling"},
                {"type": "tool-x", "toolCallId": "c1", "state": "approval-responded",
                 "input": {"n": 1}, "approval": approval},
            ]},
        ],
    }  # fmt: skip
    reduced = chat_body.reduce_chat_body(orjson.dumps(body), 10, 10)
    assert reduced["messages"] == [
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {"type": "tool-x", "toolCallId": "c1", "state": "approval-responded",
                 "approval": approval, "input": {"n": 1}},
            ],
        }
    ]  # fmt: skip


def test_a_continuation_with_more_tool_parts_than_its_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A continuation's tool parts are held to ``MAX_ANSWER_PARTS`` (or ``max_parts``
    when that is more: a step's calls may outnumber an input's parts); its other parts
    are dropped uncounted."""
    monkeypatch.setattr(chat_body, "MAX_ANSWER_PARTS", 10)
    parts = [{"type": "tool-x", "toolCallId": f"c{n}"} for n in range(11)]
    parts += [{"type": "step-start"}] * 20
    body = orjson.dumps(
        {"id": "s", "messages": [{"id": "a1", "role": "assistant", "parts": parts}]}
    )
    with pytest.raises(chat_body.BodyRefused, match="11 tool parts; the limit is 10"):
        chat_body.reduce_chat_body(body, 3, 10)
    reduced = chat_body.reduce_chat_body(body, 11, 10)
    assert len(reduced["messages"][0]["parts"]) == 11


async def test_the_lease_keeper_renews_while_the_event_loop_is_blocked(pg_url: str) -> None:
    """A renewal task would not run while the loop is blocked; the keeper's thread does,
    so no other worker can take the turn over however long the loop is held."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=1.0)
    keeper = LeaseKeeper(queue, interval=1.0 / 3)
    keeper.start()
    try:
        await queue.submit("s", "hi")
        claim = await queue.claim("w1", on_claimed=keeper.hold)
        assert claim is not None
        time.sleep(3.0)  # the event loop is held three leases long  # noqa: ASYNC251
        taken = await queue.claim("w2")
        renewal = await queue.renew(claim)
    finally:
        await keeper.aclose()
        await queue.aclose()
        await store.aclose()
    assert taken is None
    assert renewal.held
