"""What the ``run``, ``serve`` and ``worker`` commands share: the agent their options
describe, and how bad input is reported.

Both command modules import this one; neither imports the other for it, so the command
line (:mod:`runtime.app.cli`) and the web server (:mod:`runtime.app.web.serve`) assemble their
agent from one definition.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from actors.mcp import MCPServer
from actors.plugins.registry import PluginSpec, create_plugin
from actors.providers.registry import (
    create_provider,
    provider_for_model,
    provider_names,
    resolve_model,
    split_model,
)
from runtime.actor import Actor
from runtime.agent import Agent
from runtime.errors import (
    ConfigurationError,
    InvalidSessionId,
    MCPServerUnavailable,
    MediaError,
    StoreError,
    describe_exception,
)
from runtime.media import DEFAULT_MAX_FILES, DEFAULT_MAX_PARTS, InputLimits
from runtime.provider import CALL_TIMEOUT, IDLE_TIMEOUT, Provider, ProviderOptions
from runtime.redact import redact_url

MCP_HELP = "an MCP tool server: a command line to launch (stdio) or an http(s):// URL (repeatable)"

AgentSource = Agent | Callable[[str], Agent]
"""An agent for every session, or a function of the session id returning one."""

DEFAULT_MODELS = {
    "openai": "gpt-4o-mini",
    "openai-responses": "gpt-5-mini",
    "anthropic": "claude-sonnet-4-5",
    "google": "gemini-2.5-flash",
}
"""Each built-in real provider's model when ``--model`` is not given (what its
``from_options`` picks; listed here so ``--help`` says it without importing a provider)."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

AGENT_ONLY = ("model", "base_url", "api_key", "thinking_budget", "instructions", "output_schema")
"""Options that describe the agent ``--agent`` names in full: refused alongside it."""

DEADLINE_OPTIONS = ("call_timeout", "idle_timeout")
"""``--call-timeout`` and ``--idle-timeout``: the provider's two deadlines
(docs/providers.md#a-call-that-never-ends-the-deadlines). ``None`` when not given (the
provider keeps its own), ``0.0`` for ``0``/``none``/``off`` (no limit), else seconds.
Refused with ``--agent`` as :data:`AGENT_ONLY` are (its provider is the agent's own), by
``is not None``: ``0`` is given too."""

NO_DEADLINE = ("0", "none", "off")
"""What ``--call-timeout`` and ``--idle-timeout`` take for "no limit"."""


def program_name() -> str:
    """``axon`` when run as the installed ``axon`` script, else ``python3 -m runtime`` with
    the interpreter's own name (``python3``, ``python``, ``python3.12``...): the two are the
    same command, and usage lines (and the commands messages give) name the one that was
    typed, so that a copied line runs where plain ``python`` does not exist."""
    if os.path.basename(sys.argv[0]) == "axon":
        return "axon"
    return f"{os.path.basename(sys.executable or '') or 'python'} -m runtime"


class BadInput(Exception):
    """Input the command cannot use; reported as one line, exit status 2."""


USAGE_EXIT = 2


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    # ConfigurationError: an --agent that does not import, an MCP tool name clash...;
    # MCPServerUnavailable: an --mcp command that does not start.
    bad = (BadInput, InvalidSessionId, MediaError, StoreError)
    return (*bad, ConfigurationError, MCPServerUnavailable)


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
    say_on_stderr(f"error: {exc}\n")
    return USAGE_EXIT


