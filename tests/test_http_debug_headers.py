"""The ``DEBUG`` lines of the HTTP stacks under the SDKs carry no credential-bearing
header, the request's or the response's, once Axon's logging is configured: httpcore's
``receive_response_headers.complete`` listed a server's ``set-cookie`` as it was, the
Anthropic SDK's ``HTTP Response`` line the same, its ``Request options`` line the extra
headers sent (:class:`runtime.logging.HTTPClientLines` on
:data:`runtime.logging.HTTP_STACK_LOGGERS`). benchmarks/journal/pipeline.md ("logs3")."""

from __future__ import annotations

import importlib
import json
import logging
import pkgutil

import anthropic
import hpack
import openai
import pytest

from runtime.logging import HTTP_CLIENT_LINES, HTTP_STACK_LOGGERS, quiet_http_client_logs
from runtime.redact import redact_header_pairs
from tests.support.loopback import Reply, loopback_server

COOKIE = "cookie-of-the-session-6620"
"""What the server sets and the client sends back (no key shape, never registered)."""
TOKEN = "token-in-a-header-4417"

OA_BODY = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
    }
).encode()
ANT_BODY = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
).encode()
SET = (("set-cookie", f"sid={COOKIE}; Path=/"), ("x-auth-token", TOKEN))
SENT = {"Cookie": f"sid={COOKIE}", "X-Auth-Token": TOKEN}


async def _openai(url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k" * 20)
    messages = [{"role": "user", "content": "hi"}]
    await client.chat.completions.create(model="m", messages=messages, extra_headers=SENT)  # type: ignore[arg-type]


async def _anthropic(url: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=url, api_key="k" * 20)
    messages = [{"role": "user", "content": "hi"}]
    await client.messages.create(
        model="m",
        max_tokens=5,
        messages=messages,
        extra_headers=SENT,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("call", "body"), [(_openai, OA_BODY), (_anthropic, ANT_BODY)], ids=["openai", "anthropic"]
)
async def test_an_sdks_debug_lines_carry_no_header_credentials(logs, call, body):
    stream, caplog = logs
    reply = Reply(body=body, content_type="application/json", headers=SET)
    async with loopback_server(reply) as server:
        await call(server.url)
    [sent] = server.requests
    assert sent.headers["x-auth-token"] == TOKEN  # the real client did send them
    texts = [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if COOKIE in t or TOKEN in t]
    assert COOKIE not in stream.getvalue() and TOKEN not in stream.getvalue()
    [headers] = [t for t in texts if t.startswith("receive_response_headers.complete")]
    assert "(b'set-cookie', b'[redacted]')" in headers  # the line is kept, and readable
    assert "(b'content-type', b'application/json')" in headers


def test_every_module_logger_of_the_http_stacks_is_filtered():
    """A filter acts on the records of its own logger only: each module's must be in
    :data:`HTTP_STACK_LOGGERS` (a newer httpcore's new module fails this)."""
    import hpack
    import httpcore
    import httpcore2

    names = {"openai._base_client", "anthropic._base_client"}
    for package in (httpcore, httpcore2, hpack):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            try:
                loaded = importlib.import_module(module.name)
            except ImportError:  # an optional dependency (socksio, h2) not installed
                continue
            names |= {v.name for v in vars(loaded).values() if isinstance(v, logging.Logger)}
    assert names <= set(HTTP_STACK_LOGGERS)
    quiet_http_client_logs()
    assert all(HTTP_CLIENT_LINES in logging.getLogger(name).filters for name in names)


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("Headers({'set-cookie': 'sid=1', 'x-request-id': 'r'})", "'x-request-id': 'r'"),
        ("Adding b'proxy-authorization'=b'Basic dXNlcg==' to the table", "to the table"),
        ("{'headers': {'X-Goog-Api-Key': \"it's\"}, 'idempotency_key': 'i'}", "'i'"),
    ],
)
def test_a_header_named_like_a_credential_is_redacted_in_each_form(line, kept):
    out = redact_header_pairs(line)
    assert "[redacted]" in out and kept in out
    assert "sid=1" not in out and "dXNlcg" not in out and "it's" not in out


@pytest.mark.parametrize("huffman", [True, False], ids=["huffman", "literal"])
def test_an_http2_header_block_is_logged_by_its_size(caplog, huffman):
    """hpack (under httpcore's HTTP/2, h2) logs the whole header block it encodes and
    the one it decodes: a literal value as it is, a Huffman coded one (h2's default) in
    a code hpack itself reads back. The line says how long the block is instead."""
    quiet_http_client_logs()
    headers = [(":method", "POST"), ("authorization", f"Bearer {TOKEN}"), ("cookie", COOKIE)]
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    with caplog.at_level(logging.DEBUG):
        block = encoder.encode(headers, huffman=huffman)
        decoder.decode(block)
    texts = [r.getMessage() for r in caplog.records if r.name.startswith("hpack.")]
    assert f"Encoded header block to <{len(block)} bytes>" in texts
    assert f"Decoding <{len(block)} bytes>" in texts
    assert not [t for t in texts if repr(block) in t or TOKEN in t or COOKIE in t]


WORDS = "the-users-private-words-5521"
"""What the user asked (no key shape: only the request's body holds it)."""


async def test_the_anthropic_sdks_request_options_line_holds_no_request_body(logs):
    """The Anthropic SDK logs its request options at ``DEBUG`` (``Request options:
    {..., 'json_data': {'messages': [...]}}``): the user's messages, the system prompt,
    the tools, whatever ``extra_body`` adds, whole. The OpenAI SDK logs only the method
    (``Building HTTP request: method=post``); this line keeps the method and path."""
    stream, caplog = logs
    async with loopback_server(Reply(body=ANT_BODY, content_type="application/json")) as server:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key="k" * 20)
        messages = [{"role": "user", "content": WORDS}]
        await client.messages.create(model="m", max_tokens=5, messages=messages)  # type: ignore[arg-type]
    [sent] = server.requests
    assert WORDS.encode() in sent.body  # the real client did send them
    texts = [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if WORDS in t]
    assert WORDS not in stream.getvalue()
    assert "Request options: method=post url=/v1/messages" in texts


ILLEGAL_KEY = "gateway-key-with-a-newline-8812"


async def test_an_sdks_logged_traceback_quotes_no_registered_header_value(logs):
    """A gateway key read with its newline (``X-Portkey-Api-Key: <key>\\n``): h11 refuses
    the header with its value in the exception's text (``Illegal header value
    b'<key>\\n'``), which the Anthropic SDK logs with its traceback (``Encountered
    Exception``, ``exc_info``) at ``DEBUG``: the root handler's traceback is redacted
    (the exception's type and text stay)."""
    from actors.providers import AnthropicProvider
    from runtime import Agent, Host, RetryPolicy

    stream, caplog = logs
    async with loopback_server(Reply(body=ANT_BODY, content_type="application/json")) as server:
        provider = AnthropicProvider(
            "m",
            base_url=server.url,
            api_key="k" * 20,
            extra_headers={"X-Portkey-Api-Key": f"{ILLEGAL_KEY}\n"},
        )
        agent = Agent(provider=provider, retry=RetryPolicy(max_attempts=1))
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            result = await session.run("go")
    assert result.error is not None and not server.requests  # refused before it was sent
    [record] = [r for r in caplog.records if r.getMessage() == "Encountered Exception"]
    assert record.exc_info is not None  # the traceback kept, its text redacted
    text = caplog.text
    assert "LocalProtocolError: Illegal header value b'[redacted]\\n'" in text
    assert ILLEGAL_KEY not in text and ILLEGAL_KEY not in stream.getvalue()
