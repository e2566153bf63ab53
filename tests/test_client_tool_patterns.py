"""A schema's ``pattern`` is enforced everywhere a schema is checked, in linear time:
a client-side tool's input (a program's own ``Tool.client``, a browser's AG-UI tools,
rebuilt on a worker), its output, and an approve-with-edits of an MCP tool's call
checked against the schema stored with the wait (over HTTP here;
tests/test_approval_mcp_edits.py in Python). Patterns run in pydantic-core's Rust
engine (``runtime.tools.linear_schema_validator``): the tests count that engine's
compiles and that Python's backtracking ``re`` is never reached, not time."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema._keywords
import orjson
import pytest
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, ToolMessage, approval, tools
from runtime.app.web import agui_input
from runtime.app.web.answers import EDITED_INPUT
from runtime.errors import InvalidDecision
from runtime.tools import InvalidJSONSchema, Tool, ToolInputError
from runtime.turn_queue import ClientToolSpec
from tests.test_http_attacks_4 import run_with_tools
from tests.test_mcp import calling, stdio_server
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, payloads
from tests.test_worker_approval_nested_pass import _answer
from tests.web.harness import web_server

LOOK = {"type": "object", "properties": {"q": {"type": "string", "pattern": "^[a-z]+$"}}}
CATASTROPHIC = {"type": "object", "properties": {"q": {"type": "string", "pattern": "^(a|aa)*$"}}}


class _NoBacktracking:
    """Stands for ``re`` in jsonschema's keywords: a pattern run there fails the test."""

    def search(self, *args: Any) -> Any:
        raise AssertionError(f"a pattern ran in Python's re: {args[0]!r}")

    def __getattr__(self, name: str) -> Any:
        import re

        return getattr(re, name)


