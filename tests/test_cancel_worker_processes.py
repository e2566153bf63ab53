"""A turn running in a real ``runtime worker`` process, cut four ways at points of each of
its shapes: the cancellation room of tests/test_cancel_everywhere.py, in the worker
deployment (the suite's own PostgreSQL and Redis, a front end in this process, worker
processes of tests/support/worker_agent.py).

The shapes are the worker agent's: a text answer, a ``tools`` turn (reasoning, two tool
steps, an answer), an approval (asked, decided over the front end, its continuation), a
sub-agent's turn. The points are where the agent's gates hold the worker (the turn's
start, its first tool, the sub-turn's tool) or a count (the tool effects done, the answer
streaming; in an approval's continuation, whose call no hook announces again): never a
time. The cuts: a stop
over the relay, the front end's viewer leaving (which cancels nothing, docs/web.md), the
worker SIGTERMed (it drains for ``--grace``, then releases the turn) and SIGKILLed (its
lease lapses). After each:

* the queue row is right: a stopped turn ``cancelled``, any other ``done`` (or waiting
  for its approval), and a finished or waiting turn holds no lease (a waiting one no
  owner);
* the stored session is well-formed and maps to every provider's request
  (:func:`tests.test_cancel_everywhere.well_formed`);
* a new turn in the session runs, on another worker (``b``), and ends ``done``;
* no tool ran twice: one effect per idempotency key in the ledger, and every attempt of a
  key under the key its first attempt had.

An ordinary run cuts each point one way (each way at two points);
``AXON_CANCEL_EVERY=1`` cuts every point every way."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from actors.relays import RedisRelay
from runtime.messages import AssistantMessage, ToolCallPart
from tests.support.redis import require_redis
from tests.support.worker_agent import read_ledger
from tests.test_cancel_everywhere import EVERY, well_formed
from tests.test_relay_takeover import LIMIT, front_end_and_workers, wait_for_seq
from tests.test_worker_approval_processes import approval, read_some
from tests.test_workers import sql, wait_for


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@attrs.frozen
class Point:
    """Where a shape's turn is cut."""

    name: str
    text: str
    """The turn's input (its shape: tests/support/worker_agent.py)."""
    gate: str | None = None
    """The worker's gate variable that holds it there (``None``: a count, :attr:`effects`)."""
    effects: int = 0
    """Without a gate: cut once the ledger holds this many tool effects (the answer
    streams slowly after them: ``AXON_TEST_DELAY``)."""
    approved: bool = False
    """The turn first waits for approval, decided over the front end: the cut is in its
    continuation."""


POINTS = [
    Point("text_start", "hello there", gate="AXON_TEST_START_GATE"),
    Point("tools_start", "tools one", gate="AXON_TEST_START_GATE"),
    Point("tools_first_tool", "tools one", gate="AXON_TEST_TOOL_GATE"),
    Point("tools_answering", "tools one", effects=2),
    Point("approve_start", "approve it", gate="AXON_TEST_START_GATE"),
    Point("approve_continuation", "approve it", effects=1, approved=True),
    Point("sub_start", "sub one", gate="AXON_TEST_START_GATE"),
    Point("sub_tool", "sub one", gate="AXON_TEST_SUB_TOOL_GATE"),
]
CUTS = ["stop", "viewer", "sigterm", "sigkill"]


async def _row(pg_url: str, turn_id: str) -> tuple[Any, ...]:
    (found,) = await trio.to_thread.run_sync(
        lambda: sql(
            pg_url,
            "SELECT status, owner, lease_until FROM axon_turns WHERE turn_id = %s",
            turn_id,
        )
    )
    return tuple(found)


async def _settled(pg_url: str, turn_id: str) -> tuple[Any, ...]:
    async def settled() -> tuple[Any, ...] | None:
        row = await _row(pg_url, turn_id)
        return row if row[0] in ("done", "failed", "cancelled", "awaiting-input") else None

    return await wait_for(settled, timeout=60, what=f"turn {turn_id} to settle")


async def _waiting_approval(d: Any) -> str:
    """The approval id of the session's waiting call."""

    async def waiting() -> str | None:
        record = await d.store.load("s1")
        for m in record.messages if record else ():
            if isinstance(m, AssistantMessage):
                for p in m.content:
                    if isinstance(p, ToolCallPart) and p.awaiting and not p.awaiting.decided:
                        return p.awaiting.id
        return None

    return await wait_for(waiting, what="the call to wait for approval")


async def _post_approval(url: str, message_id: str, approval_id: str) -> None:
    """Approve over the front end; the continuation's stream read to its end (or until
    cancelled)."""
    async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as client:
        sent = approval("s1", "approve it", message_id, approval_id)
        async with client.stream("POST", "/api/chat", json=sent) as response:
            assert response.status_code == 200, await response.aread()
            async for _ in response.aiter_bytes():
                pass


