"""The process the crash-safety test kills: multi-step turns on an SQLite store, forever.

``python -m tests.support.crash_child STORE SESSION`` opens a host on the SQLite file
``STORE``, resumes session ``SESSION``, prints ``ready`` and then runs turns until it is
killed. Every turn has three steps (reasoning, text and a tool call; again; a final
answer) with real-time pauses between chunks, so a SIGKILL at a random moment lands
mid-stream, mid-tool or mid-write.
"""

from __future__ import annotations

import sys

import trio

from actors.providers.scripted import ScriptedProvider, Sleep, current_step, tool_call
from runtime import Agent, Host, ReasoningChunk, UserMessage, tool

PAUSE = 0.015


@tool
async def note(text: str) -> str:
    """Write a note down."""
    await trio.sleep(PAUSE)
    return f"noted {text}"


def respond(request):
    step = current_step(request.messages)
    turn = sum(1 for m in request.messages if isinstance(m, UserMessage))
    if step < 2:
        return [
            ReasoningChunk(text=f"thinking about {turn}.{step}", provider="scripted"),
            Sleep(PAUSE),
            f"step {step} of turn {turn}",
            Sleep(PAUSE),
            *tool_call("note", {"text": f"{turn}.{step}"}, tool_call_id=f"call_{turn}_{step}"),
            Sleep(PAUSE),
        ]
    return [Sleep(PAUSE), f"turn {turn} is done", Sleep(PAUSE)]


AGENT = Agent(name="crashy", provider=ScriptedProvider(responder=respond), tools=[note])


async def main(path: str, session_id: str) -> None:
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(AGENT, session_id=session_id)
        print("ready", flush=True)
        while True:
            await session.run(f"input {len(session.messages)}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
