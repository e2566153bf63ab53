"""Reasoning goes back only to the provider, model and endpoint that produced it.

An Anthropic thinking signature is bound to the model that minted it and to the server
that did; OpenAI's ``encrypted_content`` to its organization. The loopback servers of
:mod:`tests.support.signing` refuse anything else with the API's 400, so a session moved
between models or base URLs fails its next turn unless restoration drops (or, opted in,
rewrites as text) the reasoning that may not go back.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers import (
    AnthropicBedrockProvider,
    AnthropicProvider,
    AnthropicVertexProvider,
    GeminiProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
    anthropic,
    openai,
    openai_responses,
)
from actors.stores import MemoryStore
from actors.turn.parts import PartsManager
from runtime import Agent, Host
from runtime.chunks import ProviderDataChunk, ReasoningChunk, ToolCallChunk
from runtime.errors import ConfigurationError
from runtime.history import Origin, endpoint_of, replays_to
from runtime.messages import (
    AssistantMessage,
    Message,
    ProviderDataPart,
    ReasoningPart,
    TextPart,
    ToolMessage,
    UserMessage,
)
from runtime.serde import structure
from runtime.testing.providers import request as kit_request
from tests.support.loopback import loopback_server
from tests.support.signing import SealingResponses, SigningAnthropic, SigningGemini


def claude(model: str, url: str, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider(
        model, base_url=url, api_key="test", thinking_budget=1024, max_tokens=2048, **kw
    )


async def turns(store: MemoryStore, *moves: tuple[Any, str]) -> list[Any]:
    """Run one turn of session ``s1`` per ``(provider, input)``, each in a session
    opened with that provider: the session moves from one to the next."""
    results = []
    async with Host.open(store=store, log_tap=False) as host:
        for provider, text in moves:
            session = await host.open_session(Agent(provider=provider), session_id="s1")
            results.append(await session.run(text))
            await host.close_session(session)
    return results


def thinking_sent(request: Any) -> list[str]:
    """The signatures of the thinking blocks a recorded Anthropic request replays."""
    return [
        block["signature"]
        for message in request.json()["messages"]
        if message["role"] == "assistant"
        for block in message["content"]
        if block["type"] == "thinking"
    ]


# -- Anthropic: signatures bound to their model and server -------------------------------------


async def test_a_session_moved_to_another_model_drops_the_signature_and_its_turn_succeeds():
    signer = SigningAnthropic()
    async with loopback_server(respond=signer) as server:
        first, second = await turns(
            MemoryStore(),
            (claude("claude-a", server.url), "one"),
            (claude("claude-b", server.url), "two"),
        )
    assert signer.refused == []
    assert (first.error, second.error) == (None, None)
    assert second.message.text == "answer 2"
    assert thinking_sent(server.requests[1]) == []


async def test_back_on_the_first_model_its_signature_is_sent_again():
    signer = SigningAnthropic()
    async with loopback_server(respond=signer) as server:
        results = await turns(
            MemoryStore(),
            (claude("claude-a", server.url), "one"),
            (claude("claude-b", server.url), "two"),
            (claude("claude-a", server.url), "three"),
        )
    assert [r.error for r in results] == [None, None, None]
    assert thinking_sent(server.requests[2]) == ["sig:claude-a:1"]


async def test_a_session_moved_to_another_base_url_drops_the_signature_and_succeeds():
    here, there = SigningAnthropic(), SigningAnthropic()
    async with (
        loopback_server(respond=here) as first,
        loopback_server(respond=there) as second,
    ):
        results = await turns(
            MemoryStore(),
            (claude("claude-a", first.url), "one"),
            (claude("claude-a", second.url), "two"),
            (claude("claude-a", first.url), "three"),
        )
    assert [r.error for r in results] == [None, None, None]
    assert (here.refused, there.refused) == ([], [])
    assert thinking_sent(second.requests[0]) == []
    assert thinking_sent(first.requests[1]) == ["sig:claude-a:1"]


def old_session(signature: str) -> list[Message]:
    """A history stored before parts recorded their model and endpoint."""
    thinking = ReasoningPart(text="plan", signature=signature, step=0, provider="anthropic")
    text = TextPart(text="hi", step=0)
    return [UserMessage(content="one"), AssistantMessage(content=(thinking, text))]


async def test_an_old_untagged_signature_goes_back_to_its_provider_as_before():
    signer = SigningAnthropic(minted={"sig:claude-a:0": "claude-a"})
    store = MemoryStore()
    await store.save("s1", 0, old_session("sig:claude-a:0"))
    async with loopback_server(respond=signer) as server:
        same, other = await turns(
            store,
            (claude("claude-a", server.url), "two"),
            (claude("claude-b", server.url), "three"),
        )
    assert same.error is None
    assert thinking_sent(server.requests[0]) == ["sig:claude-a:0"]
    # the documented price of keeping old reasoning: the server of another model refuses it
    assert other.error.kind == "BadRequest"
    assert signer.refused == ["sig:claude-a:0"]


async def test_the_stored_parts_record_the_model_and_endpoint():
    async with loopback_server(respond=SigningAnthropic()) as server:
        store = MemoryStore()
        await turns(store, (claude("claude-a", server.url + "/"), "one"))
    record = await store.load("s1")
    thinking = record.messages[1].content[0]
    assert (thinking.provider, thinking.model, thinking.endpoint) == (
        "anthropic",
        "claude-a",
        server.url,
    )


async def test_foreign_reasoning_as_text_sends_the_other_models_thinking_as_text():
    async with loopback_server(respond=SigningAnthropic()) as server:
        results = await turns(
            MemoryStore(),
            (claude("claude-a", server.url), "one"),
            (claude("claude-b", server.url, foreign_reasoning="text"), "two"),
        )
    assert results[1].error is None
    assistant = server.requests[1].json()["messages"][1]
    assert assistant["content"] == [
        {"type": "text", "text": "<think>thought 1</think>"},
        {"type": "text", "text": "answer 1"},
    ]


def test_an_unknown_foreign_reasoning_mode_is_refused():
    with pytest.raises(ConfigurationError, match="foreign_reasoning must be one of drop, text"):
        AnthropicProvider("m", foreign_reasoning="keep")


def test_provider_data_of_another_endpoint_is_not_sent_back():
    data = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    tagged = tuple(
        ProviderDataPart(
            provider="anthropic", data=d, step=0, model="m", endpoint="https://a.example"
        )
        for d in (data, result)
    )
    history = [UserMessage(content="go"), AssistantMessage(content=tagged)]
    here = Origin(provider="anthropic", model="m", endpoint="https://a.example")
    elsewhere = Origin(provider="anthropic", model="m", endpoint="https://b.example")
    sent = anthropic.map_messages(None, history, origin=here)[1][1]["content"]
    assert sent == [data, result]
    assert len(anthropic.map_messages(None, history, origin=elsewhere)[1]) == 1  # user only


# -- OpenAI Responses: encrypted reasoning bound to its endpoint -------------------------------


def responses(url: str, **kw: Any) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key="test", **kw)


def reasoning_sent(request: Any) -> list[str]:
    return [i["encrypted_content"] for i in request.json()["input"] if i.get("type") == "reasoning"]


async def test_encrypted_reasoning_is_not_sent_to_another_endpoint():
    here, there = SealingResponses("here"), SealingResponses("there")
    async with (
        loopback_server(respond=here) as first,
        loopback_server(respond=there) as second,
    ):
        results = await turns(
            MemoryStore(),
            (responses(first.url), "one"),
            (responses(second.url), "two"),
            (responses(first.url), "three"),
        )
    assert [r.error for r in results] == [None, None, None]
    assert (here.refused, there.refused) == ([], [])
    assert reasoning_sent(second.requests[0]) == []
    assert reasoning_sent(first.requests[1]) == ["enc:here:1"]


def test_responses_sends_foreign_reasoning_as_assistant_text_when_asked():
    history = [
        UserMessage(content="Hi"),
        AssistantMessage(
            content=(
                ReasoningPart(text="Claude's plan", signature="sig", step=0, provider="anthropic"),
                TextPart(text="Hello!", step=0),
            )
        ),
    ]
    target = Origin(provider="openai-responses", model="gpt-5-mini")
    assert openai_responses.map_messages(history, origin=target)[1] == {
        "role": "assistant",
        "content": "Hello!",
    }
    mapped = openai_responses.map_messages(history, origin=target, foreign_reasoning="text")
    assert mapped[1] == {"role": "assistant", "content": "<think>Claude's plan</think>Hello!"}


# -- Chat Completions: reasoning_content only for the same server ------------------------------


def test_chat_reasoning_content_goes_only_to_the_server_that_produced_it():
    deepseek = "https://api.deepseek.com"
    history = [
        UserMessage(content="Hi"),
        AssistantMessage(
            content=(
                ReasoningPart(
                    text="Think.", step=0, provider="openai", model="m", endpoint=deepseek
                ),
                TextPart(text="Hello!", step=0),
            )
        ),
    ]
    same = Origin(provider="openai", model="m", endpoint=deepseek)
    other = Origin(provider="openai", model="m", endpoint="http://localhost:8000/v1")
    sent = openai.map_messages(None, history, send_reasoning_content=True, origin=same)
    assert sent[1]["reasoning_content"] == "Think."
    sent = openai.map_messages(None, history, send_reasoning_content=True, origin=other)
    assert "reasoning_content" not in sent[1]


def test_chat_foreign_reasoning_as_text_goes_in_the_content():
    history = [
        UserMessage(content="Hi"),
        AssistantMessage(
            content=(
                ReasoningPart(text="Plan.", signature="s", step=0, provider="anthropic"),
                TextPart(text="Hello!", step=0),
            )
        ),
    ]
    sent = openai.map_messages(None, history, foreign_reasoning="text")
    assert sent[1]["content"] == "<think>Plan.</think>Hello!"


def test_the_chat_provider_records_its_endpoint_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example/v1/")
    assert OpenAIProvider("m").origin == Origin(
        provider="openai", model="m", endpoint="https://proxy.example/v1"
    )
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert OpenAIProvider("m").origin.endpoint == "https://api.openai.com/v1"


# -- what is recorded, and what an old stored part means ---------------------------------------


def test_endpoint_of_keeps_scheme_host_port_and_path_only():
    url = "HTTPS://user:secret@API.Example.com:443/v1/?key=k#frag"
    assert endpoint_of(url) == "https://api.example.com/v1"
    assert endpoint_of("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"


def test_parts_of_the_calling_providers_tag_record_its_model_and_endpoint():
    parts = PartsManager()
    parts.origin = Origin(provider="anthropic", model="claude-a", endpoint="https://a.example")
    parts.reasoning(ReasoningChunk(text="t", signature="s", provider="anthropic"), [])
    parts.reasoning(ReasoningChunk(text="u", signature="s", provider="other"), [])
    parts.provider_data(ProviderDataChunk(provider="anthropic", data={}), [])
    own, other, data = parts.content
    assert (own.model, own.endpoint) == ("claude-a", "https://a.example")
    assert (other.model, other.endpoint) == (None, None)  # not this provider's: unrecorded
    assert (data.model, data.endpoint) == ("claude-a", "https://a.example")


OLD_STORED = {
    "role": "assistant",
    "id": "msg_old",
    "interrupted": False,
    "content": [
        {
            "type": "reasoning",
            "text": "plan",
            "step": 0,
            "signature": "sig-old",
            "redacted_data": None,
            "provider": "anthropic",
        },
        {"type": "text", "text": "hi", "step": 0, "refusal": False},
    ],
}


def test_a_part_stored_before_models_were_recorded_loads_untagged():
    message = structure(OLD_STORED, Message)
    part = message.content[0]
    assert (part.provider, part.model, part.endpoint) == ("anthropic", None, None)


def test_an_untagged_part_still_replays_to_its_provider_whatever_the_model():
    old = structure(OLD_STORED, Message).content[0]
    assert replays_to(old, Origin(provider="anthropic", model="any", endpoint="https://x"))
    assert not replays_to(old, Origin(provider="openai-responses", model="any"))


# -- Gemini: thought signatures bound to their model and server --------------------------------


def gemini(model: str, url: str, **kw: Any) -> GeminiProvider:
    return GeminiProvider(model, base_url=url, api_key="test", **kw)


def signatures_sent(request: Any) -> list[str]:
    return [
        part["thoughtSignature"]
        for content in request.json()["contents"]
        for part in content["parts"]
        if "thoughtSignature" in part
    ]


async def test_a_gemini_session_moved_to_another_model_drops_its_signatures_and_succeeds():
    signer = SigningGemini()
    async with loopback_server(respond=signer) as server:
        results = await turns(
            MemoryStore(),
            (gemini("gemini-2.5-flash", server.url), "one"),
            (gemini("gemini-2.5-pro", server.url), "two"),
            (gemini("gemini-2.5-flash", server.url), "three"),
        )
    assert [r.error for r in results] == [None, None, None]
    assert signer.refused == []
    assert signatures_sent(server.requests[1]) == []
    assert len(signatures_sent(server.requests[2])) == 2  # back home: thought and text signed


async def test_a_gemini_session_moved_to_another_base_url_drops_its_signatures():
    here, there = SigningGemini(), SigningGemini()
    async with (
        loopback_server(respond=here) as first,
        loopback_server(respond=there) as second,
    ):
        results = await turns(
            MemoryStore(),
            (gemini("gemini-2.5-flash", first.url), "one"),
            (gemini("gemini-2.5-flash", second.url), "two"),
        )
    assert [r.error for r in results] == [None, None]
    assert (here.refused, there.refused) == ([], [])
    assert signatures_sent(second.requests[0]) == []


async def test_gemini_parts_record_their_model_and_endpoint():
    async with loopback_server(respond=SigningGemini()) as server:
        store = MemoryStore()
        await turns(store, (gemini("gemini-2.5-flash", server.url), "one"))
    record = await store.load("s1")
    thought, text, signed = record.messages[1].content
    assert (thought.provider, thought.model, thought.endpoint) == (
        "google",
        "gemini-2.5-flash",
        server.url,
    )
    assert text.text == "answer 1"
    assert (signed.provider, signed.model, signed.data["of"]) == (
        "google",
        "gemini-2.5-flash",
        "text",
    )


async def test_a_gemini_3_turn_continued_from_another_models_call_signs_it_with_the_sentinel():
    """A step whose call another model made (a turn moved mid-way) has no signature that
    may go back: Gemini 3 refuses an unsigned current-turn call, so the sentinel goes."""
    signer = SigningGemini(calls=1)
    async with loopback_server(respond=signer) as server:
        older = gemini("gemini-2.5-flash", server.url)
        chunks: list[Any] = []

        async def emit(chunk: Any) -> None:
            chunks.append(chunk)

        user = UserMessage(content="look it up")
        await older.stream(kit_request((user,)), emit)
        parts = PartsManager()
        parts.origin = older.origin
        for chunk in chunks:
            if isinstance(chunk, ReasoningChunk):
                parts.reasoning(chunk, [])
            elif isinstance(chunk, ToolCallChunk):
                parts.tool_call(chunk, [])
            elif isinstance(chunk, ProviderDataChunk):
                parts.provider_data(chunk, [])
        parts.close([])
        call = next(p for p in parts.content if p.type == "tool-call")
        history = (
            user,
            AssistantMessage(content=tuple(parts.content)),
            ToolMessage(
                tool_call_id=call.tool_call_id, tool_name="lookup", output="value-1", step=0
            ),
        )
        newer = gemini("gemini-3-pro-preview", server.url)
        answer: list[Any] = []

        async def keep(chunk: Any) -> None:
            answer.append(chunk)

        await newer.stream(kit_request(history), keep)
        await older.aclose()
        await newer.aclose()
    assert signer.refused == []
    sent = server.requests[1].json()["contents"][1]["parts"]
    assert [p.get("thoughtSignature") for p in sent] == ["skip_thought_signature_validator"]
    assert "".join(c.text for c in answer if hasattr(c, "text") and c.type == "text") == (
        "answer 2"
    )


# -- Claude on Vertex and Bedrock: one platform's signature is not another's ------------------


async def test_a_session_moved_from_anthropic_to_vertex_and_back_keeps_each_platforms_thinking():
    first_party, on_vertex = SigningAnthropic(), SigningAnthropic()
    async with (
        loopback_server(respond=first_party) as first,
        loopback_server(respond=on_vertex) as second,
    ):
        vertex = AnthropicVertexProvider(
            "claude-a",
            base_url=second.url,
            region="us-east5",
            project_id="p",
            access_token="test",
            thinking_budget=1024,
            max_tokens=2048,
        )
        results = await turns(
            MemoryStore(),
            (claude("claude-a", first.url), "one"),
            (vertex, "two"),
            (claude("claude-a", first.url), "three"),
        )
    assert [r.error for r in results] == [None, None, None]
    assert (first_party.refused, on_vertex.refused) == ([], [])
    assert thinking_sent(second.requests[0]) == []
    assert thinking_sent(first.requests[1]) == ["sig:claude-a:1"]


async def test_bedrock_replays_its_own_thinking_and_drops_first_party_thinking():
    first_party, on_bedrock = SigningAnthropic(), SigningAnthropic(framing="bedrock")
    async with (
        loopback_server(respond=first_party) as first,
        loopback_server(respond=on_bedrock) as second,
    ):

        def bedrock() -> AnthropicBedrockProvider:
            return AnthropicBedrockProvider(
                "claude-a",
                base_url=second.url,
                region="us-east-1",
                api_key="test",
                thinking_budget=1024,
                max_tokens=2048,
            )

        results = await turns(
            MemoryStore(),
            (claude("claude-a", first.url), "one"),
            (bedrock(), "two"),
            (bedrock(), "three"),
        )
    assert [r.error for r in results] == [None, None, None]
    assert (first_party.refused, on_bedrock.refused) == ([], [])
    assert thinking_sent(second.requests[0]) == []
    assert thinking_sent(second.requests[1]) == ["sig:claude-a:1"]
