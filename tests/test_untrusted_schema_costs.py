"""An untrusted schema (an AG-UI client's tool, an MCP server's listing, a schema stored
with a wait) cannot leave the bounded checker or make building it quadratic.

Three ways it did: a subschema's own ``$schema`` handed the check to ``jsonschema``'s
stock validator of that dialect (patterns in Python's ``re``, keywords uncounted); the
draft-04 meta-schema's ``uniqueItems`` over an ``enum`` of objects compared every pair
as the schema was checked; and each ``"$ref": "#anchor"`` crawled the whole schema
again, as it was built and at each look-up of a validation. The tests count (calls of
the stock keywords, of ``jsonschema``'s ``equal``, of the registry's ``crawl``), never
time."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema._utils
import pytest
import referencing._core
from jsonschema import Draft7Validator

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, ToolMessage, approval, tools
from runtime.app.web import agui_input
from runtime.tools import InvalidJSONSchema, Tool, ToolInputError
from tests.test_client_tool_patterns import no_backtracking  # noqa: F401  (a fixture)
from tests.test_http_attacks_4 import run_with_tools
from tests.web.harness import web_server

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
DRAFT_04 = "http://json-schema.org/draft-04/schema#"

NESTED_DIALECT = {
    "type": "object",
    "properties": {"q": {"$schema": DRAFT_07, "type": "string", "pattern": "^(a|aa)*$"}},
}


def _client(schema: dict[str, Any]) -> Any:
    return Tool.client("look", schema, trusted=False).validator


def _server(schema: dict[str, Any]) -> Any:
    return tools.server_schema_validator(schema)


def _stored(schema: dict[str, Any]) -> Any:
    approval._stored_validator.cache_clear()
    return approval._stored_validator(orjson_sorted(schema))


def orjson_sorted(schema: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)


UNTRUSTED = pytest.mark.parametrize(
    "build", [_client, _server, _stored], ids=["client tool", "mcp listing", "stored schema"]
)


@pytest.fixture
def stock_keywords(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keywords the stock draft-07 validator ran from here on."""
    ran: list[str] = []
    for name, keyword in list(Draft7Validator.VALIDATORS.items()):

        def noting(*args: Any, _name: str = name, _keyword: Any = keyword) -> Any:
            ran.append(_name)
            return _keyword(*args)

        monkeypatch.setitem(Draft7Validator.VALIDATORS, name, noting)
    return ran


# -- a subschema's own $schema ----------------------------------------------------------


@UNTRUSTED
@pytest.mark.usefixtures("no_backtracking")
def test_a_subschemas_own_schema_keyword_keeps_its_pattern_in_the_linear_engine(
    build, stock_keywords
):
    validator = build(NESTED_DIALECT)
    with pytest.raises(ToolInputError, match=r"q: 'a+!'.* does not match '\^\(a\|aa\)\*\$'"):
        tools.check_against_schema("look", validator, {"q": "a" * 60 + "!"}, "arguments")
    tools.check_against_schema("look", validator, {"q": "aaaa"}, "arguments")
    assert stock_keywords == []


@UNTRUSTED
def test_a_subschemas_own_schema_keyword_keeps_the_bound_of_steps(build, stock_keywords):
    schema = {
        "type": "object",
        "properties": {"x": {"$schema": DRAFT_07, "type": "array", "uniqueItems": True}},
    }
    validator = build(schema)
    value = {"x": [{"a": i} for i in range(3_000)]}  # 4.5 million pairs
    with pytest.raises(ToolInputError, match=r"took over \d+ steps"):
        tools.check_against_schema("look", validator, value, "arguments")
    assert stock_keywords == []


