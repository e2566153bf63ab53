"""AG-UI (POST /ag-ui) and a client-side tool whose ``output_schema`` wants JSON other
than a string: a tool message's ``content`` is a string, so the answer is read as JSON
when the text itself does not fit the schema and the JSON does (a string schema takes
the text as it is, JSON-looking or not); an answer that fits neither is a 400
``InvalidDecision`` that says so. Top-level calls, a sub-agent's call passed up
(``H.L``), the official ``@ag-ui/client`` (tests/agui/run_agent.mjs), and a worker
deployment's front end (tests/test_worker_agui_client_output.py)."""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Tool
from runtime.actor_messages import InferRequest
from runtime.messages import ToolMessage
from tests.test_agui import post, run, run_input, user
from tests.test_agui_nested import answer
from tests.test_agui_node import node as node  # the fixture
from tests.test_agui_node import run_client
from tests.test_approval_nested_pass_client import parent
from tests.web.harness import web_server

pytest.importorskip("ag_ui.core")

PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}

seen: list[Any] = []
"""The outputs the top agent's model read, in turn."""


def _asks(request: InferRequest) -> list[Any]:
    if current_step(request.messages) == 0:
        return tool_call("where", {}, tool_call_id="c1")
    (result,) = [m for m in request.messages if isinstance(m, ToolMessage)]
    seen.append(result.output)
    return ["ok"]


def asking(output_schema: dict[str, Any]) -> Agent:
    """An agent whose model calls its client tool ``where`` (``output_schema``) once."""
    where = Tool.client("where", {"type": "object"}, "Where.", output_schema=output_schema)
    return Agent(name="asker", provider=ScriptedProvider(responder=_asks), tools=[where])


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


def tool_answer(call_id: str, content: str) -> dict[str, Any]:
    return {"id": f"a-{call_id}", "role": "tool", "toolCallId": call_id, "content": content}


async def answered(schema: dict[str, Any], content: str) -> Any:
    """The reply to the run answering ``where``'s call with ``content``."""
    async with web_server(asking(schema), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]  # the call's wire id
        assert wire.endswith(".s0.c1")
        body = run_input("s", user("go", "m1"), tool_answer(wire, content), runId="r2")
        return await post(server, body)


# -- top-level client calls ---------------------------------------------------------------


async def test_an_object_schema_takes_the_content_as_json():
    r = await answered(PLACE, '{"city": "Paris"}')
    assert r.status_code == 200, r.text
    assert seen == [{"city": "Paris"}]


@pytest.mark.parametrize(
    ("schema", "content", "output"),
    [
        ({"type": "array", "items": {"type": "integer"}}, "[1, 2]", [1, 2]),
        ({"type": "number"}, "4.5", 4.5),
        ({"type": "boolean"}, "true", True),
    ],
)
async def test_an_array_number_or_boolean_schema_takes_the_content_as_json(
    schema: dict[str, Any], content: str, output: Any
):
    r = await answered(schema, content)
    assert r.status_code == 200, r.text
    assert seen == [output]


async def test_a_string_schema_takes_json_looking_text_as_it_is():
    r = await answered({"type": "string"}, '{"city": "Paris"}')
    assert r.status_code == 200, r.text
    assert seen == ['{"city": "Paris"}']


async def test_a_schema_that_takes_a_string_or_an_object_takes_the_text_as_it_is():
    r = await answered({"type": ["string", "object"]}, '{"city": "Paris"}')
    assert r.status_code == 200, r.text
    assert seen == ['{"city": "Paris"}']


async def test_content_that_is_not_json_for_an_object_schema_is_a_400_saying_so():
    r = await answered(PLACE, "Paris")
    assert r.status_code == 400 and r.json()["code"] == "InvalidDecision", r.text
    message = r.json()["error"]
    assert ".s0.c1'" in message and "where" in message
    assert "as JSON text" in message and "not JSON" in message
    assert seen == []


async def test_json_that_does_not_match_the_schema_is_a_400_naming_the_problem():
    r = await answered(PLACE, '{"town": "Paris"}')
    assert r.status_code == 400 and r.json()["code"] == "InvalidDecision", r.text
    message = r.json()["error"]
    assert "'city' is a required property" in message and "read as JSON" in message


async def test_an_error_answer_is_taken_whatever_the_schema():
    async with web_server(asking(PLACE), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        failed = {**tool_answer("c1", "no GPS"), "error": "no GPS"}
        r = await post(server, run_input("s", user("go", "m1"), failed, runId="r2"))
    assert r.status_code == 200, r.text


async def test_the_same_json_answer_sent_again_is_the_answer_recorded():
    """A replayed run: its answer, read as JSON, is the one recorded (not another)."""
    async with web_server(asking(PLACE), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        body = run_input("s", user("go", "m1"), tool_answer("c1", '{"city": "Paris"}'))
        await run(server, {**body, "runId": "r2"})
        again = await post(server, {**body, "runId": "r3"})
    assert again.status_code == 200, again.text
    assert seen == [{"city": "Paris"}]


# -- a sub-agent's call passed up ---------------------------------------------------------


async def test_a_passed_up_sub_call_with_an_object_schema_takes_the_content_as_json():
    async with web_server(parent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
        assert wire.endswith(".s0.H.L")
        body = run_input("s", user("go", "m1"), answer(wire, '{"city": "Paris"}'), runId="r2")
        last = await run(server, body)
    text = "".join(e["delta"] for e in last if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "parent saw: you are in Paris"


async def test_a_passed_up_sub_call_answered_with_text_its_schema_refuses_is_a_400():
    async with web_server(parent(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        body = run_input("s", user("go", "m1"), answer("H.L", "Paris"), runId="r2")
        r = await post(server, body)
    assert r.status_code == 400 and r.json()["code"] == "InvalidDecision", r.text
    assert "'H.L'" in r.json()["error"] and "locate" in r.json()["error"]


# -- the official client ------------------------------------------------------------------


async def test_the_official_client_answers_a_passed_up_call_with_json_text(node):
    async with web_server(parent(), protocols=("ag-ui",)) as server:
        runs = [{"userText": "go"}, {"answerPending": {"content": '{"city": "Paris"}'}}]
        out = await run_client(node, {"url": server.url + "/ag-ui", "threadId": "t", "runs": runs})
    asked, answered_run = out["results"]
    assert out["warnings"] == []
    (wire,) = asked["outcome"]["pendingToolCallIds"]
    assert wire.endswith(".s0.H.L")
    assert answered_run["error"] is None and answered_run["schemaErrors"] == [], answered_run
    (assistant,) = [m for m in answered_run["messages"] if m["role"] == "assistant"]
    assert assistant["content"] == "parent saw: you are in Paris"


async def test_the_official_client_answers_a_top_level_call_with_json_text(node):
    async with web_server(asking(PLACE), protocols=("ag-ui",)) as server:
        runs = [{"userText": "go"}, {"answerPending": {"content": '{"city": "Paris"}'}}]
        out = await run_client(node, {"url": server.url + "/ag-ui", "threadId": "t", "runs": runs})
    asked, answered_run = out["results"]
    (wire,) = asked["outcome"]["pendingToolCallIds"]
    assert wire.endswith(".s0.c1")
    assert answered_run["error"] is None and answered_run["outcome"]["type"] == "success"
    assert seen == [{"city": "Paris"}]
