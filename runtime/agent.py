"""``Agent``: what a session runs — a provider, instructions, tools, budget, hooks and
the type of its answer."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeGuard, cast

import attrs
import trio

from runtime.budget import Budget
from runtime.busy import REJECT, OnBusy, check_on_busy
from runtime.chunks import _eq, _hash, _repr
from runtime.compaction import HistoryProcessor, check_processors
from runtime.errors import (
    AlreadyDecided,
    ConfigurationError,
    InvalidDecision,
    NothingToResume,
    ToolDefinitionError,
)
from runtime.media import MediaLimits
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    TextPart,
    ToolCallPart,
    ToolMessage,
    stored_schema,
)
from runtime.retry import RetryPolicy
from runtime.tools import (
    AGENT_DEPTH_META,
    PARENT_SESSION_META,
    Tool,
    ToolContext,
    sub_session_id,
    tool,
)

if TYPE_CHECKING:
    from runtime.output_schema import OutputSchema
    from runtime.provider import FallbackProvider, Provider

Hook = Callable[[Any], Awaitable[None]]


def _output_schema(output_type: Any) -> OutputSchema | None:
    """:func:`runtime.output_schema.output_schema`, imported when the first agent is made:
    a program that only imports the facade (a tool module, ``--help``) does not build
    the schema module (issue 24)."""
    from runtime.output_schema import output_schema

    return output_schema(output_type)


MAX_TOOLS_CHARS = 256 * 1024
"""Default :attr:`Agent.max_tools_chars`: about 64,000 tokens of tool definitions in every
model request."""


def _check_max_tools_chars(_instance: Any, _attribute: Any, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ConfigurationError(f"max_tools_chars must be an int >= 1, not {value!r}")


DEFAULT_THINK_TAGS: tuple[tuple[str, str], ...] = (("<think>", "</think>"),)
"""The one default for :attr:`Agent.think_tags` and the engine's tag splitter."""


