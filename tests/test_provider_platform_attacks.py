"""Claude on Bedrock and Vertex AI (and Gemini's client) attacked by a hostile or broken
server, or by a hostile configuration (branch ``platatk``, journal
``benchmarks/journal/pipeline.md``).

Each call goes through the real ``anthropic`` SDK client of the platform
(``AsyncAnthropicBedrock``: AWS event-stream frames, SigV4 signed by boto3 from dummy keys,
locally; ``AsyncAnthropicVertex``: SSE) to the loopback server. What is checked: what the
call streamed, the error the user gets (its class, whether it is retried), that no
credential is in it, and what the server (or another one) received. The frames are made
by :mod:`tests.support.eventstream` and broken here byte by byte.
"""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers.anthropic import AnthropicBedrockProvider, AnthropicVertexProvider
from runtime.errors import (
    AuthenticationFailed,
    ConfigurationError,
    MalformedStream,
    Overloaded,
    ProviderError,
    ProviderUnavailable,
    RateLimited,
)
from tests.support.eventstream import bedrock_stream, chunk, exception, message
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
)
from tests.support.provider_calls import Run, make_request, replay_with
from tests.test_provider_anthropic_platforms import (
    AWS_KEY,
    AWS_SECRET,
    BEDROCK_KEY,
    BEDROCK_MODEL,
    EVENTSTREAM,
    TOKEN,
    VERTEX_MODEL,
    bedrock,
    vertex,
)

CHUNK = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEXAMPLEsessionTOKEN0123456789/abc+def=="
ADC_TOKEN = "ya29.a0-adc-EXAMPLE-token-0123456789abcdef"


def delta(text: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }


START = [
    anthropic_start(),
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    delta("Hello"),
]
"""An answer's head: the message, its text block, the first delta (``Hello``)."""
REST = [delta(" again"), {"type": "content_block_stop", "index": 0}, *anthropic_end("end_turn")]
"""The rest of the answer after a second delta (``" world"``) that an attack replaces."""


def frames_body(*middle: bytes) -> bytes:
    """``Hello``, the ``middle`` frames, `` again`` and the end of the message."""
    return bedrock_stream(*START) + b"".join(middle) + bedrock_stream(*REST)


def stream_reply(body: bytes, **kw: Any) -> Reply:
    return Reply(body=body, content_type=EVENTSTREAM, **kw)


def bedrock_key(url: str) -> AnthropicBedrockProvider:
    """Bedrock with an API key (a bearer token; nothing signed, no thread)."""
    return AnthropicBedrockProvider(
        BEDROCK_MODEL, base_url=url, region="us-east-1", api_key=BEDROCK_KEY
    )


def framed(headers: bytes, payload: bytes = b"", *, headers_length: int | None = None) -> bytes:
    """A frame of raw ``headers`` bytes, both checksums right."""
    length = len(headers) if headers_length is None else headers_length
    prelude = struct.pack(">II", 12 + len(headers) + len(payload) + 4, length)
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def chunk_bytes(raw: bytes) -> bytes:
    """A ``chunk`` frame carrying ``raw`` as its base64 ``bytes``."""
    return message(CHUNK, json.dumps({"bytes": base64.b64encode(raw).decode()}).encode())


# -- frames that do not decode ---------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"not json", id="payload-not-json"),
        pytest.param(b'{"bytes": "!!!not-base64!!!"}', id="bytes-not-base64"),
        pytest.param(b'{"p": "abc"}', id="no-bytes"),
        pytest.param(b'{"bytes": 5}', id="bytes-a-number"),
        pytest.param(b'["bytes"]', id="payload-a-list"),
    ],
)
async def test_a_garbled_chunk_frame_mid_stream_is_malformed_and_never_skipped(payload):
    """Before: botocore's parser made nothing of it and the SDK skipped it, so the answer
    lost the delta it carried and finished as whole ("Hello again")."""
    run = await replay_with(
        bedrock, stream_reply(frames_body(message(CHUNK, payload))), expect_error=True
    )
    assert run.text == "Hello"
    assert isinstance(run.error, MalformedStream) and run.error.retryable
    assert run.error.provider == "anthropic-bedrock"
    assert "chunk that does not decode" in run.error.message