def say_on_stderr(text: str) -> None:
    """Write ``text`` for the person on stderr; a stderr that is gone (a pipe whose
    reader left, ``axon run ... 2>&1 | head -1``) drops it: the exit status still tells.
    Raising there was taken for the reader of stdout leaving: a turn not saved exited 0."""
    try:
        sys.stderr.write(text)
    except (OSError, ValueError):
        pass


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that describe the agent :func:`make_agent` builds (the provider and
    its settings, or ``--agent``), the same on ``run``, ``serve`` and ``worker``."""
    add = parser.add_argument
    add(
        "--provider",
        choices=provider_names(),
        default="scripted",
        help="the model's provider: scripted (the offline demo: no key, no network), "
        "openai (Chat Completions, or any compatible server with --base-url), "
        "openai-responses, anthropic, google (Gemini), anthropic-vertex, anthropic-bedrock, "
        "or a plug-in's (default: the one a provider: prefix of --model names, else scripted)",
    )
    models = ", ".join(f"{model} for {name}" for name, model in DEFAULT_MODELS.items())
    add(
        "--model",
        default=None,
        help="model name, or provider:model to choose the provider too "
        f"(openai:gpt-4o-mini, google:gemini-2.5-flash; default: {models}; "
        "anthropic-vertex and anthropic-bedrock: Claude Sonnet 4.5's id on each platform)",
    )
    add("--base-url", default=None, help="provider endpoint (any compatible server)")
    add(
        "--api-key",
        default=None,
        help="API key (default: the SDK's variable, OPENAI_API_KEY, ANTHROPIC_API_KEY, "
        "GEMINI_API_KEY; for anthropic-vertex an access token, for anthropic-bedrock a "
        "Bedrock API key: default their platform's credentials)",
    )
    add(
        "--thinking-budget",
        type=int,
        default=None,
        help="thinking tokens (Anthropic, Gemini)",
    )
    add(
        "--instructions",
        default=None,
        help="system prompt (default: none; the scripted demo's own)",
    )
    add(
        "--demo-tools",
        action="store_true",
        help="offer the demo's get_weather (invented weather) and get_time tools to a real "
        "provider too (the scripted demo always has them)",
    )
    add(
        "--agent",
        default=None,
        metavar="MODULE:NAME",
        help="your own agent instead of the one the options above describe: an Agent, or a "
        "function of the session id returning one (--mcp adds its servers to it)",
    )
    add(
        "--media-urls",
        choices=("on", "off"),
        default="on",
        help="'off' refuses images and files given by http(s) URL, which the model server "
        "would fetch (a self-hosted --base-url server: from inside your network)",
    )
    add(
        "--call-timeout",
        type=deadline_seconds,
        default=None,
        metavar="SECONDS",
        help="most seconds one model call may take, whatever it streams (CallTimeout, not "
        f"retried); 0 or none: no limit (default: {CALL_TIMEOUT:g} for the real providers, "
        "none for scripted; time the reader of the answer takes to read it does not count)",
    )
    add(
        "--idle-timeout",
        type=deadline_seconds,
        default=None,
        metavar="SECONDS",
        help="most seconds one model call may stream nothing, keep-alives not counted "
        f"(IdleTimeout, retried); 0 or none: no limit (default: {IDLE_TIMEOUT:g} for the real "
        "providers, none for scripted)",
    )


def deadline_seconds(value: str) -> float:
    """An argparse ``type`` for ``--call-timeout``/``--idle-timeout``: a finite number of
    seconds above 0, or ``0``/``none``/``off`` (:data:`NO_DEADLINE`) for no limit, read
    as ``0.0``; anything else a one-line usage error (exit status 2) before anything
    runs, rather than a ConfigurationError when the provider is built."""
    if value.strip().lower() in NO_DEADLINE:
        return 0.0
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a positive number of seconds (0 or none: no limit)"
        )
    return number


def apply_deadlines(provider: Provider, args: argparse.Namespace) -> Provider:
    """``provider`` with the deadlines ``--call-timeout``/``--idle-timeout`` give (the
    ones not given left as the provider has them). Set on the instance, as the base
    class keeps them: so a plug-in provider's ``from_options``, which knows nothing of
    them, gets them too."""
    for name in DEADLINE_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            setattr(provider, name, value or None)
    return provider


def positive(kind: type) -> Any:
    """An argparse ``type`` taking a number of ``kind`` greater than 0 (else a one-line
    usage error)."""

    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            number = None
        if number is None or not number > 0:
            raise argparse.ArgumentTypeError(f"{value!r} is not a positive {kind.__name__}")
        return number

    return parse


def non_negative(kind: type) -> Any:
    """An argparse ``type`` taking a number of ``kind`` that is 0 or more (else a one-line
    usage error, not a turn that fails on it: ``--delay -1``)."""

    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            number = None
        if number is None or not number >= 0:
            raise argparse.ArgumentTypeError(f"{value!r} is not a {kind.__name__} of 0 or more")
        return number

    return parse


def add_input_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-parts`` and ``--max-files``, the same on ``serve`` and ``worker``: how many
    parts one user message may carry (:class:`~runtime.media.InputLimits`)."""
    add = parser.add_argument
    add(
        "--max-parts",
        type=positive(int),
        default=DEFAULT_MAX_PARTS,
        metavar="N",
        help=f"most parts (text, images, files) in one user message (default {DEFAULT_MAX_PARTS})",
    )
    add(
        "--max-files",
        type=positive(int),
        default=DEFAULT_MAX_FILES,
        metavar="N",
        help=f"most images and files in one user message (default {DEFAULT_MAX_FILES})",
    )


