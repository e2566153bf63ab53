"""The OpenAI Responses API provider, end to end through the real ``openai`` client.

Stream tests serve SSE bodies from the loopback server (``tests.support.loopback``) to
``AsyncOpenAI.responses.create(stream=True)`` exactly as production does: no SDK mocks.
Bodies come from ``tests/recordings/openai-responses`` (provenance in its README) or are
built inline with :func:`body` in the same wire format. Turns through the ``Host`` assert
the exact ``input`` of the second and third requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers import AnthropicProvider, OpenAIProvider, OpenAIResponsesProvider, registry
from actors.providers.openai_responses import (
    ENCRYPTED_REASONING,
    PROVIDER,
    classify_error,
    decode_reasoning,
    encode_reasoning,
    map_finish_reason,
    map_messages,
    map_tools,
    parse_stream,
)
from runtime import Agent, Host, tool
from runtime.actor_messages import InferRequest, StreamFailed
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.errors import (
    AuthenticationFailed,
    BadRequest,
    ConnectionLost,
    MalformedStream,
    ProviderUnavailable,
    RateLimited,
)
from runtime.messages import (
    AssistantMessage,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.provider import ProviderOptions
from tests.support import provider_calls, wire_rules
from tests.support.grammar import check_grammar
from tests.support.loopback import Reply, anthropic_sse, loopback_server, sse
from tests.support.provider_calls import Call, call_with, cli_turn

REPO = Path(__file__).resolve().parents[1]
RECORDINGS = Path(__file__).resolve().parent / "recordings" / "openai-responses"
API_KEY = "sk-test-not-a-real-key-4243"
ENC = "gAAAAABoZ0-encrypted-"


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch):
    """A dummy key and no ambient configuration: nothing here may reach a real server."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-dummy")
    for var in ("OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(var, raising=False)


def recording(name: str) -> bytes:
    return (RECORDINGS / name).read_bytes()


# -- inline bodies in the recordings' wire format ---------------------------------------------


def body(*events: dict[str, Any]) -> bytes:
    """``event: <type>`` + ``data: <json>`` per event, numbered, no ``[DONE]``."""
    out = []
    for n, event in enumerate(events):
        data = {**event, "sequence_number": n}
        out.append(f"event: {event['type']}\ndata: {json.dumps(data)}\n\n")
    return "".join(out).encode()


def response(status: str = "in_progress", **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_inline",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "gpt-5-mini",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        **extra,
    }


def created() -> dict[str, Any]:
    return {"type": "response.created", "response": response()}


def completed(inp: int = 10, out: int = 5, status: str = "completed", **extra: Any) -> dict:
    usage = {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }
    return {"type": f"response.{status}", "response": response(status, usage=usage, **extra)}


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def reasoning(index: int, item_id: str, summary: str = "", enc: str | None = None) -> list[dict]:
    head = {"id": item_id, "type": "reasoning", "summary": []}
    events = [added(index, head)]
    if summary:
        events.append(
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": item_id,
                "output_index": index,
                "summary_index": 0,
                "delta": summary,
            }
        )
    final = {**head, "summary": [{"type": "summary_text", "text": summary}] if summary else []}
    final["encrypted_content"] = enc if enc is not None else ENC + item_id
    return [*events, done(index, final)]


def message(index: int, item_id: str, text: str) -> list[dict]:
    head = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress"}
    part = {"type": "output_text", "text": text, "annotations": []}
    delta = {
        "type": "response.output_text.delta",
        "item_id": item_id,
        "output_index": index,
        "content_index": 0,
        "delta": text,
        "logprobs": [],
    }
    return [
        added(index, {**head, "content": []}),
        delta,
        done(index, {**head, "status": "completed", "content": [part]}),
    ]


def call(index: int, item_id: str, call_id: str, arguments: str, name: str = "lookup") -> list:
    head = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
    delta = {
        "type": "response.function_call_arguments.delta",
        "item_id": item_id,
        "output_index": index,
        "delta": arguments,
    }
    return [
        added(index, {**head, "arguments": ""}),
        delta,
        done(index, {**head, "arguments": arguments, "status": "completed"}),
    ]


# -- one provider call -------------------------------------------------------------------------


def make_request(messages=None, *, instructions=None, tools=(), settings=None) -> InferRequest:
    return provider_calls.make_request(
        tuple(messages or (UserMessage(content="hi"),)),
        tools=tuple(tools),
        instructions=instructions,
        settings=settings,
        turn_id="t1",
    )


Run = Call


async def run(*replies: Reply, request: InferRequest | None = None, **options: Any) -> Run:
    """Serve ``replies`` and make one ``provider.stream`` call against them."""
    return await call_with(
        lambda url: OpenAIResponsesProvider(
            "gpt-5-mini", base_url=url + "/v1", api_key=API_KEY, **options
        ),
        *replies,
        request=request or make_request(),
    )


async def replay(name: str, **reply: Any) -> Run:
    return await run(Reply(body=recording(name), **reply))


def json_reply(status: int, error: dict[str, Any], headers=()) -> Reply:
    return Reply(
        status=status,
        body=json.dumps({"error": error}).encode(),
        content_type="application/json",
        headers=headers,
    )


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-{key}"


# -- module and configuration --------------------------------------------------------------


