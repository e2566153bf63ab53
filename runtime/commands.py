"""What the ``run`` and ``serve`` commands share: the agent their options describe, and
how bad input is reported.

Both command modules import this one; neither imports the other for it, so the command
line (:mod:`runtime.cli`) and the web server (:mod:`runtime.web.serve`) assemble their
agent from one definition.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import attrs

from actors.mcp import MCPServer
from actors.providers.registry import create_provider, provider_names
from runtime.agent import Agent
from runtime.errors import InvalidSessionId, MediaError, StoreError
from runtime.provider import ProviderOptions

MCP_HELP = "an MCP tool server: a command line to launch (stdio) or an http(s):// URL (repeatable)"


class BadInput(Exception):
    """Input the command cannot use; reported as one line, exit status 2."""


USAGE_EXIT = 2


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    return (BadInput, InvalidSessionId, MediaError, StoreError)


def report_bad_input(command: Callable[[], int]) -> int:
    """Run ``command``; bad input (:func:`_bad_input_errors`, alone or as the only errors
    of an exception group) becomes ``error: <message>`` on stderr and exit status 2,
    with no traceback. Anything else propagates."""
    bad = _bad_input_errors()
    try:
        return command()
    except bad as exc:
        return _fail(exc)
    except BaseExceptionGroup as group:
        match, rest = group.split(bad)
        if match is None or rest is not None:
            raise
        found: BaseException = match
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        return _fail(found)


def _fail(exc: BaseException) -> int:
    sys.stderr.write(f"error: {exc}\n")
    return USAGE_EXIT


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that describe the agent :func:`make_agent` builds (the provider and
    its settings), the same on ``run``, ``serve`` and ``worker``."""
    add = parser.add_argument
    add("--provider", choices=provider_names(), default="scripted")
    add("--model", default=None, help="model name for a real provider")
    add("--base-url", default=None, help="provider endpoint (any compatible server)")
    add("--api-key", default=None, help="API key (default: the SDK's env variable)")
    add("--thinking-budget", type=int, default=None, help="Anthropic thinking tokens")
    add("--instructions", default=None, help="system prompt")
    add(
        "--media-urls",
        choices=("on", "off"),
        default="on",
        help="'off' refuses images and files given by http(s) URL, which the model server "
        "would fetch (a self-hosted --base-url server: from inside your network)",
    )


def make_agent(args: argparse.Namespace) -> Agent:
    """The agent of ``run`` and ``serve``, with the ``--mcp`` servers' tools (docs/mcp.md)."""
    agent = with_media_urls(_provider_agent(args), args)
    if getattr(args, "mcp", None):
        servers = tuple(MCPServer.parse(spec) for spec in args.mcp)
        agent = attrs.evolve(agent, mcp_servers=(*agent.mcp_servers, *servers))
    return agent


def with_media_urls(agent: Agent, args: argparse.Namespace) -> Agent:
    """``agent``, refusing media by URL when ``--media-urls off`` says so."""
    if getattr(args, "media_urls", "on") != "off":
        return agent
    limits = attrs.evolve(agent.media_limits, allow_urls=False)
    return attrs.evolve(agent, media_limits=limits)


def _provider_agent(args: argparse.Namespace) -> Agent:
    """The agent for ``--provider`` (:mod:`actors.providers.registry`) with the demo's
    tools."""
    # The demo's @tool schemas are built with pydantic when runtime.demo is imported:
    # imported here, so `--help` and argument errors do not pay for it.
    from runtime.demo import get_time, get_weather

    delay = (
        args.delay
        if args.delay is not None
        else (0.02 if sys.stdout.isatty() and not args.jsonl else 0.0)
    )
    options = ProviderOptions(
        model=args.model,
        base_url=args.base_url,
        api_key=args.api_key,
        thinking_budget=args.thinking_budget,
        delay=delay,
    )
    return Agent(
        name=args.provider,
        provider=create_provider(args.provider, options),
        instructions=args.instructions or "You are a concise assistant. Use tools for facts.",
        tools=[get_weather, get_time],
        output_type=getattr(args, "output_type", None),
    )
