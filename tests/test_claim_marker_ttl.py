"""A claim whose process was killed on ANOTHER machine expires (branch ``claimttl``,
after ``attack2``).

Two ``serve --run-turns-here`` on one store on two machines cannot see each other's
processes: a running marker (:data:`~runtime.liveness.RUNNING_META`) of the other
machine's writer was never judged dead, so a retry of the message its killed process
claimed was a 409 for good. The marker now carries the time of the save that wrote it
(each step save writes it again) and an unseen writer's marker older than
``$AXON_RUNNING_MARKER_TTL`` seconds counts as dead. The writer here is forged: this
process's name with another host, the marker written straight into the store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, liveness
from runtime.liveness import RUNNING_META
from runtime.messages import AssistantMessage, UserMessage
from tests.test_sqlite_twin_claims import _stored, _text, _where
from tests.test_web_http import body
from tests.web.harness import web_server

TTL = 60


def _elsewhere() -> str:
    """This process's writer name as if written on another machine."""
    writer = liveness.this_process()
    assert writer is not None
    return "other-machine:" + writer.split(":", 1)[1]


def _trio_wall() -> float:
    return 1_800_000_000 + trio.current_time()


@pytest.fixture
def clock(mock_clock: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Trio's clock, run at real speed and jumped by the test, driving the markers' wall
    clock; the bound ``TTL``. Not ``autojump_clock``: it jumps while the server waits
    on the PostgreSQL socket, and the turn's save bound (``session.save-timeout``)
    fired before the store answered."""
    mock_clock.rate = 1.0
    monkeypatch.setattr(liveness, "_wall", _trio_wall, raising=False)
    monkeypatch.setenv("AXON_RUNNING_MARKER_TTL", str(TTL))
    return mock_clock


async def _saved(store: Any, last: tuple[str, str]) -> Any:
    """The session once its last message stored is ``last`` (the reply may end before
    its save is committed)."""
    for _ in range(1000):
        record = await store.load("s")
        if record is not None and _stored(record)[-1] == last:
            return record
        await trio.sleep(0.01)
    raise AssertionError(f"never stored: {last}")


async def _claimed_elsewhere(store: Any) -> None:
    """Store ``q1`` and an empty answer, as a server on another machine claims it before
    its model call (then killed there: nothing refreshes the marker)."""
    held = await _saved(store, ("assistant", "From B."))
    claim = (UserMessage(content="one", id="q1"), AssistantMessage(id="a-claimed"))
    marker = {
        "turn_id": "t",
        "message_id": "a-claimed",
        "writer": _elsewhere(),
        "at": _trio_wall(),
    }
    await store.save(
        "s", len(held.messages), claim, {RUNNING_META: marker}, expected_version=held.version
    )


async def _retry(url: str) -> httpx.Response:
    """The client's retry of ``q1``, on a new connection (the jump timed the kept-alive
    one out at the server)."""
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        return await client.post("/api/chat", json=body("s", "one", message_id="q1"))


@asynccontextmanager
async def _claimed_by_another_machine(db: str) -> AsyncIterator[tuple[Any, ScriptedProvider]]:
    """A server B on ``db`` that answered ``q0``, whose session then holds ``q1``
    claimed by a process of another machine (killed: nothing refreshes its marker)."""
    provider = ScriptedProvider(steps=[["From B."]])
    async with web_server(Agent(provider=provider), store=db) as b:
        async with httpx.AsyncClient(base_url=b.url, timeout=None) as to_b:
            await to_b.post("/api/chat", json=body("s", "zero", message_id="q0"))
        await _claimed_elsewhere(b.host.store)
        yield b, provider


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_retry_within_the_bound_of_another_machines_claim_is_a_409(
    tmp_path, request, backend, clock
):
    async with _claimed_by_another_machine(_where(tmp_path, request, backend)) as (b, provider):
        clock.jump(TTL - 1)
        retry = await _retry(b.url)
    assert retry.status_code == 409, retry.content
    assert len(provider.requests) == 1  # q0 only


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_retry_past_the_bound_of_another_machines_claim_is_answered(
    tmp_path, request, backend, clock
):
    async with _claimed_by_another_machine(_where(tmp_path, request, backend)) as (b, provider):
        clock.jump(TTL + 1)
        retry = await _retry(b.url)
        record = await _saved(b.host.store, ("assistant", "From B."))
    assert retry.status_code == 200 and _text(retry.content) == "From B."
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From B.")]
    assert len(provider.requests) == 2  # q0, then q1 run again
    assert [m.id for m in record.messages].count("q1") == 1
    assert record.meta.get(RUNNING_META) is None


def _marker(writer: str | None, at: float | None) -> dict[str, Any]:
    marker: dict[str, Any] = {"turn_id": "t", "message_id": "a", "writer": writer}
    if at is not None:
        marker["at"] = at
    return {RUNNING_META: marker}


def test_a_marker_of_a_live_writer_of_this_machine_never_expires(monkeypatch):
    monkeypatch.setenv("AXON_RUNNING_MARKER_TTL", "1")
    assert liveness.killed_marker(_marker(liveness.this_process(), 0.0)) is None


def test_a_marker_of_another_machine_without_a_time_never_expires(monkeypatch):
    """A marker an older release wrote (no ``at``) is left as it was judged before."""
    monkeypatch.setenv("AXON_RUNNING_MARKER_TTL", "1")
    assert liveness.killed_marker(_marker(_elsewhere(), None)) is None


def test_a_bound_of_zero_never_expires_another_machines_marker(monkeypatch):
    monkeypatch.setenv("AXON_RUNNING_MARKER_TTL", "0")
    assert liveness.killed_marker(_marker(_elsewhere(), 0.0)) is None


def test_the_running_marker_carries_the_time_of_its_save(monkeypatch):
    monkeypatch.setattr(liveness, "_wall", lambda: 1234.5)
    marker = liveness.running_marker("t", "a")
    assert marker is not None and marker["at"] == 1234.5