@attrs.frozen(kw_only=True, slots=True)
class Hooks:
    """Async callbacks the turn runner awaits; each receives the matching bus event.

    A hook that raises fails the turn loudly (an ``error`` chunk), it is never swallowed;
    except :class:`~runtime.errors.BudgetExceeded`, which is how a hook enforces a budget
    of its own (cost, say): the turn ends cleanly with finish reason ``budget`` and
    ``output.result.budget`` set to the name the hook gave, what was streamed is saved.
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    on_turn_start: Hook | None = None
    on_turn_finish: Hook | None = None
    on_step_start: Hook | None = None
    on_step_finish: Hook | None = None
    on_message_added: Hook | None = None
    on_tool_call: Hook | None = None
    on_tool_result: Hook | None = None


class _ToolServer(Protocol):
    """A server that supplies tools at run time (``actors.mcp.MCPServer``). ``runtime``
    cannot import ``actors``, so it is recognised by this class marker."""

    is_tool_server: ClassVar[bool]


def _is_tool_server(value: object) -> TypeGuard[_ToolServer]:
    """A server that supplies tools at run time (``actors.mcp.MCPServer``)."""
    return getattr(type(value), "is_tool_server", False) is True


def _provider(
    value: Provider | FallbackProvider | Sequence[Provider] | None,
) -> Provider | FallbackProvider | None:
    """The ``provider`` converter: a list of providers is a :class:`FallbackProvider`."""
    if isinstance(value, list | tuple):
        # Here, not at the top: runtime.provider imports the actor messages, which name
        # the agent (a module-level import would be a cycle).
        from runtime.provider import FallbackProvider

        return FallbackProvider(value)  # it refuses anything but providers
    if isinstance(value, str):  # (it failed at the first model call, an AttributeError)
        raise ConfigurationError(
            f"provider={value!r}: provider= takes a Provider (e.g. "
            "OpenAIProvider('gpt-4o-mini')); a model by name is model='openai:gpt-4o-mini'"
        )
    return cast("Provider | FallbackProvider | None", value)


def _budget(value: Budget) -> Budget:
    """The ``budget`` converter: a :class:`Budget` or refused (a dict crashed the turn)."""
    if not isinstance(value, Budget):
        raise ConfigurationError(
            f"budget= takes a Budget, e.g. Budget(max_steps=3), not {type(value).__name__}"
        )
    return value


def _tools(value: Sequence[Tool | Callable[..., Any]]) -> tuple[Tool | _ToolServer, ...]:
    """The ``tools`` converter: functions wrapped as tools, servers kept as they are for
    :meth:`Agent.__attrs_post_init__` to move to ``mcp_servers`` (so the field holds
    only :class:`Tool` s once the agent is built)."""
    if isinstance(value, Tool | str) or callable(value) or _is_tool_server(value):
        raise ConfigurationError(
            f"tools= takes a list of tools or functions, e.g. tools=[...], not one "
            f"{type(value).__name__}"
        )
    tools = tuple(t if isinstance(t, Tool) or _is_tool_server(t) else tool(t) for t in value)
    names = [t.name for t in tools if isinstance(t, Tool)]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigurationError(f"duplicate tool names: {sorted(dupes)}")
    return tools


@attrs.frozen(kw_only=True, slots=True, eq=False)
class Agent:
    """A configured agent. Immutable and shareable: any number of sessions may run it."""

    __repr__ = _repr

    name: str = "assistant"
    provider: Provider | FallbackProvider | None = attrs.field(default=None, converter=_provider)
    """The model's provider. Required to run, or :attr:`model`: opening a session for an
    agent with neither is a ``ConfigurationError`` (``ScriptedProvider.demo()`` is the
    offline demo). A list of providers (or a :class:`~runtime.provider.FallbackProvider`)
    is tried in order: a call the first fails to make (overloaded, rate limited, down)
    goes on with the next, in the same turn (docs/providers.md)."""
    model: str | None = attrs.field(default=None)
    """The model as ``"provider:model"`` (``"openai:gpt-4o-mini"``,
    ``"anthropic:claude-sonnet-4-5"``, ``"google:gemini-2.5-flash"``), instead of
    :attr:`provider`: the host builds that provider (as ``--provider NAME --model MODEL``
    would: the key from the SDK's variable) the first time a session opens, and shares it
    between the sessions of every agent naming the same string. Giving both ``provider``
    and ``model`` is a ``ConfigurationError``; so is a string without a ``provider:``
    prefix, and an unknown provider once a session opens (the registered ones are named).
    """

    @model.validator
    def _check_model(self, _attribute: Any, value: str | None) -> None:
        if value is None:
            return
        if self.provider is not None:
            raise ConfigurationError(
                "give the agent provider= or model=, not both: model='provider:model' builds "
                "the provider itself"
            )
        prefix, colon, name = value.partition(":") if isinstance(value, str) else ("", "", "")
        if not (prefix and colon and name):
            raise ConfigurationError(
                f"model must be 'provider:model', e.g. 'openai:gpt-4o-mini', not {value!r}"
            )

    instructions: str | None = None
    """The system prompt."""
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tools)
    """Tools offered to the model; plain functions are wrapped with :func:`tool`. MCP
    servers listed here move to :attr:`mcp_servers`."""
    budget: Budget = attrs.field(factory=Budget, converter=_budget)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    think_tags: tuple[tuple[str, str], ...] | None = DEFAULT_THINK_TAGS
    """Tags whose content in the text is reasoning; ``None`` disables the split."""
    hooks: Hooks = attrs.field(factory=Hooks)
    settings: dict[str, Any] = attrs.field(factory=dict)
    """Extra request options passed to the provider on every call, over the provider's
    own: the API's field names (``temperature``; the output token limit is
    ``max_completion_tokens`` on OpenAI Chat Completions, ``max_output_tokens`` on the
    Responses API, ``max_tokens`` on Anthropic). See docs/embedding.md."""
    media_limits: MediaLimits = attrs.field(factory=MediaLimits)
    history_processors: tuple[HistoryProcessor, ...] = attrs.field(
        default=(), converter=check_processors
    )
    """Run in order on the messages of every model call, before the request is built:
    context compaction (``[DropToolResults(), Summarize(max_tokens=100_000)]``; see
    :mod:`runtime.compaction` and docs/providers.md). Named apart from the ``history=``
    of ``open_session``/``run_sync``, which seeds a session's messages."""
    """Largest image, file and per-message media a user input may carry (docs/media.md)."""

    mcp_servers: tuple[Any, ...] = ()
    """MCP tool servers (``actors.mcp.MCPServer``) whose tools are offered as well."""
    max_tools_chars: int = attrs.field(default=MAX_TOOLS_CHARS, validator=_check_max_tools_chars)
    """The most characters of tool definitions (names, descriptions and input schemas as
    JSON) the agent offers with :attr:`mcp_servers`, its own tools and every server's
    together: every model request carries them all, and each server is capped alone
    (``MCPServer(max_tools=..., max_tool_chars=...)``), so twenty servers sent over
    600 KB per request. Past it, ``open_session`` raises ``ToolDefinitionError`` naming
    each server and its size; tools a running server adds past it are left out (logged,
    in the server actor's ``refused``). An agent without MCP servers is not checked."""
    approval_timeout: float | None = attrs.field(default=None)
    """Seconds a call that waits for a decision (an approval, a client-side tool) may
    wait: past that, it is denied with reason ``timed out`` and the turn goes on
    (docs/approval.md). ``None``: it waits for ever."""

    @approval_timeout.validator
    def _check_approval_timeout(self, _attribute: Any, value: float | None) -> None:
        if value is not None and not (
            isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        ):
            raise ConfigurationError(
                f"approval_timeout must be a positive number of seconds or None, not {value!r}"
            )

    on_busy: OnBusy = attrs.field(default=REJECT)
    """What a new user message does while a turn of a session runs: ``reject`` it
    (:class:`~runtime.errors.SessionBusy`), ``enqueue`` its turn after the running one,
    ``interrupt`` the running turn, or ``steer`` it (the message joins the running turn
    at its next step boundary): :mod:`runtime.busy`, docs/busy.md. A session may
    override it (``host.open_session(agent, on_busy=...)``)."""

    @on_busy.validator
    def _check_on_busy(self, _attribute: Any, value: Any) -> None:
        check_on_busy(value)

    def __attrs_post_init__(self) -> None:
        servers = tuple(t for t in self.tools if _is_tool_server(t))
        if servers:  # frozen: set once, here, as attrs documents for derived fields
            object.__setattr__(self, "tools", tuple(t for t in self.tools if isinstance(t, Tool)))
            object.__setattr__(self, "mcp_servers", (*self.mcp_servers, *servers))

    output_type: Any = None
    """What the answer must be: a pydantic model (or a ``TypedDict``, a dataclass) or a
    JSON schema ``dict``, whose root is an object. The provider is asked for JSON that
    matches it, the answer is validated and ``output.result.output`` is the typed value
    (the ``dict`` itself for a schema); ``None``: a free-text answer. See
    docs/structured-output.md."""
    output_retries: int = attrs.field(default=2, validator=attrs.validators.ge(0))
    """How many times an answer that does not validate is sent back to the model with
    the validation error, before the turn fails with ``OutputValidationError``."""
    output_schema: OutputSchema | None = attrs.field(
        init=False,
        default=attrs.Factory(lambda self: _output_schema(self.output_type), takes_self=True),
    )
    """The schema and validation made from :attr:`output_type` (checked when the agent
    is made: a type with no JSON schema, or not an object, is a ``ConfigurationError``)."""

    @property
    def tool_map(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    def as_tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        needs_approval: Any = False,
        max_depth: int = 8,
        pass_approvals: bool = False,
    ) -> Tool:
        """This agent as a tool another agent can call with a task (``input``).

        Each call runs one turn in a session of its own (id ``<parent>~<name>~<call id>``,
        its meta linking to the parent session and call), on the same host. The sub-turn
        streams inside the parent's output as ``tool-stream`` chunks nested under the
        call, its usage counts toward the parent turn's, and its final text is the tool's
        result. It runs under its own budget and, when the parent has an output-token
        budget, what that has left as the call begins (:attr:`ToolContext.output_left`),
        shared with the calls that run beside it (:attr:`ToolContext.output_account`):
        a sub-turn stopped by it ends ``budget`` (its text and a note are the result),
        and the parent, its output spent, ends ``budget`` too. A sub-turn that fails,
        or suspends to wait for a person's input (a call that needs approval, with no
        in-process approver; a client tool), is a tool error the parent model sees, and
        the calls it waited for are denied there (reason :data:`NESTED_WAIT`) and the
        sub-turn ended, so nobody can run them, or it, later; one a budget stopped ends
        its text with a note saying so.
        The sub-turn is named by the call's :attr:`ToolContext.idempotency_key`: the
        same call run again (a retried continuation) takes that turn's answer, or goes on
        from its committed steps, instead of running the sub-agent again.
        The sub-session gets the calling session's ``deps``. ``needs_approval`` is
        ``@tool``'s: a call waits for a decision first (docs/approval.md).

        ``max_depth`` bounds agents calling agents (one of itself, or A calling B calling
        A): a call from a session that runs ``max_depth`` agents-as-tools deep already
        (:attr:`ToolContext.depth`) is not run; the model sees the tool error ``agent
        nesting deeper than <max_depth>``. Without it, an agent that is its own tool
        recursed until its tool timeout or its budget's steps ran out, every level
        holding a turn.

        ``pass_approvals``: a sub-turn that suspends for one approval (a call of the
        sub-agent's that needs it) suspends the calling turn instead of ending as a tool
        error: the calling turn streams a ``tool-approval-request`` for the call with the
        sub-turn's approval id and waits for it (``awaiting-input``); a decision for that
        id on the calling session (``respond``) runs the call again, which records the
        decision in the sub-session and goes on with the sub-turn from its committed
        step (a denial is the sub-agent's to answer); its answer is the call's result.
        Only the calling session decides it: a decision addressed to the sub-session
        raises :class:`~runtime.errors.CallerDecides`. The sub-agent's
        ``approval_timeout`` is the calling call's deadline too. More approvals (two
        calls of a sub-step, a later sub-step that asks) pass one at a time, the calling
        turn's continuation waiting again for the next. A sub-agent's client-side tool
        (:meth:`Tool.client`) passes up the same way: the calling turn waits for its
        output under the id ``<call id>.<sub call id>`` (its stream shows the sub call
        under it), checked against that tool's output schema, and the call gives it to
        the sub-agent (docs/approval.md).
        """
        if type(max_depth) is not int or max_depth < 1:
            raise ToolDefinitionError(f"as_tool: max_depth must be an int >= 1, not {max_depth!r}")
        agent = self
        tool_name = name or self.name

        async def run_agent(input: str, context: ToolContext) -> str:
            return await _run_sub_turn(
                agent, tool_name, input, context, max_depth, pass_approvals=pass_approvals
            )

        # resolved here: this module's annotations are strings (PEP 563)
        run_agent.__annotations__ = {"input": str, "context": ToolContext, "return": str}
        run_agent.__doc__ = description or (
            f"Delegate a task to the {self.name} agent. {self.instructions or ''}".strip()
            + "\n\nArgs:\n    input: The task or question for the agent, in plain words."
        )
        built = tool(
            run_agent, name=tool_name, description=description, needs_approval=needs_approval
        )
        fields: dict[str, Any] = {str(a.alias): getattr(built, a.name) for a in attrs.fields(Tool)}
        return AgentTool(**fields, sub_agent=self if pass_approvals else None)


