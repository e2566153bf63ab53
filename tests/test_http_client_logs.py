"""The credentials of a provider's URL reach no log, stream or store: the HTTP clients'
request lines (``httpx``/``httpx2``: ``HTTP Request: POST URL "HTTP/1.1 200 OK"``, at
``INFO``, an application's root handler sees them) have their URLs redacted
(:class:`runtime.logging.HTTPClientLines`), and a base URL's password and query keys
are registered secrets, so a server's error that echoes them is redacted like the key.
benchmarks/journal/pipeline.md ("logs2")."""

from __future__ import annotations

import json
import logging
import os

import httpx
import pytest

from actors.mcp import MCPServer
from actors.providers import OpenAIProvider
from runtime import Agent, Host, tool
from runtime.app.web.ui_stream import encode_turn, sse
from runtime.logging import HTTP_CLIENT_LOGGERS, quiet_http_client_logs
from runtime.redact import is_secret_env_name, redact_text, register_env_secrets
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.test_mcp_attacks import ForgetfulServer, calling
from tests.test_provider_e2e import oa_answer

PASSWORD = "pw-of-the-proxy-4821"
"""The password of the base URL's user info (no key shape: only a filter hides it)."""
QUERY_KEY = "azure-ish-query-key-7730"
"""The value of the base URL's ``?api-key=`` and ``?key=`` (Azure's, Gemini's way)."""
KEY = "plain-api-key-of-no-shape-5566"
"""The provider's key, of no known shape (registered, as every provider's key is)."""


MCP_PASSWORD = "pw-of-the-mcp-server-1093"
MCP_TOKEN = "token-in-the-mcp-url-2208"
"""An MCP server URL's (each secret here is registered by the test that uses it, for the
process: the tests' values differ so that none passes by another's registration)."""
MCP_SECRETS = (MCP_PASSWORD, MCP_TOKEN)


def _unsaid(*texts: str | bytes, secrets: tuple[str, ...] = (PASSWORD, QUERY_KEY, KEY)) -> None:
    for text in texts:
        blob = text if isinstance(text, bytes) else text.encode()
        for secret in secrets:
            assert secret.encode() not in blob, secret


@pytest.mark.parametrize("status", [200, 401])
async def test_a_base_urls_credentials_reach_no_log_stream_or_store(logs, tmp_path, status):
    stream, caplog = logs
    echo = f"Incorrect API key provided: {KEY} (user {PASSWORD}, query {QUERY_KEY})"
    body = json.dumps({"error": {"message": echo, "type": "invalid_request_error"}})
    reply = (
        Reply(body=oa_answer("hello"))
        if status == 200
        else Reply(body=body.encode(), status=401, content_type="application/json")
    )
    store = tmp_path / "sessions.db"
    async with loopback_server(reply) as server:
        home = server.url.replace("http://", f"http://proxy-user:{PASSWORD}@")
        url = f"{home}/v1?api-key={QUERY_KEY}&key={QUERY_KEY}"
        agent = Agent(provider=OpenAIProvider("m", base_url=url, api_key=KEY))
        async with Host.open(store=str(store)) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                chunks = [c async for c in out]
    [sent] = server.requests
    assert QUERY_KEY in sent.path  # the real client did send them
    if status == 401:
        assert out.result.error is not None
        assert out.result.error.message == (
            "Incorrect API key provided: [redacted] (user [redacted], query [redacted])"
        )
    else:
        assert out.result.text == "hello"
    ui = b"".join(sse(c) for c in encode_turn(chunks))
    saved = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    _unsaid(stream.getvalue(), caplog.text, repr(chunks), ui, saved)
    # the request's line is still there, and says what it did
    [line] = [r.getMessage() for r in caplog.records if r.name in HTTP_CLIENT_LOGGERS]
    assert line.startswith("HTTP Request: POST http://proxy-user:[redacted]@127.0.0.1:")
    assert "api-key=[redacted]" in line and f'"HTTP/1.1 {status} ' in line