async def test_a_frame_whose_header_has_an_unknown_value_type_is_malformed():
    """Before: botocore's ``KeyError: 99`` came out as a ``ProviderError``, not retried,
    as if the client had a bug."""
    header = b"\x05event" + b"\x63" + b"\x00\x01x"  # value type 99: none the format has
    run = await replay_with(bedrock, stream_reply(frames_body(framed(header))), expect_error=True)
    assert run.text == "Hello"
    assert isinstance(run.error, MalformedStream) and run.error.retryable
    assert "undecodable event-stream frame" in run.error.message


async def test_an_error_frame_naming_an_exception_the_service_model_lacks_keeps_its_words():
    """Before: botocore's parser knew no such exception, and the error said
    ``{"type":"","message":""}``."""
    tail = exception("quotaRefreshException", "daily quota is being refreshed")
    run = await replay_with(bedrock, stream_reply(frames_body(tail)), expect_error=True)
    assert isinstance(run.error, ProviderUnavailable) and run.error.retryable
    assert run.error.message == "daily quota is being refreshed"


def cut_prelude(total: int, headers: int, crc: int | None = None) -> bytes:
    prelude = struct.pack(">II", total, headers)
    return prelude + struct.pack(">I", zlib.crc32(prelude) if crc is None else crc)


async def test_in_a_session_a_garbled_frame_fails_the_turn_saves_its_text_and_the_next_works():
    """The whole turn through a Host: the text before the frame saved, marked failed,
    and sent back in the next turn's request, which succeeds."""
    from runtime import Agent, Host, RetryPolicy
    from runtime.messages import TextPart
    from tests.support.faults import check_anthropic_body

    garbled = stream_reply(frames_body(message(CHUNK, b"not json")))
    async with loopback_server(garbled, stream_reply(bedrock_stream(*START, *REST))) as server:
        provider = bedrock_key(server.url)
        try:
            async with Host.open(log_tap=False) as host:
                agent = Agent(provider=provider, retry=RetryPolicy(max_attempts=1))
                session = await host.open_session(agent, session_id="s")
                first = await session.run("hi")
                saved = list(session.messages)
                second = await session.run("again")
        finally:
            await provider.aclose()
    assert (first.finish_reason, first.error.kind) == ("error", "MalformedStream")
    assert [m.role for m in saved] == ["user", "assistant"] and saved[1].failed
    assert [p.text for p in saved[1].content if isinstance(p, TextPart)] == ["Hello"]
    assert (second.finish_reason, second.text) == ("stop", "Hello again")
    body = server.requests[-1].json()
    check_anthropic_body(body)
    assert "Hello" in json.dumps(body["messages"][1])


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(
            bedrock_stream(*START) + chunk(delta(" again"))[:-7],
            "cut short",
            id="cut-inside-a-frame",
        ),
        pytest.param(
            bedrock_stream(*START) + cut_prelude(10_000, 0) + b"x" * 50,
            "cut short",
            id="length-past-the-body",
        ),
        pytest.param(
            bedrock_stream(*START) + cut_prelude(2**31, 10) + b"x" * 50,
            "InvalidPayloadLength",
            id="a-2-GiB-frame",
        ),
        pytest.param(
            bedrock_stream(*START) + cut_prelude(100, 10, crc=0) + b"x" * 100,
            "ChecksumMismatch",
            id="bad-prelude-checksum",
        ),
        pytest.param(
            frames_body(framed(b"x" * 20, headers_length=200)),
            "undecodable",
            id="headers-longer-than-the-frame",
        ),
        pytest.param(frames_body(chunk_bytes(b"\xff\xfe")), "Unicode", id="event-not-utf8"),
        pytest.param(frames_body(chunk_bytes(b"[1, 2]")), "not a JSON object", id="event-a-list"),
    ],
)
async def test_a_broken_frame_after_some_text_is_malformed_and_keeps_the_text(body, said):
    """These held before: each is a retryable MalformedStream after the text before it."""
    run = await replay_with(bedrock, stream_reply(body), expect_error=True)
    assert run.text == "Hello"
    assert isinstance(run.error, MalformedStream) and run.error.retryable
    assert said in run.error.message


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(body=anthropic_sse(*START, *REST)), id="sse"),
        pytest.param(
            Reply(body=b"<html>502 Bad Gateway</html>", content_type="text/html"), id="html"
        ),
        pytest.param(stream_reply(b""), id="empty"),
    ],
)
async def test_a_200_that_holds_no_frames_is_malformed_and_says_what_came(reply):
    """Before: a checksum mismatch of bytes that were never a frame (or, empty, "cut
    short"): now what the body begins with, as the first-party stream says it."""
    run = await replay_with(bedrock, reply, expect_error=True)
    assert run.text == ""
    assert isinstance(run.error, MalformedStream) and run.error.retryable
    said = f"it begins {reply.body[:20]!r}"[:-1] if reply.body else "it is empty"
    assert "the body holds no event-stream frames" in run.error.message
    assert said in run.error.message


