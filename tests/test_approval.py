"""Durable tool approval and client-side tools (docs/approval.md): a turn suspends with
its waiting calls in the store, and a decision resumes it, in this host or a new one."""

from __future__ import annotations

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import (
    Agent,
    AlreadyDecided,
    Host,
    InvalidDecision,
    NothingToResume,
    Tool,
    ToolContext,
    ToolMessage,
    UnknownApproval,
    tool,
)
from runtime.events import ToolApprovalDecided, ToolApprovalRequested
from runtime.messages import AssistantMessage, UserMessage
from tests.support.grammar import check_grammar

ran: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return f"deleted {path}"


@tool
async def list_files() -> str:
    """List the files."""
    ran.append("list")
    return "a.txt"


@tool(needs_approval=lambda args, ctx: args["amount"] > 100)
async def pay(amount: int) -> str:
    """Pay an amount."""
    ran.append(f"pay {amount}")
    return "paid"


pick_color = Tool.client(
    "pick_color",
    {"type": "object", "properties": {"hint": {"type": "string"}}},
    "Ask the user to pick a color.",
    output_schema={"type": "string"},
)


def agent(*steps: list, tools: list | None = None) -> Agent:
    return Agent(
        provider=ScriptedProvider(list(steps)),
        tools=tools if tools is not None else [delete_file, list_files, pay, pick_color],
    )


def deleting() -> list:
    return [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


async def suspended(host: Host, *first: list, session_id: str = "s") -> tuple:
    """A session whose first turn suspended after ``first`` steps (then ``"ok"``)."""
    session = await host.open_session(agent(*first, ["ok"]), session_id=session_id)
    async with session.stream("go") as out:
        chunks = [c async for c in out]
    return session, out.result, chunks


async def test_a_call_needing_approval_suspends_the_turn_with_its_request_stored(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        _, result, chunks = await suspended(host, deleting())
        record = await host.store.load("s")
    assert ran == []
    check_grammar(chunks)
    assert result.finish_reason == "awaiting-input"
    asked = [c for c in chunks if c.type == "tool-approval-request"]
    assert [(c.tool_call_id, c.approval_id) for c in asked] == [
        ("D", result.pending[0].approval_id)
    ]
    assert chunks[-1].type == "finish" and chunks[-1].finish_reason == "awaiting-input"
    part = record.messages[1].content[0]
    assert (part.tool_call_id, part.awaiting.kind, part.awaiting.decided) == (
        "D",
        "approval",
        False,
    )
    assert not any(isinstance(m, ToolMessage) for m in record.messages)


async def test_a_new_host_on_the_same_file_resumes_the_turn_on_respond(tmp_path):
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        _, first, _ = await suspended(host, deleting())
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent(["unused"], ["resumed"]), session_id="s")
        result = await session.respond(first.pending[0].approval_id, approved=True)
    assert ran == ["/x"]
    assert result.finish_reason == "stop" and result.text == "resumed"
    assert result.message.id == first.message.id  # the same assistant message goes on
    assert [type(m).__name__ for m in session.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
    ]
    assert [p.step for p in session.messages[1].content] == [0, 1]


async def test_an_approved_call_runs_exactly_once():
    async with Host.open(log_tap=False) as host:
        session, first, _ = await suspended(host, deleting())
        await session.respond(first.pending[0].approval_id, approved=True)
        with pytest.raises(AlreadyDecided):
            await session.respond(first.pending[0].approval_id, approved=True)
        with pytest.raises(NothingToResume):
            async with session.resume():
                pass
    assert ran == ["/x"]


async def test_a_denial_reaches_the_model_with_its_reason_and_streams_tool_output_denied():
    async with Host.open(log_tap=False) as host:
        session, first, _ = await suspended(host, deleting())
        await session.decide(first.pending[0].approval_id, approved=False, reason="not today")
        async with session.resume() as out:
            chunks = [c async for c in out]
    assert ran == []
    check_grammar(chunks)
    denied = [c for c in chunks if c.type == "tool-output-denied"]
    assert [(c.tool_call_id, c.reason) for c in denied] == [("D", "not today")]
    assert chunks[0].type == "start" and chunks[0].message_id == first.message.id
    assert chunks[1].type == "tool-output-denied"  # before the next step starts
    result = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert result.error == "the tool call was denied: not today"


async def test_a_call_needing_no_approval_in_the_same_step_runs_before_the_turn_suspends():
    step = [
        *tool_call("list_files", {}, tool_call_id="L"),
        *tool_call("delete_file", {"path": "/x"}, tool_call_id="D"),
    ]
    async with Host.open(log_tap=False) as host:
        session, result, _ = await suspended(host, step)
        results = [m for m in session.messages if isinstance(m, ToolMessage)]
    assert ran == ["list"]
    assert [r.tool_call_id for r in results] == ["L"]
    assert [p.tool_call_id for p in result.pending] == ["D"]


async def test_a_per_call_rule_decides_which_calls_wait():
    step = [
        *tool_call("pay", {"amount": 5}, tool_call_id="small"),
        *tool_call("pay", {"amount": 500}, tool_call_id="big"),
    ]
    async with Host.open(log_tap=False) as host:
        _, result, _ = await suspended(host, step)
    assert ran == ["pay 5"]
    assert [p.tool_call_id for p in result.pending] == ["big"]


async def test_a_client_tool_suspends_without_an_approval_request_and_takes_the_output():
    step = [*tool_call("pick_color", {"hint": "warm"}, tool_call_id="C")]
    async with Host.open(log_tap=False) as host:
        session, first, chunks = await suspended(host, step)
        assert not any(c.type == "tool-approval-request" for c in chunks)
        assert [(p.kind, p.approval_id) for p in first.pending] == [("client", "C")]
        result = await session.respond("C", output="red")
    assert result.finish_reason == "stop"
    assert next(m for m in session.messages if isinstance(m, ToolMessage)).output == "red"


async def test_a_client_tool_output_its_schema_refuses_changes_nothing():
    step = [*tool_call("pick_color", {}, tool_call_id="C")]
    async with Host.open(log_tap=False) as host:
        session, _, _ = await suspended(host, step)
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision, match="invalid output for pick_color"):
            await session.respond("C", output=42)
        with pytest.raises(InvalidDecision):
            await session.respond("C", approved=True)  # a client tool is not approved
        after = await host.store.load("s")
    assert after.messages == before.messages and after.version == before.version


