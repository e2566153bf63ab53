"""Images and files through the real SDK clients on the loopback server: the request body
carries them in each provider's block shape, the next turn (and a reloaded session)
restores them again, tool results carry images where the API allows, and a type a
provider cannot take is refused before any request is sent."""

from __future__ import annotations

import base64

from actors.providers import AnthropicProvider, GeminiProvider, OpenAIProvider
from runtime import Agent, File, Host, Image, tool
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
)
from tests.test_provider_e2e import (
    an_text,
    an_tool,
    gm_answer,
    gm_body,
    gm_chunk,
    oa_answer,
    oa_tool_step,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
PDF = b"%PDF-1.7\n%%EOF"
B64_PNG = base64.b64encode(PNG).decode()
B64_PDF = base64.b64encode(PDF).decode()
CAT = "https://example.com/cat.jpg"


@tool
async def lookup(key: str) -> list:
    """Look a key up (returns a chart)."""
    return [f"chart for {key}", Image(data=PNG)]  # type: ignore[return-value]


def openai_agent(server, **kw) -> Agent:
    return Agent(provider=OpenAIProvider("m", base_url=server.url + "/v1", api_key="test"), **kw)


def anthropic_agent(server, **kw) -> Agent:
    provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key="test")
    return Agent(provider=provider, **kw)


def an_answer(text: str) -> bytes:
    return anthropic_sse(anthropic_start(), *an_text(0, text), *anthropic_end("end_turn"))


# -- OpenAI ---------------------------------------------------------------------------------

OPENAI_USER = {
    "role": "user",
    "content": [
        {"type": "text", "text": "what are these?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64_PNG}"}},
        {"type": "image_url", "image_url": {"url": CAT}},
        {
            "type": "file",
            "file": {
                "file_data": f"data:application/pdf;base64,{B64_PDF}",
                "filename": "report.pdf",
            },
        },
    ],
}
INPUT = ["what are these?", Image(data=PNG), Image(url=CAT), File(data=PDF, filename="report.pdf")]


async def bodies_across_a_reload(tmp_path, make_agent, session_id: str, *answers: bytes) -> list:
    """Three turns of one session (the media input, then two plain ones), the third after
    the session is reloaded from SQLite: the JSON body of each request the server got."""
    path = str(tmp_path / "s.db")
    async with loopback_server(*[Reply(body=a) for a in answers]) as server:
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(make_agent(server), session_id=session_id)
            await session.run(INPUT)
            await session.run("sure?")
        async with Host.open(store=path, log_tap=False) as host:  # reloaded from SQLite
            session = await host.open_session(make_agent(server), session_id=session_id)
            await session.run("and now?")
    return [r.json() for r in server.requests]


async def refusal(make_agent, answer: bytes, content: list):
    """One streamed turn of ``content`` that the provider should refuse before any request:
    its chunks, the server (to see no request came) and the session."""
    async with loopback_server(Reply(body=answer)) as server:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(make_agent(server))
            async with session.stream(content) as out:
                chunks = [c async for c in out]
    return chunks, server, session


async def test_openai_request_carries_image_and_file_blocks_and_restores_them(tmp_path):
    bodies = await bodies_across_a_reload(
        tmp_path, openai_agent, "oa", oa_answer("a chart"), oa_answer("yes"), oa_answer("ok")
    )
    first, second, third = (b["messages"] for b in bodies)
    assert first == [OPENAI_USER]
    assert second[0] == OPENAI_USER and third[0] == OPENAI_USER


async def test_openai_tool_result_image_becomes_a_text_placeholder():
    async with loopback_server(
        Reply(body=oa_tool_step("", "call_A", "sales")), Reply(body=oa_answer("done"))
    ) as server:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(openai_agent(server, tools=[lookup]))
            await session.run("chart?")
    tool_message = server.requests[1].json()["messages"][-1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call_A",
        "content": "chart for sales\n[image image/png omitted: Chat Completions tool results "
        "cannot carry images or files]",
    }


async def test_openai_refuses_a_text_file_before_any_request():
    chunks, server, session = await refusal(
        openai_agent, oa_answer("never"), ["read", File(data=b"notes", filename="n.txt")]
    )
    error = chunks[-1].error
    assert (error.kind, error.retryable) == ("UnsupportedMedia", False)
    assert error.message == (
        "OpenAI Chat Completions cannot take text/plain files (only application/pdf)"
    )
    assert server.requests == []
    assert session.messages[0].media[0].filename == "n.txt"  # the input is kept


