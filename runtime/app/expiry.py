"""Waits that expire: ``Agent(approval_timeout=...)`` in the embedded host.

A call that suspends its turn stores, with its :class:`~runtime.messages.Awaiting`, the
wall-clock time its wait expires (``expires_at``: seconds since the epoch, so it holds
across restarts; a record stored without one never expires). Nothing runs for a wait
(docs/approval.md), so expiry is noticed in two places:

- when a host loads a waiting session after the deadline (``open_session``, a reopen),
  the expired calls are decided before the history is read;
- while a host is up, one task (:class:`ExpiryWatch`) sleeps until the earliest deadline
  of the waiting sessions the host has seen, then decides what expired there.

(A worker's host does neither: there a worker notices a waiting turn's deadline from the
turn queue, :meth:`runtime.turn_queue.TurnQueue.take_expired`, and records the expiry
through the queue, ``expire_session(record=...)``, which resumes the turn on any worker.)

Either way the expiry is recorded through the same version-checked save as a person's
decision (:func:`runtime.approval.record_decision`), so of an expiry and a concurrent
decision exactly one is recorded; the expiry is published as
:class:`~runtime.events.ToolApprovalExpired`, and when it decided the turn's last
waiting call the turn resumes, as after ``session.respond``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog
import trio

from runtime import lifecycle  # tool.approval-expired, at the first expiry (runtime/lifecycle.py)
from runtime.approval import (
    APPROVAL,
    Decision,
    PendingCall,
    Recorded,
    approval_decided,
    pending_calls,
    record_decision,
)
from runtime.errors import (
    AlreadyDecided,
    HostClosed,
    NothingToResume,
    SessionBusy,
    UnknownApproval,
)
from runtime.logging import get_logger, log_exception
from runtime.messages import AssistantMessage, Message, ToolCallPart

if TYPE_CHECKING:
    from runtime.agent import Agent

Host = Any
"""A :class:`runtime.app.host.Host` (not imported: the host imports this module)."""
Session = Any
"""A :class:`runtime.app.session.Session`."""

TIMED_OUT = "timed out"
"""The reason an expired call is denied with."""
MAX_WATCHED = 10_000
"""Most waiting sessions one host's timer keeps; past it, a session's wait is noticed on
its next load only."""

NAP = 10.0
"""Longest the timer sleeps while it watches a wait. Its sleep is timed on Trio's clock,
which stops while the machine is suspended, and the host's clock is not (it counts the
suspend: :class:`runtime.clocks.SteadyWallClock`): a machine woken past a deadline has
the wait expired within this, not after the rest of the sleep it was in."""

LOGGER = "runtime.app.expiry"
log = structlog.get_logger(LOGGER)


def deadlines(messages: Sequence[Message]) -> dict[str, float]:
    """``expires_at`` of each call the history's last turn still waits for, by tool call id
    (calls without a deadline left out)."""
    waiting = {c.tool_call_id for c in pending_calls(messages)}
    return {
        p.tool_call_id: p.awaiting.expires_at
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
        and p.tool_call_id in waiting
        and p.awaiting is not None
        and p.awaiting.expires_at is not None
    }


def expired(messages: Sequence[Message], now: float) -> tuple[PendingCall, ...]:
    """The undecided waiting calls whose deadline is at or before ``now``."""
    due = deadlines(messages)
    return tuple(
        c for c in pending_calls(messages) if c.tool_call_id in due and due[c.tool_call_id] <= now
    )


def _timed_out(call: PendingCall) -> Decision:
    if call.kind == APPROVAL:
        return Decision(approved=False, reason=TIMED_OUT)
    return Decision(error=TIMED_OUT)


RecordDecision = Callable[[str, Decision, Mapping[str, Any]], Awaitable[Recorded]]
"""``await record(key, decision, tools)``: how an expiry is recorded (by default
:func:`runtime.approval.record_decision` on the host's store; a worker's goes through
its turn queue, which resumes the turn on any worker)."""


async def expire_session(
    host: Host, session_id: str, agent: Agent, *, record: RecordDecision | None = None
) -> bool:
    """Decide the calls of session ``session_id`` whose wait has expired (as of
    ``host.clock()``), each as denied with reason ``timed out``; a call someone decided
    first keeps that decision. Publishes :class:`ToolApprovalExpired` (and, for an
    approval, :class:`ToolApprovalDecided`) for each one recorded. Returns whether an
    expiry decided the turn's last waiting call: then the turn is to resume."""
    stored = await host.store.load(session_id)
    if stored is None:
        return False

    async def in_store(key: str, decision: Decision, tools: Mapping[str, Any]) -> Recorded:
        return await record_decision(host.store, session_id, key, decision, tools)

    save = record or in_store
    tools = {t.name: t for t in agent.tools}
    complete = False
    for call in expired(stored.messages, host.clock()):
        try:
            recorded = await save(call.approval_id, _timed_out(call), tools)
        except (AlreadyDecided, UnknownApproval):
            continue  # decided (or superseded) first: that decision stands
        complete = complete or recorded.complete
        await host.bus.publish(
            lifecycle.ToolApprovalExpired(
                session_id=session_id,
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                reason=TIMED_OUT,
                turn_id=call.turn_id,
                causation_id=call.approval_id,
            )
        )
        event = approval_decided(session_id, call, approved=False, reason=TIMED_OUT)
        if event is not None:
            await host.bus.publish(event)
    return complete


