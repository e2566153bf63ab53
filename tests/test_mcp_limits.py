"""The bounds of ``/mcp``'s sessions (branch ``mcplimits``): a session whose client left
without its ``DELETE`` expires (``--mcp-session-idle``), the sessions held at once are
capped (``--mcp-max-sessions``: 503 with ``Retry-After`` past it), a GET stream held
open, read or not, ends at ``--mcp-stream-max-age`` so its session can idle out, and the
``mcp`` package's ERROR and traceback for a POST racing its session's ``DELETE`` is one
INFO line. Real short limits (a second, three sessions) on a loopback server, each wait
guarded by ``trio.fail_after``.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
import trio

from runtime.app.web.protocols import MCP_MAX_SESSIONS, MCP_SESSION_IDLE, MCPLimits
from tests.test_mcp_session_ends import (
    INIT,
    MCP,
    call,
    client,
    left,
    manager,
    open_session,
    quick_agent,
    sdk_tasks,
    until,
)
from tests.web.harness import web_server


async def test_the_transport_takes_axons_session_bounds_not_the_packages():
    async with web_server(quick_agent(), protocols=MCP) as server:
        transport = manager(server)
    assert transport.session_idle_timeout == MCP_SESSION_IDLE == 600
    assert transport.max_sessions == MCP_MAX_SESSIONS == 1000


async def test_a_session_left_without_a_delete_expires_after_the_idle_limit():
    limits = MCPLimits(session_idle=1)
    async with web_server(quick_agent(), protocols=MCP, mcp_limits=limits) as server:
        async with client(server) as raw:
            await open_session(raw)
        assert len(manager(server)._server_instances) == 1
        with trio.fail_after(10):
            assert await left(server) == (0, {})


async def test_past_the_session_cap_a_new_session_is_refused_503_with_retry_after():
    limits = MCPLimits(max_sessions=3)
    async with web_server(quick_agent(), protocols=MCP, mcp_limits=limits) as server:
        async with client(server) as raw:
            sessions = [await open_session(raw) for _ in range(3)]
            refused = await raw.post("/mcp", json=INIT)
            kept = await raw.post(
                "/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "ping"}, headers=sessions[0]
            )
            await raw.delete("/mcp", headers=sessions[0])
            again = await raw.post("/mcp", json=INIT)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "60"
    assert refused.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32603, "message": "Too many open sessions"},
    }
    assert kept.status_code == 200
    assert again.status_code == 200


async def test_a_get_stream_never_read_ends_at_its_max_age_and_its_session_idles_out():
    # The transport counts an open GET stream as a request in flight: the session's idle
    # countdown never started while the client held the connection.
    limits = MCPLimits(session_idle=1, stream_max_age=1)
    async with web_server(quick_agent(), protocols=MCP, mcp_limits=limits) as server:
        async with client(server) as raw:
            session = await open_session(raw)
            get = {**session, "accept": "text/event-stream"}
            async with raw.stream("GET", "/mcp", headers=get) as stream:
                assert stream.status_code == 200
                with trio.fail_after(10):
                    assert await left(server) == (0, {})
                    body = b"".join([chunk async for chunk in stream.aiter_bytes()])
    assert b"data:" not in body  # (it ended whole, with nothing sent)


async def test_a_get_stream_ended_at_its_max_age_is_opened_again_in_its_session():
    limits = MCPLimits(stream_max_age=1)
    async with web_server(quick_agent(), protocols=MCP, mcp_limits=limits) as server:
        async with client(server) as raw:
            session = await open_session(raw)
            get = {**session, "accept": "text/event-stream"}
            statuses = []
            for _ in range(2):
                with trio.fail_after(10):
                    async with raw.stream("GET", "/mcp", headers=get) as stream:
                        statuses.append(stream.status_code)
                        [_ async for _ in stream.aiter_bytes()]  # (until it ends)
            assert list(manager(server)._server_instances) == [session["mcp-session-id"]]
            with trio.fail_after(10):
                await until(lambda: not sdk_tasks()["standalone_sse_writer"])
    assert statuses == [200, 200]


class PublicOnly:
    """The ``mcp`` package's session manager as :class:`MCPEndpoint` may use it: its
    public methods; any private attribute read from outside the package fails."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{name!r} is the mcp package's own")
        return getattr(self._manager, name)


