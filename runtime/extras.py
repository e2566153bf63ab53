"""The optional packages a part of Axon needs, checked where that part is first used.

An agent's MCP tool servers (the MCP client, :mod:`actors.mcp`) and serving the agent
over MCP (``mcp-server``, ``serve --protocols mcp``: the application) need the same
packages, the ``mcp`` extra. The actors and the application both import the contract,
never each other, so the one check, and the one message naming the extra to install,
live here: there were two, with two messages.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import ConfigurationError

MCP_EXTRA = "pip install 'axon-runtime[mcp]'"


def require_mcp(what: str) -> tuple[Any, Any]:
    """The ``mcp`` and ``mcp_types`` modules, imported only now (importing Axon imports
    neither). Either missing is a :class:`~runtime.errors.ConfigurationError` naming
    ``what`` needs it and the extra to install: ``mcp-server needs the mcp package, which
    is not installed: pip install 'axon-runtime[mcp]'``."""
    try:
        import mcp
        import mcp_types
    except ImportError as exc:
        raise ConfigurationError(
            f"{what} needs the {exc.name or 'mcp'} package, which is not installed: {MCP_EXTRA}"
        ) from None
    return mcp, mcp_types