@attrs.frozen(kw_only=True, slots=True, eq=False)
class AgentTool(Tool):
    """An agent used as a tool (:meth:`Agent.as_tool`)."""

    __repr__ = _repr

    sub_agent: Any = attrs.field(default=None, repr=False)
    """The agent, when its waits pass up to the caller (``pass_approvals=True``)."""

    def validate_sub_output(self, name: str, output: Any) -> None:
        """Check a caller's ``output`` for the sub-agent's client-side tool ``name`` (a
        nested ``"client"`` wait, :attr:`~runtime.messages.Awaiting.sub_tool`) against
        that tool's output schema, as the sub-session itself would
        (:class:`~runtime.tools.ToolInputError`); agents calling agents are searched
        too, the first tool of that name found."""
        found = _client_tool(self.sub_agent, name, set())
        if found is not None:
            found.validate_output(output)

    def asked_tool(self, name: str, via: Sequence[str] = ()) -> Any:
        """The sub-agent's tool ``name`` whose call asked for a passed-up approval
        (:attr:`~runtime.messages.Awaiting.asked_tool`), to check a person's edit of it
        against, as the sub-session itself checks it when the edit is passed down.
        ``via``: the agent tools between (:attr:`~runtime.messages.Awaiting.asked_via`),
        followed by name, so a tool of the same name elsewhere in the tree is never the
        one checked. ``None``: none there (the sub-agent redeployed without it)."""
        return _named(self.asking_agent(via), name)

    def asking_agent(self, via: Sequence[str] = ()) -> Any:
        """The agent whose call asked for a passed-up approval: the sub-agent, or the one
        the agent tools ``via`` lead to (:attr:`~runtime.messages.Awaiting.asked_via`).
        Its model is the one an edit of that call is replayed to, so its
        ``max_tool_result_chars`` bounds the edit. ``None``: not found here."""
        agent = self.sub_agent
        for step in via:
            agent = getattr(_named(agent, step), "sub_agent", None)
        return agent


