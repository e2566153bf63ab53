"""Queue flooding through a front end (issue 18, item 5): ``serve``'s caps answered 429 with
``Retry-After`` (a real ``serve`` process on the run's own PostgreSQL and Redis, POSTs
that hang up at once, as the attacker's did), and viewers of queued turns that share one
look at PostgreSQL (runtime/app/web/watch.py) instead of each polling it."""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio

from runtime.app.web.frontend import FrontEnd
from runtime.app.web.resume import RelayEncoder
from runtime.app.web.serve import add_serve_arguments, queue_caps
from runtime.app.web.watch import TurnWatch
from runtime.errors import RelayTurnGone
from tests.support.pg import pg_connect
from tests.support.redis import require_redis, unique_prefix
from tests.test_frontend import LIMIT, _axon, body

# -- caps over HTTP ------------------------------------------------------------------------


async def _serve(pg_url: str, *flags: str) -> tuple[Any, str]:
    """A ``serve`` front end (no worker: every turn stays queued) and its URL."""
    redis_url = require_redis()
    serve = _axon(
        "serve", "--port", "0", "--store", pg_url, "--redis", redis_url,
        "--redis-prefix", unique_prefix(), *flags,
    )  # fmt: skip
    assert serve.stdout is not None
    line = await trio.to_thread.run_sync(serve.stdout.readline)
    assert "front-end mode" in line, line + (serve.stderr.read() if serve.poll() else "")
    return serve, line.split()[4].rstrip("/")


async def _post_and_hang_up(client: httpx.AsyncClient, session_id: str, n: int) -> httpx.Response:
    """POST a turn and leave at once (the turn stays queued); a refusal is read whole."""
    async with client.stream("POST", "/api/chat", json=body(session_id, message_id=f"u{n}")) as r:
        if r.status_code != 200:
            await r.aread()
        return r


def _queued(pg_url: str) -> int:
    schema = pg_url.rsplit("schema=", 1)[1]
    with pg_connect() as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {schema}.axon_turns WHERE status = 'queued'"
        ).fetchone()
    return int(row[0])


async def test_a_post_over_the_sessions_cap_is_429_with_retry_after(pg_url: str) -> None:
    serve, url = await _serve(pg_url, "--max-queued-per-session", "2")
    try:
        with trio.fail_after(LIMIT):
            async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as client:
                answers = [await _post_and_hang_up(client, "s1", n) for n in range(3)]
    finally:
        serve.terminate()
        serve.communicate(timeout=LIMIT)
    assert [r.status_code for r in answers] == [200, 200, 429]
    refused = answers[2]
    assert int(refused.headers["retry-after"]) >= 1
    assert "session 's1' already has 2 turns queued" in refused.json()["error"]
    assert _queued(pg_url) == 2


async def test_a_post_over_the_total_cap_is_429_with_retry_after(pg_url: str) -> None:
    serve, url = await _serve(pg_url, "--max-queued", "2")
    try:
        with trio.fail_after(LIMIT):
            async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as client:
                answers = [await _post_and_hang_up(client, f"s{n}", n) for n in range(3)]
    finally:
        serve.terminate()
        serve.communicate(timeout=LIMIT)
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert "retry-after" in answers[2].headers
    assert _queued(pg_url) == 2


def test_serves_cap_options_reach_the_queue_and_off_turns_one_off() -> None:
    parser = add_serve_arguments(argparse.ArgumentParser())
    given = parser.parse_args(["--max-queued-per-session", "5", "--max-queued", "off"])
    assert queue_caps(given) == {"max_queued_per_session": 5, "max_queued": None}
    assert queue_caps(parser.parse_args([])) == {}  # the queue's own defaults


def test_a_cap_option_that_is_not_a_positive_integer_is_a_usage_error(capsys) -> None:
    parser = add_serve_arguments(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-queued", "0"])
    assert "'0' is not a positive int" in capsys.readouterr().err


# -- viewers of queued turns -----------------------------------------------------------


class _Queue:
    """A queue whose one turn stays queued; counts the queries a front end sends."""

    def __init__(self) -> None:
        self.queries = 0

    async def get(self, turn_id: str) -> Any:
        self.queries += 1
        return SimpleNamespace(turn_id=turn_id, status="queued", finished=False)

    async def statuses(self, turn_ids: list[str]) -> dict[str, str]:
        self.queries += 1
        return dict.fromkeys(turn_ids, "queued")


class _Relay:
    """A relay with no stream for the turn yet (no worker has claimed it)."""

    async def read(self, turn_id: str, after_seq: int | None = None, **_: Any) -> Any:
        raise RelayTurnGone("no stream yet")
        yield  # an async generator, as the relay's is


async def _queries_in_a_minute(viewers: int) -> int:
    queue = _Queue()
    front = FrontEnd(store=None, queue=queue, relay=_Relay())
    state = SimpleNamespace(keepalive=15.0, send_timeout=None, background=None, signer=None)
    request: Any = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(axon=state)))
    turn = SimpleNamespace(session_id="s1", turn_id="t1")

    async def view() -> None:
        async def write(data: bytes) -> None:
            pass

        await front._response(request, turn, None)._body(write, RelayEncoder())

    with trio.move_on_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(viewers):
                nursery.start_soon(view)
    return queue.queries


async def test_fifty_viewers_of_a_queued_turn_send_the_queries_one_viewer_sends(
    autojump_clock: Any,
) -> None:
    one = await _queries_in_a_minute(1)
    fifty = await _queries_in_a_minute(50)
    assert fifty <= one + 1, (one, fifty)
    assert one <= 130  # about two looks a second once nothing changes


async def test_a_watch_wakes_its_waiters_when_the_turn_moves_on(autojump_clock: Any) -> None:
    statuses = {"t1": "queued"}

    class Queue:
        async def statuses(self, turn_ids: list[str]) -> dict[str, str]:
            return {t: statuses[t] for t in turn_ids if t in statuses}

    watch = TurnWatch(Queue())
    seen: list[str | None] = []

    async def viewer() -> None:
        seen.append(await watch.changed("t1", "queued"))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(viewer)
        await trio.sleep(10)
        assert seen == []
        statuses["t1"] = "running"
    assert seen == ["running"] * 3


async def test_a_watch_gives_the_seen_status_back_when_its_timeout_passes(
    autojump_clock: Any,
) -> None:
    class Queue:
        async def statuses(self, turn_ids: list[str]) -> dict[str, str]:
            return dict.fromkeys(turn_ids, "running")

    watch = TurnWatch(Queue())
    assert await watch.changed("t1", "running", 2.0) == "running"
    assert await watch.changed("t1", object(), math.inf) == "running"


async def test_waiters_leaving_before_the_look_do_not_put_it_off(autojump_clock: Any) -> None:
    status = {"t1": "running"}

    class Queue:
        async def statuses(self, turn_ids: list[str]) -> dict[str, str]:
            return {t: status[t] for t in turn_ids}

    watch = TurnWatch(Queue())
    seen: list[str | None] = []

    async def viewer(start: float) -> None:
        """Claimed and not streaming: looks at the relay every 0.1 s between waits."""
        await trio.sleep(start)
        while (now := await watch.changed("t1", "running", 0.1)) == "running":
            pass
        seen.append(now)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(viewer, 0.0)
            nursery.start_soon(viewer, 0.05)  # the turn always has a waiter
            await trio.sleep(5)  # the looks back off meanwhile
            status["t1"] = "done"
    assert seen == ["done", "done"]
