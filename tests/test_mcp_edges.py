"""Two edges of a hostile or buggy MCP server, on a real stdio server
(tests/support/hostile_mcp_server.py): an input schema too costly to check the model's
input against on the event loop, and an answer the ``mcp`` package cannot read.
benchmarks/journal/workers.md ("mcpedge") has the measurements."""

from __future__ import annotations

import json
from collections import OrderedDict
from types import SimpleNamespace

import jsonschema._keywords
import jsonschema._utils
import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from jsonschema.validators import Draft202012Validator
from mcp.shared.message import SessionMessage
from structlog.testing import capture_logs

from actors.mcp import MCPServer, build_tool, unchecked_text
from actors.mcp_lines import Lines
from runtime import Agent, Host
from runtime import tools as tools_module
from runtime.errors import MCPServerError, MCPServerUnavailable, ToolDefinitionError
from runtime.tools import (
    BYTES_PER_STEP,
    LISTING_UNITS,
    PATTERN_UNITS,
    UNTRUSTED_STEPS,
    ToolInputError,
    schema_errors,
    server_schema_validator,
)
from tests.test_mcp_attacks import calling, hostile, run_turn, tool_messages

CATASTROPHIC = "a" * 45 + "!"
"""Python's ``re`` takes minutes on it with ``^(a|aa)*$`` (each ``a`` more, 1.6x)."""


def count_steps(monkeypatch) -> list[int]:
    spent = [0]
    spend = tools_module._spend

    def counting(steps: int) -> None:
        spent[0] += steps
        spend(steps)

    monkeypatch.setattr(tools_module, "_spend", counting)
    return spent


def no_backtracking(monkeypatch) -> list[str]:
    """Make jsonschema's own ``re.search`` (the backtracking one) record its pattern and
    refuse to run it."""
    ran: list[str] = []

    class Re:
        def search(self, pattern, text):
            ran.append(pattern)
            raise AssertionError(f"Python's re ran {pattern!r}")

    monkeypatch.setattr(jsonschema._keywords, "re", Re())
    monkeypatch.setattr(jsonschema._utils, "re", Re())
    return ran


async def test_an_exponential_schema_fails_its_call_within_a_bound_of_steps(monkeypatch):
    # 16 definitions, each anyOf two $refs to the one before (1.3 KB): the check of the
    # model's input took 2**16 paths, 9.5 s of the loop of the process running the call
    # (every session of that host stalled). Now the call fails past the bound, naming
    # the server and its tool; the tool stays offered and the others run.
    spent = count_steps(monkeypatch)
    agent = Agent(
        provider=calling(("expo", {"x": 1}), ("echo", {"text": "still here"})),
        tools=[hostile("costly-schemas")],
    )
    with capture_logs() as logs:
        session, result, actor = await run_turn(agent)
    saved = tool_messages(session)
    bound = UNTRUSTED_STEPS + len(b'{"x":1}')
    assert saved["expo"].error == (
        "the arguments for expo cannot be checked: MCP server 'hostile''s input schema of "
        f"tool 'expo' took over {bound} steps to check them (a schema too costly to check "
        "here; the call was not made)"
    )
    assert saved["echo"].output == "still here"
    [expo] = [t for t in actor.tools if t.name == "expo"]  # still offered
    spent[0] = 0
    with pytest.raises(ToolInputError, match="took over 10007 steps"):
        expo.validate({"x": 1})
    assert UNTRUSTED_STEPS < spent[0] <= bound + 1  # 2**16 paths undone
    assert [(e["server"], e["tool"]) for e in logs if e["event"] == "mcp.schema-too-costly"] == [
        ("hostile", "expo")
    ]
    assert result.text == "done"


