"""What the model is replayed for a call a person approved with edits, with signed
reasoning before the call (docs/approval.md, "Approving with edits"): the assistant turn
exactly as the model returned it (its thinking or reasoning, then the call with the
model's own input) and the edit told in the call's result, each request body built by
the real SDK client against a loopback server; the stored message keeps the edit."""

from __future__ import annotations

import base64
import json
from typing import Any

import attrs

from actors.providers import AnthropicProvider, GeminiProvider, OpenAIProvider
from runtime import Agent, Host, tool
from runtime.history import EDIT_NOTE, iter_turns, replay_edits
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Image,
    TextPart,
    ToolCallPart,
    ToolMessage,
)
from tests import test_provider_gemini as gm
from tests import test_provider_openai_responses as rs
from tests.support.approval_replay import (
    decide_from_a_new_host,
    lookup,
    offline_env,  # noqa: F401 (fixture)
    openai_responses,
    ran,
)
from tests.support.faults import a_end, a_thinking, a_tool_use
from tests.support.loopback import Reply, anthropic_sse, anthropic_start, loopback_server, sse
from tests.test_provider_e2e import an_text, oa_answer, oa_chunk


def anthropic(url: str) -> AnthropicProvider:
    """Extended thinking on: a request with it off leaves the loop's thinking out."""
    return AnthropicProvider(
        "claude-sonnet-4-5", base_url=url, api_key="test", thinking_budget=2048
    )


NOTE_B = EDIT_NOTE.format(input='{"key": "b"}')


def an_thinking_call(signature: str, call_id: str, name: str, key: str) -> bytes:
    return anthropic_sse(
        anthropic_start("claude-sonnet-4-5"),
        *a_thinking(0, "I should look ", "it up.", signature=signature),
        *a_tool_use(1, call_id, name, json.dumps({"key": key})),
        *a_end("tool_use"),
    )


def an_answer() -> bytes:
    return anthropic_sse(anthropic_start("claude-sonnet-4-5"), *an_text(0, "ok"), *a_end())


THOUGHT = {"type": "thinking", "thinking": "I should look it up.", "signature": "sig-1"}


async def test_anthropic_replays_the_signed_turn_as_returned_and_tells_the_edit_in_the_result(
    tmp_path,
):
    first = an_thinking_call("sig-1", "toolu_A", "lookup", "a")
    result, requests = await decide_from_a_new_host(
        tmp_path, anthropic, first, an_answer(), approved=True, edited_input={"key": "b"}
    )
    assert ran == ["b"] and result is not None and result.finish_reason == "stop"
    sent = requests[1].json()
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        THOUGHT,
        {"type": "tool_use", "id": "toolu_A", "name": "lookup", "input": {"key": "a"}},
    ]
    (block,) = messages[2]["content"]
    assert block == {
        "type": "tool_result",
        "tool_use_id": "toolu_A",
        "content": f"{NOTE_B}\n\nvalue-b",
    }


@tool
async def echo(key: str) -> str:
    """Echo a key."""
    return f"echo-{key}"


async def test_anthropic_requests_after_the_edit_only_append_to_the_replayed_turn(tmp_path):
    """The next step's request holds the edited call's turn and result byte for byte as
    the continuation's did: thinking signed after the edit was signed over that prefix."""
    db = tmp_path / "s.db"
    replies = [
        Reply(body=an_thinking_call("sig-1", "toolu_A", "lookup", "a")),
        Reply(body=an_thinking_call("sig-2", "toolu_B", "echo", "c")),
        Reply(body=an_answer()),
    ]
    async with loopback_server(*replies) as server:
        agent = Agent(provider=anthropic(server.url), tools=[lookup, echo])
        async with Host.open(store=db, log_tap=False) as host:
            session = await host.open_session(agent, session_id="s")
            waited = await session.run("go")
            await session.respond(
                waited.pending[0].approval_id, approved=True, edited_input={"key": "b"}
            )
        async with Host.open(store=db, log_tap=False) as host:  # as the store reads it back
            session = await host.open_session(agent, session_id="s")
            call = session.messages[1].content[1]
    continuation, after = (r.json()["messages"] for r in server.requests[1:])
    assert server.requests[1].json()["thinking"]["type"] == "enabled"
    assert after[:3] == continuation
    assert after[3]["content"][0] == {**THOUGHT, "signature": "sig-2"}
    assert (call.input, call.awaiting.original_input) == ({"key": "b"}, {"key": "a"})
    assert call.awaiting.edit_in_result is True


async def test_openai_responses_replays_reasoning_and_the_models_call_and_tells_the_edit(
    tmp_path,
):
    first = rs.body(
        rs.created(),
        *rs.reasoning(0, "rs_1", "plan", enc="gAAA-enc"),
        *rs.call(1, "fc_1", "call_A", '{"key": "a"}'),
        rs.completed(),
    )
    answer = rs.body(rs.created(), *rs.message(0, "msg_1", "ok"), rs.completed())
    result, requests = await decide_from_a_new_host(
        tmp_path, openai_responses, first, answer, approved=True, edited_input={"key": "b"}
    )
    assert ran == ["b"] and result is not None and result.finish_reason == "stop"
    items = requests[1].json()["input"]
    kinds = [i.get("type") for i in items]
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]
    reasoning, call, output = items[-3:]
    assert reasoning["encrypted_content"] == "gAAA-enc"
    assert call["call_id"] == "call_A" and json.loads(call["arguments"]) == {"key": "a"}
    assert output == {
        "type": "function_call_output",
        "call_id": "call_A",
        "output": f"{NOTE_B}\n\nvalue-b",
    }