# -- Anthropic ------------------------------------------------------------------------------

ANTHROPIC_USER = {
    "role": "user",
    "content": [
        {"type": "text", "text": "what are these?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64_PNG}},
        {"type": "image", "source": {"type": "url", "url": CAT}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": B64_PDF},
            "title": "report.pdf",
        },
    ],
}


async def test_anthropic_request_carries_image_and_document_blocks_and_restores_them(tmp_path):
    bodies = await bodies_across_a_reload(
        tmp_path, anthropic_agent, "an", an_answer("a chart"), an_answer("yes"), an_answer("k")
    )
    first, second, third = (b["messages"] for b in bodies)
    assert first == [ANTHROPIC_USER]
    assert second[0] == ANTHROPIC_USER and third[0] == ANTHROPIC_USER


async def test_anthropic_text_file_is_a_text_document():
    async with loopback_server(Reply(body=an_answer("ok"))) as server:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(anthropic_agent(server))
            await session.run([File(data="héllo".encode(), filename="n.txt")])
    assert server.requests[0].json()["messages"][0]["content"] == [
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "héllo"},
            "title": "n.txt",
        }
    ]


async def test_anthropic_tool_result_carries_the_image_block():
    step1 = anthropic_sse(
        anthropic_start(), *an_tool(0, "toolu_A", "sales"), *anthropic_end("tool_use")
    )
    async with loopback_server(Reply(body=step1), Reply(body=an_answer("done"))) as server:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(anthropic_agent(server, tools=[lookup]))
            await session.run("chart?")
    results = server.requests[1].json()["messages"][-1]
    assert results == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_A",
                "content": [
                    {"type": "text", "text": "chart for sales"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": B64_PNG},
                    },
                ],
            }
        ],
    }


async def test_anthropic_refuses_an_image_format_it_cannot_take_before_any_request():
    bmp = b"BM" + b"\x00" * 30
    chunks, server, _ = await refusal(anthropic_agent, an_answer("never"), [Image(data=bmp)])
    assert chunks[-1].error.kind == "UnsupportedMedia"
    assert chunks[-1].error.message.startswith("Anthropic cannot take image/bmp images")
    assert server.requests == []


# -- Gemini ---------------------------------------------------------------------------------

GEMINI_USER = {  # as the SDK writes it: the Part's keys camelCase, a Blob's as named
    "parts": [
        {"text": "what are these?"},
        {"inlineData": {"data": base64.urlsafe_b64encode(PNG).decode(), "mime_type": "image/png"}},
        {"fileData": {"file_uri": CAT, "mime_type": "image/jpeg"}},
        {
            "inlineData": {
                "data": base64.urlsafe_b64encode(PDF).decode(),
                "mime_type": "application/pdf",
            }
        },
    ],
    "role": "user",
}


def gemini_agent(server, **kw) -> Agent:
    provider = GeminiProvider("gemini-2.5-flash", base_url=server.url, api_key="test")
    return Agent(provider=provider, **kw)


async def test_gemini_request_carries_inline_and_file_data_and_restores_them(tmp_path):
    bodies = await bodies_across_a_reload(
        tmp_path, gemini_agent, "gm", gm_answer("a chart"), gm_answer("yes"), gm_answer("k")
    )
    first, second, third = (b["contents"] for b in bodies)
    assert first == [GEMINI_USER]
    assert second[0] == GEMINI_USER and third[0] == GEMINI_USER


async def test_gemini_tool_result_image_becomes_a_text_placeholder():
    step1 = gm_body(
        gm_chunk([{"functionCall": {"name": "lookup", "args": {"key": "sales"}}}], "STOP")
    )
    async with loopback_server(Reply(body=step1), Reply(body=gm_answer("done"))) as server:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(gemini_agent(server, tools=[lookup]))
            await session.run("chart?")
    response = server.requests[1].json()["contents"][-1]["parts"][0]["functionResponse"]
    assert response["response"] == {
        "output": "chart for sales\n[image image/png omitted: function responses carry text only]"
    }


async def test_gemini_refuses_an_image_format_it_cannot_take_before_any_request():
    gif = b"GIF89a" + b"\x00" * 10
    chunks, server, _ = await refusal(gemini_agent, gm_answer("never"), [Image(data=gif)])
    assert chunks[-1].error.kind == "UnsupportedMedia"
    assert chunks[-1].error.message.startswith("Gemini cannot take image/gif images")
    assert server.requests == []