def input_limits(args: argparse.Namespace) -> InputLimits:
    """The :class:`~runtime.media.InputLimits` that ``--max-parts``/``--max-files`` say."""
    return InputLimits(max_parts=args.max_parts, max_files=args.max_files)


def add_log_level_argument(parser: argparse.ArgumentParser, default: str, why: str = "") -> None:
    """``--log-level``: one of :data:`LOG_LEVELS` (a typo is refused, not read as info)."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default,
        help=f"structlog JSON lines on stderr from this level up (default: {default}{why})",
    )


PLUGIN_HELP = (
    "start this plug-in (an observer actor registered in the axon.plugins entry-point "
    "group: otel, recorder:PATH, or an installed package's) on the host; repeatable "
    "(docs/actors.md#plug-ins-by-name)"
)


def add_plugin_argument(parser: argparse.ArgumentParser) -> None:
    """``--plugin NAME[:OPTIONS]``, the same on ``run``, ``serve`` and ``worker``: the
    names resolve when the command starts (:func:`make_plugins`), not here, so ``--help``
    imports no plug-in."""
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="NAME[:OPTIONS]", help=PLUGIN_HELP
    )


def plugin_specs(args: argparse.Namespace) -> list[PluginSpec]:
    """The plug-ins the options name: ``--otel`` (``otel``) and ``--record PATH``
    (``recorder:PATH``), the older spellings where a command has them, then each
    ``--plugin``."""
    specs = []
    if getattr(args, "otel", False):
        specs.append(PluginSpec(name="otel"))
    if getattr(args, "record", None):
        specs.append(PluginSpec(name="recorder", options=args.record))
    specs += [PluginSpec.parse(value) for value in getattr(args, "plugin", None) or ()]
    return specs


def make_plugins(args: argparse.Namespace) -> list[Actor]:
    """The plug-in actors the options name, built before anything opens: an unknown
    name or an option a plug-in refuses is a :class:`~runtime.errors.ConfigurationError`
    (one ``error:`` line)."""
    specs = plugin_specs(args)
    for spec in specs:
        if spec.name == "recorder" and spec.options:
            _not_the_store(spec.options, getattr(args, "store", None))
    return [create_plugin(spec) for spec in specs]


def _not_the_store(record: str, store: Any) -> None:
    """Refuse a recording into the SQLite store's own files (``--record sessions.db``, a
    slip for ``--store``): its lines were appended to the database file, where SQLite's
    pages overwrote them or its checkpoint cut them off, and nothing said so."""
    if not isinstance(store, str) or "://" in store:
        return
    target = os.path.realpath(record)
    base = os.path.realpath(store)
    if target in (base, *(base + suffix for suffix in ("-wal", "-shm", "-journal"))):
        raise ConfigurationError(
            f"the event recording {record} is the session store's file ({store}): "
            "record into a file of its own"
        )


EXPECTED_AGENT = "an Agent, or a function of the session id returning one"
"""What ``--agent MODULE:NAME`` must name (the end of each message refusing another)."""

STARTUP_SESSION_ID = "axon-startup-check"
"""The session id ``serve``, ``worker`` and ``mcp-server`` call an ``--agent`` function
with once at start-up, to find before serving that it returns an Agent (``run`` calls it
with its one session's id instead)."""


def load_agent(spec: str) -> AgentSource:
    """The object ``module:name`` names: an :class:`Agent`, or a function of the session
    id (a function whose result is checked to be an Agent at each call). Anything else,
    a module that does not import, a name it lacks, a class, a function that cannot be
    called with the session id alone (or an ``async`` one), is a
    :class:`~runtime.errors.ConfigurationError` naming ``spec`` and what was expected:
    one ``error:`` line before anything opens, where it was a traceback, or a 500 at the
    first request."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigurationError(f"--agent must be MODULE:NAME, not {spec!r}")
    target = _agent_target(spec, module_name, name)
    if isinstance(target, Agent):
        return target
    if isinstance(target, type):
        raise ConfigurationError(
            f"--agent {spec!r} is the class {target.__name__}, not an instance: "
            f"expected {EXPECTED_AGENT}"
        )
    if not callable(target):
        raise ConfigurationError(f"--agent {spec!r} is {_a(target)}: expected {EXPECTED_AGENT}")
    if inspect.iscoroutinefunction(target):
        raise ConfigurationError(
            f"--agent {spec!r} is an async function: expected {EXPECTED_AGENT} (a plain def)"
        )
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without one: its call at start-up says
        signature = None
    if signature is not None:
        try:
            signature.bind("session-id")
        except TypeError:
            raise ConfigurationError(
                f"--agent {spec!r} takes {_parameters(signature)}, not the session id alone: "
                f"expected {EXPECTED_AGENT}"
            ) from None
    return _checked_factory(spec, target)


def _agent_target(spec: str, module_name: str, name: str) -> Any:
    """The object ``name`` (dotted) in the module ``module_name``, imported from the
    current folder first. An exception importing the user's module (a syntax error, a
    package it needs that is missing) is a one-line ConfigurationError too."""
    # The current directory is searched first, as under ``python -m runtime`` (which puts
    # it on the path itself): the installed ``axon`` script's path starts with its own
    # folder instead, and would not find ``myagent:agent`` beside the user.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ConfigurationError(
                f"--agent {spec!r}: no module named {missing!r} in the current folder "
                "or on the Python path"
            ) from None
        raise ConfigurationError(
            f"--agent {spec!r}: importing {module_name} failed: {describe_exception(exc)}"
        ) from None
    except Exception as exc:  # the user's module raised while importing
        raise ConfigurationError(
            f"--agent {spec!r}: importing {module_name} failed: "
            f"{describe_exception(exc)}{_where(exc)}"
        ) from None
    for attr in name.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise ConfigurationError(
                f"--agent {spec!r}: {module_name} has no {name!r}: expected it to name "
                f"{EXPECTED_AGENT}"
            ) from None
    return target


def _parameters(signature: inspect.Signature) -> str:
    """``signature``'s parameters without their annotations: ``(tenant, session_id)``."""
    empty = inspect.Parameter.empty
    bare = [parameter.replace(annotation=empty) for parameter in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=empty))


