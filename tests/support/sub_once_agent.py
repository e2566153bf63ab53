"""The agent of ``tests/test_worker_approval_nested_processes.py``: it calls ``helper``,
an agent used as a tool that needs approval. The helper's step 0 calls ``note`` (its
side effect written to the ledger once per idempotency key, every attempt counted:
``AXON_TEST_LEDGER``); its step 1 calls ``hang``, which the first time creates
``AXON_TEST_HANG_FILE`` and waits forever (the test SIGKILLs the worker then), and any
later time returns; step 2 answers ``sub answer``. The calling model then says ``ok``."""

from __future__ import annotations

import os

import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.tools import ToolContext, tool
from tests.support.worker_agent import write_effect


@tool
async def note(ctx: ToolContext) -> str:
    """Write a note down (a side effect)."""
    await trio.to_thread.run_sync(write_effect, os.environ["AXON_TEST_LEDGER"], ctx.idempotency_key)
    return "noted"


@tool
async def hang() -> str:
    """Wait forever the first time (it says so in a file first)."""
    path = trio.Path(os.environ["AXON_TEST_HANG_FILE"])
    if not await path.exists():
        await path.write_text(str(os.getpid()))
        await trio.sleep_forever()
    return "went on"


def _helper(request: InferRequest) -> list:  # type: ignore[type-arg]
    step = current_step(request.messages)
    if step == 0:
        return tool_call("note", {}, tool_call_id="call_note")
    if step == 1:
        return tool_call("hang", {}, tool_call_id="call_hang")
    return ["sub answer"]


def _calls(request: InferRequest) -> list:  # type: ignore[type-arg]
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "do"}, tool_call_id="call_h")
    return ["ok"]


helper = Agent(name="helper", provider=ScriptedProvider(responder=_helper), tools=[note, hang])
agent = Agent(
    name="calls",
    provider=ScriptedProvider(responder=_calls),
    tools=[helper.as_tool(needs_approval=True)],
)
