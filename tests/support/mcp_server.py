"""A real MCP server for the tests, written with the ``mcp`` package's ``MCPServer``.

    python tests/support/mcp_server.py                  # stdio
    python tests/support/mcp_server.py --http PORT      # streamable HTTP on 127.0.0.1
    python tests/support/mcp_server.py --bad-schema     # one tool with an invalid schema
    python tests/support/mcp_server.py --ref-schemas URL  # tools whose schemas use $ref
    python tests/support/mcp_server.py --patterned      # and ``code``, with a ``pattern``

Tools: ``add`` (structured int), ``echo`` (text), ``fail`` (``isError``), ``slow`` (sleeps,
to be cancelled or timed out), ``grow`` (adds ``double`` and announces
``tools/list_changed``), ``die`` (the process exits mid-call), and ``count_starts``
(how many times a process was started in ``MCP_TEST_STATE``, to see restarts).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

server = MCPServer("test-server", log_level="CRITICAL")
STATE = os.environ.get("MCP_TEST_STATE")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer; records a cancellation in MCP_TEST_STATE/cancelled."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        if STATE:
            Path(STATE, "cancelled").write_text("yes")  # noqa: ASYNC240 - a test marker
        raise
    return "slept"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool ``double`` and tell the client its list changed."""
    server.add_tool(_double, name="double", description="Double a number.")
    await ctx.session.send_tool_list_changed()
    return "grown"


def _double(x: int) -> int:
    return 2 * x


@server.tool()
def die() -> str:
    """The server process exits in the middle of the call."""
    os._exit(3)


@server.tool()
def count_starts() -> int:
    """How many server processes have started with this MCP_TEST_STATE."""
    return int(Path(STATE, "starts").read_text()) if STATE else 0


def _bad_schema() -> None:
    """Give ``broken`` an input schema that is not a valid JSON schema."""

    @server.tool()
    def broken(x: int) -> int:
        """A tool whose schema is wrong."""
        return x

    tool = server._tool_manager.get_tool("broken")
    tool.parameters = {"type": "object", "properties": {"x": {"type": "integer-ish"}}}


def _ref_schemas(url: str) -> None:
    """Tools whose input schemas hold a ``$ref``: ``remote`` to ``url`` (an attacker's
    listener), ``passwd`` to ``file:///etc/passwd``, ``relative`` to a file beside the
    schema, and ``defs`` to its own ``#/$defs`` (the one that must keep working)."""
    refs = {
        "remote": {"$ref": url},
        "passwd": {"$ref": "file:///etc/passwd"},
        "relative": {"$ref": "../secrets.json#/x"},
        "defs": {"$ref": "#/$defs/count"},
    }
    for name, ref in refs.items():

        def take(x: int) -> int:
            return x

        server.add_tool(take, name=name, description=f"A tool whose schema refers {name}.")
        tool = server._tool_manager.get_tool(name)
        tool.parameters = {
            "type": "object",
            "$defs": {"count": {"type": "integer", "minimum": 0}},
            "properties": {"x": ref},
            "required": ["x"],
        }


def _patterned() -> None:
    """A tool whose listed input schema has a ``pattern`` (``--patterned``)."""

    @server.tool()
    def code(code: Annotated[str, Field(pattern="^[A-Z]{3}$")]) -> str:
        """Take a code of three capital letters."""
        return code


if __name__ == "__main__":
    if STATE:
        starts = Path(STATE, "starts")
        starts.write_text(str(int(starts.read_text()) + 1 if starts.exists() else 1))
    if "--bad-schema" in sys.argv:
        _bad_schema()
    if "--patterned" in sys.argv:
        _patterned()
    if "--ref-schemas" in sys.argv:
        _ref_schemas(sys.argv[sys.argv.index("--ref-schemas") + 1])
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", port=port)
    else:
        server.run()