async def test_unknown_and_foreign_ids_are_refused_and_change_nothing():
    async with Host.open(log_tap=False) as host:
        session, first, _ = await suspended(host, deleting())
        other, _, _ = await suspended(host, deleting(), session_id="other")
        before = await host.store.load("s")
        with pytest.raises(UnknownApproval):
            await session.respond("approval_nope", approved=True)
        with pytest.raises(UnknownApproval):
            await other.respond(first.pending[0].approval_id, approved=True)
        with pytest.raises(InvalidDecision):
            await session.respond(first.pending[0].approval_id, output="x")
        after = await host.store.load("s")
    assert after.version == before.version and ran == []


async def test_of_two_racing_decisions_for_one_call_exactly_one_wins(tmp_path):
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        _, first, _ = await suspended(host, deleting())
    outcomes: list[str] = []
    async with (
        Host.open(store=path, log_tap=False) as one,
        Host.open(store=path, log_tap=False) as two,
    ):
        a = await one.open_session(agent(["a"]), session_id="s")
        b = await two.open_session(agent(["b"]), session_id="s")

        async def decide(session, approved: bool) -> None:
            try:
                await session.decide(first.pending[0].approval_id, approved=approved)
                outcomes.append(f"won {approved}")
            except AlreadyDecided:
                outcomes.append("refused")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(decide, a, True)
            nursery.start_soon(decide, b, False)
        record = await one.store.load("s")
    assert sorted(outcomes)[0] == "refused" and len(outcomes) == 2
    winner = outcomes[0] if outcomes[0] != "refused" else outcomes[1]
    assert record.messages[1].content[0].awaiting.approved == (winner == "won True")


async def test_a_new_user_message_denies_the_waiting_calls_as_superseded():
    async with Host.open(log_tap=False) as host:
        provider = ScriptedProvider(turns=[[deleting()], [["new answer"]]])
        session = await host.open_session(
            Agent(provider=provider, tools=[delete_file]), session_id="s"
        )
        first = await session.run("go")
        second = await session.run("never mind, something else")
    assert first.finish_reason == "awaiting-input" and second.text == "new answer"
    assert ran == []
    denial = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert denial.error == "the tool call was denied: superseded"
    assert [type(m) for m in session.messages] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        UserMessage,
        AssistantMessage,
    ]
    assert session.pending == ()