def test_importing_the_module_does_not_import_the_sdk():
    code = (
        "import sys, actors.providers\n"
        "actors.providers.OpenAIResponsesProvider('gpt-5-mini')\n"
        "bad = [m for m in ('openai', 'httpx2') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_the_registry_builds_it_with_its_default_model_and_options():
    options = ProviderOptions(base_url="http://127.0.0.1:9/v1", api_key=API_KEY)
    provider = registry.create_provider("openai-responses", options)
    assert isinstance(provider, OpenAIResponsesProvider)
    assert (provider.model, provider.base_url) == ("gpt-5-mini", "http://127.0.0.1:9/v1")
    assert provider.provider_name == PROVIDER == "openai-responses"


def test_describe_shows_the_storage_settings_and_never_the_key():
    provider = OpenAIResponsesProvider("o4-mini", api_key=API_KEY, reasoning={"effort": "low"})
    described = provider.describe()
    assert API_KEY not in repr(described)
    assert described["settings"] == {
        "store": False,
        "encrypted_reasoning": True,
        "foreign_reasoning": "drop",
    }
    assert described["options"] == ["reasoning"]


async def test_missing_api_key_fails_as_authentication_failed_on_first_call(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    provider = OpenAIResponsesProvider("gpt-5-mini", base_url="http://127.0.0.1:9/v1")

    async def emit(chunk: Any) -> None:
        raise AssertionError("nothing may be emitted")

    with pytest.raises(AuthenticationFailed):
        await provider.stream(make_request(), emit)


# -- the request ----------------------------------------------------------------------------------


async def test_request_has_input_instructions_function_tools_store_false_and_include():
    request = make_request(
        instructions="Be brief.", tools=[lookup], settings={"max_output_tokens": 50}
    )
    result = await run(Reply(body=recording("text.sse")), request=request)
    sent = result.requests[-1]
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert result.body() == {
        "model": "gpt-5-mini",
        "input": [{"role": "user", "content": "hi"}],
        "instructions": "Be brief.",
        "store": False,
        "include": [ENCRYPTED_REASONING],
        "max_output_tokens": 50,
        "stream": True,
        "tools": [
            {
                "type": "function",
                "name": "lookup",
                "description": "Look a key up.",
                "parameters": {
                    "type": "object",
                    "properties": {"key": {"type": "string"}},
                    "required": ["key"],
                },
                "strict": False,
            }
        ],
    }


async def test_store_true_asks_for_no_encrypted_reasoning():
    result = await run(Reply(body=recording("text.sse")), store=True)
    assert result.body()["store"] is True
    assert "include" not in result.body()


async def test_encrypted_reasoning_can_be_turned_off_for_models_without_reasoning():
    result = await run(Reply(body=recording("text.sse")), encrypted_reasoning=False)
    assert "include" not in result.body()


async def test_store_in_the_settings_governs_include_and_a_string_include_is_one_value():
    request = make_request(settings={"store": True, "include": "message.output_text.logprobs"})
    result = await run(Reply(body=recording("text.sse")), request=request)
    assert result.body()["store"] is True
    assert result.body()["include"] == ["message.output_text.logprobs"]


async def test_option_tools_are_added_and_include_is_merged():
    request = make_request(tools=[lookup], settings={"include": ["web_search_call.results"]})
    result = await run(
        Reply(body=recording("text.sse")),
        request=request,
        tools=[{"type": "web_search"}],
        include=[ENCRYPTED_REASONING],
    )
    sent = result.body()
    assert [t.get("name", t["type"]) for t in sent["tools"]] == ["lookup", "web_search"]
    assert sent["include"] == [ENCRYPTED_REASONING, "web_search_call.results"]


async def test_settings_override_options_and_unknown_fields_go_in_the_body():
    request = make_request(settings={"reasoning": {"effort": "high", "summary": "auto"}})
    result = await run(
        Reply(body=recording("text.sse")),
        request=request,
        reasoning={"effort": "low"},
        a_future_field=1,
        input="never replaces the history",
    )
    sent = result.body()
    assert sent["reasoning"] == {"effort": "high", "summary": "auto"}
    assert sent["a_future_field"] == 1
    assert sent["input"] == [{"role": "user", "content": "hi"}]


# -- parsing the stream ----------------------------------------------------------------------


async def test_plain_text_with_usage():
    result = await replay("text.sse")
    assert result.error is None
    assert result.text == "Bonjour — ça va très bien 🙂."
    assert result.of(UsageChunk)[0].usage == Usage(
        input_tokens=19, output_tokens=9, total_tokens=28, cache_read=12, reasoning_tokens=0
    )
    assert (result.finish.reason, result.finish.raw_reason) == ("stop", "completed")


async def test_reasoning_summary_parts_become_one_part_signed_with_the_item_and_its_follower():
    result = await replay("reasoning-function-call.sse")
    reasoning = result.of(ReasoningChunk)
    assert result.reasoning == (
        "**Checking the weather**\n\nThe user wants Paris; I should call get_weather."
        "\n\n**Choosing units**\n\nCelsius is the default."
    )
    assert all(c.provider == PROVIDER for c in reasoning)
    assert [c.signature is not None for c in reasoning] == [False] * 5 + [True]
    item, following = decode_reasoning(reasoning[-1].signature)
    assert item["id"] == "rs_reason001" and item["encrypted_content"].startswith("gAAAA")
    assert [s["text"][:10] for s in item["summary"]] == ["**Checking", "**Choosing"]
    assert following == {"type": "function_call", "id": "fc_call00001", "call_id": "call_Weather01"}
    # the part closes before the call starts, so the call is not inside the reasoning part
    kinds = [type(c) for c in result.chunks]
    assert kinds.index(ToolInputStartChunk) == kinds.index(ReasoningChunk) + 5 + 1


async def test_function_call_streams_its_arguments_and_is_complete_when_its_item_is_done():
    result = await replay("reasoning-function-call.sse")
    assert [d.delta for d in result.of(ToolInputDeltaChunk)] == ['{"ci', 'ty": "Pa', 'ris"}']
    (done_call,) = result.calls
    assert done_call == ToolCallChunk(
        tool_call_id="call_Weather01", tool_name="get_weather", input={"city": "Paris"}
    )
    assert result.of(UsageChunk)[0].usage.reasoning_tokens == 48
    assert result.finish.reason == "tool-calls"


async def test_parallel_function_calls_in_call_order():
    result = await replay("parallel-function-calls.sse")
    assert [(c.tool_call_id, c.tool_name, c.input) for c in result.calls] == [
        ("call_ParA0001", "get_weather", {"city": "Paris"}),
        ("call_ParB0002", "get_time", {"tz": "Europe/Paris"}),
    ]
    assert result.finish.reason == "tool-calls"


async def test_reasoning_without_a_summary_is_an_empty_signed_part():
    result = await replay("parallel-function-calls.sse")
    (only,) = result.of(ReasoningChunk)
    assert only.text == "" and decode_reasoning(only.signature)[0]["id"] == "rs_parallel1"


async def test_a_builtin_tool_item_is_kept_verbatim_as_provider_data():
    result = await replay("web-search-call.sse")
    (data,) = result.of(ProviderDataChunk)
    assert data.provider == PROVIDER
    assert data.data == {
        "id": "ws_search001",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "trio structured concurrency"},
    }
    assert result.text == "Trio uses nurseries." and result.finish.reason == "stop"


async def test_incomplete_by_max_output_tokens_is_length_and_the_cut_call_never_runs():
    result = await replay("incomplete-max-output-tokens.sse")
    assert result.text == "Saving the note."
    (cut,) = result.calls
    assert cut.tool_call_id == "call_Trunc001"
    assert cut.input == '{"path": "notes.txt", "text": "Once up'
    assert "max_output_tokens" in cut.input_error and "not executed" in cut.input_error
    assert (result.finish.reason, result.finish.raw_reason) == ("length", "max_output_tokens")


async def test_incomplete_by_the_content_filter_is_content_filter():
    events = [created(), *message(0, "msg_1", "Well"), completed(status="incomplete")]
    events[-1]["response"]["incomplete_details"] = {"reason": "content_filter"}
    result = await run(Reply(body=body(*events)))
    assert (result.finish.reason, result.finish.raw_reason) == ("content-filter", "content_filter")


async def test_refusal_is_marked_and_finishes_as_content_filter():
    result = await replay("refusal.sse")
    assert result.text == "I'm sorry, I can't help with that."
    assert all(c.refusal for c in result.of(TextChunk))
    assert (result.finish.reason, result.finish.raw_reason) == ("content-filter", "completed")


async def test_response_failed_raises_classified_after_what_came_before():
    result = await replay("failed-server-error.sse")
    assert result.text == "The answer is"
    assert isinstance(result.error, ProviderUnavailable) and result.error.retryable
    assert result.error.message == "The server had an error processing your request."
    assert not result.of(FinishChunk)


async def test_error_event_raises_classified_after_what_came_before():
    result = await replay("error-event.sse")
    assert result.text == "Let me think"
    assert isinstance(result.error, RateLimited)
    assert not result.of(FinishChunk)


async def test_error_event_with_a_nested_error_object_is_classified_too():
    error = {"type": "invalid_request_error", "code": None, "message": "bad input item"}
    result = await run(Reply(body=body(created(), {"type": "error", "error": error})))
    assert type(result.error) is BadRequest and result.error.message == "bad input item"


async def test_a_stream_cut_before_its_terminal_event_is_malformed():
    result = await replay("cut-no-terminal-event.sse")
    assert result.text == "Once upon a time"
    assert isinstance(result.error, MalformedStream)
    assert not result.of(FinishChunk)


async def test_a_reasoning_item_cut_before_its_end_stays_unsigned():
    events = [created(), *reasoning(0, "rs_cut", "Thinking about")[:-1]]
    result = await run(Reply(body=body(*events)))
    assert result.reasoning == "Thinking about"
    assert all(c.signature is None for c in result.of(ReasoningChunk))
    assert isinstance(result.error, MalformedStream)


@pytest.mark.parametrize("write_size", [1, 7, 64])
async def test_arbitrary_tcp_splits_give_the_same_chunks(write_size):
    whole = await replay("reasoning-function-call.sse")
    split = await replay("reasoning-function-call.sse", write_size=write_size)
    assert split.chunks == whole.chunks


async def test_items_sent_whole_without_deltas_are_emitted_from_their_done_event():
    rs = {"id": "rs_w", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}]}
    msg = {
        "id": "msg_w",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Whole.", "annotations": []}],
    }
    fc = {"id": "fc_w", "type": "function_call", "call_id": "call_w", "name": "lookup"}
    fc["arguments"] = '{"key": "k"}'
    result = await run(
        Reply(body=body(created(), done(0, rs), done(1, msg), done(2, fc), completed()))
    )
    assert (result.reasoning, result.text) == ("Plan.", "Whole.")
    assert len(result.of(ToolInputStartChunk)) == 1
    assert result.calls[0].input == {"key": "k"} and result.calls[0].input_error is None