async def test_an_exponential_output_schema_fails_its_call_within_a_bound_off_the_loop(
    monkeypatch,
):
    # The mcp package checked a result's structured content against the tool's output
    # schema with its own jsonschema, unbounded and on the event loop: this one's 2**15
    # anyOf paths held every session of the host (~2 s; each definition more, twice
    # that). Axon now checks it with the bounded check of input schemas, in a worker
    # thread (the loop runs on beside it): the call fails past the bound, naming the
    # server and tool; another tool's valid content still passes.
    evaluated = [0]
    any_of = Draft202012Validator.VALIDATORS["anyOf"]

    def counting(*args):
        evaluated[0] += 1
        return any_of(*args)

    monkeypatch.setitem(Draft202012Validator.VALIDATORS, "anyOf", counting)
    ticks = [0]
    seen: dict[int, list[tuple[int, int]]] = {}  # the loop's ticks and steps, by check
    spend = tools_module._spend

    def watching(steps: int) -> None:
        seen.setdefault(id(tools_module._STEPS_LEFT.get()), []).append((ticks[0], steps))
        spend(steps)

    monkeypatch.setattr(tools_module, "_spend", watching)

    async def tick() -> None:
        while True:
            ticks[0] += 1
            await trio.sleep(0.001)

    agent = Agent(
        provider=calling(("expo_out", {"pad": 20_000}), ("typed", {})),
        tools=[hostile("costly-output")],
    )
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            session, result, _ = await run_turn(agent)
            nursery.cancel_scope.cancel()
    saved = tool_messages(session)
    bound = UNTRUSTED_STEPS + len(b'{"x":1,"pad":""}') + 20_000  # past ON_LOOP_STEPS
    assert saved["expo_out"].error == (
        "tool expo_out raised MCPServerError: MCP server 'hostile' sent a result of tool "
        f"'expo_out' that cannot be checked: its output schema took over {bound} steps to "
        "check it (a schema too costly to check here)"
    )
    assert saved["typed"].output == {"n": 5}
    assert evaluated[0] <= bound  # 2**15 paths before
    check = max(seen.values(), key=len)
    assert bound < sum(steps for _, steps in check) <= bound + 3  # (a $ref's pointer: 3)
    assert check[-1][0] > check[0][0]  # the loop ran while it checked
    assert [(e["server"], e["tool"]) for e in logs if e["event"] == "mcp.schema-too-costly"] == [
        ("hostile", "expo_out")
    ]
    assert result.text == "done"


async def test_a_result_whose_check_walks_it_at_every_path_is_refused_within_its_work(
    monkeypatch,
):
    # An output schema whose 2**15 paths each end in `items: true` walked the whole
    # array of the result at each path, a step each time: 4 KB of content (14,009 steps,
    # on the loop) walked 2,000 items per step, ~7 s of the loop; 1 MiB, days of a
    # thread. Each walk now costs a step a BYTES_PER_STEP items: the call fails within
    # work in proportion to its steps, the model told why in the tool's error (saved
    # as it is), the user shown the same error, the other tool's result kept.
    walked = [0]
    items = Draft202012Validator.VALIDATORS["items"]
    bound = UNTRUSTED_STEPS + len(orjson.dumps({"x": [0] * 2_000}))

    def walking(validator, value, instance, schema):
        walked[0] += len(instance) if isinstance(instance, list) else 0
        if walked[0] > BYTES_PER_STEP * bound:
            raise AssertionError(f"{walked[0]} items walked")
        return items(validator, value, instance, schema)

    monkeypatch.setitem(Draft202012Validator.VALIDATORS, "items", walking)
    provider = calling(("wide_out", {}), ("typed", {}))
    agent = Agent(provider=provider, tools=[hostile("costly-output")])
    errors_shown = []
    with capture_logs() as logs:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                async for chunk in out:
                    if chunk.type == "tool-error":
                        errors_shown.append((chunk.tool_name, chunk.error))
    error = (
        "tool wide_out raised MCPServerError: MCP server 'hostile' sent a result of tool "
        f"'wide_out' that cannot be checked: its output schema took over {bound} steps to "
        "check it (a schema too costly to check here)"
    )
    saved = tool_messages(session)
    assert saved["wide_out"].error == error  # what is saved, and what the model is sent
    assert saved["typed"].output == {"n": 5}
    [sent] = [m for m in provider.requests[-1].messages if m.role == "tool" and m.error]
    assert sent.error == error
    assert errors_shown == [("wide_out", error)]  # what the user is shown
    assert 0 < walked[0] <= BYTES_PER_STEP * bound
    assert [(e["tool"], e["schema"]) for e in logs if e["event"] == "mcp.schema-too-costly"] == [
        ("wide_out", "output")
    ]
    assert out.result.text == "done"


def test_a_tool_whose_output_schema_cannot_be_checked_is_refused():
    # The mcp package compiled an output schema at the first call of the tool, and each
    # call of one it could not compile failed; now the tool is refused when listed, as
    # for an input schema (and a longer one than max_tool_chars, checked on every result).
    listed = SimpleNamespace(name="t", input_schema={"type": "object"}, description="", title=None)
    config = MCPServer.stdio("x", name="s", max_tool_chars=100)
    with pytest.raises(ToolDefinitionError, match="'t' has an invalid output schema: "):
        build_tool(config, listed, print, output_schema={"type": 5})
    with pytest.raises(ToolDefinitionError, match="'t' has an output schema of 223 characters"):
        build_tool(config, listed, print, output_schema={"description": "x" * 205})
    tool = build_tool(config, listed, print, output_schema={"type": "object"})
    assert tool.output_schema == {"type": "object"} and tool.output_validator is not None


