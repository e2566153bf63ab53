"""Attaching an image on the page, in a real browser (Chromium via Playwright, as in
tests/test_web_browser.py, and skipped the same way without them): the paperclip adds it,
the message shows it inline, the server stores it as an Image, and reopening the session
shows it again."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Image, TextPart
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.web.harness import WebServer, web_server


def tiny_png() -> bytes:
    """A valid 1x1 red PNG, so the browser really decodes and lays it out."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


PNG = tiny_png()


def drive(sync_api: Any, server: WebServer) -> dict[str, Any]:
    expect = sync_api.expect
    seen: dict[str, Any] = {"page_errors": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.goto(server.url + "/")
            expect(page.locator("#attach")).to_be_visible()
            page.locator("#file").set_input_files(
                [{"name": "dot.png", "mimeType": "image/png", "buffer": PNG}]
            )
            expect(page.locator("#pending .file-chip")).to_contain_text("dot.png")
            page.locator("#input").fill("What colour is this?")
            page.locator("#input").press("Enter")
            image = page.locator(".msg.user .attachments img")
            expect(image).to_have_attribute("alt", "dot.png")
            expect(page.locator(".msg.user .bubble")).to_have_text("What colour is this?")
            expect(page.locator("#pending")).to_be_hidden()
            expect(page.locator(".msg.assistant .text").last).to_contain_text("red")
            seen["width"] = image.evaluate("(img) => img.naturalWidth")
            seen["session_id"] = page.locator("#session-id").inner_text()
            page.reload()  # the session comes back from the URL, its image too
            restored = page.locator(".msg.user .attachments img")
            expect(restored).to_have_count(1)
            seen["restored_src"] = restored.get_attribute("src")
        finally:
            browser.close()
    return seen


async def test_an_attached_image_is_sent_shown_stored_and_restored(playwright_sync):
    agent = Agent(name="demo", provider=ScriptedProvider([["It is red."]]))
    async with web_server(agent) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive, playwright_sync, server)
        record = await server.host.store.load(seen["session_id"])
    assert seen["page_errors"] == []
    assert seen["width"] == 1  # decoded, not a broken image
    assert record.messages[0].content == (
        TextPart(text="What colour is this?", step=0),
        Image(data=PNG),
    )
    assert seen["restored_src"] == Image(data=PNG).data_url()
