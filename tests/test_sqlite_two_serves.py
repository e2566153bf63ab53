"""Two embedded ``serve`` processes on one SQLite file, as a careless operator runs them
(two behind one balancer, or the CLI beside ``serve``), each taking turns of the same
session: a client's retry, edit or stale edit sent to the other one is told against what
the store holds, not what that process last read (branch ``sqliteattack``). Each server
here is its own Host and connection on the file, which is what a second process is to
the store; turns taken in turn by two processes are tests/test_concurrent_writers.py's."""

from __future__ import annotations

import httpx
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from runtime.app.unsaved import ANSWERED_ELSEWHERE_MESSAGE
from runtime.messages import UserMessage
from tests.test_web_http import body, events
from tests.web.harness import two_web_servers, web_server


async def _users(store, session_id: str) -> list[tuple[str, str]]:
    record = await store.load(session_id)
    return [(m.id, m.content) for m in record.messages if isinstance(m, UserMessage)]


def _text(raw: bytes) -> str:
    return "".join(c["delta"] for c in events(raw)[:-1] if "delta" in c)


async def test_a_retry_sent_to_the_other_server_replays_the_answer_and_runs_no_turn(tmp_path):
    db = str(tmp_path / "one.db")
    a_provider = ScriptedProvider(steps=[["From A."]])
    b_provider = ScriptedProvider(steps=[["From B."]])
    async with two_web_servers(
        Agent(provider=a_provider), Agent(provider=b_provider), store=db
    ) as (a, _b, to_a, to_b):
        await to_b.post("/api/chat", json=body("s", "zero", message_id="q0"))  # B holds s
        first = await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))
        again = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))
        assert again.status_code == 200 and _text(again.content) == "From A."
        assert events(again.content)[0]["messageId"] == events(first.content)[0]["messageId"]
        assert len(a_provider.requests) == 1 and len(b_provider.requests) == 1
        assert await _users(a.host.store, "s") == [("q0", "zero"), ("q1", "one")]


async def test_an_edit_sent_to_the_other_server_replaces_the_turn_it_did_not_run(tmp_path):
    db = str(tmp_path / "one.db")
    async with two_web_servers(
        Agent(provider=ScriptedProvider(steps=[["From A."]])),
        Agent(provider=ScriptedProvider(steps=[["From B."]])),
        store=db,
    ) as (a, _b, to_a, to_b):
        await to_b.post("/api/chat", json=body("s", "zero", message_id="q0"))
        await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))
        edit = await to_b.post("/api/chat", json=body("s", "one, edited", message_id="q1"))
        assert _text(edit.content) == "From B."
        stale = await to_b.post("/api/chat", json=body("s", "zero, edited", message_id="q0"))
        assert stale.status_code == 409
        record = await a.host.store.load("s")
        assert await _users(a.host.store, "s") == [("q0", "zero"), ("q1", "one, edited")]
        assert [m.role for m in record.messages] == ["user", "assistant"] * 2


async def test_an_ag_ui_run_sent_again_to_the_other_server_is_answered_with_its_turn(tmp_path):
    """The run's message is stored (by A), so B answers with the thread's snapshot: it
    was B's open session's, without A's turn, and the client took it as the thread."""
    from tests.test_agui import run, run_input, types, user

    db = str(tmp_path / "one.db")
    agui = {"protocols": ("ag-ui",)}
    async with (
        web_server(Agent(provider=ScriptedProvider(steps=[["From A."]])), store=db, **agui) as a,
        web_server(Agent(provider=ScriptedProvider(steps=[["From B."]])), store=db, **agui) as b,
    ):
        zero = user("zero", "u0")
        said = {"id": "b0", "role": "assistant", "content": "From B."}
        await run(b, run_input("t", zero, runId="r0"))  # B holds the thread
        await run(a, run_input("t", zero, said, user("one", "u1"), runId="r1"))
        again = await run(b, run_input("t", zero, said, user("one", "u1"), runId="r1"))
        assert types(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        (snapshot,) = [e["messages"] for e in again if e["type"] == "MESSAGES_SNAPSHOT"]
        assert [(m["role"], m["content"]) for m in snapshot] == [
            ("user", "zero"),
            ("assistant", "From B."),
            ("user", "one"),
            ("assistant", "From A."),
        ]
        assert len((await a.host.store.load("t")).messages) == 4


class _Gated(ScriptedProvider):
    """A scripted provider whose answer waits for ``gate``; ``entered`` is set once its
    turn has reached the model call."""

    def __init__(self, text: str) -> None:
        super().__init__(steps=[[text]])
        self.entered = trio.Event()
        self.gate = trio.Event()

    async def stream(self, request, emit) -> None:  # type: ignore[no-untyped-def]
        self.entered.set()
        await self.gate.wait()
        await super().stream(request, emit)


async def _no_registry(self: Host) -> None:
    """``Host._join_writers`` of a host whose store keeps no registry of its writers."""


async def test_the_same_message_sent_to_both_servers_at_once_is_answered_once(
    tmp_path, monkeypatch
):
    """A balancer retries a timed-out post on the other upstream while the first still
    runs: both processes run a turn for the one message. The second to save finds the
    stored copy of its message answered by the other: its turn is refused, not appended
    (``rebase`` dropped the stored copy and stored ``[answer A, q1, answer B]``).

    The hosts keep no registry of the file's writers here (as on a store without one):
    with it, B knows of A as it opens and claims ``q1`` before its model call, and A's
    post is a 409 (tests/test_twin_first_meeting.py); this pins the save's own rule."""
    monkeypatch.setattr(Host, "_join_writers", _no_registry)
    db = str(tmp_path / "one.db")
    b_provider = _Gated("From B.")
    async with two_web_servers(
        Agent(provider=ScriptedProvider(steps=[["From A."]])), Agent(provider=b_provider), store=db
    ) as (a, _b, to_a, to_b):
        b_provider.gate.set()
        await to_b.post("/api/chat", json=body("s", "zero", message_id="q0"))  # B holds s
        b_provider.gate = trio.Event()
        replies: dict[str, httpx.Response] = {}

        async def post_b() -> None:
            replies["b"] = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))

        async with trio.open_nursery() as nursery:
            b_provider.entered = trio.Event()
            nursery.start_soon(post_b)
            await b_provider.entered.wait()  # B's turn runs (q1 not stored yet)
            first = await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))
            b_provider.gate.set()
        # B's next turn sees A's answer, not its own refused one (forgotten unsaved).
        await to_b.post("/api/chat", json=body("s", "two", message_id="q2"))
        seen = b_provider.requests[-1].messages
        assert [(m.role, m.text if m.role == "assistant" else m.content) for m in seen][:5] == [
            ("user", "zero"),
            ("assistant", "From B."),
            ("user", "one"),
            ("assistant", "From A."),
            ("user", "two"),
        ]
        assert first.status_code == 200 and _text(first.content) == "From A."
        record = await a.host.store.load("s")
        assert [(m.role, m.text if m.role == "assistant" else m.id) for m in record.messages] == [
            ("user", "q0"),
            ("assistant", "From B."),
            ("user", "q1"),
            ("assistant", "From A."),
            ("user", "q2"),
            ("assistant", "From B."),
        ]
        (end,) = [c for c in events(replies["b"].content)[:-1] if c["type"] == "error"]
        assert end["errorText"].endswith(ANSWERED_ELSEWHERE_MESSAGE)
