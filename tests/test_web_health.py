"""``GET /healthz`` and ``GET /readyz`` (runtime/app/web/health.py, docs/deployment.md
"Health checks"): what they answer, to whom, what they cost, and what they say when the
store is stopped, paused or failing and when the server drains. The app served in the
test's loop, or a ``serve`` process; PostgreSQL and Redis are the test run's own
(tests/support/services.py). Nothing is timed: waits are bounded, answers counted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider
from actors.relays import RedisRelay
from runtime import Agent
from runtime.app.web.health import reason
from runtime.errors import StoreError
from tests.support.pg import EXTERNAL_PG, postgres_stopped
from tests.support.redis import redis_restored, require_redis, stop_redis, unique_prefix
from tests.support.services import own_postgres
from tests.test_frontend import deployment
from tests.web.harness import web_server

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 60


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def ready_again(client: httpx.AsyncClient) -> httpx.Response:
    """The first ``/readyz`` that answers 200, asked every 50 ms (at most ``LIMIT`` s)."""
    with trio.fail_after(LIMIT):
        for _ in range(int(LIMIT / 0.05)):
            answer = await client.get("/readyz")
            if answer.status_code == 200:
                return answer
            await trio.sleep(0.05)
    raise AssertionError(f"/readyz never said 200 again: {answer.text}")


# -- what they answer ------------------------------------------------------------------


async def test_healthz_answers_ok_and_touches_no_store_nor_session() -> None:
    async with web_server(agent()) as server:
        calls: list[str] = []
        store = server.host.store
        for name in ("version", "load", "list"):
            if hasattr(store, name):
                original = getattr(store, name)

                async def noted(*args: Any, _name: str = name, _f: Any = original) -> Any:
                    calls.append(_name)
                    return await _f(*args)

                setattr(store, name, noted)
        async with httpx.AsyncClient(base_url=server.url) as client:
            got = await client.get("/healthz")
            head = await client.head("/healthz")
    assert (got.status_code, got.json()) == (200, {"status": "ok"})
    assert (head.status_code, head.content) == (200, b"")
    assert got.headers["cache-control"] == "no-store"
    assert calls == [] and server.host.sessions == {}


async def test_readyz_answers_ok_when_the_store_reads_and_head_too() -> None:
    async with web_server(agent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            got = await client.get("/readyz")
            head = await client.head("/readyz")
    assert (got.status_code, got.json()) == (200, {"status": "ok", "store": "ok", "relay": "none"})
    assert (head.status_code, head.content) == (200, b"")
    assert server.host.sessions == {}


async def test_readyz_needs_no_token_though_the_api_does() -> None:
    async with web_server(agent(), token="s3cret-token") as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            api = await client.get("/api/info")
            ready = await client.get("/readyz")
    assert api.status_code == 401 and ready.status_code == 200


# -- the Host check -----------------------------------------------------------------------


async def test_a_forged_host_is_refused_on_readyz_and_answered_on_healthz() -> None:
    # /readyz tells of the store and the relay: a DNS-rebound page must not read it.
    # /healthz says only that the process runs: a liveness probe sent with a Host the
    # server was not told of must not have the orchestrator restart it.
    async with web_server(agent()) as server:
        headers = {"host": "attacker.example"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
            ready = await client.get("/readyz")
            live = await client.get("/healthz")
            other = await client.get("/api/info")
    assert ready.status_code == 403 and "DNS rebinding" in ready.json()["error"]
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert other.status_code == 403


async def test_the_healthz_exemption_covers_no_other_method_nor_path() -> None:
    async with web_server(agent()) as server:
        headers = {"host": "attacker.example"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
            posted = await client.post("/healthz", json={})
            below = await client.get("/healthz/x")
    assert posted.status_code == 403 and below.status_code == 403


# -- failures -------------------------------------------------------------------------------


async def test_readyz_says_503_with_the_reason_redacted_when_the_store_fails() -> None:
    async with web_server(agent()) as server:

        async def failing(session_id: str) -> int:
            raise StoreError("could not reach postgresql://axon:hunter2-pw@db:5432/axon")

        server.host.store.version = failing  # type: ignore[method-assign]
        async with httpx.AsyncClient(base_url=server.url) as client:
            got = await client.get("/readyz")
            live = await client.get("/healthz")
    assert got.status_code == 503 and live.status_code == 200
    answer = got.json()
    assert answer["status"] == "unavailable" and answer["relay"] == "none"
    assert answer["store"].startswith("StoreError: could not reach postgresql://axon:")
    assert "hunter2" not in got.text


def test_a_reason_quoting_any_url_has_its_credentials_redacted() -> None:
    text = reason(OSError("x redis://:pw-123456789@r:6379/0 y postgres://u:p4ss@h/d?password=q"))
    assert "pw-123456789" not in text and "p4ss" not in text and "password=q" not in text
    assert text.startswith("OSError: x redis://")


async def test_a_store_that_hangs_gets_503_within_the_bound_and_one_check_at_a_time() -> None:
    # A read that never returns (a paused database): each probe answers 503 after the
    # bound, and however many probes come, one read is in flight.
    reads = 0
    release = trio.Event()
    async with web_server(agent()) as server:

        async def hangs(session_id: str) -> int:
            nonlocal reads
            reads += 1
            await release.wait()
            return 0

        server.host.store.version = hangs  # type: ignore[method-assign]
        server.app.state.axon.readiness.bound = 0.2
        answers: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:

            async def probe() -> None:
                answers.append(await client.get("/readyz"))

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(probe)
            again = await client.get("/readyz")
            in_flight = reads
            release.set()
            after = await ready_again(client)
    assert [a.status_code for a in answers] == [503] * 20
    assert all(a.json()["store"].startswith("no answer within 0.2 s") for a in answers)
    assert again.status_code == 503
    assert in_flight == 1
    assert after.json()["store"] == "ok"


async def test_a_change_of_verdict_is_logged_once_not_every_probe() -> None:
    # Down for three probes, up for three, down for two: two warnings, not five.
    failing = True
    async with web_server(agent()) as server:
        store = server.host.store
        original = store.version

        async def flaky(session_id: str) -> int:
            if failing:
                raise StoreError("down")
            return await original(session_id)

        store.version = flaky  # type: ignore[method-assign]
        async with httpx.AsyncClient(base_url=server.url) as client:

            async def probes(count: int) -> list[int]:
                return [(await client.get("/readyz")).status_code for _ in range(count)]

            with capture_logs() as logs:
                codes = await probes(3)
                failing = False
                codes += await probes(3)
                failing = True
                codes += await probes(2)
    assert codes == [503] * 3 + [200] * 3 + [503] * 2
    warned = [line for line in logs if line["event"] == "web.not_ready"]
    assert [line["store"] for line in warned] == ["StoreError: down"] * 2


# -- PostgreSQL and Redis of the run's own ------------------------------------------------


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == parent:
                found.append(int(entry))
    return found


@contextlib.contextmanager
def postgres_paused() -> Iterator[None]:
    """Inside, the run's own PostgreSQL server and its backends are stopped (SIGSTOP):
    connections stay open, nothing answers. Skips on a server the run did not start."""
    if EXTERNAL_PG is not None:
        pytest.skip("AXON_TEST_PG points at a server this run did not start: not pausing it")
    data = own_postgres().data
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    pids = [postmaster, *_children(postmaster)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def test_readyz_says_503_within_the_bound_when_postgresql_is_paused(pg_url: str) -> None:
    async with web_server(agent(), store=pg_url) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            before = await client.get("/readyz")
            with postgres_paused():
                paused = await client.get("/readyz")
                live = await client.get("/healthz")
            after = await ready_again(client)
    assert before.status_code == 200 and live.status_code == 200
    assert paused.status_code == 503
    assert paused.json()["store"].startswith("no answer within 2 s")
    assert after.json()["status"] == "ok"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_probes_while_postgresql_is_paused_hold_one_thread_and_no_descriptors(
    pg_url: str,
) -> None:
    async with web_server(agent(), store=pg_url) as server:
        server.app.state.axon.readiness.bound = 0.05
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await client.get("/readyz")  # the pool's connection made
            with postgres_paused():
                await client.get("/readyz")  # the one read that hangs
                fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
                codes = {(await client.get("/readyz")).status_code for _ in range(200)}
                grown = (
                    len(os.listdir("/proc/self/fd")) - fds,
                    threading.active_count() - threads,
                )
            await ready_again(client)
    assert codes == {503}
    assert grown[0] <= 0 and grown[1] <= 0


async def test_readyz_says_503_when_postgresql_is_stopped_and_never_shows_the_password(
    pg_url: str,
) -> None:
    # The suite's server trusts every connection: a password in the URL is accepted
    # and ignored, and must not show in what /readyz answers once the server is gone.
    with_password = pg_url.replace("postgres@", "postgres:hunter2-secret@", 1)
    async with web_server(agent(), store=with_password) as server:
        readiness = server.app.state.axon.readiness
        readiness.bound = 30.0  # the store's own retries give up first
        server.host.store._retry_for = 0.5
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            with postgres_stopped():
                stopped = await client.get("/readyz")
            await ready_again(client)
    assert stopped.status_code == 503
    assert stopped.json()["store"].startswith(("StoreUnavailable", "StoreError"))
    assert "hunter2" not in stopped.text


async def test_readyz_says_503_naming_the_relay_when_redis_is_down(
    pg_url: str, redis_url: str
) -> None:
    with redis_restored():
        async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
            async with web_server(agent(), store=pg_url, relay=relay) as server:
                async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
                    up = await client.get("/readyz")
                    await trio.to_thread.run_sync(stop_redis)
                    down = await client.get("/readyz")
    assert up.json() == {"status": "ok", "store": "ok", "relay": "ok"}
    assert down.status_code == 503
    assert down.json()["store"] == "ok"
    assert down.json()["relay"].startswith("RelayUnavailable: Redis did not answer PING")


# -- a serve process ------------------------------------------------------------------------


def _serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    """A ``serve`` process on a free port, and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", "serve", "--port", "0", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("Axon web UI on "):
            return proc, line.split()[4].rstrip("/")
    proc.kill()
    raise AssertionError(proc.communicate()[1])


