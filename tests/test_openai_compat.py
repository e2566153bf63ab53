"""The OpenAI-compatible endpoint (/v1), driven by the real `openai` SDK over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent
from runtime import output as o
from runtime.app.web.openai_wire import (
    CompletionEncoder,
    OpenAIError,
    finish_reason,
    parse_chat_request,
)
from runtime.app.web.protocols import BUILT, PROTOCOLS, parse_protocols, unbuilt_refusal
from runtime.chunks import Usage
from runtime.messages import AssistantMessage, SystemMessage, ToolMessage, UserMessage
from tests.test_web_http import TWO_TOOLS, lookup
from tests.web.harness import WebServer, wait_idle, web_server

BOTH = ("ai-sdk", "openai")

# The openai SDK, the client here, leaves its own async generators to the garbage
# collector: `AsyncStream.__stream__` stops at `[DONE]` (and at an error event) with its
# `_iter_events` generator, and the byte iterators below it, unexhausted and unclosed
# (openai 3.x `_streaming.py`), which Trio reports as a ResourceWarning, an error under
# `-W error`. A client's, not the server's: only those are let through, so a generator
# the server leaves open still fails a run with `-W error::ResourceWarning`.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai\._streaming|httpx2\._models|httpcore2\._async)\.:"
    "ResourceWarning"
)


STEP_USAGE = Usage(input_tokens=10, output_tokens=3, total_tokens=13)


def tool_agent() -> Agent:
    return Agent(
        name="finder",
        provider=ScriptedProvider(TWO_TOOLS, usage=STEP_USAGE),
        tools=[lookup],
    )


@asynccontextmanager
async def openai_client(
    server: WebServer, api_key: str = "unused", **options: Any
) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key=api_key, max_retries=0, **options
    ) as client:
        yield client


def USER(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def test_a_stream_gives_the_answer_as_content_and_reasoning_as_reasoning_content():
    async with web_server(tool_agent(), protocols=BOTH) as server, openai_client(server) as c:
        stream = await c.chat.completions.create(
            model="finder", messages=USER("Find a and b"), stream=True
        )
        chunks = [chunk async for chunk in stream]
    deltas = [chunk.choices[0].delta for chunk in chunks]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == "Looking up a. Now b. Both found."
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert reasoning == "I need a and b."
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "stop"
    assert all(not d.tool_calls for d in deltas)  # the agent's tools stay inside it
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.model == "finder" for chunk in chunks)


async def test_a_whole_answer_is_one_chat_completion():
    async with web_server(tool_agent(), protocols=BOTH) as server, openai_client(server) as c:
        completion = await c.chat.completions.create(model="finder", messages=USER("Find"))
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert choice.message.content == "Looking up a. Now b. Both found."
    assert getattr(choice.message, "reasoning_content", None) == "I need a and b."
    assert not choice.message.tool_calls


async def test_usage_is_summed_over_every_step_of_the_turn():
    async with web_server(tool_agent(), protocols=BOTH) as server, openai_client(server) as c:
        completion = await c.chat.completions.create(model="finder", messages=USER("Find"))
        stream = await c.chat.completions.create(
            model="finder",
            messages=USER("Find"),
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    summed = (30, 9, 39)  # three model calls of STEP_USAGE
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == summed
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == summed[:2]
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_a_stream_without_include_usage_sends_no_usage_chunk():
    async with web_server(tool_agent(), protocols=BOTH) as server, openai_client(server) as c:
        stream = await c.chat.completions.create(model="finder", messages=USER("x"), stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(chunk.choices for chunk in chunks)


async def test_the_session_header_continues_the_sessions_own_conversation():
    provider = ScriptedProvider(turns=[["Hello Ada."], ["You are Ada."]])
    agent = Agent(name="memo", provider=provider)
    async with web_server(agent, protocols=BOTH) as server, openai_client(server) as c:
        header = {"X-Axon-Session": "chat-1"}
        first = await c.chat.completions.with_raw_response.create(
            model="memo", messages=USER("I am Ada."), extra_headers=header
        )
        assert first.headers["x-axon-session"] == "chat-1"
        # the client sends only its new message: the session holds the history
        second = await c.chat.completions.create(
            model="memo", messages=USER("Who am I?"), extra_headers=header
        )
        stored = await server.host.store.load("chat-1")
    assert second.choices[0].message.content == "You are Ada."
    sent = provider.requests[-1].messages
    assert [m.text if isinstance(m, AssistantMessage) else m.content for m in sent[:3]] == [
        "I am Ada.",
        "Hello Ada.",
        "Who am I?",
    ]
    assert stored is not None and len(stored.messages) == 4


async def test_a_stateless_call_sends_the_requests_history_and_stores_nothing(tmp_path):
    provider = ScriptedProvider(["Paris."])
    agent = Agent(name="geo", provider=provider)
    store = str(tmp_path / "s.db")
    async with web_server(agent, store=store, protocols=BOTH) as server:
        async with openai_client(server) as c:
            completion = await c.chat.completions.with_raw_response.create(
                model="geo",
                messages=[
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Capital of France?"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "atlas", "arguments": '{"q": "France"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "Paris"},
                    {"role": "user", "content": [{"type": "text", "text": "So?"}]},
                ],
            )
        assert "x-axon-session" not in completion.headers
        assert completion.parse().choices[0].message.content == "Paris."
        assert await server.host.store.list_sessions() == []
        assert server.host.sessions == {}
        scratch = server.app.state.turn_cancellers[0].__self__._host  # the stateless host
        # The scratch session is closed and deleted in the request's `finally`, after the
        # answer's last byte went out: the client can read the answer first.
        # Fails (TooSlowError) if the scratch session is never forgotten.
        with trio.fail_after(30):
            while scratch.sessions or await scratch.store.list_sessions():  # noqa: ASYNC110 - the request task's finally
                await trio.sleep(0.01)
    sent = provider.requests[0].messages
    assert [type(m) for m in sent[:5]] == [
        SystemMessage,
        UserMessage,
        AssistantMessage,
        ToolMessage,
        UserMessage,
    ]
    assert sent[3].tool_name == "atlas" and sent[3].output == "Paris"
    assert sent[4].content == "So?"


async def test_the_token_is_required_and_a_missing_one_is_401_in_openais_shape():
    async with web_server(tool_agent(), protocols=BOTH, token="s3cret") as server:
        async with openai_client(server, api_key="wrong") as c:
            with pytest.raises(openai.AuthenticationError) as caught:
                await c.models.list()
        assert caught.value.code == "invalid_api_key"
        assert caught.value.body["type"] == "invalid_request_error"
        async with openai_client(server, api_key="s3cret") as c:
            models = await c.models.list()
    assert [m.id for m in models.data] == ["finder"]


async def test_a_forged_host_is_refused():
    async with web_server(tool_agent(), protocols=BOTH) as server:
        async with openai_client(server, default_headers={"host": "evil.example"}) as c:
            with pytest.raises(openai.PermissionDeniedError) as caught:
                await c.chat.completions.create(model="finder", messages=USER("x"))
        assert "DNS rebinding" in caught.value.body["message"]  # OpenAI's shape
        assert await server.host.store.list_sessions() == []


async def test_a_malformed_body_is_400_in_openais_shape():
    async with web_server(tool_agent(), protocols=BOTH) as server:
        async with openai_client(server) as c:
            with pytest.raises(openai.BadRequestError) as caught:
                await c.chat.completions.create(
                    model="finder", messages=[{"role": "wizard", "content": "x"}]
                )
        assert caught.value.param == "messages[0].role"
        async with httpx.AsyncClient(base_url=server.url) as raw:
            r = await raw.post(
                "/v1/chat/completions",
                content=b"{nope",
                headers={"content-type": "application/json"},
            )
        assert r.status_code == 400
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert server.host.sessions == {}


async def test_an_unknown_model_is_404_model_not_found():
    async with web_server(tool_agent(), protocols=BOTH) as server, openai_client(server) as c:
        with pytest.raises(openai.NotFoundError) as caught:
            await c.chat.completions.create(model="gpt-4o", messages=USER("x"))
    assert caught.value.code == "model_not_found"


async def test_an_invalid_session_header_is_400_and_opens_no_session():
    async with web_server(tool_agent(), protocols=BOTH) as server:
        async with openai_client(server) as c:
            with pytest.raises(openai.BadRequestError) as caught:
                await c.chat.completions.create(
                    model="finder", messages=USER("x"), extra_headers={"X-Axon-Session": "../x"}
                )
        assert caught.value.code == "invalid_session_id"
        assert server.host.sessions == {}
        assert await server.host.store.list_sessions() == []


async def test_a_failed_turn_raises_in_the_sdk_from_the_stream_and_the_whole_answer():
    def fail(request: Any) -> Any:
        raise ValueError("boom")

    agent = Agent(name="broken", provider=ScriptedProvider(responder=fail))
    async with web_server(agent, protocols=BOTH) as server, openai_client(server) as c:
        with pytest.raises(openai.InternalServerError):
            await c.chat.completions.create(model="broken", messages=USER("x"))
        stream = await c.chat.completions.create(model="broken", messages=USER("x"), stream=True)
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass


async def test_a_step_that_started_over_ends_the_stream_with_an_error_and_not_the_answer():
    from runtime import RetryPolicy
    from runtime.errors import Overloaded

    def busy() -> Overloaded:
        return Overloaded("overloaded", provider="scripted", status_code=529)

    primary = ScriptedProvider(responder=lambda request: ["Half an ans", busy()])
    backup = ScriptedProvider(responder=lambda request: ["The whole answer."], name="b")
    agent = Agent(name="fb", provider=[primary, backup], retry=RetryPolicy(max_attempts=1))
    async with web_server(agent, protocols=BOTH) as server, openai_client(server) as c:
        # answered whole: only the fallback's text
        whole = await c.chat.completions.create(model="fb", messages=USER("x"))
        assert whole.choices[0].message.content == "The whole answer."
        # streamed: the half answer went out and cannot be taken back: an error ends it;
        # the turn goes on while the client stays, and is stored whole
        header = {"X-Axon-Session": "fb-1"}
        stream = await c.chat.completions.create(
            model="fb", messages=USER("y"), stream=True, extra_headers=header
        )
        got: list[str] = []
        with pytest.raises(openai.APIError, match="cannot retract"):
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append(chunk.choices[0].delta.content)
        assert "".join(got) == "Half an ans"
        await wait_idle(server, "fb-1")
        await stream.close()
        stored = (await server.host.store.load("fb-1")).messages
        assert stored[-1].text == "The whole answer." and stored[-1].status == "complete"


async def test_only_the_named_protocols_are_mounted():
    async with web_server(tool_agent()) as server, httpx.AsyncClient(base_url=server.url) as c:
        assert (await c.get("/v1/models")).status_code == 404  # default: ai-sdk only
    async with web_server(tool_agent(), protocols=("openai",)) as server:
        async with httpx.AsyncClient(base_url=server.url) as c:
            assert (await c.get("/api/info")).status_code == 404
            assert (await c.get("/v1/models")).status_code == 200


def test_protocols_parse_every_known_name_and_refuse_unbuilt_ones():
    assert parse_protocols("ai-sdk,openai") == ("ai-sdk", "openai")
    assert parse_protocols("ai-sdk,ag-ui,a2a,openai,mcp") == (
        "ai-sdk",
        "ag-ui",
        "a2a",
        "openai",
        "mcp",
    )
    with pytest.raises(Exception, match="unknown protocol 'grpc'"):
        parse_protocols("ai-sdk,grpc")
    assert unbuilt_refusal(("ai-sdk", "openai", "mcp")) is None
    for unbuilt in sorted(set(PROTOCOLS) - BUILT):  # none, once every protocol is built
        refusal = unbuilt_refusal(("openai", unbuilt))
        assert refusal is not None and unbuilt in refusal and "\n" not in refusal


def test_serve_refuses_an_unbuilt_protocol_in_one_line(monkeypatch, capsys):
    from runtime.app.cli import build_parser
    from runtime.app.web import protocols
    from runtime.app.web.serve import serve_command

    monkeypatch.setattr(protocols, "BUILT", frozenset({"ai-sdk", "openai"}))  # as before mcp
    args = build_parser().parse_args(["serve", "--protocols", "ai-sdk,mcp", "--port", "0"])
    assert trio.run(serve_command, args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --protocols mcp: not available")


JUNK = st.recursive(
    st.none() | st.booleans() | st.text(max_size=5) | st.integers(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "refusal", "audio"]) | JUNK},
    optional={"text": JUNK, "image_url": JUNK | st.fixed_dictionaries({"url": JUNK})},
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | JUNK},
    optional={
        "content": JUNK | st.lists(PART, max_size=3),
        "tool_calls": JUNK
        | st.lists(st.fixed_dictionaries({}, optional={"id": JUNK, "function": JUNK})),
        "tool_call_id": JUNK,
    },
)
BODY = JUNK | st.fixed_dictionaries(
    {},
    optional={
        "model": JUNK,
        "messages": JUNK | st.lists(MESSAGE, max_size=4),
        "stream": JUNK,
        "stream_options": JUNK,
        "n": JUNK,
        "tools": JUNK,
    },
)


@given(BODY)
def test_any_json_body_parses_or_is_an_openai_error(payload):
    try:
        parse_chat_request(payload)
    except OpenAIError as exc:
        assert exc.status == 400 and exc.message


async def test_serve_serves_the_openai_endpoint_to_the_sdk():
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "runtime.app.web.serve",
            "--port",
            "0",
            "--delay",
            "0",
            "--protocols",
            "ai-sdk,openai",
            "--token",
            "tok",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
            url = line.decode().split(" on ", 1)[1].split("/#", 1)[0]
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="tok", max_retries=0) as c:
                (model,) = (await c.models.list()).data
                completion = await c.chat.completions.create(
                    model=model.id, messages=USER("Weather in Oslo?")
                )
            assert completion.choices[0].message.content
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_session_running_a_turn_answers_409_session_busy():
    agent = Agent(name="slow", provider=ScriptedProvider([["Hi", Sleep(30), "there"]]))
    header = {"X-Axon-Session": "busy"}
    async with web_server(agent, protocols=BOTH) as server, openai_client(server) as c:
        stream = await c.chat.completions.create(
            model="slow", messages=USER("x"), stream=True, extra_headers=header
        )
        chunks = aiter(stream)
        assert (await anext(chunks)).choices[0].delta.role == "assistant"
        with pytest.raises(openai.ConflictError) as caught:
            await c.chat.completions.create(model="slow", messages=USER("y"), extra_headers=header)
        assert caught.value.code == "session_busy"
        await stream.close()  # the turn goes on (and ends) without the client


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("tool_choice", "required"),
        ("tool_choice", {"type": "function", "function": {"name": "lookup"}}),
        ("function_call", {"name": "lookup"}),
        ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ],
)
async def test_a_tool_call_the_client_asks_for_is_400_and_runs_nothing(option, value):
    # the agent's tools run server-side: a forced call would never reach the client
    header = {"X-Axon-Session": "forced"}
    async with web_server(tool_agent(), protocols=BOTH) as server, openai_client(server) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.chat.completions.create(
                model="finder", messages=USER("x"), extra_headers=header, extra_body={option: value}
            )
        assert caught.value.status_code == 400
        assert caught.value.param == option
        for harmless in ("auto", "none"):  # what the agent does anyway
            await c.chat.completions.create(
                model="finder", messages=USER("x"), extra_body={"tool_choice": harmless}
            )
        assert "forced" not in server.host.sessions
        assert await server.host.store.load("forced") is None


async def test_a_body_not_sent_as_json_is_415_and_runs_nothing():
    async with web_server(tool_agent(), protocols=BOTH) as server:
        async with httpx.AsyncClient(base_url=server.url) as raw:
            r = await raw.post(
                "/v1/chat/completions",
                content=b'{"model": "finder", "messages": [{"role": "user", "content": "x"}]}',
                headers={"content-type": "text/plain"},
            )
        assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error"
        assert server.host.sessions == {}


async def test_a_cross_origin_request_is_refused():
    async with web_server(tool_agent(), protocols=BOTH) as server:
        origin = {"origin": "https://evil.example"}
        async with openai_client(server, default_headers=origin) as c:
            with pytest.raises(openai.PermissionDeniedError):
                await c.chat.completions.create(model="finder", messages=USER("x"))
        assert server.host.sessions == {}


def test_finish_reasons_map_to_openais_words():
    mapped = {r: finish_reason(r) for r in ("stop", "length", "content-filter", "budget", "other")}
    assert mapped == {
        "stop": "stop",
        "length": "length",
        "content-filter": "content_filter",
        "budget": "length",
        "other": "stop",
    }


def test_a_cut_off_turn_is_an_error_event_with_code_aborted():
    encoder = CompletionEncoder("m")
    (event,) = encoder.chunks(o.Abort(reason="server shutdown"))
    assert event["error"]["code"] == "aborted" and "server shutdown" in event["error"]["message"]
    assert encoder.error is not None and encoder.error.status == 503


def test_the_last_message_must_be_the_users():
    with pytest.raises(OpenAIError) as caught:
        parse_chat_request(
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                ],
            }
        )
    assert caught.value.status == 400 and caught.value.param == "messages"


def test_an_image_url_part_becomes_an_image_of_the_input():
    url = "data:image/png;base64,iVBORw0KGgo="
    chat = parse_chat_request(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ],
        }
    )
    assert isinstance(chat.input, tuple)
    assert [type(p).__name__ for p in chat.input] == ["TextPart", "Image"]
    assert chat.input[1].data == b"\x89PNG\r\n\x1a\n"


def test_a_tool_result_must_answer_an_earlier_tool_call():
    with pytest.raises(OpenAIError) as caught:
        parse_chat_request(
            {
                "model": "m",
                "messages": [
                    {"role": "tool", "tool_call_id": "nope", "content": "x"},
                    {"role": "user", "content": "y"},
                ],
            }
        )
    assert caught.value.param == "messages[0].tool_call_id"


async def test_a_shutdown_ends_a_stateless_stream_with_an_aborted_error():
    agent = Agent(name="slow", provider=ScriptedProvider([["Hi", Sleep(30), "there"]]))
    async with web_server(agent, protocols=BOTH) as server, openai_client(server) as c:
        stream = await c.chat.completions.create(model="slow", messages=USER("x"), stream=True)
        chunks = aiter(stream)
        assert (await anext(chunks)).choices[0].delta.role == "assistant"
        (cancel_turns,) = server.app.state.turn_cancellers
        assert cancel_turns("server shutdown") == 1
        with pytest.raises(openai.APIError, match="server shutdown"):
            async for _ in chunks:
                pass


async def test_an_unknown_route_or_method_is_answered_in_openais_shape():
    async with web_server(tool_agent(), protocols=BOTH) as server:
        async with httpx.AsyncClient(base_url=server.url) as raw:
            missing = await raw.get("/v1/embeddings")
            wrong = await raw.get("/v1/chat/completions")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_url"
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert set(wrong.json()["error"]) == {"message", "type", "param", "code"}
