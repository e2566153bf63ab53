"""The first twin two hosts on one SQLite file ever meet is refused before its model
call (branch ``twins2``).

twinearly's claim (:attr:`~runtime.app.host.Host.claims_turns`) was made only by a host
that had already taken in another process's writes: the first twin of two fresh
servers still paid a whole model run, refused at its end. Each host now puts a row in
the file's registry of the hosts writing it as it opens (one write, SQLite's
``axon_meta``), and a turn reads that registry before it decides to claim (a key range,
no write): a second host is known before any turn of it runs. A host alone on its file
still saves once a one-step turn (tests/test_sqlite_twin_claims.py pins 3 saves for 3
turns), and writes nothing more a turn."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Hooks, Host, liveness
from runtime.app.unsaved import ANSWERED_ELSEWHERE_MESSAGE
from runtime.liveness import MARKER_TTL_DEFAULT, this_process
from tests.test_sqlite_twin_claims import _Held, _stored, _text
from tests.test_web_http import body, events
from tests.web.harness import two_web_servers, web_server


class _Gated(ScriptedProvider):
    """A provider whose stream says it was entered, then waits for ``gate``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.entered, self.gate = trio.Event(), trio.Event()

    async def stream(self, request, emit) -> None:  # type: ignore[no-untyped-def]
        self.entered.set()
        await self.gate.wait()
        await super().stream(request, emit)


@pytest.mark.parametrize("first", ["opened first", "opened second"])
async def test_the_first_twin_of_two_fresh_servers_is_refused_before_its_model_call(
    tmp_path, first
):
    """Two servers that never saw each other's writes get ``q1`` at once (both turns
    held in ``on_turn_start``, after their resend check): the winner (the server opened
    first, which learns of the other only from the registry read as its turn starts; or
    the one opened second, which knew of the first as it opened) claims and answers;
    the other's claim meets that answer, its stream ends ``not_saved``: its provider is
    never called (was: called, its answer streamed, then refused at its end)."""
    await _first_twin_is_refused(str(tmp_path / "one.db"), first)


async def _first_twin_is_refused(store: str, first: str) -> None:
    """Two servers on ``store`` (``first``: which one's turn is let go first) get
    ``q1`` at once, both held in ``on_turn_start``: the winner answers, the loser's
    provider is never called, its stream ends ``not_saved``, one answer is stored.
    Shared with tests/test_pg_twin_registry.py."""
    holds = {"a": _Held(), "b": _Held()}
    providers = {
        "a": ScriptedProvider(steps=[["From A."]]),
        "b": ScriptedProvider(steps=[["From B."]]),
    }
    async with two_web_servers(
        Agent(provider=providers["a"], hooks=Hooks(on_turn_start=holds["a"])),
        Agent(provider=providers["b"], hooks=Hooks(on_turn_start=holds["b"])),
        store=store,
    ) as (a, _b, to_a, to_b):
        winner, loser = ("a", "b") if first == "opened first" else ("b", "a")
        replies: dict[str, httpx.Response] = {}
        won = trio.Event()

        async def post(name: str, client: httpx.AsyncClient) -> None:
            replies[name] = await client.post("/api/chat", json=body("s", "one", message_id="q1"))
            if name == winner:
                won.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "a", to_a)
            nursery.start_soon(post, "b", to_b)
            await holds["a"].entered.wait()
            await holds["b"].entered.wait()
            holds[winner].go.set()
            await won.wait()
            holds[loser].go.set()
        record = await a.host.store.load("s")
    answer = f"From {winner.upper()}."
    assert not providers[loser].requests
    assert _text(replies[winner].content) == answer
    (end,) = [c for c in events(replies[loser].content)[:-1] if c["type"] == "error"]
    assert end["errorText"].endswith(ANSWERED_ELSEWHERE_MESSAGE)
    assert _stored(record) == [("user", "q1"), ("assistant", answer)]


async def test_a_twin_retried_on_a_fresh_server_while_the_first_answers_is_a_409(tmp_path):
    """A answers ``q1`` (its model call held); the client, timed out, sends it to B,
    which never saw a write of A's: A had claimed (it knew of B from the registry), so
    B's retry is told against the store: a 409, no model call on B."""
    a_provider = _Gated(steps=[["From A."]])
    b_provider = ScriptedProvider(steps=[["From B."]])
    async with two_web_servers(
        Agent(provider=a_provider),
        Agent(provider=b_provider),
        store=str(tmp_path / "one.db"),
    ) as (a, _b, to_a, to_b):
        replies: dict[str, httpx.Response] = {}

        async def to_a_post() -> None:
            replies["a"] = await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(to_a_post)
            await a_provider.entered.wait()
            replies["b"] = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))
            a_provider.gate.set()
        # once A is done, the same retry to B is the stored answer, replayed
        again = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))
        record = await a.host.store.load("s")
    assert replies["b"].status_code == 409, replies["b"].content
    assert not b_provider.requests
    assert _text(replies["a"].content) == "From A."
    assert again.status_code == 200 and _text(again.content) == "From A."
    assert _stored(record) == [("user", "q1"), ("assistant", "From A.")]


