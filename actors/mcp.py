"""MCP tool servers: their tools offered to agents and run like local tools.

``Agent(tools=[..., MCPServer.stdio("cmd", ["arg"]), MCPServer.http(url)])``. Each distinct
:class:`MCPServer` configuration runs as one host-wide :class:`MCPServerActor`, started
when the first session whose agent lists it opens, shared by every session, and
supervised like any actor: when the server's process exits or its connection closes, the
actor crashes and the supervisor restarts it (a new process, a new connection).

The server's tools become :class:`MCPTool` s (a :class:`~runtime.tools.Tool` whose schema
is the server's own input schema, checked with ``jsonschema``; a schema with a reference
that leaves it, such as ``{"$ref": "http://..."}`` or ``file:``, is refused when the tool
is listed, and nothing is ever fetched). The turn runner asks for
the agent's tools before every model call (:func:`agent_tools`), so a
``notifications/tools/list_changed`` from the server is seen by the next step. Calls go
through the tool executor like any tool: the same argument errors, timeouts, approval
and cancellation (a cancelled call sends the server ``notifications/cancelled``).

Why the package is imported lazily: ``mcp`` pulls in a large tree (httpx, starlette,
uvicorn, opentelemetry); ``import runtime, actors`` must stay fast, so it is imported in
the actor's :meth:`MCPServerActor.run`, the first time a server actually starts.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shlex
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Literal, TypeAlias
from urllib.parse import urlsplit

import attrs
import trio

from actors.mcp_lines import Lines, bounded, describe_invalid, line_transport
from runtime.actor import Actor
from runtime.agent import Agent
from runtime.errors import (
    ConfigurationError,
    MCPServerDied,
    MCPServerError,
    MCPServerUnavailable,
    MCPToolError,
    ToolDefinitionError,
    describe_exception,
)
from runtime.extras import require_mcp
from runtime.history import off_loop_limiter
from runtime.hosting import ActorStarter
from runtime.log_repeats import RepeatedWarning
from runtime.logging import get_logger, quiet_mcp_client_logs
from runtime.redact import REDACTED, is_secret_value, redact, register_url_secrets
from runtime.tools import (
    LISTING_UNITS,
    TOOL_NAME,
    UNTRUSTED_STEPS,
    InvalidJSONSchema,
    SchemaTooCostly,
    Tool,
    ToolInputError,
    json_values_over,
    schema_errors,
    schema_steps,
    server_schema_validator,
)

LISTING_OFF_LOOP_VALUES = 200
"""A listing whose schemas hold more JSON values than this has its tools built (each
schema checked against its meta-schema, its check made) in a worker thread, not on the
event loop every session streams on: ~0.1-0.5 ms a value, a 32 KiB schema ~0.3 s and a
listing of 512 of them minutes."""

MAX_LIST_PAGES = 100
"""A server that keeps returning a next cursor is cut off after this many pages."""

MAX_MESSAGE_BYTES = 1024 * 1024
"""Default :attr:`MCPServer.max_message_bytes`: the longest message a server may send.

A message is parsed whole, on the event loop, and every session of the host waits
for it: the ``mcp`` package's parser (pydantic) holds the GIL throughout, so a worker
thread frees nothing (measured: the loop held as long in a thread as on it). At the
former 32 MiB, one message held the loop 0.2-0.9 s (one text block) to 23-41 s (an array
of empty objects); at 1 MiB, 2 ms (text) to 0.8-0.9 s of CPU (arrays nested 8 deep;
single runs of deeper ones 1.2 s: docs/mcp.md has the shapes and instruction counts).
1 MiB is also what the ``mcp`` package
allows an SSE event of an HTTP server, so every transport now has the one limit. The
model sees at most ``Budget.max_tool_result_chars`` (100,000) of a result anyway."""


MAX_TOOLS = 512
"""Default :attr:`MCPServer.max_tools`."""

MAX_TOOL_CHARS = 32 * 1024
"""Default :attr:`MCPServer.max_tool_chars`."""


def _at_least_one(instance: Any, attribute: Any, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"MCPServer {attribute.name} must be a positive int, got {value!r}"
        )


def _pairs(
    value: Mapping[str, str] | Iterable[tuple[str, str]] | None,
) -> tuple[tuple[str, str], ...]:
    """A mapping, or the sorted pairs this converter stores: ``attrs.evolve`` and a
    cattrs round trip pass the stored form back through ``__init__``."""
    return tuple(sorted((str(k), str(v)) for k, v in dict(value or {}).items()))


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _approval(value: bool | Collection[str]) -> bool | frozenset[str]:
    """``True``/``False``, or the names as a frozenset. A ``str`` is refused, as ``args``
    is: ``needs_approval="delete"`` was the set of its letters, which names no tool, so
    the one tool meant to wait for a person ran without asking."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str | bytes):
        raise ConfigurationError(
            f"MCPServer needs_approval must be True, False or a list of tool names, not a "
            f"{type(value).__name__} (needs_approval=[{value!r}] names one tool)"
        )
    names = frozenset(value)
    if not all(isinstance(n, str) for n in names):
        raise ConfigurationError("MCPServer needs_approval names must be strings")
    return names


