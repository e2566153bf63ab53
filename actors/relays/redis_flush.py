"""The Redis Streams relay's one flush task (:class:`_Flusher`): it writes every writer's
due queue, those due at one moment in one pipeline.

Apart from the writers (:mod:`actors.relays.redis_writer`), which only queue and say when
they are due: this task owns the timing (it sleeps until the soonest writer is due) and
the wire (RESP on a connection of its own, :mod:`actors.relays.resp`, or coredis), and
hands each writer its flush's outcome. The class says why it is one task, not one per
writer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, Any

import trio

from actors.relays import resp
from actors.relays.redis_failures import (
    BULK_FLOOR,
    BULK_UNSAID,
    EntryTooLarge,
    _bulk_limit,
    _duplicate,
    _transient,
)

if TYPE_CHECKING:
    from actors.relays.redis_writer import RedisRelayWriter, _Job


_flat = chain.from_iterable


class _Flusher:
    """The relay's one flush task: writes every writer's due queue, those due at one
    moment in one pipeline.

    Each writer had a task of its own that held its queue, then handed its flush to a
    batcher task and waited for the outcome: about five task wake-ups, a cancel scope
    and an ``Event`` per flush, and a worker's turn makes several (issue 24 goal 3: the
    relay was about 22 % of a worker's CPU per turn). Now a writer's append only queues
    and, when its queue starts waiting, tells this task when it is due (:meth:`schedule`;
    a wake-up only when that is sooner than what this task already sleeps until, so a
    burst at a tick wakes nothing). At the due moment this task takes every due
    writer's queue, sends them as one pipeline, and settles each writer's outcome
    itself (:meth:`RedisRelayWriter._settle`); a writer's closer waits for its own
    outcome, nobody else does.

    Pipelines are written as RESP on a connection of their own
    (:mod:`actors.relays.resp`; coredis for a URL that module does not serve): through
    coredis one ``XADD`` cost about 200 µs of CPU. Each writer still has at most one
    flush out and gets its own outcome: its ``XADD`` refused (a duplicate id, a key of
    another type) is its error alone; a connection that breaks, or a pipeline that
    outlives ``timeout``, fails every flush of that pipeline, each retried by its writer
    after a backoff (the ids make a flush Redis applied a duplicate). While a pipeline
    is out, appends only queue (each writer's queue is bounded, ``max_queue``).
    """

    def __init__(self, client: Any, url: str | None, timeout: float) -> None:
        self.client = client
        self.timeout = timeout
        where = resp.address(url) if url is not None else None
        self.connection = resp.RespConnection(where) if where is not None else None
        """The writers' own connection (``None``: they go through coredis)."""
        self._pending: dict[RedisRelayWriter, None] = {}
        """The writers whose queue waits to go out (each knows when: ``_due``)."""
        self._wake = trio.Event()
        self._asleep_until = -math.inf
        """What this task sleeps until (``inf``: until woken; ``-inf``: it is not
        asleep, and looks at every pending writer before it sleeps again)."""
        self.pipelines = 0
        """Pipelines sent (observable: fewer than the writers' flushes when busy)."""
        self.wakeups = 0
        """Times a writer woke this task (observable: a burst at a tick wakes it once)."""
        self.now: Callable[[], float] = trio.current_time
        """The run's clock, read (``trio.current_time`` without its two Python calls a
        read: the relay's writers and this task read it ~20 times a worker's turn,
        issue 24 goal 3); ``trio.current_time`` itself for a relay made outside a run."""
        try:
            self.now = trio.lowlevel.current_clock().current_time
        except RuntimeError:  # not in a run (a relay built to look at its options)
            pass

    def schedule(self, writer: RedisRelayWriter, at: float) -> None:
        """``writer``'s queue goes out at ``at`` (Trio clock) with every other due then."""
        writer._due = at
        self._pending[writer] = None
        if at < self._asleep_until:
            self._asleep_until = at
            self.wakeups += 1
            self._wake.set()

    def forget(self, writer: RedisRelayWriter) -> None:
        """``writer`` closed: whatever it still queues is not written."""
        writer._due = None
        self._pending.pop(writer, None)

    async def run(self) -> None:
        try:
            while True:
                await self._serve()
        finally:
            if self.connection is not None:
                await self.connection.aclose()

    async def _serve(self) -> None:
        """Send pipelines until one outlives ``timeout`` (its flushes then fail with
        ``TooSlowError``), or a sleep's deadline passes. One cancel scope serves them
        all: its deadline is the pipeline's while one is out, instead of a
        ``trio.fail_after`` per pipeline (a new scope with a deadline was ~44 µs of CPU on
        the 2-core benchmark machine), and the sleep's wake-up while this task sleeps
        until a writer is due, instead of a ``move_on_at`` scope per sleep (~1.3 a worker
        turn, most of them ended by a writer's wake-up before their deadline: issue 24
        goal 3). A sleep whose deadline passes ends the scope: :meth:`run` opens the next."""
        with trio.CancelScope() as scope:
            while True:
                jobs = await self._next_jobs(scope)
                if jobs is None:  # cancelled by a deadline as this task woke
                    return
                self.pipelines += 1
                scope.deadline = self.now() + self.timeout
                await self._send(jobs)
                # Not held while this task sleeps until the next flush: the jobs hold
                # their writers (each with its queue and turn), and a worker's last
                # turn's writer outlived its turn until another turn wrote.
                del jobs

    async def _next_jobs(self, scope: trio.CancelScope) -> list[_Job] | None:
        """The flushes of every writer due, once there are any (sleeping until the
        soonest is due, ``scope``'s deadline the wake-up, or a writer wakes this task for
        a sooner one); ``None`` once ``scope`` is cancelled (its deadline passed as a
        writer woke this task, or as the last pipeline's replies came): no flush is
        taken into a cancelled scope, the next scope takes it."""
        while True:
            if scope.cancel_called:  # its deadline passed (or the last pipeline's did)
                return None
            jobs = self._take_due(self.now())
            if jobs:
                return jobs
            # After the look: a writer ``_take`` settled at once is due again (later).
            # (a loop, not ``min`` of a generator: a frame and a resume a writer, each
            # time this task goes to sleep, issue 24 goal 3)
            soonest = math.inf
            for writer in self._pending:
                due = writer._due or math.inf
                if due < soonest:
                    soonest = due
            self._asleep_until = soonest
            if scope.deadline != soonest:  # the last pipeline's, or the last sleep's
                scope.deadline = soonest
            try:
                await self._wake.wait()  # Cancelled at ``soonest``: the scope ends
            finally:
                self._asleep_until = -math.inf
            if self._wake.is_set():
                self._wake = trio.Event()

    def _take_due(self, now: float) -> list[_Job]:
        """The flushes of the writers due at ``now``, taken (a writer closed meanwhile
        dropped). A function of its own: the writer it looked at last (closed, maybe) is
        no local of :meth:`_next_jobs` kept while that task sleeps."""
        jobs: list[_Job] = []
        pending = self._pending
        for writer in list(pending):
            due = writer._due
            if due is None:  # closed meanwhile
                del pending[writer]
            elif due <= now:
                del pending[writer]
                writer._due = None
                job = writer._take(now)
                if job is not None:
                    jobs.append(job)
        return jobs

    async def _send(self, jobs: list[_Job]) -> None:
        """One pipeline of ``jobs``; each writer gets its outcome, whatever happens."""
        try:
            try:
                if self.connection is not None:
                    await self._send_resp(jobs)
                else:
                    await self._send_coredis(jobs)
            except Exception as exc:  # the connection: every flush of it failed
                for job in jobs:
                    job.error = exc
            for job in jobs:
                # A failed flush only: every pipeline called the check (and the import
                # of its error types) for each of its jobs, ~7 a worker's turn.
                if job.error is not None and _suspect(job):
                    with trio.CancelScope(shield=True):  # bounded: ``timeout``
                        await self._name_too_large(jobs)
                    break
        except BaseException:  # the deadline (or the relay closing): none was confirmed
            for job in jobs:
                job.error = trio.TooSlowError(f"Redis did not answer within {self.timeout:g} s")
            raise
        finally:
            for job in jobs:
                job.writer._settle(job)

    async def _name_too_large(self, jobs: list[_Job]) -> None:
        """A connection lost under an entry of at least :data:`BULK_FLOOR`: Redis may
        have closed it for the entry's size (its ``Protocol error`` lost with it, as over
        TLS). Redis's ``proto-max-bulk-len`` is asked, and each such entry past it is
        refused as :class:`EntryTooLarge` (named, not retried); the other flushes keep
        their connection error (retried). A Redis that does not answer says nothing:
        all are retried, as in an outage.

        A Redis that answers but will not say (``CONFIG`` refused or renamed, as managed
        services do, perhaps with a lower limit than its 512 MB default, which was
        assumed before: an entry between the two was retried as an outage until its
        writer gave up, and every flush of the turn after it with it): its answer shows
        it is up, so the entry is retried once, and refused when its connection is lost
        under it again (the writer's ``lost_under``), Redis answering again. What that
        costs when the losses were a network's: one entry of the turn, readers told
        (the store holds the turn; the relay is a cache)."""
        limit = await _bulk_limit(self.client, self.timeout)
        if limit is None:
            return
        for job in jobs:
            if not _suspect(job):
                continue
            assert job.error is not None
            if limit == BULK_UNSAID:
                if job.writer.lost_under == job.first:
                    job.error = EntryTooLarge(job.largest(), limit, job.error)
                job.writer.lost_under = job.first
            elif job.largest() > limit:
                job.error = EntryTooLarge(job.largest(), limit, job.error)

    async def _send_resp(self, jobs: list[_Job]) -> None:
        assert self.connection is not None
        # Tuples, their fields flattened in C (``chain``): a list comprehension was a
        # Python call a flush, and ``encode`` copied each list to a tuple (issue 24 goal 3).
        commands: list[tuple[Any, ...]] = []
        for job in jobs:
            for command in job.commands:
                name = command[0]
                if name == "XADD":
                    _, key, identifier, fields = command
                    commands.append(("XADD", key, identifier, *_flat(fields.items())))
                elif name == "SET":
                    _, key, value, ex = command
                    commands.append(("SET", key, value, "EX", ex))
                else:
                    commands.append(command)
        replies = await self.connection.pipeline(commands)
        at = 0
        for job in jobs:
            if job.ends is None:  # one entry (nearly every flush)
                reply = replies[at]
                if isinstance(reply, Exception):
                    job.error = reply
                else:
                    job.result = reply
            else:
                _outcome(job, replies[at : at + job.adds])
            at += len(job.commands)

    async def _send_coredis(self, jobs: list[_Job]) -> None:
        wanted: list[list[Any]] = []
        async with self.client.pipeline(transaction=False, raise_on_error=False) as pipe:
            for job in jobs:
                adds = job.adds
                wanted.append([])
                for _, key, identifier, fields in job.commands[:adds]:
                    wanted[-1].append(pipe.xadd(key, fields, identifier=identifier))
                for name, key, *args in job.commands[adds:]:
                    if name == "SET":
                        pipe.set(key, args[0], ex=args[1])
                    else:
                        pipe.expire(key, args[0])
        for job, results in zip(jobs, wanted, strict=True):
            replies: list[Any] = []
            for result in results:
                try:
                    replies.append(await result)
                except Exception as exc:  # this writer's command was refused
                    replies.append(exc)
            _outcome(job, replies)


def _outcome(job: _Job, replies: list[Any]) -> None:
    """``job``'s outcome from its ``XADD`` s' ``replies``, in order: the first refusal
    (but a duplicate: an entry a retry finds Redis took before), with how many entries
    before it Redis took (:attr:`_Job.applied`); all duplicates: the first (the flush was
    in already); else the last reply."""
    duplicate = None
    for index, reply in enumerate(replies):
        if isinstance(reply, Exception):
            if _duplicate(reply):
                duplicate = duplicate or reply
                continue
            job.error, job.applied = reply, index
            return
        job.result = reply
    if job.result is None:
        job.error = duplicate


def _suspect(job: _Job) -> bool:
    """Whether ``job``'s flush lost its connection carrying an entry Redis may have
    refused for its size (see :meth:`_Flusher._name_too_large`)."""
    return not job.tail and isinstance(job.error, _transient()) and job.largest() >= BULK_FLOOR
