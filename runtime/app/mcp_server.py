"""``python -m runtime mcp-server``: an agent as an MCP tool, over stdio.

    python -m runtime mcp-server                               # the offline demo agent
    python -m runtime mcp-server --agent myapp.agents:support --store sessions.db

An MCP client launches it as a subprocess and speaks MCP on its stdin and stdout (the
way Claude Desktop, an IDE, or Axon's own ``MCPServer.stdio`` start a server). The
server is the one ``serve --protocols mcp`` mounts at ``/mcp``
(:mod:`runtime.app.mcp_tools`): one tool named after the agent, a call one turn, on a
:class:`~runtime.app.host.Host` of this process with the ``--store`` given (memory by
default, so conversations last as long as the process). Logs go to stderr, never to
stdout, which is the protocol's.

It ends when the client closes stdin; SIGINT/SIGTERM cancel the running turns (saved,
marked interrupted, as a chat client's that leaves) and end it once they are saved: the
calls they answered are cut off with the connection.
Bad options are one ``error:`` line on stderr and exit status 2, before the protocol starts.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import trio

from runtime.app.commands import (
    MCP_HELP,
    add_agent_arguments,
    add_log_level_argument,
    add_plugin_argument,
    make_agent,
    make_plugins,
    non_negative,
)
from runtime.app.host import Host
from runtime.app.session import FINAL_WAIT
from runtime.extras import require_mcp
from runtime.logging import configure_logging


def add_mcp_server_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``mcp-server`` on ``build_parser()``'s subparsers (imports no ``mcp``)."""
    parser = subparsers.add_parser(
        "mcp-server",
        help="serve the agent as an MCP tool over stdio (for MCP clients to launch)",
        description="Serve the agent as an MCP tool on stdin/stdout (docs/protocols.md).",
    )
    add_agent_arguments(parser)
    parser.add_argument(
        "--store",
        default=None,
        help="session store: an SQLite file or a postgresql:// URL (default: memory)",
    )
    parser.add_argument("--mcp", action="append", default=[], metavar="SERVER", help=MCP_HELP)
    parser.add_argument(
        "--delay",
        type=non_negative(float),
        default=0.0,
        help="scripted demo: seconds between chunks",
    )
    add_log_level_argument(parser, "warning", "; on stderr, stdout is the protocol's")
    add_plugin_argument(parser)
    parser.set_defaults(jsonl=False)
    return parser


async def mcp_server_command(args: argparse.Namespace) -> int:
    """Serve MCP on stdin/stdout until the client closes stdin or a signal comes."""
    configure_logging(args.log_level)
    agent = make_agent(args)
    plugins = make_plugins(args)
    require_mcp("mcp-server")
    from mcp.server.stdio import stdio_server  # mcp: only when serving

    from runtime.app.mcp_tools import AgentTools, HostSessions, build_server

    async with Host.open(store=args.store) as host:
        host.forgets_unsaved = True  # its client is told a refused save as not saved
        for plugin in plugins:
            await host.start_actor(plugin)
        tools = AgentTools(HostSessions(host, agent))
        server = build_server(tools)
        async with _protocol_input() as stdin:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stop_on_signal, host, tools, nursery.cancel_scope)
                async with stdio_server(stdin=cast(Any, stdin)) as (read, write):
                    await server.run(read, write, server.create_initialization_options())
                nursery.cancel_scope.cancel()
    return 0


async def _stop_on_signal(host: Host, tools: Any, scope: trio.CancelScope) -> None:
    """On SIGINT/SIGTERM: cancel the running turns, wait until their calls are over (the
    turns saved, marked interrupted; at most ``FINAL_WAIT`` seconds), then stop."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            host.cancel_turns("server shutdown")
            with trio.move_on_after(FINAL_WAIT):
                await tools.idle()
            scope.cancel()
            return


class _Lines:
    """The protocol's input lines, read from ``fd`` by Trio without a thread.

    The ``mcp`` package reads stdin with ``readline`` in a worker thread, which nothing
    but input (or the client closing stdin) ends: a shutdown on SIGTERM would wait for
    the client. Read here, a cancellation stops it at once."""

    def __init__(self, fd: int) -> None:
        self.stream = trio.lowlevel.FdStream(fd)
        self.buffer = bytearray()
        self.scanned = 0

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while (end := self.buffer.find(b"\n", self.scanned)) < 0:
            self.scanned = len(self.buffer)
            data = await self.stream.receive_some(65536)
            if not data:
                if not self.buffer:
                    raise StopAsyncIteration
                end = len(self.buffer)
                break
            self.buffer += data
        line = bytes(self.buffer[: end + 1])
        del self.buffer[: end + 1]
        self.scanned = 0
        return line.decode("utf-8", errors="replace")

    async def aclose(self) -> None:
        await self.stream.aclose()


@asynccontextmanager
async def _protocol_input() -> AsyncIterator[_Lines]:
    """The protocol's input, on a private copy of fd 0, with fd 0 itself pointed at the
    null device while serving (as the ``mcp`` package does for the stdin it claims), so
    nothing a tool runs can read the protocol's bytes; restored afterwards."""
    wire = os.dup(0)
    saved = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    lines = _Lines(wire)  # owns ``wire`` (closed with the stream)
    try:
        yield lines
    finally:
        with trio.CancelScope(shield=True):
            await lines.aclose()  # restores the descriptor's blocking mode
        os.dup2(saved, 0)
        os.close(saved)


__all__ = ["add_mcp_server_parser", "mcp_server_command"]
