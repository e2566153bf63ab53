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
from runtime import Agent, Tool, tool
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


# -- AG-UI -----------------------------------------------------------------------------------


async def test_an_agui_client_output_past_64_bits_as_json_text_is_kept_exactly() -> None:
    """AG-UI carries a client tool's output as text; the tool's output schema wants an
    object, so the text ``{"n": BIG}`` is read as JSON: the model reads ``{"n": BIG}``
    (and the store keeps it). Before: ``{"n": 1.2345678901234568e+29}``, which the
    schema's ``integer`` took (an integral float)."""
    from tests.test_agui_client_output import answered, seen

    seen.clear()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = await answered(schema, '{"n": %d}' % BIG)  # noqa: UP031
    assert r.status_code == 200, r.text
    assert seen == [{"n": BIG}] and type(seen[0]["n"]) is int


ran: list[int] = []


@tool(needs_approval=True)
async def transfer(amount: int) -> str:
    """Moves money."""
    ran.append(amount)
    return f"moved {amount}"


async def test_an_agui_edit_past_64_bits_runs_the_tool_with_the_very_integer() -> None:
    """The person approves with ``editedArgs: {"amount": BIG}`` (a resume payload, JSON
    in the body): the tool runs with BIG, the user sees ``moved BIG`` and the store
    keeps the edited input exactly. Before: the tool ran with
    123456789012345677877719597056 (pydantic's ``int`` of the float orjson read)."""
    from tests.test_agui import run, run_input, user
    from tests.test_agui_edits import waiting_call

    ran.clear()
    steps = [[*tool_call("transfer", {"amount": 1}, tool_call_id="d1")], ["sent"]]
    agent = Agent(name="payer", provider=ScriptedProvider(steps), tools=[transfer])
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("pay", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        resume = [
            {
                "interruptId": interrupt["id"],
                "status": "resolved",
                "payload": {"approved": True, "editedArgs": {"amount": BIG}},
            }
        ]
        second = await run(server, run_input("t", user("pay", "m1"), resume=resume, runId="r2"))
        record = await server.host.store.load("t")
    assert ran == [BIG]
    (result,) = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == f"moved {BIG}"
    assert waiting_call(record).input == {"amount": BIG}


# -- the OpenAI-compatible endpoint ----------------------------------------------------------


async def test_a_chat_completions_history_call_past_64_bits_reaches_the_model_exactly() -> None:
    """A Chat Completions client sends a history whose assistant call's ``arguments``
    text is ``{"n": BIG}``: the agent's model reads that call's input as ``{"n": BIG}``
    (and answers). Before: ``{"n": 1.2345678901234568e+29}`` (orjson)."""
    from tests.test_openai_compat import BOTH, openai_client

    provider = ScriptedProvider(["ok"])
    async with web_server(Agent(name="geo", provider=provider), protocols=BOTH) as server:
        async with openai_client(server) as c:
            completion = await c.chat.completions.create(
                model="geo",
                messages=[
                    {"role": "user", "content": "count"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "count", "arguments": f'{{"n": {BIG}}}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "done"},
                    {"role": "user", "content": "so?"},
                ],
            )
    assert completion.choices[0].message.content == "ok"
    sent = provider.requests[0].messages
    [call] = [p for m in sent if m.role == "assistant" for p in m.content]
    assert call.input == {"n": BIG} and type(call.input["n"]) is int


# -- A2A ---------------------------------------------------------------------------------------


async def test_an_a2a_data_part_past_64_bits_reaches_the_model_exactly() -> None:
    """An A2A client sends a message with the data part ``{"n": BIG}``: the agent's model
    reads its JSON text with BIG's digits. Before: ``{"n":1.2345678901234568e+29}``."""
    provider = ScriptedProvider(["ok"])
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": {"n": BIG}}]}
    async with web_server(Agent(name="a", provider=provider), protocols=("a2a",)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            r = await http.post(
                "/a2a/message:send",
                content=_posted({"message": message}),
                headers={"content-type": "application/json", "a2a-version": "1.0"},
            )
    assert r.status_code == 200, r.text
    [user_message] = [m for m in provider.requests[0].messages if m.role == "user"]
    texts = (
        [user_message.content]
        if isinstance(user_message.content, str)
        else [p.text for p in user_message.content]
    )
    assert any(json.loads(t) == {"n": BIG} for t in texts if t.startswith("{")), texts