def _named(agent: Any, name: str) -> Any:
    """``agent``'s own tool ``name`` (``None``: no agent, or no such tool)."""
    return None if agent is None else next((t for t in agent.tools if t.name == name), None)


def _client_tool(agent: Any, name: str, seen: set[int]) -> Any:
    """The client-side tool ``name`` of ``agent`` or of the agents it calls as tools."""
    if agent is None or id(agent) in seen:
        return None
    seen.add(id(agent))
    for t in agent.tools:
        if isinstance(t, Tool) and t.is_client and t.name == name:
            return t
    for t in agent.tools:
        if isinstance(t, AgentTool):
            found = _client_tool(t.sub_agent, name, seen)
            if found is not None:
                return found
    return None


def _sub_session_id(context: ToolContext, tool_name: str) -> str:
    """The id of the session one call of an agent used as a tool runs in."""
    return sub_session_id(context.session_id, tool_name, context.tool_call_id)


CALLER_DELETED = "the session that called this agent as a tool was deleted"
"""The reason a sub-session's calls that waited for their calling session's decision
(``as_tool(pass_approvals=True)``) are denied with when that session is deleted."""

NESTED_WAIT = "the agent that called this one as a tool cannot wait for a decision"
"""The reason each call a sub-turn waits for is denied with (a client tool's, its
error): the calling agent was told the sub-agent did not finish."""