@contextlib.contextmanager
def serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, url = _serve(*args)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=LIMIT)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/PID/fd")
def test_a_thousand_probes_on_connections_of_their_own_leave_no_descriptor_behind(
    tmp_path: Path,
) -> None:
    with serving("--store", str(tmp_path / "s.db")) as (proc, url):
        with httpx.Client(base_url=url, timeout=LIMIT) as client:
            assert client.get("/readyz").status_code == 200  # the store's connection made
            before = _fds(proc.pid)
            codes = set()
            for i in range(1000):
                path = "/healthz" if i % 2 else "/readyz"
                codes.add(client.get(path, headers={"connection": "close"}).status_code)
            after = _fds(proc.pid)
    assert codes == {200}
    assert after <= before


def test_probes_write_no_access_log_line_and_other_requests_do(tmp_path: Path) -> None:
    with serving("--store", str(tmp_path / "s.db"), "--log-level", "info") as (proc, url):
        with httpx.Client(base_url=url, timeout=LIMIT) as client:
            for _ in range(5):
                client.get("/healthz")
                client.get("/readyz")
            client.get("/api/info")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=LIMIT)
    assert "/api/info" in out
    assert "/healthz" not in out and "/readyz" not in out


def test_at_sigterm_readyz_says_draining_while_the_server_goes_on_serving(tmp_path: Path) -> None:
    # --drain: from the signal on, the load balancer reads 503 and stops sending; what
    # it still sends is served; a second signal stops the server at once.
    with serving("--store", str(tmp_path / "s.db"), "--drain", "600") as (proc, url):
        with httpx.Client(base_url=url, timeout=LIMIT) as client:
            assert client.get("/readyz").status_code == 200
            proc.send_signal(signal.SIGTERM)
            for _ in range(2000):
                ready = client.get("/readyz")
                if ready.status_code != 200:
                    break
            live = client.get("/healthz")
            info = client.get("/api/info")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=LIMIT)
    assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
    assert live.status_code == 200 and info.status_code == 200
    assert proc.returncode == 0


async def test_a_front_end_of_workers_reports_its_store_and_its_relay(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), worker=False) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            ready = await client.get("/readyz")
            live = await client.get("/healthz")
    assert ready.json() == {"status": "ok", "store": "ok", "relay": "ok"}
    assert live.status_code == 200
