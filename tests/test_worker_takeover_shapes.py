"""Takeovers seen by the turn's readers, with real worker processes (one SIGKILLed), real
PostgreSQL and the test run's own Redis, read over HTTP from a front end: what the
worker that takes the turn over streams reaches every reader at once, whole, in the
grammar, with no repeat and no gap."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.relays import RedisRelay
from tests.support.redis import require_redis
from tests.test_frontend import EventReader
from tests.test_relay_takeover import LIMIT, front_end_and_workers, last_seq, wait_for_seq


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def kinds(events: list[tuple[str | None, Any]]) -> list[str]:
    return [d["type"] for _, d in events if d != "[DONE]"]


async def test_a_takeover_from_step_0_that_finds_no_stream_sends_its_start_at_once(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Worker ``a`` is killed in step 0 (nothing committed) and its stream is gone (Redis
    lost it: to a takeover, the same as a worker that streamed nothing). ``b`` re-runs
    the turn from step 0 and is held in a hook on turn start, between its ``start`` and
    its first ``step-start``. A reader gets that ``start`` while ``b`` is held; before,
    the writer kept it back until the step's first chunk told it the re-run starts at
    step 0 (a throttle or a slow hook held the reader's first chunk with it)."""
    gate = tmp_path / "gate"
    async with front_end_and_workers(pg_url, redis_url) as (d, workers):
        workers.start("a", AXON_TEST_DELAY="0.1")
        turn = await d.queue.submit("s1", "tools one")
        await wait_for_seq(redis_url, d.prefix, turn.turn_id, 3)
        workers.signal("a", signal.SIGKILL)
        async with RedisRelay.open(redis_url, prefix=d.prefix) as relay:
            await relay.client.delete([relay.turn_key(turn.turn_id)])
        workers.start("b", AXON_TEST_DELAY="0.01", AXON_TEST_START_GATE=str(gate))
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with client.stream("GET", "/api/chat/s1/stream") as response:
                assert response.status_code == 200
                reader = EventReader(response)
                with trio.fail_after(20):  # (a bound: before, it never came)
                    first = await reader.until(1)  # while b waits at its gate
                gate.touch()
                rest = await reader.all()
        done = await d.queue.get(turn.turn_id)
        assert done is not None and done.status == "done" and done.attempts == 2
    assert kinds(first) == ["start"]
    seen = kinds(rest)
    assert seen[0] == "start" and seen[-1] == "finish" and "error" not in seen
    ids = [int(i) for i, _ in rest if i is not None]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # no gap, no repeat


async def paused_until_taken_over(d: Any, workers: Any, gate: Any, gate_var: str, text: str) -> Any:
    """Worker ``a`` started with ``gate_var`` (a hook of tests/support/worker_agent.py
    that waits at ``gate``) runs a turn of ``text`` to the gate and is SIGSTOPped there;
    worker ``b`` takes the turn over and finishes it. Returns the turn (``a`` still
    stopped, its gate shut)."""
    from tests.test_workers import wait_for

    workers.start("a", **{gate_var: str(gate)})
    turn = await d.queue.submit("s1", text)

    async def at_gate() -> bool:
        return await trio.Path(f"{gate}.at").exists()

    await wait_for(at_gate, what=f"worker a at its gate ({gate_var})")
    workers.signal("a", signal.SIGSTOP)
    workers.start("b")

    async def taken_over() -> bool:
        row = await d.queue.get(turn.turn_id)
        return row is not None and row.status == "done"

    await wait_for(taken_over, what="worker b to finish the turn")
    return turn


