"""Approving an MCP server's tool call with edits (docs/approval.md, "Approving with
edits"): the call's wait stores the schema the server listed, the one the model was given
(``Awaiting.schema``), and the edit is checked against it wherever the decision is made,
whether or not that process has the server's session open. A real MCP server
(tests/support/mcp_server.py over stdio), as tests/test_approval.py's MCP approval."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from runtime import Agent, Host, approval
from runtime.errors import InvalidDecision
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage
from tests.test_mcp import calling, stdio_server, tool_messages


def mcp_agent(provider: ScriptedProvider | None = None) -> Agent:
    return Agent(
        provider=provider or calling(("add", {"a": 1, "b": 2})),
        tools=[stdio_server(needs_approval=["add"])],
    )


def the_call(messages: Any) -> ToolCallPart:
    (call,) = [
        p
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]
    return call


async def test_an_mcp_tools_call_approved_with_edits_runs_the_edit_and_replays_it(tmp_path):
    provider = calling(("add", {"a": 1, "b": 2}))
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(mcp_agent(provider), session_id="s")
        waited = await session.run("go")
        asked = await host.store.load("s")
        result = await session.respond(
            waited.pending[0].approval_id, approved=True, edited_input={"a": 40, "b": 2}
        )
        record = await host.store.load("s")
    assert asked is not None and record is not None
    listed = the_call(asked.messages).awaiting.schema  # type: ignore[union-attr]
    assert listed["type"] == "object" and set(listed["properties"]) == {"a", "b"}
    assert result is not None and result.finish_reason == "stop"
    assert tool_messages(session)["add"].output in (42, "42")  # ran with the edit
    call = the_call(record.messages)
    assert call.input == {"a": 40, "b": 2}
    assert call.awaiting is not None and call.awaiting.original_input == {"a": 1, "b": 2}
    assert call.awaiting.schema is None  # the decision dropped it: of no use any more
    assert [m.output for m in record.messages if isinstance(m, ToolMessage)] in ([42], ["42"])
    replayed = the_call(provider.requests[-1].messages)  # what the model read next
    assert replayed.input == {"a": 40, "b": 2}


async def test_the_edit_is_checked_against_the_stored_schema_without_the_servers_session(
    tmp_path,
):
    """Decided by a host whose agent has no MCP server (what a worker deployment's front
    end is): the edit is checked against the schema stored with the wait; the host that
    has the server then runs it."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(mcp_agent(), session_id="s")).run("go")
    key = waited.pending[0].approval_id
    bare = Agent(provider=ScriptedProvider([["done"]]))
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare, session_id="s")
        with pytest.raises(InvalidDecision, match=r"invalid arguments for add: a: 'x' is not"):
            await deciding.decide(key, approved=True, edited_input={"a": "x", "b": 2})
        recorded = await deciding.decide(key, approved=True, edited_input={"a": 5, "b": 5})
    assert recorded.complete and recorded.call.input == {"a": 5, "b": 5}
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
    assert tool_messages(session)["add"].output in (10, "10")


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"approved": True, "edited_input": {"a": "one", "b": 2}}, "a: 'one' is not of type"),
        ({"approved": True, "edited_input": {"a": 1}}, "'b' is a required property"),
        ({"approved": True, "edited_input": {"text": "hi"}}, "names 'text', which add does not"),
        ({"approved": True, "edited_input": {"a": 1, "b": 2, "c": 3}}, "names 'c'"),
        ({"approved": False, "edited_input": {"a": 3, "b": 2}}, "approved=True only"),
    ],
)
async def test_an_mcp_edit_that_does_not_fit_is_refused_and_nothing_is_recorded(
    tmp_path, answer, says
):
    """Another tool's field (``echo``'s ``text``), a missing or mistyped argument, an
    unknown key, an edit with a denial: refused, the call still waits."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        waited = await session.run("go")
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision, match=says):
            await session.respond(waited.pending[0].approval_id, **answer)
        after = await host.store.load("s")
        assert before is not None and after is not None
        assert (after.version, after.messages) == (before.version, before.messages)
        await session.respond(waited.pending[0].approval_id, approved=True)
    assert tool_messages(session)["add"].output in (3, "3")


async def test_what_a_refused_mcp_edit_echoes_is_bounded(tmp_path):
    """jsonschema's message quotes the value: a 100 KB string is cut in the refusal."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        waited = await session.run("go")
        with pytest.raises(InvalidDecision) as refused:
            await session.respond(
                waited.pending[0].approval_id,
                approved=True,
                edited_input={"a": "x" * 10_000, "b": 2},  # (within max_tool_result_chars)
            )
    assert len(str(refused.value)) < 1_000 and "characters cut" in str(refused.value)


