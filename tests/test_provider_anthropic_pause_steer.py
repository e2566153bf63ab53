"""A message steered into a turn (``on_busy="steer"``) while Anthropic's server pauses
its answer (``pause_turn``) waits for the continuation: the paused step is no step
boundary. It went between the paused answer and its continuation, so the continuation
request ended with the user's message, the server tool use in progress was dropped (no
result yet) and the model started over. Real ``AsyncAnthropic`` client, loopback SSE.

The first reply stalls (3 s) so that the message is steered while the paused step runs:
the test waits for the request to arrive and the steered stream to block, then lets it go
on; it asserts what was sent and stored, never a time."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from actors.providers.anthropic import AnthropicProvider
from runtime import Agent, Host
from tests.support.loopback import loopback_server
from tests.test_provider_anthropic_current import KEY, answer
from tests.test_provider_anthropic_pause import MODEL, PAUSED_EVENTS, USE, paused, text_events
from tests.test_steer_attacks import steer_in


async def test_a_message_steered_while_the_server_paused_waits_for_the_continuation():
    search = PAUSED_EVENTS[:6]  # "Let me search." and the search's use, no result yet
    first = attrs.evolve(paused(*search), stall=3.0)
    continued = answer(*text_events(0, "Trio is a library."), model=MODEL)
    french = answer(*text_events(0, "Trio est une bibliothèque."), model=MODEL)
    replies = [first, continued, french]
    asked = trio.Event()

    def respond(_request: Any) -> Any:
        asked.set()
        return replies.pop(0)

    async with loopback_server(respond=respond) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, on_busy="steer"))
            results: dict[str, Any] = {}
            steered: dict[str, Any] = {}

            async def run() -> None:
                results["first"] = await session.run("search trio")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await asked.wait()
                await steer_in(nursery, session, "and in French", steered)
            messages = list(session.messages)
    bodies = [r.json()["messages"] for r in server.requests]
    assert bodies[1] == [  # the continuation: the paused answer last, the use in it
        {"role": "user", "content": "search trio"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me search."}, USE]},
    ]
    assert len(bodies) == 3
    assert bodies[2][-1] == {"role": "user", "content": "and in French"}
    assert results["first"].text.endswith("Trio is a library.")
    out, _ = steered["and in French"]
    assert out.result.text == "Trio est une bibliothèque."
    assert [(m.role, m.text) for m in messages if m.role == "user"] == [
        ("user", "search trio"),
        ("user", "and in French"),
    ]
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
