"""Turn budgets: limits that end a turn cleanly with finish reason ``budget``.

:class:`Budget` owns its checks (as :meth:`RetryPolicy.delay
<runtime.retry.RetryPolicy.delay>` owns retries); the turn runner only asks. A budget
that runs out raises :class:`~runtime.errors.BudgetExceeded`, which the turn runner
turns into the turn's end: finish reason ``budget``, ``output.result.budget`` naming
which one, everything streamed so far saved. A hook may raise it too, for a budget of
its own: the turn then ends the same way, with that name.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from runtime.chunks import Usage, _eq, _hash, _repr
from runtime.errors import BudgetExceeded, ConfigurationError


def check_timeout(value: Any, error: type[Exception]) -> None:
    """Refuse, as a tool or a budget is made, a timeout no call could be run under: a
    negative number, NaN, text (``"5"`` from a config file): each was every call's error
    instead, as if the tool had raised it ("'<' not supported between ...")."""
    ok = value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    )
    if not ok:
        raise error(f"a tool timeout is a number of seconds, 0 or more, or None; got {value!r}")


def _at_least_one_step(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ConfigurationError(
            f"Budget.{attribute.name} must be at least 1 (got {value!r}): every turn "
            "makes at least one model call"
        )


def _a_timeout(_: object, attribute: Any, value: object) -> None:
    check_timeout(value, ConfigurationError)


def _a_count(_: object, attribute: Any, value: object) -> None:
    """``None`` or an int of 0 or more: ``max_tool_result_chars=-1`` cut every result to
    all but its last character and said "-1 ... omitted"; ``max_output_tokens="500"``
    (text from a config file) failed every turn with a ``TypeError`` as its first call
    was capped, ``-5`` silently meant 0, ``2.5`` was sent as an API's integer cap."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigurationError(
            f"Budget.{attribute.name} must be None or an int of 0 or more (got {value!r})"
        )


def _a_bound(_: object, attribute: Any, value: object) -> None:
    """``None`` or an int of 1 or more (0 would run no call, and the step never end)."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigurationError(
            f"Budget.{attribute.name} must be None or an int of 1 or more (got {value!r})"
        )


MAX_PARALLEL_TOOL_CALLS = 100
"""Default :attr:`Budget.max_parallel_tool_calls`: well above what a model asks for in one
step (a few, tens at most), well below a process's file descriptors."""