def _where(exc: BaseException) -> str:
    """`` (FILE, line N)``: where ``exc`` was raised, the one line standing in for the
    traceback the user's own code would have printed (empty when only import machinery
    is known, or for a SyntaxError, whose message says it already)."""
    if isinstance(exc, SyntaxError):
        return ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename[:1] == "<"]
    if not frames:
        return ""
    return f" ({frames[-1].filename}, line {frames[-1].lineno})"


def _a(value: Any) -> str:
    """``value``'s type for a message: ``an int``, ``a str``, ``None``."""
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _checked_factory(spec: str, factory: Callable[[str], Any]) -> Callable[[str], Agent]:
    """``factory``, its result checked: anything but an Agent is a ConfigurationError
    naming ``spec`` (a coroutine, from a function returning one, closed unawaited)."""

    def agent_for(session_id: str) -> Agent:
        agent = factory(session_id)
        if not isinstance(agent, Agent):
            if inspect.iscoroutine(agent):
                agent.close()
            raise ConfigurationError(
                f"--agent {spec!r} returned {_a(agent)}, not an Agent: expected {EXPECTED_AGENT}"
            )
        return agent

    return agent_for


def agent_for_session(spec: str, source: AgentSource, session_id: str) -> Agent:
    """The agent ``source`` gives ``session_id``, built at start-up: a function that
    raises, or returns what is not an Agent, is a ConfigurationError naming ``spec``."""
    if isinstance(source, Agent):
        return source
    try:
        return source(session_id)
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"--agent {spec!r} raised {describe_exception(exc)}{_where(exc)} when called "
            f"with the session id {session_id!r}: expected {EXPECTED_AGENT}"
        ) from None


