"""The official AG-UI client (`@ag-ui/client`'s HttpAgent) runs an Axon agent over
POST /ag-ui: a frontend tool the client answers, an approval it resumes, each event
verified by the client and parsed with `@ag-ui/core`'s EventSchema.

tests/agui/run_agent.mjs drives the client. The packages are installed from the npm
registry into tests/agui on first use; without Node.js, npm or the registry the test
skips (as the `ai` package's tests do, tests/web/harness.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio.lowlevel

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, ProviderError, ReasoningChunk, RetryPolicy, tool
from runtime.ratelimit import RateLimit
from tests.web.harness import NPM_TIMEOUT, run_node_script, web_server

AGUI = Path(__file__).resolve().parent / "agui"

ran: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return f"deleted {path}"


PICK_COLOR = {
    "name": "pick_color",
    "description": "Ask the user to pick a color.",
    "parameters": {
        "type": "object",
        "properties": {"options": {"type": "array", "items": {"type": "string"}}},
        "required": ["options"],
    },
}

STEPS = [
    [
        ReasoningChunk(text="Ask the user first."),
        "Let me ask. ",
        *tool_call("pick_color", {"options": ["red", "blue"]}, tool_call_id="c1"),
    ],
    [*tool_call("delete_file", {"path": "/tmp/x"}, tool_call_id="d1")],
    ["Deleted; you chose blue."],
]


@pytest.fixture(scope="module")
def node() -> str:
    """``node``, with @ag-ui/client and @ag-ui/core installed in tests/agui."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js/npm not installed: the @ag-ui/client check needs them")
    if not (AGUI / "node_modules" / "@ag-ui" / "client" / "package.json").exists():
        try:
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=AGUI,
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"npm install of @ag-ui/client failed: {exc}")
        if proc.returncode != 0:
            pytest.skip(f"npm install of @ag-ui/client failed: {proc.stderr.strip()[-400:]}")
    return node