async def test_a_catastrophic_pattern_is_run_in_linear_time_and_still_checks(monkeypatch):
    # '^(a|aa)*$' against 45 'a' and a '!': minutes in Python's re, on the loop. The
    # pattern is now run by pydantic-core's Rust engine (no backtracking): the input is
    # still refused as not matching, a matching one still passes.
    ran = no_backtracking(monkeypatch)
    agent = Agent(
        provider=calling(("pat", {"s": CATASTROPHIC}), ("echo", {"text": "aaaa"})),
        tools=[hostile("costly-schemas")],
    )
    session, _, actor = await run_turn(agent)
    assert tool_messages(session)["pat"].error == (
        f"invalid arguments for pat: s: {CATASTROPHIC!r} does not match '^(a|aa)*$'"
    )
    [pat] = [t for t in actor.tools if t.name == "pat"]
    assert pat.validate({"s": "aaaa"}) == {"s": "aaaa"}
    assert ran == []


async def test_pattern_properties_run_in_linear_time_and_a_lookaround_is_reported_once(
    monkeypatch,
):
    # patternProperties cannot be skipped (it decides which schema a property gets), so
    # refusing it would refuse the tool: its patterns run in linear time too, and the one
    # the linear engine does not take (a look-around) is not run here, logged at listing.
    ran = no_backtracking(monkeypatch)
    agent = Agent(
        provider=calling(("keyed", {"x_aa": "no", "x_" + CATASTROPHIC: 1, "yy": 5})),
        tools=[hostile("costly-schemas")],
    )
    with capture_logs() as logs:
        session, _, actor = await run_turn(agent)
    assert tool_messages(session)["keyed"].error == (
        "invalid arguments for keyed: x_aa: 'no' is not of type 'integer'"
    )
    [keyed] = [t for t in actor.tools if t.name == "keyed"]
    assert keyed.validate({"x_aa": 3, "yy": 5}) == {"x_aa": 3, "yy": 5}  # yy: not run
    [logged] = [e for e in logs if e["event"] == "mcp.schema-not-checked-here"]
    assert (logged["server"], logged["tool"]) == ("hostile", "keyed")
    assert logged["unchecked"] == [
        "patternProperties '^(?=y)y+$': not taken by the linear engine: look-around, "
        "including look-ahead and look-behind, is not supported"
    ]
    assert ran == []


def test_additional_properties_beside_pattern_properties_are_refused_in_linear_time(
    monkeypatch,
):
    ran = no_backtracking(monkeypatch)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}},
        "patternProperties": {"^x_(a|aa)*$": {"type": "integer"}},
        "additionalProperties": False,
    }
    listed = SimpleNamespace(name="t", input_schema=schema, description="d", title=None)
    tool = build_tool(MCPServer.stdio("x", name="s"), listed, print)
    assert tool.validator.axon_unchecked == ()
    assert tool.validate({"name": "abc", "x_aaa": 1}) == {"name": "abc", "x_aaa": 1}
    with pytest.raises(ToolInputError) as refused:
        tool.validate({"name": "ABC", "x_" + CATASTROPHIC: 1})
    assert str(refused.value) == (
        f"invalid arguments for t: (root): additional properties are not allowed "
        f"({'x_' + CATASTROPHIC!r} unexpected); name: 'ABC' does not match '^[a-z]+$'"
    )
    assert ran == []


async def test_a_listing_answer_the_package_cannot_read_fails_at_once_naming_the_server():
    # An answer to tools/list nested past the mcp package's parser (300 deep) was logged
    # as a transport error and dropped: the listing waited its whole connect_timeout
    # (30 s) for an answer that had come. It now fails with what was wrong.
    agent = Agent(provider=calling(), tools=[hostile("bad-listing")])
    async with Host.open(log_tap=False) as host:
        with pytest.raises(MCPServerUnavailable) as failed:
            await host.open_session(agent)
    error = str(failed.value)
    assert error.startswith(
        "MCP server 'hostile' could not start: MCPError: its answer could not be read: a line of "
    )
    assert "is no JSON-RPC message: Invalid JSON: recursion limit exceeded" in error
    assert "did not list its tools within" not in error


async def test_a_listing_answer_nested_past_orjson_fails_at_once_without_the_env_key():
    # 2,000 deep, orjson (1,024) did not read its id either: the listing waited its whole
    # connect_timeout (30 s). It now fails at once, quoting the line's head without the
    # API key the server was given in its env (tests/test_mcp_lines.py: the same on a
    # virtual clock).
    key = "kQ7vW2xZ9pL4mN8rT3yB6cF1"
    agent = Agent(provider=calling(), tools=[hostile("deep-listing", MCP_TEST_KEY=key)])
    async with Host.open(log_tap=False) as host:
        with pytest.raises(MCPServerUnavailable) as failed:
            await host.open_session(agent)
    error = str(failed.value)
    assert error.startswith(
        "MCP server 'hostile' could not start: MCPError: its answer could not be read: a line of "
    )
    assert error.endswith(
        """(it began '{"jsonrpc": "2.0", "id": 2, "result": {"key": "[redacted]", '...)"""
    )
    assert "did not list its tools within" not in error


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=10,
)