async def test_a_call_never_reported_done_is_complete_when_the_response_completed():
    events = [created(), *call(0, "fc_n", "call_n", '{"key": "n"}')[:-1], completed()]
    result = await run(Reply(body=body(*events)))
    assert result.calls == [
        ToolCallChunk(tool_call_id="call_n", tool_name="lookup", input={"key": "n"})
    ]
    assert result.finish.reason == "tool-calls"


async def test_events_lacking_their_fields_are_skipped_not_a_crash():
    bare = [{"type": t} for t in ("response.output_item.added", "response.output_item.done")]
    bare.append({"type": "response.output_text.delta"})
    events = [created(), *bare, *message(0, "msg_1", "still fine"), completed()]
    result = await run(Reply(body=body(*events)))
    assert result.error is None
    assert result.text == "still fine" and result.finish.reason == "stop"


async def test_event_types_it_does_not_read_leave_the_answer_whole():
    # openai 3.63's stream union: queued, compaction, shell, custom tool and annotation
    # events; then a type no SDK knows yet. The compaction item goes back verbatim.
    item = {"id": "cmp_1", "type": "compaction", "encrypted_content": "ENC"}
    events = [
        created(),
        {"type": "response.queued", "response": response("queued")},
        {"type": "response.compaction.compacting", "item_id": "cmp_1", "output_index": 0},
        added(0, {"id": "cmp_1", "type": "compaction"}),
        done(0, item),
        {"type": "response.shell_call_command.added", "output_index": 1, "command_index": 0},
        {"type": "response.custom_tool_call_input.delta", "output_index": 1, "delta": "x"},
        {"type": "response.output_text.annotation.added", "output_index": 2, "annotation": {}},
        {"type": "response.not_yet_invented", "delta": {"not": "text"}, "output_index": 2},
        *message(2, "msg_1", "still fine"),
        completed(),
    ]
    result = await run(Reply(body=body(*events)))
    assert result.error is None
    assert result.of(ProviderDataChunk) == [
        ProviderDataChunk(provider="openai-responses", data=item)
    ]
    assert result.text == "still fine" and result.finish.reason == "stop"


