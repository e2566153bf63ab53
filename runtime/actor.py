"""Actors and their supervision.

An :class:`Actor` owns a bounded :class:`~runtime.inbox.Inbox` and handles one message
at a time in :meth:`Actor.handle`. It may subscribe its inbox to bus events
(:attr:`Actor.subscribes_to`) and publish events of its own. A :class:`Supervisor` runs
actors under a one-for-one policy: an actor whose handler raises is restarted (after a
backoff) with the same inbox, so queued messages are not lost; more than ``intensity``
crashes within ``period`` seconds and it gives up. Every crash, restart and give-up is an
event on the bus and one log line, the supervisor's (the log tap does not write these
events again). An actor whose crash cannot be handled (its :meth:`Actor.on_crash` raises,
or the supervisor's own handling does) is given up on: one actor's supervisor never takes
the host, and the turns beside the actor, down.

Cancellation is never a crash: ``trio.Cancelled`` always propagates.

An actor may *rest* between bursts of work (a session's actors while the session is
idle): given :attr:`Actor.rests_when`, the :data:`REST` message ends its task when that
says so and nothing else is queued, without stopping it; its owner starts it again
(:attr:`Actor.resting`) before its next work. A resting actor holds no task and no channel.
"""

from __future__ import annotations

import math
import random
import sys
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ClassVar, Final, Generic, TypeVar, cast

import attrs
import trio

from runtime import lifecycle  # the actor.* events, on the first crash (runtime/lifecycle.py)
from runtime.bus import Bus, Subscription
from runtime.chunks import _eq, _hash, _repr
from runtime.errors import ActorFailed, describe_exception, exception_message
from runtime.inbox import Inbox, OverflowPolicy
from runtime.logging import get_logger, log_exception
from runtime.redact import redact


