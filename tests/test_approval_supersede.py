"""A new user message over a turn that waits: what was decided stands (docs/approval.md,
"A new user message while a turn waits"). A person's recorded approval is not turned
into a denial by the next message: the approved call runs before the new input (its
turn's idempotency key), a denial keeps its reason, and only the calls nobody decided
are denied ``superseded``."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Hooks, Host, ToolContext, ToolMessage, tool
from runtime.events import SessionSaved, ToolApprovalDecided
from runtime.messages import AssistantMessage, UserMessage

ran: list[str] = []
keys: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str, ctx: ToolContext) -> str:
    """Delete a file."""
    ran.append(path)
    keys.append(ctx.idempotency_key)
    return f"deleted {path}"


slow_started = trio.Event()


@tool(needs_approval=True)
async def slow_delete(path: str) -> str:
    """Delete a file, slowly."""
    slow_started.set()
    await trio.sleep(10)
    ran.append(path)
    return f"deleted {path}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()
    keys.clear()


def deleting(*paths: str) -> list:
    return [
        c
        for i, path in enumerate(paths)
        for c in tool_call("delete_file", {"path": path}, tool_call_id=f"D{i}")
    ]


class Seen:
    """The scripted model: each request's messages, by role and text/result."""

    def __init__(self, *answers: list) -> None:
        self.answers = list(answers)
        self.requests: list[list[tuple[str, Any]]] = []

    def __call__(self, request: Any) -> list:
        self.requests.append(
            [
                (m.role, m.error or m.output if isinstance(m, ToolMessage) else m.text)
                for m in request.messages
            ]
        )
        return self.answers.pop(0)


async def test_an_approved_call_runs_before_the_new_message_instead_of_being_denied(tmp_path):
    model = Seen(deleting("/x"), ["fine"])
    agent = Agent(provider=ScriptedProvider(responder=model), tools=[delete_file])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        events = host.bus.subscribe([ToolApprovalDecided], name="t")
        session = await host.open_session(agent, session_id="s")
        first = await session.run("delete /x")
        recorded = await session.decide(first.pending[0].approval_id, approved=True)
        assert recorded.complete  # ... and nobody resumes it: the client never came back
        async with session.stream("and then?") as out:
            chunks = [c async for c in out]
        record = await host.store.load("s")
        decided: list = []
        events.inbox.drain_nowait(decided)
    assert ran == ["/x"]
    assert keys == [f"{first.turn_id}:0:D0"]  # the waiting turn's key, as a resume's
    # what the model saw: the tool's result, then the new message
    assert model.requests[-1][-3:-1] == [("tool", "deleted /x"), ("user", "and then?")]
    # the new turn's stream shows its own answer, nothing of the earlier call
    assert [c.type for c in chunks if c.type.startswith("tool")] == []
    assert out.result.text == "fine"
    assert record is not None
    assert [type(m) for m in record.messages] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        UserMessage,
        AssistantMessage,
    ]
    result = record.messages[2]
    assert (result.tool_call_id, result.output, result.error) == ("D0", "deleted /x", None)
    assert record.messages[1].content[0].awaiting.approved is True
    assert [(e.approved, e.reason) for e in decided] == [(True, None)]  # no "superseded"


async def test_a_decision_a_closed_host_recorded_is_run_by_the_next_message_elsewhere(tmp_path):
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        agent = Agent(provider=ScriptedProvider([deleting("/x")]), tools=[delete_file])
        session = await host.open_session(agent, session_id="s")
        first = await session.run("delete /x")
        await session.decide(first.pending[0].approval_id, approved=True)
    async with Host.open(store=path, log_tap=False) as host:  # serve restarted
        agent = Agent(provider=ScriptedProvider([["fine"]]), tools=[delete_file])
        session = await host.open_session(agent, session_id="s")
        await session.run("hello?")
        record = await host.store.load("s")
    assert ran == ["/x"]
    assert record is not None and record.messages[2].output == "deleted /x"


async def test_with_some_calls_undecided_the_approved_one_runs_and_the_others_are_superseded():
    model = Seen(deleting("/a", "/b", "/c"), ["ok"])
    agent = Agent(provider=ScriptedProvider(responder=model), tools=[delete_file])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        first = await session.run("delete three")
        a, b, _ = first.pending
        await session.decide(a.approval_id, approved=True)
        await session.decide(b.approval_id, approved=False, reason="keep b")
        await session.run("stop that")
    assert ran == ["/a"]
    results = [(m.tool_call_id, m.output, m.error) for m in session.messages[2:5]]
    assert results == [
        ("D0", "deleted /a", None),
        ("D1", None, "the tool call was denied: keep b"),
        ("D2", None, "the tool call was denied: superseded"),
    ]
    assert [type(m) for m in session.messages[5:]] == [UserMessage, AssistantMessage]
    assert session.pending == ()


