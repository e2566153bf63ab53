"""A turn that waited for approval, resumed from the store by a new host, replays to each
real provider as a valid request: the denied call is followed by its result, the denial."""

from __future__ import annotations

import json
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


@tool(needs_approval=True)
async def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    return f"value-{key}"


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch):
    """Dummy keys: nothing here may reach a real server."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-dummy")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


async def deny_from_a_new_host(tmp_path, provider_of: Any, first: bytes, answer: bytes) -> dict:
    """Suspend on ``first``, deny from a new host on the same SQLite file; the body of
    the continuation's model request."""
    db = tmp_path / "s.db"
    ran.clear()
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
            approval_id = waited.pending[0].approval_id
            result = await session.respond(approval_id, approved=False, reason="no")
    assert ran == [] and result.finish_reason == "stop"
    assert len(server.requests) == 2
    return server.requests[1].json()


DENIAL = "the tool call was denied: no"


async def test_openai_chat_gets_the_denied_call_with_its_result(tmp_path):
    sent = await deny_from_a_new_host(
        tmp_path,
        lambda url: OpenAIProvider("m", base_url=url + "/v1", api_key="test"),
        oa_tool_step("", "call_A", "a"),
        oa_answer("ok"),
    )
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == "call_A"
    assert messages[2]["tool_call_id"] == "call_A" and DENIAL in messages[2]["content"]


async def test_anthropic_gets_the_denied_call_with_its_error_result(tmp_path):
    first = anthropic_sse(
        anthropic_start(), *an_tool(0, "toolu_A", "a"), *anthropic_end("tool_use")
    )
    answer = anthropic_sse(anthropic_start(), *an_text(0, "ok"), *anthropic_end("end_turn"))
    sent = await deny_from_a_new_host(
        tmp_path,
        lambda url: AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key="test"),
        first,
        answer,
    )
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][0]["id"] == "toolu_A"
    (block,) = messages[2]["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_A"
    assert block.get("is_error") is True and DENIAL in json.dumps(block["content"])


async def test_openai_responses_gets_the_denied_call_with_its_output(tmp_path):
    first = rs.body(
        rs.created(),
        *rs.call(0, "fc_1", "call_A", '{"key": "a"}'),
        rs.completed(),
    )
    answer = rs.body(rs.created(), *rs.message(0, "msg_1", "ok"), rs.completed())
    sent = await deny_from_a_new_host(
        tmp_path,
        lambda url: OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key="test"),
        first,
        answer,
    )
    items = sent["input"]
    calls = [i for i in items if i.get("type") == "function_call"]
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [c["call_id"] for c in calls] == ["call_A"]
    assert [o["call_id"] for o in outputs] == ["call_A"] and DENIAL in outputs[0]["output"]