class _Rest:
    """The type of :data:`REST` (a singleton)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REST"


REST: Final = _Rest()
"""Sent by an actor's owner when the actor may rest: it ends its task if
:attr:`Actor.rests_when` still says so once it reads this and nothing else is queued, and
is ignored otherwise."""


class Actor:
    """Base class: override :meth:`handle`; optionally the class attributes below.

    ``subscribes_to`` lists event classes the actor wants from the bus (``None``: none;
    an empty tuple is not allowed, use ``ALL`` for every event). ``session_id`` limits the
    subscription to one session.
    """

    ALL: ClassVar[object] = object()

    inbox_capacity: ClassVar[int] = 256
    overflow: ClassVar[OverflowPolicy] = "block"
    """What a full inbox does to a sender: ``block`` (waits for room) or
    ``drop-oldest``. A class that subscribes to bus events and names no ``overflow``
    gets ``drop-oldest`` (:meth:`__init_subclass__`): an observer never stalls an agent
    unless it asks to."""
    subscribes_to: ClassVar[Iterable[type] | object | None] = None
    decides_approvals: ClassVar[bool] = False
    """Whether this actor, while it runs, decides tool approvals in process (the
    :class:`~actors.plugins.ApprovalActor`): its host's turns then wait for its decision
    in memory instead of suspending (``TurnHost.approves_in_process``)."""

    handling_waits: ClassVar[bool] = False
    """Whether handling a message always waits for something (the turn runner's turn
    waits for its model call): then the actor takes a message already in its inbox
    without a schedule point of its own (:meth:`Inbox.take`), since its handling yields
    soon anyway; one task step and one scheduler round less per message (issue 24
    goal 1). An actor whose handling may not wait keeps one schedule point a message,
    so a backlog never runs in one step."""

    rests_after_turn: Callable[[], bool] | None = None
    """Whether the actor may rest as soon as it has handled its turn's last message
    (:attr:`turn_ended`), before the consumer has taken the result (its owner's check:
    no other turn waits); ``None``: it rests on :data:`REST` only. Set per instance by
    the host for a session's turn runner and stream controller: resting in the step
    that ended the turn spares each a task step to wake for :data:`REST` (issue 24
    goal 1). Safe because every turn starts with its owner's wake."""
    turn_ended: bool = False
    """Set by :meth:`handle` when the message was its turn's last for this actor."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An observer class (``subscribes_to`` set) that names no ``overflow`` (nor does
        any class between it and :class:`Actor`) drops its oldest event when its inbox
        is full: with ``block``, one whose handler is slow or stuck made every publisher,
        so every turn of the host, wait for it."""
        super().__init_subclass__(**kwargs)
        if cls.subscribes_to is not None and not any(
            "overflow" in vars(klass) for klass in cls.__mro__ if klass is not Actor
        ):
            cls.overflow = "drop-oldest"

    def __init__(self, *, name: str | None = None, session_id: str | None = None) -> None:
        self.name = name or type(self).__name__
        self.session_id = session_id
        self.inbox: Inbox[Any] = Inbox(self.inbox_capacity, self.overflow, name=self.name)
        """Messages of any type: an actor takes what it handles and ignores the rest."""
        self.bus: Bus | None = None
        self.current_message: Any = None
        """The message being handled (what a crash interrupted, for :meth:`on_crash`)."""
        self._stopped: trio.Event | None = None
        self._ended = False
        """Whether the actor has ended for good, while nobody asked for :attr:`stopped`
        (the event is made already set when asked for then)."""
        self._subscription: Subscription | None = None
        self.rests_when: Callable[[], bool] | None = None
        """Whether the actor may rest now (its task ends on :data:`REST`); ``None``: never."""
        self.resting = False
        """Set while the actor has no task but is not stopped: its owner starts it again
        before its next work (a message sent meanwhile waits in its inbox)."""

    @property
    def stopped(self) -> trio.Event:
        """Set when the actor has ended for good (inbox drained, or given up). Made on
        first use: an event is two tracked objects, and every full garbage collection
        walks ten thousand idle sessions' three actors (issue 24 item 5)."""
        event = self._stopped
        if event is None:
            event = self._stopped = trio.Event()
            if self._ended:
                event.set()
        return event

    @property
    def ended(self) -> bool:
        """Whether :attr:`stopped` is set, without making the event when nobody asked for
        it yet (a session's actors are stopped at every close, and the turn runner asks
        this of its controller at every turn's end; issue 24 goal 1)."""
        event = self._stopped
        return self._ended if event is None else event.is_set()

    def _set_stopped(self) -> None:
        """Set :attr:`stopped`: the event if it was made, else as made already set."""
        event = self._stopped
        if event is None:
            self._ended = True
        else:
            event.set()

    # -- life cycle hooks ------------------------------------------------------------

    async def handle(self, message: Any) -> None:
        """Handle one message. Raising crashes the actor (the supervisor decides)."""
        raise NotImplementedError

    async def on_start(self) -> None:
        """Called before the first message and after every restart."""

    def on_crash(self, exc: BaseException) -> None:
        """Called after a crash, before any restart: reset state that may be corrupt."""

    def on_give_up(self, exc: BaseException) -> None:
        """Called when the supervisor stops restarting this actor."""

    def on_rest(self) -> None:
        """Called as the actor starts resting: let go of what only its work needs."""

    # -- plumbing --------------------------------------------------------------------

    def attach(self, bus: Bus) -> None:
        """Connect to the bus; subscribes the inbox when the actor asks for events."""
        self.bus = bus
        if self.subscribes_to is not None and self._subscription is None:
            kinds = None if self.subscribes_to is Actor.ALL else self.subscribes_to
            self._subscription = bus.subscribe(
                kinds,  # type: ignore[arg-type]
                session_id=self.session_id,
                inbox=self.inbox,
            )

    async def publish(self, event: Any) -> None:
        if self.bus is not None:
            await self.bus.publish(event)

    async def send(self, message: Any) -> None:
        """Put ``message`` into this actor's inbox (waits under ``block``)."""
        await self.inbox.put(message)

    async def run(self) -> None:
        """Handle messages until the inbox is closed and drained (or the actor rests)."""
        inbox = self.inbox
        get = inbox.take if self.handling_waits else inbox.get
        # The task's first message is taken without a schedule point of its own: the
        # task was just scheduled (started, or restarted after its backoff), so a yield
        # here would only cost a task step more. A session's engine and stream controller
        # start with their turn's first message waiting (Host.wake), and handle it in
        # their first step (issue 24 goal 1).
        receive = inbox.take
        while True:
            try:
                message = await receive()
            except trio.EndOfChannel:
                return
            receive = get
            if message is REST:
                if self._rest():
                    return
                continue
            self.current_message = message
            await self.handle(message)
            # Not kept once handled (the loop variable neither): an idle actor must not pin
            # its last message, or a shared actor's last request would keep an evicted
            # session's history alive.
            self.current_message = message = None
            if self.turn_ended:
                self.turn_ended = False
                if self._rest(self.rests_after_turn):
                    return

    def _rest(self, may: Callable[[], bool] | None = None) -> bool:
        """Start resting if :attr:`rests_when` (or ``may``) says so and nothing else is
        queued (no yield from here to the end of the task: its owner never sees it
        half-ended)."""
        if may is None:
            may = self.rests_when
        if may is None or self.inbox.closed or len(self.inbox) or not may():
            return False
        self.resting = True
        self.on_rest()
        self.inbox.park()
        return True

    def stop(self) -> None:
        """Close the inbox: the actor finishes what is queued, then ends (a resting
        actor, which has no task, ends at once)."""
        if self._subscription is not None:
            self._subscription.bus.unsubscribe(self._subscription)
            self._subscription = None
        self.inbox.close()
        if self.resting:
            self._set_stopped()