@attrs.frozen(kw_only=True, slots=True)
class MCPServer:
    """How to reach one MCP server. A hashable value: equal configurations share one
    running server per host. Build one with :meth:`stdio`, :meth:`http` or :meth:`parse`."""

    is_tool_server: ClassVar[bool] = True
    """Marks a value :class:`~runtime.agent.Agent` keeps apart from its local tools."""

    name: str
    """Names the server in errors, logs and events."""
    transport: Literal["stdio", "http"]
    command: str | None = None
    args: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    """Extra environment variables for the server process (over the MCP SDK's safe
    default environment, which does not pass the parent's secrets on)."""
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    """HTTP headers sent with every request (an ``Authorization`` header, for example)."""
    prefix: str | None = None
    """Offered tool names become ``<prefix>_<name>`` (to avoid clashes with other tools)."""
    needs_approval: bool | frozenset[str] = attrs.field(default=False, converter=_approval)
    """``True``: every tool of the server waits for approval; or the server's names of
    the tools that do."""
    timeout: float | None = None
    """Seconds before a call is abandoned; ``None`` takes the agent's ``tool_timeout``."""
    connect_timeout: float = 30.0
    """Seconds to start (or reach) the server and list its tools before giving up."""
    max_tools: int = attrs.field(default=MAX_TOOLS, validator=_at_least_one)
    """The most tools offered of the server (every model request carries them all): the
    first ``max_tools`` it lists are kept, the rest left out with a warning log line."""
    max_tool_chars: int = attrs.field(default=MAX_TOOL_CHARS, validator=_at_least_one)
    """The longest input schema (as JSON) and description of one tool: a longer schema
    refuses the tool, a longer description is cut (a warning log line says which)."""
    max_message_bytes: int = attrs.field(default=MAX_MESSAGE_BYTES, validator=_at_least_one)
    """The longest message the server may send (:data:`MAX_MESSAGE_BYTES`): a stdio
    server's longer line ends its connection (the call fails as a death, the server is
    restarted); an HTTP server's longer JSON answer or SSE event fails its call. Each
    message holds the host's event loop while it is parsed: raise it knowingly."""

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        prefix: str | None = None,
        needs_approval: bool | Collection[str] = False,
        timeout: float | None = None,
        connect_timeout: float = 30.0,
        max_tools: int = MAX_TOOLS,
        max_tool_chars: int = MAX_TOOL_CHARS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> MCPServer:
        """A server the host launches as a subprocess, speaking MCP on its stdin/stdout."""
        if not command:
            raise ConfigurationError("MCPServer.stdio needs a command")
        if isinstance(args, str):
            raise ConfigurationError("MCPServer.stdio args must be a list of strings, not a str")
        return cls(
            name=name or _default_name(command, args),
            transport="stdio",
            command=command,
            args=args,
            env=env,
            cwd=os.fspath(cwd) if cwd is not None else None,
            prefix=prefix,
            needs_approval=needs_approval,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_tools=max_tools,
            max_tool_chars=max_tool_chars,
            max_message_bytes=max_message_bytes,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        name: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str | None = None,
        needs_approval: bool | Collection[str] = False,
        timeout: float | None = None,
        connect_timeout: float = 30.0,
        max_tools: int = MAX_TOOLS,
        max_tool_chars: int = MAX_TOOL_CHARS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> MCPServer:
        """A server reached over streamable HTTP at ``url`` (for example ``.../mcp``)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"MCPServer.http needs an http(s):// URL, got {url!r}")
        return cls(
            name=name or parts.netloc.rpartition("@")[2],
            transport="http",
            url=url,
            headers=headers,
            prefix=prefix,
            needs_approval=needs_approval,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_tools=max_tools,
            max_tool_chars=max_tool_chars,
            max_message_bytes=max_message_bytes,
        )

    @classmethod
    def parse(cls, spec: str) -> MCPServer:
        """A server from one command-line word (``--mcp``): an ``http(s)://`` URL, or a
        command line to launch (split like a shell does, without running one)."""
        spec = spec.strip()
        if spec.startswith(("http://", "https://")):
            return cls.http(spec)
        try:
            argv = shlex.split(spec)
        except ValueError as exc:
            raise ConfigurationError(f"cannot read MCP server command {spec!r}: {exc}") from None
        if not argv:
            raise ConfigurationError("an MCP server needs a command line or an http(s):// URL")
        return cls.stdio(argv[0], argv[1:])

    def approves(self, tool_name: str) -> bool:
        """Whether calls of the server's tool ``tool_name`` wait for approval: named in
        :attr:`needs_approval` by the server's name or by the name it is offered as
        (``<prefix>_<name>``, what the model, the events and the page show: named so,
        the tool ran without asking)."""
        if isinstance(self.needs_approval, bool):
            return self.needs_approval
        offered = f"{self.prefix}_{tool_name}" if self.prefix else tool_name
        return tool_name in self.needs_approval or offered in self.needs_approval

    def unknown_approvals(self, listed: Collection[str]) -> list[str]:
        """The names in :attr:`needs_approval` that name none of the ``listed`` tools (by
        either name :meth:`approves` reads): a typo lets the tool meant run unasked."""
        if isinstance(self.needs_approval, bool):
            return []
        known = set(listed)
        if self.prefix:
            known |= {f"{self.prefix}_{name}" for name in listed}
        return sorted(self.needs_approval - known)


def _default_name(command: str, args: Sequence[str]) -> str:
    """The script or package a launcher runs (``python x/notes.py`` → ``notes``), else the
    command's own name. ``env [NAME=VALUE ...] COMMAND ...`` is named after ``COMMAND``'s
    script: the name is in every error and log line, and such a value is often a key."""
    if os.path.basename(command) == "env":
        words = list(args)
        while words and (words[0].startswith("-") or "=" in words[0]):
            del words[0]
        if words:
            return _default_name(words[0], words[1:])
    for arg in args:
        if not arg.startswith("-") and "=" not in arg:
            base = os.path.basename(arg.rstrip("/")) or arg
            return os.path.splitext(base)[0] if base.endswith((".py", ".js", ".ts")) else base
    return os.path.basename(command)


@attrs.frozen(kw_only=True, slots=True, eq=False)
class MCPTool(Tool):
    """A tool of an MCP server. Arguments are checked against the server's input schema
    with ``jsonschema`` (the model sees what is wrong); calls go to the server's actor."""

    server: str
    """The server's name."""
    remote_name: str
    """The tool's name on the server (``name`` may carry the server's prefix)."""
    validator: Any = attrs.field(repr=False)
    chars: int = 0
    """Characters of its definition in a request (:func:`definition_chars`)."""
    output_schema: dict[str, Any] | None = None
    """The server's output schema for the tool's structured content, if it listed one."""
    output_validator: Any = attrs.field(default=None, repr=False)
    """:attr:`output_schema` 's bounded check (:func:`~runtime.tools.server_schema_validator`),
    run by the server's actor on each result (:meth:`MCPServerActor._check_output`)."""

    def stored_schema(self) -> dict[str, Any] | None:
        """The server's listed schema: a decision (in a worker deployment's front end,
        with no session of this server) checks an edit of a waiting call against it."""
        return self.parameters

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolInputError(
                f"arguments for {self.name} must be a JSON object, got {type(arguments).__name__}"
            )
        from referencing.exceptions import Unresolvable

        try:
            errors = schema_errors(self.validator, arguments)
        except SchemaTooCostly:
            steps = schema_steps(self.validator, arguments)
            error = (
                f"the arguments for {self.name} cannot be checked: MCP server "
                f"{self.server!r}'s input schema of tool {self.remote_name!r} took over "
                f"{steps} steps to check them (a schema too costly to check here; the "
                "call was not made)"
            )
            get_logger("axon.mcp").warning(
                "mcp.schema-too-costly", server=self.server, tool=redact(self.remote_name)
            )
            raise ToolInputError(error) from None
        except Unresolvable as exc:
            raise ToolInputError(
                f"the schema of {self.name} has an unresolvable $ref: {exc}"
            ) from None
        except RecursionError:  # a $ref cycle that never reads the input ({"$ref": "#"})
            raise ToolInputError(
                f"the schema of {self.name} refers to itself without end: it cannot check "
                "any arguments"
            ) from None
        if errors:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in errors[:5]
            )
            raise ToolInputError(f"invalid arguments for {self.name}: {problems}")
        return dict(arguments)


def _schema_validator(
    where: str, kind: str, schema: dict[str, Any], config: Any, budget: Any
) -> tuple[Any, int]:
    """The bounded validator of a listed tool's ``kind`` (input or output) schema and the
    schema's length in characters, or :class:`ToolDefinitionError` naming the tool: a
    schema longer than ``max_tool_chars`` or one the checker refuses is the listing's
    fault, said once as the tool is listed rather than at each call."""
    size = _schema_chars(schema)
    if size > config.max_tool_chars:
        raise ToolDefinitionError(
            f"{where} has an {kind} schema of {size} characters, more than the "
            f"{config.max_tool_chars} of max_tool_chars"
        )
    try:
        return server_schema_validator(schema, budget), size
    except InvalidJSONSchema as exc:
        raise ToolDefinitionError(f"{where} has an invalid {kind} schema: {exc}") from None


