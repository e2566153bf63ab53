"""A model that misbehaves at scale within one turn (branch ``greedymodel``, journal
``benchmarks/journal/pipeline.md``): thousands of parallel tool calls in one step, huge
answers, arguments and reasoning blobs, the same call every step, an unknown tool over
and over, a million one-character deltas. Each test is a defect found there, kept as
small as still shows it."""

from __future__ import annotations

import threading

import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import INLINE_SAVE_BYTES
from runtime import Agent, Budget, Host, ToolMessage, tool

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
                Agent(provider=ScriptedProvider([long_answer], chunk_size=65536)),
                session_id="b",
            )
            with trio.fail_after(20):  # before: the save gave up, the load waited
                answered = await b.run("hi")
                stored = await host.store.load("b")
            assert answered.text == long_answer
            assert stored.messages[-1].content[0].text == long_answer
        finally:
            gate.set()