async def test_a_body_shorter_than_a_frames_prelude_is_no_event_stream():
    run = await replay_with(bedrock, stream_reply(b"OK"), expect_error=True)
    assert isinstance(run.error, MalformedStream)
    assert run.error.message == "the body holds no event-stream frames: it begins b'OK'"


@pytest.mark.parametrize("where", ["argument", "environment"])
async def test_an_aws_profile_that_does_not_exist_is_a_configuration_error(
    where, monkeypatch, tmp_path
):
    """Before: botocore's ``ProfileNotFound`` was a ``ProviderError``."""
    from anthropic.lib.aws import _auth

    _auth._get_session.cache_clear()  # a session made before AWS_PROFILE was set
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_BEARER_TOKEN_BEDROCK"):
        monkeypatch.delenv(variable, raising=False)
    if where == "environment":
        monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
        kw = {}
    else:
        kw = {"aws_profile": "no-such-profile"}
    provider = AnthropicBedrockProvider(
        BEDROCK_MODEL, base_url="http://127.0.0.1:9", region="us-east-1", **kw
    )
    with pytest.raises(ConfigurationError, match="no-such-profile"):
        await provider.stream(make_request(), Run().emit)


async def test_frames_written_one_byte_at_a_time_give_the_whole_answer():
    body = frames_body(chunk(delta(" world")))
    whole = await replay_with(bedrock, stream_reply(body))
    bytewise = await replay_with(bedrock, stream_reply(body, write_size=1))
    assert bytewise.text == whole.text == "Hello world again"
    assert bytewise.chunks == whole.chunks


async def test_unknown_event_types_and_chunks_without_a_messages_event_are_skipped():
    """Forward compatible, as the SDK is: a frame of another ``:event-type`` and a chunk
    whose JSON object names no event type carry nothing to read."""
    other = message({":event-type": "metrics", ":message-type": "event"}, b"{}")
    body = frames_body(other, chunk_bytes(b'{"note": "no type"}'), chunk(delta(" world")))
    run = await replay_with(bedrock, stream_reply(body))
    assert run.text == "Hello world again"


async def test_a_stream_that_stalls_after_some_text_times_out_and_keeps_the_text(autojump_clock):
    import trio

    from runtime.errors import ProviderTimeout

    head = bedrock_stream(*START)
    stalled = stream_reply(head + bedrock_stream(*REST), stall=1e6, stall_after=len(head))
    t0 = trio.current_time()
    run = await replay_with(bedrock_key, stalled, expect_error=True)
    assert trio.current_time() - t0 == pytest.approx(60.0, abs=0.5)  # the read timeout
    assert run.text == "Hello"
    assert isinstance(run.error, ProviderTimeout) and run.error.retryable


async def test_a_body_kept_open_after_message_stop_does_not_fail_the_answer(autojump_clock):
    import trio

    body = bedrock_stream(*START, *REST)
    t0 = trio.current_time()
    run = await replay_with(bedrock_key, stream_reply(body, stall=1e6, stall_after=len(body)))
    assert trio.current_time() - t0 < 1.0
    assert run.text == "Hello again"


