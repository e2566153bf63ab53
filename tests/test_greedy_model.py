"""A model that misbehaves at scale within one turn (branch ``greedymodel``, journal
``benchmarks/journal/pipeline.md``): thousands of parallel tool calls in one step, huge
answers, arguments and reasoning blobs, the same call every step, an unknown tool over
and over, a million one-character deltas. Each test is a defect found there, kept as
small as still shows it."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import trio

from actors.providers import anthropic, gemini, openai
from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import INLINE_SAVE_BYTES
from runtime import Agent, Budget, Host, ToolMessage, tool
from runtime.history import repair
from runtime.media import InputLimits
from tests.support.attacks import check_gemini_body
from tests.support.faults import check_anthropic_body, check_history, check_openai_body
from tests.support.grammar import check_grammar
from tests.test_web_http import body, events
from tests.web.harness import web_server

# -- a step of many calls to a sync tool ------------------------------------------------


async def test_sync_tool_calls_hung_past_their_timeout_leave_the_hosts_threads_alone(tmp_path):
    """A sync tool's call abandoned at its timeout keeps its thread, and the thread's
    token, until the function returns. Sync tools drew from Trio's default thread
    limiter, which the SQLite store's long saves (and a model call's name resolution)
    draw from too: a step of as many calls of a hanging sync tool as it has tokens (40;
    2 here) took them for good, and no session of the host could save a long answer
    after it. They have a limiter of their own now."""
    trio.to_thread.current_default_thread_limiter().total_tokens = 2  # this run's
    gate = threading.Event()

    @tool
    def hang(i: int) -> str:
        """Waits for a server that never answers."""
        gate.wait(60)
        return "late"

    calls = [c for i in range(2) for c in tool_call("hang", {"i": i}, tool_call_id=f"c{i}")]
    greedy = ScriptedProvider([calls, ["gave up"]])
    long_answer = "x" * (INLINE_SAVE_BYTES + 1)  # saved in a worker thread
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        try:
            a = await host.open_session(
                Agent(provider=greedy, tools=[hang], budget=Budget(tool_timeout=0.05)),
                session_id="a",
            )
            result = await a.run("go")
            assert result.text == "gave up"
            errors = [m.error for m in a.messages if isinstance(m, ToolMessage)]
            assert errors == ["tool hang timed out after 0.05s"] * 2
            b = await host.open_session(
                Agent(provider=ScriptedProvider([[long_answer]], chunk_size=65536)),
                session_id="b",
            )
            with trio.fail_after(20):  # before: the save gave up, the load waited
                answered = await b.run("hi")
                stored = await host.store.load("b")
            assert answered.text == long_answer
            assert stored.messages[-1].content[0].text == long_answer
        finally:
            gate.set()


# -- a step of more calls than a user's input may have parts -------------------------------


@tool
def lookup(i: int) -> str:
    """Runs without asking."""
    return f"found {i}"


@tool(needs_approval=True)
def erase(path: str) -> str:
    """Asks first."""
    return f"erased {path}"


async def test_a_step_of_more_calls_than_an_inputs_parts_can_still_be_approved_over_http():
    """The AI SDK answers an approval by sending the whole assistant message back, a
    tool part for every call of the step. That message was held to the host's limit on
    a user's input (``max_parts``, 1,000; 3 here): a model that asked for more calls
    in the step of its one call that waits for approval left that call unanswerable,
    every answer refused 413, the turn waiting until it expired."""
    calls = [c for i in range(3) for c in tool_call("lookup", {"i": i}, tool_call_id=f"L{i}")]
    calls += tool_call("erase", {"path": "/x"}, tool_call_id="E")
    agent = Agent(provider=ScriptedProvider([calls, ["done"]]), tools=[lookup, erase])
    async with web_server(agent) as server:
        server.host.input_limits = InputLimits(max_parts=3)
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = next(c for c in first if c != "[DONE]" and c["type"] == "tool-approval-request")
            parts: list[dict[str, Any]] = [{"type": "step-start"}]
            parts += [
                {
                    "type": "tool-lookup",
                    "toolCallId": f"L{i}",
                    "state": "output-available",
                    "input": {"i": i},
                    "output": f"found {i}",
                }
                for i in range(3)
            ]
            parts.append(
                {
                    "type": "tool-erase",
                    "toolCallId": "E",
                    "state": "approval-responded",
                    "input": {"path": "/x"},
                    "approval": {"id": asked["approvalId"], "approved": True},
                }
            )
            sent = body("s")
            message_id = first[0]["messageId"]
            sent["messages"].append({"id": message_id, "role": "assistant", "parts": parts})
            sent["messageId"] = message_id
            answered = await client.post("/api/chat", json=sent)
            assert answered.status_code == 200, answered.text
            second = events(answered.content)
    assert second[1] == {"type": "tool-output-available", "toolCallId": "E", "output": "erased /x"}
    assert (second[-2]["type"], second[-2]["finishReason"]) == ("finish", "stop")


# -- pins: what the room found holding -----------------------------------------------------


async def test_a_step_of_many_calls_over_max_tool_calls_ends_clean_and_replays_everywhere():
    """A pin (it held): one step of 30 calls under ``max_tool_calls=3`` runs 3, refuses
    27 with an error result each, ends ``budget``; the stream keeps its grammar and the
    stored history maps into a valid request of each provider."""
    calls = [c for i in range(30) for c in tool_call("lookup", {"i": i}, tool_call_id=f"c{i}")]
    agent = Agent(
        provider=ScriptedProvider([calls, ["never"]]),
        tools=[lookup],
        budget=Budget(max_tool_calls=3),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
        stored = (await host.store.load("s")).messages
    check_grammar(chunks)
    assert (out.result.finish_reason, out.result.budget) == ("budget", "max_tool_calls")
    results = [m for m in stored if isinstance(m, ToolMessage)]
    assert [m.output for m in results[:3]] == ["found 0", "found 1", "found 2"]
    assert {m.error for m in results[3:]} == {
        "the tool call was not executed: budget max_tool_calls=3 reached"
    }
    assert len(results) == 30
    check_history(stored)
    history = repair(list(stored))
    check_openai_body({"messages": openai.map_messages(None, history)})
    check_anthropic_body({"messages": anthropic.map_messages(None, history)[1]})
    check_gemini_body({"contents": gemini.map_messages(None, history)[1]})
