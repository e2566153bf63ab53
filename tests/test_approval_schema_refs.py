"""Which stored schema checks an edit (docs/approval.md, "Approving with edits"): a wait of
a tool no code holds (an MCP server's) stores the schema the model was given, once per
assistant message however many calls wait for it (``Awaiting.schema_ref``), and each
edit is checked against its own call's, never another tool's of the same name (one
deeper or shallower in a tree of agents used as tools, ``pass_approvals=True``), nor
none. Decided on a host whose agent has none of the tools (a worker deployment's front
end's case), so only the stored schema can check. Embedded host, SQLite."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, tool
from runtime.errors import InvalidDecision
from runtime.messages import AssistantMessage, Awaiting, ToolCallPart
from runtime.tools import Tool

ran: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


@attrs.frozen(kw_only=True, slots=True, eq=False)
class Listed(Tool):
    """A tool whose schema is stored with its wait, as an MCP server's is."""

    def stored_schema(self) -> dict[str, Any] | None:
        return self.parameters


def listed(made: Tool) -> Listed:
    return Listed(**{a.alias: getattr(made, a.name) for a in attrs.fields(Tool) if a.init})


async def _add(a: int, b: int) -> int:
    """Add two numbers."""
    ran.append(("add", {"a": a, "b": b}))
    return a + b


async def _say(text: str) -> str:
    """Say something."""
    ran.append(("say", {"text": text}))
    return text


add = listed(tool(_add, name="add", needs_approval=True))
say = listed(tool(_say, name="say", needs_approval=True))
add_text = listed(tool(_say, name="add", needs_approval=True))  # an ``add`` taking text
"""A sub-agent's ``add``: the same name as ``add``, another schema."""


def bare() -> Agent:
    """An agent with none of the tools: only a stored schema checks an edit."""
    return Agent(provider=ScriptedProvider([["done"]]))


def calls(messages: Any) -> list[ToolCallPart]:
    return [
        p
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]


def stored_copies(messages: Any) -> int:
    """How many waits of the history carry a copy of a schema."""
    return sum(p.awaiting is not None and p.awaiting.schema is not None for p in calls(messages))


def model(first: list, answer: str = "done") -> ScriptedProvider:
    """A model that makes ``first`` 's calls at step 0, then answers ``answer``."""

    def respond(request: Any) -> list:
        return first if current_step(request.messages) == 0 else [answer]

    return ScriptedProvider(responder=respond)


async def _refused(session: Any, key: str, edit: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidDecision, match=says):
        await session.decide(key, approved=True, edited_input=edit)


async def test_two_tools_of_one_step_each_check_their_calls_edits_against_their_own(tmp_path):
    """``add`` and ``say`` twice each in one step: each stored once, and each call's edit
    checked against its tool's schema whichever is decided first, the carrier included."""
    first = [
        *tool_call("add", {"a": 1, "b": 1}, tool_call_id="a0"),
        *tool_call("say", {"text": "x"}, tool_call_id="s0"),
        *tool_call("add", {"a": 2, "b": 2}, tool_call_id="a1"),
        *tool_call("say", {"text": "y"}, tool_call_id="s1"),
    ]
    agent = Agent(provider=model(first), tools=[add, say])
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(agent, session_id="s")).run("go")
        record = await host.store.load("s")
    assert record is not None and stored_copies(record.messages) == 2
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        for call in ("s1", "a0", "a1", "s0"):
            if call.startswith("a"):
                await _refused(deciding, keys[call], {"text": "z"}, "names 'text', which add")
                edit: dict[str, Any] = {"a": 7, "b": int(call[1])}
            else:
                await _refused(deciding, keys[call], {"a": 1, "b": 2}, "names 'a', 'b', which say")
                edit = {"text": f"edited {call}"}
            recorded = await deciding.decide(keys[call], approved=True, edited_input=edit)
            assert recorded.call.input == edit
        record = await host.store.load("s")
    assert record is not None and stored_copies(record.messages) == 0


