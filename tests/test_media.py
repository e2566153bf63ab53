"""Images and files as values, in ``session.stream`` input, under size limits, and returned
by tools: checked before anything is stored, stored as parts, reloaded equal."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from runtime import (
    Agent,
    File,
    Host,
    Image,
    InvalidMedia,
    MediaLimits,
    MediaTooLarge,
    TextPart,
    ToolMessage,
    UserMessage,
    tool,
)
from runtime.app.demo import demo_agent
from runtime.media import user_content

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 16
PDF = b"%PDF-1.7\n%..."


# -- the values ----------------------------------------------------------------------------


def test_image_media_type_is_sniffed_from_its_bytes():
    assert Image(data=JPEG).media_type == "image/jpeg"


def test_image_whose_bytes_contradict_its_media_type_is_refused():
    with pytest.raises(InvalidMedia, match="declared image/png but its bytes are image/jpeg"):
        Image(data=JPEG, media_type="image/png")


def test_image_bytes_that_are_no_image_are_refused():
    with pytest.raises(InvalidMedia, match="could not tell the media type"):
        Image(data=b"just some text")


def test_file_of_pdf_bytes_is_application_pdf():
    assert File(data=PDF).media_type == "application/pdf"


def test_text_declared_text_is_kept_whatever_letters_it_starts_with():
    # Hypothesis found it: "BM" is a bitmap's whole signature. Declared text that is text
    # (UTF-8, no NUL) is text; providers take it as such.
    assert File(data=b"BMW service notes", media_type="text/plain").media_type == "text/plain"


def test_binary_bytes_declared_text_are_still_refused():
    with pytest.raises(InvalidMedia, match="declared text/plain but its bytes are image/jpeg"):
        File(data=JPEG, media_type="text/plain")


def test_file_of_utf8_text_without_a_name_is_text_plain():
    assert File(data="héllo".encode()).media_type == "text/plain"


def test_file_type_comes_from_its_filename_when_the_bytes_do_not_say():
    assert File(data=b"a,b\n1,2\n", filename="t.csv").media_type == "text/csv"


def test_data_url_is_decoded_into_bytes_and_type():
    image = Image(url="data:image/png;base64," + base64.b64encode(PNG).decode())
    assert (image.data, image.url, image.media_type) == (PNG, None, "image/png")


def test_http_url_is_kept_and_typed_from_its_extension():
    image = Image(url="https://example.com/cat.jpg")
    assert (image.url, image.data, image.media_type) == (
        "https://example.com/cat.jpg",
        None,
        "image/jpeg",
    )


@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "file:///etc/passwd", "ftp://x/a.png", "/local/a.png"]
)
def test_urls_other_than_http_https_data_are_refused(url):
    with pytest.raises(InvalidMedia, match="must be an http:, https: or data: URL"):
        Image(url=url, media_type="image/png")


def test_image_needs_exactly_one_of_data_and_url():
    with pytest.raises(InvalidMedia, match="exactly one of data"):
        Image(data=PNG, url="https://example.com/a.png")
    with pytest.raises(InvalidMedia, match="exactly one of data"):
        Image()


def test_an_image_must_have_an_image_media_type():
    with pytest.raises(InvalidMedia, match="image/\\* media type, not application/pdf"):
        Image(url="https://example.com/x", media_type="application/pdf")


def test_repr_shows_the_size_not_the_bytes():
    assert "<24 bytes>" in repr(Image(data=PNG)) and "\\x89" not in repr(Image(data=PNG))


@given(st.binary(max_size=64))
def test_any_bytes_either_make_an_image_or_raise_invalid_media(data):
    try:
        image = Image(data=data)
    except InvalidMedia:
        return
    assert image.media_type.startswith("image/")


# -- user input ----------------------------------------------------------------------------


def test_text_input_stays_a_plain_string():
    assert user_content("hi") == "hi"


def test_a_list_becomes_parts_with_text_at_step_zero():
    image = Image(data=PNG)
    assert user_content(["look:", image, ""]) == (TextPart(text="look:", step=0), image)


@pytest.mark.parametrize("bad", [42, b"raw bytes", [1], {"type": "image"}, []])
def test_input_that_is_not_text_or_parts_is_refused(bad):
    with pytest.raises(InvalidMedia):
        user_content(bad)


async def test_a_turn_with_an_image_stores_it_as_a_part():
    image = Image(data=PNG)
    agent = Agent(provider=ScriptedProvider([["a red square"]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="m")
        result = await session.run(["What is this?", image])
    assert result.text == "a red square"
    user = session.messages[0]
    assert user.content == (TextPart(text="What is this?", step=0), image)
    assert user.text == "What is this?" and user.media == (image,)


async def test_a_turn_with_media_reloads_equal_from_sqlite(tmp_path):
    path = str(tmp_path / "s.db")
    agent = Agent(provider=ScriptedProvider([["ok"]]))
    content = ["read these", Image(data=PNG), File(data=PDF, filename="a.pdf")]
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="m")
        await session.run(content)
        before = session.messages
    async with Host.open(store=path, log_tap=False) as host:
        again = await host.open_session(agent, session_id="m")
        assert again.messages == before
        assert isinstance(again.messages[0].content[1], Image)


async def test_the_offline_demo_answers_an_input_with_an_image():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(demo_agent(), session_id="demo")
        result = await session.run(["What is the time?", Image(data=PNG)])
    assert result.finish_reason == "stop"


# -- size limits ---------------------------------------------------------------------------

SMALL = MediaLimits(image_bytes=30, file_bytes=40, message_bytes=50)


async def _stream_and_expect(content, match):
    store = MemoryStore()
    agent = Agent(provider=ScriptedProvider([["never"]]), media_limits=SMALL)
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="big")
        with pytest.raises(MediaTooLarge, match=match) as info:
            session.stream(content)
        assert session.messages == ()  # nothing in memory...
        assert await store.load("big") is None  # ...and nothing stored
        # the session is still usable
        assert (await session.run("hi")).text == "never"
    return info.value


async def test_an_image_over_its_limit_is_refused_before_anything_is_stored():
    error = await _stream_and_expect(
        ["see", Image(data=PNG + b"\x00" * 10)], r"image \(image/png\) is 34 bytes; the limit"
    )
    assert (error.size, error.limit) == (34, 30)


async def test_a_file_over_its_limit_names_the_file():
    await _stream_and_expect(
        [File(data=b"x" * 41, filename="big.txt")], "file 'big.txt' is 41 bytes; the limit is 40"
    )


async def test_media_that_fit_one_by_one_can_exceed_the_message_limit():
    await _stream_and_expect(
        [Image(data=PNG), File(data=b"x" * 30, filename="a.txt")],
        "54 bytes together; the limit is 50 bytes per message",
    )


async def test_a_url_image_counts_nothing_against_the_limits():
    agent = Agent(provider=ScriptedProvider([["ok"]]), media_limits=SMALL)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="u")
        result = await session.run([Image(url="https://example.com/huge.png")])
    assert result.text == "ok"


async def test_media_by_url_is_refused_before_anything_is_stored_when_urls_are_off():
    store = MemoryStore()
    agent = Agent(
        provider=ScriptedProvider([["never"]]),
        media_limits=MediaLimits(allow_urls=False),
    )
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="u")
        with pytest.raises(InvalidMedia, match=r"image \(image/png\) is given by URL"):
            session.stream(["see", Image(url="http://169.254.169.254/latest/meta-data.png")])
        assert session.messages == () and await store.load("u") is None
        png = base64.b64encode(PNG).decode()
        inline = await session.run(["see", Image(url=f"data:image/png;base64,{png}")])
    assert inline.text == "never"  # a data: URL is inline bytes, taken as ever


# -- tools returning images ----------------------------------------------------------------


@tool
async def screenshot(caption: bool) -> list:
    """Take a screenshot."""
    return ["the screen:", Image(data=PNG)] if caption else Image(data=PNG)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        (False, (Image(data=PNG),)),
        (True, (TextPart(text="the screen:", step=0), Image(data=PNG))),
    ],
)
async def test_a_tool_returning_an_image_has_it_as_parts_in_its_result(caption, expected):
    steps = [tool_call("screenshot", {"caption": caption}, tool_call_id="c1"), ["seen"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[screenshot])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="t")
        await session.run("look")
    results = [m for m in session.messages if isinstance(m, ToolMessage)]
    assert results[0].error is None and results[0].output == expected


def test_user_message_text_of_plain_content_is_the_content():
    assert UserMessage(content="abc").text == "abc"


async def test_log_lines_carry_an_images_size_not_its_bytes():
    from structlog.testing import capture_logs

    from runtime import configure_logging

    big = Image(data=PNG + b"\x07" * 3000)
    configure_logging("info")
    try:
        with capture_logs() as logs:
            async with Host.open() as host:
                session = await host.open_session(Agent(provider=ScriptedProvider([["ok"]])))
                await session.run(["see", big])
    finally:
        configure_logging("warning")
    started = next(line for line in logs if line.get("event") == "turn.started")
    assert started["input"][1] == {
        "type": "image", "data": "<3024 bytes>", "url": None, "media_type": "image/png",
    }  # fmt: skip
    assert base64.b64encode(big.data).decode()[:40] not in repr(logs)


async def test_a_worker_refusing_media_urls_fails_a_queued_turn_holding_one(pg_url):
    import trio

    from runtime.app.worker import open_worker

    limits = MediaLimits(allow_urls=False)
    agent = Agent(provider=ScriptedProvider([["never"]]), media_limits=limits)
    async with open_worker(pg_url, agent=agent, poll=0.05) as worker:
        queued = await worker.queue.submit("w", (Image(url="http://169.254.169.254/x.png"),))
        with trio.fail_after(30):
            turn = await worker.queue.get(queued.turn_id)
            while turn.status in ("queued", "running"):  # the queue has no event to wait on
                await trio.sleep(0.05)
                turn = await worker.queue.get(queued.turn_id)
    assert turn.status == "failed" and "is given by URL" in turn.error
    assert worker.done == {"failed": 1}
