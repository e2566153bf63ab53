"""Worker processes: run durable turns from PostgreSQL, stream them through the relay.

A deployment past one machine has stateless front ends (``serve`` with a PostgreSQL
store and a Redis relay) that *submit* turns, and any number of workers
(``python -m runtime worker``) that *run* them::

    front end --submit--> PostgreSQL (axon_turns) <--claim/lease/commit-- worker
    front end <--read---- Redis Streams (axon:turn:*) <----append------- worker

A :class:`Worker` claims turns from a :class:`~runtime.turn_queue.TurnQueue` (the one in
its store, :func:`actors.stores.turn_queue`: PostgreSQL's ``axon_turns``, never two
running turns of one session), runs each on its own :class:`~runtime.app.host.Host` (the
sessions load from and commit to the same store), appends the turn's chunks to the
relay, and marks the turn finished.

**Leases and fencing.** A claim is a lease of ``lease`` seconds, renewed every third of
it by a thread of the worker's own (:class:`LeaseKeeper`), which nothing the event loop
does can hold up. Every commit of the session while the turn runs is fenced by the
claim's ``(owner, epoch)`` (:meth:`~runtime.turn_queue.TurnQueue.fenced`): a
worker that lost its lease (it was paused, partitioned, or too slow to renew, and another
worker took the turn over) has its saves refused, and cancels its turn as soon as it
notices (a refused save or a failed renewal). Its relay writes are dropped too.

**Takeover.** A worker that dies mid-turn stops renewing; once the lease expires another
worker claims the turn with ``takeover`` set and runs it with ``resume``: the turn runner
keeps the committed steps and re-runs only the step in flight (tools see the same
``ToolContext.idempotency_key`` for a repeated call). When the dead worker streamed any of
that step, the re-run starts with a ``reset-step`` chunk (error kind ``Takeover``), as a
provider fallback does: every reader drops the dead worker's partial parts. A turn that
keeps killing its workers is marked failed after ``max_attempts`` claims and blocks
nothing else; while a worker runs a taken-over turn it claims no other, so a turn that
kills workers burns no other turn's attempts past its first.

**Waiting for a person.** A turn that suspends for approval (or a client-side tool's
output, docs/approval.md) ends here with its calls committed: the worker marks its row
``awaiting-input`` (:meth:`~runtime.turn_queue.TurnQueue.suspend`: no owner, no lease,
nothing held) and ends its relay stream with a pause. The decision, recorded from any
front end through the queue, puts the row back; any worker's next claim is then
``resumed`` and runs the continuation (``resume``: the approved calls run once, the model
goes on in the same assistant message), its chunks going on in the same relay stream.
Each worker also looks at the queue every ``poll`` seconds for waits whose deadline
passed (``Agent(approval_timeout=...)``) and records them as denied ``timed out``,
which resumes the turn the same way.

**Deleted sessions.** A session deleted while its turn runs here (``PostgresStore.delete``
ends the turn's row ``cancelled``, reason ``session deleted``, in its transaction) is no
lost lease: the turn's next save is refused, or its lease's next renewal, each saying
why. The worker logs ``worker.session_deleted`` (info), writes nothing more of the turn,
ends its relay stream with ``abort`` (``session deleted``), the end the deleting front
end gives its own viewers, so every other reader gets it too, and counts it ``cancelled``.

**Stopping.** :meth:`Worker.stop` (SIGINT/SIGTERM in the command) stops claiming and
gives the running turns ``grace`` seconds to finish; the ones still running then are cut
at their last commit (the store refuses their later saves) and released, so another
worker takes them over at once, as if this one had died, without waiting for the lease.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import trio

from actors.log_tap import WINDOW, LogTap
from actors.relays.redis_streams import RedisRelay, public_url
from actors.relays.redis_writer import RedisRelayWriter
from actors.stores import open_store, queue_scheme, require_driver, turn_queue
from runtime.actor import Actor
from runtime.actor_messages import SteeredInput
from runtime.agent import Agent
from runtime.app.commands import (
    MCP_HELP,
    AgentSource,
    add_agent_arguments,
    add_input_limit_arguments,
    add_log_level_argument,
    add_plugin_argument,
    command_collector,
    input_limits,
    make_agent,
    make_plugins,
    non_negative,
    positive,
)
from runtime.app.expiry import deadlines, expire_session
from runtime.app.host import Host
from runtime.app.nested import delete_scratch
from runtime.app.unsaved import told_end, unsaved_error
from runtime.approval import AWAITING_INPUT, Decision, Recorded
from runtime.clocks import AnchoredClock
from runtime.errors import (
    SESSION_DELETED,
    ConfigurationError,
    InvalidHistory,
    LeaseLost,
    RateLimitUnavailable,
    RegenerateOutdated,
    RelayUnavailable,
    StoreError,
    describe_exception,
)
from runtime.history import off_loop_limiter
from runtime.log_repeats import RepeatedWarning
from runtime.logging import configure_logging, get_logger
from runtime.media import InputLimits
from runtime.messages import UserMessage
from runtime.output import Abort, Error, ErrorInfo, Finish, ResetStep, Steered, StepStart
from runtime.redact import redact, redact_url
from runtime.store import SessionRecord, Store
from runtime.tools import AGENT_DEPTH_META, LISTING_UNITS, Tool, agent_depth
from runtime.turn_queue import (
    WAITING,
    Claim,
    ClientToolSpec,
    LeaseRenewer,
    NextClaim,
    NextClaimed,
    QueuedTurn,
    Renewal,
    SteerWatch,
    TurnQueue,
    TurnStatus,
)

DEFAULT_CONCURRENCY = 4
DEFAULT_LEASE = 10.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_GRACE = 10.0
DEFAULT_MAX_SESSIONS = 1000
"""Sessions a worker's host keeps in memory at most (``--max-sessions``), the least
recently used idle ones freed past it (reloaded from the store on their next turn)."""
BUSY_WAIT = 30.0
"""Seconds a claimed turn waits for this worker's previous turn of its session to end."""
DEFAULT_POLL = 1.0
"""Seconds between claim attempts while nothing is notified (an expired lease notifies
nobody: this is how soon a dead worker's turn is noticed after its lease ran out)."""
HEALTH_INTERVAL = 5.0
"""Seconds between two touches of the worker's health file (``--health-file``): each
after a read of PostgreSQL's clock answered, the ``LISTEN`` connection answered and the
claim loop was seen going round (:meth:`Worker._beat`)."""
STALL_INTERVALS = 3
"""Health intervals (beyond one ``poll``) the claim loop may spend in one step, a claim
or a wait, before the worker's health file goes stale (:meth:`Worker._claim_stalled`)."""


def log() -> Any:
    """The worker's logger, looked up at each (rare) use: the ``worker`` command
    configures logging after this module is imported, and a logger bound at import would
    keep structlog's unconfigured defaults."""
    return get_logger("axon.worker")


def default_owner() -> str:
    """``host:pid:random``: unique per worker run, readable in ``axon_turns.owner``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


TAKEOVER = "Takeover"
"""The error kind of the ``reset-step`` a takeover sends: the worker that streamed the
step stopped (died, or lost its lease), and another runs the step again."""
TAKEOVER_MESSAGE = "the worker running this step stopped; another worker runs it again"


@attrs.define(kw_only=True, slots=True, eq=False)
class _Running:
    """A turn this worker runs: its claim, its stream, and whether its lease is gone."""

    claim: Claim
    stream: Any = None
    lost: bool = False
    suspended: bool = False
    """The save of the step that made the turn wait also suspended its row (committed)."""
    finished: bool = False
    """The save of the turn's last step also finished its row ``done`` (committed)."""
    next: NextClaimed | None = None
    """The turn that save claimed too, for this turn's slot (:class:`NextClaim`)."""
    asked_at: int = 0
    """The worker's waits when its last save was sent (:meth:`Worker._asks_next`)."""
    cancelled: str | None = None
    """Why the turn was cancelled before its stream existed (applied once it does)."""
    deleted: bool = False
    """Its session was deleted while it ran (:meth:`session_deleted`): also :attr:`lost`
    (nothing more of it is written), but its stream ends with ``abort``."""
    last_out: Any = None
    """The last chunk written to the relay (:meth:`Worker._relay`)."""
    end: Any = None
    """The turn's end chunk (``finish``, ``error``, ``abort``), held from the relay
    until its result says it was saved (:meth:`Worker._stream_turn`)."""
    steered: list[str] = attrs.Factory(list)
    """The ids of the steering messages the turn took (:meth:`Worker._take_steering`):
    a cancel naming one stops the turn, whose rest is that message's answer."""
    writer_closed: bool = False
    """Its relay writer was closed (flushed) before the turn was given back
    (:meth:`Worker._give_back`): not to be closed again."""

    def claimed_next(self, claimed: NextClaimed) -> None:
        self.next = claimed

    def suspend(self) -> None:
        self.suspended = True

    def finish(self) -> None:
        self.finished = True

    def cancel(self, reason: str) -> None:
        """Cancel the turn; before its stream exists (its session still being opened),
        kept for the stream: the relay's cancel request is said once, and a renewal
        repeats it only a third of a lease later, the turn running meanwhile."""
        if self.stream is not None:
            self.stream.cancel(reason)
        elif self.cancelled is None:
            self.cancelled = reason

    def lose(self, why: str) -> None:
        """The lease is gone: write nothing more, stop the turn. Not once the turn
        suspended or finished (its step's commit let the row go: a renewal or a later
        save of the turn then finds it waiting or done, which is no loss; the turn ends
        as committed)."""
        if not self.lost and not self.suspended and not self.finished:
            self.lost = True
            log().warning(
                "worker.lease_lost",
                turn_id=self.claim.turn.turn_id,
                epoch=self.claim.epoch,
                why=why,
            )
            self.cancel("lease lost")

    def session_deleted(self, why: str) -> None:
        """The turn's session was deleted while it ran (``PostgresStore.delete`` ended its
        row ``cancelled``, reason ``session deleted``): no lease was lost, no other worker
        runs it, and none will. Nothing more of it is written (every save is refused)
        and the turn stops; its relay stream ends with the ``abort`` (``session deleted``)
        the deleting front end shows its own viewers, so every other reader (another
        front end's, one resuming from ``Last-Event-ID``) sees it end too. Not once the
        turn suspended or finished (its commit came before the delete), nor once lost."""
        if not self.lost and not self.suspended and not self.finished:
            self.lost = self.deleted = True
            turn = self.claim.turn
            log().info(
                "worker.session_deleted",
                turn_id=turn.turn_id,
                session_id=turn.session_id,
                epoch=self.claim.epoch,
                why=why,
            )
            self.cancel(SESSION_DELETED)