async def test_invalid_json_arguments_keep_the_raw_text_and_an_input_error():
    events = [created(), *call(0, "fc_bad", "call_bad", '{"key": k}'), completed()]
    result = await run(Reply(body=body(*events)))
    (bad,) = result.calls
    assert bad.input == '{"key": k}' and "invalid JSON" in bad.input_error


# hypothesis: the arguments of a call split at any points, and two summary parts split at
# any points, always give the same call and the same reasoning text.


def _event_classes() -> dict[str, type]:
    """The SDK's event class for each ``type`` of the ``ResponseStreamEvent`` union."""
    from typing import get_args

    from openai.types.responses import ResponseStreamEvent

    union = get_args(ResponseStreamEvent)[0]
    return {get_args(cls.model_fields["type"].annotation)[0]: cls for cls in get_args(union)}


EVENT_CLASSES = _event_classes()


def _typed(events: list[dict[str, Any]]) -> list[Any]:
    """The SDK's event objects, built as its stream builds them (no validation)."""
    return [
        EVENT_CLASSES[e["type"]].construct(**e, sequence_number=n) for n, e in enumerate(events)
    ]


def _parse(events: list[dict[str, Any]]) -> list[Any]:
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)

    async def main() -> None:
        async def stream():
            for event in _typed(events):
                yield event

        async with aclosing(stream()) as typed:  # parse_stream stops at the terminal event
            await parse_stream(typed, emit)

    trio.run(main)
    return chunks


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@given(
    arguments=st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=3).map(json.dumps),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_arguments_split_at_any_points_give_the_same_call(arguments, cuts):
    head = {"id": "fc_h", "type": "function_call", "call_id": "call_h", "name": "lookup"}
    deltas = [
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_h",
            "output_index": 0,
            "delta": piece,
        }
        for piece in _pieces(arguments, cuts)
    ]
    events = [
        created(),
        added(0, {**head, "arguments": ""}),
        *deltas,
        done(0, {**head, "arguments": arguments}),
        completed(),
    ]
    chunks = _parse(events)
    streamed = "".join(c.delta for c in chunks if isinstance(c, ToolInputDeltaChunk))
    (complete,) = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert streamed == arguments
    assert complete.input == json.loads(arguments) and complete.input_error is None