def _schema_chars(schema: Any) -> int:
    return len(json.dumps(schema, separators=(",", ":")))


def definition_chars(tool: Tool) -> int:
    """The characters of ``tool``'s definition in a model request: its name, description
    and input schema (as compact JSON). What :attr:`Agent.max_tools_chars` counts."""
    if isinstance(tool, MCPTool) and tool.chars:
        return tool.chars
    return len(tool.name) + len(tool.description) + _schema_chars(tool.parameters)


def unchecked_text(server: str, remote: str, skipped: Sequence[str]) -> str:
    """The ``mcp.schema-not-checked-here`` warning's text for what a listed tool's schemas
    leave unchecked here (``skipped``; an output schema's prefixed ``output schema: ``):
    each named with what it is not run on: an input schema's the model's input (the
    server checks its own input), an output schema's the server's result."""
    inputs = [s for s in skipped if not s.startswith("output schema: ")]
    outputs = [
        s.removeprefix("output schema: ") for s in skipped if s.startswith("output schema: ")
    ]
    said: list[str] = []
    if inputs:
        said.append(
            "not run on the model's input here (the server checks its own input): "
            + "; ".join(inputs)
        )
    if outputs:
        said.append("not run on the server's output here: " + "; ".join(outputs))
    return f"MCP server {server!r}: tool {remote!r}: " + "; ".join(said)


def build_tool(
    config: MCPServer,
    listed: Any,
    call: Any,
    budget: list[int] | None = None,
    output_schema: Any = None,
) -> MCPTool:
    """An :class:`MCPTool` for a tool the server listed, or :class:`ToolDefinitionError`
    naming the server and tool when its name, input schema or ``output_schema`` cannot
    be offered. ``budget``: what compiling its patterns may still cost in this listing
    (:data:`~runtime.tools.LISTING_UNITS`). ``output_schema``: the one it listed, which
    :meth:`MCPServerActor._cut_listing` took out of the listing (the ``mcp`` package
    checks results against it unbounded; this check is bounded like the input's)."""
    remote = listed.name
    where = f"MCP server {config.name!r}: tool {remote!r}"
    name = f"{config.prefix}_{remote}" if config.prefix else remote
    if not TOOL_NAME.fullmatch(name):
        raise ToolDefinitionError(
            f"{where} cannot be offered: a tool name must be 1-64 letters, digits, '_' or '-'"
        )
    schema = listed.input_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ToolDefinitionError(
            f"{where} has an invalid input schema: it must be a JSON schema of type 'object'"
        )
    validator, size = _schema_validator(where, "input", schema, config, budget)
    output_validator = None
    if output_schema is not None:
        if not isinstance(output_schema, dict):
            raise ToolDefinitionError(
                f"{where} has an invalid output schema: it must be a JSON schema object"
            )
        output_validator, _ = _schema_validator(where, "output", output_schema, config, budget)
    description = (listed.description or listed.title or "")[: config.max_tool_chars]
    return MCPTool(
        name=name,
        description=description,
        parameters=schema,
        function=functools.partial(call, remote),
        is_async=True,
        timeout=config.timeout,
        needs_approval=config.approves(remote),
        adapter=None,
        server=config.name,
        remote_name=remote,
        validator=validator,
        chars=len(name) + len(description) + size,
        output_schema=output_schema,
        output_validator=output_validator,
    )


def tool_output(output_schema: dict[str, Any] | None, result: Any) -> Any:
    """The tool output for an MCP ``CallToolResult``, or an :class:`MCPToolError` to raise
    when the server flagged it ``isError``.

    Structured content wins when the server sent some; a lone ``result`` key (how servers
    wrap a value that is not an object) is unwrapped. Otherwise text blocks are joined;
    any other content (images, resources) is passed on as its JSON form.
    """
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    texts = [b["text"] for b in blocks if b.get("type") == "text"]
    if result.is_error:
        return MCPToolError("\n".join(texts) or "the tool reported an error")
    structured = result.structured_content
    if structured is not None:
        schema = output_schema or {}
        if set(structured) == {"result"} and set(schema.get("properties", {})) == {"result"}:
            return structured["result"]
        return structured
    if len(texts) == len(blocks):
        return "\n".join(texts)
    return blocks


@attrs.define(kw_only=True, slots=True, eq=False)
class CallMCPTool:
    """A request to the server's actor: one ``tools/call``. The answer (an output, or
    an exception to raise) goes to ``reply``; cancelling ``cancel_scope`` abandons it."""

    name: str
    arguments: dict[str, Any]
    reply: trio.MemorySendChannel[Any]
    cancel_scope: trio.CancelScope


