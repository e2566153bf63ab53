"""Approving a sub-agent's passed-up approval with edits (``as_tool(pass_approvals=True)``,
docs/approval.md "Approving with edits"): the edit is of the sub-agent's call that asks
(``Awaiting.asked_tool``/``asked_input``, stored with the calling call's wait), checked
against that tool's schema on the calling session, kept on the calling call's wait
(``Awaiting.edited_input``) and passed down when the call runs again: the sub-session's
call stores it as its input (the model's kept beside it), and the sub-agent's tool runs
it once. Embedded host, SQLite."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import AlreadyDecided, Host, SessionBusy
from runtime.agent import Agent
from runtime.errors import InvalidDecision
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage
from tests.test_approval_nested_pass import SUB, parent, ran
from tests.test_mcp import stdio_server


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def calls(messages: Any) -> list[ToolCallPart]:
    return [
        p
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]


async def test_a_passed_up_approval_approved_with_edits_runs_the_sub_agents_tool_once_with_it(
    tmp_path,
):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        waited = await session.run("go")
        (pending,) = waited.pending
        result = await session.respond(pending.approval_id, approved=True, edited_input={"to": "y"})
        calling = await host.store.load("s")
        sub = await host.store.load(SUB)
    assert (pending.asked_tool, pending.asked_input) == ("wire_money", {"to": "x"})
    assert result is not None and result.text == "parent saw: paid"
    assert ran == ["y"]  # once, with the edit
    assert calling is not None and sub is not None
    (held,) = calls(calling.messages)
    assert held.input == {"input": "pay x"}  # the agent tool's own prompt stays
    assert held.awaiting is not None and held.awaiting.edited_input == {"to": "y"}
    assert held.awaiting.original_input is None and held.awaiting.asked_input == {"to": "x"}
    (asked,) = calls(sub.messages)
    assert asked.input == {"to": "y"}  # the sub-session's call: the edit, the model's kept
    assert asked.awaiting is not None and asked.awaiting.original_input == {"to": "x"}
    assert asked.awaiting.approved is True


async def test_the_sub_agents_model_reads_the_edited_call_on_its_next_request(tmp_path):
    seen: list[Any] = []

    def helper_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return tool_call("wire_money", {"to": "x"}, tool_call_id="W")
        seen.extend(calls(request.messages))
        return ["paid"]

    from tests.test_approval_nested_pass import _parent_model, wire_money

    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=helper_model), tools=[wire_money]
    )
    agent = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        waited = await session.run("go")
        await session.respond(
            waited.pending[0].approval_id, approved=True, edited_input={"to": "z"}
        )
    assert [c.input for c in seen] == [{"to": "z"}]


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"approved": True, "edited_input": {"to": 5}}, "invalid arguments for wire_money"),
        ({"approved": True, "edited_input": {"to": "y", "amount": 9}}, "names 'amount'"),
        ({"approved": True, "edited_input": {"input": "pay y"}}, "names 'input'"),
        ({"approved": True, "edited_input": "pay y"}, "must be a JSON object"),
        ({"approved": False, "edited_input": {"to": "y"}}, "approved=True only"),
    ],
)
async def test_an_edit_of_a_passed_up_approval_that_does_not_fit_records_nothing_anywhere(
    tmp_path, answer, says
):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        waited = await session.run("go")
        before = (await host.store.load("s"), await host.store.load(SUB))
        with pytest.raises(InvalidDecision, match=says):
            await session.respond(waited.pending[0].approval_id, **answer)
        after = (await host.store.load("s"), await host.store.load(SUB))
        assert [(r.version, r.messages) for r in after] == [  # type: ignore[union-attr]
            (r.version, r.messages)  # type: ignore[union-attr]
            for r in before
        ]
        await session.respond(waited.pending[0].approval_id, approved=True)
    assert ran == ["x"]


async def test_an_edit_equal_to_the_sub_calls_input_is_a_plain_approval(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        waited = await session.run("go")
        await session.respond(
            waited.pending[0].approval_id, approved=True, edited_input={"to": "x"}
        )
        sub = await host.store.load(SUB)
        calling = await host.store.load("s")
    assert ran == ["x"]
    assert calls(calling.messages)[0].awaiting.edited_input is None  # type: ignore[union-attr]
    assert calls(sub.messages)[0].awaiting.original_input is None  # type: ignore[union-attr]


async def test_an_edit_recorded_without_its_continuation_runs_as_the_next_message_begins(
    tmp_path,
):
    """Decided, then a new message instead of the continuation: the approved calling call
    runs before it, and passes the edit down."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        waited = await session.run("go")
        await session.decide(waited.pending[0].approval_id, approved=True, edited_input={"to": "q"})
        await session.run("something else")
        sub = await host.store.load(SUB)
    assert ran == ["q"]
    assert calls(sub.messages)[0].input == {"to": "q"}  # type: ignore[union-attr]