@given(
    first=st.text(min_size=1, max_size=12),
    second=st.text(min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=6),
)
def test_summary_parts_split_at_any_points_give_the_same_reasoning(first, second, cuts):
    def deltas(text: str, index: int) -> list[dict[str, Any]]:
        return [
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": "rs_h",
                "output_index": 0,
                "summary_index": index,
                "delta": piece,
            }
            for piece in _pieces(text, cuts)
            if piece
        ]

    summary = [{"type": "summary_text", "text": t} for t in (first, second)]
    item = {"id": "rs_h", "type": "reasoning", "summary": summary, "encrypted_content": "e"}
    events = [
        created(),
        added(0, {**item, "summary": []}),
        *deltas(first, 0),
        *deltas(second, 1),
        done(0, item),
        completed(),
    ]
    chunks = [c for c in _parse(events) if isinstance(c, ReasoningChunk)]
    assert "".join(c.text for c in chunks) == f"{first}\n\n{second}"
    assert decode_reasoning(chunks[-1].signature)[0] == item


def test_every_recording_is_valid_for_the_sdk_event_types():
    for path in sorted(RECORDINGS.glob("*.sse")):
        events = [
            json.loads(block.split("data: ", 1)[1])
            for block in path.read_text(encoding="utf-8").split("\n\n")
            if block.strip()
        ]
        for event in events:  # strict validation: every required field, every literal
            EVENT_CLASSES[event["type"]].model_validate(event)


# -- HTTP and transport failures through the shared ladder ------------------------------------


async def test_http_429_with_retry_after_is_rate_limited():
    error = {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}
    result = await run(json_reply(429, error, headers=[("retry-after", "3")]))
    assert isinstance(result.error, RateLimited) and result.error.retryable
    assert (result.error.retry_after, result.error.status_code) == (3.0, 429)
    assert result.error.provider == PROVIDER
    assert len(result.requests) == 1  # the SDK does not retry: the runtime decides


async def test_http_401_is_authentication_failed():
    error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
    result = await run(json_reply(401, error))
    assert isinstance(result.error, AuthenticationFailed) and not result.error.retryable


async def test_http_400_encrypted_content_unsupported_is_bad_request():
    error = {
        "message": "Encrypted content is not supported with this model.",
        "type": "invalid_request_error",
        "param": "include",
    }
    result = await run(json_reply(400, error))
    assert type(result.error) is BadRequest and not result.error.retryable


async def test_connection_dropped_mid_body_is_connection_lost():
    data = recording("text.sse")
    cut = data.index(" très bien".encode()) + 4
    result = await run(Reply(body=data, drop_after=cut, write_size=64))
    assert isinstance(result.error, ConnectionLost)
    assert result.text == "Bonjour — ça va"


async def test_the_actor_reports_a_failed_call_as_stream_failed():
    reply = json_reply(429, {"message": "slow", "type": "requests"}, headers=[("retry-after", "2")])
    async with loopback_server(reply) as server:
        provider = OpenAIResponsesProvider("m", base_url=server.url + "/v1", api_key=API_KEY)
        request = make_request()
        await provider.serve(request)
        await provider.aclose()
    batches: list[Any] = []
    request.reply.drain_nowait(batches)
    last = batches[-1][-1]
    assert isinstance(last, StreamFailed)
    assert isinstance(last.error, RateLimited) and last.error.retry_after == 2.0


def test_map_finish_reason():
    assert map_finish_reason("completed") == "stop"
    assert map_finish_reason("completed", tool_calls=True) == "tool-calls"
    assert map_finish_reason("incomplete", reason="max_output_tokens") == "length"
    assert map_finish_reason("incomplete", reason="content_filter") == "content-filter"
    assert map_finish_reason("incomplete", reason="something_new") == "other"
    assert map_finish_reason("failed") == "error"
    assert map_finish_reason("cancelled") == "other"
    assert map_finish_reason(None) == "other"


def test_classify_error_passes_axon_errors_through():
    err = BadRequest("x", provider=PROVIDER)
    assert classify_error(err) is err


# -- restoration -------------------------------------------------------------------------------


def signed(step: int, item_id: str, text: str = "", following: dict | None = None, **item):
    data = {"id": item_id, "type": "reasoning", "summary": [], "encrypted_content": ENC, **item}
    if text:
        data["summary"] = [{"type": "summary_text", "text": text}]
    return ReasoningPart(
        text=text, step=step, signature=encode_reasoning(data, following), provider=PROVIDER
    )


def tool_call(call_id: str, step: int, key: str = "k") -> ToolCallPart:
    return ToolCallPart(tool_call_id=call_id, tool_name="lookup", input={"key": key}, step=step)


def result_of(call_id: str, step: int, output: Any = "ok", error: str | None = None):
    return ToolMessage(
        tool_call_id=call_id, tool_name="lookup", output=output, error=error, step=step
    )