@pytest.fixture
def no_backtracking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonschema._keywords, "re", _NoBacktracking())


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The patterns compiled for the linear engine from here on (none kept before)."""
    compiled: list[str] = []
    linear = tools._linear_search

    def noting(pattern: str) -> Any:
        compiled.append(pattern)
        return linear(pattern)

    monkeypatch.setattr(tools, "_linear_search", noting)
    monkeypatch.setattr(tools, "_COMPILED", type(tools._COMPILED)())
    return compiled


# -- a client tool's input --------------------------------------------------------------


@pytest.mark.parametrize("trusted", [True, False])
def test_a_client_tools_pattern_refuses_the_models_input_saying_so(trusted, no_backtracking):
    tool = Tool.client("look", LOOK, trusted=trusted)
    with pytest.raises(ToolInputError, match=r"invalid arguments for look: q: 'B!' does not match"):
        tool.validate({"q": "B!"})
    assert tool.validate({"q": "b"}) == {"q": "b"}


@pytest.mark.parametrize("trusted", [True, False])
def test_a_catastrophic_client_pattern_refuses_a_long_input_in_the_linear_engine(
    trusted, no_backtracking, compiles
):
    # Python's re took minutes on 45 a's and a "!"; these are 100,000, and the error
    # quotes 100 of them.
    tool = Tool.client("look", CATASTROPHIC, trusted=trusted)
    with pytest.raises(ToolInputError, match=r"\(100,001 characters\) does not match"):
        tool.validate({"q": "a" * 100_000 + "!"})
    assert compiles == ["^(a|aa)*$"]


def test_a_big_patterns_search_of_a_long_string_counts_against_the_bound_before_it_runs(
    monkeypatch,
):
    # Linear in the text, but per character the engine's worst case grows with the
    # pattern: a client's 4,615-unit \w{60}\W\w{10} held the loop 1.5 s on 200,000 a's
    # (loaded), within the 10,000 keywords. The search is counted first and refused.
    searched: list[int] = []
    linear = tools._linear_search

    def noting(pattern: str) -> Any:
        search = linear(pattern)
        assert not isinstance(search, str)

        def counted(text: str) -> bool:
            searched.append(len(text))
            return search(text)

        return counted

    monkeypatch.setattr(tools, "_linear_search", noting)
    monkeypatch.setattr(tools, "_COMPILED", type(tools._COMPILED)())
    big = {"type": "object", "properties": {"q": {"type": "string", "pattern": r"\w{60}\W\w{10}"}}}
    tool = Tool.client("look", big, trusted=False)
    with pytest.raises(ToolInputError, match="the schema took over 10000 steps"):
        tool.validate({"q": "a" * 200_000})
    assert searched == []
    tool.validate({"q": "a" * 60 + "!" + "a" * 10})  # 71 characters: 6 steps' worth
    small = Tool.client("look", LOOK, trusted=False)  # ^[a-z]+$: 6 units, 120 steps
    assert small.validate({"q": "a" * 1_000_000})
    assert searched == [71, 1_000_000]


def test_many_keys_against_many_pattern_properties_count_each_search(monkeypatch):
    # One patternProperties keyword tries every key against every pattern: 10,000 keys
    # and 50 patterns were 500,000 searches in one step (0.9 s of the loop, loaded).
    # Each search now costs a twentieth of a step at least: refused after 200,000.
    searched = [0]
    linear = tools._linear_search

    def noting(pattern: str) -> Any:
        search = linear(pattern)
        assert not isinstance(search, str)

        def counted(text: str) -> bool:
            searched[0] += 1
            return search(text)

        return counted

    monkeypatch.setattr(tools, "_linear_search", noting)
    monkeypatch.setattr(tools, "_COMPILED", type(tools._COMPILED)())
    patterns = {f"^p{i}_[0-9]+$": {"type": "integer"} for i in range(50)}
    tool = Tool.client("look", {"type": "object", "patternProperties": patterns}, trusted=False)
    with pytest.raises(ToolInputError, match="the schema took over 10000 steps"):
        tool.validate({f"k{i}": i for i in range(10_000)})
    assert searched[0] <= 10_000 * tools.SEARCH_UNITS_PER_STEP // tools.SEARCH_CALL_UNITS
    assert tool.validate({"p3_7": 1, "other": "x"}) == {"p3_7": 1, "other": "x"}


def test_a_worker_rebuilds_a_queued_client_tool_with_its_patterns_run(no_backtracking):
    rebuilt = ClientToolSpec(name="look", schema=LOOK).tool()
    with pytest.raises(ToolInputError, match="does not match"):
        rebuilt.validate({"q": "B"})


def test_a_client_tools_pattern_properties_run_in_the_linear_engine(no_backtracking):
    schema = {
        "type": "object",
        "patternProperties": {"^(a|aa)*$": {"type": "integer"}},
        "additionalProperties": False,
    }
    tool = Tool.client("look", schema, trusted=False)
    assert tool.validate({"aaa": 1}) == {"aaa": 1}
    with pytest.raises(ToolInputError, match="aaa: 'x' is not of type 'integer'"):
        tool.validate({"aaa": "x"})
    with pytest.raises(ToolInputError, match="additional properties are not allowed"):
        tool.validate({"a" * 5_000 + "!": 1})


async def test_an_agui_client_tools_pattern_refuses_the_models_input_and_stores_the_error():
    # The model's input is refused as any invalid input: the model is told (a tool
    # error), the call is not handed to the client, and the run goes on.
    agent = Agent(
        provider=ScriptedProvider([tool_call("look", {"q": "B!"}, tool_call_id="c1"), ["done"]])
    )
    async with web_server(agent, protocols=("ai-sdk", "ag-ui")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            r = await client.post(
                "/ag-ui", json=run_with_tools([{"name": "look", "parameters": LOOK}])
            )
        record = await server.host.store.load("t")
    assert r.status_code == 200 and "pendingToolCallIds" not in r.text
    assert record is not None
    (answer,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert answer.is_error and "q: 'B!' does not match '^[a-z]+$'" in str(answer.error)


def test_a_client_tool_pattern_the_linear_engine_does_not_take_is_skipped_with_one_warning():
    # A client's look-around (zod's regexes have some) is not run on the model's input:
    # the client runs its tool and checks its own input, and refusing the run would stop
    # a client that worked. Logged once per process, not once per request.
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^(?!x)"},
            "b": {"type": "string", "pattern": "^[0-9]+$"},
        },
    }
    agui_input._warned.clear()
    with capture_logs() as logs:
        for _ in range(3):
            (tool,) = agui_input.client_tools([{"name": "look", "parameters": schema}])
    assert tool.validate({"a": "xy", "b": "1"}) == {"a": "xy", "b": "1"}
    with pytest.raises(ToolInputError, match="b: 'x' does not match"):
        tool.validate({"a": "xy", "b": "x"})
    warned = [e for e in logs if e["event"] == "agui.schema-not-checked-here"]
    assert len(warned) == 1
    assert warned[0]["unchecked"] == [
        "pattern '^(?!x)': not taken by the linear engine: look-around, including "
        "look-ahead and look-behind, is not supported"
    ]


def test_a_requests_client_tools_compile_their_patterns_within_one_budget(compiles):
    # 128 tools of a distinct 2,600-unit pattern each (332,800 units, ~2 s to compile):
    # the request's budget stops compiling at LISTING_UNITS, the rest are not run.
    specs = [
        {
            "name": f"t{i}",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "pattern": f"^\\w{{40}}{i}$"}},
            },
        }
        for i in range(128)
    ]
    agui_input._warned.clear()
    built = agui_input.client_tools(specs)
    spent = sum(tools._compile_units(p) for p in compiles)
    skipped = [t for t in built if t.validator.axon_unchecked]
    assert 0 < spent <= tools.LISTING_UNITS
    assert len(compiles) + len(skipped) == 128
    assert "past the listing's 200000 units of compiling" in skipped[0].validator.axon_unchecked[0]


def test_a_programs_client_tool_with_a_pattern_the_linear_engine_does_not_take_is_refused():
    # A program's own schema: its author learns it as the tool is built (skipping it
    # would leave the input unchecked; Python's re would leave the loop to the input's
    # author).
    look_around = {"type": "object", "properties": {"q": {"type": "string", "pattern": "(?<=a)b"}}}
    with pytest.raises(
        InvalidJSONSchema,
        match=r"pattern '\(\?<=a\)b': not taken by the linear engine: look-around",
    ):
        Tool.client("look", look_around)
    with pytest.raises(InvalidJSONSchema, match="backreferences are not supported"):
        Tool.client("look", LOOK, output_schema={"type": "string", "pattern": r"(a)\1"})
    too_big = {"type": "object", "properties": {"q": {"type": "string", "pattern": r"\w{1000}"}}}
    with pytest.raises(InvalidJSONSchema, match="exceeds size limit"):
        Tool.client("look", too_big)


# -- a client tool's output -------------------------------------------------------------


async def test_a_client_tools_output_its_pattern_refuses_is_refused_and_nothing_is_saved(
    tmp_path, no_backtracking
):
    look = Tool.client("look", LOOK, output_schema={"type": "string", "pattern": "^(a|aa)*$"})
    agent = Agent(
        provider=ScriptedProvider([tool_call("look", {"q": "b"}, tool_call_id="c1"), ["done"]]),
        tools=[look],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        waited = await session.run("go")
        key = waited.pending[0].approval_id
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision, match=r"invalid output for look: \(root\): 'aaa"):
            await session.respond(key, output="a" * 50_000 + "!")
        after = await host.store.load("s")
        assert before is not None and after is not None
        assert (after.version, after.messages) == (before.version, before.messages)
        await session.respond(key, output="aaaa")
    assert [m.output for m in session.messages if isinstance(m, ToolMessage)] == ["aaaa"]


# -- an approve-with-edits checked against the schema stored with the wait --------------


def test_a_stored_schemas_patterns_compile_within_the_edit_checks_budget(compiles):
    # The stored schema's check is built on the deciding loop (a front end's): 20
    # distinct 2,601-unit patterns (~1 s to compile, loaded) compile within
    # EDIT_CHECK_UNITS; the rest are not run on an edit, named in the warning.
    schema = {
        "type": "object",
        "properties": {
            f"p{i}": {"type": "string", "pattern": f"^\\w{{40}}{i}$"} for i in range(20)
        },
    }
    approval._stored_validator.cache_clear()
    with capture_logs() as logs:
        validator = approval._stored_validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    spent = sum(tools._compile_units(p) for p in compiles)
    assert 0 < spent <= approval.EDIT_CHECK_UNITS
    assert len(compiles) + len(validator.axon_unchecked) == 20
    [warned] = [e for e in logs if e["event"] == "approval.schema-not-checked-here"]
    assert len(warned["unchecked"]) == 20 - len(compiles)


def _on_code(approval_id: str, edit: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool-code",
        "toolCallId": "c_code",
        "state": "approval-responded",
        "input": {"code": "ABC"},
        "approval": {"id": approval_id, "approved": True, EDITED_INPUT: edit},
    }


async def test_an_edit_that_the_mcp_tools_listed_pattern_refuses_is_a_400_and_nothing_saved():
    # The MCP server lists `code` with {"pattern": "^[A-Z]{3}$"}; the call waits with
    # that schema stored, and an edit is checked against it where the decision is made.
    # Before, the stored schema's patterns were not run there: "abc" was approved and
    # failed as the server's error.
    agent = Agent(
        name="mcp",
        provider=calling(("code", {"code": "ABC"})),
        tools=[stdio_server("--patterned", needs_approval=["code"])],
    )
    async with web_server(agent) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            response = await client.post("/api/chat", json=chat("s1", "go"))
            events = payloads(sse_events(response.text))
            asked = next(c for c in events if c["type"] == "tool-approval-request")
            message_id = events[0]["messageId"]
            before = await server.host.store.load("s1")
            refused = await client.post(
                "/api/chat",
                json=_answer("s1", message_id, _on_code(asked["approvalId"], {"code": "abc"})),
            )
            after = await server.host.store.load("s1")
            taken = await client.post(
                "/api/chat",
                json=_answer("s1", message_id, _on_code(asked["approvalId"], {"code": "XYZ"})),
            )
        record = await server.host.store.load("s1")
    assert refused.status_code == 400, refused.text
    assert "code: 'abc' does not match '^[A-Z]{3}$'" in refused.json()["error"]
    assert before is not None and after is not None
    assert (after.version, after.messages) == (before.version, before.messages)
    assert taken.status_code == 200, taken.text
    assert record is not None
    outputs = [m.output for m in record.messages if isinstance(m, ToolMessage)]
    assert outputs in (["XYZ"], [{"result": "XYZ"}]), outputs
