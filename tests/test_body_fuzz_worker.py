"""The body fuzzer (:mod:`tests.test_body_fuzz`) on the distributed mode's HTTP front end
(:mod:`runtime.app.web.frontend`): turns queued in the suite's own PostgreSQL, run by a
worker in the test's process, streamed from its Redis relay.

Two families: every protocol's seed bodies (the AI SDK's new message, continuation,
regenerate, edit, stop and delete; OpenAI's, AG-UI's, A2A's and MCP's) mutated; and
requests for a session whose turn a worker runs, held in a tool (:mod:`tests.
test_body_fuzz_busy`: a steering, interrupting or queued message, a stop, a resume with
forged ``Last-Event-ID`` s, two of them at once). The invariants are the body fuzzer's,
with the queue in place of the host's sessions: no 5xx, the protocol's error shape, no
traceback, every stored session loads and maps to the providers' requests, no turn
queued or running and no task left, a valid request works afterwards.
``AXON_BODY_FUZZ=N`` runs ``N`` examples per family (and strategy).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from tests import test_frontend as frontend_tests
from tests.support.redis import require_redis
from tests.test_body_fuzz import (
    LARGE,
    a2a_new,
    a2a_task_call,
    ag_new,
    ag_resume,
    fuzz_settings,
    mcp_tool,
    mutated,
    oa_named,
    ui_approval,
    ui_client_tool,
    ui_delete,
    ui_edit,
    ui_new,
    ui_next,
    ui_regenerate,
    ui_stop,
    ui_valid,
    wire_errors,
)
from tests.test_body_fuzz_busy import BusyRig, busy_agent, busy_example
from tests.test_frontend import deployment

POOL_GROWTH = 8
"""Connections a relay's pool may keep past the baseline: an example reads a turn from
at most four requests at once."""

ALL = ("ai-sdk", "openai", "ag-ui", "a2a", "mcp")

SEEDS = {
    ui_new: "ai-sdk",
    ui_next: "ai-sdk",
    ui_approval: "ai-sdk",
    ui_client_tool: "ai-sdk",
    ui_regenerate: "ai-sdk",
    ui_edit: "ai-sdk",
    ui_stop: "ai-sdk",
    ui_delete: "ai-sdk",
    oa_named: "openai",
    ag_new: "ag-ui",
    ag_resume: "ag-ui",
    a2a_new: "a2a",
    a2a_task_call: "a2a",
    mcp_tool: "mcp",
}


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _long_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment's whole life is bounded (30 s: ``test_frontend.LIMIT``); a large run
    needs longer."""
    monkeypatch.setattr(frontend_tests, "LIMIT", 3600 if LARGE else 120)


class WorkerRig(BusyRig):
    """A :class:`BusyRig` on a front end: what runs is asked of the queue, and the
    sessions the worker's host holds open keep their supervisors."""

    def __init__(self, d: Any) -> None:
        super().__init__(SimpleNamespace(url=d.urls[0], host=d.hosts[0]), "worker")
        self.d = d

    async def _settled(self) -> None:
        with trio.move_on_after(20):
            while True:  # (no event says the queue emptied: it is polled)
                if not await self.d.queue.busy_sessions() and not self.left_over():
                    break
                await trio.sleep(0.02)
        assert not await self.d.queue.busy_sessions(), "turns left queued or running"
        assert not self.left_over(), self.left_over()
        for info in await self.d.store.list_sessions():
            key = (info.cursor, info.message_count, repr(info.meta))
            if self.seen.get(info.session_id) == key:
                continue
            self.seen[info.session_id] = key
            record = await self.d.store.load(info.session_id)
            assert record is not None, info.session_id
            assert wire_errors(record.messages) == [], (info.session_id, record.messages)

    def left_over(self) -> dict[str, int]:
        extra = super().left_over()
        # (the worker's host keeps each session it ran open, with its supervisor)
        held = sum(len(w.host.sessions) for w in self.d.workers if w.host is not None)
        if extra.get("runtime.app.host.Host._supervise", 0) <= held:
            extra.pop("runtime.app.host.Host._supervise", None)
        # (a relay's connection pool keeps the connections it opened for the readers of
        # one moment, a few here: a pool that grew; more than POOL_GROWTH, a leak)
        return {
            name: n
            for name, n in extra.items()
            if not (name.startswith("coredis.") and n <= POOL_GROWTH)
        }


async def run_worker(d: Any, example_of: Any) -> int:
    rig = WorkerRig(d)
    ran = 0

    def run() -> None:
        nonlocal ran
        with rig.http, rig.pool:
            rig.chat("other-done", "hello")
            rig.chat("other-wait", "approve this")
            ui_valid(rig)
            trio.from_thread.run(rig._baseline)
            ran = example_of(rig)

    await trio.to_thread.run_sync(run)
    return ran


async def test_bodies_on_the_worker_front_end(pg_url, redis_url):
    async with deployment(pg_url, redis_url, busy_agent(), protocols=ALL) as d:

        def examples(rig: WorkerRig) -> int:
            ran = 0

            @fuzz_settings(16)
            @given(data=st.data())
            def example(data: Any) -> None:
                nonlocal ran
                ran += 1
                rig.data = data
                seed = data.draw(st.sampled_from(list(SEEDS)), label="seed")
                with seed(rig) as call:
                    body = data.draw(mutated(call.body, rig.ids), label="body")
                    call.response = rig.send(call.method, call.path, body, call.headers)
                    rig.check(SEEDS[seed], call.response, body)
                rig.settled()
                ui_valid(rig)
                rig.settled()

            example()
            return ran

        ran = await run_worker(d, examples)
    print(f"\nbody fuzz worker front end: {ran} examples")


@pytest.mark.parametrize("on_busy", ["steer", "interrupt", "enqueue"])
async def test_requests_for_a_session_a_worker_runs(on_busy, pg_url, redis_url):
    async with deployment(pg_url, redis_url, busy_agent(), on_busy=on_busy) as d:

        def examples(rig: WorkerRig) -> int:
            ran = 0

            @fuzz_settings(6)
            @given(data=st.data())
            def example(data: Any) -> None:
                nonlocal ran
                ran += 1
                rig.data = data
                busy_example(rig, data)
                rig.settled()
                ui_valid(rig)
                rig.settled()

            example()
            return ran

        ran = await run_worker(d, examples)
    print(f"\nbusy fuzz worker front end ({on_busy}): {ran} examples")