def test_map_messages_splits_steps_and_sends_outputs_after_their_step_in_call_order():
    history = [
        SystemMessage(content="Stay on topic."),
        UserMessage(content="go"),
        AssistantMessage(
            content=(
                TextPart(text="Looking", step=0),
                TextPart(text=" it up.", step=0),
                tool_call("call_A", 0, "a"),
                tool_call("call_B", 1, "b"),
                tool_call("call_C", 1, "c"),
                TextPart(text="Done.", step=2),
            )
        ),
        result_of("call_A", 0, {"n": 1}),
        result_of("call_C", 1, error="boom"),
        result_of("call_B", 1),
    ]
    assert map_messages(history) == [
        {"role": "system", "content": "Stay on topic."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Looking it up."},
        {
            "type": "function_call",
            "call_id": "call_A",
            "name": "lookup",
            "arguments": '{"key": "a"}',
        },
        {"type": "function_call_output", "call_id": "call_A", "output": '{"n": 1}'},
        {
            "type": "function_call",
            "call_id": "call_B",
            "name": "lookup",
            "arguments": '{"key": "b"}',
        },
        {
            "type": "function_call",
            "call_id": "call_C",
            "name": "lookup",
            "arguments": '{"key": "c"}',
        },
        {"type": "function_call_output", "call_id": "call_B", "output": "ok"},
        {"type": "function_call_output", "call_id": "call_C", "output": "boom"},
        {"role": "assistant", "content": "Done."},
    ]


def test_reasoning_goes_back_verbatim_and_the_item_after_it_gets_its_id_back():
    fc_link = {"type": "function_call", "id": "fc_1", "call_id": "call_A"}
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(
                signed(0, "rs_1", "Plan.", fc_link),
                tool_call("call_A", 0),
                tool_call("call_B", 0),
                signed(1, "rs_2", "", {"type": "message", "id": "msg_2"}),
                TextPart(text="Answer.", step=1),
            )
        ),
        result_of("call_A", 0),
        result_of("call_B", 0),
    ]
    items = map_messages(history)
    assert items[1] == {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Plan."}],
        "encrypted_content": ENC,
    }
    assert items[2]["id"] == "fc_1" and "id" not in items[3]  # only its follower is linked
    assert items[6:] == [
        {"id": "rs_2", "type": "reasoning", "summary": [], "encrypted_content": ENC},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_2",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Answer.", "annotations": []}],
        },
    ]


def test_a_call_renamed_for_its_repeated_id_still_gets_its_item_id_back():
    # A server numbering calls per response: step 1's call_A became call_A-1 in the turn.
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(
                signed(0, "rs_1", "", {"type": "function_call", "id": "fc_1", "call_id": "call_A"}),
                tool_call("call_A", 0),
                signed(1, "rs_2", "", {"type": "function_call", "id": "fc_2", "call_id": "call_A"}),
                tool_call("call_A-1", 1),
            )
        ),
        result_of("call_A", 0),
        result_of("call_A-1", 1),
    ]
    items = map_messages(history)
    calls = [(i["id"], i["call_id"]) for i in items if i.get("type") == "function_call"]
    assert calls == [("fc_1", "call_A"), ("fc_2", "call_A-1")]
    assert wire_rules.responses_errors(items) == []


def test_other_providers_reasoning_unsigned_and_unreadable_reasoning_are_dropped():
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(
                ReasoningPart(text="chat reasoning", step=0, provider="openai"),
                ReasoningPart(text="thinking", signature="sig==", step=0, provider="anthropic"),
                ReasoningPart(text="", redacted_data="opaque", step=0, provider="anthropic"),
                ReasoningPart(text="cut short", step=0, provider=PROVIDER),
                ReasoningPart(text="x", signature="not json", step=0, provider=PROVIDER),
                ReasoningPart(text="x", signature='{"item": [1]}', step=0, provider=PROVIDER),
                ProviderDataPart(provider="anthropic", data={"type": "server_tool_use"}, step=0),
                TextPart(text="Hi.", step=0),
            )
        ),
    ]
    assert map_messages(history) == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Hi."},
    ]


def test_reasoning_without_encrypted_content_is_sent_only_when_the_server_stores_it():
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(signed(0, "rs_1", encrypted_content=None), TextPart(text="Hi.", step=0))
        ),
    ]
    assert [i.get("type") for i in map_messages(history, store=False)] == [None, None]
    assert [i.get("type") for i in map_messages(history, store=True)] == [
        None,
        "reasoning",
        None,
    ]


def test_reasoning_with_nothing_after_it_in_its_step_is_dropped():
    history = [
        UserMessage(content="go"),
        AssistantMessage(content=(signed(0, "rs_1", "Plan."), TextPart(text="Hi.", step=1))),
    ]
    assert map_messages(history) == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Hi."},
    ]


def test_reasoning_whose_message_was_whitespace_alone_is_not_sent_before_the_call():
    """The message that followed the reasoning held whitespace alone, which the history's
    repair drops: the reasoning item is not sent without it (the API pairs the two)."""
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(
                signed(0, "rs_1", "Plan.", {"type": "message", "id": "msg_1"}),
                tool_call("call_A", 0),
                signed(1, "rs_2", "", {"type": "message", "id": "msg_2"}),
                TextPart(text="Answer.", step=1),
            )
        ),
        result_of("call_A", 0),
    ]
    items = map_messages(history)
    assert [i.get("id") or i.get("type") or i.get("role") for i in items] == [
        "user",
        "function_call",
        "function_call_output",
        "rs_2",
        "msg_2",
    ]
    assert wire_rules.responses_errors(items) == []