def _count_registry_calls(store: Any) -> list[str]:
    """The registry's reads and writes of ``store`` apart from the version query's."""
    calls: list[str] = []
    for name in ("writers", "writers_now", "set_writer"):
        method = getattr(store, name)

        def counted(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            calls.append(_name)
            return _method(*args, **kwargs)

        setattr(store, name, counted)
    return calls


async def test_a_host_alone_on_its_file_reads_and_writes_no_registry_row_a_turn(tmp_path):
    """Alone: no claim, and its turns read the registry's names only in the version
    query they make anyway (its row was written as it opened): no call of the
    registry's own, no write."""
    async with web_server(
        Agent(provider=ScriptedProvider(steps=[["Hi."]])), store=str(tmp_path / "one.db")
    ) as a:
        calls = _count_registry_calls(a.host.store)
        async with httpx.AsyncClient(base_url=a.url) as to_a:
            for i in range(3):
                await to_a.post("/api/chat", json=body("s", f"m{i}", message_id=f"q{i}"))
        assert calls == []
        assert not a.host.claims_turns
        assert list(await a.host.store.writers()) == [a.host.marker_id]


async def test_a_second_host_on_the_file_makes_the_first_claim_its_next_turn(tmp_path):
    """A opens alone; B opens: B claims from the start (A's row), A from its next turn
    (B's row, read as the turn starts)."""
    await _second_host_makes_the_first_claim(str(tmp_path / "one.db"))


async def _second_host_makes_the_first_claim(store: str, **options: Any) -> None:
    """A opens alone on ``store`` (no claim), B opens (claims), A claims once it has
    run a turn. Shared with tests/test_pg_twin_registry.py."""
    async with Host.open(store=store, **options) as host_a:
        assert not host_a.claims_turns
        async with Host.open(store=store, **options) as host_b:
            assert host_b.claims_turns
            session = await host_a.open_session(
                Agent(provider=ScriptedProvider(steps=[["A."]])), session_id="s"
            )
            result = await session.run("one")
            assert result.error is None
            assert host_a.claims_turns


async def test_a_closed_host_leaves_the_registry(tmp_path):
    """A host's row goes as it closes: the next host alone on the file does not claim."""
    db = str(tmp_path / "one.db")
    async with Host.open(store=db):
        pass
    async with Host.open(store=db) as host:
        assert not host.claims_turns
        assert list(await host.store.writers()) == [host.marker_id]


async def test_a_dead_processs_row_is_dropped_not_counted(tmp_path):
    """A row left by a killed process of this machine (its pid gone) is dropped as the
    next host opens: that host is alone, no claim."""
    db = str(tmp_path / "one.db")
    store = await SQLiteStore.open(db)
    try:
        mine = this_process()
        assert mine is not None
        host_name, boot, ns, _pid, start = mine.rsplit(":", 4)
        dead = ":".join((host_name, boot, ns, str(2**22 + 7), start))
        await store.set_writer("host_dead_0", json.dumps({"writer": dead, "at": 0}))
    finally:
        await store.aclose()
    async with Host.open(store=db) as host:
        assert not host.claims_turns
        assert list(await host.store.writers()) == [host.marker_id]


@pytest.mark.parametrize("read_before", [False, True])
async def test_an_openai_post_to_the_server_opened_first_while_the_other_answers_is_busy(
    tmp_path, read_before
):
    """B (opened second) runs a turn of session ``s`` (claimed: it knew of A as it
    opened); the same OpenAI post to A, which ran no turn yet, is ``session_busy``: A's
    front end reads the registry too (it skipped the check for a host that had not
    claimed, and ran a second turn beside B's). ``read_before``: a version query of A's
    store ran before B opened (the registry's names it read, only A's, not taken by a
    turn): the front end reads the registry afresh, not those."""
    a_provider = ScriptedProvider(steps=[["From A."]])
    b_provider = _Gated(steps=[["From B."]])
    chat = {"model": "m", "messages": [{"role": "user", "content": "one"}]}
    headers = {"X-Axon-Session": "s"}
    db = str(tmp_path / "one.db")
    options: dict[str, Any] = {"store": db, "protocols": ("ai-sdk", "openai")}
    async with web_server(Agent(name="m", provider=a_provider), **options) as a:
        if read_before:
            assert await a.host.store.version("other") == 0
        async with (
            web_server(Agent(name="m", provider=b_provider), **options) as b,
            httpx.AsyncClient(base_url=a.url) as to_a,
            httpx.AsyncClient(base_url=b.url) as to_b,
        ):
            replies: dict[str, httpx.Response] = {}

            async def to_b_post() -> None:
                replies["b"] = await to_b.post("/v1/chat/completions", json=chat, headers=headers)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(to_b_post)
                await b_provider.entered.wait()
                replies["a"] = await to_a.post("/v1/chat/completions", json=chat, headers=headers)
                b_provider.gate.set()
        record = await a.host.store.load("s")
    assert replies["a"].status_code == 409, replies["a"].content
    assert replies["a"].json()["error"]["code"] == "session_busy"
    assert not a_provider.requests
    assert replies["b"].status_code == 200
    assert [m.text for m in record.messages] == ["one", "From B."]


def _other_machines_row(at: float) -> str:
    mine = this_process()
    assert mine is not None
    return json.dumps({"writer": "other-machine:" + mine.split(":", 1)[1], "at": at})


async def _store_with_row(db: str, row: str) -> None:
    store = await SQLiteStore.open(db)
    try:
        await store.set_writer("host_other_0", row)
    finally:
        await store.aclose()


async def test_another_machines_fresh_row_counts_as_a_host_writing_the_file(tmp_path):
    """A host this process cannot see (another machine or container) whose row is
    recent: the file is shared, the host opening claims."""
    db = str(tmp_path / "one.db")
    await _store_with_row(db, _other_machines_row(time.time()))
    async with Host.open(store=db) as host:
        assert host.claims_turns
        assert sorted(await host.store.writers()) == sorted(["host_other_0", host.marker_id])


async def test_another_machines_row_past_the_bound_is_dropped(tmp_path):
    """Its row older than ``AXON_RUNNING_MARKER_TTL`` (a live host writes it again past
    half that): gone, dropped as the next host opens, which does not claim."""
    db = str(tmp_path / "one.db")
    await _store_with_row(db, _other_machines_row(time.time() - 2 * MARKER_TTL_DEFAULT))
    async with Host.open(store=db) as host:
        assert not host.claims_turns
        assert list(await host.store.writers()) == [host.marker_id]


async def test_a_lone_hosts_row_is_written_again_once_past_half_the_bound(tmp_path, monkeypatch):
    """One write when a turn starts past half the bound, none on the next turns."""
    now = [time.time()]
    monkeypatch.setattr(liveness, "_wall", lambda: now[0])
    async with Host.open(store=str(tmp_path / "one.db")) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(responder=lambda request: ["ok"])), session_id="s"
        )
        calls = _count_registry_calls(host.store)
        await session.run("one")
        now[0] += MARKER_TTL_DEFAULT / 2 + 1
        await session.run("two")
        await session.run("three")
        assert calls.count("set_writer") == 1
        assert not host.claims_turns
        (row,) = (await host.store.writers()).values()
        assert json.loads(row)["at"] == round(now[0], 3)


