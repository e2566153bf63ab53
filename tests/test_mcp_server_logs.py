"""What the ``mcp`` package's server logs while Axon serves an agent over MCP carries no
session's id, nor what a client sent, into a log at any level: its info lines name each
session's id (the bearer of the session) and an id a client made up, its debug lines a
frame whole. :class:`runtime.logging.MCPServerLines` drops those and scrubs its warnings,
on the package's server loggers, before Axon's sink or an application's root handler
sees them. benchmarks/journal/pipeline.md ("logs2")."""

from __future__ import annotations

import importlib
import logging
import pkgutil

import mcp.server
import pytest

from runtime.logging import (
    MCP_CLIENT_LOGGERS,
    MCP_SERVER_LINES,
    MCP_SERVER_LOGGERS,
    configure_logging,
)
from tests.test_mcp_server import MCP
from tests.test_mcp_session_ends import call, client, open_session, quick_agent
from tests.web.harness import web_server

PROMPT = "the-users-own-words-in-a-call-4471"
KEY = "sk-ant-api03-" + "Z1x2C3v4B5n6M7a8S9d0F1g2H3j4"


def _sdk(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    names = (*MCP_SERVER_LOGGERS, *MCP_CLIENT_LOGGERS)
    return [r for r in caplog.records if r.name in names]


async def test_a_served_sessions_id_and_a_clients_words_reach_no_log(logs):
    stream, caplog = logs
    async with web_server(quick_agent(), protocols=MCP) as server:
        async with client(server) as raw:
            session = await open_session(raw)
            answered = await raw.post("/mcp", json=call(5, PROMPT), headers=session)
            forged = {**session, "mcp-session-id": f"forged-{PROMPT}"}
            refused = await raw.post("/mcp", json=call(6, PROMPT), headers=forged)
            await raw.delete("/mcp", headers=session)
    assert answered.status_code == 200 and refused.status_code == 404
    said = "\n".join(r.getMessage() for r in _sdk(caplog))
    assert session["mcp-session-id"] not in said and PROMPT not in said
    assert session["mcp-session-id"] not in stream.getvalue()
    assert all(r.levelno >= logging.WARNING for r in _sdk(caplog))


def test_every_logger_of_the_mcp_server_is_filtered():
    # A filter on a logger sees its own records only: each module's logger is named.
    names = set()
    for module in pkgutil.walk_packages(mcp.server.__path__, "mcp.server."):
        if module.name.endswith("__main__") or module.name == "mcp.server.fastmcp":
            continue  # (fastmcp: a module that only raises, naming its new name)
        found = importlib.import_module(module.name)
        for attribute in ("logger", "_logger"):
            logger = getattr(found, attribute, None)
            if isinstance(logger, logging.Logger):
                names.add(logger.name)
    assert names and names <= set(MCP_SERVER_LOGGERS)
    configure_logging("warning")
    for name in MCP_SERVER_LOGGERS:
        assert MCP_SERVER_LINES in logging.getLogger(name).filters


def test_an_mcp_server_error_keeps_its_traceback_redacted_and_its_line_cut(logs):
    stream, caplog = logs
    logger = logging.getLogger("mcp.server.streamable_http_manager")
    try:
        raise ValueError(f"the handler saw {KEY}")
    except ValueError:
        logger.exception("Session %s crashed", "x" * 1_000)
    logger.info("Created new transport with session ID: %s", PROMPT)
    [record] = [r for r in caplog.records if r.name == logger.name]
    assert record.levelno == logging.ERROR
    text = record.getMessage()
    assert text.startswith("Session xxx") and text.endswith("characters more)")
    assert "Traceback" in caplog.text and "ValueError: the handler saw [redacted]" in caplog.text
    assert KEY not in caplog.text and PROMPT not in caplog.text
    assert KEY not in stream.getvalue()