async def test_two_racing_edits_of_a_passed_up_approval_record_one_and_run_it(tmp_path):
    """Two hosts on one SQLite file decide at once (and a third decision after): one is
    recorded, the other refused, and the sub-agent's tool runs the recorded edit once."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        key = (await (await host.open_session(parent(), session_id="s")).run("go")).pending[0]
    outcomes: dict[str, Any] = {}
    async with (
        Host.open(store=db, log_tap=False) as one,
        Host.open(store=db, log_tap=False) as two,
    ):
        a = await one.open_session(parent(), session_id="s")
        b = await two.open_session(parent(), session_id="s")

        async def decide(name: str, session: Any, to: str) -> None:
            try:
                outcomes[name] = await session.decide(
                    key.approval_id, approved=True, edited_input={"to": to}
                )
            except (AlreadyDecided, SessionBusy) as exc:
                outcomes[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(decide, "a", a, "ya")
            nursery.start_soon(decide, "b", b, "yb")
        won = [n for n, o in outcomes.items() if not isinstance(o, Exception)]
        assert len(won) == 1, outcomes
        with pytest.raises(AlreadyDecided):
            await a.decide(key.approval_id, approved=True, edited_input={"to": "late"})
        winner = a if won == ["a"] else b
        await winner.reopen()
        async with winner.resume() as out:
            async for _ in out:
                pass
    assert ran == [{"a": "ya", "b": "yb"}[won[0]]]


async def test_an_mcp_tool_of_a_sub_agent_is_edited_against_the_schema_its_server_listed(
    tmp_path,
):
    """The sub-agent's tool is an MCP server's: the calling call's wait stores the schema
    the sub call stored, and the edit is checked against it on the calling session (the
    calling agent has no such tool, nor that server)."""

    def helper_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return tool_call("add", {"a": 1, "b": 2}, tool_call_id="A")
        result = [m for m in request.messages if isinstance(m, ToolMessage)][-1]
        return [f"sum {result.output}"]

    def parent_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return tool_call("helper", {"input": "add"}, tool_call_id="H")
        result = [m for m in request.messages if isinstance(m, ToolMessage)][-1]
        return [f"parent saw: {result.output}"]

    helper = Agent(
        name="helper",
        provider=ScriptedProvider(responder=helper_model),
        tools=[stdio_server(needs_approval=["add"])],
    )
    agent = Agent(
        provider=ScriptedProvider(responder=parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        waited = await session.run("go")
        key = waited.pending[0].approval_id
        with pytest.raises(InvalidDecision, match="invalid arguments for add"):
            await session.respond(key, approved=True, edited_input={"a": "one", "b": 2})
        result = await session.respond(key, approved=True, edited_input={"a": 20, "b": 2})
        sub = await host.store.load(SUB)
    assert waited.pending[0].asked_tool == "add"
    assert result is not None and result.text == "parent saw: sum 22"
    assert calls(sub.messages)[0].input == {"a": 20, "b": 2}  # type: ignore[union-attr]


async def test_a_passed_up_approval_two_agents_deep_is_edited_in_the_innermost_call(tmp_path):
    """``top`` -> ``middle`` -> ``helper``: the edit goes down through ``middle``'s
    waiting call (its own ``edited_input``) to ``helper``'s call, which runs it."""
    from tests.test_approval_nested_pass import _grand_parent

    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_grand_parent(), session_id="s")
        asked = await session.run("go")
        (pending,) = asked.pending
        with pytest.raises(InvalidDecision, match="names 'input', which wire_money"):
            await session.respond(pending.approval_id, approved=True, edited_input={"input": "y"})
        result = await session.respond(
            pending.approval_id, approved=True, edited_input={"to": "deep"}
        )
        middle = await host.store.load("s.middle.T")
        inner = await host.store.load("s.middle.T.helper.M")
    assert (pending.asked_tool, pending.asked_input) == ("wire_money", {"to": "x"})
    assert result is not None and result.text == "top saw: middle saw: paid"
    assert ran == ["deep"]
    (held,) = calls(middle.messages)  # type: ignore[union-attr]
    assert held.input == {"input": "pay x"}
    assert held.awaiting is not None and held.awaiting.edited_input == {"to": "deep"}
    (innermost,) = calls(inner.messages)  # type: ignore[union-attr]
    assert innermost.input == {"to": "deep"}
    assert innermost.awaiting is not None and innermost.awaiting.original_input == {"to": "x"}