@given(
    ident=st.integers(-(2**53), 2**53) | st.text(max_size=8),
    fields=st.dictionaries(st.sampled_from(["jsonrpc", "result", "error", "x"]), JSON),
    depth=st.sampled_from([0, 300, 2000]),
)
def test_every_answer_with_an_id_reaches_its_request(ident, fields, depth):
    # An answer with an id and no method, readable or not (nested past the mcp package's
    # parser, or past orjson's 1,024), is a message for the request with that id (its
    # result, or an error saying why it could not be read): never dropped, which left
    # the request waiting for its timeout.
    import mcp_types

    lines = Lines()
    lines.wrote(mcp_types.JSONRPCRequest(jsonrpc="2.0", id=ident, method="ping"))
    answer = {**fields, "id": ident}
    text = json.dumps(answer)
    if depth:
        answer["result"] = None
        text = json.dumps(answer).replace('"result": null', f'"result": {"[" * depth}{"]" * depth}')
    [parsed] = lines.read(text)
    assert isinstance(parsed, SessionMessage)
    assert parsed.message.id == ident
    if depth:
        assert "recursion limit exceeded" in parsed.message.error.message


def test_a_line_without_an_id_is_still_only_a_transport_error():
    for line in ('{"jsonrpc": "2.0", "result": {}}', "not json", '{"id": true}', "[1]"):
        assert [type(m) for m in Lines().read(line)] == [MCPServerError]


def test_a_listing_compiles_its_patterns_within_a_budget(monkeypatch):
    # The linear engine's compiling holds the loop too (``^\w{3,50}$``: 14 ms; a 1 MiB
    # listing of distinct ``\w{40}`` patterns took minutes). A pattern estimated past
    # PATTERN_UNITS is never compiled, a listing compiles at most LISTING_UNITS, and a
    # pattern compiled before costs nothing: the rest are not run here, saying why.
    monkeypatch.setattr(tools_module, "_COMPILED", OrderedDict())
    compiled: list[str] = []
    compile_pattern = tools_module._linear_search

    def counting(pattern: str):
        compiled.append(pattern)
        return compile_pattern(pattern)

    monkeypatch.setattr(tools_module, "_linear_search", counting)
    costly = [f"^p{n}" + r"\w{3,60}$" for n in range(100)]  # ~3,900 units each
    schema = {
        "type": "object",
        "properties": {f"p{n}": {"type": "string", "pattern": p} for n, p in enumerate(costly)}
        | {"big": {"type": "string", "pattern": r"\w{100}"}},
    }
    budget = [LISTING_UNITS]
    validator = server_schema_validator(schema, budget)
    assert r"\w{100}" not in compiled
    assert 0 < len(compiled) < len(costly)
    assert sum(map(tools_module._compile_units, compiled)) <= LISTING_UNITS
    assert budget[0] >= 0
    unchecked = validator.axon_unchecked
    assert f"pattern '\\\\w{{100}}': too costly to compile (over {PATTERN_UNITS} units)" in (
        unchecked
    )
    past = [
        u for u in unchecked if u.endswith(f"past the listing's {LISTING_UNITS} units of compiling")
    ]
    assert len(past) == len(costly) - len(compiled)
    first = compiled[0]
    assert schema_errors(validator, {"p0": "ab"})[0].message == f"'ab' does not match {first!r}"

    compiled.clear()  # the next listing: what was compiled costs nothing
    again = server_schema_validator(
        {"type": "object", "properties": {"p": {"pattern": first}}}, [0]
    )
    assert compiled == [] and again.axon_unchecked == ()


def test_the_unchecked_schema_warning_says_whether_an_input_or_an_output_pattern_is_skipped():
    lookaround = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=a)a"}}}
    listed = SimpleNamespace(name="t", input_schema=lookaround, description="", title=None)
    config = MCPServer.stdio("x", name="s")
    tool = build_tool(config, listed, print, output_schema=lookaround)
    skipped = (
        *tool.validator.axon_unchecked,
        *(f"output schema: {s}" for s in tool.output_validator.axon_unchecked),
    )
    text = unchecked_text("s", "t", skipped)
    (why,) = tool.validator.axon_unchecked
    assert text == (
        "MCP server 's': tool 't': not run on the model's input here (the server checks its "
        f"own input): {why}; not run on the server's output here: {why}"
    )