async def resume_expired(session: Session, close: bool = False) -> None:
    """Run the continuation of ``session``'s turn, whose last waiting call expired, to its
    end. A turn someone else resumed (or a new message superseded) meanwhile is left to
    them. ``close``: the session was not in memory when its wait expired (the host's
    timer loaded it for the expiry): closed again once idle, as it was."""
    try:
        async with session.resume() as out:
            async for _ in out:
                pass
    except (NothingToResume, SessionBusy):
        pass
    except HostClosed:
        # The host began to close after the expiry was recorded: the continuation is the
        # session's next host's (its resume, or the turn that supersedes the wait). Let
        # out, it ended the host's nursery and ``Host.open`` raised it at its caller.
        return
    if close and session.loaded and not (session.busy or session.queued):
        # Left open, every expired wait of a session its application had closed stayed
        # in memory for the host's life (no idle_ttl by default): its history, actors.
        await session.close()


class ExpiryWatch:
    """One host's timer: the earliest deadline of each waiting session it has seen, and
    the task (started on the first :meth:`note`) that sleeps until the earliest of all and
    expires what is due. Trio's clock times the sleep, at most :data:`NAP` at a time; the
    stored wall-clock deadline, compared with ``host.clock()``, decides what is due (a
    wake-up too early for the wall clock just sleeps again)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._due: dict[str, tuple[float, Agent]] = {}
        self._changed = trio.Event()
        self._started = False

    def note(self, session_id: str, agent: Agent, messages: Sequence[Message]) -> None:
        """Watch session ``session_id`` (run by ``agent``) if its last turn waits with a
        deadline. A worker's host watches none: the turn queue owns resumption there."""
        if self.host.expects_other_writers:
            return
        due = deadlines(messages)
        if not due:
            self._due.pop(session_id, None)
            return
        if session_id not in self._due and len(self._due) >= MAX_WATCHED:
            log.warning("expiry.watch-full", session_id=session_id, watched=len(self._due))
            return
        self._due[session_id] = (min(due.values()), agent)
        self._changed.set()
        if not self._started:
            self._started = True
            self.host.nursery.start_soon(self._run)

    def forget(self, session_id: str) -> None:
        """Stop watching session ``session_id``: its wait is over (every call decided, or
        the session deleted). Kept until its deadline, each such wait held one of the
        :data:`MAX_WATCHED` places, and a long timeout's decided waits left none for a
        new one. (A wait a new message superseded leaves at its deadline: it is found
        decided then.)"""
        self._due.pop(session_id, None)

    def expire_now(self, session_id: str, agent: Agent) -> None:
        """Expire what is due in session ``session_id`` now, in the background: a decision
        found its wait expired before this timer woke (:class:`~runtime.errors.WaitExpired`),
        and the turn is to go on denied ``timed out`` as if it had. A worker's host
        leaves it to the turn queue."""
        if self.host.expects_other_writers or self.host.shutting_down:
            return
        self.host.nursery.start_soon(self._expire, session_id, agent)

    async def _run(self) -> None:
        clock: Callable[[], float] = self.host.clock
        while True:
            self._changed = trio.Event()
            await self.host.sync_clock()
            now = clock()
            due = sorted((d, sid) for sid, (d, _) in self._due.items() if d <= now)
            for _, sid in due:
                watched = self._due.pop(sid, None)
                if watched is not None:
                    await self._expire(sid, watched[1])
            wake = min((d for d, _ in self._due.values()), default=math.inf)
            nap = math.inf if wake == math.inf else min(max(0.0, wake - clock()), NAP)
            with trio.move_on_after(nap):
                await self._changed.wait()

    async def _expire(self, session_id: str, agent: Agent) -> None:
        host = self.host
        if host.shutting_down:
            return
        held = host.get_session(session_id)
        in_memory = held is not None and held.loaded
        del held
        try:
            session = await self._expire_session(session_id, agent)
        except Exception:  # a store failure: this wait is noticed on the next load instead
            log_exception(get_logger(LOGGER), "expiry.failed", session_id=session_id)
            return
        if session is not None:
            host.nursery.start_soon(resume_expired, session, not in_memory)

    async def _expire_session(self, session_id: str, agent: Agent) -> Session | None:
        """Expire what is due; the session to resume, if the expiry completed its turn."""
        host = self.host
        complete = await expire_session(host, session_id, agent)
        record = await host.store.load(session_id)
        if record is not None:
            self.note(session_id, agent, record.messages)  # a later deadline of the turn
        if not complete:
            return None
        session = host.get_session(session_id)
        if session is None or session.agent is not agent:
            try:
                session = await host.open_session(agent, session_id)
            except SessionBusy:  # open here with another agent: its holder resumes it
                return None
        return session