async def test_keep_alive_frames_without_end_stream_until_the_users_cancel(autojump_clock):
    """A frame of another event type every second, without end: each read resets the
    read timeout, as an SSE ``ping`` does for Anthropic, so only a cancel ends the call;
    it ends it at once, the text streamed before kept, the connection released."""
    import trio

    other = message({":event-type": "metrics", ":message-type": "event"}, b"{}")
    head = bedrock_stream(*START)
    endless = stream_reply(head + other * 10_000, write_size=len(other), delay=1.0)
    run = Run()
    async with loopback_server(endless) as server:
        provider = bedrock_key(server.url)
        t0 = trio.current_time()
        with trio.move_on_after(300) as scope:
            await provider.stream(make_request(), run.emit)
        await provider.aclose()
    assert scope.cancelled_caught
    assert trio.current_time() - t0 == pytest.approx(300.0, abs=0.5)
    assert run.text == "Hello"


def decode_frames(pieces: list[bytes]) -> tuple[list[tuple[str, str]], BaseException | None]:
    """The events the Bedrock frame decoder gives for a body read as ``pieces``, and
    what it raised (``None``: nothing)."""
    import trio

    from actors.providers.anthropic_platforms import frame_decoder_class

    decoder_class = frame_decoder_class()
    assert decoder_class is not None

    async def reads() -> Any:
        for piece in pieces:
            yield piece

    async def run() -> tuple[list[tuple[str, str]], BaseException | None]:
        out: list[tuple[str, str]] = []
        try:
            async for event in decoder_class().aiter_bytes(reads()):
                out.append((event.event, event.data))
        except Exception as exc:
            return out, exc
        return out, None

    return trio.run(run)


def cut(body: bytes, points: list[int]) -> list[bytes]:
    points = sorted({min(p, len(body)) for p in points})
    return [body[i:j] for i, j in zip([0, *points], [*points, len(body)], strict=True)]


WHOLE = frames_body(chunk(delta(" world")), exception("throttlingException", "slow down"))
WHOLE_EVENTS, _ = decode_frames([WHOLE])