def agent_options(args: argparse.Namespace) -> list[str]:
    """The options that describe ``args``' agent, as another command line repeats them
    (``run`` says how to decide a stored waiting turn in another process, which must
    build the same agent): ``--agent``, else the provider's options that differ from
    their defaults. Never ``--api-key``, a secret: the other process reads the provider's
    variable, or is given the key again; a credential in a URL is redacted as in logs."""
    options: list[str] = []
    if getattr(args, "agent", None):
        options += ["--agent", args.agent]
    elif args.provider != "scripted":
        options += ["--provider", args.provider]
    for name in ("model", "base_url", "thinking_budget", "instructions", "output_schema"):
        value = getattr(args, name, None)
        if value is not None:
            value = redact_url(value) if name == "base_url" else str(value)
            options += [f"--{name.replace('_', '-')}", value]
    for name in DEADLINE_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            options += [f"--{name.replace('_', '-')}", f"{value:g}" if value else "none"]
    if getattr(args, "demo_tools", False):
        options.append("--demo-tools")
    for server in getattr(args, "mcp", None) or ():
        options += ["--mcp", redact_url(server)]
    if getattr(args, "media_urls", "on") == "off":
        options += ["--media-urls", "off"]
    return options


def make_agent(args: argparse.Namespace, *, session_id: str | None = None) -> AgentSource:
    """The agent of ``run``, ``serve``, ``worker`` and ``mcp-server``: ``--agent``'s, else
    the one ``--provider`` describes; with the ``--mcp`` servers' tools (docs/mcp.md),
    refusing media by URL when ``--media-urls off`` says so.

    An ``--agent`` function is called here, before anything opens: with ``session_id``
    (``run``'s one session), whose agent is returned; without, once with
    :data:`STARTUP_SESSION_ID`, and the function is returned. One that raises or returns
    what is not an Agent is a :class:`~runtime.errors.ConfigurationError` (one ``error:``
    line, exit status 2), where ``serve`` answered each request with a 500."""
    source = _described_agent(args)
    if getattr(args, "media_urls", "on") == "off":
        source = _with_media_urls_off(source, args)
    if isinstance(source, Agent):
        if getattr(args, "agent", None):
            check_runnable(args.agent, source)
        return source
    agent = agent_for_session(args.agent, source, session_id or STARTUP_SESSION_ID)
    check_runnable(args.agent, agent)
    return agent if session_id is not None else source


def check_runnable(spec: str, agent: Agent) -> None:
    """Refuse ``--agent``'s agent at start-up when no model can answer it: no provider
    and no ``model`` string, or a string naming no registered provider. The host refuses
    it too, but only when a session opens: ``serve`` answered the first request with a
    500 and a traceback in its log."""
    if agent.provider is not None:
        return
    if agent.model is None:
        raise ConfigurationError(
            f"--agent {spec!r}: agent {agent.name!r} has no provider: give it one, e.g. "
            "Agent(model='openai:gpt-4o-mini'), or Agent(provider=ScriptedProvider.demo()) "
            "for the offline demo"
        )
    if split_model(agent.model) is None:
        try:
            provider_for_model(agent.model)  # raises, saying why the string names none
        except ConfigurationError as exc:
            raise ConfigurationError(f"--agent {spec!r}: {exc}") from None


def _described_agent(args: argparse.Namespace) -> AgentSource:
    servers = tuple(MCPServer.parse(spec) for spec in getattr(args, "mcp", None) or ())
    if getattr(args, "agent", None):
        given = [f"--{n.replace('_', '-')}" for n in AGENT_ONLY if getattr(args, n, None)]
        given += [
            f"--{n.replace('_', '-')}"
            for n in DEADLINE_OPTIONS
            if getattr(args, n, None) is not None
        ]
        given += ["--demo-tools"] if getattr(args, "demo_tools", False) else []
        given += ["--provider"] if args.provider != "scripted" else []
        if given:
            raise BadInput(f"--agent names the whole agent: drop {', '.join(given)}")
        source = load_agent(args.agent)
        return _with_servers(source, servers) if servers else source
    agent = _provider_agent(args)
    if servers:
        agent = attrs.evolve(agent, mcp_servers=(*agent.mcp_servers, *servers))
    return agent


def _with_media_urls_off(source: AgentSource, args: argparse.Namespace) -> AgentSource:
    """``source``'s agent (or each its function returns) refusing media by URL."""
    if isinstance(source, Agent):
        return with_media_urls(source, args)
    factory = source
    return lambda session_id: with_media_urls(factory(session_id), args)