def test_builtin_tool_items_go_back_verbatim_in_their_place():
    search = {"id": "ws_1", "type": "web_search_call", "status": "completed", "action": {}}
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(
                signed(0, "rs_1", following={"type": "web_search_call", "id": "ws_1"}),
                ProviderDataPart(provider=PROVIDER, data=search, step=0),
                TextPart(text="Found it.", step=0),
            )
        ),
    ]
    items = map_messages(history)
    assert [i.get("type", i.get("role")) for i in items] == [
        "user",
        "reasoning",
        "web_search_call",
        "assistant",
    ]
    assert items[2] == search


def test_map_tools_sends_functions_non_strict_and_dicts_as_they_are():
    assert map_tools([lookup, {"type": "web_search"}]) == [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look a key up.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
            "strict": False,
        },
        {"type": "web_search"},
    ]


# -- whole turns through the host ---------------------------------------------------------------


def step_with_calls(n: int, *calls: tuple[str, str]) -> bytes:
    events = [created(), *reasoning(0, f"rs_{n}", f"plan {n}")]
    for index, (call_id, key) in enumerate(calls, start=1):
        events += call(index, f"fc_{call_id}", call_id, json.dumps({"key": key}))
    return body(*events, completed())


def answer(text: str, item_id: str = "msg_end") -> bytes:
    return body(created(), *message(0, item_id, text), completed())


def rs_item(n: int) -> dict[str, Any]:
    return {
        "id": f"rs_{n}",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": f"plan {n}"}],
        "encrypted_content": f"{ENC}rs_{n}",
    }


def fc_item(call_id: str, key: str, linked: bool = False) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "call_id": call_id,
        "name": "lookup",
        "arguments": json.dumps({"key": key}),
    }
    return {**item, "id": f"fc_{call_id}"} if linked else item


def output(call_id: str, key: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": f"value-{key}"}


async def test_three_step_turn_sends_back_encrypted_reasoning_and_outputs_in_order():
    replies = [
        Reply(body=step_with_calls(1, ("call_A", "a")), write_size=29),
        Reply(body=step_with_calls(2, ("call_B", "b"), ("call_C", "c"))),
        Reply(body=answer("all done")),
    ]
    async with loopback_server(*replies) as server:
        provider = OpenAIResponsesProvider("gpt-5-mini", base_url=server.url + "/v1", api_key="t")
        agent = Agent(provider=provider, instructions="Be brief.", tools=[lookup])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                chunks = [c async for c in out]
    check_grammar(chunks)
    assert out.result.text == "all done" and out.result.steps == 3
    assert [c.type for c in chunks].count("reasoning-start") == 2
    second, third = server.requests[1].json(), server.requests[2].json()
    step0 = [
        {"role": "user", "content": "go"},
        rs_item(1),
        fc_item("call_A", "a", linked=True),
        output("call_A", "a"),
    ]
    assert second["input"] == step0
    assert third["input"] == [
        *step0,
        rs_item(2),
        fc_item("call_B", "b", linked=True),
        fc_item("call_C", "c"),
        output("call_B", "b"),
        output("call_C", "c"),
    ]
    assert second["instructions"] == "Be brief." and second["store"] is False
    parts = session.messages[1].content
    assert [p.type for p in parts] == [
        "reasoning",
        "tool-call",
        "reasoning",
        "tool-call",
        "tool-call",
        "text",
    ]
    assert [p.text for p in parts if isinstance(p, ReasoningPart)] == ["plan 1", "plan 2"]


async def test_a_session_saved_to_sqlite_and_resumed_sends_its_reasoning_back(tmp_path):
    db = str(tmp_path / "sessions.db")
    first = body(
        created(), *reasoning(0, "rs_1", "plan 1"), *message(1, "msg_1", "Hi."), completed()
    )
    async with loopback_server(Reply(body=first), Reply(body=answer("Again."))) as server:
        provider = OpenAIResponsesProvider("gpt-5-mini", base_url=server.url + "/v1", api_key="t")
        async with Host.open(store=db, log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider), session_id="s1")
            await session.run("hello")
        async with Host.open(store=db, log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider), session_id="s1")
            await session.run("more")
    assert server.requests[1].json()["input"] == [
        {"role": "user", "content": "hello"},
        rs_item(1),
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hi.", "annotations": []}],
        },
        {"role": "user", "content": "more"},
    ]


async def test_reasoning_of_a_cut_stream_is_saved_unsigned_and_never_sent_back():
    cut = body(created(), *reasoning(0, "rs_cut", "half a thought")[:-1])
    async with loopback_server(Reply(body=cut), Reply(body=answer("ok"))) as server:
        provider = OpenAIResponsesProvider("gpt-5-mini", base_url=server.url + "/v1", api_key="t")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("go") as out:
                chunks = [c async for c in out]
            await session.run("again")
    check_grammar(chunks, ending="error")
    assert chunks[-1].error.kind == "MalformedStream"
    saved = session.messages[1].content
    assert saved == (
        ReasoningPart(
            text="half a thought",
            step=0,
            provider=PROVIDER,
            model="gpt-5-mini",
            endpoint=server.url + "/v1",
        ),
    )
    assert server.requests[1].json()["input"] == [
        {"role": "user", "content": "go"},
        {"role": "user", "content": "again"},
    ]


def chat_reasoning_answer() -> bytes:
    def chunk(delta: dict, finish: str | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [choice],
        }

    return sse(
        chunk({"reasoning_content": "chat thoughts"}),
        chunk({"content": "chat answer"}),
        chunk({}, "stop"),
    )