@given(
    cuts=st.lists(st.integers(min_value=0, max_value=len(WHOLE)), max_size=16),
    at=st.integers(min_value=0, max_value=len(WHOLE) - 1),
    flip=st.integers(min_value=1, max_value=255),
    mutate=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_frames_in_any_reads_decode_alike_and_any_changed_byte_is_malformed(cuts, at, flip, mutate):
    """However the body is cut into reads, the same events; with any one byte changed
    (every byte is under a checksum), the events of the frames before it, then a
    MalformedStream: never another exception, never a frame skipped."""
    body = WHOLE
    if mutate:
        body = body[:at] + bytes([body[at] ^ flip]) + body[at + 1 :]
    events, raised = decode_frames(cut(body, cuts))
    if not mutate:
        assert (events, raised) == (WHOLE_EVENTS, None)
        return
    assert isinstance(raised, MalformedStream), raised
    assert events == WHOLE_EVENTS[: len(events)]
    assert len(events) < len(WHOLE_EVENTS)


# -- credentials --------------------------------------------------------------------------------


def aws_from_the_environment(monkeypatch: Any, tmp_path: Any) -> None:
    """AWS credentials only in the environment (boto3's chain finds them), with a session
    token; no profile, no instance metadata."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    for variable in ("AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK"):
        monkeypatch.delenv(variable, raising=False)


def bedrock_from_the_environment(url: str) -> AnthropicBedrockProvider:
    return AnthropicBedrockProvider(BEDROCK_MODEL, base_url=url, region="us-west-2")


def echoing(status: int, secret: str) -> Reply:
    """An error whose body quotes ``secret`` (a debugging proxy echoing the headers)."""
    body = {"message": f"The security token included in the request is invalid: {secret}"}
    return Reply(status=status, body=json.dumps(body).encode(), content_type="application/json")


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (403, AuthenticationFailed),
        (429, RateLimited),
        (500, ProviderUnavailable),
        (529, Overloaded),
    ],
)
async def test_a_session_token_found_in_the_environment_and_echoed_back_is_redacted(
    status, expected, monkeypatch, tmp_path
):
    """Before: only the credentials given to the provider were secrets; a session token
    boto3 found in the environment, sent as ``X-Amz-Security-Token``, came back whole in
    the error."""
    aws_from_the_environment(monkeypatch, tmp_path)
    run = await replay_with(
        bedrock_from_the_environment, echoing(status, SESSION_TOKEN), expect_error=True
    )
    assert run.request.headers["x-amz-security-token"] == SESSION_TOKEN  # it was sent
    assert type(run.error) is expected
    assert "[redacted]" in run.error.message and SESSION_TOKEN not in str(run.error)


@pytest.fixture
def adc(monkeypatch: Any) -> None:
    """Application Default Credentials holding :data:`ADC_TOKEN` (not expired), as
    ``google.auth.default`` would load them; no file, no network."""
    import datetime

    from anthropic.lib.vertex import _client
    from google.oauth2.credentials import Credentials

    expiry = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(hours=1)

    def load_auth(*, project_id: str | None) -> tuple[Any, str]:
        return Credentials(token=ADC_TOKEN, expiry=expiry), project_id or "adc-project"

    monkeypatch.setattr(_client, "load_auth", load_auth)


def vertex_adc(url: str) -> AnthropicVertexProvider:
    return AnthropicVertexProvider(VERTEX_MODEL, base_url=url, region="us-east5", project_id="p")


@pytest.mark.parametrize("status", [401, 403, 429, 500, 529])
async def test_an_adc_access_token_echoed_back_is_redacted(status, adc):
    """Before: "credentials found later stay Google's": the token was no secret."""
    run = await replay_with(vertex_adc, echoing(status, f"token {ADC_TOKEN}"), expect_error=True)
    assert run.request.headers["authorization"] == f"Bearer {ADC_TOKEN}"
    assert ADC_TOKEN not in str(run.error) and "[redacted]" in run.error.message


async def test_adc_that_cannot_be_refreshed_is_authentication_failed_before_any_request(
    monkeypatch,
):
    """Held: an expired token whose refresh Google refuses (``invalid_grant``) is
    google-auth's ``RefreshError``: AuthenticationFailed, not retried, nothing sent."""
    from anthropic.lib.vertex import _client
    from google.auth.exceptions import RefreshError
    from google.oauth2.credentials import Credentials

    class Expired(Credentials):  # type: ignore[misc]
        def refresh(self, request: Any) -> None:
            raise RefreshError("invalid_grant: Token has been expired or revoked.")

    monkeypatch.setattr(
        _client, "load_auth", lambda *, project_id: (Expired(token=None), project_id or "p")
    )
    run = await replay_with(vertex_adc, Reply(body=anthropic_sse(*START, *REST)), expect_error=True)
    assert isinstance(run.error, AuthenticationFailed) and not run.error.retryable
    assert "invalid_grant" in run.error.message
    assert run.server.requests == []


@pytest.mark.parametrize("status", [401, 403, 429, 500, 529])
@pytest.mark.parametrize("platform", ["vertex", "bedrock-key", "bedrock-sigv4"])
async def test_a_given_credential_echoed_back_is_redacted(platform, status):
    """Held before: the credentials given are registered when the client is built."""
    make, secret = {
        "vertex": (vertex, TOKEN),
        "bedrock-key": (bedrock_key, BEDROCK_KEY),
        "bedrock-sigv4": (bedrock, AWS_SECRET),
    }[platform]
    run = await replay_with(make, echoing(status, secret), expect_error=True)
    assert secret not in str(run.error) and "[redacted]" in run.error.message


@pytest.mark.parametrize("status", [307, 302])
async def test_a_redirect_to_another_origin_never_carries_the_session_token(
    status, monkeypatch, tmp_path
):
    """The HTTP library strips ``Authorization`` (the signature) when a redirect leaves
    the origin, not ``X-Amz-Security-Token``: it went on to whatever host the redirect
    named. Now the redirect is not followed at all (every provider refuses one off the
    endpoint's origin: ``StayHome``), and the token is dropped there besides."""
    aws_from_the_environment(monkeypatch, tmp_path)
    answer = bedrock_stream(*START, *REST)
    async with loopback_server(stream_reply(answer)) as elsewhere:
        moved = Reply(status=status, headers=[("location", elsewhere.url + "/moved")])
        run = await replay_with(bedrock_from_the_environment, moved, expect_error=True)
    assert run.request.headers["x-amz-security-token"] == SESSION_TOKEN  # the endpoint's
    assert elsewhere.requests == []
    assert isinstance(run.error, ProviderError) and not run.error.retryable
    assert "redirected the call to another origin" in run.error.message
    assert SESSION_TOKEN not in run.error.message


@pytest.mark.parametrize(
    "region", ["evil.example#", "us-east-1.evil.example/x?", "x@evil.example#", "us east 1"]
)
@pytest.mark.parametrize("source", ["argument", "environment"])
@pytest.mark.parametrize("platform", ["vertex", "bedrock"])
async def test_a_region_that_is_no_regions_name_sends_nothing_anywhere(
    platform, source, region, monkeypatch
):
    """The SDKs put the region in the host's name: ``evil.example#`` (in
    ``CLOUD_ML_REGION`` or ``AWS_REGION``, or given) sent the Vertex access token or the
    Bedrock API key to ``https://evil.example``. Now a ConfigurationError, before any
    request, and no endpoint for the reasoning's origin."""
    for variable in ("ANTHROPIC_VERTEX_BASE_URL", "ANTHROPIC_BEDROCK_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    given = region if source == "argument" else None
    monkeypatch.setenv("CLOUD_ML_REGION" if platform == "vertex" else "AWS_REGION", region)
    if platform == "vertex":
        provider: Any = AnthropicVertexProvider(
            VERTEX_MODEL, region=given, project_id="p", access_token=TOKEN
        )
    else:
        provider = AnthropicBedrockProvider(BEDROCK_MODEL, region=given, api_key=BEDROCK_KEY)
    assert provider.endpoint is None
    with pytest.raises(ConfigurationError, match="not a region's name"):
        await provider.stream(make_request(), Run().emit)


@pytest.mark.parametrize("region", ["us-east-1", "us-gov-west-1", "eu-central-2"])
async def test_a_real_bedrock_region_still_calls(region):
    def make(url: str) -> AnthropicBedrockProvider:
        return AnthropicBedrockProvider(
            BEDROCK_MODEL, base_url=url, region=region, api_key=BEDROCK_KEY
        )

    run = await replay_with(make, stream_reply(bedrock_stream(*START, *REST)))
    assert run.text == "Hello again"


@pytest.mark.parametrize("region", ["global", "us", "eu", "europe-west1", "us-east5"])
async def test_a_real_vertex_region_still_calls(region):
    def make(url: str) -> AnthropicVertexProvider:
        return AnthropicVertexProvider(
            VERTEX_MODEL, base_url=url, region=region, project_id="p", access_token=TOKEN
        )

    run = await replay_with(make, Reply(body=anthropic_sse(*START, *REST)))
    assert run.text == "Hello again"
    assert f"/locations/{region}/" in run.request.path


# -- missing extras --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("missing", "platform", "extra"),
    [
        pytest.param(("boto3",), "bedrock-sigv4", "bedrock", id="boto3-signing"),
        pytest.param(("botocore", "botocore.eventstream"), "bedrock-key", "bedrock", id="botocore"),
        pytest.param(
            ("google.auth", "google.auth.transport.requests"),
            "vertex-adc",
            "vertex",
            id="google-auth",
        ),
    ],
)
async def test_a_missing_extra_is_a_configuration_error_naming_it_before_any_request(
    missing, platform, extra, monkeypatch
):
    """Before: a ``ProviderError`` quoting ``ModuleNotFoundError`` (or the SDK's own
    ``pip install anthropic[vertex]``); with a Bedrock API key the request went out and
    the answer was lost in the stream's decoder."""
    from anthropic.lib.aws import _auth

    _auth._get_session.cache_clear()  # the SDK keeps boto3's session between calls
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)
    make = {
        "bedrock-sigv4": bedrock,
        "bedrock-key": bedrock_key,
        "vertex-adc": vertex_adc,
    }[platform]
    async with loopback_server(stream_reply(bedrock_stream(*START, *REST))) as server:
        provider = make(server.url)
        with pytest.raises(ConfigurationError) as raised:
            await provider.stream(make_request(), Run().emit)
        await provider.aclose()
    assert f"pip install 'axon-runtime[{extra}]'" in str(raised.value)
    assert server.requests == []