async def test_a_worker_woken_past_its_lease_runs_no_tool_the_takeover_ran(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Worker ``a`` is held just before its first tool, then SIGSTOPped past its lease;
    ``b`` takes the turn over and finishes it (running ``record`` under the call's key).
    ``a`` is let on and SIGCONTed: it must not run ``record`` again. Before, it did, tens
    of ms before its lease thread told it the turn was ``b``'s (two attempts under one
    key: only the tool's own idempotency kept the effect single). Its writes are
    refused, the store holds ``b``'s turn, and ``a`` goes on working."""
    from tests.support.worker_agent import read_ledger
    from tests.test_workers import assert_tools_turn_whole, wait_for

    gate = tmp_path / "gate"
    async with front_end_and_workers(pg_url, redis_url) as (d, workers):
        turn = await paused_until_taken_over(d, workers, gate, "AXON_TEST_TOOL_GATE", "tools one")
        version = await d.store.version("s1")
        await trio.Path(gate).touch()
        workers.signal("a", signal.SIGCONT)

        async def a_noticed() -> bool:
            return "lease_lost" in workers.log("a")

        await wait_for(a_noticed, timeout=20, what="worker a to notice its lost lease")
        second = await d.queue.submit("s2", "after the pause")  # a goes on working

        async def second_done() -> bool:
            row = await d.queue.get(second.turn_id)
            return row is not None and row.status == "done"

        await wait_for(second_done, what="the next turn")
        done = await d.queue.get(turn.turn_id)
        record = await d.store.load("s1")
        assert await d.store.version("s1") == version  # nothing of a's written
    assert done is not None and (done.owner, done.attempts) == ("b", 2)
    assert record is not None
    assert_tools_turn_whole(record.messages, done)
    effects, attempts = read_ledger(pg_url)
    keys = [f"{turn.turn_id}:0:call_1", f"{turn.turn_id}:1:call_2"]
    assert {k: effects.get(k) for k in keys} == {k: 1 for k in keys}
    assert {k: attempts.get(k) for k in keys} == {k: 1 for k in keys}  # run once, by b


async def test_a_worker_woken_inside_a_sub_turn_past_its_lease_runs_no_sub_agent_tool_again(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Worker ``a`` runs a ``sub`` turn: its agent tool ``helper``'s sub-turn is held just
    before its ``record``, then ``a`` is SIGSTOPped past its lease; ``b`` takes the turn
    over and finishes it (the sub-turn again, ``record`` under the same key). ``a`` is
    let on and SIGCONTed: its sub-turn confirms through the calling turn's claim, lost,
    and runs no ``record``. Before, the sub-turn had no confirm of its own: ``a`` ran
    ``record`` a second time (two attempts under one key)."""
    from tests.support.worker_agent import read_ledger
    from tests.test_workers import wait_for

    gate = tmp_path / "gate"
    async with front_end_and_workers(pg_url, redis_url) as (d, workers):
        turn = await paused_until_taken_over(d, workers, gate, "AXON_TEST_SUB_TOOL_GATE", "sub one")
        await trio.Path(gate).touch()
        workers.signal("a", signal.SIGCONT)

        async def a_noticed() -> bool:
            return "lease_lost" in workers.log("a")

        await wait_for(a_noticed, timeout=20, what="worker a to notice its lost lease")
        second = await d.queue.submit("s2", "after the pause")  # a goes on working

        async def second_done() -> bool:
            row = await d.queue.get(second.turn_id)
            return row is not None and row.status == "done"

        await wait_for(second_done, what="the next turn")
        done = await d.queue.get(turn.turn_id)
        subs = [i.session_id for i in await d.store.list_sessions() if i.session_id != "s1"]
        sub = [await d.store.load(s) for s in subs if s.startswith("s1.")]
    assert done is not None and (done.owner, done.attempts) == ("b", 2)
    effects, attempts = read_ledger(pg_url)
    (key,) = [k for k in attempts if k.endswith(":0:call_s")]  # the sub-turn's record
    assert (effects[key], attempts[key]) == (1, 1)  # run once, by b
    # ... and nothing of a's aborted sub-turn landed on b's sub-session, whichever of
    # a's checks saw the lost claim first: the sub-turn's own confirm (pinned in
    # process: tests/test_sub_turn_stale_save.py) or the lease watch cancelling the
    # calling turn while the sub-turn runs (tests/test_worker_sub_turn_fence.py): its
    # saves are fenced by the calling turn's claim (PostgresStore.fence_under).
    (record,) = sub
    assert record is not None
    assert [m.role for m in record.messages].count("user") == 1, record.messages


@pytest.mark.parametrize("killed_at", [4, 6, 9])
async def test_every_reader_of_a_taken_over_step_that_asks_shows_the_stored_request(
    pg_url: str, redis_url: str, killed_at: int
) -> None:
    """Worker ``a`` is SIGKILLed in the step that asks for approval (in its text, at its
    end, in the call's input); ``b`` runs the step again and the turn waits. A reader
    that watched live, one that resumes with ``Last-Event-ID`` after ``b`` began, and
    one that comes after the kill each read ids that only grow, end with ``finish``
    ``awaiting-input``, and (through the real `ai` package) show the stored message:
    the text once and the call waiting for approval under the stored approval id."""
    from runtime.app.web.ui_stream import ui_messages
    from tests.test_relay_takeover import as_sse, read_ui_message, shape
    from tests.web.harness import ensure_ai_package

    node = ensure_ai_package()
    got: dict[str, list[tuple[str | None, Any]]] = {}
    async with front_end_and_workers(pg_url, redis_url) as (d, workers):
        workers.start("a", AXON_TEST_DELAY="0.1")
        turn = await d.queue.submit("s1", "approve it")
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:

            async def read(
                name: str, headers: dict[str, str], task_status: Any = trio.TASK_STATUS_IGNORED
            ) -> None:
                async with client.stream("GET", "/api/chat/s1/stream", headers=headers) as r:
                    assert r.status_code == 200
                    reader = EventReader(r)
                    await reader.until(1)
                    task_status.started()
                    got[name] = await reader.all()

            await wait_for_seq(redis_url, d.prefix, turn.turn_id, killed_at)
            async with trio.open_nursery() as nursery:
                await nursery.start(read, "live", {})
                workers.signal("a", signal.SIGKILL)
                async with RedisRelay.open(redis_url, prefix=d.prefix) as relay:
                    dead = await last_seq(relay, turn.turn_id)
                # slow enough (~15 chunks of 0.2 s) that the two readers below join
                # while b runs: a turn that waits already is no stream to GET (204)
                workers.start("b", AXON_TEST_DELAY="0.2")
                await wait_for_seq(redis_url, d.prefix, turn.turn_id, dead + 2)
                await nursery.start(read, "resumed", {"last-event-id": "2"})
                await nursery.start(read, "after", {})
        row = await d.queue.get(turn.turn_id)
        assert row is not None and row.status == "awaiting-input" and row.attempts == 2
        record = await d.store.load("s1")
        assert record is not None
    [stored] = [m for m in ui_messages(record.messages) if m["id"] == turn.message_id]
    [call] = [p for p in stored["parts"] if p["type"] == "tool-guarded"]
    assert call["state"] == "approval-requested"
    head = [e for e in got["live"] if e[0] is not None and int(e[0]) <= 2]
    for name, events in (("live", got["live"]), ("resumed", head + got["resumed"]),
                         ("after", got["after"])):  # fmt: skip
        data = [x for _, x in events if x != "[DONE]"]
        assert data[-1]["type"] == "finish", name
        assert data[-1]["messageMetadata"]["finishReason"] == "awaiting-input", name
        ids = [int(i) for i, x in events if i is not None and x["type"] != "data-reset-step"]
        assert all(b > a for a, b in itertools.pairwise(ids)), (name, ids)
        message = await read_ui_message(node, as_sse(events))
        assert shape(message["parts"]) == shape(stored["parts"]), name
        [shown] = [p for p in message["parts"] if p["type"] == "tool-guarded"]
        assert (shown["state"], shown["approval"]) == ("approval-requested", call["approval"])


async def test_a_worker_paused_mid_step_and_woken_after_the_takeover_adds_nothing_anywhere(
    pg_url: str, redis_url: str
) -> None:
    """Worker ``a`` is SIGSTOPped in the middle of step 0's model stream, past its lease;
    ``b`` takes the turn over and finishes it; ``a`` is SIGCONTed and goes on from where
    it stopped, believing the turn is its own until told. The reader that watched from
    the start reads ids that only grow and (through the real `ai` package) the stored
    message; every tool ran once, by ``b``; nothing of ``a``'s is stored or relayed
    after ``b``'s end."""
    from runtime.app.web.ui_stream import ui_messages
    from tests.support.worker_agent import read_ledger
    from tests.test_relay_takeover import as_sse, read_ui_message, shape
    from tests.test_workers import assert_tools_turn_whole, wait_for
    from tests.web.harness import ensure_ai_package

    node = ensure_ai_package()
    got: dict[str, list[tuple[str | None, Any]]] = {}
    async with front_end_and_workers(pg_url, redis_url) as (d, workers):
        workers.start("a", AXON_TEST_DELAY="0.1")
        turn = await d.queue.submit("s1", "tools one")
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:

            async def read(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                async with client.stream("GET", "/api/chat/s1/stream") as r:
                    assert r.status_code == 200
                    reader = EventReader(r)
                    await reader.until(1)
                    task_status.started()
                    got["live"] = await reader.all()

            await wait_for_seq(redis_url, d.prefix, turn.turn_id, 5)
            workers.signal("a", signal.SIGSTOP)  # (before its tool: ~8 chunks of 0.1 s on)
            async with trio.open_nursery() as nursery:
                await nursery.start(read)
                workers.start("b", AXON_TEST_DELAY="0.01")

                async def done() -> bool:
                    row = await d.queue.get(turn.turn_id)
                    return row is not None and row.status == "done"

                await wait_for(done, what="worker b to finish the turn")
            async with RedisRelay.open(redis_url, prefix=d.prefix) as relay:
                ended = await last_seq(relay, turn.turn_id)
            version = await d.store.version("s1")
            workers.signal("a", signal.SIGCONT)

            async def a_noticed() -> bool:
                return "lease_lost" in workers.log("a")

            await wait_for(a_noticed, timeout=20, what="worker a to notice its lost lease")
            second = await d.queue.submit("s2", "after the pause")  # a's next turn, maybe

            async def second_done() -> bool:
                row = await d.queue.get(second.turn_id)
                return row is not None and row.status == "done"

            await wait_for(second_done, what="the next turn")
            async with RedisRelay.open(redis_url, prefix=d.prefix) as relay:
                assert await last_seq(relay, turn.turn_id) == ended  # nothing after b's end
            assert await d.store.version("s1") == version
            row = await d.queue.get(turn.turn_id)
            record = await d.store.load("s1")
    assert row is not None and (row.owner, row.attempts) == ("b", 2)
    assert record is not None
    assert_tools_turn_whole(record.messages, row)
    effects, attempts = read_ledger(pg_url)
    keys = [f"{turn.turn_id}:0:call_1", f"{turn.turn_id}:1:call_2"]
    assert {k: (effects.get(k), attempts.get(k)) for k in keys} == {k: (1, 1) for k in keys}
    ids = [int(i) for i, x in got["live"] if i is not None and x["type"] != "data-reset-step"]
    assert all(b > a for a, b in itertools.pairwise(ids)), ids
    [stored] = [m for m in ui_messages(record.messages) if m["id"] == turn.message_id]
    message = await read_ui_message(node, as_sse(got["live"]))
    assert shape(message["parts"]) == shape(stored["parts"])