def _done_so_far(result: Any) -> str:
    """What a sub-turn that did not finish had done, for the calling model's error: the
    calls of its that ran (their effects stand: told only "it did not finish", a model
    asked it again, and they ran twice) and its text so far."""
    return _done(result.tool_messages, result.text)


def _done(tool_messages: Sequence[Any], text: str) -> str:
    ran = ", ".join(m.tool_name for m in tool_messages if m.error is None)
    said = text.strip()
    return (f"; the calls it made that ran: {ran}" if ran else "") + (
        f"; its text so far: {said}" if said else ""
    )


def _waited(tool_name: str, waits: str, done: str) -> str:
    """The calling model's error for a sub-turn that stopped to wait for a person."""
    return (
        f"sub-agent {tool_name} stopped to wait for a person's input ({waits}), which "
        f"nobody can give it when another agent calls it: it did not finish{done}"
    )


def _sub_turn_ids(context: ToolContext, tool_name: str) -> tuple[str, str]:
    """The turn id and assistant message id of the sub-turn one call runs: derived from
    the sub-session and the call's :attr:`ToolContext.idempotency_key`, so every run of
    the call (a retried continuation) names the same turn."""
    raw = f"{_sub_session_id(context, tool_name)}\n{context.idempotency_key}"
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"turn_sub_{digest}", f"msg_sub_{digest}"


def _passes(result: Any, may: bool) -> bool:
    """Whether the calling turn may wait for the suspended sub-turn's ``result``
    (``as_tool(pass_approvals=True)``, a call its turn can suspend for): it waits for
    approvals only (runtime.approval.APPROVAL), and passes the first: one at a time, the
    next once it is decided (the calling call waits again for it)."""
    pending = result.pending
    return may and bool(pending) and all(p.kind in ("approval", "client") for p in pending)


def _waiting_call(
    messages: Sequence[Any], wait_id: str
) -> tuple[AssistantMessage, ToolCallPart, Awaiting] | None:
    """The sub-turn's last assistant message, its call whose wait is ``wait_id`` and
    that wait (a suspended sub-turn's waits are all in its last one); ``None``: none."""
    for m in reversed(messages):
        if isinstance(m, AssistantMessage):
            for p in m.content:
                if isinstance(p, ToolCallPart) and p.awaiting is not None:
                    if p.awaiting.id == wait_id:
                        return m, p, p.awaiting
            return None
    return None