async def _at(point: Point, gate: Path, pg_url: str, redis_url: str, d: Any, turn: Any) -> None:
    """Wait until the worker is at ``point``."""
    if point.gate == "AXON_TEST_START_GATE":  # (the hook says nothing: its start relayed)
        await wait_for_seq(redis_url, d.prefix, turn.turn_id, 1)
        return
    if point.gate is not None:

        async def at_gate() -> bool:
            return await trio.Path(f"{gate}.at").exists()

        await wait_for(at_gate, what=f"the worker at {point.name}")
        return None

    async def effects() -> bool:
        done, _ = await trio.to_thread.run_sync(read_ledger, pg_url)
        return len(done) >= point.effects

    await wait_for(effects, what=f"{point.effects} tool effects")
    return None


async def _cut_one(point: Point, cut: str, pg_url: str, redis_url: str, tmp: Path) -> None:
    gate = tmp / "gate"
    env = {point.gate: str(gate)} if point.gate else {"AXON_TEST_DELAY": "0.05"}
    async with front_end_and_workers(pg_url, redis_url) as (d, workers):
        async with trio.open_nursery() as background:
            workers.start("a", **env)
            turn = await d.queue.submit("s1", point.text)
            if point.approved:
                approval_id = await _waiting_approval(d)
                background.start_soon(_post_approval, d.urls[0], turn.message_id, approval_id)
            await _at(point, gate, pg_url, redis_url, d, turn)
            if cut == "stop":
                async with RedisRelay.open(redis_url, prefix=d.prefix) as relay:
                    await relay.request_cancel(turn.turn_id, "stopped by user")
            elif cut == "viewer":
                async with (
                    httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client,
                    client.stream("GET", "/api/chat/s1/stream") as response,
                ):
                    assert response.status_code == 200
                    await read_some(response, 1)
                gate.touch()  # (the viewer left: the worker goes on)
            elif cut == "sigterm":
                workers.signal("a", signal.SIGTERM)  # (--grace 2: the gate holds longer)
                await wait_for(lambda: _true(not workers.alive("a")), what="worker a to exit")
                assert workers.procs["a"].returncode == 0, workers.log("a")
            else:
                workers.signal("a", signal.SIGKILL)
            if cut in ("sigterm", "sigkill"):
                workers.start("b")
            status, owner, lease = await _settled(pg_url, turn.turn_id)
            background.cancel_scope.cancel()
        expected = {"stop": "cancelled"}.get(cut, "done")
        if point.name == "approve_start" and cut != "stop":
            expected = "awaiting-input"  # (the turn asks again, or goes on waiting)
        if point.effects and cut == "stop":
            assert status in ("cancelled", "done"), status  # (the answer may end first)
        else:
            assert status == expected, (status, workers.log("a"))
        assert lease is None, (status, owner, lease)
        if status == "awaiting-input":
            assert owner is None, owner
        record = await d.store.load("s1")
        assert record is not None
        assert well_formed(record.messages) == [], record.messages
        # A new turn in the session, on another worker.
        if workers.alive("a"):
            workers.signal("a", signal.SIGTERM)
            await wait_for(lambda: _true(not workers.alive("a")), what="worker a to exit")
        if "b" not in workers.procs:
            workers.start("b")
        after = await d.queue.submit("s1", "tools next")
        status, owner, lease = await _settled(pg_url, after.turn_id)
        assert (status, owner, lease) == ("done", "b", None), workers.log("b")
        record = await d.store.load("s1")
        assert record is not None
        assert well_formed(record.messages) == [], record.messages
        first = await _row(pg_url, turn.turn_id)
        assert first[0] != "running" and first[2] is None, first
        effects, attempts = await trio.to_thread.run_sync(read_ledger, pg_url)
        assert set(effects.values()) <= {1}, effects
        assert set(attempts) == set(effects), (attempts, effects)
        if cut != "sigkill":  # (a kill between a tool's effect and its commit may repeat
            assert set(attempts.values()) <= {1}, attempts  # its attempt, under its key)


async def _true(value: bool) -> bool:
    return value


def _cases() -> list[Any]:
    """Every point and cut with ``AXON_CANCEL_EVERY``; else each point cut one way, each
    way at two points (a rotation)."""
    cases = [
        pytest.param(p, c, id=f"{p.name}-{c}")
        for i, p in enumerate(POINTS)
        for j, c in enumerate(CUTS)
        if EVERY or (i + j) % len(CUTS) == 0
    ]
    return cases


@pytest.mark.parametrize(("point", "cut"), _cases())
async def test_a_worker_turn_cut_at_a_point_of_its_shape_loses_nothing(
    point: Point, cut: str, pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    await _cut_one(point, cut, pg_url, redis_url, tmp_path)
