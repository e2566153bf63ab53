"""A stored approval decided from a new host, against a loopback of a real provider: the
approval tests that check what each provider is replayed after a decision (a denial, an
edited approval) share the tool, the setup and the two hosts here."""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers import AnthropicProvider, OpenAIProvider, OpenAIResponsesProvider
from runtime import Agent, Host, tool
from tests import test_provider_openai_responses as rs
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
)
from tests.test_provider_e2e import an_text, an_tool, oa_answer, oa_tool_step

ran: list[str] = []
"""The keys :func:`lookup` ran for, in order (cleared before each test by
:func:`offline_env`)."""


@tool(needs_approval=True)
async def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    return f"value-{key}"


@pytest.fixture(autouse=True)
def offline_env(monkeypatch):
    """Dummy keys: nothing here may reach a real server. Import it into a test module to
    clear :data:`ran` before each of its tests."""
    ran.clear()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-dummy")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


async def decide_from_a_new_host(
    tmp_path, provider_of: Any, first: bytes, answer: bytes, **decision: Any
) -> tuple[Any, list[Any]]:
    """Suspend on ``first`` (a call of :func:`lookup` with key ``a``), then answer it with
    ``decision`` from a new host on the same SQLite file, the model answering ``answer``;
    the result of ``respond`` and the requests the loopback got."""
    db = tmp_path / "s.db"
    async with loopback_server(Reply(body=first), Reply(body=answer)) as server:
        async with Host.open(store=db, log_tap=False) as host:
            session = await host.open_session(
                Agent(provider=provider_of(server.url), tools=[lookup]), session_id="s"
            )
            waited = await session.run("go")
        async with Host.open(store=db, log_tap=False) as host:
            session = await host.open_session(
                Agent(provider=provider_of(server.url), tools=[lookup]), session_id="s"
            )
            result = await session.respond(waited.pending[0].approval_id, **decision)
    return result, server.requests


# -- each provider, with its first step (a call of lookup with key a) and its answer -------


def openai_chat(url: str) -> OpenAIProvider:
    return OpenAIProvider("m", base_url=url + "/v1", api_key="test")


def openai_chat_steps() -> tuple[bytes, bytes]:
    return oa_tool_step("", "call_A", "a"), oa_answer("ok")


def anthropic(url: str) -> AnthropicProvider:
    return AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key="test")


def anthropic_steps() -> tuple[bytes, bytes]:
    first = anthropic_sse(
        anthropic_start(), *an_tool(0, "toolu_A", "a"), *anthropic_end("tool_use")
    )
    answer = anthropic_sse(anthropic_start(), *an_text(0, "ok"), *anthropic_end("end_turn"))
    return first, answer


def openai_responses(url: str) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key="test")


def openai_responses_steps() -> tuple[bytes, bytes]:
    first = rs.body(rs.created(), *rs.call(0, "fc_1", "call_A", '{"key": "a"}'), rs.completed())
    answer = rs.body(rs.created(), *rs.message(0, "msg_1", "ok"), rs.completed())
    return first, answer