def _sub_client(messages: Sequence[Any], wait_id: str) -> tuple[str, Any]:
    """The client tool call a sub-turn's ``"client"`` wait ``wait_id`` stands for: its
    tool's name and input (two agents deep, the one its own nested wait names)."""
    found = _waiting_call(messages, wait_id)
    if found is None:
        raise RuntimeError(f"no call of the sub-turn waits for {wait_id!r}")
    _, p, w = found
    if w.sub_tool is not None:
        return w.sub_tool, w.sub_input
    return p.tool_name, p.input


def _sub_asked(
    messages: Sequence[Any], wait_id: str
) -> tuple[str, Any, Any, tuple[str, ...]] | None:
    """The call a sub-turn's approval ``wait_id`` asks for: its tool's name, input,
    stored schema and the agent tools between (two agents deep, the one its own nested
    wait names, through that wait's agent tool); ``None`` when that wait cannot say
    (one stored before it did)."""
    found = _waiting_call(messages, wait_id)
    if found is None:
        return None
    m, p, w = found
    if w.nested:
        if w.asked_tool is None:
            return None
        via = (p.tool_name, *w.asked_via)
        return w.asked_tool, w.asked_input, stored_schema(m.content, p), via
    return p.tool_name, p.input, stored_schema(m.content, p), ()


def sub_wait_id(tool_call_id: str, wait_id: str) -> str:
    """The id the calling session answers a sub-agent's client tool call with: the
    calling call's id and the sub-session's wait id (the sub call's id), so it is unique
    among the calling turn's calls whatever ids the sub-agent's model gave."""
    return f"{tool_call_id}.{wait_id}"


def _deadline(messages: Sequence[Any], approval_id: str) -> float | None:
    """When the sub-turn's wait for ``approval_id`` expires (the sub-agent's
    ``approval_timeout``), the calling turn's wait's deadline too; ``None``: never."""
    found = _waiting_call(messages, approval_id)
    return None if found is None else found[2].expires_at


async def _sub_stream(
    session: Any,
    context: ToolContext,
    input: str,
    turn_id: str,
    message_id: str,
    *,
    stored: Any = None,
) -> Any:
    """Stream the sub-turn (or go on with it from its committed steps), inside the call.
    ``stored``: the record the sub-session's open just read (``None``: the turn loads
    it), so a first call loads the sub-session once."""
    turn = session.stream(
        input,
        turn_id=turn_id,
        message_id=message_id,
        resume=True,
        stored=stored,
        max_output_tokens=context.output_left,  # the caller's left bounds the sub-turn
        output_account=context.output_account,  # shared with the batch's other calls
    )
    async with _confirming(turn, context) as out:
        async for chunk in out:
            await context.emit(chunk)
    assert out.result is not None
    return out.result


SUB_CALLER_LOST = "the calling turn is no longer this process's (taken over)"
"""The reason a sub-turn is cancelled with when its calling turn's confirm says that turn
may not run tools any more (a worker's claim lost while the process was paused)."""


@asynccontextmanager
async def _confirming(turn: Any, context: ToolContext) -> AsyncIterator[Any]:
    """``turn`` (a sub-turn's stream) entered, confirming through the calling turn's
    confirm (:attr:`ToolContext.confirm`) before each batch of its own tools: a worker
    paused inside a sub-turn past its lease, woken after a takeover ran the calling
    turn's step again, ran a sub-agent tool the takeover had run (the sub-turn had no
    confirm of its own). A calling turn that may not go on cancels the sub-turn there,
    before its tools, and refuses its saves while it ends: the takeover runs the
    sub-turn again and saves the sub-session, and the aborted one would be rebased onto
    that. (A worker's store fences the sub-session's saves by the calling turn's claim
    as well, :func:`runtime.store.fence_under`, which also covers a sub-turn cancelled
    by the lease watch before any confirm; this refusal is the host's own, for any
    store.) Refused for this run only: a later run of the call here (the turn taken
    back) saves again."""
    calling = context.confirm
    if calling is None:
        async with turn as out:
            yield out
        return
    lost = False

    async def confirm() -> None:
        nonlocal lost
        if not await calling():
            lost = True
            turn.session.host.refuse_saves(turn.session.id, turn.turn_id)
            turn.cancel(SUB_CALLER_LOST)
            await trio.lowlevel.checkpoint()  # (cancelled here: the sub-turn's scope)

    turn.confirm_with(confirm)
    try:
        async with turn as out:
            yield out
    finally:
        if lost:
            turn.session.host.accept_saves(turn.session.id, turn.turn_id)


