"""The tool executor: runs a step's tool calls concurrently, turning failures into results.

Shared by every session of a host. Each :class:`~runtime.actor_messages.ExecuteTools` request
runs in a child task; within it, every call runs concurrently (sync tools in worker
threads) under its own timeout. Nothing a tool does can crash the executor or the
turn: an unknown tool, invalid arguments, an exception, a timeout or an unserializable
return value each become an error outcome that the model sees as the tool's result.
Outcomes are sent as they complete; the turn runner saves them in call order.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Generator
from typing import Any

import trio

from runtime.actor import ServingActor
from runtime.actor_messages import ExecuteTools, ToolCallSpec, ToolOutcome, ToolProgress
from runtime.errors import describe_exception, sole_exception
from runtime.events import ToolApprovalDecided, ToolApprovalRequested
from runtime.logging import get_logger, log_exception
from runtime.redact import redact
from runtime.results import truncate_output
from runtime.tools import (
    Tool,
    ToolContext,
    ToolInputError,
    note_abandoned_call,
    own_input,
    to_jsonable,
)


def writable(value: Any, *, deep: bool = False) -> Any:
    """``value`` with every lone surrogate in its text written as its escape (``\\udce9``),
    the rest as it is: a string only, or (``deep``) every string of a JSON value.

    Bytes that are not UTF-8, decoded with ``surrogateescape`` (``os.listdir``'s names,
    a path in an ``OSError``'s message), hold lone surrogates, which no JSON writer
    (orjson, the store's) takes: such a result was the call's, and then every save of
    the session failed."""
    if isinstance(value, str):
        if value.isascii():
            return value
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if not deep:
        return value
    if isinstance(value, list):
        return [writable(v, deep=True) for v in value]
    if isinstance(value, dict):
        return {writable(k, deep=True): writable(v, deep=True) for k, v in value.items()}
    return value


LOOP_HOLD_WARNING = 0.25
"""Seconds one step of an async tool's call (from one ``await`` to the next) may hold the
event loop before :class:`LoopWatch` warns."""


class LoopWatch:
    """Times each step an async tool's call takes on the event loop: from where Trio
    resumes it to its next ``await``. Every session of the host waits while a step runs;
    a long one is an async tool that blocks (``time.sleep``, a blocking client, a long
    computation). The first step of a tool over :attr:`limit` is logged, a warning
    ``tool.blocked-loop`` naming the tool, once per tool and watch (per host).

    The cost is a clock read per step; ``clock`` is injectable (a test's fake)."""

    def __init__(
        self, *, clock: Callable[[], float] = time.perf_counter, limit: float = LOOP_HOLD_WARNING
    ) -> None:
        self.clock = clock
        self.limit = limit
        self.warned: set[str] = set()
        """The tools warned about already."""

    def held(self, tool_name: str, seconds: float, session_id: str | None) -> None:
        """One step of ``tool_name``'s call took ``seconds``: warn if it is the first too
        long a step of that tool."""
        if seconds <= self.limit or tool_name in self.warned:
            return
        self.warned.add(tool_name)
        get_logger("axon.tools").warning(
            "tool.blocked-loop",
            tool=tool_name,
            session_id=session_id,
            held=round(seconds, 3),
            hint="an async tool blocked the event loop, and every session of the host with "
            "it: make it a sync function (run in a thread) or await (trio.sleep, "
            "trio.to_thread.run_sync)",
        )


class _Timed:
    """An awaitable running ``coro`` as ``await coro`` does, timing each of its steps on
    the loop (:class:`LoopWatch`)."""

    __slots__ = ("_coro", "_session_id", "_tool_name", "_watch")

    def __init__(self, coro: Any, watch: LoopWatch, tool_name: str, session_id: str | None):
        self._coro, self._watch = coro, watch
        self._tool_name, self._session_id = tool_name, session_id

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, watch = self._coro, self._watch
        value: Any = None
        thrown: BaseException | None = None
        while True:
            start = watch.clock()
            try:
                if thrown is None:
                    yielded = coro.send(value)
                else:
                    exc, thrown = thrown, None
                    yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            finally:
                watch.held(self._tool_name, watch.clock() - start, self._session_id)
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # what Trio throws in (Cancelled): to the tool
                thrown, value = exc, None


def _ends_the_process(exc: BaseException) -> bool:
    """Whether ``exc`` asks the whole program to stop (Ctrl-C, ``sys.exit``): it goes on
    out of the tool executor as it came, whichever tool it came through."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split((KeyboardInterrupt, SystemExit))[0] is not None
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


class StepPlaces:
    """The places of one step's calls (``Budget.max_parallel_tool_calls``): a call holds
    one while its tool runs. Counts the calls that had to wait for one: the first is
    logged (``tool.calls-wait-for-a-place``, once a step, naming the bound), and a call
    of the step that times out says in its error that calls waited behind the bound. A
    step whose tools wait on each other (a barrier) stalls there until their timeouts,
    unless the tool says so (:attr:`~runtime.tools.Tool.waits_on_siblings`): visible
    where it shows, not a step that merely took a minute."""

    __slots__ = ("_limiter", "_on_first_wait", "bound", "waited")

    def __init__(self, bound: int, on_first_wait: Callable[[], None] | None = None) -> None:
        self.bound = bound
        self.waited = 0
        """How many of the step's calls waited for a place."""
        self._limiter = trio.CapacityLimiter(bound)
        self._on_first_wait = on_first_wait

    async def take(self) -> None:
        limiter = self._limiter
        if not limiter.available_tokens or limiter.statistics().tasks_waiting:
            self.waited += 1
            if self.waited == 1 and self._on_first_wait is not None:
                self._on_first_wait()
        await limiter.acquire()

    def give_back(self) -> None:
        self._limiter.release()

    def timed_out_hint(self) -> str:
        """What a timed-out call's error adds when calls of its step waited for a place."""
        if not self.waited:
            return ""
        return (
            f" ({self.waited} calls of its step waited for a place meanwhile: "
            f"Budget.max_parallel_tool_calls={self.bound}; the calls of a tool that wait "
            "on each other run at once with @tool(waits_on_siblings=True))"
        )


async def run_tool_call(
    call: ToolCallSpec,
    tools: dict[str, Tool],
    default_timeout: float | None,
    max_chars: int | None,
    context: ToolContext | None = None,
    approve: Any = None,
    watch: LoopWatch | None = None,
    limit: StepPlaces | None = None,
) -> ToolOutcome:
    """Run one call to completion and describe what happened; never raises (but
    cancellation, ``KeyboardInterrupt`` and ``SystemExit`` propagate).

    Whatever the tool's code does (its argument validators and approval rule
    included) becomes the call's error: an exception of any class, one whose ``str()``
    raises, a ``GeneratorExit``, a ``trio.Cancelled`` that no cancelled scope sent, a
    return value that cannot be made JSON (bytes that are not UTF-8, a cycle, nesting
    too deep). ``watch`` times the steps of an async tool's call (:class:`LoopWatch`).
    ``limit`` (the step's ``max_parallel``) is held while the tool runs: not while its
    call waits for an approval, and its timeout starts once it holds it; a tool whose
    calls wait on each other (:attr:`~runtime.tools.Tool.waits_on_siblings`) takes none."""
    start = trio.current_time()

    def done(output: Any = None, error: str | None = None, ran: bool = False) -> ToolOutcome:
        return ToolOutcome(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            ran=ran,  # (the tool's function was called: its output, or its own error)
            output=output,
            error=None if error is None else truncate_output(writable(error), max_chars),
            duration=trio.current_time() - start,
            usage=context.usage if context is not None else None,
            waits_for=context.waits_for if context is not None and error is None else None,
            waits_until=context.waits_until if context is not None else None,
            waits_client=context.waits_client if context is not None else None,
            waits_asked=context.waits_asked if context is not None else None,
        )

    tool = tools.get(call.tool_name)
    if tool is None:
        names = ", ".join(sorted(tools)) or "none"
        return done(error=f"unknown tool {call.tool_name!r}; available tools: {names}")
    try:
        kwargs = tool.validate(own_input(call.input))  # the history's input stays the model's
    except ToolInputError as exc:
        return done(error=str(exc))
    except Exception as exc:  # a validator of the tool's own that raised past pydantic
        return done(
            error=f"invalid arguments for {tool.name}: validation raised {describe_exception(exc)}"
        )
    try:  # (not asked again of a call the turn asked it of: ToolCallSpec.ruled)
        asks = not (call.approved or call.ruled) and tool.requires_approval(kwargs, context)  # type: ignore[arg-type]
    except Exception as exc:
        return done(error=tool.rule_raised(exc))
    if asks:
        if approve is None:
            return done(error=f"tool {tool.name} needs approval and no approver is configured")
        approved, reason = await approve(call, kwargs)
        if not approved:
            return done(error=f"the tool call was denied: {reason or 'no reason given'}")
    timeout = tool.timeout if tool.timeout is not None else default_timeout
    if limit is not None and tool.waits_on_siblings:
        limit = None
    if limit is not None:
        await limit.take()
    try:
        with trio.move_on_after(timeout if timeout is not None else math.inf) as scope:
            running: Any = tool.call(kwargs, context)
            if watch is not None and tool.is_async:
                sid = context.session_id if context is not None else None
                running = _Timed(running, watch, tool.name, sid)
            result = await running
        if scope.cancelled_caught:
            hint = "" if limit is None else limit.timed_out_hint()
            return done(error=f"tool {tool.name} timed out after {timeout:g}s{hint}", ran=True)
    except Exception as exc:
        # A tool's own nursery wraps its one error in a group: the error is what it says.
        raised = (sole_exception(exc) or exc) if isinstance(exc, ExceptionGroup) else exc
        return done(error=f"tool {tool.name} raised {describe_exception(raised)}", ran=True)
    except BaseException as exc:
        if _ends_the_process(exc):
            raise
        # A real cancellation (the turn's, the host's) goes on, raised here afresh; a
        # Cancelled the tool made or carried out of its own scope, a GeneratorExit, is
        # the tool's error like any other.
        await trio.lowlevel.checkpoint_if_cancelled()
        raised = (sole_exception(exc) or exc) if isinstance(exc, BaseExceptionGroup) else exc
        return done(error=f"tool {tool.name} raised {describe_exception(raised)}", ran=True)
    finally:
        if limit is not None:
            limit.give_back()
    try:
        value = to_jsonable(result)
        try:
            output = truncate_output(writable(value), max_chars)
        except TypeError:  # orjson's: a lone surrogate deep inside, an integer past 64 bits
            output = truncate_output(writable(value, deep=True), max_chars)
    except TypeError as exc:  # orjson's too: an integer past 64 bits, which no save writes
        return done(error=f"tool {tool.name} returned a value that is not JSON: {exc}", ran=True)
    except Exception as exc:  # an object whose own serializer hook raised
        return done(
            error=f"tool {tool.name} returned a value that is not JSON: {describe_exception(exc)}",
            ran=True,
        )
    return done(output=output, ran=True)


ABANDON_AFTER = 5.0
"""Default :attr:`ToolExecutor.abandon_after`."""


class _Detached:
    """A request's calls, each in a task of its own outside the executor's nursery (a
    Trio system task), waited for here.

    A tool that shields itself from cancellation (``with trio.CancelScope(shield=True):
    await trio.sleep_forever()``) cannot be stopped: Trio has no way to kill a task.
    In the executor's nursery, its task held that nursery, so the executor's task, the
    host's nursery and ``Host.open``'s exit (Ctrl-C on ``run`` or ``serve``) for ever.
    Here, once the wait is cancelled (the turn's cancel, the executor's crash, the host
    closing), every call is cancelled and given ``grace`` seconds to end; one still
    running then is abandoned, with an error line naming its tool, and the wait ends:
    the host closes. The abandoned task lives on; ``trio.run`` itself still waits for it
    at the very end (Trio waits for every task), so a process that must end then ends
    by other means (docs/embedding.md, "What a tool's failures become").

    A call whose task raises (``KeyboardInterrupt``, a bug past the call's own
    handling) cancels the others, and the wait raises it, as a nursery would."""

    __slots__ = ("_abandoned", "_running", "_settled", "failure", "scopes")

    def __init__(self) -> None:
        self.scopes: list[trio.CancelScope] = []
        self.failure: BaseException | None = None
        self._running: dict[int, str] = {}
        """The calls still running: their scope's id, their tool's name."""
        self._settled = trio.Event()
        self._abandoned = False

    def start(self, run: Callable[[ToolCallSpec], Any], call: ToolCallSpec) -> None:
        scope = trio.CancelScope()
        self.scopes.append(scope)
        self._running[id(scope)] = call.tool_name
        trio.lowlevel.spawn_system_task(
            self._run,
            run,
            call,
            scope,
            name=f"tool {call.tool_name}",
            context=contextvars.copy_context(),  # the request's, as a nursery's child
        )

    async def _run(
        self, run: Callable[[ToolCallSpec], Any], call: ToolCallSpec, scope: trio.CancelScope
    ) -> None:
        try:
            with scope:
                await run(call)
        except trio.Cancelled:
            raise  # not the call's own scope's: Trio's end (the system nursery's)
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
                self.cancel()
        finally:
            del self._running[id(scope)]
            if self._abandoned:
                note_abandoned_call(-1)  # it ended after all
            if not self._running:
                self._settled.set()

    def cancel(self) -> None:
        for scope in self.scopes:
            scope.cancel()

    async def wait(self, grace: float, session_id: str | None) -> None:
        """Until every call has ended; if cancelled, at most ``grace`` seconds more."""
        try:
            if self._running:
                await self._settled.wait()
            else:
                await trio.lowlevel.checkpoint()
        except trio.Cancelled:
            self.cancel()
            with trio.move_on_after(grace, shield=True):
                await self._settled.wait()
            self._abandon(grace, session_id)
            raise
        if self.failure is not None:
            raise self.failure

    def _abandon(self, grace: float, session_id: str | None) -> None:
        self._abandoned = True
        for name in self._running.values():
            note_abandoned_call()
            get_logger("axon.tools").error(
                "tool.abandoned",
                tool=name,
                session_id=session_id,
                grace=grace,
                error=f"tool {name} did not end within {grace:g}s of its cancellation "
                "(it shields itself from it?): its task is abandoned, still running",
            )


NO_APPROVER = (
    "the approval rule of {tool} asked for a decision, and no approver runs in this "
    "process to give one (the in-process approver that ran as the turn made the call "
    "has ended): the call was not executed"
)
"""Why a call is denied whose approval rule asked for a decision in the executor with no
in-process approver running (:meth:`ToolExecutor._approve`)."""


class ToolExecutor(ServingActor[ExecuteTools]):
    """Host-wide actor executing tool calls for every session.

    Each :class:`~runtime.actor_messages.ExecuteTools` is served in a child task
    (:class:`~runtime.actor.ServingActor`); if the executor crashes, every call not yet
    answered gets an error outcome saying so, so no turn waits forever.
    """

    inbox_capacity = 1024
    request_types = (ExecuteTools,)

    def __init__(
        self,
        *,
        name: str = "tool-executor",
        approval_timeout: float | None = 300.0,
        abandon_after: float = ABANDON_AFTER,
    ) -> None:
        super().__init__(name=name)
        self.approval_timeout = approval_timeout
        """Seconds a ``needs_approval`` call waits for a decision before it is denied."""
        self.abandon_after = abandon_after
        """Seconds a cancelled call (its turn's, the host's shutdown) has to end before
        its task is abandoned, and logged (``tool.abandoned``): see :class:`_Detached`."""
        self._waiting: dict[str, tuple[trio.Event, list[ToolApprovalDecided]]] = {}
        self._pending: dict[int, set[str]] = {}
        """Per request in flight: its calls not yet answered."""
        self._background: trio.Nursery | None = None
        self.loop_watch = LoopWatch()
        """Warns of an async tool that holds the event loop (once per tool)."""
        self._decisions: Any = None
        """The bus subscription to approval decisions, taken at the first call that waits
        for one in memory (:meth:`_approve`) and kept while the executor runs."""

    def fail(self, request: ExecuteTools, exc: BaseException) -> None:
        """Answer each call of ``request`` still unanswered with the crash."""
        pending = self._pending.pop(id(request), None)
        request.answer_crash(self.name, exc, only=pending)

    async def run(self) -> None:
        async with trio.open_nursery() as background:
            self._background, self._decisions = background, None
            try:
                await super().run()
            finally:
                self._background = None
                background.cancel_scope.cancel()

    def _listen_for_decisions(self) -> None:
        """Subscribe to approval decisions, once, before the first request for one is
        published (so its decision cannot be missed). Not at start: a call waits here
        only while an in-process approver runs (``TurnHost.approves_in_process``;
        otherwise it suspends its turn, docs/approval.md), and a subscription taken at
        start woke this executor's task at every decision a person recorded for a
        suspended turn, to find nobody waiting (a task step and a bus delivery per
        decision, issue 21)."""
        if self._decisions is not None or self.bus is None or self._background is None:
            return
        self._decisions = self.bus.subscribe(
            [ToolApprovalDecided], policy="block", name=f"{self.name}:approvals"
        )
        self._background.start_soon(self._collect_decisions, self._decisions)

    async def _collect_decisions(self, decisions: Any) -> None:
        try:
            async for decision in decisions:
                waiter = self._waiting.get(getattr(decision, "tool_call_id", ""))
                if waiter is not None:
                    waiter[1].append(decision)
                    waiter[0].set()
        finally:
            decisions.close()

    async def _approve(
        self, request: ExecuteTools, call: ToolCallSpec, kwargs: Any
    ) -> tuple[bool, str | None]:
        """Publish an approval request and wait for its decision (denied on timeout).

        The executor asks a call's approval rule only when the turn runner did not (an
        in-process approver ran as the turn made the call: the call waits for it here
        rather than suspending the turn); the runner's answer goes with the call
        (``ToolCallSpec.ruled``). Denied at once when that approver has ended since:
        waited for, the call held its turn for the whole ``approval_timeout`` (300 s)
        for a decision nobody could give (``session.decide`` decides suspended calls
        only). (Before the rule was asked once a call, a rule that said no as the turn
        asked and yes here came this way too.)"""
        in_process = getattr(request.host, "approves_in_process", None)
        if in_process is not None and not in_process():
            return False, NO_APPROVER.format(tool=call.tool_name)
        self._listen_for_decisions()
        event = trio.Event()
        box: list[ToolApprovalDecided] = []
        self._waiting[call.tool_call_id] = (event, box)
        try:
            await self.publish(
                ToolApprovalRequested(
                    session_id=request.session_id,
                    turn_id=request.turn_id,
                    step=request.step,
                    tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name,
                    input=call.input,
                    causation_id=call.tool_call_id,
                )
            )
            with trio.move_on_after(
                self.approval_timeout if self.approval_timeout is not None else math.inf
            ):
                await event.wait()
        finally:
            del self._waiting[call.tool_call_id]
        if not box:
            return False, f"no decision within {self.approval_timeout:g}s"
        return box[0].approved, box[0].reason

    async def serve(self, request: ExecuteTools) -> None:
        pending = {c.tool_call_id for c in request.calls}
        self._pending[id(request)] = pending
        await self._execute_calls(request, pending)
        self._pending.pop(id(request), None)  # not in finally: see ServingActor

    async def _execute_calls(self, request: ExecuteTools, pending: set[str]) -> None:
        bound = request.max_parallel
        # (a step of no more calls than the bound needs no limiter)
        limit = None
        if bound and len(request.calls) > bound:

            def first_wait() -> None:
                get_logger("axon.tools").info(
                    "tool.calls-wait-for-a-place",
                    session_id=request.session_id,
                    turn_id=request.turn_id,
                    step=request.step,
                    calls=len(request.calls),
                    bound=bound,
                    setting="Budget.max_parallel_tool_calls",
                )

            limit = StepPlaces(bound, first_wait)

        async def one(call: ToolCallSpec) -> None:
            running = [True]

            async def emit(chunk: Any, _call: ToolCallSpec = call) -> None:
                if not running[0] or request.cancel_scope.cancel_called:
                    # The call has ended, or its requester stopped waiting: a context
                    # kept past it (a background task) put its chunk in the session's
                    # tool inbox, where a later call with the same id (call_0 of every
                    # response) streamed it as its own.
                    return
                await request.reply.put(
                    ToolProgress(
                        tool_call_id=_call.tool_call_id, tool_name=_call.tool_name, chunk=chunk
                    )
                )

            context = ToolContext(
                host=request.host,
                session_id=request.session_id,
                turn_id=request.turn_id,
                step=request.step,
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                emit=emit,
                deps=request.deps,
                depth=request.depth,
                # a call approved runs, not waits; one whose sub-agent waited may wait
                # again (its sub-turn asks for its next approval)
                may_wait=request.may_wait and (not call.approved or call.decision is not None),
                decision=call.decision,
                confirm=request.confirm,
                output_left=request.output_left,
                output_account=request.output_account,
            )
            try:
                outcome = await run_tool_call(
                    call,
                    request.tools,
                    request.default_timeout,
                    request.max_result_chars,
                    context,
                    approve=lambda c, kw: self._approve(request, c, kw),
                    watch=self.loop_watch,
                    limit=limit,
                )
            except Exception as exc:
                # A bug on this call's way (a plug-in's tool class, ours): its error, not
                # a crash that fails every session's calls in flight with it.
                log_exception(
                    get_logger("axon.tools"),
                    "tool.call-failed",
                    session_id=request.session_id,
                    tool_call_id=call.tool_call_id,
                    error=redact(describe_exception(exc)),
                )
                outcome = ToolOutcome(
                    tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name,
                    error=f"the tool call failed: {describe_exception(exc)}",
                )
            finally:
                running[0] = False
            pending.discard(call.tool_call_id)
            if request.cancel_scope.cancel_called:
                # Nobody waits for it: a tool that swallowed its cancellation answered
                # anyway, into the session's tool inbox, and the next turn's call with
                # the same id (call_0) took that stale answer as its own result.
                return
            try:
                await request.reply.put(outcome)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        with request.cancel_scope:
            calls = _Detached()
            for call in request.calls:
                calls.start(one, call)
            await calls.wait(self.abandon_after, request.session_id)