class MCPServerActor(Actor):
    """Runs one MCP server connection for the whole host; a crash means it died."""

    inbox_capacity = 256

    def __init__(self, config: MCPServer) -> None:
        super().__init__(name=f"mcp:{config.name}")
        self.config = config
        self.tools: tuple[MCPTool, ...] = ()
        """The offered tools, as of the last listing (kept while the server restarts)."""
        self.refused: dict[str, str] = {}
        """Listed tools that cannot be offered, with the reason, by the server's name."""
        self.ready = False
        """Set once the server has listed its tools."""
        self.gave_up = False
        self.closed = False
        """Set when the host stopped the server (calls are refused from then on)."""
        self.last_error: str | None = None
        self._by_remote: dict[str, MCPTool] = {}
        """The offered tools, by the server's names of them."""
        self._output_schemas: dict[str, Any] = {}
        """The output schemas :meth:`_cut_listing` took out of the listings, by tool."""
        self._checking = trio.CapacityLimiter(1)
        """The worker thread that checks this server's results (:meth:`_check_output`)."""
        self._more_listed = 0
        """How many tools the last page over :attr:`MCPServer.max_tools` listed, before
        :meth:`_cut_listing` left out the rest (0: none was over)."""
        self._over_cap = False
        """Whether the last listing had more than :attr:`MCPServer.max_tools`."""
        self._cut: set[str] = set()
        """Tools of the last listing whose description was cut (logged when new)."""
        self._unchecked: dict[str, tuple[str, ...]] = {}
        """Tools of the last listing with patterns not run here (logged when new)."""
        self._unknown_approvals: list[str] = []
        """Names in ``needs_approval`` the last listing had no tool of (logged when new)."""
        self._client: Any = None
        self._nursery: trio.Nursery | None = None
        self._in_flight: set[CallMCPTool] = set()
        self._stale = self._listing = False
        self._connection_ended = trio.Event()
        """Set when the connection of the running attempt ended (the server died)."""
        self._end_reason = "exited or closed its connection"
        self._refreshed = trio.Event()
        self._changed = trio.Event()
        self._refresh_lock = trio.Lock()
        self._refresh_due = False
        """Whether a :meth:`_refresh` is started and not yet listing."""
        self._log = get_logger("axon.mcp")
        self._transport_errors = RepeatedWarning("axon.mcp", "mcp.transport-error")
        """What the connection could not read (a line that is no message): a server that
        prints its debug log on stdout makes one a line, each a warning of its own (2,000
        lines, 2,000 warnings); the first logged at once, then one line each
        :data:`~runtime.log_repeats.REPEAT_INTERVAL` with the count held back."""
        values = [value for _, value in (*config.env, *config.headers)]
        self._secrets = tuple({part for v in values for part in (v, *v.split())})
        """What no error may quote: the values of the server's env and headers, and
        their words (the token after ``Bearer``)."""
        if config.url is not None:
            # its URL's password and ``?token=``: secrets wherever they turn up (a server's
            # error that quotes the URL it was called at went to the model, the stored
            # tool result, the stream and the log as it was)
            register_url_secrets(config.url)

    # -- what sessions call ----------------------------------------------------------

    async def wait_ready(self) -> None:
        """Return once the server has listed its tools; :class:`MCPServerUnavailable`
        if the attempt to start it failed (the supervisor keeps retrying by policy)."""
        if self.ready:
            return
        if self.gave_up or self.stopped.is_set():
            raise self._unavailable()
        await self._changed.wait()
        if not self.ready:
            raise self._unavailable()

    async def current_tools(self) -> tuple[MCPTool, ...]:
        """The offered tools; waits for a listing the server announced as changed."""
        await self.wait_ready()
        if (self._stale or self._listing) and self._client is not None:
            refreshed = self._refreshed
            with trio.move_on_after(self.config.connect_timeout):
                await refreshed.wait()
        return self.tools

    async def call_tool(self, _name: str, /, **arguments: Any) -> Any:
        """Call the server's tool ``_name``: what :class:`MCPTool` runs in the executor.

        Cancelling the caller (a timeout, a cancelled turn) cancels the request."""
        send, receive = trio.open_memory_channel[Any](1)
        request = CallMCPTool(
            name=_name, arguments=arguments, reply=send, cancel_scope=trio.CancelScope()
        )
        try:
            try:
                await self.send(request)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise self._unavailable() from None
            outcome = await receive.receive()
        finally:
            request.cancel_scope.cancel()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _unavailable(self) -> MCPServerUnavailable:
        why = f": {self.last_error}" if self.last_error else ""
        if self.gave_up:
            state = "is not running (it failed more often than its restart policy allows)"
        elif self.closed or self.stopped.is_set():
            state, why = "is not running (its host has closed)", ""
        else:
            state = "could not start"
        return MCPServerUnavailable(f"MCP server {self.config.name!r} {state}{why}")

    # -- the actor ---------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        except trio.Cancelled:  # the host is closing: no call may wait for an answer
            self.closed = True
            self.stop()
            self._answer_queued(self._unavailable())
            self._answer_in_flight(self._unavailable())
            raise
        finally:
            self._transport_errors.clear()  # (those held back, counted in one line)

    async def _run(self) -> None:
        mcp, types = require_mcp("an MCP tool server")
        quiet_mcp_client_logs()  # (an application may never call configure_logging)
        ended = self._connection_ended = trio.Event()
        self._end_reason = "exited or closed its connection"
        transport = _WatchedTransport(self._open_transport(), ended, self._cut_listing)
        self._stale = self._refresh_due = False  # (a refresh of the last run died with it)
        with trio.CancelScope() as connecting:
            connecting.deadline = trio.current_time() + self.config.connect_timeout
            async with (
                mcp.Client(
                    transport,
                    mode="legacy",
                    message_handler=functools.partial(self._on_message, types),
                    cache=None,
                    client_info=types.Implementation(name="axon", version="0.1.0"),
                ) as client,
                trio.open_nursery() as nursery,
            ):
                self._client, self._nursery = client, nursery
                await self._list_tools()
                connecting.deadline = math.inf
                self.ready, self.last_error = True, None
                self._notify()
                nursery.start_soon(self._watch, ended)
                async for message in self.inbox:
                    if isinstance(message, CallMCPTool):
                        self._in_flight.add(message)
                        nursery.start_soon(self._serve, message)
                nursery.cancel_scope.cancel()
        self._client = self._nursery = None
        if connecting.cancelled_caught:
            raise MCPServerUnavailable(
                f"MCP server {self.config.name!r} did not list its tools within "
                f"{self.config.connect_timeout:g}s"
            )
        self._answer_in_flight(MCPServerUnavailable(f"MCP server {self.config.name!r} stopped"))

    def on_crash(self, exc: BaseException) -> None:
        """The server died (or could not start): answer the calls it was running."""
        self._client = self._nursery = None
        if self._connection_ended.is_set():  # what the watcher saw, not the teardown's noise
            self.last_error = f"MCP server {self.config.name!r} {self._end_reason}"
        elif (status := _http_status(_single(exc))) is not None:
            self.last_error = f"it answered {status}"
            if status.startswith(("401 ", "403 ")):
                self.last_error += (
                    ": its credentials (the headers given to MCPServer.http) are missing "
                    "or not accepted"
                )
        else:
            error = str(exc) if isinstance(exc, MCPServerError) else _describe(exc)
            self.last_error = self._server_said(error)
        self._log.warning("mcp.server-died", server=self.config.name, error=self.last_error)
        self._answer_in_flight(
            MCPServerDied(
                f"MCP server {self.config.name!r} died during the call ({self.last_error})"
            )
        )
        self._stale = self._listing = False
        self._refreshed.set()
        self._refreshed = trio.Event()
        self._notify()

    def on_give_up(self, exc: BaseException) -> None:
        """No more restarts: every queued call is answered, none waits forever."""
        self.gave_up = True
        self._answer_queued(self._unavailable())
        self._notify()

    # -- inside the actor ----------------------------------------------------------------

    def _open_transport(self) -> Any:
        config = self.config
        if config.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters

            assert config.command is not None
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env) or None,
                cwd=config.cwd,
            )
            if not _bounded_stdio_possible():
                from mcp.client.stdio import stdio_client

                return stdio_client(params)  # unbounded lines: see _bounded_stdio_possible
            return _stdio_client(params, config.max_message_bytes, self._too_long)
        from mcp.client.streamable_http import streamable_http_client

        assert config.url is not None
        http = _limited_http_client(dict(config.headers) or None, config.max_message_bytes)
        ended = self._connection_ended

        async def session_lost(response: Any) -> None:
            # 404 to a request in a session: the server no longer knows it (it restarted,
            # or expired it). The specification says to start a new session, which the
            # mcp package's client does not: every later request got the 404 again.
            # Ended, the actor restarts: a new connection, a new session.
            if response.status_code == 404 and "mcp-session-id" in response.request.headers:
                self._end_reason = "ended the session (HTTP 404)"
                ended.set()

        hooks = http.event_hooks
        http.event_hooks = {**hooks, "response": [*hooks.get("response", ()), session_lost]}
        transport = streamable_http_client(
            config.url, http_client=http, max_sse_event_size=config.max_message_bytes
        )
        return _ClosingTransport(transport, http)

    def refuse(self, remote: str, error: str) -> None:
        """Leave the server's tool ``remote`` out of what is offered, for ``error`` (in
        :attr:`refused`; logged when the reason is new)."""
        if self.refused.get(remote) != error:
            self._log.error("mcp.tool-refused", server=self.config.name, error=redact(error))
        self.refused[remote] = error

    def leave_out(self, remotes: Sequence[str], error: str) -> None:
        """Leave the server's tools ``remotes`` out of what one agent is offered, for
        ``error`` (in :attr:`refused`; one log line when any is newly left out)."""
        new = [r for r in remotes if self.refused.get(r) != error]
        for remote in remotes:
            self.refused[remote] = error
        if new:
            self._log.warning(
                "mcp.tools-left-out",
                server=self.config.name,
                tools=len(remotes),
                first=redact(remotes[0]),
                error=error,
            )

    def _cut_listing(self, message: Any) -> Any:
        """``message``, its list of tools (an answer to ``tools/list``) cut to one more
        than :attr:`MCPServer.max_tools` before the ``mcp`` package reads it into models:
        that took seconds of the event loop and gigabytes for a page of a million tools
        (the count before the cut is kept for the warning :meth:`_list_tools` logs).

        Each tool's ``outputSchema`` is taken out too, kept in :attr:`_output_schemas`
        for :func:`build_tool`: the ``mcp`` package checks every result against the one it
        read with its own ``jsonschema``, on the event loop and unbounded (a schema of 16
        ``anyOf`` definitions each referring twice to the one before: 2**16 paths, ~2 s;
        one more definition, twice that). Unread, it checks nothing; Axon checks with the
        bounded check of input schemas, off the loop (:meth:`_check_output`)."""
        result = getattr(getattr(message, "message", None), "result", None)
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return message
        if len(tools) > self.config.max_tools + 1:
            self._more_listed = max(self._more_listed, len(tools))
            del tools[self.config.max_tools + 1 :]
        for entry in tools:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                self._output_schemas[entry["name"]] = entry.pop("outputSchema", None)
        return message

    def _too_long(self, limit: int) -> None:
        self._end_reason = f"sent a message longer than {limit} bytes"
        self._log.error("mcp.message-too-long", server=self.config.name, limit=limit)

    async def _watch(self, ended: trio.Event) -> None:
        await ended.wait()
        raise MCPServerDied(f"MCP server {self.config.name!r} {self._end_reason}")

    async def _serve(self, request: CallMCPTool) -> None:
        from mcp.shared.exceptions import MCPError
        from pydantic import ValidationError

        name = self.config.name
        outcome: Any
        try:
            with request.cancel_scope:
                result = await self._client.call_tool(request.name, request.arguments)
                tool = self._by_remote.get(request.name)
                if tool is not None and tool.output_validator is not None:
                    await self._check_output(tool, result)
                outcome = tool_output(tool.output_schema if tool else None, result)
                if isinstance(outcome, MCPToolError) and self._secrets:
                    # (an error result's text, as a JSON-RPC error's: a server that echoes
                    # the token it was given went to the model, the store and the log)
                    outcome = MCPToolError(_scrub(outcome.message, self._secrets))
            if request.cancel_scope.cancelled_caught:  # the caller left: nobody to answer
                self._in_flight.discard(request)
                return
        except MCPError as exc:
            # A death only when the connection ended: the code the mcp package resolves
            # a request cut off by a closed connection with (-32000) is also JSON-RPC's
            # generic server error, which servers answer with their own message, and
            # what a streamable HTTP response cut off mid-answer gets.
            if self._connection_ended.is_set():  # the watcher restarts the actor
                outcome = MCPServerDied(
                    f"MCP server {name!r} died during the call ({self._end_reason})"
                )
            elif (status := _http_status(exc)) is not None:
                outcome = MCPToolError(f"MCP server {name!r} answered {status}")
            else:
                said = self._server_said(str(exc))
                outcome = MCPToolError(f"MCP server {name!r} answered with an error: {said}")
        except MCPServerError as exc:  # (from _check_output: it names the server)
            outcome = exc
        except ValidationError as exc:  # its text quotes the result: see describe_invalid
            why = describe_invalid(exc)
            outcome = MCPServerError(f"MCP server {name!r} sent an invalid result: {why}")
        except Exception as exc:  # a result that does not fit the tool's output schema, ...
            # (whose text quotes the result whole, then the schema: its first line)
            why = self._server_said(str(exc).partition("\n")[0])
            outcome = MCPServerError(f"MCP server {name!r} sent an invalid result: {why}")
        self._in_flight.discard(request)
        _answer(request, outcome)

    async def _check_output(self, tool: MCPTool, result: Any) -> None:
        """Raise :class:`MCPServerError` naming the server and ``tool`` when ``result``
        (not an error) has no structured content or content off the tool's output schema,
        or when checking it takes more than its steps (:func:`~runtime.tools.schema_steps`:
        10,000 and one per byte of the content as JSON, as for a model's input).

        A check allowed more than :data:`ON_LOOP_STEPS` runs in a worker thread, one at a
        time for the server: it is Python (``jsonschema``; patterns in pydantic-core's
        linear engine), which gives the GIL up every few milliseconds, so the loop runs on
        beside it, where 1 MiB of content may take up to a million steps (2-5 us each,
        whatever the schema: ~3 s for an array of integers, ~5 s for a hostile schema;
        each step's work is counted, :data:`~runtime.tools.UNTRUSTED_STEPS`). A call
        cancelled meanwhile stops it at its next
        step. A smaller one runs on the loop, as a model's input is checked: no thread's
        hop for the many small results."""
        from referencing.exceptions import Unresolvable

        name, remote = self.config.name, tool.remote_name
        if result.is_error:
            return
        content = result.structured_content
        if content is None:
            raise MCPServerError(
                f"MCP server {name!r} sent an invalid result: tool {remote!r} has an output "
                "schema but the result has no structured content"
            )
        steps = schema_steps(tool.output_validator, content) or UNTRUSTED_STEPS
        left = [steps, 0]  # (the box of runtime.tools.schema_errors: steps, search units)
        check = functools.partial(schema_errors, tool.output_validator, content, left)
        try:
            if steps <= ON_LOOP_STEPS:
                errors = check()
            else:
                errors = await trio.to_thread.run_sync(
                    check, abandon_on_cancel=True, limiter=self._checking
                )
        except SchemaTooCostly:
            self._log.warning(
                "mcp.schema-too-costly", server=name, tool=redact(remote), schema="output"
            )
            raise MCPServerError(
                f"MCP server {name!r} sent a result of tool {remote!r} that cannot be "
                f"checked: its output schema took over {steps} steps to check it (a schema "
                "too costly to check here)"
            ) from None
        except (Unresolvable, RecursionError, OverflowError) as exc:
            why = self._server_said(describe_exception(exc))
            raise MCPServerError(
                f"MCP server {name!r} sent a result of tool {remote!r} that cannot be "
                f"checked against its output schema: {why}"
            ) from None
        finally:
            left[0] = -1  # a check whose call went away stops at its next step
        if errors:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in errors[:3]
            )
            raise MCPServerError(
                f"MCP server {name!r} sent an invalid result: the structured content of tool "
                f"{remote!r} does not fit its output schema: {self._server_said(problems)}"
            )

    def _server_said(self, text: str) -> str:
        """``text`` (what the server said, or an error quoting it) cut to
        :data:`ERROR_MESSAGE_CHARS`, without the values of its env and headers (a server
        that echoes the API key it was given) and without key-shaped text.

        Only the first :data:`SAID_WINDOW` characters are read for it, the secrets taken
        out of the whole text first (a cut through one would keep its head): the lazy
        ``.*?`` of :data:`_PYDANTIC_INPUT` is quadratic in a line full of
        ``, input_value=`` (a server's error message of 480 KB of them held the loop 66 s)."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            if is_secret_value(secret) and secret in text:
                text = text.replace(secret, REDACTED)
        window = text[:SAID_WINDOW]
        kept, cut = bounded(_PYDANTIC_INPUT.sub("", window), (), ERROR_MESSAGE_CHARS)
        return kept + ("..." if cut or len(text) > len(window) else "")

    async def _list_tools(self) -> None:
        config = self.config
        listed: dict[str, Any] = {}
        cursor: str | None = None
        self._more_listed = 0
        for _ in range(MAX_LIST_PAGES):
            page = await self._client.list_tools(cursor=cursor)
            listed.update((t.name, t) for t in page.tools)
            cursor = page.next_cursor
            if not cursor or len(listed) > config.max_tools:
                break
        over = len(listed) > config.max_tools
        if over and not self._over_cap:  # logged once, not at every list_changed
            at_least = max(len(listed), self._more_listed)
            self._log.warning(
                "mcp.too-many-tools",
                server=config.name,
                listed_at_least=at_least,
                offered=config.max_tools,
                error=f"MCP server {config.name!r} listed more than {config.max_tools} "
                f"tools (at least {at_least}): only the first {config.max_tools} "
                "(max_tools) are offered",
            )
        self._over_cap = over
        if over:
            listed = dict(list(listed.items())[: config.max_tools])
        unknown = config.unknown_approvals(listed)
        if unknown and unknown != self._unknown_approvals:  # logged once, when new
            self._log.warning(
                "mcp.approval-names-unknown",
                server=config.name,
                names=[redact(n) for n in unknown],
                error=f"MCP server {config.name!r} lists no tool named "
                f"{', '.join(repr(redact(n)) for n in unknown)} of its needs_approval: "
                "no call waits for approval by those names",
            )
        self._unknown_approvals = unknown
        tools: list[MCPTool] = []
        refused: dict[str, str] = {}
        cut: set[str] = set()
        unchecked: dict[str, tuple[str, ...]] = {}
        budget = [LISTING_UNITS]
        schemas = [e.input_schema for e in listed.values()] + list(self._output_schemas.values())
        off_loop = json_values_over(schemas, LISTING_OFF_LOOP_VALUES)
        for remote, entry in listed.items():
            description = entry.description or entry.title or ""
            if len(description) > config.max_tool_chars:
                cut.add(remote)
            if remote in cut and remote not in self._cut:
                self._log.warning(
                    "mcp.description-cut",
                    server=config.name,
                    tool=redact(remote),
                    chars=len(description),
                    kept=config.max_tool_chars,
                )
            try:
                output_schema = self._output_schemas.get(remote)
                built = (config, entry, self.call_tool, budget, output_schema)
                if off_loop:  # (one at a time: the budget is the listing's)
                    limiter = off_loop_limiter()
                    tools.append(await trio.to_thread.run_sync(build_tool, *built, limiter=limiter))
                else:
                    tools.append(build_tool(*built))
                skipped = tools[-1].validator.axon_unchecked
                if tools[-1].output_validator is not None:
                    skipped += tuple(
                        f"output schema: {s}" for s in tools[-1].output_validator.axon_unchecked
                    )
                if skipped:
                    unchecked[remote] = skipped
                    if self._unchecked.get(remote) != skipped:  # logged once, when new
                        self._log.warning(
                            "mcp.schema-not-checked-here",
                            server=config.name,
                            tool=redact(remote),
                            unchecked=[redact(s) for s in skipped],
                            error=unchecked_text(config.name, remote, skipped),
                        )
            except ToolDefinitionError as exc:
                refused[remote] = str(exc)
                if self.refused.get(remote) != str(exc):
                    self._log.error(
                        "mcp.tool-refused", server=self.config.name, error=redact(str(exc))
                    )
        self.tools, self.refused, self._cut = tuple(tools), refused, cut
        self._by_remote = {tool.remote_name: tool for tool in tools}
        self._output_schemas = {k: v for k, v in self._output_schemas.items() if k in listed}
        self._unchecked = unchecked

    async def _on_message(self, types: Any, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._stale = True  # before any await: the next step waits for the new list
            if self._nursery is not None and not self._refresh_due:
                # One refresh waits at a time: a flood of notices started one task each
                # (5,000: 1.3 s more of the loop than as many log notices), all queued
                # on the lock to find the list fresh.
                self._refresh_due = True
                self._nursery.start_soon(self._refresh)
        elif isinstance(message, Exception):
            error = _describe(message)
            self._transport_errors.warning(server=self.config.name, error=error)

    async def _refresh(self) -> None:
        async with self._refresh_lock:
            self._refresh_due = False  # a notice from now on needs a listing after this one
            if not self._stale:
                return
            self._stale = False  # a notice that arrives during the listing marks it again
            self._listing = True
            try:
                await self._list_tools()
            finally:
                self._listing = False
                refreshed, self._refreshed = self._refreshed, trio.Event()
                refreshed.set()

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _answer_queued(self, error: BaseException) -> None:
        while True:
            try:
                message = self.inbox.get_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            if isinstance(message, CallMCPTool):
                _answer(message, error)

    def _answer_in_flight(self, error: BaseException) -> None:
        for request in list(self._in_flight):
            if not request.cancel_scope.cancel_called:
                _answer(request, error)
        self._in_flight.clear()


def _answer(request: CallMCPTool, outcome: Any) -> None:
    try:
        request.reply.send_nowait(outcome)
    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def _single(exc: BaseException) -> BaseException:
    """``exc`` out of the exception groups of one exception around it."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    return describe_exception(_single(exc))