EDIT_REFUSED = "the approved edit was refused by the sub-agent's tool"
"""The start of the reason a sub-agent's call is denied with when the edit its caller's
person approved it with no longer fits its tool where the call runs (the sub-agent
redeployed between the decision and its continuation): never run with the model's own
input instead, which nobody approved."""


async def _decide_sub_approval(session: Any, decision: Any) -> None:
    """Record the calling session's decision (the decided nested ``Awaiting``) for the
    sub-session's approval it waited for, with the person's edit of the sub call if there
    was one (:attr:`~runtime.messages.Awaiting.edited_input`). An edit the sub-session
    refuses (checked on the caller against the same tool; a redeploy in between can
    change it) denies the call instead, saying why: the sub-agent answers that, and the
    sub-session does not wait for ever for a decision its caller already made."""
    try:
        await session.decide(
            decision.id,
            approved=bool(decision.approved),
            reason=decision.reason,
            edited_input=decision.edited_input,  # the person's edit of the sub call
            by_caller=True,
        )
    except InvalidDecision as exc:
        if decision.edited_input is None:
            raise
        await session.decide(
            decision.id, approved=False, reason=f"{EDIT_REFUSED}: {exc}", by_caller=True
        )


async def _go_on(
    session: Any,
    decision: Any,
    context: ToolContext,
    input: str,
    turn_id: str,
    message_id: str,
) -> Any:
    """A call whose sub-turn waited, decided: record the decision in the sub-session and
    resume the sub-turn. Run again (a continuation retried after a crash), the decision
    is there already and the sub-turn resumed or finished: it goes on from its committed
    steps, or gives its answer, as any retried sub-turn does."""
    try:
        if decision.kind == "client":
            prefix = f"{context.tool_call_id}."
            assert decision.id.startswith(prefix), (decision.id, prefix)
            answer: dict[str, Any] = (
                {"error": decision.error}
                if decision.error is not None
                else {"output": decision.output}
            )
            await session.decide(decision.id[len(prefix) :], by_caller=True, **answer)
        else:
            await _decide_sub_approval(session, decision)
    except AlreadyDecided:
        pass  # recorded by the run a crash cut short
    try:
        # what the caller has left now, its usage so far counted there: beyond what the
        # sub-turn wrote before it waited (Budget.bounded)
        resumed = session.resume(
            max_output_tokens=context.output_left, output_account=context.output_account
        )
        async with _confirming(resumed, context) as out:
            async for chunk in out:
                await context.emit(chunk)
    except NothingToResume:  # resumed already: it went on, or finished
        return await _sub_stream(session, context, input, turn_id, message_id)
    assert out.result is not None
    return out.result


def _ended_before(messages: Sequence[Any], message_id: str, tool_name: str) -> str | None:
    """The calling model's error again when the history holds the sub-turn
    ``message_id`` and it waited for a person and was ended (:data:`NESTED_WAIT`): a
    retried call gets what the first run said, and the sub-turn is not gone on with (its
    calls have their results: resumed, its model would be asked again)."""
    at = next(
        (
            i
            for i, m in enumerate(messages)
            if isinstance(m, AssistantMessage) and m.id == message_id
        ),
        None,
    )
    if at is None:
        return None
    content = messages[at].content
    ended = [
        f"{p.tool_name} ({p.awaiting.kind})"
        for p in content
        if isinstance(p, ToolCallPart)
        and p.awaiting is not None
        and p.awaiting.reason == NESTED_WAIT
    ]
    if not ended:
        return None
    waits = ", ".join(ended)
    results = []
    for m in messages[at + 1 :]:
        if not isinstance(m, ToolMessage):
            break
        results.append(m)  # the denied calls' have an error: not counted as run
    text = "".join(p.text for p in content if isinstance(p, TextPart))
    return _waited(tool_name, waits, _done(results, text))