Request = TypeVar("Request")


class ServingActor(Actor, Generic[Request]):
    """An actor that serves each request in a child task of its own, and answers every
    request a crash cut short.

    Shared by the provider actors and the tool executor, which both serve many sessions
    at once: one slow request must not hold up the next, so :meth:`handle` starts
    :meth:`serve` in a child task and returns. A request is *in flight* from the moment
    :meth:`handle` accepts it until :meth:`serve` returns. When the actor crashes (a bug
    in :meth:`handle` or in a request's task), Trio cancels every sibling task; the
    requests still in flight then, and a request whose :meth:`handle` was the one that
    crashed, are each passed to :meth:`fail` so their requesters get a clear error
    instead of waiting forever. A request the requester cancelled is not in flight any
    more: :meth:`serve` returns normally from the requester's cancel scope.

    Subclasses set ``request_types`` and implement :meth:`serve` and :meth:`fail`. When
    the inbox is closed, :meth:`run` waits for the requests in flight to finish.
    """

    request_types: ClassVar[tuple[type, ...]] = ()
    """The message classes served as requests; any other message goes to
    :meth:`handle_other`."""

    def __init__(self, *, name: str | None = None, session_id: str | None = None) -> None:
        super().__init__(name=name, session_id=session_id)
        self._nursery: trio.Nursery | None = None
        """The nursery of a running :meth:`run` (the latest that still runs)."""
        self._in_flight: dict[int, Request] = {}
        """The requests in flight, of every :meth:`run` running."""
        self._loops: dict[Any, tuple[trio.Nursery, dict[int, Request]]] = {}
        """Per task running :meth:`run`: its nursery and the requests served in it. One
        task, but for a provider the hosts of one Trio run share: each host runs it, so
        each takes requests from the one inbox, maybe another host's (see :meth:`run`)."""

    @property
    def in_flight(self) -> list[Request]:
        """The requests accepted and not yet finished, oldest first."""
        return list(self._in_flight.values())

    async def serve(self, request: Request) -> None:
        """Serve one request to the end; raising crashes the actor (so catch what a
        request may legitimately fail with, and answer the requester)."""
        raise NotImplementedError

    def fail(self, request: Request, exc: BaseException) -> None:
        """Tell ``request``'s requester, without waiting, that the crash ``exc`` cut it
        short. Called outside any task (from :meth:`on_crash`): use ``put_nowait`` and
        swallow a full or closed reply channel."""
        raise NotImplementedError

    async def handle_other(self, message: Any) -> None:
        """A message that is not a request; ignored unless overridden."""

    async def handle(self, message: Any) -> None:
        if not isinstance(message, self.request_types):
            await self.handle_other(message)
            return
        loop = self._loops.get(trio.lowlevel.current_task())
        assert loop is not None, "a ServingActor handles messages only inside run()"
        request = cast(Request, message)  # what request_types admits
        self._in_flight[id(message)] = loop[1][id(message)] = request
        loop[0].start_soon(self._serve_tracked, request, loop[1])
        self.current_message = None  # accepted: a crash from now on finds it in flight

    async def _serve_tracked(self, request: Request, mine: dict[int, Request]) -> None:
        await self.serve(request)
        # Not in a ``finally``: when a crash cancels this task, the request must stay in
        # flight for on_crash to answer.
        self._in_flight.pop(id(request), None)
        mine.pop(id(request), None)

    async def run(self) -> None:
        """Serve until the inbox ends. Each task running this serves the requests it
        takes in a nursery of its own: two hosts of one Trio run sharing a provider run
        it twice, and the first to close set the one nursery both used to ``None`` (the
        other's next request crashed it: ``AssertionError``) after cancelling the other
        host's calls in it. Cancelled (its host closing), the requests it still serves,
        maybe another host's, are failed, their requesters told at once."""
        task = trio.lowlevel.current_task()
        mine: dict[int, Request] = {}
        nursery: trio.Nursery | None = None
        crashed = False
        try:
            async with trio.open_nursery() as nursery:
                self._loops[task] = (nursery, mine)
                self._nursery = nursery
                await super().run()
        except BaseException as exc:
            if _cancelled(exc):
                # (another host's call, when hosts of one Trio run share a provider)
                self._let_go(mine, ActorFailed("the host whose task served the call closed"))
            else:
                crashed = True  # (on_crash answers them, in this task)
            raise
        finally:
            if not crashed:
                self._loops.pop(task, None)
            if self._nursery is nursery:
                others = [n for n, _ in self._loops.values() if n is not nursery]
                self._nursery = others[-1] if others else None

    def _let_go(self, requests: dict[int, Request], exc: BaseException) -> None:
        """Fail ``requests`` (still in flight, now out of it), telling each requester."""
        cut = list(requests.values())
        requests.clear()
        for request in cut:
            self._in_flight.pop(id(request), None)
            self.fail(request, exc)

    def on_crash(self, exc: BaseException) -> None:
        """Fail every request the crash cut short, so no requester waits forever: those
        of the crashed :meth:`run` (this task's), or, called from elsewhere, all."""
        loop = self._loops.pop(trio.lowlevel.current_task(), None) if _in_trio() else None
        requests = dict(self._in_flight) if loop is None else dict(loop[1])
        current = self.current_message
        if isinstance(current, self.request_types) and id(current) not in requests:
            requests[id(current)] = cast(Request, current)
        self.current_message = None
        self._let_go(requests, exc)

    def on_give_up(self, exc: BaseException) -> None:
        """Fail the requests in flight and those still queued: nobody will read them."""
        self.on_crash(exc)
        queued: list[Any] = []
        self.inbox.drain_nowait(queued)
        for message in queued:
            if isinstance(message, self.request_types):
                self.fail(cast(Request, message), exc)