_STDIO_INTERNALS = (
    "_get_executable_command",
    "_create_platform_compatible_process",
    "get_default_environment",
    "_drain_stdout",
    "_stop_server_process",
    "_WRITER_FLUSH_TIMEOUT",
)
"""What :func:`_stdio_client` borrows of ``mcp.client.stdio`` (2.3): names the package
does not promise to keep."""


def _bounded_stdio_possible() -> bool:
    """Whether the installed ``mcp`` still has what :func:`_stdio_client` borrows. A
    release without it gets the package's own ``stdio_client`` (lines unbounded, read in
    quadratic time, as before), logged once, rather than a server that never starts."""
    from mcp.client import stdio

    missing = [name for name in _STDIO_INTERNALS if not hasattr(stdio, name)]
    if missing and not _warned_stdio:
        _warned_stdio.append(True)
        get_logger("axon.mcp").warning("mcp.stdio-unbounded", missing=missing)
    return not missing


_warned_stdio: list[bool] = []


@asynccontextmanager
async def _stdio_client(
    server: Any, limit: int, too_long: Callable[[int], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """The ``mcp`` package's ``stdio_client``, with its process handling (spawn, the
    shutdown sequence, the tree kill), reading the server's stdout in bounded lines
    (:func:`~actors.mcp_lines.line_transport`).

    Its own reader joined each chunk to the line so far and split it all again: a
    result of a few megabytes (a file a server read) took the event loop seconds to
    minutes of CPU, every session of the host stalled, and a line without end was
    buffered without end. It also dropped a line it could not read, which left the
    request that line answered waiting its timeout: :class:`~actors.mcp_lines.Lines`
    fails it at once, quoting the line without the server's ``env`` values."""
    from mcp.client import stdio

    command = await stdio._get_executable_command(server.command)
    env = server.env or {}
    process = await stdio._create_platform_compatible_process(
        command=command,
        args=server.args,
        env=stdio.get_default_environment() | env,
        errlog=sys.stderr,
        cwd=server.cwd,
    )
    assert process.stdout is not None and process.stdin is not None
    async with line_transport(
        functools.partial(process.stdout.receive, 65536),
        process.stdin.send,
        lines=Lines(secrets=env.values()),
        limit=limit,
        too_long=too_long,
        encoding=server.encoding,
        drain=functools.partial(stdio._drain_stdout, process),
        stop=functools.partial(stdio._stop_server_process, process),
        flush_timeout=stdio._WRITER_FLUSH_TIMEOUT,
    ) as streams:
        yield streams


_PYDANTIC_INPUT = re.compile(
    r", input_value=.*?, input_type=\w+(?=\])|, input_value=.*\Z|\n *For further information .*"
)
"""What a pydantic error's text quotes of its input (cut in the middle: a key's head or
tail, past redaction) and its link: the ``mcp`` package's errors for an HTTP answer or
SSE event it cannot read carry them."""


HTTP_STATUS = "axon.httpStatus"
"""The key of a JSON-RPC error's ``data`` that carries the HTTP status the server
answered a request with (see :func:`_status_answer`)."""

ERROR_BODY_BYTES = 64 * 1024
"""How much of a non-2xx answer's body is read for the server's JSON-RPC error."""

ERROR_MESSAGE_CHARS = 500
"""How much of the server's own error message a non-2xx answer's error keeps."""

ON_LOOP_STEPS = UNTRUSTED_STEPS + 4096
"""The most steps a check of a result's structured content may take on the event loop
(content of up to 4 KiB as JSON): ~0.07 s at the costliest step known (~5 us, a
``$ref`` in an ``anyOf``), no more than a model's input may hold it. A check allowed more runs
in a worker thread (:meth:`MCPServerActor._check_output`)."""

SAID_WINDOW = 4 * ERROR_MESSAGE_CHARS
"""How much of what a server said :meth:`MCPServerActor._server_said` reads (a quote
of pydantic's input cut at its end is removed to the end: its tail never shows)."""


STATUS_ANSWER = "MCP server answered "
"""How the error of a non-2xx answer begins (then ``401 Unauthorized``)."""


def _http_status(exc: BaseException) -> str | None:
    """What an :class:`mcp.MCPError` made of a non-2xx answer says after
    :data:`STATUS_ANSWER` (``401 Unauthorized: ...``), or ``None`` for any other error."""
    data = getattr(exc, "data", None)
    if not isinstance(data, dict) or not isinstance(data.get(HTTP_STATUS), int):
        return None
    return str(exc).removeprefix(STATUS_ANSWER)


def _status_text(status: int) -> str:
    """``401 Unauthorized``: the standard phrase, not the server's own reason phrase."""
    import httpx2

    phrase = httpx2.codes.get_reason_phrase(status)
    return f"{status} {phrase}" if phrase else str(status)


def _scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` without any of ``secrets`` (the configured header values: a server may
    echo the ``Authorization`` it refused) and without key-shaped text."""
    for value in secrets:  # the whole value, and its words (the token after "Bearer")
        for secret in sorted({value, *value.split()}, key=len, reverse=True):
            if is_secret_value(secret):
                text = text.replace(secret, REDACTED)
    return redact(text)


async def _status_answer(request: Any, response: Any, secrets: Iterable[str]) -> Any:
    """A non-2xx answer to a POST as a JSON-RPC error that says its status.

    The ``mcp`` package turned any such answer whose body is no JSON-RPC error into
    "Server returned an error response": the model (and, at connect time, the user) never
    learnt that the server said 401 or 500. The status travels in the error's ``data``
    (:data:`HTTP_STATUS`); the server's own JSON-RPC error message, when its body has one,
    is kept (cut, without the configured header values); any other body is dropped."""
    import httpx2

    body = bytearray()
    try:
        async for chunk in response.stream:
            body += chunk
            if len(body) > ERROR_BODY_BYTES:
                body.clear()
                break
    except httpx2.HTTPError:
        body.clear()
    finally:
        await response.stream.aclose()
    message = STATUS_ANSWER + _status_text(response.status_code)
    try:
        error = json.loads(body)["error"]
        said = error["message"] if isinstance(error, dict) else None
    except (ValueError, TypeError, KeyError):
        said = None
    if isinstance(said, str) and said.strip():
        message += ": " + _scrub(said.strip()[:ERROR_MESSAGE_CHARS], secrets)
    answer = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32603, "message": message, "data": {HTTP_STATUS: response.status_code}},
    }
    return httpx2.Response(
        response.status_code,
        headers={"content-type": "application/json"},
        content=json.dumps(answer).encode(),
        extensions=response.extensions,
        request=request,
    )


def _posted_ids(request: Any) -> tuple[Any, Any]:
    """The id of the JSON-RPC request ``request`` posts, and the id of the request it
    cancels (``notifications/cancelled``), each ``None`` when it posts no such message
    (as the ``mcp`` package matches ids: ``"7"`` is ``7``)."""
    if request.method != "POST":
        return None, None
    try:
        message = json.loads(request.content)
    except (ValueError, TypeError, AttributeError, RuntimeError):
        return None, None
    if not isinstance(message, dict) or not isinstance(method := message.get("method"), str):
        return None, None
    if method == "notifications/cancelled":
        params = message.get("params")
        cancelled = params.get("requestId") if isinstance(params, dict) else None
        return None, _coerced_id(cancelled)
    return _coerced_id(message.get("id")), None


def _coerced_id(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return value
    return value


def _limited_http_client(headers: dict[str, str] | None, limit: int) -> Any:
    """The ``mcp`` package's HTTP client (its timeouts), reading a JSON answer of at
    most ``limit`` bytes: the package read any JSON answer whole (a server could make
    the host hold gigabytes). A longer one fails its call with the package's own
    "Failed to parse JSON response" error, saying why. A non-2xx answer to a POST says
    its status (:func:`_status_answer`)."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    class TooLarge(httpx2.StreamError):
        pass

    class Limited(httpx2.AsyncByteStream):
        """An answer's body: at most ``limit`` bytes (``None``: an SSE stream, whose
        events the package limits), closed by :meth:`Transport.cancel` too."""

        def __init__(self, inner: Any, limit: int | None, done: Callable[[], Any]) -> None:
            self.inner, self.limit, self.done = inner, limit, done

        async def __aiter__(self) -> AsyncIterator[bytes]:
            read = 0
            async for chunk in self.inner:
                read += len(chunk)
                if self.limit is not None and read > self.limit:
                    raise TooLarge(f"the answer is longer than {self.limit} bytes")
                yield chunk

        async def aclose(self) -> None:
            self.done()
            await self.inner.aclose()

    class Transport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx2.AsyncHTTPTransport()
            self.answering: dict[Any, Limited] = {}
            """The answers being read, by the id of the request they answer."""

        async def handle_async_request(self, request: Any) -> Any:
            posted, cancelled = _posted_ids(request)
            if cancelled is not None and (answer := self.answering.get(cancelled)):
                # The package reads a cancelled request's SSE answer on until the server
                # ends it: a server that never did kept a task and a connection per
                # cancelled call (a timed-out one) for the connection's life.
                await answer.aclose()
            response = await self.inner.handle_async_request(request)
            if response.status_code >= 400 and request.method == "POST":
                return await _status_answer(request, response, (headers or {}).values())
            json_body = "json" in response.headers.get("content-type", "").lower()
            answer = Limited(
                response.stream,
                limit if json_body else None,
                functools.partial(self.answering.pop, posted, None),
            )
            if posted is not None:
                self.answering[posted] = answer
            return httpx2.Response(
                response.status_code,
                headers=response.headers,
                stream=answer,
                extensions=response.extensions,
                request=request,
            )

        async def aclose(self) -> None:
            await self.inner.aclose()

    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    return httpx2.AsyncClient(headers=headers, timeout=timeout, transport=Transport())


class _WatchedTransport:
    """An MCP transport whose incoming stream sets ``ended`` when it ends: that is how the
    actor learns that an idle server's process exited, not only a busy one. Each message
    read goes through ``cut`` first."""

    def __init__(self, inner: Any, ended: trio.Event, cut: Callable[[Any], Any]) -> None:
        self._inner = inner
        self._ended = ended
        self._cut = cut

    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self._inner.__aenter__()
        return _WatchedStream(read, self._ended, self._cut), write

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)


class _WatchedStream:
    def __init__(self, inner: Any, ended: trio.Event, cut: Callable[[Any], Any]) -> None:
        self._inner = inner
        self._ended = ended
        self._cut = cut

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        import anyio

        try:
            return self._cut(await self._inner.receive())
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended.set()
            raise

    def __aiter__(self) -> _WatchedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return self._cut(await self._inner.__anext__())
        except StopAsyncIteration:
            self._ended.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)


class _ClosingTransport:
    """Enter ``transport``; close the HTTP client it was given when it is left."""

    def __init__(self, transport: Any, http: Any) -> None:
        self._transport = transport
        self._http = http

    async def __aenter__(self) -> Any:
        await self._http.__aenter__()
        try:
            return await self._transport.__aenter__()
        except BaseException:
            await self._http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            return await self._transport.__aexit__(*exc_info)
        finally:
            await self._http.__aexit__(None, None, None)


# -- what the host and the turn runner call ---------------------------------------------

Servers: TypeAlias = dict[MCPServer, MCPServerActor]
"""A host's running MCP server actors, by configuration: one per server, shared by the
host's sessions."""


async def start_servers(servers: Servers, host: ActorStarter, agent: Agent) -> None:
    """Start each MCP server ``agent`` lists that ``servers`` lacks (once per host; a
    server that gave up is started anew) under ``host``'s supervisor, wait until each has
    listed its tools, and check the tool names.

    Raises :class:`MCPServerUnavailable` when a server cannot start, and
    :class:`ToolDefinitionError` when two tools would share a name."""
    for config in agent.mcp_servers:
        actor = servers.get(config)
        if actor is None or actor.stopped.is_set():
            actor = servers[config] = MCPServerActor(config)
            await host.start_actor(actor)
    for config in agent.mcp_servers:
        await servers[config].wait_ready()
    await agent_tools(servers, agent, clash="raise")


async def agent_tools(
    servers: Mapping[MCPServer, MCPServerActor], agent: Agent, *, clash: str = "refuse"
) -> tuple[Tool, ...]:
    """The tools to offer for the next model call: the agent's own, then each MCP
    server's current ones (after any announced change). Names must be unique.

    A server's tool named like one before it is :class:`ToolDefinitionError` with
    ``clash="raise"`` (what :func:`start_servers` checks: the agent's configuration needs
    a prefix). Otherwise (``"refuse"``) it is left out, logged and in the server's
    ``refused``, as a tool whose schema cannot be offered: a tool a server adds while
    sessions run (``tools/list_changed``) failed every later turn of every session.

    With ``servers`` bound (``functools.partial(agent_tools, servers)``) this is the
    turn runner's :data:`~runtime.hosting.ToolSource`."""
    if not agent.mcp_servers:
        return agent.tools
    tools = list(agent.tools)
    owner = {t.name: "a local tool" for t in tools}
    cap = agent.max_tools_chars
    total = _local_chars(agent)
    sizes = [f"its own: {_tools_count(len(tools))}, {total:,}"] if tools else []
    for config in agent.mcp_servers:
        actor = servers.get(config)
        if actor is None:
            raise MCPServerUnavailable(f"MCP server {config.name!r} is not started on this host")
        count = chars = 0
        left_out: list[str] = []
        for t in await actor.current_tools():
            if t.name in owner:
                error = (
                    f"tool {t.name!r} of MCP server {config.name!r} has the same name as "
                    f"{owner[t.name]}; give the server a prefix (MCPServer.stdio(..., prefix=...))"
                )
                if clash == "raise":
                    raise ToolDefinitionError(error)
                actor.refuse(t.remote_name, error)
                continue
            size = definition_chars(t)
            if clash != "raise" and total + size > cap:
                left_out.append(t.remote_name)
                continue
            owner[t.name] = f"a tool of MCP server {config.name!r}"
            tools.append(t)
            total, count, chars = total + size, count + 1, chars + size
        sizes.append(f"MCP server {config.name!r}: {_tools_count(count)}, {chars:,}")
        if left_out:
            actor.leave_out(
                left_out,
                f"left out: the tools of agent {agent.name!r} would pass its "
                f"max_tools_chars ({cap:,} characters of tool definitions in each request)",
            )
    if total > cap:  # (only when the session opens: later, tools past it were left out)
        raise ToolDefinitionError(
            f"the tools of agent {agent.name!r} come to {total:,} characters of "
            f"definitions (names, descriptions, input schemas), more than its "
            f"max_tools_chars ({cap:,}), and every model request carries them all: "
            + "; ".join(sizes)
            + ". Offer fewer (a server less, MCPServer(max_tools=..., max_tool_chars=...)) "
            "or raise Agent(max_tools_chars=...)"
        )
    return tuple(tools)


def _tools_count(count: int) -> str:
    return f"{count} tool" if count == 1 else f"{count} tools"


_local_sizes: weakref.WeakKeyDictionary[Agent, int] = weakref.WeakKeyDictionary()


def _local_chars(agent: Agent) -> int:
    """The characters of ``agent``'s own tool definitions (counted once per agent: the
    turn runner asks for the tools before every model call)."""
    chars = _local_sizes.get(agent)
    if chars is None:
        chars = _local_sizes[agent] = sum(definition_chars(t) for t in agent.tools)
    return chars


__all__ = [
    "CallMCPTool",
    "MCPServer",
    "MCPServerActor",
    "MCPTool",
    "Servers",
    "agent_tools",
    "build_tool",
    "definition_chars",
    "start_servers",
    "tool_output",
]