async def run_client(node: str, config: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = await run_node_script(node, AGUI / "run_agent.mjs", config)
    return result


async def test_the_official_client_answers_a_frontend_tool_then_resumes_an_approval(node):
    ran.clear()
    agent = Agent(name="helper", provider=ScriptedProvider(STEPS), tools=[delete_file])
    async with web_server(agent, protocols=("ag-ui",), token="tok") as server:
        out = await run_client(
            node,
            {
                "url": server.url + "/ag-ui",
                "token": "tok",
                "threadId": "thread-1",
                "runs": [
                    {"userText": "Pick a color, then delete /tmp/x", "tools": [PICK_COLOR]},
                    {"answerPending": {"content": "blue"}, "tools": [PICK_COLOR]},
                    {"approveAll": True, "tools": [PICK_COLOR]},
                ],
            },
        )
        record = await server.host.store.load("thread-1")
    first, second, third = out["results"]
    assert out["warnings"] == []  # the client stripped, translated or dropped nothing
    for result in out["results"]:
        assert result["error"] is None, result["error"]
        assert result["schemaErrors"] == []

    # 1: the frontend tool call ends the run as success, naming the call
    roles = [m["role"] for m in first["messages"]]
    assert roles == ["user", "reasoning", "assistant"]
    reasoning, assistant = first["messages"][1:]
    c1, d1 = f"{assistant['id']}.s0.c1", f"{assistant['id']}.s1.d1"  # the calls' wire ids
    assert first["outcome"] == {"type": "success", "pendingToolCallIds": [c1], "interrupts": None}
    assert first["types"][0] == "RUN_STARTED" and first["types"][-1] == "RUN_FINISHED"
    assert reasoning["content"] == "Ask the user first."
    assert assistant["content"] == "Let me ask. "
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["toolCalls"]
    ] == [(c1, "pick_color", {"options": ["red", "blue"]})]

    # 2: the client's tool message answers it; the turn goes on into an approval
    assert second["outcome"]["type"] == "interrupt"
    (interrupt,) = second["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_call" and interrupt["toolCallId"] == d1
    assert [i["id"] for i in second["pendingInterrupts"]] == [interrupt["id"]]

    # 3: resume approves: the tool runs once, its result and the answer stream
    assert third["outcome"]["type"] == "success"
    assert third["pendingInterrupts"] == []
    assert ran == ["/tmp/x"]
    final = third["messages"]
    assert [m["role"] for m in final] == ["user", "reasoning", "assistant", "tool", "tool"]
    assert final[2]["content"] == "Let me ask. Deleted; you chose blue."
    assert [(m["toolCallId"], m["content"]) for m in final[3:]] == [
        (c1, "blue"),
        (d1, "deleted /tmp/x"),
    ]
    # one turn on the server: the same assistant message, continued twice
    assert [type(m).__name__ for m in record.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "ToolMessage",
    ]
    assert record.messages[1].id == final[2]["id"]


async def test_the_official_client_surfaces_a_failed_run(node):
    agent = Agent(
        provider=ScriptedProvider([["Partial", ProviderError("upstream exploded")]]),
        retry=RetryPolicy(max_attempts=1),
    )
    async with web_server(agent, protocols=("ag-ui",)) as server:
        out = await run_client(
            node,
            {"url": server.url + "/ag-ui", "threadId": "t", "runs": [{"userText": "go"}]},
        )
    (result,) = out["results"]
    assert result["types"][-1] == "RUN_ERROR"
    assert result["runError"]["code"] == "ProviderError"
    assert "upstream exploded" in result["runError"]["message"]
    assert result["schemaErrors"] == [] and out["warnings"] == []


async def test_the_official_client_reads_through_keep_alive_comments(node):
    agent = Agent(provider=ScriptedProvider([["Slow", Sleep(0.5), " answer."]]))
    async with web_server(agent, protocols=("ag-ui",), keepalive=0.05) as server:
        out = await run_client(
            node,
            {"url": server.url + "/ag-ui", "threadId": "t", "runs": [{"userText": "go"}]},
        )
    (result,) = out["results"]
    assert result["error"] is None and result["runError"] is None
    assert result["outcome"]["type"] == "success"
    assert result["messages"][-1]["content"] == "Slow answer."


async def test_the_official_client_ends_without_the_text_of_a_step_that_started_over(node):
    from runtime.errors import Overloaded

    busy = Overloaded("overloaded", provider="scripted", status_code=529)
    primary = ScriptedProvider([["Half an ans", busy]], name="primary")
    backup = ScriptedProvider([["The whole answer."]], name="backup")
    agent = Agent(name="helper", provider=[primary, backup], retry=RetryPolicy(max_attempts=1))
    async with web_server(agent, protocols=("ag-ui",), token="tok") as server:
        out = await run_client(
            node,
            {
                "url": server.url + "/ag-ui",
                "token": "tok",
                "threadId": "thread-r",
                "runs": [{"userText": "Go"}],
            },
        )
    (result,) = out["results"]
    assert out["warnings"] == []
    assert result["error"] is None and result["schemaErrors"] == []
    types = result["types"]
    assert "CUSTOM" in types and types[-2:] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    # the client built "Half an ansThe whole answer." from the stream; the snapshot wins
    assert [(m["role"], m.get("content")) for m in result["messages"]] == [
        ("user", "Go"),
        ("assistant", "The whole answer."),
    ]


class InstantClock:
    """A rate limiter's clock whose waits pass at once (their seconds added to ``now``)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await trio.lowlevel.checkpoint()


@tool
async def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


async def test_the_official_client_takes_a_rate_limit_wait_as_a_custom_event(node):
    """The step's model call waits for the rate limit: the run says so with ``CUSTOM``
    ``axon.throttled`` (it was dropped: the run went quiet), which the client hands on
    untouched, schema-valid, with no warning."""
    limit = RateLimit(requests_per_minute=1, clock=InstantClock())
    steps = [[*tool_call("look", {"q": "x"}, tool_call_id="L")], ["Found it."]]
    agent = Agent(provider=ScriptedProvider(steps, rate_limit=limit), tools=[look])
    async with web_server(agent, protocols=("ag-ui",)) as server:
        out = await run_client(
            node,
            {"url": server.url + "/ag-ui", "threadId": "t", "runs": [{"userText": "go"}]},
        )
    (result,) = out["results"]
    assert out["warnings"] == [] and result["schemaErrors"] == []
    assert result["error"] is None and result["outcome"]["type"] == "success"
    custom = [e for e in result["events"] if e["type"] == "CUSTOM"]
    assert [(e["name"], e["value"]) for e in custom] == [
        ("axon.throttled", {"step": 1, "wait": 60.0, "reason": "requests"})
    ]
    # said inside step 1, before its text
    names = [e.get("stepName") or e.get("name") or e["type"] for e in result["events"]]
    assert names.index("axon.throttled") > names.index("step-1")
    assert names.index("axon.throttled") < result["types"].index("TEXT_MESSAGE_CONTENT", 3)
    assert [m.get("content") for m in result["messages"] if m["role"] == "assistant"] == [
        "Found it."
    ]