async def test_an_httpx_request_line_keeps_all_but_its_credentials(caplog):
    """``httpx`` itself (MCP's, A2A's, Gemini's client): a URL's password and its
    credential-named parameters redacted, its path and other parameters kept."""
    quiet_http_client_logs()
    caplog.set_level(logging.INFO)
    async with loopback_server(Reply(body=b"{}", content_type="application/json")) as server:
        home = server.url.replace("http://", f"http://someone:{PASSWORD}@")
        async with httpx.AsyncClient() as client:
            await client.get(f"{home}/v1beta/models?key={QUERY_KEY}&alt=sse&token={KEY}")
    [line] = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert line.startswith("HTTP Request: GET http://someone:[redacted]@127.0.0.1:")
    assert line.endswith('/v1beta/models?key=[redacted]&alt=sse&token=[redacted] "HTTP/1.1 200 "')
    _unsaid(caplog.text)


class QuotingServer(ForgetfulServer):
    """A streamable HTTP MCP server whose tool answers a JSON-RPC error quoting the URL
    it was called at (its ``?token=``) and the password it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.restarted = True  # never forgets its sessions

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/call":
            return super().__call__(request)
        error = {"code": -32000, "message": f"no access for {MCP_PASSWORD} at {request.path}"}
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error})
        return Reply(body=body.encode(), content_type="application/json")


async def test_an_mcp_servers_url_credentials_are_secrets(logs, tmp_path):
    stream, caplog = logs
    async with loopback_server(respond=QuotingServer()) as web:
        home = web.url.replace("http://", f"http://someone:{MCP_PASSWORD}@")
        server = MCPServer.http(f"{home}/mcp?token={MCP_TOKEN}", name="web")
        agent = Agent(provider=calling(("echo", {"text": "x"})), tools=[server])
        async with Host.open(store=str(tmp_path / "sessions.db")) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                chunks = [c async for c in out]
    [echo] = [m for m in session.messages if m.role == "tool"]
    assert echo.error is not None
    assert echo.error.endswith("no access for [redacted] at /mcp?token=[redacted]")
    ui = b"".join(sse(c) for c in encode_turn(chunks))
    saved = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    _unsaid(stream.getvalue(), caplog.text, repr(chunks), ui, saved, secrets=MCP_SECRETS)
    lines = [r.getMessage() for r in caplog.records if r.name in HTTP_CLIENT_LOGGERS]
    assert lines and all("/mcp?token=[redacted]" in line for line in lines)


SERVICE_TOKEN = "service-token-from-the-env-3141"
"""A tool's own credential, from the environment, of no key shape."""
DSN_PASSWORD = "password-of-the-dsn-2718"
HEADER_TOKEN = "header-token-of-no-shape-1618"


@tool
async def call_service(what: str) -> str:
    """Call a service with the token of the environment."""
    raise RuntimeError(f"the service refused {what} with token {os.environ['BILLING_API_TOKEN']}")


@tool
async def query(sql: str) -> str:
    """Run a query."""
    raise ConnectionError(f"could not connect to postgresql://app:{DSN_PASSWORD}@db:5432/app")


class EchoingErrorServer(QuotingServer):
    """Its tool answers an error result (``isError``) quoting the header it was sent."""

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/call":
            return super().__call__(request)
        said = f"unauthorized: {request.headers['authorization']}"
        result = {"content": [{"type": "text", "text": said}], "isError": True}
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        return Reply(body=body.encode(), content_type="application/json")