async def test_each_approval_a_sub_step_passes_up_in_turn_takes_its_own_edit(tmp_path):
    """A sub-step asking for two approvals passes them one at a time on the same calling
    call: each names its own sub call, and each edit reaches its own call."""
    from tests.test_approval_nested_pass_many import _calling, _pays_twice_model

    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_calling(_pays_twice_model), session_id="s")
        asked = await session.run("go")
        again = await session.respond(
            asked.pending[0].approval_id, approved=True, edited_input={"to": "x2"}
        )
        assert again is not None and again.finish_reason == "awaiting-input"
        second = again.pending[0]
        result = await session.respond(second.approval_id, approved=True, edited_input={"to": "y2"})
        sub = await host.store.load(SUB)
    assert (asked.pending[0].asked_input, second.asked_input) == ({"to": "x"}, {"to": "y"})
    assert result is not None and result.finish_reason == "stop"
    assert sorted(ran) == ["x2", "y2"]  # (the sub-step's two calls run at once)
    assert [c.input for c in calls(sub.messages)] == [{"to": "x2"}, {"to": "y2"}]  # type: ignore[union-attr]


async def test_the_pages_echo_of_an_edited_passed_up_approval_after_a_202_is_taken():
    """Two sub-agent calls each pass an approval up; the page answers the first with an
    edit (202), then sends both answers: the first repeats its recorded edit (of the
    sub call, not of the agent tool's input), which is an echo, not a second decision."""
    import httpx

    from runtime.app.web.answers import EDITED_INPUT
    from tests.test_approval_nested_pass_many import _two_sub_agents
    from tests.test_approval_web import answer, post
    from tests.test_web_http import body
    from tests.web.harness import web_server

    def part(approval_id: str, call_id: str, said: str, **edit: Any) -> dict[str, Any]:
        return {
            "type": "tool-helper",
            "toolCallId": call_id,
            "state": "approval-responded",
            "input": {"input": said},
            "approval": {"id": approval_id, "approved": True, **edit},
        }

    async with web_server(_two_sub_agents()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            h1, h2 = [c for c in first if c != "[DONE]" and c["type"] == "tool-approval-request"]
            mid = first[0]["messageId"]
            edited = part(h1["approvalId"], "H1", "pay x", **{EDITED_INPUT: {"to": "x2"}})
            partly = await client.post("/api/chat", json=answer("s", mid, edited))
            both = answer("s", mid, edited)
            both["messages"][-1]["parts"].append(part(h2["approvalId"], "H2", "pay y"))
            r = await client.post("/api/chat", json=both)
    assert (partly.status_code, partly.json()) == (202, {"recorded": True, "waiting": 1})
    assert r.status_code == 200, r.text
    assert sorted(ran) == ["x", "x2"]


def test_an_agui_replay_of_an_edited_passed_up_approval_compares_the_sub_calls_edit():
    """A replayed resume repeats the recorded edit of the sub call (the agent tool's own
    input is not what was edited); another edit, or none, is another answer."""
    import attrs

    from runtime.app.web.agui import _same_edit
    from runtime.approval import Decision, PendingCall

    call = PendingCall(
        approval_id="a",
        tool_call_id="H",
        tool_name="helper",
        input={"input": "pay x"},
        kind="approval",
        step=0,
        message_id="m",
        turn_id="t",
        decided=True,
        asked_tool="wire_money",
        asked_input={"to": "x"},
        edited_input={"to": "y"},
    )
    assert _same_edit(call, Decision(approved=True, edited_input={"to": "y"}))
    assert not _same_edit(call, Decision(approved=True, edited_input={"to": "z"}))
    assert not _same_edit(call, Decision(approved=True))
    plain = attrs.evolve(call, edited_input=None)
    assert _same_edit(plain, Decision(approved=True))
    assert _same_edit(plain, Decision(approved=True, edited_input={"to": "x"}))


def _tree_with_a_same_named_tool() -> Agent:
    """top -> middle -> helper, each passing approvals up; ``middle`` has a
    ``wire_money`` of its own (``amount``, never called) beside helper's (``to``), which
    asks."""
    from runtime import tool
    from tests.test_approval_nested_pass import _helper_model, _middle_model, _top_model
    from tests.test_approval_nested_pass import wire_money as helpers_wire_money

    @tool
    async def wire_money(amount: int) -> str:  # (middle's own, never called)
        """Wire an amount."""
        return "no"

    middle = Agent(
        name="middle",
        provider=ScriptedProvider(responder=_middle_model),
        tools=[
            wire_money,
            Agent(
                name="helper",
                provider=ScriptedProvider(responder=_helper_model),
                tools=[helpers_wire_money],
            ).as_tool(pass_approvals=True),
        ],
    )
    return Agent(
        provider=ScriptedProvider(responder=_top_model),
        tools=[middle.as_tool(pass_approvals=True)],
    )


async def test_a_tool_of_the_same_name_elsewhere_in_the_tree_is_not_the_one_checked(tmp_path):
    """``middle`` has a ``wire_money`` of its own (``amount``), and calls ``helper``, whose
    ``wire_money`` (``to``) asks: the edit is checked along the stored path
    (``Awaiting.asked_via``), against helper's. Found by name alone, ``{"amount": 5}``
    passed on the calling session and was refused only where the call runs."""
    top = _tree_with_a_same_named_tool()
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(top, session_id="s")
        key = (await session.run("go")).pending[0].approval_id
        stored = await host.store.load("s")
        with pytest.raises(InvalidDecision, match="names 'amount', which wire_money does not"):
            await session.respond(key, approved=True, edited_input={"amount": 5})
        await session.respond(key, approved=True, edited_input={"to": "deep"})
    assert calls(stored.messages)[0].awaiting.asked_via == ("helper",)  # type: ignore[union-attr]
    assert ran == ["deep"]


async def test_an_edit_the_redeployed_sub_agents_tool_refuses_denies_the_call_not_runs_it(
    tmp_path,
):
    """Recorded on the calling session, then the sub-agent redeployed with a tool whose
    schema refuses the edit before the continuation: the sub-agent's call is denied,
    saying why (never run with its model's input, which nobody approved), and both turns
    finish instead of the sub-session waiting for ever."""
    from runtime import tool
    from tests.test_approval_nested_pass import _helper_model, _parent_model

    @tool(needs_approval=True)
    async def wire_money(to: int) -> str:  # the redeployed tool: an account number now
        """Wire money."""
        ran.append(str(to))
        return "wired"

    def redeployed() -> Agent:
        helper = Agent(
            name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[wire_money]
        )
        return Agent(
            provider=ScriptedProvider(responder=_parent_model),
            tools=[helper.as_tool(pass_approvals=True)],
        )

    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        key = (await session.run("go")).pending[0].approval_id
        await session.decide(key, approved=True, edited_input={"to": "y"})
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(redeployed(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
        sub = await host.store.load(SUB)
    assert ran == []
    assert out.result is not None and out.result.finish_reason == "stop"
    assert "the approved edit was refused by the sub-agent's tool" in out.result.text
    (asked,) = calls(sub.messages)  # type: ignore[union-attr]
    assert asked.awaiting is not None and asked.awaiting.approved is False
    assert asked.input == {"to": "x"}  # not replaced: nothing ran with the edit


def test_an_a2a_task_waiting_for_a_passed_up_approval_names_the_asking_call():
    """The task's ``pending`` names the call an ``editedInput`` edits (the sub call),
    not the agent tool's prompt."""
    from runtime.app.web.a2a_tasks import pending_message
    from runtime.approval import PendingCall

    call = PendingCall(
        approval_id="a",
        tool_call_id="H",
        tool_name="helper",
        input={"input": "pay x"},
        kind="approval",
        step=0,
        message_id="m",
        turn_id="t",
        asked_tool="wire_money",
        asked_input={"to": "x"},
    )
    message = pending_message("task", "ctx", [call])
    assert "approve wire_money" in message["parts"][0]["text"]
    assert message["parts"][1]["data"]["pending"] == [
        {"id": "a", "kind": "approval", "tool": "wire_money", "input": {"to": "x"}}
    ]


@pytest.mark.parametrize("via", [("ghost",), ("wire_money",), ("helper", "helper", "x")])
async def test_an_asked_via_naming_no_agent_tool_of_the_caller_refuses_the_edit(tmp_path, via):
    """Attacked (attacktoday): a stored wait whose ``asked_via`` names a tool the calling
    agent lacks, a plain tool (no sub-agent), or a path deeper than the tree (a store
    written by something else, or an agent redeployed): the walk ends on nothing and the
    edit is refused as unchecked, nothing recorded; a plain approval still runs."""
    import attrs

    top = _tree_with_a_same_named_tool
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        key = (await (await host.open_session(top(), session_id="s")).run("go")).pending[0]
        record = await host.store.load("s")
        assert record is not None
        index, message = next(
            (i, m) for i, m in enumerate(record.messages) if isinstance(m, AssistantMessage)
        )
        (call,) = calls([message])
        assert call.awaiting is not None
        crafted = attrs.evolve(call, awaiting=attrs.evolve(call.awaiting, asked_via=via))
        content = tuple(crafted if p is call else p for p in message.content)
        await host.store.save(
            "s", index, [attrs.evolve(message, content=content)], expected_version=record.version
        )
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(top(), session_id="s")
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision, match="not available here"):
            await session.respond(key.approval_id, approved=True, edited_input={"to": "deep"})
        after = await host.store.load("s")
        assert before is not None and after is not None and after.version == before.version
        await session.respond(key.approval_id, approved=True)
    assert ran == ["x"]  # once, with the model's own input