async def _run_sub_turn(
    agent: Agent,
    tool_name: str,
    input: str,
    context: ToolContext,
    max_depth: int,
    *,
    pass_approvals: bool = False,
) -> str:
    """One call of ``agent`` as a tool: a turn in a sub-session of its own, streamed inside
    the call, its usage added to the parent turn's; its text, or an error the parent
    model sees."""
    host = context.host
    if host is None:
        raise RuntimeError(f"agent tool {tool_name} runs sub-turns on a host; none runs it")
    depth = context.depth + 1
    if depth > max_depth:
        raise RuntimeError(
            f"agent nesting deeper than {max_depth}: {tool_name} was not run (agents "
            f"calling agents, or themselves, {max_depth} deep already)"
        )
    session = await host.open_session(
        agent,
        session_id=_sub_session_id(context, tool_name),
        meta={
            PARENT_SESSION_META: context.session_id,
            "parent_tool_call_id": context.tool_call_id,
            "parent_turn_id": context.turn_id,
            AGENT_DEPTH_META: depth,
        },
        deps=context.deps,  # the sub-agent's tools reach the same objects
    )
    # Named by the calling call's idempotency key: a retry of that call (a continuation
    # whose process died before it saved the result) finds this turn in the sub-session
    # and takes its answer, or goes on from its committed steps, its tools keyed as the
    # first time; before, it ran the sub-agent again from the start (issue 21).
    turn_id, message_id = _sub_turn_ids(context, tool_name)
    # The open just read the sub-session: the resumed turn starts from that record
    # instead of loading it a second time (one load per call, as before the resume).
    loaded = session.take_loaded()
    ended = _ended_before(session.messages, message_id, tool_name)
    if ended is not None:  # it waited, and was ended: nothing of it runs again
        await session.close()
        raise RuntimeError(ended)
    decision = context.decision
    if decision is not None and not decision.decided:
        # the calling turn went on without it (a new message): nobody resumes it now
        await session.end_wait(NESTED_WAIT)
        await session.close()
        raise RuntimeError(f"sub-agent {tool_name} was ended: its caller went on")
    try:
        if decision is not None:
            result = await _go_on(session, decision, context, input, turn_id, message_id)
        else:
            result = await _sub_stream(session, context, input, turn_id, message_id, stored=loaded)
        passes = result.finish_reason == "awaiting-input" and _passes(
            result, pass_approvals and context.may_wait
        )
        until = _deadline(session.messages, result.pending[0].approval_id) if passes else None
        client = (
            _sub_client(session.messages, result.pending[0].approval_id)
            if passes and result.pending[0].kind == "client"
            else None
        )
        asked = (
            _sub_asked(session.messages, result.pending[0].approval_id)
            if passes and client is None
            else None
        )
        if result.finish_reason == "awaiting-input" and not passes:
            # Nobody may run it on once the calling model is told it did not finish:
            # its calls are denied and the turn ended, in its sub-session's store.
            await session.end_wait(NESTED_WAIT)
    finally:
        await session.close()
    context.add_usage(result.usage, drawn=True)  # its calls drew on the account as they ran
    if passes:  # the calling turn waits for its approval (issue 21)
        wait_id = result.pending[0].approval_id
        if client is not None:  # answered on the caller under an id of its own
            wait_id = sub_wait_id(context.tool_call_id, wait_id)
        context.waits_for = wait_id
        context.waits_until = until
        context.waits_client = client
        context.waits_asked = asked
        return ""
    if result.finish_reason in ("error", "aborted"):
        why = result.error.message if result.error else result.abort_reason
        raise RuntimeError(f"sub-agent {tool_name} failed: {why}{_done_so_far(result)}")
    if result.finish_reason == "awaiting-input":
        if pass_approvals and decision is not None and _passes(result, True):
            # Run with its decision but unable to wait (a new message's turn runs the
            # superseded turn's approved call): only the calling turn's continuation
            # holds a call for the next approval; this turn's messages come after it.
            asks = ", ".join(p.tool_name for p in result.pending)
            raise RuntimeError(
                f"sub-agent {tool_name} asked for another approval ({asks}) after its "
                "caller went on with a new message, and only the calling turn's own "
                f"continuation can wait for one: it was ended{_done_so_far(result)}"
            )
        # Its turn suspended for a person (a call needing approval, a client tool): its
        # answer was '', a success; and nobody would ever answer the wait.
        waits = ", ".join(f"{p.tool_name} ({p.kind})" for p in result.pending)
        raise RuntimeError(_waited(tool_name, waits, _done_so_far(result)))
    if result.finish_reason == "budget":
        return f"{result.text}\n[the sub-agent stopped before it finished: {result.budget} reached]"
    return result.text
