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
from runtime.media import DEFAULT_MAX_FILES, DEFAULT_MAX_PARTS, InputLimits
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


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 1")
    return number


def add_input_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-parts`` and ``--max-files``, the same on ``serve`` and ``worker``: how many
    parts one user message may carry (:class:`~runtime.media.InputLimits`)."""
    add = parser.add_argument
    add(
        "--max-parts",
        type=_count,
        default=DEFAULT_MAX_PARTS,
        metavar="N",
        help=f"most parts (text, images, files) in one user message (default {DEFAULT_MAX_PARTS})",
    )
    add(
        "--max-files",
        type=_count,
        default=DEFAULT_MAX_FILES,
        metavar="N",
        help=f"most images and files in one user message (default {DEFAULT_MAX_FILES})",
    )


def input_limits(args: argparse.Namespace) -> InputLimits:
    """The :class:`~runtime.media.InputLimits` that ``--max-parts``/``--max-files`` say."""
    return InputLimits(max_parts=args.max_parts, max_files=args.max_files)


def make_agent(args: argparse.Namespace) -> Agent:
    """The agent of ``run`` and ``serve``, with the ``--mcp`` servers' tools (docs/mcp.md)."""
    agent = _provider_agent(args)
    if getattr(args, "mcp", None):
        servers = tuple(MCPServer.parse(spec) for spec in args.mcp)
        agent = attrs.evolve(agent, mcp_servers=(*agent.mcp_servers, *servers))
    return agent


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
