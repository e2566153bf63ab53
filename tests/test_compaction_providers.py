"""A long session stays under its context window on every provider, and what it replays
stays valid: loopback servers of the three APIs (tests/support/windows.py) refuse a
request over their window, a call without its result and reasoning of the current tool
loop that went missing, as the real APIs do."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import trio

from actors.providers import (
    AnthropicProvider,
    GeminiProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
    openai_common,
)
from runtime import Agent, DropToolResults, Host, Summarize
from runtime.compaction import is_summary
from runtime.errors import AuthenticationFailed
from runtime.messages import Message, UserMessage
from tests.support.faults import check_history, resolve_platform
from tests.support.loopback import loopback_server
from tests.support.windows import (
    AnthropicWindow,
    ChatWindow,
    GeminiWindow,
    ResponsesWindow,
    WindowServer,
    fake_tiktoken,
)

WINDOW = 2500
TURNS = 200


def lookup(q: str) -> str:
    """Look something up."""
    return "a long result " * 150  # ~2000 characters


@pytest.fixture
def tiktoken(monkeypatch):
    """The OpenAI providers count with a stand-in tiktoken (the servers' tokenizer): the
    real one downloads its encoding, which a test cannot."""
    monkeypatch.setitem(sys.modules, "tiktoken", fake_tiktoken())
    monkeypatch.setattr(openai_common, "_encodings", {})


def make(kind: str, url: str) -> tuple[Any, WindowServer]:
    if kind == "anthropic":
        provider = AnthropicProvider(
            "claude-sonnet-4-5", base_url=url, api_key="test", thinking_budget=1024, max_tokens=2048
        )
        return provider, AnthropicWindow(window=WINDOW)
    if kind == "openai":
        return OpenAIProvider("gpt-4o", base_url=url + "/v1", api_key="test"), ChatWindow(
            window=WINDOW
        )
    if kind == "gemini":
        return GeminiProvider("gemini-2.5-flash", base_url=url, api_key="test"), GeminiWindow(
            window=WINDOW
        )
    provider = OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key="test")
    return provider, ResponsesWindow(window=WINDOW)


async def long_session(
    kind: str, turns: int
) -> tuple[WindowServer, list[Any], tuple[Message, ...]]:
    server_state: dict[str, WindowServer] = {}

    def respond(request):
        return server_state["server"](request)

    async with loopback_server(respond=respond) as server:
        provider, window = make(kind, server.url)
        server_state["server"] = window
        resolve_platform(provider)
        agent = Agent(
            provider=provider,
            instructions="You are a helpful assistant.",
            tools=[lookup],
            history_processors=[
                DropToolResults(max_chars=200, keep_turns=2),
                Summarize(max_tokens=WINDOW, keep_turns=3),
            ],
        )
        results = []
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            for n in range(turns):
                with trio.fail_after(30):
                    results.append(await session.run(f"question {n}: " + "tell me more " * 15))
            messages = session.messages
    return window, results, messages


@pytest.mark.parametrize("kind", ["anthropic", "openai", "openai-responses", "gemini"])
async def test_a_200_turn_session_stays_under_the_window_and_replays_validly(kind, tiktoken):
    window, results, messages = await long_session(kind, TURNS)
    assert window.refused == []
    assert [r.error for r in results] == [None] * TURNS
    assert max(window.counts) <= WINDOW
    assert TURNS // 20 <= window.summaries <= TURNS // 4  # summarized now and then, not every turn
    assert sum(is_summary(m) for m in messages) == window.summaries  # each one stored once
    assert sum(isinstance(m, UserMessage) for m in messages) == TURNS  # the store keeps all
    check_history([m for m in messages if not is_summary(m)])
    if isinstance(window, GeminiWindow):
        assert window.counted > 0  # measured by the API's count, not the estimate


# -- token counts ------------------------------------------------------------------------------

HISTORY = (UserMessage(content="question 1: " + "tell me more " * 15),)


async def test_anthropic_counts_with_its_count_tokens_endpoint():
    window = AnthropicWindow(window=WINDOW)
    async with loopback_server(respond=window) as server:
        provider, _ = make("anthropic", server.url)
        resolve_platform(provider)
        counted = await provider.count_tokens("be brief", HISTORY, [lookup_tool()])
        (request,) = server.requests
    assert request.path == "/v1/messages/count_tokens"
    body = request.json()
    assert body["system"] == "be brief" and body["thinking"]["budget_tokens"] == 1024
    assert [t["name"] for t in body["tools"]] == ["lookup"]
    assert counted == window.tokens(body)


async def test_anthropic_counts_with_the_interleaved_thinking_beta_its_calls_send():
    window = AnthropicWindow(window=WINDOW)
    async with loopback_server(respond=window) as server:
        provider = AnthropicProvider(
            "claude-sonnet-4-5",
            base_url=server.url,
            api_key="sk-ant-test",
            thinking_budget=8000,
            max_tokens=4096,
            interleaved_thinking=True,
        )
        await provider.count_tokens("be brief", HISTORY, [lookup_tool()])
        (request,) = server.requests
    assert request.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert request.json()["thinking"]["budget_tokens"] == 8000  # above max_tokens, with tools


async def test_gemini_counts_the_request_it_sends_with_its_count_tokens_endpoint():
    window = GeminiWindow(window=WINDOW)
    async with loopback_server(respond=window) as server:
        provider, _ = make("gemini", server.url)
        counted = await provider.count_tokens("be brief", HISTORY, [lookup_tool()])
        (request,) = server.requests
    assert request.path.endswith("/models/gemini-2.5-flash:countTokens")
    asked = request.json()["generateContentRequest"]  # the whole request, as documented
    assert asked["model"] == "models/gemini-2.5-flash"
    assert asked["systemInstruction"]["parts"] == [{"text": "be brief"}]
    assert [f["name"] for f in asked["tools"][0]["functionDeclarations"]] == ["lookup"]
    assert asked["contents"] == [{"role": "user", "parts": [{"text": HISTORY[0].content}]}]
    assert counted == window.tokens(asked) > window.tokens({"contents": asked["contents"]})


async def test_a_gemini_count_the_api_refuses_is_a_classified_error():
    from tests.support.loopback import Reply

    error = {"error": {"code": 403, "message": "no", "status": "PERMISSION_DENIED"}}
    reply = Reply(status=403, content_type="application/json", body=json.dumps(error).encode())
    async with loopback_server(reply) as server:
        provider, _ = make("gemini", server.url)
        with pytest.raises(AuthenticationFailed):
            await provider.count_tokens(None, HISTORY, [])


@pytest.mark.parametrize("kind", ["openai", "openai-responses"])
async def test_the_openai_providers_count_the_request_they_send_with_tiktoken(kind, tiktoken):
    window = ChatWindow(window=WINDOW) if kind == "openai" else ResponsesWindow(window=WINDOW)
    async with loopback_server(respond=window) as server:
        provider, _ = make(kind, server.url)
        resolve_platform(provider)
        counted = await provider.count_tokens("be brief", HISTORY, [lookup_tool()])
        from runtime.actor_messages import InferRequest

        params = provider.request_params(
            InferRequest(
                request_id="r",
                session_id="s",
                turn_id="t",
                step=0,
                instructions="be brief",
                messages=HISTORY,
                tools=(lookup_tool(),),
                reply=None,  # type: ignore[arg-type]
                cancel_scope=trio.CancelScope(),
            )
        )
    assert server.requests == []  # counted locally
    assert counted == window.tokens(params)


async def test_without_tiktoken_the_openai_count_is_left_to_the_estimate(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken raises ImportError
    monkeypatch.setattr(openai_common, "_encodings", {})
    provider = OpenAIProvider("gpt-4o", api_key="test")
    assert await provider.count_tokens(None, HISTORY, []) is None
    assert openai_common._encodings == {"gpt-4o": None}  # not tried again


def lookup_tool():
    from runtime.tools import tool

    return tool(lookup)


class FailingCount(AnthropicWindow):
    def __call__(self, request):
        if request.path.endswith("/count_tokens"):
            from tests.support.faults import a_error_reply

            return a_error_reply(404, "not_found_error", "no such endpoint")
        return super().__call__(request)


async def test_a_count_that_fails_falls_back_to_the_estimate_and_the_turn_goes_on():
    window = FailingCount(window=WINDOW)
    async with loopback_server(respond=window) as server:
        provider, _ = make("anthropic", server.url)
        resolve_platform(provider)
        agent = Agent(provider=provider, history_processors=[Summarize(max_tokens=100)])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            first = await session.run("question 0: " + "tell me more " * 30)
            second = await session.run("question 2: " + "tell me more " * 30)
        paths = [r.path for r in server.requests]
    assert (first.error, second.error) == (None, None)
    assert "/v1/messages/count_tokens" in paths  # asked, refused, estimated instead
    assert window.summaries == 1  # the estimate put the second turn over 100 tokens


async def test_far_below_its_limit_a_request_is_not_counted_by_the_endpoint():
    window = AnthropicWindow(window=WINDOW)
    async with loopback_server(respond=window) as server:
        provider, _ = make("anthropic", server.url)
        resolve_platform(provider)
        agent = Agent(provider=provider, history_processors=[Summarize(max_tokens=100_000)])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            result = await session.run("question 0: hello")
        paths = [r.path for r in server.requests]
    assert result.error is None
    assert paths == ["/v1/messages"]
