"""Client bodies holding integers past 64 bits (branch ``bigints``): what the user sends
is what the tool's result is, what the stream shows and what the store keeps.

orjson reads ``123456789012345678901234567890`` as ``1.2345678901234568e+29``: an answer
holding it was taken as that float (the user's integer silently changed, stored so and
sent to the model so)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Tool
from runtime.app.web.chat_input import INLINE_BODY
from tests.test_approval_web import answer
from tests.test_web_http import body, events
from tests.web.harness import web_server

BIG = 123456789012345678901234567890

pick = Tool.client("pick", {"type": "object", "properties": {}}, "Ask the user.")


def _posted(sent: dict[str, Any]) -> bytes:
    return json.dumps(sent).encode()  # (the standard library writes the integers exactly)


@pytest.mark.parametrize("size", ["inline", "parsed-in-a-child"])
async def test_a_client_tools_output_past_64_bits_posted_by_use_chat_is_kept_exactly(
    tmp_path: Any, size: str
) -> None:
    """``useChat`` posts the client tool's output ``{"n": BIG, "m": -BIG}``: the user sees
    ``tool-output-available`` with those very integers, and the store keeps them (read
    back). Before: 1.2345678901234568e+29 in both."""
    steps = [[*tool_call("pick", {}, tool_call_id="C")], ["thanks"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[pick])
    async with web_server(agent, store=tmp_path / "s.db") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            part = {
                "type": "tool-pick",
                "toolCallId": "C",
                "state": "output-available",
                "input": {},
                "output": {"n": BIG, "m": -BIG},
            }
            sent = answer("s", first[0]["messageId"], part)
            if size == "parsed-in-a-child":
                sent["messages"][0]["parts"][0]["text"] = "x" * INLINE_BODY
            raw = _posted(sent)
            assert (len(raw) > INLINE_BODY) == (size == "parsed-in-a-child")
            response = await client.post(
                "/api/chat", content=raw, headers={"content-type": "application/json"}
            )
            second = events(response.content)
            record = await server.host.store.load("s")
    assert second[1] == {
        "type": "tool-output-available",
        "toolCallId": "C",
        "output": {"n": BIG, "m": -BIG},
    }
    outputs = [getattr(m, "output", None) for m in record.messages if m.role == "tool"]
    assert outputs == [{"n": BIG, "m": -BIG}]
