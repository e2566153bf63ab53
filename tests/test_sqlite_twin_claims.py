"""The same message posted to two ``serve`` on one SQLite file at once is refused
before the second pays a model run (branch ``twinearly``).

twinserve made the second save of such a twin refused (``AnsweredElsewhere``), but only
at the loser's end: its whole model run was paid and streamed. A host that saw another
process write its sessions (:attr:`~runtime.app.host.Host.claims_turns`) now saves a
new turn's user message before its first model call: the twin that saves second meets
the first's answer after its message and ends ``not_saved`` without a model call; a
twin posted once the first's claim is stored is a 409 (the answer is being written
there). A host that never saw another writer saves as before: no write more a turn.
Each server here is its own Host and connection on the file (a second process to the
store), as in tests/test_sqlite_two_serves.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Hooks, Host
from runtime.app.unsaved import ANSWERED_ELSEWHERE_MESSAGE
from tests.test_http_attacks_2 import until
from tests.test_web_http import body, events
from tests.web.harness import two_web_servers, web_server


def _text(raw: bytes) -> str:
    return "".join(c["delta"] for c in events(raw)[:-1] if "delta" in c)


class _Held:
    """An ``on_turn_start`` hook that holds a turn whose message is ``q1`` (after its
    post was told against the store, before its claim) until ``go`` is set."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.go = trio.Event()

    async def __call__(self, started: Any) -> None:
        if started.input == "one":
            self.entered.set()
            await self.go.wait()


def _where(tmp_path: Any, request: Any, backend: str) -> str:
    """One store both servers open: an SQLite file, or the run's own PostgreSQL (two
    ``serve --run-turns-here`` on one database)."""
    if backend == "sqlite":
        return str(tmp_path / "one.db")
    return str(request.getfixturevalue("pg_url"))


def _stored(record: Any) -> list[tuple[str, str]]:
    return [(m.role, m.text if m.role == "assistant" else m.id) for m in record.messages]


async def _meet(to_a: httpx.AsyncClient, to_b: httpx.AsyncClient) -> None:
    """Each server takes in a turn of the other's: both know the file is shared (A
    opens the session as B stored it: no other writer seen yet)."""
    await to_b.post("/api/chat", json=body("s", "zero", message_id="q0"))
    await to_a.post("/api/chat", json=body("s", "zero a", message_id="qa"))
    await to_b.post("/api/chat", json=body("s", "zero b", message_id="qb"))
    await to_a.post("/api/chat", json=body("s", "zero c", message_id="qc"))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_twin_whose_turn_began_before_the_others_claim_is_refused_before_its_model_call(
    tmp_path, request, backend
):
    """Both posts were told against the store before either turn claimed (both held in
    ``on_turn_start``): A claims and answers; B's claim meets A's answer after ``q1`` and
    B's stream ends ``not_saved`` (the answered-elsewhere text): B's provider was never
    called for ``q1`` (before: called, its answer streamed, then refused)."""
    db = _where(tmp_path, request, backend)
    a_hold, b_hold = _Held(), _Held()
    a_provider = ScriptedProvider(steps=[["From A."]])
    b_provider = ScriptedProvider(steps=[["From B."]])
    async with two_web_servers(
        Agent(provider=a_provider, hooks=Hooks(on_turn_start=a_hold)),
        Agent(provider=b_provider, hooks=Hooks(on_turn_start=b_hold)),
        store=db,
    ) as (a, _b, to_a, to_b):
        await _meet(to_a, to_b)
        replies: dict[str, httpx.Response] = {}

        a_done = trio.Event()

        async def post(name: str, client: httpx.AsyncClient) -> None:
            replies[name] = await client.post("/api/chat", json=body("s", "one", message_id="q1"))
            if name == "a":
                a_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "a", to_a)
            nursery.start_soon(post, "b", to_b)
            await a_hold.entered.wait()
            await b_hold.entered.wait()
            a_hold.go.set()
            await a_done.wait()  # A's turn claimed, answered, saved
            b_hold.go.set()
        record = await a.host.store.load("s")
    assert len(b_provider.requests) == 2  # q0 and qb: none for q1
    assert _text(replies["a"].content) == "From A."
    assert replies["b"].status_code == 200 and _text(replies["b"].content) == ""
    (end,) = [c for c in events(replies["b"].content)[:-1] if c["type"] == "error"]
    assert end["errorText"].endswith(ANSWERED_ELSEWHERE_MESSAGE)
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From A.")]
    assert [m.id for m in record.messages].count("q1") == 1


