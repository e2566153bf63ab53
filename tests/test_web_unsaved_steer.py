"""A message steered (busy strategy ``steer``) into a turn of ``serve``'s host whose
save the store refused: the running turn is dropped (its client told ``not_saved``,
``Saving._discard_unsaved``), and the steered message with it. Its client had been
answered 202 ("taken") and was never told. Now a steered message no save of the turn
held is handed back when such a turn ends, as one the turn never took is: it runs as a
turn of its own, on what the store holds, and its client streams that turn (stored,
or told ``not_saved`` by its own stream)."""

from __future__ import annotations

from typing import Any

import httpx
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.unsaved import NOT_SAVED
from runtime.messages import AssistantMessage, UserMessage
from tests.test_busy import Script, hold, holding, look, looking
from tests.test_busy_web import _fresh_gate, held  # noqa: F401 (the gate's fixture)
from tests.test_web_http import body, events
from tests.test_web_unsaved_turns import DownStore
from tests.web.harness import wait_idle, web_server


async def test_a_message_steered_into_a_turn_whose_save_failed_runs_as_its_own_turn():
    store = DownStore()
    script = Script(looking(), holding(), ["answer to both"], ["answer to it"])

    def responder(request: Any) -> list:
        store.down = len(script.requests) < 3  # back for the steered message's own turn
        return script(request)

    agent = Agent(
        provider=ScriptedProvider(responder=responder), tools=[hold, look], on_busy="steer"
    )
    replies: dict[str, Any] = {}
    async with (
        web_server(agent, store=store) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):

        async def post(text: str) -> None:
            replies[text] = await client.post("/api/chat", json=body("s", text))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "first")
            await held["open"].wait()
            nursery.start_soon(post, "also this")
            await trio.testing.wait_all_tasks_blocked(0.05)
            held["release"].set()
        await wait_idle(server, "s")
        record = await store.load("s")
    first = [c for c in events(replies["first"].content) if isinstance(c, dict)]
    assert first[-1]["type"] == "error" and first[-1]["errorText"].startswith(NOT_SAVED)
    steered = replies["also this"]
    assert steered.status_code == 200  # not 202: the turn that took it is not stored
    own = [c for c in events(steered.content) if isinstance(c, dict)]
    assert own[-1]["type"] == "finish"
    assert record is not None
    assert [
        (m.role, m.text) for m in record.messages if isinstance(m, UserMessage | AssistantMessage)
    ] == [("user", "also this"), ("assistant", "answer to it")]
    seen = [m.text for m in script.requests[3].messages if isinstance(m, UserMessage)]
    assert seen == ["also this"]  # its turn ran on what the store holds