async def test_vertex_without_google_auth_or_a_region_names_the_extra_first(monkeypatch):
    """On the core install, with no region set, the SDK's constructor asked for a region;
    once it was set, the next try said to install the vertex extra."""
    monkeypatch.delenv("CLOUD_ML_REGION", raising=False)
    monkeypatch.setitem(sys.modules, "google.auth", None)
    provider = AnthropicVertexProvider(VERTEX_MODEL, project_id="p")
    with pytest.raises(ConfigurationError) as raised:
        await provider.stream(make_request(), Run().emit)
    await provider.aclose()
    assert str(raised.value) == (
        "anthropic-vertex cannot run without google-auth (Application Default Credentials): "
        "pip install 'axon-runtime[vertex]'"
    )


def test_vertex_with_an_access_token_and_no_region_still_asks_for_the_region(monkeypatch):
    """A given access token needs no google-auth: the region is what is missing."""
    monkeypatch.delenv("CLOUD_ML_REGION", raising=False)
    monkeypatch.setitem(sys.modules, "google.auth", None)
    provider = AnthropicVertexProvider(VERTEX_MODEL, project_id="p", access_token="t")
    with pytest.raises(ConfigurationError, match="region"):
        provider.new_client()


# -- nothing read at import ------------------------------------------------------------------

