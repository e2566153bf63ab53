"""The providers read the SDK's server-sent events as JSON dicts, not as pydantic models.

Building a model per chunk was most of a stream's client-side cost (issue 14); the
request, status errors, SSE decoding and transport errors stay the SDK's. These tests pin
that the installed SDKs still offer that path (an upgrade that removes it fails here
instead of silently slowing every stream down) and what the path does at its edges.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.anthropic import AnthropicProvider, json_events
from actors.providers.openai import OpenAIProvider, json_chunks
from runtime.chunks import TextChunk
from runtime.errors import MalformedStream
from tests.support.faults import a_body, a_end, a_start, a_text, a_text_answer, oa_text
from tests.support.loopback import Reply, loopback_server
from tests.test_provider_anthropic import make_request as anthropic_request
from tests.test_provider_openai import make_request as openai_request

KEY = "sk-test-not-a-real-key"


async def test_openai_sdk_stream_is_read_as_plain_dicts():
    async with loopback_server(Reply(body=oa_text("Hi", " there"))) as server:
        provider = OpenAIProvider("gpt-4o-mini", base_url=server.url + "/v1", api_key=KEY)
        client = provider._get_client()
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async with stream:
            chunks = [c async for c in json_chunks(stream)]
        await provider.aclose()
    assert {type(c) for c in chunks} == {dict}
    assert [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]] == [
        "",
        "Hi",
        " there",
        None,
    ]


async def test_anthropic_sdk_stream_is_read_as_plain_dicts():
    async with loopback_server(Reply(body=a_text_answer("Hi"))) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key=KEY)
        client = provider._get_client()
        stream = await client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        events = [e async for e in json_events(stream)]
        await stream.close()
        await provider.aclose()
    assert {type(e) for e in events} == {dict}
    assert events[0]["type"] == "message_start"
    assert events[-1]["type"] == "message_stop"


async def _openai_text(body: bytes, **reply: Any) -> str:
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)

    async with loopback_server(Reply(body=body, **reply)) as server:
        provider = OpenAIProvider("gpt-4o-mini", base_url=server.url + "/v1", api_key=KEY)
        with trio.fail_after(20):
            await provider.stream(openai_request(), emit)
        await provider.aclose()
    return "".join(c.text for c in chunks if isinstance(c, TextChunk))


async def test_openai_data_after_done_is_not_read_as_chunks():
    late = b'data: {"choices":[{"index":0,"delta":{"content":"late"}}]}\n\n'
    assert await _openai_text(oa_text("Hi") + late) == "Hi"


async def test_openai_body_held_open_after_done_still_ends_the_call():
    # A server that keeps the body open after [DONE]: read briefly, then the call ends.
    body = oa_text("Hi")
    assert await _openai_text(body, stall=60.0, stall_after=len(body)) == "Hi"


async def test_anthropic_event_whose_data_is_not_an_object_is_malformed():
    body = (
        a_body(a_start(), a_text(0, "Hi", stop=False)) + b"event: content_block_stop\ndata: 3\n\n"
    )
    body += a_body(a_end())
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)

    async with loopback_server(Reply(body=body)) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key=KEY)
        with pytest.raises(MalformedStream, match="not a JSON object"):
            await provider.stream(anthropic_request(), emit)
        await provider.aclose()
    assert [c.text for c in chunks if isinstance(c, TextChunk)] == ["Hi"]  # kept


async def test_a_stream_without_the_sdk_event_iterator_is_read_as_it_is():
    async def events():
        yield {"type": "ping"}

    assert [e async for e in json_events(events())] == [{"type": "ping"}]
    assert [c async for c in json_chunks(events())] == [{"type": "ping"}]