async def test_the_bus_hears_the_request_and_the_decision():
    async with Host.open(log_tap=False) as host:
        events = host.bus.subscribe([ToolApprovalRequested, ToolApprovalDecided], name="t")
        session, first, _ = await suspended(host, deleting())
        await session.respond(first.pending[0].approval_id, approved=False, reason="no")
        seen = [events.inbox.get_nowait(), events.inbox.get_nowait()]
    assert [type(e) for e in seen] == [ToolApprovalRequested, ToolApprovalDecided]
    assert seen[1].approved is False and seen[1].reason == "no"


async def test_an_mcp_servers_tool_needing_approval_suspends_the_same_way():
    from tests.test_mcp import calling, stdio_server, tool_messages

    agent = Agent(
        provider=calling(("add", {"a": 1, "b": 2}), ("echo", {"text": "free"})),
        tools=[stdio_server(needs_approval=["add"])],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        first = await session.run("go")
        assert [p.tool_name for p in first.pending] == ["add"]
        assert list(tool_messages(session)) == ["echo"]  # the free one ran
        result = await session.respond(first.pending[0].approval_id, approved=True)
    assert result.finish_reason == "stop"
    assert tool_messages(session)["add"].output is not None


async def test_an_agent_used_as_a_tool_can_need_approval():
    helper = Agent(name="helper", provider=ScriptedProvider([["helped"]]))
    parent = agent(
        [*tool_call("helper", {"input": "do it"}, tool_call_id="H")],
        ["ok"],
        tools=[helper.as_tool(needs_approval=True)],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(parent)
        first = await session.run("go")
        result = await session.respond(first.pending[0].approval_id, approved=True)
    assert [p.tool_name for p in first.pending] == ["helper"]
    assert next(m for m in session.messages if isinstance(m, ToolMessage)).output == "helped"
    assert result.finish_reason == "stop"


async def test_a_superseded_approval_is_announced_as_denied():
    provider = ScriptedProvider(turns=[[deleting()], [["fine"]]])
    async with Host.open(log_tap=False) as host:
        events = host.bus.subscribe([ToolApprovalDecided], name="t")
        session = await host.open_session(Agent(provider=provider, tools=[delete_file]))
        await session.run("go")
        await session.run("something else")
        decided = events.inbox.get_nowait()
    assert (decided.tool_call_id, decided.approved, decided.reason) == ("D", False, "superseded")


async def test_a_turn_can_wait_twice_in_one_message():
    steps = [
        deleting(),
        [*tool_call("delete_file", {"path": "/y"}, tool_call_id="E")],
        ["both done"],
    ]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(*steps))
        first = await session.run("go")
        second = await session.respond(first.pending[0].approval_id, approved=True)
        assert second.finish_reason == "awaiting-input"
        assert [p.tool_call_id for p in second.pending] == ["E"]
        third = await session.respond(second.pending[0].approval_id, approved=True)
    assert third.text == "both done" and ran == ["/x", "/y"]
    assert first.message.id == second.message.id == third.message.id
    assert [p.step for p in third.message.content] == [0, 1, 2]
    assert [type(m).__name__ for m in session.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "ToolMessage",
    ]


class BothLoadFirst:
    """A store whose first two loads both return before either caller saves: two
    decisions that truly race (each based on the same version)."""

    def __init__(self, store) -> None:
        self.store, self.loads, self.both = store, 0, trio.Event()

    async def load(self, session_id: str):
        record = await self.store.load(session_id)
        self.loads += 1
        if self.loads == 2:
            self.both.set()
        if self.loads <= 2:
            await self.both.wait()
        return record

    async def save(self, *args, **kwargs):
        return await self.store.save(*args, **kwargs)


async def test_two_decisions_based_on_the_same_version_one_is_refused(tmp_path):
    from runtime.approval import Decision, record_decision

    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        _, first, _ = await suspended(host, deleting())
        racing = BothLoadFirst(host.store)
        outcomes: list[str] = []

        async def decide(approved: bool) -> None:
            try:
                await record_decision(
                    racing, "s", first.pending[0].approval_id, Decision(approved=approved), {}
                )
                outcomes.append("recorded")
            except AlreadyDecided:
                outcomes.append("refused")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(decide, True)
            nursery.start_soon(decide, False)
    assert sorted(outcomes) == ["recorded", "refused"]
    assert racing.loads == 3  # the loser loaded again after its save conflicted


async def test_the_approved_call_runs_under_the_suspended_turns_idempotency_key():
    keys: list[str] = []

    @tool(needs_approval=True)
    async def charge(amount: int, context: ToolContext) -> str:
        """Charge an amount."""
        keys.append(context.idempotency_key)
        return "charged"

    steps = [[*tool_call("charge", {"amount": 5}, tool_call_id="C")], ["ok"]]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(*steps, tools=[charge]))
        first = await session.run("go")
        await session.respond(first.pending[0].approval_id, approved=True)
    assert keys == [f"{first.turn_id}:0:C"]