@pytest.mark.usefixtures("no_backtracking")
async def test_an_agui_tools_nested_dialect_pattern_refuses_the_models_input_in_linear_time():
    agent = Agent(
        provider=ScriptedProvider(
            [tool_call("look", {"q": "a" * 60 + "!"}, tool_call_id="c1"), ["done"]]
        )
    )
    async with web_server(agent, protocols=("ai-sdk", "ag-ui")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            r = await client.post(
                "/ag-ui", json=run_with_tools([{"name": "look", "parameters": NESTED_DIALECT}])
            )
        record = await server.host.store.load("t")
    assert r.status_code == 200 and "pendingToolCallIds" not in r.text
    assert record is not None
    (answer,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert answer.is_error and "does not match '^(a|aa)*$'" in str(answer.error)


# -- the meta-schema's uniqueItems ------------------------------------------------------


@pytest.fixture
def equal_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    equal = jsonschema._utils.equal

    def noting(one: Any, two: Any) -> Any:
        calls.append(1)
        return equal(one, two)

    monkeypatch.setattr(jsonschema._utils, "equal", noting)
    return calls


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$schema": DRAFT_04,
            "type": "object",
            "properties": {"x": {"enum": [{"a": i} for i in range(400)]}},
        },
        {"type": "object", "properties": {"x": {"type": [{"a": i} for i in range(400)]}}},
    ],
    ids=["draft-04 enum", "2020-12 type"],
)
def test_a_schemas_arrays_of_objects_are_checked_unique_without_comparing_pairs(
    schema, equal_calls
):
    try:
        Tool.client("look", schema, trusted=False)
    except InvalidJSONSchema as exc:  # (a type that is no type name is refused, shortly)
        assert len(str(exc)) < 700
    assert len(equal_calls) < 400  # each pair compared: 79,800


@pytest.mark.parametrize(
    ("members", "unique"),
    [
        ([{"a": 1}, {"a": 1}], False),
        ([{"a": [1, {"b": 2}]}, {"a": [1, {"b": 2.0}]}], False),
        ([1, 1.0], False),
        ([True, 1], True),
        ([{"a": True}, {"a": 1}], True),
        ([[1, 2], [2, 1]], True),
        ([{"a": 1}, {"b": 1}], True),
    ],
)
def test_a_draft04_enum_is_unique_as_jsonschema_says(members, unique):
    schema = {"$schema": DRAFT_04, "type": "object", "properties": {"x": {"enum": members}}}
    if unique:
        Tool.client("look", schema, trusted=False)
    else:
        with pytest.raises(InvalidJSONSchema, match="non-unique elements"):
            Tool.client("look", schema, trusted=False)


# -- anchors ----------------------------------------------------------------------------


@pytest.fixture
def crawls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    crawl = referencing._core.Registry.crawl

    def noting(self: Any) -> Any:
        calls.append(len(self._uncrawled))
        return crawl(self)

    monkeypatch.setattr(referencing._core.Registry, "crawl", noting)
    return calls


@UNTRUSTED
def test_anchor_references_are_found_without_crawling_the_schema_again(build, crawls):
    n = 300
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"$ref": "#word"} for i in range(n)},
        "$defs": {"w": {"$anchor": "word", "type": "string"}},
    }
    validator = build(schema)
    built = len(crawls)
    tools.check_against_schema("look", validator, {f"p{i}": "x" for i in range(n)}, "arguments")
    with pytest.raises(ToolInputError, match="p7: 1 is not of type 'string'"):
        tools.check_against_schema("look", validator, {"p7": 1}, "arguments")
    assert built <= 3  # one a reference: 300 (and 300 more a check)
    assert len(crawls) == built


def test_a_schemas_long_complaint_is_cut_in_the_agui_400():
    schema = {"type": "object", "properties": [f"p{i}" for i in range(20_000)]}
    with pytest.raises(agui_input.AGUIError) as refused:
        agui_input.client_tools([{"name": "look", "parameters": schema}])
    assert refused.value.status == 400
    assert "is not of type 'object'" in refused.value.message
    assert len(refused.value.message) < 700  # was the list whole: 188,906 characters
