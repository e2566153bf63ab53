"""Checks of what a client sends that could hold the event loop, or the log, bounded.

A client tool's answer checked once against its output schema, a large one in a worker
thread while other sessions stream; ``uniqueItems`` on an untrusted schema's value hashed
(a step an item); the unchecked-pattern warning of AG-UI client tools once per pattern
and at most one line a request. Tests count (calls, threads, log lines), never time."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import jsonschema._utils
import orjson
import pytest
import trio
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, ToolMessage, approval
from runtime.actor_messages import InferRequest
from runtime.app.web import agui_input
from runtime.messages import UserMessage
from runtime.tools import ClientTool, Tool, ToolInputError
from tests.test_agui import post, run, run_input, user
from tests.test_web_http import body, events
from tests.web.harness import web_server

# -- a client tool's large answer: checked once, in a thread -----------------------------

ROWS = {
    "type": "object",
    "properties": {
        "rows": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
            },
        }
    },
    "required": ["rows"],
}
BIG = {"rows": [{"n": i} for i in range(20_000)]}
"""20,000 rows (~200 KB of JSON): past both thresholds (text and values) for a thread."""

seen: list[Any] = []
"""What the model read as the client tool's output, in turn."""


def _responder(request: InferRequest) -> list[Any]:
    last = [m for m in request.messages if isinstance(m, UserMessage)][-1]
    if "other" in str(last.content):
        return ["hello there"]
    if current_step(request.messages) == 0:
        return tool_call("table", {}, tool_call_id="c1")
    (result,) = [m for m in request.messages if isinstance(m, ToolMessage)]
    seen.append(result.output)
    return ["ok"]


def agent() -> Agent:
    table = Tool.client("table", {"type": "object"}, "Rows.", output_schema=ROWS)
    return Agent(name="rows", provider=ScriptedProvider(responder=_responder), tools=[table])


class Checks:
    """The table tool's output checks: each value checked (not the text's try), whether on
    the event loop's thread, and a hold of the first large one until the test lets go."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.on_main: list[bool] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_in_time: list[bool] = []
        self.hold = False
        self.converted_on_loop = 0
        """The rows converted to their stored form (``to_jsonable``) on the loop."""


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Checks:
    seen.clear()
    noted = Checks()
    original = ClientTool.validate_output

    def noting(tool: ClientTool, output: Any) -> None:
        if not isinstance(output, str):  # (structured_output tries the text first)
            noted.values.append(output)
            noted.on_main.append(threading.current_thread() is threading.main_thread())
            if noted.hold and len(noted.values) == 1:
                noted.entered.set()
                # On the loop, nothing else can run until this returns: the other
                # session's turn cannot end, and this wait gives up (False).
                noted.released_in_time.append(noted.release.wait(20))
        original(tool, output)

    monkeypatch.setattr(ClientTool, "validate_output", noting)
    to_jsonable = approval.to_jsonable

    def converting(value: Any) -> Any:
        if isinstance(value, dict) and "rows" in value:
            noted.converted_on_loop += threading.current_thread() is threading.main_thread()
        return to_jsonable(value)

    monkeypatch.setattr(approval, "to_jsonable", converting)
    return noted


async def _other_session_turn_meanwhile(server: Any, checks: Checks) -> list[Any]:
    """Once the big answer's check has begun, a turn of another session, to its end,
    over HTTP; then the check may end. The other turn's chunks."""
    await trio.to_thread.run_sync(checks.entered.wait, 20)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sent = body("other", "other")
        chunks = events((await client.post("/api/chat", json=sent)).content)
    checks.release.set()
    return chunks


async def test_an_agui_clients_large_json_answer_is_checked_once_in_a_thread_while_others_stream(
    checks,
):
    checks.hold = True
    async with web_server(agent(), protocols=("ag-ui", "ai-sdk")) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
        answer = {
            "id": "a1",
            "role": "tool",
            "toolCallId": wire,
            "content": orjson.dumps(BIG).decode(),
        }
        got: dict[str, Any] = {}

        async def answering() -> None:
            got["r"] = await post(server, run_input("s", user("go", "m1"), answer, runId="r2"))

        async def other() -> None:
            got["other"] = await _other_session_turn_meanwhile(server, checks)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answering)
            nursery.start_soon(other)
        record = await server.host.store.load("s")
    assert checks.released_in_time == [True]  # the other session's turn ended meanwhile
    assert _text(got["other"]) == "hello there"
    assert len(checks.values) == 1 and checks.on_main == [False]  # was 3, all on the loop
    assert checks.converted_on_loop == 0  # was 2 (the pre-check's and the recording's)
    # What the user sees: the run goes on and ends; what the model read, what is saved.
    assert got["r"].status_code == 200 and '"RUN_FINISHED"' in got["r"].text
    _saved_cut(record)