async def test_a_stored_schema_that_no_longer_compiles_refuses_the_edit(tmp_path):
    """A stored wait whose schema is not a schema (hand-edited, or a store written by
    something else): nothing to check with, refused, not a 500; a plain approval runs."""
    import attrs

    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        waited = await session.run("go")
        record = await host.store.load("s")
        assert record is not None
        index, message = next(
            (i, m) for i, m in enumerate(record.messages) if isinstance(m, AssistantMessage)
        )
        call = the_call(record.messages)
        assert call.awaiting is not None
        bad = attrs.evolve(call, awaiting=attrs.evolve(call.awaiting, schema={"type": 5}))
        content = tuple(bad if p is call else p for p in message.content)
        await host.store.save(
            "s",
            index,
            [attrs.evolve(message, content=content)],
            expected_version=record.version,
        )
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        with pytest.raises(InvalidDecision, match="cannot be checked"):
            await session.respond(
                waited.pending[0].approval_id, approved=True, edited_input={"a": 2, "b": 2}
            )
        await session.respond(waited.pending[0].approval_id, approved=True)
    assert tool_messages(session)["add"].output in (3, "3")


async def test_a_superseded_mcp_call_keeps_no_schema(tmp_path):
    """A new message instead of a decision denies the call ``superseded``: the schema
    it stored to check an edit with goes with the wait, as a decision drops it."""
    asks = [*tool_call("add", {"a": 1, "b": 2}, tool_call_id="c_add")]
    provider = ScriptedProvider(turns=[[asks], [["ok"]]])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(mcp_agent(provider), session_id="s")
        await session.run("go")
        await session.run("something else")
        record = await host.store.load("s")
    assert record is not None
    call = the_call(record.messages)
    assert call.awaiting is not None and call.awaiting.reason == "superseded"
    assert call.awaiting.schema is None


async def _store_schema(host: Host, schema: dict[str, Any]) -> None:
    """Replace the waiting call's stored schema with ``schema``: what a server that
    listed it would have left (its listing's check takes each: see the test)."""
    import attrs

    record = await host.store.load("s")
    assert record is not None
    index, message = next(
        (i, m) for i, m in enumerate(record.messages) if isinstance(m, AssistantMessage)
    )
    call = the_call(record.messages)
    assert call.awaiting is not None
    crafted = attrs.evolve(call, awaiting=attrs.evolve(call.awaiting, schema=schema))
    content = tuple(crafted if p is call else p for p in message.content)
    await host.store.save(
        "s", index, [attrs.evolve(message, content=content)], expected_version=record.version
    )


def _exponential_refs(depth: int) -> dict[str, Any]:
    """Definitions each ``anyOf`` two references to the one before: a value matching
    none is checked 2**depth times (1.3 KB; 16 deep held a decision's loop 9.5 s)."""
    defs: dict[str, Any] = {"d0": {"type": "number"}}
    for i in range(1, depth + 1):
        defs[f"d{i}"] = {"anyOf": [{"$ref": f"#/$defs/d{i - 1}"}] * 2}
    return {
        "type": "object",
        "$defs": defs,
        "properties": {"a": {"$ref": f"#/$defs/d{depth}"}, "b": {"type": "integer"}},
    }


