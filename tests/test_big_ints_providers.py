"""A model's tool call holding an integer past 64 bits, through each provider's real SDK
client from a loopback server (branch ``bigints``): the tool gets the model's very
integer, the session stores it (SQLite, read back), and the next request replays the
call and its result with the same integers.

orjson reads ``123456789012345678901234567890`` as ``1.2345678901234568e+29``, which
pydantic's ``int`` parameter takes, silently, as the wrong integer
123456789012345677877719597056; and it writes no integer past 64 bits. Before: the
OpenAI, Responses and Anthropic readers parsed the arguments exactly, and the call was
then refused ("its input cannot be stored ...; send such a value as a string"); Gemini's
reader (orjson, on the whole chunk) gave the tool the wrong integer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from actors.providers import (
    AnthropicProvider,
    GeminiProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
)
from runtime import Agent, Host, tool
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
    responses_sse,
    sse,
)
from tests.test_provider_e2e import gm_body, gm_chunk, oa_answer, oa_chunk, oa_usage

BIG = 123456789012345678901234567890
ARGS = f'{{"n": {BIG}, "list": [{-BIG}, 1]}}'
INPUT = {"n": BIG, "list": [-BIG, 1]}
OUTPUT = {"n": BIG, "twice": 2 * BIG}
ran: list[Any] = []


@tool
async def double(n: int, list: list[int]) -> dict:
    """Doubles n."""
    ran.append((n, list))
    return {"n": n, "twice": 2 * n}


def _openai() -> tuple[Any, list[bytes], Callable[[Any], tuple[Any, Any]]]:
    call = {"index": 0, "id": "call_A", "type": "function"}
    step = sse(
        oa_chunk({"tool_calls": [{**call, "function": {"name": "double", "arguments": ARGS}}]}),
        oa_chunk({}, "tool_calls"),
        oa_usage(),
    )

    def replayed(body: Any) -> tuple[Any, Any]:
        sent_call, sent_result = body["messages"][1], body["messages"][2]
        args = sent_call["tool_calls"][0]["function"]["arguments"]
        return json.loads(args), json.loads(sent_result["content"])

    return (
        (lambda url: OpenAIProvider("m", base_url=url + "/v1", api_key="t")),
        [
            step,
            oa_answer("ok"),
        ],
        replayed,
    )


def _responses() -> tuple[Any, list[bytes], Callable[[Any], tuple[Any, Any]]]:
    head = {"id": "fc_1", "type": "function_call", "call_id": "call_A", "name": "double"}
    events = [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**head, "arguments": ""},
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 0,
            "delta": ARGS,
        },
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**head, "arguments": ARGS, "status": "completed"},
        },
    ]
    text = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed"}
    answer = [
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**text, "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        }
    ]

    def replayed(body: Any) -> tuple[Any, Any]:
        items = {item.get("type"): item for item in body["input"]}
        call, result = items["function_call"], items["function_call_output"]
        return json.loads(call["arguments"]), json.loads(result["output"])

    return (
        (lambda url: OpenAIResponsesProvider("m", base_url=url + "/v1", api_key="t")),
        [
            responses_sse("m", 1, events),
            responses_sse("m", 2, answer),
        ],
        replayed,
    )


def _responses_object() -> tuple[Any, list[bytes], Callable[[Any], tuple[Any, Any]]]:
    """Responses from a server that sends a call's ``arguments`` as a JSON object, not
    the text holding it (branch ``exactints2``: orjson read the event, so the tool got the
    float's integer 123456789012345677877719597056)."""
    make, bodies, replayed = _responses()
    head = {"id": "fc_1", "type": "function_call", "call_id": "call_A", "name": "double"}
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**head}},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**head, "arguments": INPUT, "status": "completed"},
        },
    ]
    return make, [responses_sse("m", 1, events), bodies[1]], replayed


def _anthropic() -> tuple[Any, list[bytes], Callable[[Any], tuple[Any, Any]]]:
    start = {"type": "tool_use", "id": "toolu_A", "name": "double", "input": {}}
    step = anthropic_sse(
        anthropic_start(),
        {"type": "content_block_start", "index": 0, "content_block": start},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": ARGS},
        },
        {"type": "content_block_stop", "index": 0},
        *anthropic_end("tool_use"),
    )
    text = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    answer = anthropic_sse(
        anthropic_start(),
        text,
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        *anthropic_end("end_turn"),
    )

    def replayed(body: Any) -> tuple[Any, Any]:
        [use] = [b for b in body["messages"][1]["content"] if b["type"] == "tool_use"]
        [result] = [b for b in body["messages"][2]["content"] if b["type"] == "tool_result"]
        content = result["content"]
        text = content if isinstance(content, str) else content[0]["text"]
        return use["input"], json.loads(text)

    return (lambda url: AnthropicProvider("m", base_url=url, api_key="t")), [step, answer], replayed


def _gemini() -> tuple[Any, list[bytes], Callable[[Any], tuple[Any, Any]]]:
    # (written by hand: json.dumps would write the integers exactly too, as a compatible
    # server does; the API itself holds args as a protobuf Struct, whose numbers are
    # doubles)
    chunk = json.dumps(gm_chunk([{"functionCall": {"name": "double", "args": {}}}], "STOP"))
    chunk = chunk.replace('"args": {}', '"args": ' + ARGS)
    step = f"data: {chunk}\r\n\r\n".encode()
    answer = gm_body(gm_chunk([{"text": "ok"}]), gm_chunk([{"text": ""}], "STOP"))

    def replayed(body: Any) -> tuple[Any, Any]:
        [call] = [p["functionCall"] for p in body["contents"][1]["parts"] if "functionCall" in p]
        [result] = [p["functionResponse"] for p in body["contents"][2]["parts"]]
        return call["args"], result["response"]["output"]

    return (
        (lambda url: GeminiProvider("gemini-2.5-flash", base_url=url, api_key="t")),
        [
            step,
            answer,
        ],
        replayed,
    )


@pytest.mark.parametrize(
    "wire",
    [_openai, _responses, _responses_object, _anthropic, _gemini],
    ids=lambda w: w.__name__[1:],
)
async def test_a_models_integer_past_64_bits_reaches_the_tool_the_store_and_the_next_request(
    tmp_path: Any, wire: Any
) -> None:
    """The user sees the tool run with n = 123456789012345678901234567890 and its result
    ``{"n": ..., "twice": ...}`` exact; the store keeps the call's input and the result
    as integers; the next request sends both back as they were."""
    ran.clear()
    make, bodies, replayed = wire()
    path = tmp_path / "s.db"
    async with loopback_server(*(Reply(body=b) for b in bodies)) as server:
        provider = make(server.url)
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(
                Agent(provider=provider, tools=[double]), session_id="s"
            )
            result = await session.run("go")
        if hasattr(provider, "aclose"):
            await provider.aclose()
    async with Host.open(store=path, log_tap=False) as host:
        stored = (await host.store.load("s")).messages
    assert (result.finish_reason, result.error, result.text) == ("stop", None, "ok")
    assert ran == [(BIG, [-BIG, 1])]
    assert all(type(v) is int for v in ran[0][1])
    [call] = [p for m in stored if isinstance(m, AssistantMessage) for p in m.content
              if isinstance(p, ToolCallPart)]  # fmt: skip
    [tool_result] = [m for m in stored if isinstance(m, ToolMessage)]
    assert (call.input, tool_result.output, tool_result.error) == (INPUT, OUTPUT, None)
    sent_input, sent_output = replayed(json.loads(server.requests[1].body))
    assert (sent_input, sent_output) == (INPUT, OUTPUT)