def _saved_cut(record: Any) -> None:
    """The answer (its 200 KB whole checked) is stored and read by the model as JSON text
    cut to the agent's max_tool_result_chars (100,000), as a server tool's would be."""
    assert record is not None
    (saved,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert isinstance(saved.output, str) and saved.output.startswith('{"rows":[{"n":0},{"n":1}')
    assert "characters omitted]" in saved.output and len(saved.output) < 100_200
    assert seen == [saved.output]


async def test_an_agui_clients_small_json_answer_is_checked_once_on_the_loop(checks):
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
        answer = {"id": "a1", "role": "tool", "toolCallId": wire, "content": '{"rows": []}'}
        r = await post(server, run_input("s", user("go", "m1"), answer, runId="r2"))
    assert r.status_code == 200, r.text
    assert checks.values == [{"rows": []}] and checks.on_main == [True]  # was 3 checks
    assert seen == [{"rows": []}]


async def test_an_agui_clients_large_answer_its_schema_refuses_is_a_400_checked_in_a_thread(
    checks,
):
    bad = {"rows": [{"n": i} for i in range(20_000)] + [{"n": "x"}]}
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
        answer = {
            "id": "a1",
            "role": "tool",
            "toolCallId": wire,
            "content": orjson.dumps(bad).decode(),
        }
        r = await post(server, run_input("s", user("go", "m1"), answer, runId="r2"))
        record = await server.host.store.load("s")
    assert r.status_code == 400 and r.json()["code"] == "InvalidDecision", r.text
    assert "rows.20000.n: 'x' is not of type 'integer'" in r.json()["error"]
    assert checks.on_main == [False]
    assert record is not None and not any(isinstance(m, ToolMessage) for m in record.messages)


def _text(chunks: list[Any]) -> str:
    return "".join(c["delta"] for c in chunks if c != "[DONE]" and c["type"] == "text-delta")


def _output_part(output: Any) -> dict[str, Any]:
    return {
        "type": "tool-table",
        "toolCallId": "c1",
        "state": "output-available",
        "input": {},
        "output": output,
    }


async def test_an_ai_sdk_clients_large_tool_output_is_checked_once_in_a_thread_while_others_stream(
    checks,
):
    checks.hold = True
    async with web_server(agent()) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            sent = body("s")
            sent["messages"].append(
                {
                    "id": first[0]["messageId"],
                    "role": "assistant",
                    "parts": [{"type": "step-start"}, _output_part(BIG)],
                }
            )
            sent["messageId"] = first[0]["messageId"]
            got: dict[str, Any] = {}

            async def answering() -> None:
                got["chunks"] = events((await client.post("/api/chat", json=sent)).content)

            async def other() -> None:
                got["other"] = await _other_session_turn_meanwhile(server, checks)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answering)
                nursery.start_soon(other)
        record = await server.host.store.load("s")
    assert checks.released_in_time == [True]
    assert _text(got["other"]) == "hello there"
    assert len(checks.values) == 1 and checks.on_main == [False]  # was 2, on the loop
    assert checks.converted_on_loop == 0  # was 2
    (shown,) = [
        c["output"] for c in got["chunks"] if c != "[DONE]" and c["type"] == "tool-output-available"
    ]
    assert shown == seen[0]  # the page shows what the model read
    _saved_cut(record)


async def test_session_respond_checks_a_large_output_once_in_a_thread(checks):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        result = await session.run("go")
        assert result.finish_reason is not None
        done = await session.respond("c1", output=BIG)
        record = await host.store.load("s")
    assert done is not None and done.text == "ok"
    assert len(checks.values) == 1 and checks.on_main == [False]
    assert checks.converted_on_loop == 0  # was 1
    _saved_cut(record)


async def test_session_respond_checks_a_small_output_once_on_the_loop(checks):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        await session.run("go")
        done = await session.respond("c1", output={"rows": [{"n": 1}]})
    assert done is not None and done.text == "ok"
    assert checks.values == [{"rows": [{"n": 1}]}] and checks.on_main == [True]


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