@attrs.define(kw_only=True, slots=True, eq=False)
class _Lease:
    """A claim whose lease the :class:`LeaseKeeper` renews, and the turn to tell."""

    turn_id: str
    owner: str
    epoch: int
    entry: _Running | None = None
    """Set once the turn runs: the claim is held from the moment it is made, before its
    input is decoded (which may take longer than the lease)."""
    cancelled: str | None = None
    """Why the turn was cancelled while held and not running yet (a turn a last save
    claimed, not started): told to its entry once it runs."""
    renewed: float = attrs.field(factory=time.monotonic)
    """When the last renewal that held the claim began (``time.monotonic``, which goes
    on while the process is stopped), or the claim was made."""


class LeaseKeeper:
    """Renews the leases of a worker's claimed turns from a thread of its own, on a
    connection of its own.

    A renewal task on the event loop is only as punctual as the loop: a turn whose input
    takes seconds to decode, store or send (hundreds of thousands of parts) blocked it
    past the lease, another claim took the turn over, and the turn ran twice. This
    thread needs only the GIL, which Python hands it every few milliseconds whatever the
    loop runs. A claim is held from the moment the queue grants it (``on_claimed``),
    before its input is decoded. What a renewal learns goes back to the loop
    (``run_sync_soon``): a refused renewal loses the turn (:meth:`_Running.lose`), a
    requested cancellation cancels it. A renewal that fails (the server restarting) is
    retried soon on a new connection; if the lease runs out meanwhile, the fence refuses
    the worker's next commit.
    """

    RETRY = 0.25
    """Seconds before a failed renewal is tried again."""

    def __init__(self, queue: TurnQueue, interval: float) -> None:
        self.queue = queue
        self.interval = interval
        self._held: dict[str, _Lease] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._run, name="axon-leases", daemon=True)

    def hold(self, turn_id: str, owner: str, epoch: int) -> None:
        """Renew this claim's lease from now on (the queue's ``on_claimed``)."""
        with self._lock:
            self._held[turn_id] = _Lease(turn_id=turn_id, owner=owner, epoch=epoch)

    def attach(self, entry: _Running) -> None:
        """Tell ``entry`` what its renewals learn (it is held already, or is held now),
        and a cancellation asked for while it was held and not running yet."""
        claim = entry.claim
        with self._lock:
            lease = self._held.get(claim.turn.turn_id)
            if lease is None or lease.epoch != claim.epoch:
                lease = self._held[claim.turn.turn_id] = _Lease(
                    turn_id=claim.turn.turn_id, owner=claim.owner, epoch=claim.epoch
                )
            lease.entry = entry
            cancelled = lease.cancelled
        if cancelled is not None:
            entry.cancel(cancelled)

    def cancel_held(self, turn_id: str, reason: str) -> None:
        """A cancellation for a turn held and not running yet (none running here has that
        id): kept for it, told to its entry once it runs (:meth:`attach`)."""
        with self._lock:
            lease = self._held.get(turn_id)
            if lease is not None and lease.entry is None and lease.cancelled is None:
                lease.cancelled = reason

    def release(self, turn_id: str, epoch: int) -> None:
        """Stop renewing that claim (before the turn is finished or released, so that the
        refusal of a renewal that follows is not taken for a lost lease)."""
        with self._lock:
            lease = self._held.get(turn_id)
            if lease is not None and lease.epoch == epoch:
                del self._held[turn_id]

    def start(self) -> None:
        self._thread.start()

    async def aclose(self) -> None:
        """Stop the thread and wait for it (at most one renewal's time)."""
        self._stopping.set()
        if self._thread.is_alive():
            await trio.to_thread.run_sync(self._thread.join)

    def _run(self) -> None:
        renewer: LeaseRenewer | None = None
        delay: float | None = self.interval
        try:
            while delay is not None and not self._stopping.wait(delay):
                renewer, delay = self._round(renewer)
        finally:
            if renewer is not None:
                renewer.close()

    def lapsing(self, turn_id: str) -> bool:
        """Whether the turn's lease may have lapsed: no renewal held it for two renewal
        intervals (the process was stopped, or its renewals failed), so another worker
        may have taken the turn over."""
        lease = self._held.get(turn_id)
        return lease is None or time.monotonic() - lease.renewed > 2 * self.interval

    def _round(self, renewer: LeaseRenewer | None) -> tuple[LeaseRenewer | None, float | None]:
        """Renew every lease held now; the renewer, and the delay before the next round
        (``None``: the run is over). A method of its own: what its locals held of the
        turns (their entries, whose streams hold their sessions and histories) goes when
        it returns; kept in :meth:`_run`'s frame, the last lease renewed kept its turn
        alive until the next lease was, for ever on an idle worker."""
        delay = self.interval
        with self._lock:
            leases = list(self._held.values())
        for lease in leases:
            if self._stopping.is_set():
                break
            if lease.entry is not None and lease.entry.lost:
                continue
            try:
                if renewer is None:
                    renewer = self.queue.open_renewer()
                began = time.monotonic()
                renewal = renewer.renew(lease.turn_id, lease.owner, lease.epoch)
                if renewal.held:
                    lease.renewed = began
            except Exception as exc:
                log().warning("worker.renew_failed", turn_id=lease.turn_id, error=redact(str(exc)))
                if renewer is not None:
                    renewer.close()
                renewer = None
                delay = self.RETRY
                continue
            if not renewal.held or renewal.cancel_requested:
                try:
                    self._token.run_sync_soon(self._apply, lease, renewal)
                except trio.RunFinishedError:
                    return renewer, None
        return renewer, delay

    def _apply(self, lease: _Lease, renewal: Renewal) -> None:
        """On the event loop: act on a renewal that was refused or asks to cancel."""
        with self._lock:
            if self._held.get(lease.turn_id) is not lease:
                return  # released meanwhile: the turn ended here, the refusal says so
            if not renewal.held:
                del self._held[lease.turn_id]
            entry = lease.entry
        if entry is None:  # not running yet: its first fenced commit will be refused,
            if renewal.held:  # or it is cancelled as it starts
                self.cancel_held(lease.turn_id, renewal.cancel_reason or "cancelled")
            return
        if renewal.let_go:
            # The turn's own commit suspended or finished its row, and the renewal ran
            # before that commit's answer came back here (which says so to the entry):
            # no loss. Taken for one, the turn's end was not relayed (its stream left
            # without its finish, a waiting turn's continuation never shown).
            return
        if renewal.deleted:
            entry.session_deleted("renewal refused")
        elif not renewal.held:
            entry.lose("renewal refused")
        else:
            entry.cancel(renewal.cancel_reason or "cancelled")