async def test_a_tools_error_quoting_an_env_token_a_dsn_or_a_header_is_redacted(
    logs, tmp_path, monkeypatch
):
    """Error texts are redacted where they are made: a token from the environment (no
    key shape; the host registers what variables named like credentials hold), a DSN's
    password, an MCP server's error result echoing the header it was given."""
    monkeypatch.setenv("BILLING_API_TOKEN", SERVICE_TOKEN)
    stream, caplog = logs
    secrets = (SERVICE_TOKEN, DSN_PASSWORD, HEADER_TOKEN)
    async with loopback_server(respond=EchoingErrorServer()) as web:
        server = MCPServer.http(
            f"{web.url}/mcp", name="web", headers={"Authorization": f"Token {HEADER_TOKEN}"}
        )
        provider = calling(("call_service", {"what": "x"}), ("query", {"sql": "1"}), ("echo", {}))
        agent = Agent(provider=provider, tools=[call_service, query, server])
        async with Host.open(store=str(tmp_path / "sessions.db")) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                chunks = [c async for c in out]
    errors = {m.tool_name: m.error for m in session.messages if m.role == "tool"}
    # ("Token [redacted]" or "[redacted]": the header's value or its token word first)
    errors["echo"] = errors["echo"].replace("Token [redacted]", "[redacted]")
    assert errors == {
        "call_service": "tool call_service raised RuntimeError: the service refused x with "
        "token [redacted]",
        "query": "tool query raised ConnectionError: could not connect to "
        "postgresql://app:[redacted]@db:5432/app",
        "echo": "tool echo raised MCPToolError: unauthorized: [redacted]",
    }
    ui = b"".join(sse(c) for c in encode_turn(chunks))
    saved = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    told = repr(list(provider.requests))  # what the model was told: the same texts
    assert "token [redacted]" in told
    _unsaid(stream.getvalue(), caplog.text, repr(chunks), ui, saved, told, secrets=secrets)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("github_pat", False),
        ("PWD", False),  # the working directory
        ("SSL_KEY_FILE", False),  # a path
        ("TOKENIZERS_PARALLELISM", False),
        ("KEYBOARD", False),
    ],
)
def test_an_environment_variable_is_a_secret_by_the_words_of_its_name(name, secret):
    assert is_secret_env_name(name) is secret


def test_an_environment_urls_credentials_are_registered():
    password = "password-of-database-url-1414"
    register_env_secrets({"DATABASE_URL": f"postgresql://app:{password}@db/app", "PWD": "/srv/a"})
    assert redact_text(f"authentication failed: {password}") == "authentication failed: [redacted]"
    assert redact_text("/srv/a/b") == "/srv/a/b"


async def test_a_query_key_the_sdk_appended_its_path_to_keeps_the_path(logs):
    """The OpenAI SDK appends its path to the base URL, query and all: ``/v1?key=K``
    is sent as ``/v1/?key=Kchat/completions``. The key is a registered secret (the
    provider registered its base URL's), so only it is redacted, not the path."""
    _, caplog = logs
    key = "query-key-glued-to-the-path-9031"
    async with loopback_server(Reply(body=oa_answer("hello"))) as server:
        agent = Agent(provider=OpenAIProvider("m", base_url=f"{server.url}/v1?key={key}"))
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            await session.run("go")
    [sent] = server.requests
    assert sent.path == f"/v1/?key={key}chat/completions"  # what the real client sent
    [line] = [r.getMessage() for r in caplog.records if r.name in HTTP_CLIENT_LOGGERS]
    assert line.endswith('/v1/?key=[redacted]chat/completions "HTTP/1.1 200 "')


