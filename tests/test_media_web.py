"""Attachments through the web app over real HTTP: a ``useChat`` file part becomes a stored
image or file, comes back in ``ui_messages``, and bad or oversized ones are refused with a
JSON error before anything is stored."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from runtime import Agent, File, Image, MediaLimits, TextPart, tool
from runtime.app.web.ui_stream import UIStreamEncoder, ui_messages
from tests.test_web_http import events
from tests.web.harness import web_server

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def body(session_id: str, *parts: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": session_id,
        "messages": [{"id": "u1", "role": "user", "parts": list(parts)}],
        "trigger": "submit-message",
    }


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def file_part(url: str, media_type: str = "image/png", filename: str | None = "a.png") -> dict:
    part = {"type": "file", "mediaType": media_type, "url": url}
    if filename is not None:
        part["filename"] = filename
    return part


async def test_a_usechat_file_part_is_stored_as_an_image_and_comes_back_as_a_file_part():
    agent = Agent(provider=ScriptedProvider([["a square"]]))
    async with web_server(agent) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("w", text("what?"), file_part(PNG_URL)))
            assert r.status_code == 200 and events(r.content)[-1] == "[DONE]"
            stored = server.host.sessions["w"].messages[0]
            assert stored.content == (TextPart(text="what?", step=0), Image(data=PNG))
            r = await client.get("/api/sessions/w")
    assert r.json()["ui_messages"][0]["parts"] == [
        text("what?"),
        {"type": "file", "mediaType": "image/png", "url": PNG_URL},
    ]
    assert r.json()["title"] == "what?"


async def test_an_http_file_url_is_kept_for_the_provider_to_fetch():
    agent = Agent(provider=ScriptedProvider([["ok"]]))
    url = "https://example.com/doc.pdf"
    async with web_server(agent) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post(
                "/api/chat", json=body("u", file_part(url, "application/pdf", "doc.pdf"))
            )
            assert r.status_code == 200
            session = server.host.sessions["u"]
            pdf = File(url=url, media_type="application/pdf", filename="doc.pdf")
            assert session.messages[0].content == (pdf,)
            assert session.meta["title"] == "doc.pdf"


async def test_a_file_part_without_a_media_type_that_is_an_image_is_stored_as_one():
    agent = Agent(provider=ScriptedProvider([["ok"]]))
    async with web_server(agent) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("n", {"type": "file", "url": PNG_URL}))
            assert r.status_code == 200
            assert server.host.sessions["n"].messages[0].content == (Image(data=PNG),)


@pytest.mark.parametrize(
    ("part", "error"),
    [
        (
            file_part("javascript:alert(1)"),
            "must be an http:, https: or data: URL, not javascript:",
        ),
        (file_part("file:///etc/passwd"), "must be an http:, https: or data: URL, not file:"),
        (file_part("data:image/png;base64,@@@"), "the data: URL is not valid base64"),
        ({"type": "file", "mediaType": "image/png"}, "a file part needs a 'url'"),
        (file_part(PNG_URL, "image/jpeg"), "declared image/jpeg but its bytes are image/png"),
    ],
)
async def test_an_unusable_file_part_is_a_400_and_nothing_is_stored(part, error):
    store = MemoryStore()
    agent = Agent(provider=ScriptedProvider([["never"]]))
    async with web_server(agent, store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("bad", text("hi"), part))
    assert r.status_code == 400 and error in r.json()["error"]
    assert "bad" not in server.host.sessions and await store.load("bad") is None


async def test_an_attachment_over_the_media_limit_is_a_413_and_nothing_is_stored():
    store = MemoryStore()
    limits = MediaLimits(image_bytes=10)
    agent = Agent(provider=ScriptedProvider([["never"]]), media_limits=limits)
    async with web_server(agent, store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("big", text("hi"), file_part(PNG_URL)))
            assert r.status_code == 413
            assert r.json() == {
                "error": "image (image/png) is 16 bytes; the limit is 10 bytes per image"
            }
            assert server.host.sessions["big"].messages == ()
    assert await store.load("big") is None


async def test_a_file_part_by_url_is_a_400_and_nothing_is_stored_when_urls_are_off():
    store = MemoryStore()
    limits = MediaLimits(allow_urls=False)
    agent = Agent(provider=ScriptedProvider([["never"]]), media_limits=limits)
    url = "http://169.254.169.254/latest/meta-data/iam.pdf"
    async with web_server(agent, store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post(
                "/api/chat", json=body("ssrf", text("hi"), file_part(url, "application/pdf"))
            )
            assert r.status_code == 400
            assert r.json()["error"].startswith(
                "file 'a.png' is given by URL (http://169.254.169.254/latest/meta-data/iam.pdf)"
            )
            assert server.host.sessions["ssrf"].messages == ()
    assert await store.load("ssrf") is None


@tool
async def snap() -> Image:
    """Take a picture."""
    return Image(data=PNG)


async def test_a_tool_image_streams_and_restores_as_ui_file_parts():
    steps = [tool_call("snap", {}, tool_call_id="c1"), ["done"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[snap])
    async with web_server(agent) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("t", text("snap")))
            restored = ui_messages(server.host.sessions["t"].messages)[1]["parts"]
    [streamed] = [
        e for e in events(r.content) if e != "[DONE]" and e["type"] == "tool-output-available"
    ]
    expected = [{"type": "file", "mediaType": "image/png", "url": PNG_URL}]
    assert streamed["output"] == expected
    assert [p.get("output") for p in restored if p["type"] == "tool-snap"] == [expected]


def test_the_encoder_never_writes_an_image_repr():
    from runtime.output import ToolResult

    chunk = ToolResult(step=0, tool_call_id="c", tool_name="snap", output=(Image(data=PNG),))
    assert b"Image(" not in UIStreamEncoder().events(chunk)
