"""Agents as MCP tools: the adapter both MCP transports share.

``serve --protocols mcp`` (streamable HTTP at ``/mcp``, :mod:`runtime.app.web.mcp_endpoint`)
and ``python -m runtime mcp-server`` (stdio, :mod:`runtime.app.mcp_server`) serve the same
MCP server (:func:`build_server`, on the official ``mcp`` package's low-level ``Server``):
the served agent is one tool, and a call is one turn of it, run through ``session.stream``
like a ``POST /api/chat`` (no second turn loop); in a worker deployment's front end the
turn is queued for the workers instead and its chunks read back from the relay
(:class:`~runtime.app.web.mcp_endpoint.QueuedAgentTools` overrides :meth:`AgentTools.run`),
with the same progress and results (:func:`tool_result`):

``tools/list``
    One tool named after the agent (its name with anything outside ``[A-Za-z0-9_-]``
    replaced, as model APIs require of tool names). Input ``{"prompt": str, "session_id":
    str?}``; output the answer as text content, and ``{"answer", "session_id",
    "finish_reason"}`` as structured content (``outputSchema``), so a caller learns the
    session to continue.
``tools/call``
    Runs the turn on ``session_id`` (created on first use and stored like a chat-page
    session, so it shows in ``/api/sessions``), or on a new session when none is given.
    While it streams, a call that asked for progress (a ``progressToken``) gets
    ``notifications/progress``: one per text delta (its ``message`` is the delta) and one
    per tool call the agent makes (``message`` ``[tool NAME]``), ``progress`` counting
    them; a ``reset-step`` (a fallback after output) gets one saying so. A client that
    cancels the call (``notifications/cancelled``) cancels the turn: saved, marked
    interrupted, as when a chat client leaves.

Bad input is answered in MCP's own shapes, before any session opens: an unknown tool is
the JSON-RPC error ``-32602`` (``Unknown tool: NAME``), as the specification's example;
arguments that do not fit the input schema (no prompt, a malformed ``session_id``) are a
tool execution error (``isError: true``, the reason as text), which is where the
specification puts input validation, so a model can correct itself. A call on a session
that is running a turn gets what the session's busy strategy says (:mod:`runtime.busy`):
a tool execution error (``reject``, the default), its own turn after the running one
(``enqueue``, and ``steer``: a call needs its own answer), or the running turn cancelled
(``interrupt``). A turn that fails, is cut off (a server shutdown) or ends
waiting for a decision (a tool that needs approval, docs/approval.md) is an ``isError``
result saying so, and is stored as such.

``mcp`` is an optional dependency (``pip install 'axon-runtime[mcp]'``): this module is
imported only when an MCP server is served.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import mcp_types as types
import trio
from mcp.shared.exceptions import MCPError

from runtime.actor_messages import TurnResult
from runtime.agent import Agent
from runtime.app.commands import program_name
from runtime.app.session import FINAL_WAIT, title_of
from runtime.app.unsaved import forget_unsaved, unsaved, unsaved_error
from runtime.busy import ENQUEUE, REJECT, STEER, OnBusy
from runtime.errors import HostClosed, InvalidSessionId, SessionBusy
from runtime.ids import new_id
from runtime.output import ResetStep, TextDelta, ToolCall
from runtime.serde import utf8_text
from runtime.store import validate_session_id

TOOL_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
"""What a tool name may not hold (OpenAI and Anthropic take ``[A-Za-z0-9_-]{1,64}``, and
so does Axon's own MCP client)."""

SERVER_NAME = "axon"

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "prompt": {
            "type": "string",
            "minLength": 1,
            "description": "What to ask or tell the agent, in plain words.",
        },
        "session_id": {
            "type": "string",
            "description": "Continue this conversation (the session_id of an earlier "
            "answer); leave it out to start a new one.",
        },
    },
    "required": ["prompt"],
    "additionalProperties": False,
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "description": "The agent's answer."},
        "session_id": {
            "type": "string",
            "description": "The conversation this turn ran in: pass it to continue.",
        },
        "finish_reason": {"type": "string", "description": "How the turn ended (stop, ...)."},
    },
    "required": ["answer", "session_id", "finish_reason"],
}

Report = Callable[[float, str | None], Awaitable[None]]
"""``await report(progress, message)``: one progress notification (a no-op when the
call asked for none)."""


class Sessions(Protocol):
    """Where the calls' sessions come from: the web app's
    :class:`~runtime.app.web.app.WebState`, or :class:`HostSessions` on stdio."""

    async def session(self, session_id: str) -> Any: ...

    def agent_for(self, session_id: str) -> Agent: ...