async def test_a_twin_refused_at_its_end_makes_its_host_claim_without_a_registry(
    tmp_path, monkeypatch
):
    """Without a registry (a store keeping none, PostgreSQL's): B's turn of ``q1``, run
    while A answered it, is refused at its end (``AnsweredElsewhere``): proof another
    process writes the session, so B claims from then on. It did not: the loser of a
    twin writes nothing, so neither host ever took in the other's writes and every later
    twin was run twice (two real ``serve`` on main: 12 model runs for 6 twins)."""
    monkeypatch.setattr(Host, "_join_writers", _no_registry)
    b_provider = _Gated(steps=[["From B."]])
    async with two_web_servers(
        Agent(provider=ScriptedProvider(steps=[["From A."]])),
        Agent(provider=b_provider),
        store=str(tmp_path / "one.db"),
    ) as (_a, b, to_a, to_b):
        replies: dict[str, httpx.Response] = {}

        async def post_b() -> None:
            replies["b"] = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_b)
            await b_provider.entered.wait()
            await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))
            assert not b.host.claims_turns
            b_provider.gate.set()
        (end,) = [c for c in events(replies["b"].content)[:-1] if c["type"] == "error"]
        assert end["errorText"].endswith(ANSWERED_ELSEWHERE_MESSAGE)
        assert b.host.claims_turns


async def _no_registry(self: Host) -> None:
    """``Host._join_writers`` of a host whose store keeps no registry of its writers."""