async def test_a_get_stream_ages_out_without_reading_the_packages_private_attributes():
    # The endpoint used to find the session's transport in the manager's private
    # ``_server_instances`` and skipped the age quietly when it was not there: this
    # stream then stayed open (the wait below timed out).
    limits = MCPLimits(stream_max_age=1)
    async with web_server(quick_agent(), protocols=MCP, mcp_limits=limits) as server:
        (route,) = [r for r in server.app.router.routes if getattr(r, "path", None) == "/mcp"]
        real = route.endpoint.manager
        route.endpoint.manager = PublicOnly(real)
        async with client(server) as raw:
            session = await open_session(raw)
            get = {**session, "accept": "text/event-stream"}
            statuses = []
            for _ in range(2):  # (the first one's place for the session's GET stream freed)
                with trio.fail_after(10):
                    async with raw.stream("GET", "/mcp", headers=get) as stream:
                        statuses.append(stream.status_code)
                        body = b"".join([chunk async for chunk in stream.aiter_bytes()])
            assert list(real._server_instances) == [session["mcp-session-id"]]
            ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
            kept = await raw.post("/mcp", json=ping, headers=session)
    assert statuses == [200, 200] and b"data:" not in body
    assert kept.status_code == 200  # the session lives on after its stream's age


def sdk_log(exc: BaseException, message: str) -> None:
    """Log ``message`` as the transport does, from its handler of ``exc``."""
    try:
        raise exc
    except BaseException:
        logging.getLogger("mcp.server.streamable_http").exception(message)


@pytest.mark.parametrize("message", ["Error handling POST request", "SSE response error"])
@pytest.mark.parametrize(
    "exc",
    [
        anyio.ClosedResourceError(),
        anyio.BrokenResourceError(),
        ExceptionGroup("", [anyio.ClosedResourceError()]),
    ],
    ids=["closed", "broken", "group"],
)
def test_a_post_racing_its_sessions_delete_logs_one_info_line(caplog, message, exc):
    from runtime.app.web.mcp_endpoint import quiet_ended_session_races

    quiet_ended_session_races()
    with caplog.at_level(logging.INFO, logger="mcp.server.streamable_http"):
        sdk_log(exc, message)
    (record,) = caplog.records
    assert (record.levelno, record.exc_info, record.exc_text) == (logging.INFO, None, None)
    assert record.getMessage().startswith(f"{message}: its session ended as it was sent (")
    assert "Traceback" not in caplog.text


def test_a_race_record_is_dropped_where_the_loggers_level_is_above_info(caplog):
    # Rewritten to INFO after the logger let it pass at ERROR: its handlers took it.
    from runtime.app.web.mcp_endpoint import quiet_ended_session_races

    quiet_ended_session_races()
    logger = logging.getLogger("mcp.server.streamable_http")
    kept: list[logging.LogRecord] = []
    handler = logging.Handler()  # (of no level: the record's own decides)
    handler.emit = kept.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            sdk_log(anyio.ClosedResourceError(), "SSE response error")
    finally:
        logger.removeHandler(handler)
    assert kept == []


@pytest.mark.parametrize(
    "exc",
    [ValueError("boom"), ExceptionGroup("", [anyio.ClosedResourceError(), ValueError("boom")])],
    ids=["other", "mixed-group"],
)
def test_another_error_in_those_records_keeps_its_traceback(caplog, exc):
    from runtime.app.web.mcp_endpoint import quiet_ended_session_races

    quiet_ended_session_races()
    with caplog.at_level(logging.INFO, logger="mcp.server.streamable_http"):
        sdk_log(exc, "Error handling POST request")
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "Traceback" in caplog.text


async def test_calls_and_notifications_racing_their_sessions_delete_log_no_traceback(caplog):
    # branch mcpreap: 12 in 50 notifications ("Error handling POST request") and 7 in 50
    # calls ("SSE response error") racing their session's DELETE logged ERROR with a
    # traceback. (A race: each of the 40 rounds sends both.)
    notified = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
    async with web_server(quick_agent(), protocols=MCP) as server:
        with caplog.at_level(logging.INFO, logger="mcp.server.streamable_http"):
            async with client(server) as raw:
                for _ in range(40):
                    session = await open_session(raw)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(
                            lambda s=session: raw.post("/mcp", json=call(2), headers=s)
                        )
                        nursery.start_soon(
                            lambda s=session: raw.post("/mcp", json=notified, headers=s)
                        )
                        nursery.start_soon(lambda s=session: raw.delete("/mcp", headers=s))
                assert await left(server) == (0, {})
    sdk = [r for r in caplog.records if r.name == "mcp.server.streamable_http"]
    assert [r.getMessage() for r in sdk if r.exc_info or r.levelno >= logging.ERROR] == []


def test_serves_mcp_options_set_the_limits():
    import argparse

    from runtime.app.web.serve import add_serve_arguments, mcp_limits

    parser = add_serve_arguments(argparse.ArgumentParser())
    assert mcp_limits(parser.parse_args([])) == MCPLimits()
    given = ["--mcp-session-idle", "30", "--mcp-max-sessions", "off"]
    given += ["--mcp-stream-max-age", "60"]
    limits = MCPLimits(session_idle=30, max_sessions=None, stream_max_age=60)
    assert mcp_limits(parser.parse_args(given)) == limits