class HostSessions:
    """The sessions of a host running one agent source (an :class:`Agent`, or a
    function of the session id returning one): opened on first use, reloaded from the
    store when the host evicted them. What the web app's state does for ``serve``."""

    def __init__(self, host: Any, agent: Agent | Callable[[str], Agent]) -> None:
        self.host = host
        self.agent = agent
        self._lock = trio.Lock()

    def agent_for(self, session_id: str) -> Agent:
        return self.agent if isinstance(self.agent, Agent) else self.agent(session_id)

    async def session(self, session_id: str) -> Any:
        async with self._lock:
            session = self.host.get_session(session_id)
            if session is None:
                agent = self.agent_for(session_id)
                return await self.host.open_session(agent, session_id=session_id)
            await session.reopen()
            self.host.touch(session)  # a use: the last to be evicted
            return session


def tool_name(agent_name: str) -> str:
    """The tool name an agent is served under."""
    return TOOL_NAME_CHARS.sub("_", agent_name)[:64] or "agent"


def _error(text: str) -> types.CallToolResult:
    # utf8_text: a provider's error quoting half a character was a response the
    # official client could not parse, and the call failed instead of saying why
    block = types.TextContent(type="text", text=utf8_text(text))
    return types.CallToolResult(content=[block], is_error=True)


class BadArguments(Exception):
    """Arguments that do not fit the tool's input schema (an ``isError`` result)."""