async def test_a_crafted_stored_schema_is_checked_within_a_bound_of_steps(tmp_path):
    """A server's schema whose ``$ref`` s make a check exponential (it lists fine: the
    listing's check builds it) is checked at decision time, on the event loop of a front
    end that serves every session, with a bound of keywords: refused past it, counted,
    the call still waits and a plain approval runs. Before, trusted, every keyword ran
    (2**14 branches here; 18 deep is 34 s)."""
    from runtime import tools
    from runtime.tools import json_schema_validator

    schema = _exponential_refs(14)
    json_schema_validator(schema)  # what listing the tool checks: it is taken
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(mcp_agent(), session_id="s")).run("go")
        await _store_schema(host, schema)
    key = waited.pending[0].approval_id
    spent: list[int] = []
    spend = tools._spend

    def counting(steps: int) -> None:
        spent.append(steps)
        spend(steps)

    bare = Agent(provider=ScriptedProvider([["done"]]))
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare, session_id="s")
        before = await host.store.load("s")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tools, "_spend", counting)
            with pytest.raises(InvalidDecision, match="the schema took over 10000 steps"):
                await deciding.decide(key, approved=True, edited_input={"a": "x", "b": 2})
        after = await host.store.load("s")
        assert before is not None and after is not None
        assert after.version == before.version
        assert sum(spent) <= tools.UNTRUSTED_STEPS + 1
        recorded = await deciding.decide(key, approved=True)
    assert recorded.complete


async def test_an_edit_that_a_stored_pattern_refuses_is_refused_and_nothing_is_saved(tmp_path):
    """A server's ``pattern`` is enforced on an edit as on the model's input: the stored
    schema's patterns run in the linear engine where the decision is made. Before, they
    were not run there (Python's ``re`` could hold the deciding loop for minutes), and an
    edit the server's schema refuses was approved."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}, "b": {}},
    }
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(mcp_agent(), session_id="s")).run("go")
        await _store_schema(host, schema)
    key = waited.pending[0].approval_id
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision, match=r"a: 'ABC' does not match '\^\[a-z\]\+\$'"):
            await session.decide(key, approved=True, edited_input={"a": "ABC", "b": 2})
        after = await host.store.load("s")
        assert before is not None and after is not None and after.version == before.version
        recorded = await session.decide(key, approved=True, edited_input={"a": "abc", "b": 2})
    assert recorded.complete and recorded.call.input == {"a": "abc", "b": 2}


async def test_a_catastrophic_stored_pattern_refuses_a_long_edit_in_linear_time(tmp_path):
    """``^(a|aa)*$`` against 45 ``a`` and a ``!`` took Python's ``re`` minutes; in the
    linear engine an edit of 50,000 ``a`` and a ``!`` is refused (within the edit's size
    bound, :class:`~runtime.errors.EditTooLarge`): the stored schema's pattern is
    compiled for that engine (counted), and nothing else runs patterns."""
    from runtime import tools

    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a|aa)*$"}}}
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(mcp_agent(), session_id="s")).run("go")
        await _store_schema(host, schema)
    searched: list[str] = []
    linear = tools._linear_search

    def noting(pattern: str) -> Any:
        searched.append(pattern)
        return linear(pattern)

    tools._COMPILED.pop("^(a|aa)*$", None)
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tools, "_linear_search", noting)
            approval._stored_validator.cache_clear()
            with pytest.raises(InvalidDecision, match=r"\(50,001 characters\) does not match"):
                await session.decide(
                    waited.pending[0].approval_id,
                    approved=True,
                    edited_input={"a": "a" * 50_000 + "!"},
                )
    assert searched == ["^(a|aa)*$"]


async def test_a_stored_pattern_the_linear_engine_does_not_take_is_skipped_with_a_warning(
    tmp_path,
):
    """A look-around is not taken by the linear engine: it is not run on an edit (the
    server checks its own input, as for the model's input), logged once as the stored
    schema's validator is built; the schema's other patterns still run."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^(?!x)"},
            "b": {"type": "string", "pattern": "^[0-9]+$"},
        },
    }
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(mcp_agent(), session_id="s")).run("go")
        await _store_schema(host, schema)
    key = waited.pending[0].approval_id
    approval._stored_validator.cache_clear()
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        with capture_logs() as logs:
            with pytest.raises(InvalidDecision, match="b: 'x' does not match"):
                await session.decide(key, approved=True, edited_input={"a": "xy", "b": "x"})
            recorded = await session.decide(key, approved=True, edited_input={"a": "xy", "b": "1"})
    assert recorded.complete and recorded.call.input == {"a": "xy", "b": "1"}
    warned = [e for e in logs if e["event"] == "approval.schema-not-checked-here"]
    assert len(warned) == 1
    assert warned[0]["unchecked"] == [
        "pattern '^(?!x)': not taken by the linear engine: look-around, including "
        "look-ahead and look-behind, is not supported"
    ]


