"""What the AI SDK's continuation ``POST /api/chat`` reads from the store (issue 21): in
the embedded app, with the session in memory, the answers are checked against the
session as the process holds it and the continuation starts from what the decision
stored, as ``session.respond`` does: no load, no version query. A view another writer
made stale is never trusted: the store is read then and decides, so the guarantees
(a 4xx that changes nothing for an unknown, decided or foreign id; exactly one of two
racing decisions; a decision after a restart) hold as before."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host
from runtime.approval import Decision, record_decision
from runtime.errors import StoreConflict
from tests.test_approval_reads import count_calls, delete_file, ran
from tests.test_approval_web import answer, approval_part, post
from tests.test_web_http import body, events
from tests.web.harness import web_server


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


ONE = [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]
TWO = [*ONE, *tool_call("delete_file", {"path": "/y"}, tool_call_id="E")]


def agent(first: list[Any]) -> Agent:
    return Agent(provider=ScriptedProvider([first, ["done"]]), tools=[delete_file])


def part_e(approval_id: str, approved: bool) -> dict[str, Any]:
    return {**approval_part(approval_id, approved), "toolCallId": "E", "input": {"path": "/y"}}


async def asked(client: httpx.AsyncClient, session_id: str = "s") -> tuple[str, list[str]]:
    """Start a turn that suspends: its message id and the approval ids it asks for."""
    first = await post(client, body(session_id))
    ids = [c["approvalId"] for c in first if c != "[DONE]" and c["type"] == "tool-approval-request"]
    return first[0]["messageId"], ids


async def test_the_answers_are_checked_against_the_session_in_memory_not_a_load(tmp_path):
    async with web_server(agent(ONE), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (key,) = await asked(client)
            calls = count_calls(server.host.store)
            r = await client.post("/api/chat", json=answer("s", mid, approval_part(key, True)))
    assert r.status_code == 200 and ran == ["/x"]
    assert events(r.content)[1]["type"] == "tool-output-available"
    assert calls["load"] == 0


async def test_the_continuation_resumes_from_the_decision_without_a_version_query(tmp_path):
    """The request resumes at once after the decision that completed the turn, as
    ``respond`` does (``Session.take_decided`` says why that needs no version query):
    the decision's save, the result's and the last step's, nothing else."""
    async with web_server(agent(ONE), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (key,) = await asked(client)
            calls = count_calls(server.host.store)
            r = await client.post("/api/chat", json=answer("s", mid, approval_part(key, True)))
            made = dict(calls)
            stored = await server.host.store.load("s")
    assert r.status_code == 200 and ran == ["/x"]
    assert made == {"save": 3}
    assert stored is not None and stored.messages[1].content[0].awaiting.approved is True


async def test_a_body_of_two_answers_saves_the_second_on_top_of_the_first(tmp_path):
    """The second decision of one body is made on what the first stored (the session's
    latest decision), not on the version the turn runner last saw, which its save would
    conflict with, costing a load."""
    async with web_server(agent(TWO), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (d, e) = await asked(client)
            both = answer("s", mid, approval_part(d, True))
            both["messages"][-1]["parts"].append(part_e(e, False))
            calls = count_calls(server.host.store)
            r = await client.post("/api/chat", json=both)
    assert r.status_code == 200 and ran == ["/x"]
    assert {"type": "tool-output-denied", "toolCallId": "E"} in events(r.content)
    assert calls["load"] == 0 and calls["version"] == 0


async def test_answers_one_request_at_a_time_read_nothing(tmp_path):
    """A page that answers each call as it is clicked: 202 for the first (the waiting
    count from what the decision left, not a read), the second (the first echoed in
    it, as the page sends what it holds) resumes the turn."""
    async with web_server(agent(TWO), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (d, e) = await asked(client)
            calls = count_calls(server.host.store)
            r1 = await client.post("/api/chat", json=answer("s", mid, approval_part(d, True)))
            both = answer("s", mid, approval_part(d, True))
            both["messages"][-1]["parts"].append(part_e(e, True))
            r2 = await client.post("/api/chat", json=both)
    assert (r1.status_code, r1.json()) == (202, {"recorded": True, "waiting": 1})
    assert r2.status_code == 200 and sorted(ran) == ["/x", "/y"]
    assert calls["load"] == 0 and calls["version"] == 0


async def test_a_decision_after_the_session_left_memory_loads_it_once(tmp_path):
    """As after a restart: the session is opened (its one load) and the answers are
    checked against what that load gave, not read again."""
    async with web_server(agent(ONE), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (key,) = await asked(client)
            session = server.host.sessions["s"]
            await server.host.close_session(session)
            assert "s" not in server.host.sessions
            calls = count_calls(server.host.store)
            r = await client.post("/api/chat", json=answer("s", mid, approval_part(key, True)))
    assert r.status_code == 200 and ran == ["/x"]
    assert events(r.content)[1] == {
        "type": "tool-output-available",
        "toolCallId": "D",
        "output": "deleted /x",
    }
    assert calls["load"] == 1 and calls["version"] == 0


async def test_unknown_and_foreign_ids_are_refused_after_a_read_and_change_nothing(tmp_path):
    async with web_server(agent(ONE), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (key,) = await asked(client)
            _, (theirs,) = await asked(client, "other")
            before = await server.host.store.load("s")
            calls = count_calls(server.host.store)
            unknown = await client.post(
                "/api/chat", json=answer("s", mid, approval_part("approval_nope", True))
            )
            foreign = await client.post(
                "/api/chat", json=answer("s", mid, approval_part(theirs, True))
            )
            loads = calls["load"]
            after = await server.host.store.load("s")
            ok = await client.post("/api/chat", json=answer("s", mid, approval_part(key, False)))
            again = await client.post("/api/chat", json=answer("s", mid, approval_part(key, True)))
    assert (unknown.status_code, foreign.status_code) == (404, 404)
    assert loads == 2  # each refusal comes from a read of the store
    assert before is not None and after is not None and after.version == before.version
    assert ok.status_code == 200 and again.status_code == 409 and ran == []


async def test_two_racing_decisions_for_one_id_exactly_one_wins(tmp_path):
    async with web_server(agent(ONE), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (key,) = await asked(client)
            responses: list[httpx.Response] = []

            async def decide(approved: bool) -> None:
                sent = answer("s", mid, approval_part(key, approved))
                responses.append(await client.post("/api/chat", json=sent))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(decide, True)
                nursery.start_soon(decide, False)
            stored = await server.host.store.load("s")
    assert sorted(r.status_code for r in responses) == [200, 409]
    won = next(r for r in responses if r.status_code == 200)
    approved = stored is not None and stored.messages[1].content[0].awaiting.approved
    assert ran == (["/x"] if approved else [])
    kind = "tool-output-available" if approved else "tool-output-denied"
    assert events(won.content)[1]["type"] == kind


async def test_a_decision_another_writer_made_first_is_refused_from_the_store(tmp_path):
    """The view in memory still shows the call waiting: the first answer's save on top
    of it conflicts, nothing is recorded, and the store's record refuses it."""
    path = tmp_path / "w.db"
    async with web_server(agent(ONE), store=str(path)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (key,) = await asked(client)
            async with Host.open(store=path, log_tap=False) as other:  # another process
                await record_decision(other.store, "s", key, Decision(approved=False), {})
                version = await other.store.version("s")
            r = await client.post("/api/chat", json=answer("s", mid, approval_part(key, True)))
            assert await server.host.store.version("s") == version
    assert r.status_code == 409 and ran == []


async def test_a_stale_view_does_not_refuse_a_body_the_store_takes(tmp_path):
    """Another process recorded the second call's decision; the page answers the first
    and sends the second's back as it holds it. Against the view in memory the second
    is no echo (there it still waits): recorded after the first, the store would refuse
    it, leaving the turn decided with nobody to resume it. So the first answer is saved
    on top of the view or not at all: its save conflicts, nothing is recorded, and on
    the store's record the second is an echo and the first completes the turn, as it
    would have without a view."""
    path = tmp_path / "w.db"
    async with web_server(agent(TWO), store=str(path)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (d, e) = await asked(client)
            async with Host.open(store=path, log_tap=False) as other:
                await record_decision(
                    other.store, "s", e, Decision(approved=False), {"delete_file": delete_file}
                )
            both = answer("s", mid, approval_part(d, True))
            both["messages"][-1]["parts"].append(part_e(e, False))
            r = await client.post("/api/chat", json=both)
    assert r.status_code == 200, r.text
    assert {"type": "tool-output-denied", "toolCallId": "E"} in events(r.content)
    assert ran == ["/x"]


async def test_a_view_in_memory_that_refuses_the_answer_is_not_believed(tmp_path):
    """The view in memory no longer has the call waiting (a new message superseded it
    here), but the store has it again (another process restored it): the store's
    record decides, not the view's refusal."""
    path = tmp_path / "w.db"
    async with web_server(agent(ONE), store=str(path)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            mid, (key,) = await asked(client)
            before = await server.host.store.load("s")
            assert before is not None
            await server.host.sessions["s"].run("something else")
            async with Host.open(store=path, log_tap=False) as other:
                version = await other.store.version("s")
                await other.store.save("s", 0, before.messages, expected_version=version)
            r = await client.post("/api/chat", json=answer("s", mid, approval_part(key, True)))
    assert r.status_code == 200, r.text
    assert ran == ["/x"]


async def test_deciding_on_a_version_the_session_is_no_longer_at_records_nothing(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider([ONE, ["done"]]), tools=[delete_file]),
            session_id="s",
        )
        waiting = await session.run("go")
        held = session.held_record()
        assert held is not None
        with pytest.raises(StoreConflict):
            await session.decide(
                waiting.pending[0].approval_id, approved=True, expected_version=held.version - 1
            )
        assert await host.store.version("s") == held.version
        recorded = await session.decide(
            waiting.pending[0].approval_id, approved=True, expected_version=held.version
        )
    assert recorded.complete and recorded.version > held.version