def anthropic_thinking_answer() -> bytes:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_a",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    }
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    return anthropic_sse(
        start,
        {"type": "content_block_start", "index": 0, "content_block": thinking},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "claude thoughts"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "SIG=="},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "text_delta", "text": "claude answer"},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    )


async def test_a_history_from_chat_completions_and_anthropic_is_restored_without_their_reasoning(
    tmp_path,
):
    db = str(tmp_path / "sessions.db")
    replies = [
        Reply(body=chat_reasoning_answer()),
        Reply(body=anthropic_thinking_answer()),
        Reply(body=answer("responses answer")),
    ]
    async with loopback_server(*replies) as server:
        providers = [
            OpenAIProvider("m", base_url=server.url + "/v1", api_key="t"),
            AnthropicProvider(
                "m", base_url=server.url, api_key="t", thinking_budget=1024, max_tokens=2048
            ),
            OpenAIResponsesProvider("gpt-5-mini", base_url=server.url + "/v1", api_key="t"),
        ]
        for n, provider in enumerate(providers):
            async with Host.open(store=db, log_tap=False) as host:
                session = await host.open_session(Agent(provider=provider), session_id="s1")
                await session.run(f"q{n}")
    kinds = [
        [p.type for p in m.content] for m in session.messages if isinstance(m, AssistantMessage)
    ]
    assert kinds == [["reasoning", "text"], ["reasoning", "text"], ["text"]]
    assert server.requests[2].path == "/v1/responses"
    assert server.requests[2].json()["input"] == [
        {"role": "user", "content": "q0"},
        {"role": "assistant", "content": "chat answer"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "claude answer"},
        {"role": "user", "content": "q2"},
    ]


async def test_the_cli_runs_a_turn_with_provider_openai_responses():
    chunks, requests = await cli_turn(
        Reply(body=answer("hello from responses")),
        lambda url: ["--provider", "openai-responses", "--base-url", url + "/v1"],
    )
    check_grammar(chunks)
    assert "".join(c["text"] for c in chunks if c["type"] == "text-delta") == "hello from responses"
    assert requests[0].path == "/v1/responses"
    assert requests[0].json()["model"] == "gpt-5-mini"


# -- images and files ------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
PDF = b"%PDF-1.7\n%%EOF"
PNG_URL = "data:image/png;base64," + __import__("base64").b64encode(PNG).decode()
PDF_URL = "data:application/pdf;base64," + __import__("base64").b64encode(PDF).decode()


async def test_user_images_and_files_go_as_input_image_and_input_file_items():
    from runtime import File, Image

    content = (
        TextPart(text="what are these?", step=0),
        Image(data=PNG),
        Image(url="https://example.com/cat.jpg"),
        File(data=PDF, filename="report.pdf"),
        File(url="https://example.com/a.pdf", media_type="application/pdf"),
    )
    request = make_request([UserMessage(content=content)])
    result = await run(Reply(body=recording("text.sse")), request=request)
    assert result.body()["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what are these?"},
                {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
                {
                    "type": "input_image",
                    "image_url": "https://example.com/cat.jpg",
                    "detail": "auto",
                },
                {"type": "input_file", "filename": "report.pdf", "file_data": PDF_URL},
                {
                    "type": "input_file",
                    "filename": "file.pdf",
                    "file_url": "https://example.com/a.pdf",
                },
            ],
        }
    ]


def test_a_tool_that_returned_an_image_sends_it_in_its_function_call_output():
    from runtime import Image

    history = [
        UserMessage(content="chart?"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id="c1", tool_name="chart", input={}, step=0),)
        ),
        ToolMessage(
            tool_call_id="c1",
            tool_name="chart",
            output=(TextPart(text="here", step=0), Image(data=PNG)),
            step=0,
        ),
    ]
    output = next(i for i in map_messages(history) if i.get("type") == "function_call_output")
    assert output["output"] == [
        {"type": "input_text", "text": "here"},
        {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
    ]


async def test_a_format_responses_cannot_take_is_refused_before_any_request():
    from runtime import Image
    from runtime.errors import UnsupportedMedia

    bmp = Image(data=b"BM" + b"\x00" * 60, media_type="image/bmp")
    request = make_request([UserMessage(content=(TextPart(text="see", step=0), bmp))])
    result = await run(Reply(body=recording("text.sse")), request=request)
    assert isinstance(result.error, UnsupportedMedia) and "image/bmp" in str(result.error)
    assert result.requests == []


async def test_an_output_type_asks_for_strict_json_schema_text():
    import pydantic

    from runtime.output_schema import output_schema

    class Weather(pydantic.BaseModel):
        city: str
        temp: float

    request = attrs.evolve(make_request(), output=output_schema(Weather))
    result = await run(Reply(body=recording("text.sse")), request=request)
    assert result.body()["text"] == {
        "format": {
            "type": "json_schema",
            "name": "Weather",
            "schema": {
                "type": "object",
                "title": "Weather",
                "properties": {
                    "city": {"type": "string", "title": "City"},
                    "temp": {"type": "number", "title": "Temp"},
                },
                "required": ["city", "temp"],
                "additionalProperties": False,
            },
            "strict": True,
        }
    }
