"""The agent of ``tests/test_serve_sigkill_step.py``: a turn whose first step is
committed before its second hangs, so a test can SIGKILL ``serve`` between the two.

Step 0 says ``looking`` and calls ``note`` (quick); step 1 says ``still going`` and calls
``hang``, which creates the file ``AXON_TEST_HANG_FILE`` and then waits forever; step 2
would answer ``finished``. Any other input than ``go`` is answered ``answered <input>``.
"""

from __future__ import annotations

import os

import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.messages import UserMessage
from runtime.tools import tool


@tool
async def note(text: str) -> str:
    """Write a note down."""
    return f"noted {text}"


@tool
async def hang() -> str:
    """Never end (it says so in a file first)."""
    await trio.Path(os.environ["AXON_TEST_HANG_FILE"]).write_text(str(os.getpid()))
    await trio.sleep_forever()
    return "unreachable"  # pragma: no cover


def respond(request: InferRequest) -> list:  # type: ignore[type-arg]
    last = [m for m in request.messages if isinstance(m, UserMessage)][-1]
    if last.content != "go":
        return [f"answered {last.content}"]
    step = current_step(request.messages)
    if step == 0:
        return ["looking ", *tool_call("note", {"text": "a"}, tool_call_id="call_note")]
    if step == 1:
        return ["still going ", *tool_call("hang", {}, tool_call_id="call_hang")]
    return ["finished"]


agent = Agent(
    name="killed-step",
    provider=ScriptedProvider(responder=respond),
    instructions="test",
    tools=[note, hang],
)
