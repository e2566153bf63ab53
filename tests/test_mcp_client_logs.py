"""What the ``mcp`` package's client logs never carries a server's messages into a log,
whatever the level: its debug lines hold whole JSON-RPC messages (``SSE message: ...``,
``Sending client message: ...``), its warnings text a server chose (``Unknown SSE event:
...``). :class:`runtime.logging.MCPClientLines` drops the first and scrubs the second,
on the package's loggers, before Axon's sink or an application's root handler sees them.
benchmarks/journal/pipeline.md ("mcpbounds")."""

from __future__ import annotations

import importlib
import json
import logging
import os
import pkgutil

import mcp
import mcp.client

from actors.mcp import MCPServer
from runtime import Agent, Host
from runtime.logging import MCP_CLIENT_LINES, MCP_CLIENT_LOGGERS, configure_logging
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.test_mcp_attacks import ForgetfulServer, calling

SHAPELESS = "tok-1234567890abcdef"
"""A header's value of no key shape (only a filter that keeps the line out hides it)."""
KEY = "sk-ant-api03-" + "Q7w8E9r0T1y2U3i4O5p6A7s8D9f0"
"""A key's shape (redacted wherever it is written)."""
ARGUMENT = "the-model-wrote-this-argument-42"


class TalkativeServer(ForgetfulServer):
    """Answers its tool over SSE with an event of a name it made up (the key), then the
    result, which echoes the ``Authorization`` header, the key and the call's argument."""

    def __init__(self) -> None:
        super().__init__()
        self.restarted = True  # never forgets its sessions

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/call":
            return super().__call__(request)
        said = f"{request.headers['authorization']} {KEY} {message['params']['arguments']}"
        result = {"content": [{"type": "text", "text": said}]}
        data = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        events = f"event: {KEY}\ndata: {{}}\n\nevent: message\ndata: {data}\n\n"
        return Reply(body=events.encode())


async def test_a_server_message_reaches_no_log_at_any_level(logs):
    stream, caplog = logs
    async with loopback_server(respond=TalkativeServer()) as web:
        server = MCPServer.http(web.url + "/mcp", name="web", headers={"Authorization": SHAPELESS})
        agent = Agent(provider=calling(("echo", {"text": ARGUMENT})), tools=[server])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            await session.run("go")
    [echo] = [m for m in session.messages if m.role == "tool"]
    assert SHAPELESS in echo.output and ARGUMENT in echo.output  # the server did say them
    for text in (stream.getvalue(), caplog.text):
        assert SHAPELESS not in text
        assert KEY not in text
        assert ARGUMENT not in text
    sdk = [r for r in caplog.records if r.name in MCP_CLIENT_LOGGERS]
    assert sdk and all(r.levelno >= logging.WARNING for r in sdk)
    [unknown] = [r.getMessage() for r in sdk if "Unknown SSE event" in r.getMessage()]
    assert unknown == "Unknown SSE event: [redacted]"


def test_every_logger_of_the_mcp_client_is_filtered():
    # A filter on a logger sees its own records only: each module's logger is named.
    # One added to the package (or renamed) would log its messages unfiltered.
    names = set()
    for module in pkgutil.walk_packages(mcp.client.__path__, "mcp.client."):
        if module.name.endswith("__main__"):
            continue
        logger = getattr(importlib.import_module(module.name), "logger", None)
        if isinstance(logger, logging.Logger):
            names.add(logger.name)
    assert names <= set(MCP_CLIENT_LOGGERS)
    configure_logging("warning")
    for name in MCP_CLIENT_LOGGERS:
        assert MCP_CLIENT_LINES in logging.getLogger(name).filters


def test_an_mcp_client_warning_is_one_scrubbed_line_without_its_traceback(logs):
    stream, caplog = logs
    logger = logging.getLogger("mcp.client.streamable_http")
    try:
        raise ValueError(f"the server said {KEY}")
    except ValueError:
        logger.exception("Error in post_writer %s", "x" * 1_000)
    logger.debug("SSE message: %s", ARGUMENT)
    [record] = [r for r in caplog.records if r.name == "mcp.client.streamable_http"]
    assert record.exc_info is None and record.levelno == logging.ERROR
    text = record.getMessage()
    assert text.startswith("Error in post_writer xxx") and KEY not in text
    assert text.endswith("characters more)") and len(text) < 600
    assert ARGUMENT not in caplog.text and ARGUMENT not in stream.getvalue()


def test_an_applications_own_logger_named_client_is_left_as_it_was(logs):
    """The ``mcp`` session logs under the bare name ``client``; an application's logger
    of that name keeps its debug lines and its tracebacks (only the package's own
    records are filtered)."""
    _stream, caplog = logs
    logger = logging.getLogger("client")
    logger.debug("the application's debug line %s", ARGUMENT)
    try:
        raise ValueError("the application's failure")
    except ValueError:
        logger.exception("the application failed")
    records = [r for r in caplog.records if r.name == "client"]
    assert [r.levelno for r in records] == [logging.DEBUG, logging.ERROR]
    assert records[0].getMessage() == f"the application's debug line {ARGUMENT}"
    assert records[1].exc_info is not None


def test_the_mcp_sessions_own_client_records_are_still_dropped(logs):
    """The package's records under ``client`` are still dropped below ``WARNING``: the
    filter knows them by the package's folder."""
    stream, caplog = logs
    package = os.path.join(mcp.__path__[0], "")
    record = logging.LogRecord(
        "client",
        logging.DEBUG,
        f"{package}client{os.sep}session.py",
        1,
        "SSE %s",
        (ARGUMENT,),
        None,
    )
    logging.getLogger("client").handle(record)
    assert ARGUMENT not in caplog.text and ARGUMENT not in stream.getvalue()