@attrs.frozen(kw_only=True, slots=True)
class RestartPolicy:
    """One-for-one restart policy."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    intensity: int = 3
    """Restarts allowed within ``period``; one more crash and the supervisor gives up."""
    period: float = 5.0
    backoff_initial: float = 0.01
    backoff_max: float = 1.0


class Supervisor:
    """Runs actors, restarting each on its own when it crashes (one-for-one)."""

    def __init__(self, bus: Bus, policy: RestartPolicy | None = None) -> None:
        self.bus = bus
        self.policy = policy or RestartPolicy()
        self.on_fatal: Callable[[BaseException], None] | None = None
        """Called with a ``KeyboardInterrupt`` or ``SystemExit`` raised in an actor's task
        (Ctrl-C lands in whichever task runs; a tool's ``sys.exit()``), instead of letting
        it take the actors' nursery down at once: the host then ends its turns, saved,
        and raises it from ``Host.open`` (:meth:`runtime.app.host.Host.end_for`). The
        actor is given up on. ``None``: it goes on out of the task."""

    def supervise(
        self,
        actor: Actor,
        *,
        policy: RestartPolicy | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> Coroutine[Any, Any, None]:
        """Run ``actor`` until its inbox ends, restarting it on crashes by policy.

        A coroutine to await or to start as a task (``nursery.start(supervise, actor)``),
        made here rather than by a coroutine of its own: every step of the actor's task
        resumes through one frame less, and a session's actors start a task every turn
        (issue 24 goal 1)."""
        actor.attach(self.bus)
        return self._supervise(actor, policy or self.policy, task_status)

    async def _supervise(self, actor: Actor, policy: RestartPolicy, task_status: Any) -> None:
        try:
            # The logger and the crash times are made at the first crash, not per run: an
            # actor runs once per turn (it rests between turns), and with 10,000 turns in
            # flight a bound logger, its write logger, context and a deque each were 40,000
            # more objects for every full garbage collection to walk (issue 24 item 5).
            log: Any = None
            crashes: deque[float] | None = None
            restarts = 0
            started = False
            while True:
                try:
                    if type(actor).on_start is not Actor.on_start:  # (the default: nothing)
                        await actor.on_start()
                    if not started:
                        started = True
                        task_status.started()
                    await actor.run()
                    return
                except Exception as raised:
                    exc = _unwrap(raised)
                    try:
                        if crashes is None:
                            crashes, log = deque(), get_logger("axon.supervisor")
                        err = await self._crashed(actor, exc, policy, crashes, log, restarts)
                        if err is None:
                            delay = min(
                                policy.backoff_max, policy.backoff_initial * math.pow(2, restarts)
                            )
                            await trio.sleep(delay * (0.5 + random.random() / 2))
                            restarts += 1
                            log.warning(
                                "actor.restarted",
                                actor=actor.name,
                                restarts=restarts,
                                session_id=actor.session_id,
                            )
                            await self._publish(
                                lifecycle.ActorRestarted(
                                    actor=actor.name, restarts=restarts, session_id=actor.session_id
                                )
                            )
                            continue
                    except Exception as failure:
                        err = self._failed(actor, exc, failure, restarts)
                        why = "its crash could not be handled"
                    else:
                        why = (
                            f"it crashed {len(crashes)} times, more than its restart policy allows"
                        )
                    try:
                        actor.on_give_up(exc)
                    except Exception as failure:
                        self._failed(actor, exc, failure, restarts, said=True)
                    actor.stop()
                    _answer_cut_short(actor, exc, queued=True)
                    if not started:
                        if task_status is not trio.TASK_STATUS_IGNORED:  # its starter
                            raise ActorFailed(
                                f"actor {actor.name!r} could not start: {err} ({why})"
                            ) from exc
                        task_status.started()
                    return
                except BaseException as raised:
                    ending = _ending(raised)
                    if ending is None or self.on_fatal is None or not started:
                        raise  # (Trio's Cancelled among them)
                    try:
                        actor.on_give_up(ending)  # (a serving actor answers its requests)
                    except Exception:
                        pass
                    actor.stop()
                    _answer_cut_short(actor, ending, queued=True)
                    self.on_fatal(ending)
                    return
        finally:
            if not actor.resting:
                actor._set_stopped()

    async def _crashed(
        self,
        actor: Actor,
        exc: BaseException,
        policy: RestartPolicy,
        crashes: deque[float],
        log: Any,
        restarts: int,
    ) -> str | None:
        """Say that ``actor`` crashed (one log line, with the traceback; one event), let it
        reset (:meth:`Actor.on_crash`), and decide: ``None`` to restart it, else the error
        it gave up on (said too; the caller stops the actor). Called in the ``except``
        block of the crash (the line's traceback is the crash's)."""
        now = trio.current_time()
        crashes.append(now)
        while crashes and now - crashes[0] > policy.period:
            crashes.popleft()
        err: str = redact(describe_exception(exc))
        # The only line of the crash: the log tap does not write the supervisor's events
        # (each was written twice, once by each, the traceback in one only).
        log_exception(  # with the traceback: where the actor's code failed
            log,
            "actor.crashed",
            actor=actor.name,
            session_id=actor.session_id,
            error=err,
            error_type=type(exc).__name__,
            restarts=restarts,
        )
        await self._publish(
            lifecycle.ActorCrashed(
                actor=actor.name,
                error=exception_message(exc),
                error_type=type(exc).__name__,
                restarts=restarts,
                session_id=actor.session_id,
            )
        )
        try:
            actor.on_crash(exc)
        finally:
            _answer_cut_short(actor, exc)
        if len(crashes) <= policy.intensity:
            return None
        log.error(
            "actor.gave-up",
            actor=actor.name,
            session_id=actor.session_id,
            restarts=restarts,
            error=err,
        )
        await self._publish(
            lifecycle.ActorGaveUp(
                actor=actor.name, restarts=restarts, error=err, session_id=actor.session_id
            )
        )
        return err

    def _failed(
        self,
        actor: Actor,
        exc: BaseException,
        failure: Exception,
        restarts: int,
        *,
        said: bool = False,
    ) -> str:
        """The handling of ``actor``'s crash ``exc`` raised ``failure`` (the actor's own
        :meth:`~Actor.on_crash` or :meth:`~Actor.on_give_up`, or a bug of the
        supervisor's): the actor is given up on, as if past its restart intensity, and
        its supervisor ends there. Raised on, it took the host's nursery down, and every
        turn beside the actor with it. Said as best it can be, never raising: a log line
        with the failure's traceback (else a line on stderr), ``actor.gave-up`` and an
        :class:`ActorGaveUp` event, or ``actor.give-up-failed`` alone when ``said`` (the
        give-up was said, its :meth:`~Actor.on_give_up` raised). Returns the crash's
        error text."""
        err: str = redact(describe_exception(exc))
        why = redact(describe_exception(failure))
        try:
            log_exception(
                get_logger("axon.supervisor"),
                "actor.give-up-failed" if said else "actor.gave-up",
                actor=actor.name,
                session_id=actor.session_id,
                restarts=restarts,
                error=err,
                supervisor_error=why,
            )
        except Exception:
            _say_on_stderr(f"axon: actor {actor.name!r} given up on: {err}; its supervisor: {why}")
        if not said:
            try:
                self.bus.publish_nowait(
                    lifecycle.ActorGaveUp(
                        actor=actor.name, restarts=restarts, error=err, session_id=actor.session_id
                    )
                )
            except Exception:  # a full inbox, a broken bus: the log line says it
                pass
        return err

    async def _publish(self, event: Any) -> None:
        try:
            self.bus.publish_nowait(event)
        except trio.WouldBlock:
            with trio.move_on_after(1):
                await self.bus.publish(event)


def _answer_cut_short(actor: Actor, exc: BaseException, *, queued: bool = False) -> None:
    """Answer the message ``actor``'s crash ``exc`` cut short (and, given up on,
    ``queued``, those left in its closed inbox), each whose class has an
    ``answer_crash(actor_name, exc)`` (:class:`~runtime.actor_messages.ExecuteTools`):
    a replacement tool executor that is a plain :class:`Actor`, not a
    :class:`ServingActor`, lost the request it crashed on, and its turn waited to its
    deadline. A :class:`ServingActor` has answered its own (its :meth:`~Actor.on_crash`
    clears :attr:`~Actor.current_message`, its give-up drains its inbox). Never raises:
    a failing answer is one requester's loss, not the supervisor's."""
    messages = [actor.current_message]
    if queued:
        actor.inbox.drain_nowait(messages)
    for i, message in enumerate(messages):
        answer = getattr(type(message), "answer_crash", None)
        if answer is None:
            continue
        if i == 0:  # answered: not again (another actor's on_give_up still sees others)
            actor.current_message = None
        try:
            answer(message, actor.name, exc)
        except Exception:  # (a custom message's own answer): the crash's line says enough
            pass


def _say_on_stderr(text: str) -> None:
    """A line on the process's stderr that never raises (when even logging failed)."""
    stream = sys.__stderr__
    try:
        if stream is not None:
            stream.write(text + "\n")
            stream.flush()
    except Exception:  # a closed or broken stderr: nothing left to say it with
        pass


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is Trio's ``Cancelled``, alone or a group of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


def _in_trio() -> bool:
    """Whether the caller runs in a Trio task."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _ending(exc: BaseException) -> BaseException | None:
    """The ``KeyboardInterrupt`` or ``SystemExit`` in ``exc`` (itself, or the first
    in a group), if any: what asks the whole program to stop."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _ending(inner)
            if found is not None:
                return found
    return None


def _unwrap(exc: BaseException) -> BaseException:
    """The real error inside nursery wrappers: single-exception groups are peeled off."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
