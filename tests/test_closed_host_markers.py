"""A closed Host's running marker, met by another Host of the same process (branch
``markers``): the marker's writer (this process) lives, so only the host's own end
tells its turn is dead. A host whose turn's end saves failed (or that was cancelled
while they ran) left its marker; a new Host of the same process on the same store took
the turn for one running elsewhere: never settled, the retry of its message a 409 for
as long as the process lived. :func:`runtime.liveness.host_closed` names it dead."""

from __future__ import annotations

from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores.sqlite import SQLiteStore
from runtime import liveness
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.errors import StoreError
from runtime.liveness import HOST_KEY, RUNNING_META, answering_elsewhere, running_marker
from tests.test_killed_turn_marks import note, respond


def agent() -> Agent:
    return Agent(name="a", provider=ScriptedProvider(responder=respond), tools=[note])


async def stored_meta(path: str) -> dict[str, Any]:
    store = await SQLiteStore.open(path)
    try:
        record = await store.load("s")
        return {} if record is None else dict(record.meta)
    finally:
        await store.aclose()


async def killed_in_step_1(path: str) -> str:
    """Run ``go`` on a host of ``path``; once step 0's save stored the running marker,
    fail every later save and cancel the host from outside (its end saves refused):
    the marker stays. Returns the host's marker id."""
    marked = trio.Event()
    with trio.CancelScope() as killed:
        async with Host.open(store=path, log_tap=False) as host:
            save = host.store.save

            async def watched(*args: Any, **kwargs: Any) -> int:
                if marked.is_set():
                    raise StoreError("the disk is full")
                version = await save(*args, **kwargs)
                if isinstance(args[3].get(RUNNING_META), dict):
                    marked.set()  # step 0's save stored the marker: every later one fails
                return version

            host.store.save = watched  # type: ignore[method-assign]
            session = await host.open_session(agent(), session_id="s")
            async with session.stream("go") as out:
                async for chunk in out:
                    if chunk.type == "step-start" and chunk.step == 1:
                        await marked.wait()
                        killed.cancel()
    marker = (await stored_meta(path))[RUNNING_META]
    assert marker["writer"] == liveness.this_process()
    return marker[HOST_KEY]


async def test_a_closed_hosts_marker_is_settled_by_a_new_host_of_the_same_process(
    tmp_path, autojump_clock
):
    path = str(tmp_path / "one.db")
    await killed_in_step_1(path)
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        assert [m.interrupted for m in session.messages if m.role == "assistant"] == [True]
    assert (await stored_meta(path))[RUNNING_META] is None


async def test_a_closed_hosts_marker_is_not_a_turn_running_elsewhere(tmp_path, autojump_clock):
    path = str(tmp_path / "one.db")
    gone = await killed_in_step_1(path)
    async with Host.open(store=path, log_tap=False) as host:
        assert host.marker_id != gone
        assert not answering_elsewhere(await stored_meta(path), host.marker_id)


async def test_an_open_hosts_marker_of_this_process_is_a_turn_running_elsewhere(
    autojump_clock,
):
    async with Host.open(log_tap=False) as a, Host.open(log_tap=False) as b:
        meta = {RUNNING_META: running_marker("turn_1", "msg_1", a.marker_id)}
        assert answering_elsewhere(meta, b.marker_id)
    assert not answering_elsewhere(meta, b.marker_id)  # (both closed now)


async def test_a_chat_retry_of_a_message_a_closed_server_claimed_is_answered(tmp_path):
    """``serve`` A (this process) answered ``q0`` and claimed ``q1`` (its end saves then
    refused), then closed; server B of the same process on the same file gets the
    client's retry of ``q1``: it runs it (on main, a 409 "another server is answering
    it now", for as long as the process lived)."""
    import httpx

    from runtime.messages import AssistantMessage
    from runtime.messages import UserMessage as User
    from tests.test_claim_marker_ttl import _saved
    from tests.test_sqlite_twin_claims import _stored
    from tests.test_web_http import body
    from tests.web.harness import web_server

    db = str(tmp_path / "one.db")
    async with web_server(Agent(provider=ScriptedProvider(steps=[["From A."]])), store=db) as a:
        async with httpx.AsyncClient(base_url=a.url, timeout=None) as to_a:
            await to_a.post("/api/chat", json=body("s", "zero", message_id="q0"))
        held = await a.host.store.load("s")
        marker = running_marker("t", "a-claimed", a.host.marker_id)
        claim = (User(content="one", id="q1"), AssistantMessage(id="a-claimed"))
        await a.host.store.save(
            "s", len(held.messages), claim, {**held.meta, RUNNING_META: marker},
            expected_version=held.version,
        )  # fmt: skip
    provider = ScriptedProvider(steps=[["From B."]])
    async with web_server(Agent(provider=provider), store=db) as b:
        async with httpx.AsyncClient(base_url=b.url, timeout=None) as to_b:
            retry = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))
        assert retry.status_code == 200, retry.content
        record = await _saved(b.host.store, ("assistant", "From B."))
    assert len(provider.requests) == 1
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From B.")]