def with_media_urls(agent: Agent, args: argparse.Namespace) -> Agent:
    """``agent``, refusing media by URL when ``--media-urls off`` says so."""
    if getattr(args, "media_urls", "on") != "off":
        return agent
    limits = attrs.evolve(agent.media_limits, allow_urls=False)
    return attrs.evolve(agent, media_limits=limits)


def _with_servers(source: AgentSource, servers: tuple[MCPServer, ...]) -> AgentSource:
    """``source`` with ``servers`` added to its agent (or to each its factory returns:
    the host and the web app call a factory only for a session not open yet)."""

    def add(agent: Agent) -> Agent:
        return attrs.evolve(agent, mcp_servers=(*agent.mcp_servers, *servers))

    if isinstance(source, Agent):
        return add(source)
    factory = source
    return lambda session_id: add(factory(session_id))


def choose_provider(args: argparse.Namespace) -> None:
    """Read ``--provider`` and ``--model`` together, in place: a ``provider:`` prefix in
    ``--model`` (``openai:gpt-4o-mini``) names the provider, which ``--provider`` may
    repeat but not contradict (the default, ``scripted``, gives way to it); with neither,
    the scripted demo. A contradiction, or a ``:`` in ``--model`` that names no registered
    provider while no other ``--provider`` is given, is bad input
    (:func:`actors.providers.registry.resolve_model` says which)."""
    given = None if args.provider == "scripted" else args.provider
    try:
        provider, model = resolve_model(args.model, given)
    except ConfigurationError as exc:
        raise BadInput(f"--model: {exc}") from None
    args.provider, args.model = provider or "scripted", model


def _provider_agent(args: argparse.Namespace) -> Agent:
    """The agent for ``--provider`` (:mod:`actors.providers.registry`). The scripted
    demo gets the demo's tools and instructions; a real provider gets neither unless asked
    (``--demo-tools``, ``--instructions``): a real model must not be handed a tool that
    invents the weather."""
    choose_provider(args)
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
    demo = args.provider == "scripted"
    tools: list[Any] = []
    if demo or getattr(args, "demo_tools", False):
        # The demo's @tool schemas are built with pydantic when runtime.app.demo is imported:
        # imported here, so `--help` and argument errors do not pay for it.
        from runtime.app.demo import get_time, get_weather

        tools = [get_weather, get_time]
    instructions = args.instructions
    if instructions is None and demo:
        instructions = "You are a concise assistant. Use tools for facts."
    return Agent(
        name=args.provider,
        provider=apply_deadlines(create_provider(args.provider, options), args),
        instructions=instructions,
        tools=tools,
        output_type=getattr(args, "output_type", None),
    )


COMMAND_GC_THRESHOLDS = (2000, 10, 100)
"""The collector's thresholds in the process of the ``worker`` and ``serve`` commands
(``python -m runtime worker``/``serve``; CPython's are ``(700, 10, 10)``). Nearly every
object either makes belongs to a turn in flight: it outlives a young collection or two
(several turns run at once, each waiting on its store, relay or model), is promoted, and
dies by reference counting when the turn ends; cyclic garbage is about 0.1 object a turn
(none in a ``serve``-like host loop of 2,640 turns). CPython collects everything once a
quarter more objects were promoted into the oldest generation than survived the last
full collection, so those already-dead turns brought a walk of the whole heap (85,000 to
165,000 objects, 23-65 ms) every ~1,000 CPU-bound turns, finding nothing. Here a full
collection waits for 100 middle ones instead of 10 (tens of thousands of such turns), and
a young one for 2,000 objects, so the turns in flight are walked fewer times: the
collector's CPU 92 -> 30 µs a turn in a worker, 35 -> 2.4 µs in a ``serve``-like host
(issue 24 goal 3; benchmarks/journal/workers.md, branches ``wcpu7`` and ``gcfair``). The
commands' own processes only: a :class:`~runtime.app.host.Host` or ``Worker`` an
application opens leaves its collector alone, and ``--gc-pacing`` turns the automatic
collector off anyway."""


@contextmanager
def command_collector() -> Iterator[None]:
    """:data:`COMMAND_GC_THRESHOLDS` while a ``worker`` or ``serve`` command runs; the
    collector's own thresholds back after it (a command run in another program's
    process: tests)."""
    saved = gc.get_threshold()
    gc.set_threshold(*COMMAND_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*saved)