def reasoning_chat(url: str) -> OpenAIProvider:
    return OpenAIProvider("m", base_url=url + "/v1", api_key="test", send_reasoning_content=True)


async def test_openai_chat_replays_reasoning_content_and_the_models_call_and_tells_the_edit(
    tmp_path,
):
    call_delta = {"index": 0, "id": "call_A", "type": "function"}
    first = sse(
        oa_chunk({"role": "assistant", "reasoning_content": "look it up"}),
        oa_chunk({"tool_calls": [{**call_delta, "function": {"name": "lookup", "arguments": ""}}]}),
        oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"key": "a"}'}}]}),
        oa_chunk({}, "tool_calls"),
    )
    result, requests = await decide_from_a_new_host(
        tmp_path, reasoning_chat, first, oa_answer("ok"), approved=True, edited_input={"key": "b"}
    )
    assert ran == ["b"] and result is not None and result.finish_reason == "stop"
    messages = requests[1].json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["reasoning_content"] == "look it up"
    (call,) = messages[1]["tool_calls"]
    assert call["id"] == "call_A" and json.loads(call["function"]["arguments"]) == {"key": "a"}
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": "call_A",
        "content": f"{NOTE_B}\n\nvalue-b",
    }


# -- the replay itself --------------------------------------------------------------------


def edited(call_id: str = "c1", step: int = 0) -> ToolCallPart:
    wait = Awaiting(
        kind="approval",
        id="w",
        turn_id="t",
        decided=True,
        approved=True,
        original_input={"key": "a"},
        edit_in_result=True,
    )
    return ToolCallPart(
        tool_call_id=call_id, tool_name="lookup", input={"key": "b"}, step=step, awaiting=wait
    )


def result(call_id: str = "c1", step: int = 0, **kw: Any) -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, tool_name="lookup", step=step, **kw)


def test_an_edited_calls_error_is_headed_by_the_note():
    _, (out,) = replay_edits(AssistantMessage(content=(edited(),)), [result(error="boom")])
    assert out.error == f"{NOTE_B}\n\nboom" and out.output is None


def test_an_edited_calls_structured_output_is_written_as_json_after_the_note():
    _, (out,) = replay_edits(AssistantMessage(content=(edited(),)), [result(output={"n": 1})])
    assert out.output == f'{NOTE_B}\n\n{{"n": 1}}'


def test_an_edited_calls_media_output_gets_the_note_as_its_first_text_part():
    image = Image(data=b"\x89PNG\r\n\x1a\n" + b"0" * 16, media_type="image/png")
    _, (out,) = replay_edits(AssistantMessage(content=(edited(),)), [result(output=(image,))])
    assert out.output == (TextPart(text=NOTE_B, step=0), image)


def test_only_the_edited_call_and_its_result_change():
    plain = ToolCallPart(tool_call_id="c2", tool_name="lookup", input={"key": "z"}, step=0)
    msg = AssistantMessage(content=(edited(), plain))
    (_, sent, results), *_ = iter_turns([msg, result(output="x"), result("c2", output="y")])
    assert [p.input for p in sent.content] == [{"key": "a"}, {"key": "z"}]
    assert [r.output for r in results] == [f"{NOTE_B}\n\nx", "y"]
    assert msg.content[0].input == {"key": "b"}  # the stored message is untouched


def test_a_message_without_an_edit_is_handed_over_as_it_is():
    msg = AssistantMessage(content=(attrs.evolve(edited(), awaiting=None),))
    results = [result(output="x")]
    ((_, sent, out),) = iter_turns([msg, *results])
    assert sent is msg and out == results


def gemini(url: str) -> GeminiProvider:
    return GeminiProvider(gm.MODEL, base_url=url, api_key=gm.KEY)


async def test_gemini_replays_the_signed_call_with_the_models_args_and_tells_the_edit(tmp_path):
    """Gemini signs the function call part itself: its signature goes back on the
    model's own ``args``."""
    sig = base64.b64encode(b"signed-call").decode()
    call = {"functionCall": {"name": "lookup", "args": {"key": "a"}}, "thoughtSignature": sig}
    first = gm.inline(gm.candidate([call], "STOP")).body
    answer = gm.inline(gm.candidate([{"text": "ok"}], "STOP")).body
    result, requests = await decide_from_a_new_host(
        tmp_path, gemini, first, answer, approved=True, edited_input={"key": "b"}
    )
    assert ran == ["b"] and result is not None and result.finish_reason == "stop"
    contents = requests[1].json()["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    (sent,) = contents[1]["parts"]
    assert sent["functionCall"]["args"] == {"key": "a"}
    assert sent["thoughtSignature"] == gm.wire(sig)
    (response,) = contents[2]["parts"]
    assert response["functionResponse"] == {
        "name": "lookup",
        "response": {"output": f"{NOTE_B}\n\nvalue-b"},
    }


def test_an_edit_stored_before_the_rule_is_replayed_as_it_was_then():
    """No ``edit_in_result``: the session's requests had the edit as the call's input,
    and later thinking was signed over that; changing it now would invalidate it."""
    old = attrs.evolve(edited(), awaiting=attrs.evolve(edited().awaiting, edit_in_result=False))
    msg = AssistantMessage(content=(old,))
    results = [result(output="value-b")]
    ((_, sent, out),) = iter_turns([msg, *results])
    assert sent is msg and sent.content[0].input == {"key": "b"} and out == results
