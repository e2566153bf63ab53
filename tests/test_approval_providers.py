"""A turn that waited for approval, resumed from the store by a new host, replays to each
real provider as a valid request: the denied call is followed by its result, the denial."""

from __future__ import annotations

import json
from typing import Any

from tests.support.approval_replay import (
    anthropic,
    anthropic_steps,
    decide_from_a_new_host,
    offline_env,  # noqa: F401 (fixture)
    openai_chat,
    openai_chat_steps,
    openai_responses,
    openai_responses_steps,
    ran,
)


async def deny_from_a_new_host(tmp_path, provider_of: Any, first: bytes, answer: bytes) -> dict:
    """Suspend on ``first``, deny from a new host on the same SQLite file; the body of
    the continuation's model request."""
    result, requests = await decide_from_a_new_host(
        tmp_path, provider_of, first, answer, approved=False, reason="no"
    )
    assert ran == [] and result.finish_reason == "stop"
    assert len(requests) == 2
    return requests[1].json()


DENIAL = "the tool call was denied: no"


async def test_openai_chat_gets_the_denied_call_with_its_result(tmp_path):
    sent = await deny_from_a_new_host(tmp_path, openai_chat, *openai_chat_steps())
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == "call_A"
    assert messages[2]["tool_call_id"] == "call_A" and DENIAL in messages[2]["content"]


async def test_anthropic_gets_the_denied_call_with_its_error_result(tmp_path):
    sent = await deny_from_a_new_host(tmp_path, anthropic, *anthropic_steps())
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][0]["id"] == "toolu_A"
    (block,) = messages[2]["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_A"
    assert block.get("is_error") is True and DENIAL in json.dumps(block["content"])


async def test_openai_responses_gets_the_denied_call_with_its_output(tmp_path):
    sent = await deny_from_a_new_host(tmp_path, openai_responses, *openai_responses_steps())
    items = sent["input"]
    calls = [i for i in items if i.get("type") == "function_call"]
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [c["call_id"] for c in calls] == ["call_A"]
    assert [o["call_id"] for o in outputs] == ["call_A"] and DENIAL in outputs[0]["output"]
