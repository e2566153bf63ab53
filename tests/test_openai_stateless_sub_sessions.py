"""A stateless OpenAI-compatible completion (no ``X-Axon-Session``) runs on a scratch
session deleted after its turn. Its agent tools' calls run in sub-sessions of their own
(``<scratch>.<tool>.<call>``): they go with it. Before, each agent-tool call of each
stateless completion left one session in the stateless host's store, for good."""

from __future__ import annotations

from typing import Any

import httpx

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent
from runtime.actor_messages import InferRequest
from tests.test_mcp_server import eventually
from tests.web.harness import web_server

COMPLETIONS = 50
REQUEST = {"model": "boss", "messages": [{"role": "user", "content": "ask the helper"}]}


def _boss_model(request: InferRequest) -> list[Any]:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "what is 2+2?"}, tool_call_id="H")
    return ["the helper says 4"]


def boss() -> Agent:
    helper = Agent(name="helper", provider=ScriptedProvider(steps=[["4"]]))
    return Agent(
        name="boss", provider=ScriptedProvider(responder=_boss_model), tools=[helper.as_tool()]
    )


async def test_fifty_stateless_completions_calling_an_agent_tool_leave_no_session_behind():
    async with (
        web_server(boss(), protocols=("ai-sdk", "openai")) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        first = await client.post("/v1/chat/completions", json=REQUEST)  # opens the host
        scratch = server.app.state.turn_cancellers[0].__self__._host  # the stateless host

        async def count() -> int:
            return len(await scratch.store.list_sessions())

        await eventually(lambda: not scratch.sessions)  # the first one's finally ran
        before = await count()
        answers = [await client.post("/v1/chat/completions", json=REQUEST)]
        for _ in range(COMPLETIONS - 1):
            answers.append(await client.post("/v1/chat/completions", json=REQUEST))

        async def settled() -> bool:
            return not scratch.sessions and await count() == before

        await eventually(settled)
    assert first.status_code == 200, first.text
    assert [a.status_code for a in answers] == [200] * COMPLETIONS
    assert answers[-1].json()["choices"][0]["message"]["content"] == "the helper says 4"
    assert before == 0