@pytest.mark.parametrize("module", ["actors.providers", "actors.mcp", "actors.a2a"])
def test_each_client_modules_http_request_lines_are_redacted_before_any_client_is_built(
    module: str,
) -> None:
    """A fresh process that imports a client's module (the providers', MCP's, A2A's) and
    builds nothing, nor configures logging, has the filter on the HTTP clients' and their
    stacks' loggers (put there once, by :mod:`runtime.logging` as it is imported): no client's
    constructor path can miss it."""
    import subprocess
    import sys

    check = (
        "import importlib, logging, sys\n"
        f"importlib.import_module({module!r})\n"
        "lines = sys.modules['runtime.logging'].HTTP_CLIENT_LINES\n"
        "logs = sys.modules['runtime.logging']\n"
        "names = (*logs.HTTP_CLIENT_LOGGERS, *logs.HTTP_STACK_LOGGERS)\n"
        "print(sorted({lines in logging.getLogger(n).filters for n in names}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True]"


GATEWAY_KEY = "gateway-key-of-no-shape-3310"
"""An AI gateway's key, sent in a header of its own (``X-Portkey-Api-Key``,
``cf-aig-authorization``) through the provider's ``extra_headers``."""


@pytest.mark.parametrize("header", ["X-Portkey-Api-Key", "cf-aig-authorization"])
async def test_a_gateways_key_in_extra_headers_is_redacted_when_its_401_quotes_it(header):
    echo = f"gateway refused {GATEWAY_KEY}"
    body = json.dumps({"error": {"message": echo, "type": "invalid_request_error"}})
    reply = Reply(body=body.encode(), status=401, content_type="application/json")
    value = f"Bearer {GATEWAY_KEY}" if "authorization" in header else GATEWAY_KEY
    async with loopback_server(reply) as server:
        provider = OpenAIProvider(
            "m", base_url=f"{server.url}/v1", api_key=KEY, extra_headers={header: value}
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            result = await session.run("go")
    [sent] = server.requests
    assert sent.headers[header.lower()] == value  # the real client did send it
    assert result.error is not None and result.error.message == "gateway refused [redacted]"


@pytest.mark.parametrize("kind", ["openai", "openai-responses", "anthropic"])
async def test_a_gateways_key_in_an_agents_own_extra_headers_is_redacted_when_its_401_quotes_it(
    kind: str,
) -> None:
    """The header given per call (the agent's ``settings``, which go in every call's
    request, over the provider's ``request_options``) rather than to the provider."""
    from actors.providers import AnthropicProvider, OpenAIResponsesProvider

    secret = f"per-call-gateway-key-{kind}-4471"  # (one per case: secrets are the process's)
    echo = f"gateway refused {secret}"
    error = {"type": "error", "error": {"type": "authentication_error", "message": echo}}
    if kind != "anthropic":
        error = {"error": {"message": echo, "type": "invalid_request_error"}}
    reply = Reply(body=json.dumps(error).encode(), status=401, content_type="application/json")
    async with loopback_server(reply) as server:
        maker = {
            "openai": OpenAIProvider,
            "openai-responses": OpenAIResponsesProvider,
            "anthropic": AnthropicProvider,
        }[kind]
        base = server.url if kind == "anthropic" else f"{server.url}/v1"
        provider = maker("m", base_url=base, api_key=KEY)
        agent = Agent(provider=provider, settings={"extra_headers": {"X-Portkey-Api-Key": secret}})
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            result = await session.run("go")
    sent = server.requests[0]
    assert sent.headers["x-portkey-api-key"] == secret  # the real client did send it
    assert result.error is not None and result.error.message == "gateway refused [redacted]"


def test_a_gateways_session_label_in_extra_headers_stays_readable_and_its_key_hidden():
    # Helicone's session headers name a session (a label, a path): registered as
    # secrets they were hidden in every log line and error text that named them, and
    # a label's words after its first ("Quokka Support Desk": "Support Desk") too.
    from actors.providers.sdk import register_header_secrets

    register_header_secrets(
        {
            "Helicone-Session-Name": "Quokka Support Desk",
            "Helicone-Session-Path": "/quokka/support-desk",
            "Helicone-Auth": "Bearer hk-quokka-0a1b2c3d4e5f6a7b",
        }
    )
    text = "Quokka Support Desk at /quokka/support-desk; Support Desk"
    assert redact_text(text) == text
    assert redact_text("refused hk-quokka-0a1b2c3d4e5f6a7b") == "refused [redacted]"
