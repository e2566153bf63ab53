"""``Host``: runs actors and sessions in one Trio nursery.

The host owns the bus, the supervisor and the host-wide actors (persister, tool
executor, log tap, one actor per provider configuration); each session adds its own
turn runner, engine and stream controller, which run only while a turn does: between
turns they rest, with no task and no channel (:meth:`Host.wake`, :meth:`Host.rest`), so
ten thousand idle sessions cost a few kilobytes each. ``async with Host.open() as host`` starts
them; leaving the block cancels running turns (they are saved, marked interrupted),
lets every observer (an actor subscribed to bus events: the log tap, a recorder, metrics)
handle the events already published to it, bounded by ``drain_timeout``, and stops every
actor.

A long-running host (the web server) frees idle sessions: with ``idle_ttl`` a session
unused for that long is evicted, with ``max_sessions`` the least recently used idle ones
are evicted past that count. Evicting stops the session's actors and drops its history
from memory; the store keeps it, and the next use loads it again. A session with a
running turn, or whose history is not all saved, is never evicted.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog
import trio

from runtime import lifecycle  # session.evicted, at the first eviction (runtime/lifecycle.py)
from runtime.actor import REST, Actor, RestartPolicy, Supervisor
from runtime.actor_messages import Batch, SessionState
from runtime.agent import Agent
from runtime.app.expiry import ExpiryWatch, expire_session, expired, resume_expired
from runtime.app.gcpacing import acquire_pacer, release_pacer
from runtime.app.nested import end_sub_waits
from runtime.app.session import Session, TurnStream, checked_meta
from runtime.bus import Bus
from runtime.busy import HeldStops, OnBusy, check_on_busy
from runtime.clocks import AnchoredClock, SteadyWallClock
from runtime.errors import (
    SESSION_DELETED,
    ConfigurationError,
    HostClosed,
    InvalidHistory,
    SessionBusy,
    StoreError,
    describe_exception,
    reraise,
    sole_exception,
)
from runtime.history import checked_off_loop, repaired_off_loop
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.liveness import (
    PRIVATE_META,
    host_closed,
    host_opened,
    settle,
    wall,
    writer_gone,
    writer_row,
)
from runtime.logging import configure_logging, get_logger
from runtime.media import InputLimits
from runtime.messages import Message
from runtime.provider import FallbackProvider, Provider
from runtime.ratelimit import LimitBackend, Limiter, MemoryBackend, TrioClock
from runtime.redact import redact, register_env_secrets
from runtime.store import (
    SessionRecord,
    Store,
    fence_under,
    release_under,
    validate_session_id,
)
from runtime.tools import caller_of

if TYPE_CHECKING:
    from actors.mcp import Servers
    from actors.persister import Persister
    from actors.turn.runner import TurnRunner
    from runtime.events import SessionEvicted
    from runtime.hosting import ToolSource

_DELETE_ROUNDS = 100
"""Bound on :meth:`Host.delete_session`'s rounds of cancelling a running turn and
withdrawing those queued (each round ends what the last one let in)."""

_DELETE_WAIT = 10.0
"""Seconds :meth:`Host.delete_session` waits for a cancelled turn to end (its final save
is bounded by ``SAVE_TIMEOUT``; its stream ends once its consumer reads it). A turn
still running then, its consumer not reading (or the caller itself), is left to end
by itself: its saves are refused once the session is deleted."""

# The actors (the implementations the host assembles) are imported where the host starts
# them, not here: ``from runtime import Host`` is an application's first line, and the
# actors' modules (the turn runner, the stores, the MCP client, the provider registry) are
# about a fifth of what it cost; a program pays for them when it opens a host (issue 24;
# tests/test_layers.py keeps it so).

_RUNS_LOCK = threading.Lock()
_PROVIDER_RUNS: dict[int, tuple[trio.lowlevel.TrioToken, int]] = {}
"""The providers serving hosts now, by ``id``: the Trio run they serve (its token) and
how many of its hosts they serve (:func:`_claim_provider`)."""


def _claim_run(
    runs: dict[int, tuple[trio.lowlevel.TrioToken, int]], thing: object, refusal: str
) -> None:
    """Count ``thing`` serving one more host of this Trio run in ``runs``; a
    :class:`~runtime.errors.ConfigurationError` saying ``refusal`` if it serves another
    run now (another thread's ``run_sync``, ``AsyncHost`` or ``Host.open``)."""
    token = trio.lowlevel.current_trio_token()
    with _RUNS_LOCK:
        held = runs.get(id(thing))
        if held is not None and held[0] is not token:
            raise ConfigurationError(refusal)
        runs[id(thing)] = (token, 1 if held is None else held[1] + 1)


def _release_run(runs: dict[int, tuple[trio.lowlevel.TrioToken, int]], thing: object) -> None:
    """One host fewer served by ``thing`` (:func:`_claim_run`)."""
    with _RUNS_LOCK:
        held = runs.pop(id(thing), None)
        if held is not None and held[1] > 1:
            runs[id(thing)] = (held[0], held[1] - 1)


def _claim_provider(provider: Provider) -> None:
    """Count ``provider`` serving one more host of this Trio run; refused if it serves
    another run now. A provider is an actor: its inbox and its tasks belong to one run,
    and requests of two runs in one inbox failed Trio's assertions and hung both runs'
    turns (a threaded web app's ``run_sync`` of one module-level agent per request).
    Hosts of one run may share it."""
    _claim_run(
        _PROVIDER_RUNS,
        provider,
        f"provider {getattr(provider, 'name', provider)!r} is serving a host in "
        "another thread's Trio run now (run_sync or Host.open there): a provider, "
        "and so an Agent, serves one Trio run at a time; give each thread an Agent "
        "of its own (with its own provider), or send the turns to one host",
    )


_STORE_RUNS: dict[int, tuple[trio.lowlevel.TrioToken, int]] = {}
"""The store objects given to :meth:`Host.open` (not opened by it) serving hosts now,
by ``id``, as :data:`_PROVIDER_RUNS` (:func:`_claim_store`)."""


def _claim_store(store: object) -> None:
    """Count ``store`` serving one more host of this Trio run; refused if it serves
    another run now. A store's lock and connection (SQLite's ``trio.Lock``,
    PostgreSQL's pool) belong to one run: two ``AsyncHost`` threads saving through one
    ``SQLiteStore`` interleaved their transactions, and a turn each of 7 sessions in
    200 was lost, both runs told ``stop``. Hosts of one run may share it; a path opens a
    store per host."""
    _claim_run(
        _STORE_RUNS,
        store,
        f"this {type(store).__name__} is serving a host in another thread's Trio "
        "run now (an AsyncHost, run_sync or Host.open there): a store object "
        "serves one Trio run at a time; give each host the store's path "
        "(store='app.db': each opens its own), or send the turns to one host",
    )


DRAIN_TIMEOUT = 5.0
"""Seconds a closing host waits, at most, for its observers to handle what was published."""


_SESSION_KINDS: tuple[Any, ...] | None = None


async def _shielded_nursery(task_status: trio.TaskStatus[trio.Nursery]) -> None:
    """The nursery the host's actors run in, shielded from a cancellation of the block
    (a timeout around ``Host.open``, a cancelled nursery of the application): until
    :meth:`Host._shutdown` has let the running turns save and the persister write them,
    only the host cancels it (``nursery.cancel_scope``)."""
    with trio.CancelScope(shield=True):
        async with trio.open_nursery() as nursery:
            task_status.started(nursery)
            await trio.sleep_forever()


class _ShieldOnStart:
    """The task status an observer's supervisor reports its start to: the observer's
    scope is shielded from then on (:meth:`Host._supervise_observer`)."""

    __slots__ = ("_scope", "_status")

    def __init__(self, scope: trio.CancelScope, status: trio.TaskStatus[None]) -> None:
        self._scope, self._status = scope, status

    def started(self, value: None = None) -> None:
        self._scope.shield = True
        self._status.started(value)


async def _turn_over(stream: TurnStream) -> None:
    """Until ``stream``'s turn is over for a closing host: its consumer has its result,
    or the result waits in the stream's inbox behind the chunks the consumer has not read
    (it is busy elsewhere: it reads them whenever it reads again, the host gone or not).
    Waiting for the consumer to read it held every close 15 s (the bound of
    :meth:`Host._shutdown`) for a consumer that read later, its turn long saved. Looked
    at every 10 ms: only while a host closes, and no wake-up for the inbox's arrivals
    costs the turns that are not closing."""
    done = stream.done
    while not done.is_set() and not stream.result_waits():
        with trio.move_on_after(0.01):
            await done.wait()


def _session_kinds() -> tuple[Any, ...]:
    """What :meth:`Host._start_session_actors` makes a session's actors from (the
    engine, stream controller and turn runner classes, the MCP client's ``agent_tools``
    and ``start_servers``): imported on the first session's open (see the note on the
    imports), then kept. Four ``from`` imports a fresh session were ~2.5 us hot, ~3x
    that in place (issue 24 goal 1)."""
    global _SESSION_KINDS
    if _SESSION_KINDS is None:
        from actors.engine import Engine  # see the note on the imports
        from actors.mcp import agent_tools, start_servers
        from actors.stream_controller import StreamController
        from actors.turn.runner import TurnRunner

        _SESSION_KINDS = (Engine, StreamController, TurnRunner, agent_tools, start_servers)
    return _SESSION_KINDS


def _check_bounds(idle_ttl: float | None, max_sessions: int | None, drain_timeout: float) -> None:
    """A :class:`~runtime.errors.ConfigurationError` for a bound :meth:`Host.open` cannot
    keep, before anything starts."""
    if idle_ttl is not None and not idle_ttl > 0:
        raise ConfigurationError(f"idle_ttl must be a positive number of seconds, not {idle_ttl!r}")
    if max_sessions is not None and not (isinstance(max_sessions, int) and max_sessions >= 1):
        raise ConfigurationError(f"max_sessions must be an int >= 1, not {max_sessions!r}")
    if not (isinstance(drain_timeout, int | float) and drain_timeout >= 0):
        raise ConfigurationError(
            f"drain_timeout must be a number of seconds >= 0, not {drain_timeout!r}"
        )


def _session_state(
    sid: str,
    record: SessionRecord | None,
    history: tuple[Message, ...] | None,
    meta: dict[str, Any] | None,
) -> tuple[SessionState, dict[str, Any]]:
    """A loading session's state and metadata: its stored record's, or ``history`` for a
    new session (a stored one given a history is an
    :class:`~runtime.errors.InvalidHistory`), with ``meta`` over the stored metadata."""
    state = SessionState(session_id=sid)
    session_meta: dict[str, Any] = {}
    if history is not None:
        if record is not None:
            raise InvalidHistory(
                f"session {sid!r} is stored already ({len(record.messages)} messages); "
                "history= starts a new session: give another id, or none"
            )
        state.messages.extend(history)  # saved_upto stays 0: the first save writes it
    if record is not None:
        state.messages.extend(record.messages)
        state.saved_upto = len(record.messages)
        state.version = record.version
        # (the runner's own keys are its to keep, never a turn's meta: _save_meta)
        session_meta.update(
            {k: v for k, v in record.meta.items() if k != "agent" and k not in PRIVATE_META}
        )
    if meta:
        session_meta.update(meta)
    return state, session_meta


def _idle_check(session: Session) -> Callable[[], bool]:
    """Whether ``session`` is idle (no turn running or waiting): when its actors may
    rest. Holds the session weakly, so its actors keep no evicted session alive."""
    ref = weakref.ref(session)

    def idle() -> bool:
        s = ref()
        return s is not None and s.current is None and not s.queued

    return idle


def _no_turn_waits(session: Session) -> Callable[[], bool]:
    """Whether no other turn waits for ``session``: when its turn runner and stream
    controller may rest at the end of a turn (:attr:`Actor.rests_after_turn`), before
    the consumer takes the result. A turn that waits starts with :meth:`Host.wake`
    anyway; this spares their rest and wake in between."""
    ref = weakref.ref(session)

    def no_turn_waits() -> bool:
        s = ref()
        return s is not None and not s.queued

    return no_turn_waits


def _taken_back(existing: Session, meta: Mapping[str, Any] | None) -> bool:
    """Whether an open of an agent used as a tool (its ``meta`` names the calling
    session) takes its sub-session back from ``existing``, the same id open with
    another agent and idle: someone opened it to look at it (the web app, serving
    its own agent, for a request naming that id). The call closes that one and opens
    its own: before, the calling call failed with ``SessionBusy``, and the approval
    its caller had just given was lost with its sub-turn."""
    return caller_of(meta) is not None and not existing.busy and not existing.queued


def _configure(session: Session, deps: Any, on_busy: OnBusy | None) -> None:
    """Give ``session`` the ``deps`` and ``on_busy`` an open asked for (``None``: keep)."""
    if deps is not None:
        session.deps = deps
    if on_busy is not None:
        session.on_busy = on_busy


class Host:
    """Hosts sessions. Create with :meth:`Host.open`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        store: Store,
        bus: Bus,
        supervisor: Supervisor,
        idle_ttl: float | None = None,
        max_sessions: int | None = None,
        drain_timeout: float = DRAIN_TIMEOUT,
        input_limits: InputLimits | None = None,
    ) -> None:
        self.nursery = nursery
        self.store = store
        self.bus = bus
        self.supervisor = supervisor
        self.idle_ttl = idle_ttl
        """Seconds an idle session stays in memory (``None``: for ever)."""
        self.max_sessions = max_sessions
        """Most sessions kept in memory, least recently used evicted first (``None``: all)."""
        self.drain_timeout = drain_timeout
        """Seconds a closing host waits, at most, for its observers to drain their inboxes."""
        self.input_limits = input_limits or InputLimits()
        """How many parts (and images and files) one user input may have: more is refused
        before anything is stored (:class:`~runtime.media.InputLimits`)."""
        self.sessions: dict[str, Session] = {}
        """The sessions in memory, least recently used first."""
        self.turns_by_id: dict[str, TurnStream] = {}
        """The turns running now (each a session's ``current``), by turn id: whether a
        caller's id names one is a look-up, not a pass over every session in memory (a
        worker's thousand, each of its turns: issue 24 goal 3)."""
        self._handles: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        """Every ``Session`` object still referenced, loaded or evicted: one per id."""
        self._opening: dict[str, trio.Event | None] = {}
        self._providers: dict[int, Actor] = {}
        self._providers_starting: dict[int, trio.Event] = {}
        self._model_providers: dict[str, Provider] = {}
        """The providers built for ``Agent(model="provider:model")``, by that string."""
        self.mcp_servers: Servers = {}
        """The running MCP server actors, by configuration (see :mod:`actors.mcp`)."""
        self._tool_source: ToolSource | None = None
        """Every session's turn runner's tool source (one, made with the first session:
        a partial per session was two more objects for the collector to walk)."""
        self._actors: dict[Actor, None] = {}
        """The running actors, and the loaded sessions' resting ones (an ordered set:
        removing one is O(1))."""
        self._deciders: dict[Actor, None] = {}
        """The started actors that decide approvals in process (few: checked per call)."""
        self._observer_scopes: dict[Actor, trio.CancelScope] = {}
        """The running observers' shielded scopes: only the host cancels them, once drained."""
        self.persister: Persister
        self.shutting_down = False
        """Set once a shutdown signal arrived or the host is closing."""
        self.held_stops = HeldStops()
        """Named stops that found nothing here (:meth:`hold_stop`): sent to this host, or
        heard from another through the relay (:func:`actors.relays.attach_relay`)."""
        self.closed = False
        """Set once the host has closed: opening a session, running a turn or starting an
        actor then raises :class:`~runtime.errors.HostClosed`."""
        self.expects_other_writers = False
        """Set when other processes writing this host's sessions is normal operation (the
        workers of one deployment, each running a session's next turn in turn): a
        session that takes in another writer's turns then logs it at debug, not as a
        ``session.concurrent-writer`` warning (the bus event is published either way)."""
        self.claims_turns = False
        """Set once a turn took in another process's writes (:meth:`saw_other_writer`):
        this host's new turns then save their user message before their first model
        call, so a twin of the message in another process is refused before it runs."""
        self._registry: Any = None
        """The store, once this host's row is in its registry of the hosts writing it
        (:meth:`shares_store`); ``None`` for a store that keeps none."""
        self._row_due = 0.0
        """The wall time past which this host's registry row is written again."""
        self.marker_id = new_id("host")
        """This host instance's name in the running markers its turns store
        (:data:`~runtime.liveness.HOST_KEY`): a marker of its own it meets while the
        session runs no turn here is a leftover (its end saves refused), not another
        server's turn (:func:`~runtime.liveness.answering_elsewhere`). The process's
        writer name cannot tell: two Hosts in one process share it."""
        host_opened(self.marker_id, self)  # (closed in ``open``, once its tasks ended)
        self.forgets_unsaved = False
        """Set by ``serve`` (``create_app``): a turn whose final save the store refused is
        dropped from its session's history as it ends (its client is told ``not_saved``),
        so the next turn, one queued behind it too, starts from what the store holds.
        Otherwise it stays in memory and the session's next save writes it."""
        self.tool_executor: Actor
        self._block: trio.CancelScope | None = None
        """The scope of ``Host.open``'s block (the application's code in it), cancelled
        by :meth:`end_for`."""
        self._claimed: list[Provider] = []
        """The providers this host serves (:func:`_claim_provider`)."""
        self._ending: BaseException | None = None
        """The ``KeyboardInterrupt`` or ``SystemExit`` an actor's task raised, which
        ``Host.open`` raises once the host has closed (:meth:`end_for`)."""
        self.clock: Callable[[], float] = SteadyWallClock()
        """The wall clock waits expire by (``Agent(approval_timeout=...)``), in seconds
        since the epoch: read once, then carried on Trio's clock, so a step of the
        machine's clock does not move a deadline; on a store with a clock of its own
        (PostgreSQL, which hosts on several machines may share) that clock, read by
        :meth:`sync_clock` (:mod:`runtime.clocks`); replaceable (a test's fake clock)."""
        self.expiry = ExpiryWatch(self)
        self.rate_limits: LimitBackend = MemoryBackend()
        """Where the providers' rate limits are counted (:mod:`runtime.ratelimit`): this
        process by default; a worker replaces it with its relay's Redis, shared by all
        the workers, before any provider starts."""
        """The timer of the waiting sessions this host has seen (:mod:`runtime.app.expiry`)."""

    async def sync_clock(self) -> None:
        """Read the store's clock again if a minute passed since the last reading (a
        clock of a store shared by several machines: :class:`~runtime.clocks.AnchoredClock`);
        a store that does not answer keeps the reading held (logged)."""
        clock = self.clock
        if not isinstance(clock, AnchoredClock) or not clock.due():
            return
        try:
            await clock.sync()
        except StoreError as exc:
            get_logger("axon.host").warning("host.clock_sync_failed", error=redact(str(exc)))

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        *,
        store: Any = None,
        log_tap: bool = True,
        restart_policy: RestartPolicy | None = None,
        handle_signals: bool = False,
        tool_executor: Actor | None = None,
        idle_ttl: float | None = None,
        max_sessions: int | None = None,
        drain_timeout: float = DRAIN_TIMEOUT,
        input_limits: InputLimits | None = None,
        gc_pacing: bool = False,
        expects_other_writers: bool = False,
    ) -> AsyncIterator[Host]:
        """Start a host. ``store`` is a path (an SQLite file, created if missing), a
        ``Store``, or ``None`` for memory. With ``handle_signals``, SIGINT and SIGTERM
        cancel every running turn with reason ``signal SIGINT`` / ``signal SIGTERM`` (each is
        saved, marked interrupted, and its stream ends with ``abort``); the application's
        own code then leaves the block as usual. ``tool_executor`` replaces the default
        executor with any actor that answers :class:`~runtime.actor_messages.ExecuteTools`.

        ``idle_ttl`` (seconds) evicts a session unused for that long; ``max_sessions``
        evicts the least recently used idle sessions past that many. Both are off by
        default. An evicted session's ``Session`` object reloads it on its next turn.

        Leaving the block delivers every event already published to every observer (an
        actor with ``subscribes_to``: the log tap, a :class:`JsonlRecorder`, metrics): once
        the turns have ended and saved, the observers stop receiving new events and each
        handles what its inbox holds, for at most ``drain_timeout`` seconds (default
        ``DRAIN_TIMEOUT``, 5 s) in all; then every actor is cancelled, and an observer that
        had not finished is logged (``host.events-dropped``, a warning) with how many
        events it did not handle. The drain runs even when the block is cancelled from outside,
        shielded for no longer than that bound.

        An exception the block raises comes out as itself, not wrapped in the nursery's
        exception group, unless closing the host raised others too (then the group holds
        them all).

        ``input_limits`` (:class:`~runtime.media.InputLimits`; default 1,000 parts, 100
        images and files) caps the parts of one user input: ``session.stream`` refuses more
        with :class:`~runtime.errors.TooManyParts`, the web app with 413, before anything
        is stored or queued.

        ``gc_pacing`` hands the process's garbage collections to the Trio loop while the
        host is open (:mod:`runtime.app.gcpacing`: young ones every hundred task steps;
        the heap as it stood once the host started, and what survives to each idle
        moment, is frozen, i.e. walked by no collection, with the cyclic garbage kept
        so bounded, until the last pacing host closes): with thousands of turns in
        flight CPython's own triggers pause the loop for seconds. Off by default: the
        collector's settings are the whole process's (docs/embedding.md, "Garbage
        collection in a large host").

        ``expects_other_writers`` (a worker's host: its deployment dedupes messages by its
        turn queue) sets :attr:`expects_other_writers` before the host starts: such a host
        keeps no row in its store's registry of the hosts writing it (:meth:`shares_store`)."""
        _check_bounds(idle_ttl, max_sessions, drain_timeout)
        from actors.stores import open_store  # see the note on the imports

        if not structlog.is_configured():  # quiet JSON on stderr unless the app configured it
            configure_logging("warning")
        register_env_secrets()  # a tool's error quoting its token from the environment
        given = store is not None and not isinstance(store, str | os.PathLike)
        if given:
            _claim_store(store)
        try:
            the_store = await open_store(store)
        except BaseException:
            if given:
                _release_run(_STORE_RUNS, store)
            raise
        bus = Bus()
        pacer = acquire_pacer() if gc_pacing else None
        held: Callable[[], tuple[int, int]] | None = None  # what it holds, for the pacer
        made: Host | None = None
        try:
            async with trio.open_nursery() as outer:
                nursery = await outer.start(_shielded_nursery)
                try:
                    host = cls(
                        nursery,
                        store=the_store,
                        bus=bus,
                        supervisor=Supervisor(bus, restart_policy),
                        idle_ttl=idle_ttl,
                        max_sessions=max_sessions,
                        drain_timeout=drain_timeout,
                        input_limits=input_limits,
                    )
                except BaseException:  # no host to shut it: the shielded nursery ends here
                    nursery.cancel_scope.cancel()
                    raise
                made = host
                read = getattr(the_store, "now", None)
                if callable(read):  # a store other machines' hosts may share: its clock
                    host.clock = AnchoredClock(read)
                    await host.sync_clock()
                host._block = outer.cancel_scope
                host.expects_other_writers = expects_other_writers
                host.supervisor.on_fatal = host.end_for
                try:
                    await host._start_services(tool_executor, log_tap, handle_signals)
                    await host._join_writers()
                    if pacer is not None:
                        held = host._held
                        pacer.host_started(held)
                    try:
                        yield host
                    finally:
                        with trio.CancelScope(shield=True):  # each step is bounded
                            await host._shutdown()
                            await host._drain_observers()
                finally:
                    for scope in list(host._observer_scopes.values()):
                        scope.cancel()  # shielded from the nursery's cancellation
                    nursery.cancel_scope.cancel()
                    host.closed = True
            host._end_orphaned_streams()
            if host._ending is not None:
                raise host._ending
        except BaseExceptionGroup as group:  # the nursery wraps the one error the block raised
            sole = sole_exception(group)
            if sole is None:
                raise
            reraise(sole)
        finally:
            if made is not None:  # its tasks have ended: a marker of it left is a dead turn's
                host_closed(made.marker_id)
            for provider in made._claimed if made is not None else ():
                _release_run(_PROVIDER_RUNS, provider)  # (its tasks have ended with the nursery)
            if pacer is not None:
                release_pacer(pacer, held)
            if given:
                _release_run(_STORE_RUNS, store)
            if store is None or isinstance(store, str | os.PathLike):  # we opened it
                with trio.CancelScope(shield=True):
                    await the_store.aclose()

    async def _start_services(
        self, tool_executor: Actor | None, log_tap: bool, handle_signals: bool
    ) -> None:
        """Start what every session shares: the persister, the tool executor, the log
        tap, and the watchers of signals and of idle sessions, as :meth:`open` asks."""
        from actors.log_tap import LogTap  # see the note on the imports
        from actors.persister import Persister
        from actors.tool_executor import ToolExecutor

        self.persister = await self.start_actor(Persister(self.store))
        self.tool_executor = await self.start_actor(tool_executor or ToolExecutor())
        if log_tap:
            await self.start_actor(LogTap())
        if handle_signals:
            await self.nursery.start(self._watch_signals)
        if self.idle_ttl is not None:
            self.nursery.start_soon(self._expire_idle_sessions)

    async def start_actor(self, actor: Actor, *, policy: RestartPolicy | None = None) -> Any:
        """Run ``actor`` under the host's supervisor; returns it once started. Raises
        :class:`~runtime.errors.ActorFailed` when it never starts (its ``on_start``
        crashed more often than its restart policy allows). An actor runs once, on one
        host: one running here already, or on another host (of this Trio run or another
        thread's), or one that has ended (stopped by a host that closed, given up on), is
        a :class:`~runtime.errors.ConfigurationError`; start a new instance."""
        return await self._start_actor(actor, policy)

    async def _start_actor(
        self, actor: Actor, policy: RestartPolicy | None, *, shared: bool = False
    ) -> Any:
        """:meth:`start_actor`; ``shared``: a provider, which hosts of one Trio run share
        (:func:`_claim_provider` has refused one another run's host serves)."""
        self.check_open()
        if actor in self._actors:  # a second task on its inbox: two handle()s at once
            raise ConfigurationError(
                f"actor {actor.name!r} is running on this host already: start it once"
            )
        if actor.inbox.closed:  # its run() returned at once: it got nothing, silently
            raise ConfigurationError(
                f"actor {actor.name!r} has ended (its host closed, or it was stopped or "
                "given up on): an actor runs once; start a new instance of it"
            )
        with _RUNS_LOCK:  # (two threads' hosts starting it at once: one wins)
            if not shared and actor.bus is not None and actor.bus is not self.bus:
                # A second task on its inbox, of another host's (or another run's: Trio's
                # assertions fail); its subscription stayed the first host's bus.
                raise ConfigurationError(
                    f"actor {actor.name!r} is running on another host now (of this Trio "
                    "run, or another thread's): an actor runs on one host; give each host "
                    "an instance of its own"
                )
            actor.bus = self.bus  # (attach subscribes it; set here under the lock)
        self._actors[actor] = None
        if actor.decides_approvals:
            self._deciders[actor] = None
        try:
            await self.nursery.start(self._supervise, actor, policy)
        except BaseException:
            self._actors.pop(actor, None)
            self._deciders.pop(actor, None)
            actor.stop()  # (its bus subscription, else fed for ever, never read)
            raise
        return actor

    def end_for(self, exc: BaseException) -> None:
        """An actor's task raised ``exc``, a ``KeyboardInterrupt`` (Ctrl-C lands in
        whichever task runs: a tool's, a provider's, a hook's in a turn runner) or a
        ``SystemExit`` (a tool's ``sys.exit()``): close the host as a signal would, then
        raise it from ``Host.open``. The running turns are cancelled with its name as
        their reason and the application's block is cancelled; leaving it saves the
        turns (marked interrupted) while the persister still runs. Raised on out of the
        actor's task, it cancelled the persister with every other actor at once: the
        turns in flight were not saved at all."""
        if self._ending is None:
            self._ending = exc
        self.shutting_down = True
        self.cancel_turns(type(exc).__name__)
        if self._block is not None:
            self._block.cancel()

    def wait_over(self, session: Session) -> None:
        """Every call of ``session``'s wait is decided: its timer forgets it
        (:meth:`ExpiryWatch.forget`)."""
        self.expiry.forget(session.id)

    def expire_now(self, session: Session) -> None:
        """Deny what of ``session``'s wait expired, ``timed out``, and resume its turn, in
        the background (:meth:`ExpiryWatch.expire_now`): a decision found it past its
        deadline before the timer woke."""
        self.expiry.expire_now(session.id, session.agent)

    def check_open(self) -> None:
        """Raise :class:`~runtime.errors.HostClosed` if the host has closed."""
        if self.closed:
            raise HostClosed(
                "the host is closed: open a new one (Host.open()) to run more turns; "
                "it loads what the store kept"
            )

    def check_not_closing(self) -> None:
        """Raise :class:`~runtime.errors.HostClosed` if the host has closed or has begun
        closing (:attr:`shutting_down`): what would act on its turns (a stop, a resume
        of a turn's stream) is refused then, as a new turn is, and changes nothing."""
        self.check_open()
        if self.shutting_down:
            raise HostClosed(
                "the host is closing: its turns are being stopped and saved; send the "
                "request again once a new host serves the session"
            )

    def saw_other_writer(self) -> None:
        """A turn took in another process's writes: the store is shared, so this host's
        new turns claim their message from now on (:attr:`claims_turns`). A worker's
        host does not: its turn queue gives a message to one worker only."""
        if not self.expects_other_writers:
            self.claims_turns = True

    async def _join_writers(self) -> None:
        """Put this host in its store's registry of the hosts writing it (a store that
        keeps one: SQLite's), dropping the rows of hosts gone (:func:`writer_gone`); one
        write as the host opens. Another host's row there: the store is shared, so this
        host claims its turns from its first (:meth:`saw_other_writer`)."""
        store: Any = self.store
        if self.expects_other_writers or getattr(store, "set_writer", None) is None:
            return  # (a worker's host: the turn queue dedupes; it neither writes nor reads it)
        try:
            rows = await store.writers()
            rows.pop(self.marker_id, None)
            gone = [name for name, row in rows.items() if writer_gone(row)]
            await self._write_row(store, gone)
        except StoreError as exc:  # (no registry: its turns learn of others as before)
            get_logger("axon.host").warning(
                "host.writers-unknown", error=redact(describe_exception(exc))
            )
            return
        self._registry = store
        if len(rows) > len(gone):
            self.saw_other_writer()

    async def _write_row(self, store: Any, gone: list[str]) -> None:
        """Write this host's registry row, dropping the rows of the hosts ``gone``."""
        row, due = writer_row()
        await store.set_writer(self.marker_id, row, drop=gone)
        self._row_due = due

    async def shares_store(self, *, fresh: bool = False) -> bool:
        """Whether another host writes this host's store now, by its registry of the
        hosts writing it; if so the host claims its turns from now on
        (:attr:`claims_turns`). A host alone on its store so learns of a second one as
        that one opens, before a twin of a message reaches both. As a turn starts (before
        the claim it decides) the registry's names are those the turn's version query
        read: no statement more, no write. Another name there (or none read: another
        session's turn took them) reads the rows; rows of hosts gone are dropped then,
        and this host's own row written again once old (or lost). ``fresh`` (a front end
        asking before any turn's query) always reads them: the names a version query
        read may be old then."""
        store = self._registry
        if store is None or self.expects_other_writers:
            return False
        seen = store.writers_seen()
        if not fresh and seen == [self.marker_id] and wall() < self._row_due:
            return False
        try:
            rows = store.writers_now()
            if rows is None:
                rows = await store.writers()
            mine = rows.pop(self.marker_id, None)
            gone = [name for name, row in rows.items() if writer_gone(row)]
            if mine is None or gone or wall() >= self._row_due:
                await self._write_row(store, gone)
        except StoreError:
            return False  # (the turn's saves say what is wrong with the store)
        if len(rows) > len(gone):
            self.saw_other_writer()
            return True
        return False

    async def _leave_writers(self) -> None:
        """Take this host's row out of its store's registry as it closes (shielded, as
        the close: the store's own wait bounds it). Not bounded by a timer: one that cut
        it left the row of a host of a live process, which the next host opening the
        file in this process takes for a second host, for as long as it lives."""
        store = self._registry
        if store is None:
            return
        self._registry = None
        try:
            await store.set_writer(self.marker_id, None)
        except StoreError:
            pass  # (its row outlives it: judged gone by its process, or its age)

    def approves_in_process(self) -> bool:
        """Whether a running actor decides approvals in process (an
        :class:`~actors.plugins.ApprovalActor`): a call that needs approval then waits
        for it in memory instead of suspending its turn (docs/approval.md)."""
        return any(not a.ended for a in self._deciders)

    def _supervise(
        self,
        actor: Actor,
        policy: RestartPolicy | None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> Coroutine[Any, Any, None]:
        """Run ``actor`` (a coroutine to await or to start as a task); an observer (it
        subscribes to bus events) runs shielded from any cancellation but the host's own,
        so that a host cancelled from outside still lets it drain
        (:meth:`_drain_observers`, bounded) before cancelling it."""
        actor.attach(self.bus)  # an actor may decide what it subscribes to here (LogTap)
        if actor.subscribes_to is None:
            # No shield, so no scope: an unshielded scope without a deadline that nobody
            # cancels does nothing, and a session's actors come here at every turn
            # (wake). Nor a coroutine of its own: the supervisor's is the task's, one
            # frame less for every step of it (issue 24 goal 1).
            return self.supervisor.supervise(actor, policy=policy, task_status=task_status)
        return self._supervise_observer(actor, policy, task_status)

    async def _supervise_observer(
        self, actor: Actor, policy: RestartPolicy | None, task_status: trio.TaskStatus[None]
    ) -> None:
        """:meth:`_supervise` for an observer: shielded once started, its scope kept to
        cancel. Not while it starts: shielded from its first ``on_start`` on, one that
        hung (a collector that does not answer) hung ``host.start_actor`` beyond any
        ``trio.fail_after`` of its caller's, and the block's cancellation."""
        ignored = task_status is trio.TASK_STATUS_IGNORED  # (nobody waits for its start)
        scope = trio.CancelScope(shield=ignored)
        self._observer_scopes[actor] = scope
        status = task_status if ignored else _ShieldOnStart(scope, task_status)
        try:
            with scope:
                await self.supervisor.supervise(actor, policy=policy, task_status=status)
        finally:
            self._observer_scopes.pop(actor, None)

    async def provider_actor(self, provider: Provider) -> Actor:
        """The running actor for a provider configuration (started on first use). Sessions
        opened at once wait for the one start of their provider: each started it (the
        second start a second task on its inbox, refused since an actor runs once, which
        failed every concurrent open but the first)."""
        key = id(provider)
        while (actor := self._providers.get(key)) is None:
            starting = self._providers_starting.get(key)
            if starting is None:
                break
            await starting.wait()  # then started, or failed: this open tries in turn
        else:
            return actor
        self._providers_starting[key] = started = trio.Event()
        try:
            _claim_provider(provider)  # (released once the host's tasks have all ended)
            self._claimed.append(provider)
            if provider.rate_limit is not None:  # counted where this host counts them
                backend = self.rate_limits
                clock = getattr(backend, "clock", None) or TrioClock()
                provider.limiter = Limiter(provider.limit_key, provider.rate_limit, backend, clock)
            actor = await self._start_actor(provider, None, shared=True)
            self._providers[key] = actor
        finally:
            del self._providers_starting[key]
            started.set()
        return actor

    def provider_of(self, agent: Agent) -> Provider:
        """The provider ``agent`` runs on: its own, or the one its ``model`` string names
        (``"openai:gpt-4o-mini"``: built on first use, then shared by every agent naming
        the same string, and closed with the host). An agent with neither, or a model
        string whose provider is not registered, is a
        :class:`~runtime.errors.ConfigurationError` (a silent stand-in model would answer
        in its place)."""
        return self.providers_of(agent)[0]

    def providers_of(self, agent: Agent) -> tuple[Provider, ...]:
        """The providers ``agent`` runs on, in order: the first (:meth:`provider_of`),
        then the fallbacks of an ``Agent(provider=[primary, fallback, ...])``."""
        chain = agent.provider
        if isinstance(chain, FallbackProvider):
            return chain.providers
        if chain is not None:
            return (chain,)
        if agent.model is None:
            raise ConfigurationError(
                f"agent {agent.name!r} has no provider: give it one, e.g. "
                "Agent(model='openai:gpt-4o-mini'), "
                "Agent(provider=OpenAIProvider('gpt-4o-mini')), or "
                "Agent(provider=ScriptedProvider.demo()) for the offline demo"
            )
        provider = self._model_providers.get(agent.model)
        if provider is None:
            from actors.providers.registry import provider_for_model  # see the imports

            provider = provider_for_model(agent.model)
            self._model_providers[agent.model] = provider
        return (provider,)

    async def open_session(
        self,
        agent: Agent,
        session_id: str | None = None,
        *,
        meta: dict[str, Any] | None = None,
        deps: Any = None,
        history: Sequence[Message] | None = None,
        on_busy: OnBusy | None = None,
        stored: SessionRecord | None = None,
    ) -> Session:
        """Open (or resume, when ``session_id`` is stored) a session running ``agent``.

        ``deps``: the application's own objects, handed to the session's tools as
        ``ToolContext.deps`` (:attr:`Session.deps`). ``on_busy``: what a new user
        message does while a turn runs, instead of the agent's ``on_busy``
        (:attr:`Session.on_busy`, :mod:`runtime.busy`). ``history``: messages the new
        session starts from, instead of a stored history (a conversation the
        application keeps itself); saved with its first turn if the host has a store.
        Giving a history for a session that is stored or open already raises
        :class:`~runtime.errors.InvalidHistory`, as does anything in it but messages.

        An evicted session whose ``Session`` object is still held is loaded back into that
        object, so there is one object per session id. An agent with no provider is a
        :class:`~runtime.errors.ConfigurationError` (a silent stand-in model would answer
        in its place).

        ``stored``: the session as its caller just read it from this host's store (a
        worker's claim, :attr:`runtime.turn_queue.Claim.stored`; an empty record at
        version 0 for a session not stored yet), loaded from instead of reading it
        again. Ignored when the session is open already."""
        self.check_open()
        if not isinstance(agent, Agent):  # an agent factory's careless return value
            raise ConfigurationError(f"open_session needs an Agent, not {type(agent).__name__}")
        self.provider_of(agent)  # no provider, or an unknown one: refused before anything
        if meta is not None:
            checked_meta(meta)
        if on_busy is not None:
            check_on_busy(on_busy)
        sid = validate_session_id(session_id) if session_id is not None else new_id("session")
        caller = caller_of(meta)
        if caller is not None:  # an agent tool's sub-session: saved under its caller's claim
            fence_under(self.store, sid, caller)
        seed = await checked_off_loop(history) if history is not None else None
        while sid in self._opening:  # one load per id at a time
            pending = self._opening[sid]
            if pending is None:  # the first to wait for this load makes its event
                pending = self._opening[sid] = trio.Event()
            await pending.wait()
        existing = self.sessions.get(sid)
        if existing is not None and existing.agent is not agent and _taken_back(existing, meta):
            await self.close_session(existing)
            existing = None
        if existing is not None:
            if existing.agent is not agent:
                raise SessionBusy(f"session {sid!r} is already open with another agent")
            if seed is not None:
                raise InvalidHistory(
                    f"session {sid!r} is open already; history= starts a new session"
                )
            _configure(existing, deps, on_busy)
            self.touch(existing)
            return existing
        session = await self._load_once(agent, sid, meta, seed, stored)
        _configure(session, deps, on_busy)
        await self._announce(self._evict_over_capacity(keep=session))
        return session

    async def _load_once(
        self,
        agent: Agent,
        sid: str,
        meta: dict[str, Any] | None,
        seed: tuple[Message, ...] | None,
        stored: SessionRecord | None = None,
    ) -> Session:
        """Load ``sid`` into memory, into its evicted ``Session`` object if one of
        ``agent`` is still held; an open of the same id meanwhile waits for this one."""
        handle = self._handles.get(sid)
        if handle is not None and handle.agent is not agent:
            handle = None  # an evicted object of another agent: this open supersedes it
        self._opening[sid] = None  # (an open of the same id meanwhile makes the event)
        try:
            return await self._load_session(agent, sid, meta, handle, seed, stored)
        finally:
            opening = self._opening.pop(sid)
            if opening is not None:
                opening.set()

    async def reopen_session(self, session: Session) -> None:
        """Load an evicted (or closed) ``session`` back into memory, into the same object.

        Raises :class:`~runtime.errors.SessionBusy` if its id was opened again meanwhile
        with another agent."""
        if session.loaded:
            return
        if self._handles.get(session.id, session) is not session:
            current = self._handles[session.id]
            if current.loaded or current.agent is not session.agent:
                raise SessionBusy(f"session {session.id!r} was opened again with another agent")
        self._handles[session.id] = session
        await self.open_session(session.agent, session.id)

    async def load_settled(self, session_id: str) -> SessionRecord | None:
        """The session as stored, as every reader of it here is to show it: a turn a dead
        process left running (killed mid-turn) marked interrupted first
        (:func:`runtime.liveness.settle`: no statement more for a session without a
        running marker; a store failing the marking save leaves it as read). A worker's
        host settles nothing: its turn queue takes such a turn over."""
        record = await self.store.load(session_id)
        if record is None or self.expects_other_writers:
            return record
        return await settle(self.store, record)

    def get_session(self, session_id: str) -> Session | None:
        """The ``Session`` object of ``session_id`` if one exists, loaded or evicted."""
        return self.sessions.get(session_id) or self._handles.get(session_id)

    async def _load_session(
        self,
        agent: Agent,
        sid: str,
        meta: dict[str, Any] | None,
        handle: Session | None,
        history: tuple[Message, ...] | None = None,
        stored: SessionRecord | None = None,
    ) -> Session:
        if handle is not None and handle.unsaved_meta:
            meta = {**handle.unsaved_meta, **(meta or {})}
        if stored is not None and stored.session_id == sid:
            record = stored if stored.version else None
        else:
            record = await self.store.load(sid)
        resume = False
        # A worker's host never expires waits itself: there the turn queue owns a turn's
        # resumption (runtime.app.worker), and a resume outside it could run on two workers.
        expires_here = not self.expects_other_writers
        if expires_here and record is not None:
            # A turn a dead process left running (killed mid-turn): marked interrupted
            # (runtime.liveness), once, before anything reads it. A worker's turn queue
            # takes such a turn over instead.
            record = await settle(self.store, record)
        if expires_here:
            await self.sync_clock()
        if expires_here and record is not None and expired(record.messages, self.clock()):
            resume = await expire_session(self, sid, agent)  # decided before it is read
            record = await self.store.load(sid)
        state, session_meta = _session_state(sid, record, history, meta)
        runner, actors = await self._start_session_actors(agent, sid, state)
        if handle is None:
            session = Session(self, agent, runner, session_id=sid)
            self._handles[sid] = session
        else:
            session = handle
        session.attach(runner, actors, session_meta)
        if not resume:  # (an expired wait's resumption writes before any turn of ours)
            # (a session not stored yet: version 0, as a version query would say)
            session.loaded_record = record or SessionRecord(session_id=sid, messages=())
        idle, after_turn = _idle_check(session), _no_turn_waits(session)
        for actor in actors:
            actor.rests_when = idle
            actor.rests_after_turn = after_turn  # (the engine: its last call's end)
        self.sessions[sid] = session
        session.last_used = trio.current_time()
        if resume:
            self.nursery.start_soon(resume_expired, session)
        elif expires_here and record is not None:
            self.expiry.note(sid, agent, record.messages)
        return session

    async def _start_session_actors(
        self, agent: Agent, sid: str, state: SessionState
    ) -> tuple[TurnRunner, list[Actor]]:
        """Start a session's own actors (its engine, stream controller and turn runner)
        over ``state``, and what they use that the host shares: ``agent``'s providers and
        MCP servers."""
        _, _, _, agent_tools, start_servers = _session_kinds()
        provider_actors = [await self.provider_actor(p) for p in self.providers_of(agent)]
        repaired = await repaired_off_loop(state.messages)  # a long one: in a thread
        if self._tool_source is None:
            self._tool_source = partial(agent_tools, self.mcp_servers)
        if agent.mcp_servers:  # started once per host, shared by sessions (actors.mcp)
            await start_servers(self.mcp_servers, self, agent)
        return self._new_session_actors(sid, agent, state, provider_actors, repaired)

    def _new_session_actors(
        self,
        sid: str,
        agent: Agent,
        state: SessionState,
        providers: Sequence[Any],
        repaired: Any,
    ) -> tuple[TurnRunner, list[Actor]]:
        """A session's engine, stream controller and turn runner over ``state``, with
        what the host shares (``providers``' actors, the tool executor, the persister),
        resting (the session's first turn starts them: :meth:`wake`) and on the bus."""
        Engine, StreamController, TurnRunner, _, _ = _session_kinds()
        stream_inbox: Inbox[Batch[Any]] = Inbox(128, "block", name="engine-output")  # MAX_RUN
        engine = Engine(stream_inbox, tags=agent.think_tags, session_id=sid)
        controller = StreamController(session_id=sid)
        runner = TurnRunner(
            state=state,
            agent=agent,
            provider=providers[0],
            fallbacks=providers[1:],  # Agent(provider=[primary, fallback, ...])
            engine=engine,
            controller=controller,
            tool_executor=self.tool_executor,
            persister=self.persister,
            stream_inbox=stream_inbox,
            host=self,
            tool_source=self._tool_source,
            repaired=repaired,
        )
        actors: list[Actor] = [engine, controller, runner]
        for actor in actors:
            actor.resting = True
            actor.attach(self.bus)
            self._actors[actor] = None
        return runner, actors

    def wake(self, session: Session) -> None:
        """Start the session's resting actors, before its turn is sent to them (without
        yielding: the caller starts the turn in the same step). An idle session's actors
        rest (:meth:`rest`): ten thousand idle sessions hold no task and no channel.

        The engine's and the stream controller's tasks are started from the turn
        runner's first step, before it takes the turn: they run from the next round, when
        the runner has sent each its first message (the model call's, the turn's start),
        and take it in their first step. Started beside the runner, each took a step to
        wait and another for the message (issue 24 goal 1)."""
        self._renew_given_up(session)
        runner: Actor | None = None
        waking: list[Actor] = []
        for actor in session.actors:
            if actor.resting and not actor.inbox.closed:
                actor.resting = False
                if actor is session.runner:
                    runner = actor
                else:
                    waking.append(actor)
        if runner is not None and waking:
            self.nursery.start_soon(self._supervise_first, runner, waking)
            return
        if runner is not None:
            waking.append(runner)
        for actor in waking:
            self.nursery.start_soon(self._supervise, actor, None)

    def _renew_given_up(self, session: Session) -> None:
        """A loaded session one of whose own actors has ended (given up on: it crashed
        more often than its policy allows, or its crash could not be handled) gets a
        fresh engine, stream controller and turn runner, over the same history, as a
        restart would have kept it. Without, every later turn of the session failed on
        the actor that had ended (``ClosedResourceError``), or waited for it for ever.
        Synchronous, so that the turn starts in the same step: what the new runner
        uses that the host shares (providers, executor, persister, tools) is the old
        one's; so is the save it may still wait for. The others are stopped."""
        if self.sessions.get(session.id) is not session:
            return  # closed or evicted: its next turn reloads it, with fresh actors
        ended = [actor.name for actor in session.actors if actor.ended]
        if not ended:
            return
        old: Any = session.runner
        for actor in session.actors:
            actor.stop()
            self._actors.pop(actor, None)
        providers = [old.provider, *old.fallbacks]
        runner, actors = self._new_session_actors(
            session.id, old.agent, old.state, providers, old._repaired
        )
        controller: Any = runner.controller
        controller.seq = old.controller.seq  # session-wide and monotonic
        runner.save_replies, runner._pending, runner._answered = (
            old.save_replies,
            old._pending,
            old._answered,
        )
        idle, after_turn = _idle_check(session), _no_turn_waits(session)
        for actor in actors:
            actor.rests_when = idle
            actor.rests_after_turn = after_turn
        session.runner, session.actors = runner, actors
        get_logger("axon.host").warning(
            "session.actors-renewed", session_id=session.id, given_up=ended
        )

    def wake_actor(self, actor: Actor) -> None:
        """Start one resting actor of a session again (without yielding: its task runs
        from the next round and takes the message waiting for it in its first step). The
        engine rests as soon as a model call that ends its turn has ended
        (:attr:`actors.engine.Engine.turn_ended`); a turn that makes another call after
        all (a structured answer judged again, input steered in) wakes it so."""
        if actor.resting and not actor.inbox.closed:
            actor.resting = False
            self.nursery.start_soon(self._supervise, actor, None)

    async def _supervise_first(self, actor: Actor, others: list[Actor]) -> None:
        """Start ``others`` (their tasks run from the next round), then run ``actor``."""
        for other in others:
            self.nursery.start_soon(self._supervise, other, None)
        await self._supervise(actor, None)

    def rest(self, session: Session) -> None:
        """Let the session's actors rest, now that no turn runs or waits: each ends its
        task once it has handled what is queued, if the session is still idle then."""
        for actor in session.actors:
            if not actor.resting:
                try:
                    actor.inbox.put_nowait(REST)
                except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    pass  # full (it is busy, and rests after a later turn) or stopped

    def touch(self, session: Session) -> None:
        """Mark ``session`` used now: the last to be evicted, its idle time restarted."""
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]  # re-inserted last: the dict is in LRU order
            self.sessions[session.id] = session
            session.last_used = trio.current_time()

    def _evictable(self, session: Session) -> bool:
        """Idle and fully saved: evicting it loses nothing."""
        return (
            session.loaded and not session.busy and not session.queued and session.state.all_saved
        )

    def _evict(self, session: Session, reason: str, now: float) -> SessionEvicted:
        """Stop the session's actors and drop its history (synchronously: no other task
        can start a turn on it half-way)."""
        for actor in session.actors:
            actor.stop()
            self._actors.pop(actor, None)
        del self.sessions[session.id]
        self.bus.forget_session(session.id)
        self.persister.forget(session.id)  # (all saved: nothing of it is in flight)
        release = release_under(self.store, session.id)  # (its sub-turn fence: as closed)
        if release is not None:
            release()
        session.detach()
        return lifecycle.SessionEvicted(
            session_id=session.id, reason=reason, idle_for=now - session.last_used
        )

    def _evict_over_capacity(self, keep: Session | None = None) -> list[SessionEvicted]:
        """Evict least recently used idle sessions until at most ``max_sessions`` remain
        (busy or unsaved ones stay, so the count may stay above it for a while)."""
        limit = self.max_sessions
        if limit is None or len(self.sessions) <= limit or self.shutting_down:
            return []
        now = trio.current_time()
        # The least recently used first, as far as the excess: not a copy of them all (a
        # host at capacity, a worker's thousand, copied every session for each new one).
        going = []
        excess = len(self.sessions) - limit  # (at least 1 here)
        for session in self.sessions.values():
            if session is not keep and self._evictable(session):
                going.append(session)
                excess -= 1
                if excess <= 0:
                    break
        return [self._evict(session, "capacity", now) for session in going]

    async def _expire_idle_sessions(self) -> None:
        """Evict sessions idle for ``idle_ttl``; sleeps until the next one is due."""
        ttl = self.idle_ttl
        assert ttl is not None
        while True:
            evicted, wake = self._evict_idle(ttl)
            await self._announce(evicted)
            await trio.sleep_until(wake)

    def _evict_idle(self, ttl: float) -> tuple[list[SessionEvicted], float]:
        """Evict the sessions idle for ``ttl``; the events, and when the next one is due.
        A function of its own so that no variable of the sleeping loop holds the last
        session it looked at (an evicted session, its meta and deps, would stay in memory
        until the next wake-up)."""
        now = trio.current_time()
        wake = now + ttl
        evicted = []
        for session in list(self.sessions.values()):  # least recently used first
            due = session.last_used + ttl
            if due > now:
                wake = min(wake, due)
                break
            if self._evictable(session) and not self.shutting_down:
                evicted.append(self._evict(session, "idle", now))
        return evicted, wake

    async def _announce(self, events: list[SessionEvicted]) -> None:
        for event in events:
            try:
                self.bus.publish_nowait(event)
            except trio.WouldBlock:
                with trio.move_on_after(1):
                    await self.bus.publish(event)
            self.bus.forget_session(event.session_id)  # the routes this event cached

    def _held(self) -> tuple[int, int]:
        """The sessions in memory and the messages of their histories (a pacing host's
        bound on frozen objects grows with both: :meth:`runtime.app.gcpacing.GcPacer.
        _thaw_limit`). Read at a quiet moment of a pacing host only."""
        messages = 0
        for session in self.sessions.values():
            if session.runner is not None:
                messages += len(session.runner.snapshot.messages)
        return len(self.sessions), messages

    async def close_session(self, session: Session) -> None:
        """Stop a session's actors (its history stays in the store)."""
        for actor in session.actors:
            actor.stop()
            self._actors.pop(actor, None)
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
        self.bus.forget_session(session.id)
        # What the persister keeps of it, as for an evicted session: a turn that ended
        # waiting (approval, client tool) left its messages there, held for the host's
        # life once the session closed. A save still in flight (it outlasted the turn's
        # wait) reads the session's latest request: then once it is written.
        # An agent tool's sub-session: its store's fence of the sub-turn's saves is let
        # go once they are written (it outlived the calling turn's block, and stayed
        # among the store's last ENDED_REMEMBERED until others pushed it out).
        release = release_under(self.store, session.id)
        if session.runner is not None:
            if session.state.all_saved:
                self.persister.forget(session.id)
            else:
                self.persister.forget_when_saved(session.id, release)
                release = None
        if release is not None:
            release()

    async def delete_session(self, session_id: str) -> None:
        """Delete a session for good: its running turn cancelled (abort reason ``session
        deleted``) and waited for, the turns queued behind it withdrawn (they never run:
        their ``async with`` raises :class:`~runtime.errors.TurnWithdrawn`), its actors
        stopped and its history dropped from memory, then the session deleted from the
        store. Deleting an unknown session is not an error.

        A turn that another process runs on the same store is not this host's to cancel:
        its next save finds the session gone and is refused
        (:class:`~runtime.errors.SessionDeleted`), and that turn ends the same way,
        writing nothing. A turn started on the session afterwards starts a new
        conversation (a ``Session`` still held loads it again, empty)."""
        sid = validate_session_id(session_id)
        self.check_open()
        session = self.get_session(sid)
        if session is not None:
            await self._stop_for_delete(session)
        # the waits of its agent tools' sub-sessions for its decisions: nobody makes
        # them now (before, those sub-sessions waited, refusing everything, for good);
        # one open here idle is closed, so its next use reads the ended wait
        for sub in await end_sub_waits(self.store, sid, bus=self.bus):
            held = self.sessions.get(sub)
            if held is not None and not held.busy and not held.queued:
                await self.close_session(held)
        await self.store.delete(sid)
        self.expiry.forget(sid)

    async def _stop_for_delete(self, session: Session) -> None:
        """End what runs or waits on ``session`` (:meth:`delete_session`), then drop it
        from memory. Rounds: an input that was to join the running turn (``steer``) and
        that the cancelled turn did not take joins the queue as the turn ends."""
        for _ in range(_DELETE_ROUNDS):
            session.withdraw_queued(SESSION_DELETED)
            current = session.current
            if current is not None:
                # none of its saves may write from now on, also one in flight that would
                # find the session re-created under its id by a new message
                self.persister.refuse(session.id, current.turn_id)
                current.cancel(SESSION_DELETED)
                with trio.move_on_after(_DELETE_WAIT):
                    await current.done.wait()  # (its final save is bounded: SAVE_TIMEOUT)
                if session.current is current:
                    return  # its consumer does not read it: the store refuses its saves
            elif session.queued:
                await trio.lowlevel.checkpoint()  # a withdrawn stream leaves the queue
            else:
                break
        if session.busy or session.queued:
            return  # still in use: left in memory; the store refuses the turns' saves
        await self.close_session(session)
        self.persister.forget(session.id)
        session.detach()

    def running_turns(self) -> list[TurnStream]:
        """The turns running now, one per busy session."""
        return [s.current for s in self.sessions.values() if s.current is not None]

    def cancel_turns(self, reason: str) -> int:
        """Cancel every running turn with ``reason``; returns how many were running."""
        running = self.running_turns()
        for stream in running:
            stream.cancel(reason)
        return len(running)

    def refuse_saves(self, session_id: str, turn_id: str) -> None:
        """Refuse every save of turn ``turn_id`` of ``session_id`` from now on, writing
        nothing, as a deleted session's (:meth:`~actors.persister.Persister.refuse`): a
        sub-turn whose calling turn was taken over by another worker, whose sub-session
        that worker's run of the sub-turn saved (its aborted sub-turn would be rebased
        onto it: the sub-session's saves are not under the calling turn's fence)."""
        self.persister.refuse(session_id, turn_id)

    def accept_saves(self, session_id: str, turn_id: str) -> None:
        """Undo :meth:`refuse_saves` once that run of the turn is over: a later run of it
        here (the calling turn taken back) saves again."""
        self.persister.accept(session_id, turn_id)

    def refuses_turn(self, turn_id: str) -> bool:
        """Whether turn ``turn_id``'s saves are refused (its session was deleted while it
        ran: :meth:`delete_session`, :meth:`cancel_turn`)."""
        return self.persister.refuses(turn_id)

    def stop_named(
        self,
        session_id: str,
        *,
        message_id: str | None,
        turn_id: str | None,
        reason: str,
    ) -> tuple[str, bool] | None:
        """Stop what a stop naming a message (``message_id``: a user message's client
        id, or the answer a regenerate replaces) or a turn (``turn_id``) of
        ``session_id`` names, if this host holds it: a message waiting for the running
        turn (queued, or to be steered in) is taken out (its stream ends ``abort``), the
        running turn is cancelled. ``(turn_id, queued)`` of what it stopped, or ``None``
        (nothing here is so named: the running turn goes on). Used by ``POST
        /api/chat/{id}/stop`` and, for a stop sent to another embedded host, by the
        relay's cancel watch (:func:`actors.relays.attach_relay`)."""
        session = self.sessions.get(session_id)
        if session is None:
            return None
        waiting = session.waiting_stream(message_id=message_id, turn_id=turn_id)
        if waiting is not None and waiting.withdraw(reason):
            return waiting.turn_id, True
        current = session.current
        if current is None or (
            turn_id not in (None, current.turn_id)
            or (message_id is not None and not current.named_by(message_id))
        ):
            return None
        current.cancel(reason)
        return current.turn_id or "", False

    def hold_stop(
        self, session_id: str, *, message_id: str | None, turn_id: str | None, reason: str
    ) -> None:
        """Keep a named stop that found nothing so named here (:meth:`stop_named`
        ``None``), sent to this host (``POST /api/chat/{id}/stop``) or to another
        (forwarded over the relay): the message it names may be on its way still (its
        POST and the stop race on two connections). :attr:`held_stops` bounds them (a
        minute, 1024); the message's stream takes it when it comes
        (:meth:`stopped_before`). Not one naming the answer the session's last turn here
        continued (``Session.continued``): that turn's stop, late, which must not stop
        a regenerate of that answer (named by it too)."""
        session = self.sessions.get(session_id)
        if session is not None and message_id is not None and session.continued == message_id:
            return
        self.held_stops.hold(session_id, message_id, turn_id, reason)

    def stopped_before(self, session_id: str, message_id: str | None, turn_id: str) -> str | None:
        """A new message of ``session_id`` (user message ``message_id``, turn ``turn_id``)
        reaches this host: the reason of a stop that came before it and names it
        (:meth:`hold_stop`), used up, or ``None``."""
        held = self.held_stops
        return held.take(session_id, message_id, turn_id) if held else None

    def cancel_turn(self, turn_id: str, reason: str) -> bool:
        """Cancel the turn ``turn_id`` if this host runs it; whether it did. With reason
        ``session deleted`` (another host deleted the session: its cancel over the relay)
        the turn's saves are refused from now on, as :meth:`delete_session`'s are."""
        for stream in self.running_turns():
            if stream.turn_id == turn_id:
                if reason == SESSION_DELETED:
                    self.persister.refuse(stream.session.id, turn_id)
                stream.cancel(reason)
                return True
        return False

    async def _watch_signals(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for signum in signals:
                self.shutting_down = True
                self.cancel_turns(f"signal {signal.Signals(signum).name}")

    def _end_orphaned_streams(self) -> None:
        """Once every actor has ended: end the stream of any turn that never got its
        result to its consumer (the shutdown bound ran out while its runner was stuck,
        e.g. in a slow store call), so no consumer waits for ever on a dead host. Such a
        consumer's iteration ends and its ``result`` stays ``None``."""
        for session in list(self._handles.values()):
            stream = session.current
            if stream is not None:
                stream.end_orphaned()

    async def _shutdown(self) -> None:
        """Cancel running turns with a reason, let them save, then stop everything."""
        self.shutting_down = True
        with trio.move_on_after(15):
            running = self.running_turns()
            self.cancel_turns("host shutdown")
            for stream in running:
                await _turn_over(stream)
            for session in list(self.sessions.values()):
                await self.close_session(session)
            # The persister drains what the turns queued before it stops.
            self.persister.stop()
            await self.persister.stopped.wait()
        await self._leave_writers()
        for provider in self._model_providers.values():  # built here: closed here
            close = getattr(provider, "aclose", None)
            if close is not None:
                with trio.move_on_after(2):
                    await close()

    async def _drain_observers(self) -> None:
        """Let every observer handle the events already in its inbox, for at most
        ``drain_timeout`` seconds, then log, for each one cut short, how many it lost.

        All are stopped in one go, without yielding: each then misses the same events (those
        published from now on) and ends once its inbox is drained. Without this the
        nursery's cancellation cut an observer short with a turn's last events queued (a
        recording without its ``turn.finished``). An observer still busy when the time is
        up loses the event in hand and those queued: ``host.events-dropped`` says how many
        (nothing is logged for one that was only finishing up, e.g. flushing an exporter)."""
        observers = [actor for actor in self._observer_scopes if not actor.stopped.is_set()]
        for actor in observers:
            actor.stop()
        with trio.move_on_after(self.drain_timeout):
            for actor in observers:
                await actor.stopped.wait()
        for actor in observers:
            if actor.stopped.is_set():
                continue
            dropped = len(actor.inbox) + (actor.current_message is not None)
            if dropped:
                get_logger("axon.host").warning(
                    "host.events-dropped",
                    actor=actor.name,
                    dropped=dropped,
                    drain_timeout=self.drain_timeout,
                )