class Worker:
    """Claims durable turns and runs them; see the module docstring.

    ``store`` is an open store that holds a turn queue (PostgreSQL's: the worker does not
    close it; a store without one is a :class:`~runtime.errors.ConfigurationError`); ``relay``
    a :class:`runtime.relay.Relay` or ``None`` (front ends then show a turn once it is
    committed). Run with ``await nursery.start(worker.run)``; :attr:`done` counts the turns
    it finished, by status.
    """

    def __init__(
        self,
        *,
        store: Store,
        relay: Any = None,
        agent: AgentSource,
        owner: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float = DEFAULT_LEASE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        grace: float = DEFAULT_GRACE,
        poll: float = DEFAULT_POLL,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        input_limits: InputLimits | None = None,
        plugins: Sequence[Actor] = (),
        gc_pacing: bool = False,
        health_file: str | os.PathLike[str] | None = None,
        health_interval: float = HEALTH_INTERVAL,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, not {concurrency!r}")
        if not lease > 0:
            raise ConfigurationError(f"lease must be a positive number of seconds, not {lease!r}")
        self.store = store
        self.relay = relay
        self.agent = agent
        self.owner = owner or default_owner()
        self.concurrency = concurrency
        self.lease = lease
        self.grace = grace
        self.poll = poll
        self.max_sessions = max_sessions
        self.input_limits = input_limits
        """The parts a turn's input may have (its host's); a turn with more fails."""
        self.plugins = tuple(plugins)
        """Actors started on the worker's host beside its own (``--plugin``: tracing,
        recording), seeing the bus events of every turn the worker runs."""
        self.gc_pacing = gc_pacing
        """Its host paces the process's garbage collections (``Host.open(gc_pacing=True)``,
        :mod:`runtime.app.gcpacing`; the command's ``--gc-pacing``). A worker claiming a
        session of 600,000 messages otherwise has CPython's full collections walk them,
        0.2-0.9 s each, several a turn; paced, a short turn costs 6-7% more CPU
        (benchmarks/journal/approval.md, branch ``whist``)."""
        self.health_file = health_file
        """A file whose modification time the worker sets every ``health_interval``
        seconds while its event loop runs and PostgreSQL answers (:meth:`_beat`), for an
        orchestrator's liveness probe; removed when the worker stops (``None``: none)."""
        self.health_interval = health_interval
        self.max_attempts = max_attempts
        """Claims a turn gets (the queue's bound): the last one's unsaved end fails it
        (:meth:`_give_back`)."""
        self.queue: TurnQueue = turn_queue(store, lease=lease, max_attempts=max_attempts)
        self.running: dict[str, _Running] = {}
        """The turns running now, by turn id."""
        self.done: dict[str, int] = {}
        """Turns finished by this worker, by status (``done``, ``failed``, ``cancelled``,
        ``awaiting-input``: suspended for a person, ``lost``: the lease went to another
        worker, or the worker gave the turn back, its final save not confirmed; a turn
        whose session was deleted while it ran is ``cancelled``)."""
        self.host: Host | None = None
        self._leases: LeaseKeeper | None = None
        self._clock: AnchoredClock | None = None
        """The queue's clock, which the host's wait deadlines run on (once running)."""
        self._stopping = trio.Event()
        self._turn_ended = trio.Event()
        self._loop_at = 0.0
        """When the claim loop last made progress (``trio.current_time()``): a claim
        answered; moved on by the time it then waited for this worker's own turns
        (:meth:`_claim_stalled`)."""
        self._claim_failed = RepeatedWarning("axon.worker", "worker.claim_failed")
        """Claims that failed (the store down): a line at once, then one with a count
        each :data:`~runtime.log_repeats.REPEAT_INTERVAL`, not one a poll."""
        self._loop_parked = False
        """The claim loop waits for this worker's own turns (a free slot, a takeover's
        end): no stall, however long (the turns' leases say whether they progress)."""
        self._waits = 0
        """The claim loop's waits on the queue that returned (each takes every ``NOTIFY``
        received so far off the connection)."""
        self._found_none_at: int | None = None
        """:attr:`_waits` when the last save that found nothing to claim
        (:attr:`NextClaim.found_none`) was sent: while no wait returned since, the queue
        held nothing claimable at that save's commit and what was submitted after it is
        announced on the ``LISTEN`` connection, so the loop waits without a claim."""

    # -- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running turns get ``grace`` seconds, then are cut and released."""
        self._stopping.set()

    async def run(self, *, task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim and run turns until :meth:`stop` (then drain) or cancellation (then the
        running turns are cut at their last commit, as if the process had died)."""
        async with Host.open(
            store=self.store,
            max_sessions=self.max_sessions,
            input_limits=self.input_limits,
            log_tap=False,
            gc_pacing=self.gc_pacing,
            expects_other_writers=True,  # a session's turns run on any worker: no registry
        ) as host:
            # Wait deadlines are set and expired by the queue's clock, not this machine's
            # (runtime/clocks.py): workers' wall clocks differ.
            clock = self._clock = AnchoredClock(self.queue.now)
            await self._sync_clock()
            host.clock = clock
            # The worker's loop waits on PostgreSQL and Redis between a turn's events, so
            # a tap that wrote each as it came took a step and a write for nearly every
            # line: it rests between writes instead (issue 24 goal 3).
            await host.start_actor(LogTap(window=WINDOW))
            shared = getattr(self.relay, "rate_limits", None)
            if shared is not None:  # rate limits kept by all the workers together
                host.rate_limits = shared()
                sync = getattr(host.rate_limits, "sync_clock", None)
                if sync is not None:  # Redis's clock, before the first call counts
                    try:
                        await sync()
                    except RateLimitUnavailable as exc:  # each call tries again
                        log().warning("worker.clock_sync_failed", error=redact(str(exc)))
            self.host = host
            for plugin in self.plugins:
                await host.start_actor(plugin)
            self._leases = LeaseKeeper(self.queue, self.lease / 3)
            self._leases.start()
            self._loop_at = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    watch = getattr(self.relay, "watch_cancels", None)
                    if watch is not None:
                        await nursery.start(watch, self._on_relay_cancel)
                    nursery.start_soon(self._expire_waits)
                    if self.health_file is not None:
                        nursery.start_soon(self._beat, self.health_file)
                    async with trio.open_nursery() as turn_nursery:
                        task_status.started(self)
                        log().info("worker.started", owner=self.owner, concurrency=self.concurrency)
                        await self._claim_until_stopped(turn_nursery)
                        self._loop_parked = True  # stopping: it claims no more
                        await self._drain(turn_nursery)
                    nursery.cancel_scope.cancel()
            finally:
                if self.health_file is not None:
                    _remove(self.health_file)  # a stopped worker is not alive
                with trio.CancelScope(shield=True):
                    await self._leases.aclose()
                await self._close()
                self.host = None

    async def _beat(self, path: str | os.PathLike[str]) -> None:
        """Every :attr:`health_interval` seconds, when the worker can take work, touch
        ``path``: PostgreSQL's clock read (one round trip, the queue's own), the queue's
        ``LISTEN`` connection answered (:meth:`TurnQueue.check_listening`: a worker that
        no longer hears ``NOTIFY`` takes a new turn only every ``poll`` seconds), and
        the claim loop went round (:meth:`_claim_stalled`: not stuck in a claim, on a
        lock or a bug). The file goes stale when the event loop is stuck (nothing here
        runs), when PostgreSQL is gone (the read fails after the store's retries) or
        paused (the read never returns), when the ``LISTEN`` connection is gone and
        cannot be opened again, or does not answer, and when the claim loop is stuck: a
        probe that finds it older than a few intervals finds a worker that cannot claim.
        What failed is logged when the beat stops and when it comes back, not at each
        beat."""
        failing: str | None = None
        while True:
            why = await self._unhealthy()
            if why is None:
                try:
                    _touch(path)
                except OSError as exc:
                    why = redact(str(exc))
            if why is not None and failing is None:
                log().warning("worker.health_failing", error=why)
            elif why is None and failing is not None:
                log().info("worker.health_back")
            failing = why
            await trio.sleep(self.health_interval)

    async def _unhealthy(self) -> str | None:
        """Why the worker cannot take work now (``None``: it can); see :meth:`_beat`."""
        try:
            await self.queue.now()
        except StoreError as exc:
            return redact(str(exc))
        # A check that finds no answer within this bound drops the connection (the
        # next wait opens another); a wait in progress ends within ``poll`` first.
        with trio.move_on_after(self.poll + self.health_interval):
            try:
                if not await self.queue.check_listening():
                    return "the LISTEN connection is gone and could not be opened again"
            except StoreError as exc:
                return redact(str(exc))
            if self._claim_stalled():
                return "the claim loop made no progress"
            return None
        return "the LISTEN connection did not answer"

    def _claim_stalled(self) -> bool:
        """Whether the claim loop is stuck: it is not waiting for the worker's own turns
        (a free slot, a takeover's end), and no claim was answered for ``poll`` and
        :data:`STALL_INTERVALS` health intervals, the time it waited for its own turns
        not counted (an idle loop's step is a wait of ``poll`` seconds and a claim: a
        claim waiting on a lock, claims that keep failing, a wait that never returns, a
        task that waits on nothing that will come)."""
        if self._loop_parked:
            return False
        bound = self.poll + STALL_INTERVALS * self.health_interval
        return trio.current_time() - self._loop_at > bound

    async def _claim_until_stopped(self, nursery: trio.Nursery) -> None:
        slots = trio.Semaphore(self.concurrency)
        leases = self._leases
        assert leases is not None
        async with trio.open_nursery() as waiter:
            waiter.start_soon(self._cancel_on_stop, waiter.cancel_scope)
            while True:
                # Waiting on this worker's own turns: the time it takes is no stall.
                self._loop_parked, parked_at = True, trio.current_time()
                try:
                    await _take_slot(slots)
                    while any(entry.claim.takeover for entry in self.running.values()):
                        # A taken-over turn may be what killed its last worker: while it
                        # runs here, claim nothing else, so that if it kills this worker
                        # too it takes no other turn's attempt down with it.
                        await self._a_turn_ends()
                finally:
                    self._loop_parked = False
                    self._loop_at += trio.current_time() - parked_at
                if self._found_none_at is not None:
                    found_none_at, self._found_none_at = self._found_none_at, None
                    if found_none_at == self._waits:
                        # The slot's last save claimed for it and found nothing, and no
                        # wait took a NOTIFY since it was sent: a claim now would find
                        # nothing more (a round trip a turn, on a worker that is not
                        # saturated); what came after it wakes the wait at once.
                        slots.release()
                        await self._wait()
                        continue
                try:
                    claim = await self._claim(leases)
                except StoreError as exc:
                    slots.release()
                    self._claim_failed.warning(error=redact(str(exc)))
                    await trio.sleep(self.poll)
                    continue
                self._loop_at = trio.current_time()  # a claim answered
                self._claim_failed.clear()
                if claim is None:
                    slots.release()
                    await self._wait()
                    continue
                if isinstance(claim, NextClaimed):  # read in the turn's task: claim on
                    nursery.start_soon(self._run_unread, claim, slots)
                    continue
                entry = self.running[claim.turn.turn_id] = _Running(claim=claim)
                nursery.start_soon(self._run_claim, entry, slots)

    async def _run_unread(self, claimed: NextClaimed, slots: trio.Semaphore) -> None:
        """Read a turn the claim loop claimed and did not wait to read (its input, its
        session: seconds for a long one), then run it as :meth:`_run_claim` runs any;
        given back if the worker began stopping meanwhile (:meth:`_start_next`)."""
        try:
            entry = await self._start_next(claimed)
        except BaseException:
            slots.release()
            raise
        if entry is None:
            slots.release()
            return
        await self._run_claim(entry, slots)

    async def _claim(self, leases: LeaseKeeper) -> Claim | NextClaimed | None:
        """The next claim, its lease renewed from the moment it is made; a turn whose
        reading is left to its task (:meth:`TurnQueue.claim_unread`) as a
        :class:`NextClaimed`."""
        claimed: list[tuple[str, int]] = []

        def on_claimed(turn_id: str, owner: str, epoch: int) -> None:
            claimed.append((turn_id, epoch))
            leases.hold(turn_id, owner, epoch)

        try:
            return await self.queue.claim_unread(
                self.owner, on_claimed=on_claimed, load=self._not_open
            )
        except BaseException:  # after the claim, maybe: its input could not be read
            for turn_id, epoch in claimed:
                leases.release(turn_id, epoch)
            raise

    async def _wait(self) -> None:
        """Wait for the queue's next ``NOTIFY`` (at most :attr:`poll` seconds)."""
        try:
            await self.queue.wait(self.poll)
        finally:
            self._waits += 1

    def _asks_next(self, entry: _Running) -> bool:
        """:meth:`_wants_next` for ``entry``'s last save, which is sent right after: the
        waits so far are noted for :meth:`_found_none`."""
        entry.asked_at = self._waits
        return self._wants_next(entry)

    def _found_none(self, entry: _Running) -> None:
        """``entry``'s last save claimed for its slot and found nothing claimable."""
        self._found_none_at = entry.asked_at

    def _not_open(self, session_id: str) -> bool:
        """Whether a claimed turn's session is not in this worker's memory, so the claim
        reads it for the turn (in the claim's thread: a dictionary look-up). One in
        memory is not read: the turn asks the store for its version instead, which
        costs nothing whatever the history's length."""
        host = self.host
        return host is not None and session_id not in host.sessions

    async def _a_turn_ends(self) -> None:
        """Wait until one of the running turns ends."""
        self._turn_ended = trio.Event()
        await self._turn_ended.wait()

    async def _cancel_on_stop(self, scope: trio.CancelScope) -> None:
        await self._stopping.wait()
        scope.cancel()

    async def _drain(self, nursery: trio.Nursery) -> None:
        """After :meth:`stop`: wait ``grace`` seconds for the running turns, then cut the
        rest at their last commit and release them to other workers."""
        with trio.move_on_after(self.grace):
            while self.running:
                await self._a_turn_ends()
        if self.running:
            self.queue.close_fences()
            for entry in list(self.running.values()):
                entry.lost = True  # what the turn does from here is not this worker's
                entry.cancel("worker stopping")
            with trio.CancelScope(shield=True):
                for entry in list(self.running.values()):
                    try:
                        await self.queue.release(entry.claim)
                    except StoreError as exc:
                        log().warning("worker.release_failed", error=redact(str(exc)))
            nursery.cancel_scope.deadline = trio.current_time() + 5.0

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            try:
                await self.queue.aclose()
            except Exception as exc:  # closing: report, do not mask the real ending
                log().warning("worker.close_failed", error=redact(str(exc)))

    async def _expire_waits(self) -> None:
        """Every ``poll`` seconds: the waiting turns whose deadline passed (as of the
        host's clock: the queue's, :class:`~runtime.clocks.AnchoredClock`), each expired
        here (one worker per turn: the queue holds it back from the others meanwhile)."""
        while True:
            await trio.sleep(self.poll)
            host = self.host
            if host is None or self._stopping.is_set():
                return
            if self._clock is not None and self._clock.due():
                await self._sync_clock()
            try:
                due = await self.queue.take_expired(host.clock())
            except StoreError as exc:
                log().warning("worker.expiry_failed", error=redact(str(exc)))
                continue
            for turn in due:
                await self._expire(host, turn)

    async def _sync_clock(self) -> None:
        """Read the queue's clock again; a failure keeps the reading held (logged)."""
        if self._clock is None:
            return
        try:
            await self._clock.sync()
        except StoreError as exc:
            log().warning("worker.clock_sync_failed", error=redact(str(exc)))

    async def _expire(self, host: Host, turn: TurnStatus) -> None:
        """Record the expired calls of a waiting turn as denied ``timed out`` through the
        queue: the one that decides the last call puts the turn back for any worker to
        resume; otherwise the turn's next deadline goes back on its row."""
        session_id = turn.session_id

        async def record(key: str, decision: Decision, tools: Mapping[str, Any]) -> Recorded:
            decided = await self.queue.decide(session_id, key, decision, tools, expiry=True)
            return decided.recorded

        try:
            agent = self.agent_for(session_id)
            if await expire_session(host, session_id, agent, record=record):
                log().info("worker.wait_expired", turn_id=turn.turn_id, session_id=session_id)
                return
            stored = await host.store.load(session_id)
            due = deadlines(stored.messages) if stored is not None else {}
            await self.queue.set_expiry(turn.turn_id, min(due.values(), default=None))
        except Exception as exc:  # a store failure: the queue offers it again later
            log().warning("worker.expiry_failed", turn_id=turn.turn_id, error=redact(str(exc)))

    def _on_relay_cancel(self, turn_id: str, reason: str) -> None:
        entry = self.running.get(turn_id)
        if entry is not None:
            entry.cancel(reason)
        elif self._leases is not None:  # claimed (by the loop or a last save), not started yet
            self._leases.cancel_held(turn_id, reason)
        if entry is None:  # a steering message a running turn took: stop that turn
            for running in self.running.values():
                if turn_id in running.steered:
                    running.cancel(reason)

    # -- one turn ----------------------------------------------------------------------------

    def agent_for(self, session_id: str) -> Agent:
        """The agent of ``session_id``: the one its session in memory runs (the host keeps
        one agent per open session), else a new one from the factory. Nothing is kept
        here: a worker sees unboundedly many sessions over its life, its host only keeps
        ``max_sessions`` of them."""
        if isinstance(self.agent, Agent):
            return self.agent
        existing = self.host.get_session(session_id) if self.host is not None else None
        return existing.agent if existing is not None else self.agent(session_id)

    async def _run_claim(self, entry: _Running, slots: trio.Semaphore) -> None:
        """Run the claimed turn, then the ones its last saves claimed for its slot (each
        started once the one before has ended here), then free the slot."""
        leases = self._leases
        assert leases is not None
        try:
            running: _Running | None = entry
            while running is not None:
                try:
                    claimed = await self._run_one(running)
                except BaseException:
                    if running.next is not None:  # not started here: its lease lapses
                        leases.release(running.next.turn_id, running.next.epoch)
                    raise
                running = None if claimed is None else await self._start_next(claimed)
        finally:
            slots.release()

    async def _start_next(self, claimed: NextClaimed) -> _Running | None:
        """The turn a last save claimed (:class:`NextClaim`), read and entered as running;
        ``None`` if it is not run here: a worker that began stopping since, or that runs
        a taken-over turn now, gives it back at once (the attempt too, as a release on
        stopping does); one whose input or session cannot be read lets its lease lapse,
        as a failed claim does (another worker then takes it over)."""
        leases = self._leases
        assert leases is not None
        try:
            claim = await claimed.take()
        except StoreError as exc:
            leases.release(claimed.turn_id, claimed.epoch)
            self._claim_failed.warning(error=redact(str(exc)))
            return None
        except BaseException:
            leases.release(claimed.turn_id, claimed.epoch)
            raise
        if not self._wants_next(None):
            # Stopping since, or beside a taken-over turn the claim loop took meanwhile.
            leases.release(claimed.turn_id, claimed.epoch)
            with trio.CancelScope(shield=True):
                try:
                    await self.queue.release(claim)
                except StoreError as exc:
                    log().warning("worker.release_failed", error=redact(str(exc)))
            return None
        entry = self.running[claim.turn.turn_id] = _Running(claim=claim)
        return entry

    def _wants_next(self, entry: _Running | None) -> bool:
        """Whether ``entry``'s last save may claim the next turn for its slot (``None``:
        whether a turn so claimed may start now): not while the worker is stopping, nor
        while another turn it runs is a takeover (the claim loop's rule: it claims
        nothing beside one). A loop, not ``any`` of a generator: asked twice a turn over
        the turns running (a resume each, issue 24 goal 3)."""
        if self._stopping.is_set():
            return False
        for other in self.running.values():
            if other.claim.takeover and other is not entry:
                return False
        return True

    async def _run_one(self, entry: _Running) -> NextClaimed | None:
        """Run one claimed turn to its end (its lease and entry let go); the turn its last
        save claimed for the slot, if it did."""
        turn = entry.claim.turn
        leases = self._leases
        assert leases is not None
        leases.attach(entry)
        try:
            status = await self._run_turn(entry)
        except Exception as exc:  # the turn could not even start: fail it, keep working
            leases.release(turn.turn_id, entry.claim.epoch)
            message = describe_exception(exc)
            log().error("worker.turn_crashed", turn_id=turn.turn_id, error=message[:500])
            status = "failed"
            if not entry.lost:
                with trio.CancelScope(shield=True):
                    try:
                        await self.queue.finish(
                            entry.claim, status="failed", finish_reason="error", error=message
                        )
                    except StoreError as err:
                        log().warning(
                            "worker.finish_failed", turn_id=turn.turn_id, error=redact(str(err))
                        )
        finally:
            leases.release(turn.turn_id, entry.claim.epoch)
            if self.running.get(turn.turn_id) is entry:  # not a later claim of the same turn
                del self.running[turn.turn_id]
            # The turn's stream holds the entry (its confirm callback, through the stream's
            # ``TurnCancel``) and the entry the stream: a reference cycle, so the turn's ~32
            # objects (stream, inbox, claim, result, ...) outlived it until the collector
            # found them, each turn growing the young generation that triggers collections
            # (issue 24 goal 3). Broken here, they go when the turn's task lets go of them.
            entry.stream = None
            self._turn_ended.set()
        self.done[status] = self.done.get(status, 0) + 1
        return entry.next

    async def _run_turn(self, entry: _Running) -> str:
        """Run the claimed turn to its end: its session ready, its stream steered from the
        queue and relayed, its row finished; the status it ended with (``"lost"``: the
        turn is no longer this worker's)."""
        claim = entry.claim
        turn = claim.turn
        host = self.host
        assert host is not None
        was_open = host.sessions.get(turn.session_id) is not None
        session, loaded = await self._claimed_session(host, claim)
        outdated = _outdated_regenerate(claim, session.messages if was_open else None, loaded)
        if outdated is not None:
            return await self._refuse(entry, outdated)
        steered = entry.steered  # the ids of the steering messages the turn took
        # A takeover may find steering its turn's earlier worker never took: read once.
        watch = SteerWatch(taken=-1 if claim.takeover else 0)
        tools = await _client_tools(turn.options.tools)
        stream = entry.stream = self._turn_stream(claim, session, was_open, loaded, tools)
        if entry.cancelled is not None and not turn.cancel_requested:
            stream.cancel(entry.cancelled)  # asked for while its session was opened
        stream.steer_from(partial(self._take_steering, claim, steered, watch))
        stream.confirm_with(partial(self._confirm_claim, entry))
        # A turn's first claim says nothing its ``turn.started`` line does not (the tap's:
        # the same ids): debug. A takeover, a continuation or a retry says how at info.
        first = claim.epoch == 1 and not (claim.takeover or claim.resumed)
        (log().debug if first else log().info)(
            "worker.turn",
            turn_id=turn.turn_id,
            session_id=turn.session_id,
            epoch=claim.epoch,
            takeover=claim.takeover,
            resumed=claim.resumed,
        )
        writer = self._turn_writer(claim)
        status = await self._stream_turn(entry, stream, writer, steered, watch)
        if status == "lost" or entry.deleted:
            await self._drop_lost(entry, session)
        elif turn.options.ephemeral:
            await self._forget(session, len(turn.options.history or ()))
        return status

    async def _refuse(self, entry: _Running, exc: Exception) -> str:
        """Fail the claimed turn before it starts (nothing run, cut or stored): its
        stream's readers are told why by the front end, from the row's error."""
        claim = entry.claim
        message = describe_exception(exc)
        log().info("worker.turn_refused", turn_id=claim.turn.turn_id, error=message[:500])
        with trio.CancelScope(shield=True):
            try:
                if not await self.queue.finish(
                    claim, status="failed", finish_reason="error", error=message
                ):
                    return "lost"
            except LeaseLost:
                return "lost"
        return "failed"

    async def _drop_lost(self, entry: _Running, session: Any) -> None:
        """The turn went to another worker (its lease lapsed, a save was refused): its
        history here may hold the turn's steps this worker could not save. A later turn
        of the session here would carry them on as its own, rebased after what the
        takeover stored (before: a copy of the lost turn written over the rows of the
        session's later turns). Dropped, so the next claim loads the session as stored;
        unless another claim of the session already holds it (it reloads it itself)."""
        if session.current is not None or any(
            other is not entry and other.claim.turn.session_id == session.id
            for other in self.running.values()
        ):
            return
        with trio.CancelScope(shield=True):
            await session.close()

    async def _claimed_session(self, host: Host, claim: Claim) -> tuple[Any, Any]:
        """The claimed turn's session, open and free for the turn (with the turn's meta),
        and the record it was loaded from (``None`` when it was open already)."""
        turn = claim.turn
        session = await self._open_session(host, turn, claim.stored)
        # Loaded now, after the claim: no other worker may save the session while this
        # one holds its turn, so the turn starts from that record without asking the
        # store again (one round trip a turn). One open already says nothing of that.
        loaded = session.take_loaded()
        current = session.current
        if current is not None:
            # This worker's earlier turn of the session, whose lease it lost (cancelled,
            # finishing): the queue gave the session on, so let that one end first; then
            # read the session again, without what that turn could not save
            # (:meth:`_drop_lost`).
            current.cancel("lease lost")
            with trio.move_on_after(BUSY_WAIT):
                await current.done.wait()
            if session.current is None:
                await session.close()
                session = await self._open_session(host, turn, claim.stored)
                loaded = session.take_loaded()
        if turn.meta:
            meta = turn.meta
            if 0 < agent_depth(meta) < agent_depth(session.meta):  # an A2A hop count
                meta = {k: v for k, v in meta.items() if k != AGENT_DEPTH_META}  # never less
            session.update_meta(meta)
        return session, loaded

    def _turn_writer(self, claim: Claim) -> Any:
        """The relay's writer of the claimed turn's stream (``None`` without a relay). A
        continuation goes on in the stream its turn paused (its seqs following on); the
        turn's first claim has no stream to continue, no tail to read. A takeover of a
        turn none of whose saves committed re-runs it from step 0, and says so: a
        stream found missing is then the whole turn's at once, its ``start`` not held
        until the first ``step-start`` (a hook on turn start, a slow session load)."""
        if self.relay is None:
            return None
        turn = claim.turn
        return self.relay.writer(
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            takeover=claim.takeover or claim.resumed,
            fresh=not (claim.takeover or claim.resumed or turn.saved),
            resumed=claim.resumed,
            first_step=0 if claim.takeover and not (claim.resumed or turn.saved) else None,
            pauses=turn.resumes,
        )

    async def _stream_turn(
        self, entry: _Running, stream: Any, writer: Any, steered: list[str], watch: SteerWatch
    ) -> str:
        """Run the turn's ``stream`` under its claim's fence, its chunks to ``writer``, then
        finish its row; the status. The lease is held from the claim until the stream
        ends. The stream ends for readers once the queue says the turn is over, so a
        client that sends its next message on ``[DONE]`` finds the session idle."""
        claim = entry.claim
        leases = self._leases
        assert leases is not None
        status = "lost"
        try:
            with self.queue.fenced(
                claim,
                on_lost=lambda: entry.lose("a save was refused"),
                on_deleted=lambda: entry.session_deleted("a save was refused"),
                on_suspended=entry.suspend,
                steered=steered,
                watch=watch,
                on_finished=entry.finish,
                on_finishing=partial(leases.release, claim.turn.turn_id, claim.epoch),
                claim_next=NextClaim(
                    wanted=partial(self._asks_next, entry),
                    on_claimed=leases.hold,
                    claimed=entry.claimed_next,
                    load=self._not_open,
                    found_none=partial(self._found_none, entry),
                ),
            ):
                try:
                    async with stream as out:
                        await self._relay(entry, out, writer)
                finally:
                    leases.release(claim.turn.turn_id, claim.epoch)
            status = await self._finish(entry, writer)
        finally:
            if writer is not None and not entry.writer_closed:
                if entry.end is not None and (entry.deleted or not entry.lost):
                    # The turn's own end, once its result says its save holds it. A turn
                    # given back unsaved (or whose lease went) ends no stream: the
                    # takeover goes on in it, resetting the step; before, its readers
                    # were shown this run's end first (``finish``, or ``error`` quoting
                    # the store), then the re-run and a second end.
                    writer.append(entry.end)
                    entry.last_out = entry.end
                if entry.deleted and not isinstance(entry.last_out, _ENDS):
                    # Its readers' end (``abort``, as the deleting front end gives its
                    # own): unless the turn's own end went out before the delete was known.
                    turn = claim.turn
                    writer.append(
                        Abort(
                            reason=SESSION_DELETED,
                            session_id=turn.session_id,
                            turn_id=turn.turn_id,
                        )
                    )
                final = entry.deleted or (status != "lost" and not entry.lost)
                await _close_writer(writer, final=final, paused=status == WAITING)
        return status

    def _turn_stream(
        self, claim: Claim, session: Any, was_open: bool, loaded: Any, tools: tuple[Any, ...]
    ) -> Any:
        """The claimed turn's stream on ``session``, offering the client's ``tools``:
        resumed where a takeover or a continuation goes on, cancelled at once if that was
        asked."""
        turn = claim.turn
        options = turn.options
        stream = session.stream(
            turn.input,
            regenerate=turn.regenerate,
            turn_id=turn.turn_id,
            message_id=turn.message_id,
            resume=claim.takeover or claim.resumed or turn.saved,
            user_message_id=options.user_message_id,
            tools=tools,
            instructions=options.instructions,
        )
        # A continuation starts from the session its claim read; a fresh load from that.
        stream.stored = claim.stored or (None if was_open else loaded)
        # A reason without a request: a stop held for its message before its POST came
        # (taken by axon_submit_v2's insert, actors/stores/postgres_calls.py), stopped as it starts.
        if turn.cancel_requested or turn.cancel_reason is not None:
            stream.cancel(turn.cancel_reason or "cancelled")
        return stream

    async def _confirm_claim(self, entry: _Running) -> None:
        """Before the turn runs tools: when its lease may have lapsed
        (:meth:`LeaseKeeper.lapsing`: the process was paused past it), ask the queue
        whether the claim still holds; one another worker took over loses the turn here
        (cancelled), before any tool runs a second time. A worker that woke from a
        SIGSTOP ran its step's tool again before its lease thread told it so (the tool's
        idempotency key alone kept the effect single). A renewal held in time costs
        nothing: no query."""
        leases = self._leases
        if leases is None or entry.lost or not leases.lapsing(entry.claim.turn.turn_id):
            return
        try:
            renewal = await self.queue.renew(entry.claim)
        except StoreError as exc:  # not known: the fence refuses the step's commit anyway
            log().warning(
                "worker.confirm_failed", turn_id=entry.claim.turn.turn_id, error=redact(str(exc))
            )
            return
        if not renewal.held and not renewal.let_go:
            entry.lose("lease lapsed before the turn ran a tool")
        await trio.lowlevel.checkpoint()  # (cancelled here when lost)

    async def _take_steering(
        self, claim: Claim, taken: list[str], watch: SteerWatch
    ) -> list[SteeredInput]:
        """At a step boundary of the claimed turn: the messages a front end queued to
        steer it (``on_busy="steer"``), each once. Their ids go to ``taken``, which the
        turn's fenced saves mark ``done`` in the commit that stores them.

        Read only when the turn's saves saw a steering submit since the last read
        (:class:`~runtime.turn_queue.SteerWatch`): a turn nobody steers reads nothing.
        The runner asks once the previous step's save is answered, so what was
        submitted before that save's commit is taken at this boundary."""
        if not watch.pending:
            return []
        found = [t for t in await self.queue.take_steering(claim, watch) if t.turn_id not in taken]
        taken.extend(t.turn_id for t in found)
        return [SteeredInput(content=t.input, user_message_id=t.user_message_id) for t in found]

    async def _open_session(
        self, host: Host, turn: QueuedTurn, stored: SessionRecord | None = None
    ) -> Any:
        """The turn's session, loaded from the store (or from ``stored``, as its claim
        read it); one that is not stored yet starts from the history the turn carries,
        if any (``TurnOptions.history``)."""
        agent = self.agent_for(turn.session_id)
        history = turn.options.history
        if history is not None:
            try:
                return await host.open_session(
                    agent, turn.session_id, history=history, stored=stored
                )
            except InvalidHistory:  # stored (or open) already: an earlier claim saved it
                pass
        return await host.open_session(agent, turn.session_id, stored=stored)

    async def _forget(self, session: Any, history: int) -> None:
        """Delete an ephemeral turn's session once the turn is over
        (``TurnOptions.ephemeral``: a stateless request's scratch session, which started
        from ``history`` messages), with its agent tools' sub-sessions: nobody reads or
        decides them now (:func:`~runtime.app.nested.delete_scratch`)."""
        with trio.CancelScope(shield=True):
            try:
                added = session.messages[history:]  # what its turn added
                await session.close()
                await delete_scratch(self.queue.store, session.id, added)
            except StoreError as exc:
                log().warning("worker.forget_failed", session_id=session.id, error=redact(str(exc)))

    async def _relay(self, entry: _Running, out: Any, writer: Any) -> None:
        """The turn's chunks to the relay; on a takeover, the re-run step reset first
        (:meth:`_reset_shown`). Nothing goes out once the lease is lost.

        Read in bulk (:meth:`~runtime.app.session.TurnStream.next_batch`: every chunk
        that has arrived, the stream's waiting batches taken without a schedule point
        each), not one ``__anext__`` a chunk: the worker only forwards them, ~35 a turn
        (issue 24 goal 3). The same chunks in the same order."""
        restart = entry.claim.takeover
        steered: list[Steered] = []  # a takeover's, held until its step's reset is known
        # One call a batch where the writer takes them so (the Redis relay's): nothing
        # in a batch awaits unless a takeover's restart is looked for, so the lease's
        # loss, noticed on the loop, is the same for the whole batch.
        extend = getattr(writer, "extend", None)
        # The writer's bound in bytes (the Redis relay's): waiting here, the turn's
        # stream (bounded, blocking) fills and the turn waits for a slow Redis.
        room = getattr(writer, "room", None)
        try:
            while chunks := await out.next_batch():
                if writer is None:
                    continue
                if entry.end is not None:  # (nothing follows a turn's end: kept in order)
                    chunks.insert(0, entry.end)
                    entry.end = None
                if type(chunks[-1]) in _ENDS:  # held until the turn's result is in
                    end = chunks.pop()
                    if not entry.lost:  # (once lost, nothing goes out)
                        entry.end = end
                    if not chunks:
                        continue
                if extend is not None and not restart:
                    if not entry.lost:
                        extend(chunks)
                        entry.last_out = chunks[-1]
                        if room is not None:
                            await room()
                    continue
                for chunk in chunks:
                    if entry.lost:
                        break
                    if restart and type(chunk) is Steered:
                        steered.append(chunk)  # (sent before its step: is it shown already?)
                        continue
                    if restart and type(chunk) is StepStart:
                        restart = False
                        reset = await self._reset_shown(entry, writer, chunk.step, steered)
                        steered.clear()
                        if reset:
                            continue  # readers have the step's start: the reset keeps it
                    elif steered:  # (in their place, before what follows them)
                        self._write_steered(entry, writer, steered, frozenset())
                    writer.append(chunk)
                    entry.last_out = chunk
                if room is not None:
                    await room()
            if steered and writer is not None and not entry.lost:
                self._write_steered(entry, writer, steered, frozenset())  # (no step followed)
        except trio.Cancelled:
            # The worker itself is being torn down (only that raises Cancelled here):
            # keep the turn at its last commit, as if the process had died, so the turn
            # that takes it over never finds a partial step saved as interrupted.
            self.queue.close_fences()
            entry.lost = True
            raise

    async def _reset_shown(
        self, entry: _Running, writer: Any, step: int, steered: list[Steered]
    ) -> bool:
        """Before a taken-over turn re-runs ``step``: when the dead worker streamed any of
        it, the parts it left open are closed and a ``reset-step`` chunk
        (:class:`~runtime.output.ResetStep`, error kind :data:`TAKEOVER`) takes back what
        it streamed, as a provider fallback does; the re-run's parts follow, without a
        second ``start-step``. Whether the step was streamed is read from the relay.
        Nothing is written when the lease was lost during that read (the turn is another
        worker's now: a ``reset-step`` from here would take back that worker's parts).

        ``steered``: the messages the re-run took before the step. One the earlier run
        took too, and showed, is not shown again (the relay's ``steered_shown``): its
        row stays queued until a save stores it, so a turn given back unsaved (or whose
        worker died) before that save takes it again. Its readers were shown it twice,
        the bundled page two bubbles of it."""
        closing = await writer.shown(step)
        if entry.lost:  # lost while it read: the stream is a newer worker's to write
            return True
        self._write_steered(entry, writer, steered, getattr(writer, "steered_shown", frozenset()))
        if closing is None:
            return False
        for chunk in closing:
            writer.append(chunk)
        agent = getattr(entry.stream.session, "agent", None)
        name = getattr(getattr(agent, "provider", None), "name", None) or ""
        error = ErrorInfo(kind=TAKEOVER, message=TAKEOVER_MESSAGE)
        writer.append(ResetStep(step=step, provider=name, error=error))
        log().info("worker.step_reset", turn_id=entry.claim.turn.turn_id, step=step)
        return True

    @staticmethod
    def _write_steered(
        entry: _Running, writer: Any, steered: list[Steered], shown: frozenset[str]
    ) -> None:
        """A takeover's held ``steered`` chunks to the relay, but those ``shown``."""
        for chunk in steered:
            if chunk.message_id not in shown:
                writer.append(chunk)
                entry.last_out = chunk
        steered.clear()

    async def _finish(self, entry: _Running, writer: Any = None) -> str:
        """Mark the turn finished in the queue (fenced); the status it ended with. Usually
        its last step's save did it already, in its commit (:meth:`TurnQueue.fenced
        <runtime.turn_queue.TurnQueue.fenced>`'s ``on_finished``)."""
        if entry.suspended:  # its step's commit suspended the row: it waits, whatever came after
            return WAITING
        if entry.finished:  # its last step's commit finished the row
            return "done"
        if entry.deleted:  # the session's delete ended the row (cancelled): nothing to write
            return "cancelled"
        if entry.lost:
            return "lost"
        result = entry.stream.result
        if result is not None and not result.saved:
            return await self._give_back(entry, writer)
        if result is None:
            status, reason, error = "failed", "error", "the turn ended without a result"
        elif result.finish_reason == "error":
            status, reason = "failed", "error"
            error = result.error.message if result.error is not None else "error"
        elif result.finish_reason == "aborted":
            status, reason, error = "cancelled", "aborted", result.abort_reason
        elif result.finish_reason == AWAITING_INPUT and entry.claim.turn.options.ephemeral:
            # nobody can answer an ephemeral turn's wait: it is over as it stands
            status, reason, error = "done", AWAITING_INPUT, None
        elif result.finish_reason == AWAITING_INPUT:
            return await self._suspend(entry)
        else:
            status, reason, error = "done", result.finish_reason, None
        with trio.CancelScope(shield=True):
            try:
                if not await self.queue.finish(
                    entry.claim, status=status, finish_reason=reason, error=error
                ):
                    return "lost"
            except LeaseLost:
                return "lost"
        return status

    async def _give_back(self, entry: _Running, writer: Any = None) -> str:
        """The turn ended but its final save was not confirmed (it failed, or outlived
        the turn runner's ``SAVE_TIMEOUT``): it must not be marked done, the session
        missing what the turn said, nor its save land later, after the session's next
        turn (run by another worker meanwhile) saved: the store refuses it now that the
        fenced block is left (:meth:`PostgresStore.fenced
        <actors.stores.postgres.PostgresStore.fenced>`). The turn is released, as a
        stopping worker's is: another worker takes it over from its last committed step
        and re-runs the rest (its readers told to drop this run's unsaved step). The
        attempt stays used: a store that never confirms fails the turn at last.

        ``writer`` (the turn's relay writer) is flushed before the release: the re-run,
        on this worker or another, reads from the relay what this run streamed of the
        step it re-runs (:meth:`_reset_shown`). Released first, the re-run could read
        before this run's last chunks were out, find the step unstreamed and send no
        ``reset-step``: its readers were shown the step twice, the unsaved run's
        answer and the re-run's, one after the other."""
        turn = entry.claim.turn
        last = turn.attempts >= self.max_attempts
        log().error(
            "worker.turn_unsaved",
            turn_id=turn.turn_id,
            session_id=turn.session_id,
            epoch=entry.claim.epoch,
            attempts=turn.attempts,
        )
        session = entry.stream.session
        with trio.CancelScope(shield=True):
            if session.current is None:
                # Its history holds the turn unsaved: a later turn here would carry
                # those messages on as its own (after what the takeover stores of
                # them). Dropped before the release, so the next claim loads the session.
                await session.close()
            if last:
                return await self._fail_unsaved(entry)
            entry.lost = True  # what happens to the turn from here is not this worker's
            if writer is not None:
                entry.writer_closed = True
                await _close_writer(writer, final=False, paused=False)
            try:
                await self.queue.release(entry.claim, keep_attempt=True)
            except StoreError as exc:  # the lease runs out instead: taken over all the same
                log().warning("worker.release_failed", turn_id=turn.turn_id, error=redact(str(exc)))
        return "lost"

    async def _fail_unsaved(self, entry: _Running) -> str:
        """The turn's last attempt ended unsaved too: it fails here, its error and its
        stream's end the ``not_saved`` ones the embedded app tells
        (:func:`~runtime.app.unsaved.unsaved_error`; no store text). Given back, the
        next claim failed it as "abandoned by N workers (their leases expired while
        running it): it may be killing its workers", and its stream had no end: its
        client was told the relay lost it, to reload. What its saves committed stays."""
        result = entry.stream.result
        error = unsaved_error(result)
        if entry.end is not None:
            entry.end = told_end(entry.end, result)
        try:
            if not await self.queue.finish(
                entry.claim, status="failed", finish_reason="error", error=error.message
            ):
                entry.lost = True
                return "lost"
        except (LeaseLost, StoreError) as exc:  # its lease runs out: the claim fails it
            log().warning(
                "worker.finish_failed", turn_id=entry.claim.turn.turn_id, error=redact(str(exc))
            )
            entry.lost = True
            return "lost"
        return "failed"

    async def _suspend(self, entry: _Running) -> str:
        """The turn waits for a person: its row holds nothing from here on (``WAITING``),
        until the earliest deadline of its waiting calls, if any. Usually the step's
        save did it already, in its commit (:meth:`~runtime.turn_queue.TurnQueue.fenced`)."""
        if entry.suspended:
            return WAITING
        due = deadlines(entry.stream.session.messages)
        with trio.CancelScope(shield=True):
            try:
                if not await self.queue.suspend(
                    entry.claim, expires_at=min(due.values(), default=None)
                ):
                    return "lost"
            except LeaseLost:
                return "lost"
        return WAITING


_ENDS = (Abort, Error, Finish)
"""The chunks that end a turn's output (its relay stream's end follows)."""


def _outdated_regenerate(
    claim: Claim, open_messages: Sequence[Any] | None, loaded: Any
) -> RegenerateOutdated | None:
    """Why the claimed regenerate must not run (``None``: it may): a user message follows
    the assistant message it names (``TurnOptions.regenerates``) in the history the turn
    would start from, so the turn it waited for answered a later message. Cutting the
    last turn would drop that message and its answer and store the regenerated one a
    second time (embedded, :meth:`~runtime.app.session.TurnStream._check_still_last`).
    Asked only as the turn first starts (a takeover or a continuation goes on with what
    its own saves stored), and only of a row that names the message (older rows, a
    message the history does not hold: the last turn is replaced, as before).
    ``open_messages``: the open session's history, when it was open before the claim."""
    turn = claim.turn
    named = turn.options.regenerates
    if not turn.regenerate or named is None or claim.takeover or claim.resumed or turn.saved:
        return None
    record = claim.stored or (None if open_messages is not None else loaded)
    messages = record.messages if record is not None else (open_messages or ())
    at = next((i for i, m in enumerate(messages) if getattr(m, "id", None) == named), None)
    if at is None:
        return None
    later = [m for m in messages[at + 1 :] if isinstance(m, UserMessage)]
    if not later:
        return None
    return RegenerateOutdated(
        f"message {named!r} is no longer the last answer of session {turn.session_id!r}: "
        f"message {later[-1].id!r} was answered after it while this regenerate waited; "
        "nothing was regenerated."
    )


async def _client_tools(specs: Sequence[ClientToolSpec]) -> tuple[Tool, ...]:
    """The client's tools of a queued turn, built in a thread when there are any: each
    schema is checked against the JSON Schema meta-schema, ~0.5 ms a tool and ~8 us a
    byte of a large one, and a front end takes up to 128 tools and 256 KiB of schemas
    (:mod:`runtime.app.web.agui_input`), seconds of this worker's loop otherwise; and
    their patterns compile for the linear engine, within one budget for the turn
    (:data:`~runtime.tools.LISTING_UNITS`, ~1 s)."""
    if not specs:
        return ()
    budget = [LISTING_UNITS]  # (their patterns compile within one budget, as the front end's)
    return await trio.to_thread.run_sync(
        lambda: tuple(spec.tool(budget) for spec in specs), limiter=off_loop_limiter()
    )


async def _close_writer(writer: Any, *, final: bool, paused: bool) -> None:
    """Close a turn's relay writer, shielded: its end is flushed (within the relay's
    bound) even when the worker is being torn down. The Redis relay's writer shields its
    own bounded wait (``shield=True``: one cancel scope, not a shield around its own
    bound's: issue 24 goal 3); any other relay's is closed inside a shield."""
    if type(writer) is RedisRelayWriter:
        await writer.aclose(final=final, paused=paused, shield=True)
        return
    with trio.CancelScope(shield=True):
        await writer.aclose(final=final, paused=paused)


async def _take_slot(slots: trio.Semaphore) -> None:
    """One of the worker's ``concurrency`` slots, waiting while none is free.

    A free slot is taken without a schedule point (``Semaphore.acquire`` yields once even
    then): the claim that follows parks the loop in its store call's thread at once, so
    that yield carried nothing but a task step (issue 24 goal 3). Cancellation is still
    checked."""
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        slots.acquire_nowait()
    except trio.WouldBlock:
        await slots.acquire()


def _not_a_plain_file(path: str | os.PathLike[str]) -> OSError | None:
    """Why ``path`` is no file the worker may touch and remove (``None``: a regular file,
    or nothing there). ``--health-file /dev/null`` ("no file wanted", one might think) was
    touched, then removed: as root the null device itself was unlinked, and the next beat
    created a regular file in its place. A FIFO blocked the first touch forever; a
    symbolic link had its target's time set, wherever it pointed."""
    try:
        info = os.lstat(path)
    except OSError:
        return None  # nothing there, or nothing to see: the open or unlink says why
    if stat.S_ISLNK(info.st_mode):
        return OSError("a symbolic link: give the file's own path")
    if not stat.S_ISREG(info.st_mode):
        return OSError(
            "not a regular file: give the path of a file (created if missing, removed at exit)"
        )
    return None


def _touch(path: str | os.PathLike[str]) -> None:
    """Set ``path``'s modification time to now, creating it if need be (``OSError``
    when it cannot be written, or is no regular file: :func:`_not_a_plain_file`)."""
    refused = _not_a_plain_file(path)
    if refused is not None:
        raise refused
    # O_NOFOLLOW, O_NONBLOCK: what was swapped in since the look above (a link, a FIFO)
    # fails or is seen by fstat, never followed or waited on.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        os.utime(fd)
    finally:
        os.close(fd)


def _remove(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` if it is a regular file (never a device, FIFO or link that took
    its name: see :func:`_not_a_plain_file`)."""
    if _not_a_plain_file(path) is not None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass  # never made, or removed by someone else


@asynccontextmanager
async def open_worker(
    store_url: str,
    *,
    redis_url: str | None = None,
    agent: AgentSource,
    relay_options: dict[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[Worker]:
    """Open the store (and relay, with ``relay_options`` such as ``prefix``), start a
    :class:`Worker` with ``options``, yield it; on exit stop it (draining its turns for
    ``grace`` seconds) and close what it opened."""
    # The relay first: a bad Redis URL fails before anything is created in PostgreSQL,
    # and the relay outlives the worker, so its turns' last chunks are flushed.
    # A store without a turn queue, or without its driver installed, fails before anything
    # is opened (Redis not answering is retried for seconds, then says only that).
    queue_scheme(store_url)
    require_driver(store_url)
    async with _maybe_relay(redis_url, relay_options or {}) as relay:
        store = await open_store(store_url)
        try:
            async with trio.open_nursery() as nursery:
                worker = Worker(store=store, relay=relay, agent=agent, **options)
                await nursery.start(worker.run)
                try:
                    yield worker
                finally:
                    worker.stop()
        finally:
            with trio.CancelScope(shield=True):
                await store.aclose()


@asynccontextmanager
async def _maybe_relay(url: str | None, options: dict[str, Any]) -> AsyncIterator[Any]:
    if url is None:
        yield None
        return

    async with RedisRelay.open(url, **options) as relay:
        yield relay


__all__ = ["AgentSource", "LeaseKeeper", "Worker", "default_owner", "open_worker"]


# -- the command ------------------------------------------------------------------------


def add_worker_parser(subparsers: Any) -> Any:
    """``python -m runtime worker``: its options (imports nothing heavy)."""

    worker = subparsers.add_parser(
        "worker", help="run durable turns from PostgreSQL, streaming them through Redis"
    )
    _add_service_arguments(worker)
    _add_claim_arguments(worker)
    _add_relay_write_arguments(worker)
    add = worker.add_argument
    add("--owner", default=None, help="this worker's name in axon_turns (default host:pid:rand)")
    add_input_limit_arguments(worker)
    add_agent_arguments(worker)
    add(
        "--delay",
        type=non_negative(float),
        default=0.0,
        help="scripted demo: seconds between chunks",
    )
    add("--mcp", action="append", default=[], metavar="SERVER", help=MCP_HELP)
    add(
        "--health-file",
        default=None,
        metavar="PATH",
        help="touch PATH every --health-interval seconds while the worker can take work "
        "(PostgreSQL and its LISTEN connection answer, its claim loop goes round), for a "
        "liveness probe (stale: the worker is stuck or lost the database); removed at "
        "exit. docs/deployment.md",
    )
    add(
        "--health-interval",
        type=positive(float),
        default=HEALTH_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between touches of --health-file (default {HEALTH_INTERVAL:g})",
    )
    add_log_level_argument(worker, "warning")
    add_plugin_argument(worker)
    worker.set_defaults(jsonl=False)
    return worker


def _add_service_arguments(worker: Any) -> None:
    """Where the worker's turns are stored and where their output goes (the relay's
    prefix must be the front ends' too)."""
    add = worker.add_argument
    add("--store", required=True, metavar="URL", help="postgresql://... (the sessions and turns)")
    add("--redis", default=None, metavar="URL", help="redis://... (live output to front ends)")
    add(
        "--redis-prefix",
        default=None,
        metavar="PREFIX",
        help="key prefix of the relay's streams (default 'axon:'; front ends must agree)",
    )


def _add_claim_arguments(worker: Any) -> None:
    """How many turns the worker claims, how long a claim holds, how often a turn is
    tried, and how long the worker drains and idles (:class:`Worker`'s options)."""
    add = worker.add_argument
    add(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"turns run at once (default {DEFAULT_CONCURRENCY})",
    )
    add(
        "--lease",
        type=float,
        default=DEFAULT_LEASE,
        help=f"seconds a claim holds unrenewed (default {DEFAULT_LEASE:g})",
    )
    add(
        "--max-attempts",
        type=int,
        default=DEFAULT_MAX_ATTEMPTS,
        help=f"claims before a turn is marked failed (default {DEFAULT_MAX_ATTEMPTS})",
    )
    add(
        "--grace",
        type=float,
        default=DEFAULT_GRACE,
        help=f"seconds to finish turns on SIGTERM (default {DEFAULT_GRACE:g})",
    )
    add(
        "--poll",
        type=positive(float),
        default=DEFAULT_POLL,
        help=f"seconds between claims when idle (default {DEFAULT_POLL:g})",
    )
    add(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help="keep at most N sessions in memory, freeing the least recently used idle ones "
        f"(default {DEFAULT_MAX_SESSIONS}); a freed one is read from the store again",
    )
    add(
        "--gc-pacing",
        action="store_true",
        help="pace the garbage collector from the event loop (Worker(gc_pacing=True)): for "
        "long histories (a session of 600,000 messages brought collections of 0.2-0.9 s); "
        "costs 6-7%% more CPU on short turns. docs/embedding.md",
    )


def _add_relay_write_arguments(worker: Any) -> None:
    """The Redis relay's write coalescing (:func:`relay_options_of` checks them): left
    unset (``None``), the relay keeps its own defaults."""
    add = worker.add_argument
    add(
        "--relay-flush-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a burst's writes to Redis wait for the relay's shared tick of this length "
        "(default 0.005; 0: each flush at once). docs/relay.md",
    )
    add(
        "--relay-end-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a turn's last chunk waits at most this long to go out with its close "
        "(default 0.05; 0: at once). docs/relay.md",
    )


def relay_options_of(args: Any) -> dict[str, Any]:
    """The Redis relay's options the command line sets (``RedisRelay.open``'s keywords);
    a negative (or not-a-number) time raises :class:`~runtime.errors.ConfigurationError`."""
    options: dict[str, Any] = {}
    if args.redis_prefix:
        options["prefix"] = args.redis_prefix
    for flag, key in (("relay_flush_interval", "flush_interval"), ("relay_end_wait", "end_wait")):
        value = getattr(args, flag, None)
        if value is None:
            continue
        if not value >= 0:  # NaN too
            raise ConfigurationError(f"--{flag.replace('_', '-')} must be 0 or more seconds")
        options[key] = value
    return options


async def worker_command(args: Any) -> int:
    """Run a worker until SIGINT/SIGTERM, then drain it (``--grace``); a second signal
    during the drain ends the process at once (its turns are taken over)."""

    configure_logging(args.log_level)
    with command_collector():
        return await _run_worker_command(args)


def worker_options(args: Any) -> dict[str, Any]:
    """:class:`Worker`'s options from the command line (not its agent); a value out of
    range raises :class:`~runtime.errors.ConfigurationError` (one line, exit 2)."""
    if args.concurrency < 1 or not args.lease > 0 or args.grace < 0 or args.max_attempts < 1:
        raise ConfigurationError(
            "--concurrency and --max-attempts must be >= 1, --lease > 0 and --grace >= 0"
        )
    max_sessions = getattr(args, "max_sessions", DEFAULT_MAX_SESSIONS)
    if max_sessions < 1:
        raise ConfigurationError(f"--max-sessions must be >= 1, not {max_sessions}")
    return {
        "concurrency": args.concurrency,
        "lease": args.lease,
        "max_attempts": args.max_attempts,
        "grace": args.grace,
        "poll": args.poll,
        "max_sessions": max_sessions,
        "owner": args.owner,
        "input_limits": input_limits(args),
        "plugins": make_plugins(args),
        "gc_pacing": args.gc_pacing,
        "health_file": getattr(args, "health_file", None),
        "health_interval": getattr(args, "health_interval", HEALTH_INTERVAL),
    }


async def _run_worker_command(args: Any) -> int:
    try:
        queue_scheme(args.store)
        require_driver(args.store)  # a missing extra said first: see open_worker
        options = worker_options(args)
        agent = make_agent(args)
        relay_options = relay_options_of(args)
        health_file = getattr(args, "health_file", None)
        if health_file is not None:
            try:
                _touch(health_file)  # a path it cannot write fails here, not in the probe
                _remove(health_file)  # made once the database answers
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot write --health-file {health_file}: {exc.strerror or exc}"
                ) from None
        async with open_worker(
            args.store,
            redis_url=args.redis,
            agent=agent,
            relay_options=relay_options,
            **options,
        ) as worker:
            print(
                f"Axon worker {worker.owner} on {redact_url(args.store)}"
                f"{', relay ' + public_url(args.redis) if args.redis else ''} "
                f"(concurrency {worker.concurrency}, lease {worker.lease:g} s)",
                flush=True,
            )
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break  # then leaving open_worker drains; a second signal kills
    except (ConfigurationError, RelayUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