READS = """
import os, sys
read = []
get = os._Environ.__getitem__
os._Environ.__getitem__ = lambda self, key: (read.append(key), get(self, key))[1]
import actors.providers, actors.providers.anthropic, actors.providers.gemini
from actors.providers.registry import create_provider
from runtime.provider import ProviderOptions
for name in ("anthropic-bedrock", "anthropic-vertex", "google", "anthropic"):
    provider = create_provider(name, ProviderOptions())
    provider.describe(), provider.origin
print(sorted(set(read)))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore", "anthropic")
    or m.startswith("google.")))
"""


def test_importing_and_building_the_cloud_providers_reads_no_credential_and_loads_no_sdk():
    """Held: a key or a cloud credential is read on the first call only."""
    done = subprocess.run(
        [sys.executable, "-c", READS], capture_output=True, text=True, check=True, timeout=120
    )
    read, modules = done.stdout.splitlines()
    for word in ("KEY", "TOKEN", "SECRET", "CREDENTIAL", "PROFILE", "PASSWORD"):
        assert word not in read.upper(), read
    assert modules == "[]"


def test_gemini_without_google_genai_is_a_configuration_error_naming_the_extra(monkeypatch):
    """Before: the ``ModuleNotFoundError`` left the call unclassified (the classifier
    imports the SDK too)."""
    import trio

    from actors.providers import GeminiProvider

    monkeypatch.setitem(sys.modules, "google.genai", None)
    provider = GeminiProvider("gemini-2.5-flash", base_url="http://127.0.0.1:9", api_key=TOKEN)
    with pytest.raises(ConfigurationError, match=r"pip install 'axon-runtime\[google\]'"):
        trio.run(provider.stream, make_request(), Run().emit)


# -- Gemini ----------------------------------------------------------------------------------


async def test_gemini_stays_on_the_developer_api_whatever_google_genai_use_vertexai_says(
    monkeypatch,
):
    """The SDK reads ``GOOGLE_GENAI_USE_VERTEXAI``: set (for another tool), it made this
    client Vertex AI's express mode, its own paths (``/v1beta1/publishers/google/...``)
    on ``aiplatform.googleapis.com``, a host the key is not sent to."""
    from actors.providers import GeminiProvider
    from tests.support.attacks import KEY, gemini_chunk, gemini_sse

    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "true")
    chunk_ = gemini_chunk([{"text": "hi"}], "STOP")

    def make(url: str) -> GeminiProvider:
        return GeminiProvider("gemini-2.5-flash", base_url=url, api_key=KEY)

    run = await replay_with(make, Reply(body=gemini_sse(chunk_)))
    assert run.text == "hi"
    assert "/models/gemini-2.5-flash:streamGenerateContent" in run.request.path
    assert "publishers" not in run.request.path
    assert run.request.headers["x-goog-api-key"] == KEY