def parse_arguments(arguments: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """``(prompt, session_id)`` from a call's arguments; :class:`BadArguments` says what
    is wrong with them."""
    arguments = arguments or {}
    unknown = sorted(set(arguments) - set(INPUT_SCHEMA["properties"]))
    if unknown:
        raise BadArguments(f"unknown argument(s): {', '.join(unknown)} (takes prompt, session_id)")
    prompt = arguments.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadArguments("prompt must be a non-empty string")
    session_id = arguments.get("session_id")
    if session_id is not None:
        if not isinstance(session_id, str):
            raise BadArguments("session_id must be a string")
        try:
            validate_session_id(session_id)
        except InvalidSessionId as exc:
            raise BadArguments(f"session_id: {exc}") from None
    return prompt, session_id


class AgentTools:
    """The served agent as an MCP tool over ``sessions``: its definition and its calls."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self._agent_name: str | None = None
        self.calls = 0
        """The calls running now."""
        self._idle = trio.Event()
        self._idle.set()

    @property
    def agent_name(self) -> str:
        """The served agent's name (a factory's: the agent it gives a new session)."""
        if self._agent_name is None:
            self._agent_name = self.sessions.agent_for(new_id("session")).name
        return self._agent_name

    @property
    def name(self) -> str:
        return tool_name(self.agent_name)

    def definitions(self) -> list[types.Tool]:
        """``tools/list``: the one tool."""
        description = (
            f"Ask the {self.agent_name} agent and get its answer (it may use tools of its "
            "own first). Give session_id to continue a conversation: every answer names "
            "the session it ran in; without it a new conversation starts."
        )
        return [
            types.Tool(
                name=self.name,
                title=self.agent_name,
                description=description,
                input_schema=INPUT_SCHEMA,
                output_schema=OUTPUT_SCHEMA,
            )
        ]

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None, report: Report
    ) -> types.CallToolResult:
        """``tools/call``: one turn of the agent (see the module docstring)."""
        if name != self.name:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}")
        try:
            prompt, session_id = parse_arguments(arguments)
        except BadArguments as exc:
            return _error(f"invalid arguments for {self.name}: {exc}")
        self.calls += 1
        self._idle = trio.Event() if self.calls == 1 else self._idle
        try:
            return await self.run(session_id or new_id("session"), prompt, report)
        finally:
            self.calls -= 1
            if not self.calls:
                self._idle.set()

    async def run(self, session_id: str, prompt: str, report: Report) -> types.CallToolResult:
        """One turn of ``session_id`` on ``prompt`` (the arguments checked), as its MCP
        result: here, on the host's session. A worker deployment's front end runs none
        and overrides this to queue it (:mod:`runtime.app.web.mcp_endpoint`)."""
        try:
            session = await self.sessions.session(session_id)
        except HostClosed as exc:  # opened on a host closed already (serve stopping)
            return closing_result(exc, session_id)
        return await run_turn(session, prompt, report)

    async def idle(self) -> None:
        """Wait until no call is running (a shutdown lets them answer first)."""
        await self._idle.wait()


async def run_turn(session: Any, prompt: str, report: Report) -> types.CallToolResult:
    """Run one turn of ``session`` on ``prompt``, reporting progress; its MCP result."""
    try:
        await session.reopen()  # the host may have evicted it since it was looked up
    except HostClosed as exc:
        return closing_result(exc, session.id)
    strategy = one_answer_each(session)
    if session.busy and strategy == REJECT:
        return _busy(session)
    if "title" not in session.meta:
        session.set_title(title_of(prompt))
    progress = Progress(report)
    try:
        async with session.stream(prompt, on_busy=strategy) as out:
            async for chunk in out:
                await progress.chunk(chunk)
            with trio.move_on_after(FINAL_WAIT):
                await out.done.wait()  # saved: the session's next call sees this turn
    except HostClosed as exc:  # the turn entered (or waited) as the host closed
        return closing_result(exc, session.id)
    except SessionBusy:
        return _busy(session)
    await forget_unsaved(session, out.result)
    return tool_result(out.result, session.id)


def closing_result(exc: HostClosed, session_id: str) -> types.CallToolResult:
    """A call refused as the host closes (``serve`` stopping): nothing ran or was
    stored; the client calls again once the server is back."""
    return _error(
        f"the server is shutting down ({exc}): nothing of this call was stored "
        f"(session {session_id}); call again shortly"
    )


def tool_result(result: TurnResult | None, session_id: str) -> types.CallToolResult:
    """A turn's MCP result, however it ran (here or on a worker): its answer, or an
    ``isError`` result saying why there is none (failed, cut off, waiting for a
    decision on the calls it names)."""
    if result is None:  # a turn whose end nothing tells (a store that could not be read)
        return _error(f"the turn ended without a result (session {session_id})")
    reason = result.finish_reason
    if unsaved(result):  # whatever it answered: the session does not hold it
        return _error(f"{unsaved_error(result).message} (session {session_id})")
    if reason == "error":
        why = result.error.message if result.error is not None else "the turn failed"
        return _error(f"the turn failed: {why} (session {session_id})")
    if reason == "aborted":
        return _error(f"the turn was cut off: {result.abort_reason} (session {session_id})")
    if reason == "awaiting-input":
        waiting = ", ".join(f"{call.tool_name} ({call.approval_id})" for call in result.pending)
        return _error(
            f"the turn waits for a decision on {waiting} (session {session_id}); "
            f"decide it on the chat page or with `{program_name()} run --session`"
        )
    answer = result.text
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=answer)],
        structured_content={"answer": answer, "session_id": session_id, "finish_reason": reason},
    )


def one_answer_each(session: Any) -> OnBusy:
    """A call's busy strategy (:mod:`runtime.busy`): the session's, except that ``steer``
    becomes ``enqueue``: a call gets its own answer, and a steered message's answer would
    go to the call whose turn took it."""
    strategy: OnBusy = session.on_busy
    return ENQUEUE if strategy == STEER else strategy


def _busy(session: Any) -> types.CallToolResult:
    return busy_result(session.id)


def busy_result(session_id: str) -> types.CallToolResult:
    """What a call on a session running a turn gets under the ``reject`` strategy."""
    return _error(f"session {session_id!r} is already running a turn")


def error_result(text: str) -> types.CallToolResult:
    """A tool execution error (``isError: true``) saying ``text``."""
    return _error(text)


class Progress:
    """Turns the turn's output chunks into progress notifications. A notification that
    cannot be sent (the client went away) stops the notifications, not the turn: a
    call is cancelled by ``notifications/cancelled``, and the turn is stored either way."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.count = 0
        self.broken = False

    async def chunk(self, chunk: Any) -> None:
        if isinstance(chunk, TextDelta):
            # half a character alone U+FFFD: the official client refused the escape of
            # a lone half, and failed the whole call (-32700) over one notification
            message = utf8_text(chunk.text)
        elif isinstance(chunk, ToolCall):
            message = f"[tool {chunk.tool_name}]"
        elif isinstance(chunk, ResetStep):
            # a notification cannot be taken back: say the text since the step began
            # is void (the call's result, the stored answer, never holds it)
            message = f"[reset-step {chunk.step}: the step starts over on {chunk.provider}]"
        else:
            return
        if self.broken or not message:
            return
        self.count += 1
        try:
            await self.report(self.count, message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.broken = True
        except Exception as exc:  # anyio's own stream errors, without importing anyio
            if type(exc).__module__.split(".")[0] != "anyio":
                raise
            self.broken = True


def build_server(tools: AgentTools, *, send_timeout: float | None = None) -> Any:
    """The MCP server (``mcp.server.lowlevel.Server``) offering ``tools``.

    ``send_timeout``: a progress notification the client does not take within that many
    seconds (it reads nothing of the call's stream) stops the call's notifications, as a
    client that went away does (:class:`Progress`); the turn goes on and is stored.
    Without it such a client held the turn, its session and the model's stream forever
    (backpressure stopped the turn at the unsent notification)."""
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools.definitions())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        async def report(progress: float, message: str | None) -> None:
            with trio.move_on_after(math.inf if send_timeout is None else send_timeout):
                await ctx.session.report_progress(progress, None, message)
                return
            raise trio.BrokenResourceError(f"the client took no notification in {send_timeout} s")

        return await tools.call(params.name, params.arguments, report)

    return Server(
        SERVER_NAME,
        title=f"Axon agent {tools.agent_name}",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


__all__ = [
    "AgentTools",
    "HostSessions",
    "Progress",
    "build_server",
    "busy_result",
    "error_result",
    "one_answer_each",
    "parse_arguments",
    "tool_name",
    "tool_result",
]