async def test_a_rebuilt_waiting_turn_asks_again_and_a_rebuilt_denial_shows_as_denied():
    from runtime.app.web.resume import stored_turn_chunks

    async with Host.open(log_tap=False) as host:
        session, first, _ = await suspended(host, deleting())
        waiting = stored_turn_chunks((await host.store.load("s")).messages)
        await session.respond(first.pending[0].approval_id, approved=False, reason="no")
        denied = stored_turn_chunks((await host.store.load("s")).messages)
    asks = [c for c in waiting if c.type == "tool-approval-request"]
    assert [c.approval_id for c in asks] == [first.pending[0].approval_id]
    assert waiting[-1].type == "finish" and waiting[-1].finish_reason == "awaiting-input"
    assert [c.reason for c in denied if c.type == "tool-output-denied"] == ["no"]
    assert denied[-1].finish_reason == "stop"


def test_the_terminal_shows_a_waiting_call_and_a_denial():
    import io

    from rich.console import Console

    from runtime import output as o
    from runtime.app.render import TerminalRenderer

    buffer = io.StringIO()
    renderer = TerminalRenderer(Console(file=buffer, width=100))
    renderer.render(
        o.ToolApprovalRequest(step=0, tool_call_id="D", tool_name="rm", approval_id="a1")
    )
    renderer.render(o.ToolOutputDenied(step=0, tool_call_id="D", tool_name="rm", reason="no"))
    assert "rm waits for approval (a1)" in buffer.getvalue()
    assert "rm denied: no" in buffer.getvalue()


async def test_a_second_resume_in_one_host_is_refused():
    from runtime import SessionBusy

    async with Host.open(log_tap=False) as host:
        session, first, _ = await suspended(host, deleting())
        await session.decide(first.pending[0].approval_id, approved=True)
        async with session.resume() as out:
            with pytest.raises(SessionBusy):
                async with session.resume():
                    pass
            await out.collect()
        with pytest.raises(NothingToResume):
            async with session.resume():
                pass
    assert ran == ["/x"]


async def test_a_waiting_session_is_freed_from_memory_and_resumes_from_the_store(autojump_clock):
    async with Host.open(idle_ttl=60, log_tap=False) as host:
        session, first, _ = await suspended(host, deleting())
        await trio.sleep(61)
        assert not session.loaded  # the wait holds nothing in memory
        result = await session.respond(first.pending[0].approval_id, approved=True)
    assert result.finish_reason == "stop" and ran == ["/x"]


async def test_a_repeated_call_id_is_renamed_before_its_approval_is_asked(tmp_path):
    # A server numbering calls per response: call_0 in every step.
    script = [
        [*tool_call("list_files", {}, tool_call_id="call_0")],
        [*tool_call("delete_file", {"path": "/x"}, tool_call_id="call_0")],
        [*tool_call("list_files", {}, tool_call_id="call_0")],
        ["done"],
    ]
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent(*script), session_id="s")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
        first = out.result
        asked = [
            (c.tool_call_id, c.approval_id) for c in chunks if c.type == "tool-approval-request"
        ]
        assert asked == [("call_0-1", first.pending[0].approval_id)]
        assert ran == ["list"]
        result = await session.respond(first.pending[0].approval_id, approved=True)
    assert ran == ["list", "/x", "list"]
    assert result.finish_reason == "stop" and result.text == "done"
    calls = [p.tool_call_id for p in session.messages[1].content if hasattr(p, "tool_call_id")]
    assert calls == ["call_0", "call_0-1", "call_0-2"]
    outputs = [(m.tool_call_id, m.output) for m in session.messages if isinstance(m, ToolMessage)]
    assert outputs == [("call_0", "a.txt"), ("call_0-1", "deleted /x"), ("call_0-2", "a.txt")]
