"""AG-UI, A2A and the OpenAI-compatible endpoint, given a twin posted to one ``serve``
while another on the same SQLite file answers it (branch ``twinleft``).

twinearly made the AI SDK chat endpoint's retry of such a message a 409: the other
server's claim (:attr:`~runtime.app.host.Host.claims_turns`) stored the message with an
empty answer and a running marker, and replaying it gave that empty answer as the whole
reply. The other protocols have their own resend rules, which replayed it too: AG-UI a
``MESSAGES_SNAPSHOT`` with the empty answer (a 200), A2A the task read back from the
store as completed with nothing in it. Each now gives the refusal it gives for a thread
(context) running a run here. Two Hosts on one file, as tests/test_sqlite_twin_claims.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_agui import run_input, user
from tests.test_sqlite_twin_claims import _Gated, _meet, _stored
from tests.web.harness import two_web_servers

PROTOCOLS = ("ai-sdk", "ag-ui", "a2a", "openai")


async def _while_a_answers(
    a_url: str, b_url: str, a_provider: _Gated, post: Callable[[str], Awaitable[Any]]
) -> Any:
    """``post`` sent to A; once A's claim is stored and its model call runs, the same
    sent to B: B's reply (A's released after)."""
    replies: dict[str, Any] = {}

    async def to_a() -> None:
        replies["a"] = await post(a_url)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(to_a)
        await a_provider.entered.wait()
        replies["b"] = await post(b_url)
        a_provider.gate.set()
    return replies["b"]


async def _twin(
    tmp_path: Any, post: Callable[[str], Awaitable[Any]], session_id: str = "s"
) -> tuple[Any, list[Any], Any]:
    """Two servers on one file, both claiming (having met on ``s``); ``post`` (to
    session ``session_id``) sent to A, then while A answers, to B: B's reply, B's
    provider's requests and the stored session."""

    db = str(tmp_path / "one.db")
    a_provider = _Gated("From A.")
    b_provider = ScriptedProvider(steps=[["From B."]])
    async with two_web_servers(
        Agent(name="m", provider=a_provider),
        Agent(name="m", provider=b_provider),
        store=db,
        protocols=PROTOCOLS,
    ) as (a, b, to_a, to_b):
        await _meet(to_a, to_b)
        a_provider.gate, a_provider.entered = trio.Event(), trio.Event()
        reply = await _while_a_answers(a.url, b.url, a_provider, post)
        record = await a.host.store.load(session_id)
    return reply, b_provider.requests, record


def _openai_post(session_id: str) -> Callable[[str], Awaitable[httpx.Response]]:
    async def post(url: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            chat = {"model": "m", "messages": [{"role": "user", "content": "one"}]}
            headers = {"X-Axon-Session": session_id}
            return await client.post("/v1/chat/completions", json=chat, headers=headers)

    return post


async def test_an_openai_post_while_the_other_server_answers_its_session_is_session_busy(
    tmp_path,
):
    """The OpenAI API has no message ids: a post to B on a session A runs a turn of (its
    claim stored, its running marker live) is refused as a session running a turn here
    is, ``session_busy`` (was a second turn run beside A's, the question stored twice)."""

    async def post(url: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            chat = {"model": "m", "messages": [{"role": "user", "content": "one"}]}
            return await client.post(
                "/v1/chat/completions", json=chat, headers={"X-Axon-Session": "s"}
            )

    reply, b_requests, record = await _twin(tmp_path, post)
    assert reply.status_code == 409, reply.content
    assert reply.json()["error"]["code"] == "session_busy"
    assert "another server" in reply.json()["error"]["message"]
    assert len(b_requests) == 2  # q0 and qb: none for "one"
    assert [m.content for m in record.messages if m.role == "user"].count("one") == 1


async def test_an_agui_twin_posted_while_the_other_server_answers_it_is_thread_busy(tmp_path):
    """B's thread holds ``q1`` (A's claim) with an empty answer A is writing: a 409
    ``thread_busy``, as a thread running a run here (was a 200 snapshot holding the
    empty answer)."""

    async def post(url: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await client.post("/ag-ui", json=run_input("s", user("one", id="q1")))

    reply, b_requests, record = await _twin(tmp_path, post)
    assert reply.status_code == 409, reply.content
    assert reply.json()["code"] == "thread_busy"
    assert "another server" in reply.json()["error"]
    assert len(b_requests) == 2  # q0 and qb: none for q1
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From A.")]


async def test_an_openai_post_to_a_session_b_opens_while_a_answers_it_is_session_busy(
    tmp_path,
):
    """B never held session ``u`` open: it opens it at the version A's claim stored, so
    its twin check made no load and read no meta (the open's record held A's running
    marker unread): a second turn ran beside A's, ``one`` stored twice (branch
    ``attack3``). Now the open's record is read: ``session_busy``."""
    reply, b_requests, record = await _twin(tmp_path, _openai_post("u"), session_id="u")
    assert reply.status_code == 409, reply.content
    assert reply.json()["error"]["code"] == "session_busy"
    assert len(b_requests) == 2  # q0 and qb: none for "one"
    assert [m.content for m in record.messages if m.role == "user"] == ["one"]


def _send(text: str, message_id: str) -> dict[str, Any]:
    message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    message["contextId"] = "s"
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}


async def test_an_a2a_twin_sent_while_the_other_server_answers_it_is_refused(tmp_path):
    """B finds the message stored (A's claim) with the empty answer A is writing: the
    error a context running a task here gets (was that answer as a completed task)."""

    async def post(url: str) -> Any:
        async with httpx.AsyncClient(timeout=30) as client:
            return (await client.post(url + "/a2a/jsonrpc", json=_send("one", "m-1"))).json()

    reply, b_requests, record = await _twin(tmp_path, post)
    assert "error" in reply, reply
    assert "another server" in reply["error"]["message"]
    assert len(b_requests) == 2  # q0 and qb: none for m-1
    assert [m.role for m in record.messages][-2:] == ["user", "assistant"]
    assert record.messages[-1].text == "From A."


@pytest.mark.parametrize("on_busy", ["enqueue", "interrupt"])
async def test_an_openai_post_queued_while_the_other_server_answers_is_session_busy(
    tmp_path, on_busy
):
    """Under ``enqueue`` (or ``interrupt``) a post to B on a session A runs a turn of
    cannot wait behind A's turn nor stop it (no queue across two ``serve`` on a file):
    refused ``session_busy`` as under ``reject`` (was: a second turn run beside A's,
    ``one`` stored twice, B's provider called)."""
    db = str(tmp_path / "one.db")
    a_provider = _Gated("From A.")
    b_provider = ScriptedProvider(steps=[["From B."]])
    async with two_web_servers(
        Agent(name="m", provider=a_provider, on_busy=on_busy),
        Agent(name="m", provider=b_provider, on_busy=on_busy),
        store=db,
        protocols=PROTOCOLS,
    ) as (a, b, to_a, to_b):
        await _meet(to_a, to_b)
        a_provider.gate, a_provider.entered = trio.Event(), trio.Event()
        reply = await _while_a_answers(a.url, b.url, a_provider, _openai_post("s"))
        record = await a.host.store.load("s")
    assert reply.status_code == 409, reply.content
    assert reply.json()["error"]["code"] == "session_busy"
    assert "another server" in reply.json()["error"]["message"]
    assert len(b_provider.requests) == 2  # q0 and qb: none for "one"
    assert [m.content for m in record.messages if m.role == "user"].count("one") == 1
    assert [m.text for m in record.messages[-2:]] == ["one", "From A."]
