"""Checks of what a client sends that could hold the event loop, or the log, bounded.

A client tool's answer checked once against its output schema, a large one in a worker
thread while other sessions stream; ``uniqueItems`` on an untrusted schema's value hashed
(a step an item); the unchecked-pattern warning of AG-UI client tools once per pattern
and at most one line a request. Tests count (calls, threads, log lines), never time."""

from __future__ import annotations

from typing import Any

import jsonschema._utils
import pytest
from structlog.testing import capture_logs

from runtime.app.web import agui_input
from runtime.tools import Tool, ToolInputError

# -- uniqueItems of a value, hashed ----------------------------------------------------


@pytest.fixture
def equal_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    equal = jsonschema._utils.equal

    def noting(one: Any, two: Any) -> Any:
        calls.append(1)
        return equal(one, two)

    monkeypatch.setattr(jsonschema._utils, "equal", noting)
    return calls


UNIQUE = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}


def test_unique_items_of_3000_objects_pass_an_untrusted_check_without_comparing_pairs(
    equal_calls,
):
    tool = Tool.client("look", UNIQUE, trusted=False)
    assert tool.validate({"a": [{"k": i} for i in range(3000)]})
    assert len(equal_calls) < 3000  # each pair compared: 4,498,500 (and refused as costly)


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([{"a": 1}, {"a": 1}], False),
        ([{"a": [1, {"b": 2}]}, {"a": [1, {"b": 2.0}]}], False),
        ([1, 1.0], False),
        ([True, 1], True),
        ([{"a": True}, {"a": 1}], True),
        ([[1, 2], [2, 1]], True),
        ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),
    ],
)
def test_unique_items_of_an_untrusted_check_are_unique_as_jsonschema_says(items, unique):
    tool = Tool.client("look", UNIQUE, trusted=False)
    trusted = Tool.client("look", UNIQUE)  # jsonschema's own keyword
    if unique:
        assert tool.validate({"a": items}) == trusted.validate({"a": items})
    else:
        for each in (tool, trusted):
            with pytest.raises(ToolInputError, match="non-unique"):
                each.validate({"a": items})


def test_unique_items_past_the_untrusted_budget_is_refused():
    tool = Tool.client("look", UNIQUE, trusted=False)
    with pytest.raises(ToolInputError, match="took over 10000 steps"):
        tool.validate({"a": list(range(20_000))})


# -- the unchecked-pattern warning of AG-UI client tools -------------------------------

LOOKAROUND = {"type": "object", "properties": {"q": {"type": "string", "pattern": "^(?!x)"}}}


def _warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "agui.schema-not-checked-here"]


def test_client_tools_renamed_every_request_log_their_unchecked_pattern_once():
    agui_input._warned.clear()
    with capture_logs() as logs:
        for request in range(3):
            specs = [{"name": f"r{request}_t{i}", "parameters": LOOKAROUND} for i in range(128)]
            assert len(agui_input.client_tools(specs)) == 128
    (warned,) = _warnings(logs)  # one a tool of each request: 384
    assert warned["tool"] == "r0_t0" and warned["more_tools"] == 0
    assert warned["unchecked"] == [
        "pattern '^(?!x)': not taken by the linear engine: look-around, including "
        "look-ahead and look-behind, is not supported"
    ]


def test_a_requests_new_unchecked_patterns_are_one_line_naming_a_few_and_counting_the_rest():
    agui_input._warned.clear()
    specs = [
        {
            "name": f"t{i}",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "pattern": f"^(?!x{i})"}},
            },
        }
        for i in range(128)
    ]
    with capture_logs() as logs:
        agui_input.client_tools(specs)
        agui_input.client_tools(specs)  # the same again: nothing new to say
    (warned,) = _warnings(logs)
    assert warned["tools"] == ["t0", "t1", "t2", "t3"]
    assert warned["more_tools"] == 124
    assert len(warned["unchecked"]) == agui_input.WARNED_SHOWN
    assert "t0' and 127 more: not run" in warned["error"]