class _Gated(ScriptedProvider):
    """A scripted provider whose answer waits for ``gate`` (set: no wait); ``entered``
    is set once a turn reached the model call."""

    def __init__(self, text: str) -> None:
        super().__init__(steps=[[text]])
        self.entered = trio.Event()
        self.gate = trio.Event()
        self.gate.set()

    async def stream(self, request, emit) -> None:  # type: ignore[no-untyped-def]
        self.entered.set()
        await self.gate.wait()
        await super().stream(request, emit)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_twin_posted_while_the_other_server_answers_it_is_a_409(tmp_path, request, backend):
    """A's claim of ``q1`` is stored and its model call runs; the same post reaching B
    is told against the store: the last user message, same content, a retry, whose
    answer another process is writing (the session's running marker, its writer
    alive): a 409 saying so, no turn (replaying it gave the empty claimed answer as
    the whole reply, a 200)."""
    db = _where(tmp_path, request, backend)
    a_provider = _Gated("From A.")
    b_provider = ScriptedProvider(steps=[["From B."]])
    async with two_web_servers(
        Agent(provider=a_provider), Agent(provider=b_provider), store=db
    ) as (a, _b, to_a, to_b):
        await _meet(to_a, to_b)
        a_provider.gate, a_provider.entered = trio.Event(), trio.Event()
        replies: dict[str, httpx.Response] = {}

        async def post_a() -> None:
            replies["a"] = await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_a)
            await a_provider.entered.wait()  # A's claim stored, its model call runs
            twin = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))
            a_provider.gate.set()
        record = await a.host.store.load("s")
    assert twin.status_code == 409, twin.content
    assert "another server is answering" in twin.json()["error"]
    assert len(b_provider.requests) == 2  # q0 and qb: none for q1
    assert _text(replies["a"].content) == "From A."
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From A.")]


def _count_saves(store: Any) -> list[int]:
    """Count ``store.save`` calls (the persister's writes) into the returned list."""
    calls: list[int] = []
    save = store.save

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await save(*args, **kwargs)

    store.save = counted
    return calls


async def test_a_host_that_saw_no_other_writer_saves_once_a_turn(tmp_path):
    """No claim on a host alone on its store: a one-step turn is one save, as before."""
    async with web_server(
        Agent(provider=ScriptedProvider(steps=[["Hi."]])), store=str(tmp_path / "one.db")
    ) as a:
        saves = _count_saves(a.host.store)
        async with httpx.AsyncClient(base_url=a.url) as to_a:
            for i in range(3):
                await to_a.post("/api/chat", json=body("s", f"m{i}", message_id=f"q{i}"))
        assert not a.host.claims_turns
    assert len(saves) == 3


async def test_a_host_that_saw_another_writer_claims_each_turn_with_one_save_more(tmp_path):
    """Once it took in the other's turn, its one-step turn is two saves: the claim, then
    the answer."""
    db = str(tmp_path / "one.db")
    async with two_web_servers(
        Agent(provider=ScriptedProvider(steps=[["A."]])),
        Agent(provider=ScriptedProvider(steps=[["B."]])),
        store=db,
    ) as (a, _b, to_a, to_b):
        await _meet(to_a, to_b)
        saves = _count_saves(a.host.store)
        await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))
        record = await a.host.store.load("s")
    assert len(saves) == 2
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "A.")]