@attrs.frozen(kw_only=True, slots=True)
class Budget:
    """Limits for one turn. ``None`` means unlimited."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    max_steps: int = attrs.field(default=10, validator=_at_least_one_step)
    """Model calls per turn. When the model still wants tools after the last allowed
    step, the turn ends with finish reason ``budget``."""
    max_tool_calls: int | None = attrs.field(default=None, validator=_a_count)
    """Tool calls per turn, over all steps; calls past it are not run."""
    max_input_tokens: int | None = attrs.field(default=None, validator=_a_count)
    max_output_tokens: int | None = attrs.field(default=None, validator=_a_count)
    """Output tokens per turn, over all its calls (sub-agents included). Each call asks
    the provider for at most what is left (:meth:`output_left`, sent as the API's own
    cap), so no call writes past it; a call cut at that cap, or calls that spent it all
    while the model still wants tools, end the turn with finish reason ``budget``
    (:meth:`output_spent`), the cut text saved, also when its server counts up to a
    quarter short of the cap (:func:`actors.turn.inference.cut_by_budget`); a call cut
    further below it (the server's own limit), or by a smaller cap that its request
    carried (``settings``, a provider option or default: ``Provider.sent_cap``), ends it
    ``length``. A call whose server reports no output tokens counts the UTF-8 bytes
    it wrote, at most its cap (:func:`actors.turn.inference.counted`). Agents used as
    tools that run at once share what is left (:class:`OutputAccount`)."""
    max_total_tokens: int | None = attrs.field(default=None, validator=_a_count)
    max_cost: float | None = None
    """US dollars per turn: the turn's :attr:`Usage.cost <runtime.chunks.Usage.cost>`
    (sub-agents included), each call priced from the ``genai-prices`` table
    (:mod:`runtime.pricing`). A turn whose cost is unknown (a model or endpoint the table
    does not list) cannot be held to it and ends as if it had gone over: a budget that
    cannot be kept is never silently ignored."""
    deadline: float | None = None
    """Wall-clock seconds for the whole turn. A turn that waits for a person
    (docs/approval.md) is timed while it runs: the part before the wait and each
    continuation get it afresh, the wait itself is not counted (``Agent.approval_timeout``
    bounds that)."""
    tool_timeout: float | None = attrs.field(default=60.0, validator=_a_timeout)
    """Default per-tool timeout in seconds (a tool may set its own)."""
    max_tool_result_chars: int | None = attrs.field(default=100_000, validator=_a_count)
    """A tool result longer than this (as JSON text) is truncated with a visible marker."""
    max_parallel_tool_calls: int | None = attrs.field(
        default=MAX_PARALLEL_TOOL_CALLS, validator=_a_bound
    )
    """Calls of one step that run at once; the others wait for a place (their timeout
    starts once they run; a call waiting for its approval holds none). ``None``: all at
    once. A model that asks for thousands of calls in one step started them all together
    (5,000 async calls at once: as many sockets, benchmarks/journal/pipeline.md). Calls
    that wait on each other stall behind it until their timeouts: a tool made with
    ``@tool(waits_on_siblings=True)`` takes no place (:attr:`Tool.waits_on_siblings
    <runtime.tools.Tool.waits_on_siblings>`)."""

    def check_step(self, step: int) -> None:
        """Raise :class:`BudgetExceeded` (``max_steps``) if step ``step`` (from 0) may
        not start."""
        if step >= self.max_steps:
            raise BudgetExceeded("max_steps")

    def tokens_exceeded(self, usage: Usage) -> str | None:
        """The name of the token or cost budget the turn's ``usage`` so far exceeds (or,
        for ``max_cost``, cannot be checked against: its cost is unknown), if any.

        Not raised at once: the step that went over has already been streamed, so the
        turn runner finishes it (its tool calls are refused) and then ends the turn.
        """
        if self.max_input_tokens is not None and usage.input_tokens > self.max_input_tokens:
            return "max_input_tokens"
        if self.max_output_tokens is not None and usage.output_tokens > self.max_output_tokens:
            return "max_output_tokens"
        if self.max_total_tokens is not None and usage.total_tokens > self.max_total_tokens:
            return "max_total_tokens"
        if self.max_cost is not None and not usage.empty:
            if usage.cost is None or usage.cost > self.max_cost:
                return "max_cost"
        return None

    def output_left(self, usage: Usage) -> int | None:
        """The output tokens the turn's next call may write, after ``usage`` so far: what
        :attr:`max_output_tokens` leaves (0 when spent), ``None`` without that budget."""
        if self.max_output_tokens is None:
            return None
        return max(self.max_output_tokens - usage.output_tokens, 0)

    def output_spent(self, usage: Usage, *, more: bool, cut: bool) -> str | None:
        """``"max_output_tokens"`` when the last call was cut at the cap this budget sent
        it (``cut``: finish ``length`` at that cap, judged by the caller from the cap and
        the reported tokens, which a server may count short of it), or when the turn's
        calls wrote all the output it may (``usage``) and the model wants another call
        (``more``: its tool calls' results would go to a call that may write nothing,
        which no API takes). Not exceeded otherwise: a last answer that ends (``stop``)
        on exactly the budget is whole."""
        left = self.output_left(usage)
        if left is not None and (cut or (more and left == 0)):
            return "max_output_tokens"
        return None

    def bounded(self, more: int | None, usage: Usage) -> Budget:
        """This budget for a run of a turn that may write at most ``more`` output tokens
        beyond ``usage`` (its committed steps', for a turn resumed): its
        :attr:`max_output_tokens` lowered to ``usage.output_tokens + more`` if that is
        less; itself when ``more`` is ``None``. An agent tool's sub-turn runs under what
        its calling turn has left this way (:attr:`ToolContext.output_left
        <runtime.tools.ToolContext.output_left>`)."""
        if more is None:
            return self
        bound = usage.output_tokens + max(more, 0)
        own = self.max_output_tokens
        if own is not None and own <= bound:
            return self
        return attrs.evolve(self, max_output_tokens=bound)

    def admits_tool_call(self, used: int) -> bool:
        """Whether one more tool call may run after ``used`` calls this turn."""
        return self.max_tool_calls is None or used < self.max_tool_calls


class OutputAccount:
    """The output tokens that the calls of one batch of tools share: what their calling
    turn had left as the batch began (:attr:`Budget.max_output_tokens` less what it
    wrote), drawn from live by the sub-turns of the agents used as tools that run at
    once (and by remote agents' calls, :class:`actors.a2a.A2AAgent`, and tools that
    count usage of their own, :meth:`ToolContext.add_usage
    <runtime.tools.ToolContext.add_usage>`), so that together they never write more
    than that.

    Why: each of them was given all that was left (:attr:`ToolContext.output_left
    <runtime.tools.ToolContext.output_left>`, a number fixed as the batch began), so N
    sub-agents of one step could write N times it; the calling turn was billed for all
    and ended ``budget`` after them.

    A model call reserves the cap it is sent before it is made (:meth:`reserve`) and,
    once it is over, gives back what it did not write (:meth:`settle`): a call that may
    write all that is left holds all of it, and a sibling's call waits until some comes
    back (or, nothing held anywhere, is told nothing is left: its sub-turn ends
    ``budget`` as the budget says). Calls with a smaller cap of their own (the agent's
    ``settings``, the provider's default) hold only that, and run side by side. An
    account of a batch inside a sub-turn has the sub-turn's account as its
    :attr:`parent`: a call reserves in every account up the chain, so an agent two
    levels down draws on the top caller's tokens too.

    Reservations are served first come, first served, across the whole tree of
    accounts (the chain's top one keeps the queue): once one waits, every later one
    waits behind it, even one that would fit. Why: a call that wants more than is free
    (one with no cap of its own wants all that is left) was starved by capped siblings
    whose next calls kept taking what came back, until their turns ended. It cannot
    deadlock: the first waiter waits only for holds to settle, and a hold is one model
    or summary call, which ends on its own without reserving (nothing holds while it
    waits for anything but its provider).

    Live and in-process only: never stored. A calling turn that waits for a sub-agent's
    approval counts what that sub-turn wrote with the wait (``Awaiting.counted``), and
    its continuation, in whatever process, opens a new account from what it has left
    then."""

    __slots__ = ("_changed", "_queue", "held", "left", "parent")

    def __init__(self, left: int, parent: OutputAccount | None = None) -> None:
        self.left = left
        """The tokens neither reserved by a call in flight nor written (below 0 when a
        call wrote more than it reserved: a server that ignores its cap)."""
        self.held = 0
        """The tokens reserved by calls in flight."""
        self.parent = parent
        """The account of the batch whose sub-turn runs this one's (``None``: none)."""
        self._changed: trio.Event | None = None
        """(The top account's:) set when a hold settles or a waiter leaves the queue."""
        self._queue: deque[object] = deque()
        """(The top account's:) the reservations waiting, first come first."""

    def available(self) -> int:
        """What a call may reserve now: the least any account up the chain has left."""
        left, up = self.left, self.parent
        while up is not None:
            left = min(left, up.left)
            up = up.parent
        return max(left, 0)

    def waiting(self) -> int:
        """How many reservations wait in this account's tree (its top one's queue)."""
        return len(self._top()._queue)

    def _top(self) -> OutputAccount:
        top = self
        while top.parent is not None:
            top = top.parent
        return top

    def _short(self) -> OutputAccount:
        """The account up the chain that has the least left (this one on a tie)."""
        short, up = self, self.parent
        while up is not None:
            if up.left < short.left:
                short = up
            up = up.parent
        return short

    def _ready(self, need: int) -> int | None:
        """What the call may take now (``0``: nothing is left, nothing held that could
        come back), or ``None`` while it must wait for a hold to settle."""
        available = self.available()
        if available >= need:
            return available
        if self._short().held > 0:
            return None
        return available  # all that is left (``0``: none), nothing held that could come back

    async def reserve(
        self, want: int, waits: Callable[[int, int, int], Awaitable[None]] | None = None
    ) -> int:
        """Reserve up to ``want`` tokens (the cap a call will be sent) for one call, in
        this account and every one above it; return what was available (``0``: nothing
        is left, and nothing was reserved: the call may not be made). Waits, while
        less than ``want`` is available, for a call holding a reservation to settle;
        takes less (or returns ``0``) only when none does: then that is what is left.
        What was reserved, ``min(want, available)``, is given back by :meth:`settle`.
        While another reservation waits, this one waits behind it (first come, first
        served: see the class). ``waits``, when the call must wait: awaited once,
        before it queues, with what is available, what calls hold and how many
        reservations wait ahead of it (a notice for the stream).

        Why it waits for all of ``want``: a call that took the crumb its siblings' holds
        left it (10 of 90, two calls holding 40 each) was sent that as its cap and cut
        there, its sub-turn ended ``budget`` while most of those holds came back
        unwritten. Holds end on their own (each is one model call's), so the wait
        does."""
        want = max(want, 0)
        need = max(want, 1)  # (``want`` 0: whether anything is left, once holds settle)
        top = self._top()
        queue = top._queue
        available = None if queue else self._ready(need)
        if available is None:
            if waits is not None:  # (said before it queues: a stream slow to take the
                # notice would otherwise hold up the reservations behind this one)
                await waits(self.available(), top.held, len(queue))
            ticket = object()
            queue.append(ticket)
            try:
                while True:
                    if queue[0] is ticket:
                        available = self._ready(need)
                        if available is not None:
                            break
                    if top._changed is None:
                        top._changed = trio.Event()
                    await top._changed.wait()
            finally:
                queue.remove(ticket)
                if queue:  # the next one looks (this one served, cancelled or refused)
                    top._wake()
        if not available:
            return 0
        take = min(want, available)
        account: OutputAccount | None = self
        while account is not None:
            account.left -= take
            account.held += take
            account = account.parent
        return available

    def settle(self, held: int, spent: int) -> None:
        """A call that reserved ``held`` tokens is over, having written ``spent``: what
        it did not write comes back (what it wrote past ``held`` is taken too), in this
        account and every one above it, and calls waiting for tokens look again.
        ``settle(0, n)``: ``n`` tokens written with no reservation (a tool's usage,
        :meth:`ToolContext.add_usage <runtime.tools.ToolContext.add_usage>`)."""
        account: OutputAccount | None = self
        top = self
        while account is not None:
            account.held -= held
            account.left += held - spent
            top = account
            account = account.parent
        top._wake()

    def _wake(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    def __repr__(self) -> str:
        return f"OutputAccount(left={self.left}, held={self.held})"


def batch_account(left: int | None, parent: OutputAccount | None) -> OutputAccount | None:
    """The account a turn's batch of tool calls shares (:class:`OutputAccount`): the
    turn's output tokens ``left`` as it begins, under the turn's own account
    (``parent``: a sub-turn's, which its caller's batch shares); ``parent`` itself when
    the turn has no output budget (``left`` ``None``)."""
    if left is None:
        return parent
    return OutputAccount(left, parent)
