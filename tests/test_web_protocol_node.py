"""The endpoint's stream, parsed by the real `ai` npm package (what `useChat` runs).

tests/web/read_stream.mjs sends the request with the package's ``DefaultChatTransport``
(the ``useChat`` request body), which validates every chunk against
``uiMessageChunkSchema``, and builds the UI message with ``readUIMessageStream``. The
package is installed from the npm registry into tests/web on first use; without Node.js,
npm or the registry the test skips.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, ProviderError, ReasoningChunk, RetryPolicy, tool
from tests.web.harness import ensure_ai_package, run_read_stream, web_server


@tool
async def lookup(key: str) -> dict[str, Any]:
    """Look a key up."""
    return {"key": key, "value": f"value of {key}"}


@tool
async def broken(key: str) -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


TWO_TOOL_STEPS = [
    [
        ReasoningChunk(text="The user wants a and b. I will look up a first."),
        "Let me look up a. ",
        *tool_call("lookup", {"key": "a"}, tool_call_id="call_a"),
    ],
    [
        ReasoningChunk(text="Now b."),
        *tool_call("lookup", {"key": "b"}, tool_call_id="call_b"),
    ],
    ["a is value of a and b is value of b."],
]

AGENTS = {
    "tools": lambda: Agent(name="tools", provider=ScriptedProvider(TWO_TOOL_STEPS), tools=[lookup]),
    "toolerr": lambda: Agent(
        name="toolerr",
        provider=ScriptedProvider(
            [[*tool_call("broken", {"key": "x"}, tool_call_id="call_x")], ["It failed."]]
        ),
        tools=[broken],
    ),
    "sub": lambda: Agent(
        name="sub",
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "sub task"}, tool_call_id="call_h")], ["Done."]]
        ),
        tools=[
            Agent(
                name="helper", provider=ScriptedProvider([["The child agent answers."]])
            ).as_tool()
        ],
    ),
    "fail": lambda: Agent(
        name="fail",
        provider=ScriptedProvider([["Partial answer", ProviderError("upstream exploded")]]),
        retry=RetryPolicy(max_attempts=1),
    ),
}


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


async def read_with_ai_package(node: str, url: str, requests: list[dict[str, str]]) -> list[Any]:
    return await run_read_stream(node, {"url": url, "token": "tok", "requests": requests})


async def test_the_ai_package_reads_a_turn_with_reasoning_two_tool_steps_and_an_answer(node):
    def factory(session_id: str) -> Agent:
        return AGENTS[session_id.split("-")[0]]()

    async with web_server(factory, token="tok") as server:
        results = await read_with_ai_package(
            node,
            server.url,
            [
                {"chatId": "tools-1", "text": "What are a and b?"},
                {"chatId": "toolerr-1", "text": "Try x"},
                {"chatId": "sub-1", "text": "Delegate"},
                {"chatId": "fail-1", "text": "Go"},
            ],
        )
    tools, toolerr, sub, fail = results

    # -- reasoning, two tool steps, an answer ---------------------------------------------
    assert tools["error"] is None, tools["error"]
    assert tools["status"] == 200
    assert tools["headers"]["x-vercel-ai-ui-message-stream"] == "v1"
    assert tools["headers"]["content-type"].startswith("text/event-stream")
    assert tools["requestBody"]["id"] == "tools-1"
    assert tools["requestBody"]["trigger"] == "submit-message"
    chunk_types = tools["chunks"]
    assert chunk_types[0] == "start" and chunk_types[-1] == "finish"
    assert chunk_types.count("start-step") == chunk_types.count("finish-step") == 3

    message = tools["message"]
    assert message["role"] == "assistant"
    assert message["id"].startswith("msg_")
    parts = message["parts"]
    assert [p["type"] for p in parts] == [
        "step-start",
        "reasoning",
        "text",
        "tool-lookup",
        "step-start",
        "reasoning",
        "tool-lookup",
        "step-start",
        "text",
    ]
    assert parts[1]["text"] == "The user wants a and b. I will look up a first."
    assert parts[1]["state"] == "done"
    assert parts[5]["text"] == "Now b."
    assert parts[2] == {"type": "text", "text": "Let me look up a. ", "state": "done"}
    for part, key in [(parts[3], "a"), (parts[6], "b")]:
        assert part["toolCallId"] == f"call_{key}"
        assert part["state"] == "output-available"
        assert part["input"] == {"key": key}
        assert part["output"] == {"key": key, "value": f"value of {key}"}
    assert parts[8]["text"] == "a is value of a and b is value of b."
    # the stored session passes the package's validateUIMessages, same parts
    stored = tools["stored"]
    assert tools.get("storedError") is None, tools.get("storedError")
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["id"] == message["id"]
    assert [p["type"] for p in stored[1]["parts"]] == [p["type"] for p in parts]
    assert [p.get("output") for p in stored[1]["parts"]] == [p.get("output") for p in parts]

    # -- a failing tool: output-error ---------------------------------------------------------
    assert toolerr["error"] is None, toolerr["error"]
    (tool_part,) = [p for p in toolerr["message"]["parts"] if p["type"] == "tool-broken"]
    assert tool_part["state"] == "output-error"
    assert "disk on fire" in tool_part["errorText"]
    assert toolerr.get("storedError") is None, toolerr.get("storedError")

    # -- an agent as a tool: preliminary outputs, then the final one ---------------------------
    assert sub["error"] is None, sub["error"]
    assert sub["chunks"].count("tool-output-available") > 2
    (helper,) = [p for p in sub["message"]["parts"] if p["type"] == "tool-helper"]
    assert helper["state"] == "output-available"
    assert helper["output"] == "The child agent answers."
    assert not helper.get("preliminary")

    # -- a failing model call: the package surfaces the error text -----------------------------
    assert fail["error"] is not None and "upstream exploded" in fail["error"]
    assert "error" in fail["chunks"]
    assert fail["message"]["parts"][-1]["text"] == "Partial answer"


REDACTED_THEN_THINKING = [
    [
        ReasoningChunk(text="", redacted_data="b3BhcXVl", provider="anthropic"),
        ReasoningChunk(text="Then plain thinking."),
        "The answer.",
    ]
]


async def test_a_reloaded_session_has_the_reasoning_parts_the_stream_built(node):
    # AI SDK 7 keeps a reasoning part's stream id on the part; a redacted block streams a
    # start and an end with no text, and is a part (with no text) of the built message
    agents = {
        "tools": AGENTS["tools"],
        "redacted": lambda: Agent(name="r", provider=ScriptedProvider(REDACTED_THEN_THINKING)),
    }
    async with web_server(lambda sid: agents[sid.split("-")[0]](), token="tok") as server:
        results = await read_with_ai_package(
            node,
            server.url,
            [
                {"chatId": "tools-1", "text": "What are a and b?"},
                {"chatId": "redacted-1", "text": "Hm"},
            ],
        )
    for result in results:
        assert result["error"] is None and result.get("storedError") is None, result
        built = [p for p in result["message"]["parts"] if p["type"] == "reasoning"]
        stored = [p for p in result["stored"][-1]["parts"] if p["type"] == "reasoning"]
        assert len(built) == 2 and all(p.get("id") for p in built)
        assert stored == built


async def test_every_mapped_chunk_passes_the_ai_package_chunk_schema(node):
    from runtime.app.web.ui_stream import DONE, UIStreamEncoder, sse
    from tests.test_web_protocol import CASES

    encoder = UIStreamEncoder()
    sent = [ui for chunk, _ in CASES for ui in encoder.encode(chunk)]
    body = b"".join(sse(ui) for ui in sent) + b": keep-alive\n\n" + DONE
    parsed = await run_read_stream(node, {"sse": body.decode()})
    assert [p.get("error") for p in parsed] == [None] * len(sent)
    assert [p["value"] for p in parsed] == sent
    assert {ui["type"] for ui in sent} >= {"abort", "error", "finish", "tool-output-error"}


async def test_the_ai_package_reads_a_steered_message_as_transient_data(node):
    """A ``data-steered`` chunk between two steps passes the chunk schema, and
    ``readUIMessageStream`` builds the assistant message around it: the steered text is
    no part of it (the stored session has it as a user message of its own)."""
    from runtime import output as o
    from runtime.app.web.ui_stream import DONE, UIStreamEncoder, sse
    from runtime.chunks import Usage

    u = Usage()
    chunks = [
        o.Start(message_id="msg_1"),
        o.StepStart(step=0),
        o.TextStart(step=0, part_id="t0"),
        o.TextDelta(step=0, part_id="t0", text="looking"),
        o.TextFinish(step=0, part_id="t0"),
        o.StepFinish(step=0, finish_reason="stop", usage=u),
        o.Steered(step=1, message_id="u2", text="also this"),
        o.StepStart(step=1),
        o.TextStart(step=1, part_id="t1"),
        o.TextDelta(step=1, part_id="t1", text="answer to both"),
        o.TextFinish(step=1, part_id="t1"),
        o.StepFinish(step=1, finish_reason="stop", usage=u),
        o.Finish(finish_reason="stop", usage=u),
    ]
    encoder = UIStreamEncoder()
    sent = [ui for chunk in chunks for ui in encoder.encode(chunk)]
    body = b"".join(sse(ui) for ui in sent) + DONE
    out = await run_read_stream(node, {"sse": body.decode(), "read": True})
    assert [p.get("error") for p in out["parsed"]] == [None] * len(sent)
    (steered,) = [p["value"] for p in out["parsed"] if p["value"]["type"] == "data-steered"]
    assert steered["data"] == {"messageId": "u2", "text": "also this", "step": 1}
    assert out["error"] is None
    parts = out["message"]["parts"]
    assert [p["type"] for p in parts] == ["step-start", "text", "step-start", "text"]
    assert parts[3]["text"] == "answer to both"


async def test_the_ai_package_reads_a_sub_agents_throttled_and_budget_wait_as_transient_data(
    node,
):
    """A sub-agent's ``throttled`` nested in its call's ``tool-stream`` was dropped (only
    its ``budget-wait`` was shown): both now come as transient data naming the top call,
    which pass the chunk schema and leave the call's part (its preliminary output) as
    it was."""
    from runtime import output as o
    from runtime.app.web.ui_stream import DONE, UIStreamEncoder, sse
    from runtime.chunks import Usage

    u = Usage()

    def nested(chunk: Any) -> o.ToolStream:
        deep = o.ToolStream(step=0, tool_call_id="deep", tool_name="inner", chunk=chunk)
        return o.ToolStream(step=0, tool_call_id="call_h", tool_name="helper", chunk=deep)

    chunks = [
        o.Start(message_id="msg_1"),
        o.StepStart(step=0),
        o.ToolCall(step=0, tool_call_id="call_h", tool_name="helper", input={"input": "x"}),
        o.ToolStream(
            step=0,
            tool_call_id="call_h",
            tool_name="helper",
            chunk=o.TextDelta(step=0, part_id="s", text="so far"),
        ),
        nested(o.Throttled(step=0, wait=2.5, reason="requests")),
        nested(o.BudgetWait(step=0, want=90, available=10, held=80, ahead=1)),
        o.ToolResult(step=0, tool_call_id="call_h", tool_name="helper", output="so far, done"),
        o.StepFinish(step=0, finish_reason="tool-calls", usage=u),
        o.Finish(finish_reason="stop", usage=u),
    ]
    encoder = UIStreamEncoder()
    sent = [ui for chunk in chunks for ui in encoder.encode(chunk)]
    body = b"".join(sse(ui) for ui in sent) + DONE
    out = await run_read_stream(node, {"sse": body.decode(), "read": True})
    assert [p.get("error") for p in out["parsed"]] == [None] * len(sent)
    data = [p["value"] for p in out["parsed"] if p["value"]["type"].startswith("data-")]
    assert [(d["type"], d["data"]["toolCallId"], d["transient"]) for d in data] == [
        ("data-throttled", "call_h", True),  # (dropped before: budget-wait alone)
        ("data-budget-wait", "call_h", True),
    ]
    assert data[0]["data"] == {"wait": 2.5, "reason": "requests", "toolCallId": "call_h"}
    assert out["error"] is None
    (part,) = [p for p in out["message"]["parts"] if p["type"].startswith("tool-")]
    assert (part["state"], part["output"]) == ("output-available", "so far, done")
    assert not [p for p in out["message"]["parts"] if p["type"].startswith("data-")]