async def test_a_twin_queued_behind_a_turn_is_refused_once_the_other_answered_it(tmp_path):
    """B is busy (its turn of ``x`` at the model call), so B's post of ``q1`` is queued
    without being told against the store; A answers ``q1`` meanwhile. When B's queued
    turn starts, its history holds A's ``q1`` (B's save of ``x`` was rebased after A's
    turn): the client's id is taken, so the message was answered there, and the turn
    ends ``not_saved`` before its model call (it ran with a new id for the message:
    ``q1`` and its answer stored twice)."""
    db = str(tmp_path / "one.db")
    b_provider = _Gated("From B.")
    async with two_web_servers(
        Agent(provider=ScriptedProvider(steps=[["From A."]])),
        Agent(provider=b_provider, on_busy="enqueue"),
        store=db,
    ) as (a, b, to_a, to_b):
        await _meet(to_a, to_b)
        b_provider.gate, b_provider.entered = trio.Event(), trio.Event()
        replies: dict[str, httpx.Response] = {}

        async def post_b(text: str, message_id: str) -> None:
            replies[message_id] = await to_b.post(
                "/api/chat", json=body("s", text, message_id=message_id)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_b, "x", "qx")
            await b_provider.entered.wait()  # B busy with x
            nursery.start_soon(post_b, "one", "q1")
            await until(lambda: b.host.sessions["s"].queued == 1)  # q1 queued on B
            first = await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))
            b_provider.gate.set()
        record = await a.host.store.load("s")
    assert _text(first.content) == "From A."
    assert len(b_provider.requests) == 3  # q0, qb, x: none for q1
    (end,) = [c for c in events(replies["q1"].content)[:-1] if c["type"] == "error"]
    assert end["errorText"].endswith(ANSWERED_ELSEWHERE_MESSAGE)
    assert [m.text for m in record.messages if m.role == "user"].count("one") == 1


async def test_an_edit_on_a_claiming_host_replaces_the_turn_and_runs(tmp_path):
    """The AI SDK's edit (the last message's id, other content) sent to the other
    server, both claiming: its claim rewrites the turn it replaces, then it runs."""
    db = str(tmp_path / "one.db")
    async with two_web_servers(
        Agent(provider=ScriptedProvider(steps=[["From A."]])),
        Agent(provider=ScriptedProvider(steps=[["From B."]])),
        store=db,
    ) as (a, b, to_a, to_b):
        await _meet(to_a, to_b)
        await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))
        edit = await to_b.post("/api/chat", json=body("s", "one, edited", message_id="q1"))
        assert a.host.claims_turns and b.host.claims_turns
        record = await a.host.store.load("s")
    assert _text(edit.content) == "From B."
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From B.")]
    assert [m.text for m in record.messages if m.role == "user"][-1] == "one, edited"


async def test_a_library_hosts_twin_refused_for_its_taken_id_is_never_stored_later(tmp_path):
    """Two library Hosts (no ``serve``: they keep unsaved turns) on one file, both
    claiming. B is sent ``q1`` after A answered it: its history holds A's ``q1`` (the
    id taken: B's copy got a new one), so the claim refuses it before its model call.
    The refused copy leaves B's history at once (it matched the store only after) and
    B's next turn stores none of it (before: the copy and its empty answer were
    written with that turn)."""
    db = str(tmp_path / "one.db")
    async with (
        Host.open(store=db, log_tap=False) as host_a,
        Host.open(store=db, log_tap=False) as host_b,
    ):
        a = await host_a.open_session(
            Agent(provider=ScriptedProvider(steps=[["A."]])), session_id="s"
        )
        b = await host_b.open_session(
            Agent(provider=ScriptedProvider(steps=[["B."]])), session_id="s"
        )
        for session, text in ((a, "zero"), (b, "zero b"), (a, "zero c"), (b, "zero d")):
            await session.run(text)  # each takes in the other's turn: both claim
        async with a.stream("one", user_message_id="q1") as out:
            async for _ in out:
                pass
        async with b.stream("one", user_message_id="q1") as twin:
            async for _ in twin:
                pass
        assert twin.result is not None and not twin.result.saved
        assert b.messages == (await host_b.store.load("s")).messages
        await b.run("two")
        record = await host_b.store.load("s")
    assert [m.content for m in record.messages if m.role == "user"][-2:] == ["one", "two"]
    assert b.messages == record.messages