async def test_an_approved_call_cut_by_an_interrupt_gets_an_interrupted_result(autojump_clock):
    agent = Agent(
        provider=ScriptedProvider(
            turns=[
                [[*tool_call("slow_delete", {"path": "/x"}, tool_call_id="S")]],
                [["never"]],
                [["ok"]],
            ]
        ),
        tools=[slow_delete],
        on_busy="interrupt",
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        first = await session.run("delete /x")
        await session.decide(first.pending[0].approval_id, approved=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "hello?")
            with trio.fail_after(60):
                await slow_started.wait()
            third = await session.run("stop")
    assert ran == []
    result = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert result.tool_call_id == "S" and result.output is None
    assert "interrupted" in (result.error or "")
    assert third.text == "ok"
    # a history every provider accepts: each call has its one result before the next user
    assert [type(m) for m in session.messages] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        UserMessage,
        AssistantMessage,  # "hello?", interrupted before its model call
        UserMessage,
        AssistantMessage,
    ]


async def test_over_http_a_new_message_after_a_decided_wait_runs_it_and_streams_its_own_turn(
    tmp_path,
):
    """The embedded app's continuation POST recorded the approval and its ``serve``
    stopped before running it; the person, back on a restarted ``serve``, types a new
    message instead of sending the answer again. The new message's stream is its own
    turn (nothing of the earlier call: ``useChat`` knows no such call in this message);
    the reloaded session shows the call with its output, not denied."""
    import httpx

    from tests.test_approval_web import DELETE, request_of
    from tests.test_approval_web import agent as web_agent
    from tests.test_approval_web import ran as web_ran
    from tests.test_web_http import body, events
    from tests.web.harness import web_server

    web_ran.clear()
    db = str(tmp_path / "w.db")
    async with web_server(web_agent(DELETE), store=db) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
        asked = request_of(first)
        await server.host.sessions["s"].decide(asked["approvalId"], approved=True)
    async with web_server(web_agent(["done"]), store=db) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("s", text="are you there?"))
            ui = (await client.get("/api/sessions/s?view=ui")).json()["ui_messages"]
    assert r.status_code == 200, r.text
    second = events(r.content)
    assert web_ran == ["/x"]  # once, before the new message's model call
    assert [c["type"] for c in second if c != "[DONE]" and c["type"].startswith("tool")] == []
    assert second[-2]["type"] == "finish" and second[-2]["finishReason"] == "stop"
    card = next(p for p in ui[1]["parts"] if p["type"] == "tool-delete_file")
    assert (card["state"], card["output"]) == ("output-available", "deleted /x")
    assert [m["role"] for m in ui] == ["user", "assistant", "user", "assistant"]


async def test_the_approved_calls_result_is_stored_before_the_new_messages_model_call(tmp_path):
    """A process that dies during the new message's model call must not leave the
    approved call looking unrun (the next message would run it again), as a
    continuation commits its results before the model goes on. Read from the store as
    the new turn's first step starts, once a save of it is answered."""
    seen: dict = {}
    path = tmp_path / "s.db"

    async def at_step(event: Any) -> None:
        with trio.fail_after(10):  # (a guard: without the save, none is ever answered)
            await saved.inbox.get()
        async with Host.open(store=path, log_tap=False) as other:
            seen["record"] = await other.store.load("s")

    async with Host.open(store=path, log_tap=False) as host:
        agent = Agent(provider=ScriptedProvider([deleting("/x")]), tools=[delete_file])
        session = await host.open_session(agent, session_id="s")
        first = await session.run("delete /x")
        await session.decide(first.pending[0].approval_id, approved=True)
    async with Host.open(store=path, log_tap=False) as host:
        saved = host.bus.subscribe([SessionSaved], name="saved")
        agent = Agent(
            provider=ScriptedProvider([["fine"]]),
            tools=[delete_file],
            hooks=Hooks(on_step_start=at_step),
        )
        session = await host.open_session(agent, session_id="s")
        result = await session.run("hello?")
    assert ran == ["/x"] and result.text == "fine"
    record = seen["record"]
    assert record is not None and record.messages[2].output == "deleted /x"
    assert [type(m) for m in record.messages][3:] == [UserMessage, AssistantMessage]