def _same_named_tree() -> Agent:
    """The calling agent's own ``add`` (``a``, ``b``) and a sub-agent whose ``add`` takes
    ``text``, both asking, in one step."""

    def helper_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return tool_call("add", {"text": "x"}, tool_call_id="A")
        return ["sub done"]

    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=helper_model), tools=[add_text]
    )
    first = [
        *tool_call("add", {"a": 1, "b": 2}, tool_call_id="c_add"),
        *tool_call("helper", {"input": "add"}, tool_call_id="H"),
    ]
    return Agent(provider=model(first), tools=[add, helper.as_tool(pass_approvals=True)])


async def test_a_same_named_tool_one_agent_deeper_is_checked_against_its_own_schema(tmp_path):
    """The calling step's own ``add`` waits beside a sub-agent's passed-up ``add`` of
    another schema: on a host with neither, each edit is checked against its own call's
    stored schema, and each call runs its edit."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(_same_named_tree(), session_id="s")).run("go")
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        await _refused(deciding, keys["H"], {"a": 1, "b": 2}, "names 'a', 'b', which add")
        await _refused(deciding, keys["c_add"], {"text": "y"}, "names 'text', which add")
        await deciding.decide(keys["H"], approved=True, edited_input={"text": "deep"})
        await deciding.decide(keys["c_add"], approved=True, edited_input={"a": 5, "b": 5})
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(_same_named_tree(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
        record = await host.store.load("s")
    assert sorted(ran, key=repr) == [("add", {"a": 5, "b": 5}), ("say", {"text": "deep"})]
    assert record is not None and stored_copies(record.messages) == 0


def _fan_out(n: int) -> Agent:
    """``n`` calls of one sub-agent in one step, each sub-turn asking for its ``add``."""

    def helper_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return tool_call("add", {"a": 1, "b": 1}, tool_call_id="A")
        return ["sub done"]

    helper = Agent(name="helper", provider=ScriptedProvider(responder=helper_model), tools=[add])
    first = [
        c
        for i in range(n)
        for c in tool_call("helper", {"input": f"add {i}"}, tool_call_id=f"H{i}")
    ]
    return Agent(provider=model(first), tools=[helper.as_tool(pass_approvals=True)])


async def test_sub_agent_calls_passing_up_one_tools_approval_store_its_schema_once(tmp_path):
    """Three calls of a sub-agent each pass up an approval of the same ``add``: the
    calling message stores its schema once (each wait kept a copy: 100 such calls of a
    31 KB schema were 3.1 MB), and each edit, decided on a host without the tool in
    any order, is checked against it; none is left once all are decided."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(_fan_out(3), session_id="s")).run("go")
        record = await host.store.load("s")
    assert record is not None and stored_copies(record.messages) == 1
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        for i, call in enumerate(("H1", "H0", "H2")):
            await _refused(deciding, keys[call], {"a": "x", "b": 1}, "'x' is not of type")
            await deciding.decide(keys[call], approved=True, edited_input={"a": 10, "b": i})
        record = await host.store.load("s")
    assert record is not None and stored_copies(record.messages) == 0
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(_fan_out(3), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
    assert sorted(ran, key=repr) == [("add", {"a": 10, "b": i}) for i in range(3)]


def _pays_twice() -> Agent:
    """One sub-agent call whose sub-step makes two calls of ``add``: passed up one at a
    time on the same calling call."""

    def helper_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return [
                *tool_call("add", {"a": 1, "b": 1}, tool_call_id="A0"),
                *tool_call("add", {"a": 2, "b": 2}, tool_call_id="A1"),
            ]
        return ["sub done"]

    helper = Agent(name="helper", provider=ScriptedProvider(responder=helper_model), tools=[add])
    first = tool_call("helper", {"input": "add twice"}, tool_call_id="H")
    return Agent(provider=model(first), tools=[helper.as_tool(pass_approvals=True)])


async def test_the_second_approval_a_sub_step_passes_up_is_checked_against_its_schema(tmp_path):
    """The sub-step's second ``add`` stored no copy of its own (its first did): decided
    first there, the sub-session's first call hands the check on, and the calling call's
    second wait has it: an edit of it, on a host without the tool, is still checked."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(_pays_twice(), session_id="s")
        asked = await session.run("go")
        again = await session.respond(
            asked.pending[0].approval_id, approved=True, edited_input={"a": 3, "b": 3}
        )
    assert again is not None and again.finish_reason == "awaiting-input"
    second = again.pending[0]
    assert second.asked_input == {"a": 2, "b": 2}
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        await _refused(deciding, second.approval_id, {"a": "x", "b": 1}, "'x' is not of type")
        await deciding.decide(second.approval_id, approved=True, edited_input={"a": 4, "b": 4})
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(_pays_twice(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
        sub = await host.store.load("s.helper.H")
    assert sorted(ran, key=repr) == [("add", {"a": 3, "b": 3}), ("add", {"a": 4, "b": 4})]
    assert out.result is not None and out.result.finish_reason == "stop"
    assert sub is not None and stored_copies(sub.messages) == 0


def _three_deep() -> Agent:
    """top -> middle, whose step calls helper twice -> helper, asking for ``add``; top's
    own ``add`` takes text."""

    def helper_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return tool_call("add", {"a": 1, "b": 1}, tool_call_id="A")
        return ["sub done"]

    helper = Agent(name="helper", provider=ScriptedProvider(responder=helper_model), tools=[add])
    middle_first = [
        *tool_call("helper", {"input": "one"}, tool_call_id="H0"),
        *tool_call("helper", {"input": "two"}, tool_call_id="H1"),
    ]
    middle = Agent(
        name="middle",
        provider=model(middle_first, "middle done"),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    first = [
        *tool_call("add", {"text": "top"}, tool_call_id="c_add"),
        *tool_call("middle", {"input": "go"}, tool_call_id="M"),
    ]
    return Agent(provider=model(first), tools=[add_text, middle.as_tool(pass_approvals=True)])


async def test_approvals_passed_up_two_agents_deep_from_one_step_each_check_the_deepest_schema(
    tmp_path,
):
    """``middle``'s step waits for two ``helper`` calls, which share one stored copy of
    helper's ``add`` there; passed up to ``top`` one at a time (beside top's own ``add``
    of another schema), each edit is checked against helper's, on a host without any of
    the tools, the second too once the first is decided and its call run."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(_three_deep(), session_id="s")).run("go")
        middle = await host.store.load("s.middle.M")
    assert middle is not None and stored_copies(middle.messages) == 1
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        await _refused(deciding, keys["M"], {"text": "no"}, "names 'text', which add")
        await deciding.decide(keys["M"], approved=True, edited_input={"a": 3, "b": 0})
        await deciding.decide(keys["c_add"], approved=True)
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(_three_deep(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
        again = out.result
    assert again is not None and again.finish_reason == "awaiting-input"
    (second,) = again.pending
    assert (second.asked_tool, second.asked_input) == ("add", {"a": 1, "b": 1})
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        await _refused(deciding, second.approval_id, {"text": "no"}, "names 'text', which add")
        await deciding.decide(second.approval_id, approved=True, edited_input={"a": 4, "b": 0})
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(_three_deep(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
    assert out.result is not None and out.result.finish_reason == "stop"
    assert sorted(ran, key=repr) == [
        ("add", {"a": 3, "b": 0}),
        ("add", {"a": 4, "b": 0}),
        ("say", {"text": "top"}),
    ]


async def test_a_new_message_after_a_partial_decision_leaves_no_schema(tmp_path):
    """One of two calls decided (its copy still needed by the other), then a new message
    supersedes the other: no wait keeps a copy."""
    first = [
        *tool_call("add", {"a": 1, "b": 1}, tool_call_id="a0"),
        *tool_call("add", {"a": 2, "b": 2}, tool_call_id="a1"),
    ]
    provider = ScriptedProvider(turns=[[first], [["ok"]]])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, tools=[add]), session_id="s")
        waited = await session.run("go")
        await session.decide(waited.pending[0].approval_id, approved=False)
        await session.run("something else")
        record = await host.store.load("s")
    assert record is not None and stored_copies(record.messages) == 0


async def _reshape(db: Any, shape: Any) -> None:
    """Store the waiting turn's calls as ``shape(calls)`` makes them: a record written by
    an earlier version."""
    async with Host.open(store=db, log_tap=False) as host:
        record = await host.store.load("s")
        assert record is not None
        index, message = next(
            (i, m) for i, m in enumerate(record.messages) if isinstance(m, AssistantMessage)
        )
        parts = shape([p for p in message.content if isinstance(p, ToolCallPart)])
        content = tuple(parts.get(p.tool_call_id, p) for p in message.content)
        await host.store.save(
            "s", index, [attrs.evolve(message, content=content)], expected_version=record.version
        )


def _each_own_copy(parts: list[ToolCallPart]) -> dict[str, ToolCallPart]:
    """Before a step stored a schema once: every wait its own copy, no reference."""
    return {
        p.tool_call_id: attrs.evolve(
            p, awaiting=attrs.evolve(p.awaiting, schema=dict(add.parameters), schema_ref=None)
        )
        for p in parts
        if p.awaiting is not None
    }


def _first_call_carries(parts: list[ToolCallPart]) -> dict[str, ToolCallPart]:
    """Before ``schema_ref``: the first waiting call of the tool carried the copy, the
    others none, found by the tool's name."""
    out = {}
    for i, p in enumerate(parts):
        assert p.awaiting is not None
        schema = dict(add.parameters) if i == 0 else None
        waiting = attrs.evolve(p.awaiting, schema=schema, schema_ref=None)
        out[p.tool_call_id] = attrs.evolve(p, awaiting=waiting)
    return out


@pytest.mark.parametrize("shape", [_each_own_copy, _first_call_carries])
async def test_a_waiting_turn_stored_by_an_earlier_version_still_checks_each_edit(tmp_path, shape):
    """Three waiting calls of ``add`` stored as an earlier version stored them: decided
    one by one on a host without the tool, each edit is checked against the schema, the
    carrier decided first; none is left at the end."""
    first = [c for i in range(3) for c in tool_call("add", {"a": i, "b": 0}, tool_call_id=f"c{i}")]
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        agent = Agent(provider=model(first), tools=[add])
        waited = await (await host.open_session(agent, session_id="s")).run("go")
    await _reshape(db, shape)
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        for call in ("c0", "c2", "c1"):
            await _refused(deciding, keys[call], {"a": "x", "b": 1}, "'x' is not of type")
            await deciding.decide(keys[call], approved=True, edited_input={"a": 9, "b": 1})
        record = await host.store.load("s")
    assert record is not None and stored_copies(record.messages) == 0
    assert [p.input for p in calls(record.messages)] == [{"a": 9, "b": 1}] * 3


def test_a_wait_stored_without_a_schema_ref_reads_as_none() -> None:
    from runtime.serde import from_json, to_json

    stored = b'{"kind":"approval","id":"a","turn_id":"t","decided":false,"approved":null,'
    stored += b'"reason":null,"output":null,"error":null,"schema":{"type":"object"}}'
    waiting = from_json(stored, Awaiting)
    assert waiting.schema_ref is None and waiting.schema == {"type": "object"}
    assert b"schema_ref" not in to_json(waiting)


async def test_a_turn_that_stored_a_summary_before_it_waited_checks_each_edit(tmp_path):
    """The waiting turn's first model call summarized the turns before it (the summary
    stored before its user message): its calls' edits are still checked, each against
    the one stored copy, on a host without the tool."""
    from runtime.compaction import SUMMARY_INSTRUCTIONS, Summarize, is_summary

    def respond(request: Any) -> list:
        if request.instructions == SUMMARY_INSTRUCTIONS:
            return ["a summary"]
        said = [m for m in request.messages if m.role == "user"][-1].text
        if said == "ask" and current_step(request.messages) == 0:
            return [
                *tool_call("add", {"a": 1, "b": 1}, tool_call_id="a0"),
                *tool_call("add", {"a": 2, "b": 2}, tool_call_id="a1"),
            ]
        return ["an answer of some length " * 20]

    def agent() -> Agent:
        return Agent(
            provider=ScriptedProvider(responder=respond),
            tools=[add],
            history_processors=[Summarize(max_tokens=300, keep_turns=1)],
        )

    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        for said in ("one", "two", "three"):
            await session.run(said)
        waited = await session.run("ask")
        record = await host.store.load("s")
    assert record is not None and any(is_summary(m) for m in record.messages)
    assert stored_copies(record.messages) == 1
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        for i, p in enumerate(reversed(waited.pending)):
            await _refused(deciding, p.approval_id, {"text": "no"}, "names 'text', which add")
            await deciding.decide(p.approval_id, approved=True, edited_input={"a": 8, "b": i})
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
        record = await host.store.load("s")
    assert sorted(ran, key=repr) == [("add", {"a": 8, "b": 0}), ("add", {"a": 8, "b": 1})]
    assert record is not None and stored_copies(record.messages) == 0


def _refs_naming_nothing(parts: list[ToolCallPart]) -> dict[str, ToolCallPart]:
    """A damaged (hand-built) record: each wait names its schema, none holds it."""
    return {
        p.tool_call_id: attrs.evolve(p, awaiting=attrs.evolve(p.awaiting, schema=None))
        for p in parts
        if p.awaiting is not None
    }


async def _text(text: str) -> str:
    """Another ``add``: takes text."""
    ran.append(("text", {"text": text}))
    return text


@pytest.mark.parametrize("here", ["no tool", "another add"])
async def test_an_edit_of_a_wait_naming_a_schema_its_message_lacks_is_refused(tmp_path, here):
    """A stored wait whose ``schema_ref`` names nothing in its message: an edit is
    refused saying so, never checked against the deciding host's tool of the same name
    (there another tool, taking ``text``: its edit was taken for a call of the listed
    ``add``); approving without an edit is still taken."""
    first = [c for i in range(2) for c in tool_call("add", {"a": i, "b": 0}, tool_call_id=f"c{i}")]
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (
            await host.open_session(Agent(provider=model(first), tools=[add]), session_id="s")
        ).run("go")
    await _reshape(db, _refs_naming_nothing)
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    other = tool(_text, name="add", needs_approval=True)
    agent = bare() if here == "no tool" else Agent(provider=model([]), tools=[other])
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(agent, session_id="s")
        for edit in ({"text": "z"}, {"a": 1, "b": 2}):
            await _refused(deciding, keys["c0"], edit, "schema stored for it .* is not in its")
        recorded = await deciding.decide(keys["c0"], approved=True)
        assert recorded.call.input == {"a": 0, "b": 0}
        record = await host.store.load("s")
    assert record is not None
    assert [p.input for p in calls(record.messages)] == [{"a": 0, "b": 0}, {"a": 1, "b": 0}]


async def test_two_hosts_deciding_a_step_s_two_calls_of_one_schema_at_once_check_both(
    tmp_path, monkeypatch
):
    """Two hosts on one file (two front ends) each decide one of the two waiting calls
    that share one stored copy, with an edit, both having read the message before either
    saved: the loser's save conflicts, it reads again and checks its edit against the
    copy the winner's decision kept for it (dropped only once neither waits), whichever
    call carries it (a pin: held on main)."""
    import trio

    from runtime import approval

    first = [c for i in range(2) for c in tool_call("add", {"a": i, "b": 0}, tool_call_id=f"c{i}")]
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (
            await host.open_session(Agent(provider=model(first), tools=[add]), session_id="s")
        ).run("go")
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    real = approval._save_decided
    arrived: list[int] = []
    both = trio.Event()

    async def together(*args: Any, **kwargs: Any) -> Any:
        arrived.append(1)
        if len(arrived) == 2:
            both.set()
        await both.wait()  # (each first attempt has decided on the same version)
        return await real(*args, **kwargs)

    monkeypatch.setattr(approval, "_save_decided", together)
    edits = {"c0": {"a": 5, "b": 5}, "c1": {"a": 6, "b": 6}}
    async with Host.open(store=db, log_tap=False) as one, Host.open(store=db, log_tap=False) as two:
        sessions = {
            "c0": await one.open_session(bare(), session_id="s"),
            "c1": await two.open_session(bare(), session_id="s"),
        }
        await _refused(sessions["c1"], keys["c1"], {"text": "z"}, "names 'text', which add")
        arrived.clear()
        async with trio.open_nursery() as nursery:
            for call, session in sessions.items():
                nursery.start_soon(
                    lambda s=session, c=call: s.decide(
                        keys[c], approved=True, edited_input=edits[c]
                    )
                )
        assert len(arrived) == 3  # (both first attempts, then the loser's second)
        record = await one.store.load("s")
    assert record is not None and stored_copies(record.messages) == 0
    assert [p.input for p in calls(record.messages)] == [edits["c0"], edits["c1"]]