async def test_a_stored_schemas_pattern_properties_check_an_edit(tmp_path):
    """``patternProperties`` runs in the linear engine too: an edit whose key a pattern
    matches is checked against that pattern's schema (before, such an edit was refused
    as unchecked, whatever it was); a plain approval runs."""
    schema = {"type": "object", "patternProperties": {"^(a|aa)*$": {"type": "integer"}}}
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(mcp_agent(), session_id="s")).run("go")
        await _store_schema(host, schema)
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(mcp_agent(), session_id="s")
        with pytest.raises(InvalidDecision, match="a: 'x' is not of type 'integer'"):
            await session.decide(
                waited.pending[0].approval_id, approved=True, edited_input={"a": "x", "b": 2}
            )
        await session.respond(waited.pending[0].approval_id, approved=True)
    assert tool_messages(session)["add"].output in (3, "3")


def _schemas(messages: Any) -> dict[str, Any]:
    """Each waiting call's stored schema, by call id."""
    return {
        p.tool_call_id: p.awaiting.schema
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart) and p.awaiting is not None
    }


async def test_a_steps_calls_of_one_tool_store_its_schema_once_and_each_edit_is_checked(
    tmp_path,
):
    """Three waiting calls of ``add`` in one step store the schema once, on the first
    (each call's copy made 100 calls of a 31 KB schema 3.1 MB, and deciding them one by
    one wrote 155 MB), the others naming it (``Awaiting.schema_ref``). Decided on a host
    without the server (a front end's case), the copy stays on its call, decided or not,
    while another call names it: every call's edit is checked against it, whichever
    order they are decided in, and none is left at the end."""
    provider = ScriptedProvider(
        [
            [c for i in range(3) for c in tool_call("add", {"a": i, "b": 0}, tool_call_id=f"c{i}")],
            ["done"],
        ]
    )
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(mcp_agent(provider), session_id="s")).run("go")
        record = await host.store.load("s")
    assert record is not None
    stored = _schemas(record.messages)
    assert [k for k, v in stored.items() if v is not None] == ["c0"]
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    bare = Agent(provider=ScriptedProvider([["done"]]))
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare, session_id="s")
        for call in ("c1", "c0", "c2"):  # a call without the schema first, then its carrier
            with pytest.raises(InvalidDecision, match=r"invalid arguments for add: a: 'x'"):
                await deciding.decide(keys[call], approved=True, edited_input={"a": "x", "b": 2})
            recorded = await deciding.decide(
                keys[call], approved=True, edited_input={"a": 7, "b": 1}
            )
            assert recorded.call.input == {"a": 7, "b": 1}
            now = _schemas((await host.store.load("s")).messages)  # type: ignore[union-attr]
            assert sum(v is not None for v in now.values()) == (0 if call == "c2" else 1), now
