"""asyncio's front door: an Axon host for FastAPI, Starlette, aiohttp or Django apps.

Axon runs under Trio. :class:`AsyncHost` runs a :class:`~runtime.app.host.Host` in a Trio
run on a thread of its own and gives asyncio code the same shapes, asyncio-native::

    async with AsyncHost.open(store="app.db") as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            async for chunk in out:
                ...
        result = await session.run("hi")

**Why a thread, not Trio's guest mode.** ``trio.lowlevel.start_guest_run`` could run
Trio on asyncio's own loop with no thread, and it was considered first. It was turned
down because (1) a guest run takes the loop thread's Trio run context for as long as it
lives: one host per event loop, and no other Trio code (``run_sync``, a second host, a
library's own guest run) can start in that thread; (2) every turn's work (parsing the
provider's stream, saving, tools' bookkeeping) would run as callbacks of the
application's loop, so one blocking call in any request handler would stall every
turn's stream and deadline, and Axon's timeouts would measure the app's latency; (3) it
saves less than it seems: a guest run still waits for I/O on a thread of its own, so a
wake-up from idle crosses threads either way. On a thread the host keeps Trio's
scheduling whole, works with any loop (uvloop included) and any number of loops, and
the cost of crossing is paid per *batch* of chunks, not per chunk (below).

**Cancellation crosses both ways.** Every call into the host runs as a Trio task in a
cancel scope of its own. An asyncio task cancelled while it waits (in
``open_session``, ``run``, or anywhere in a ``stream`` block) cancels that scope: the
turn is cancelled as if a Trio consumer had been (reason ``cancelled``) and saved,
marked interrupted, *before* the ``CancelledError`` goes on up the asyncio task (further
cancellations meanwhile are held back until then: the save is bounded by
:data:`runtime.app.session.FINAL_WAIT`). Leaving the block early, or with an exception,
cancels the turn with the Trio API's reasons (``consumer left the stream``, ``consumer
failed: ValueError``). The other way, a turn cancelled on the Trio side (the host
closing, ``out.cancel(reason)``) ends the asyncio stream as it ends a Trio one, with its
``abort`` chunk. An error the host raises (``SessionBusy``, ``InvalidSessionId``,
``InvalidMedia``...) is raised in the asyncio task as itself, the same object.

**Backpressure is kept.** The Trio side forwards a stream's chunks in batches
(:meth:`~runtime.app.session.TurnStream.next_batch`: whatever arrived since the last
batch), with one batch of credit: it hands the asyncio side a batch only once the one
before was taken. So the asyncio side holds at most the batch it is reading and one
more, the Trio turn's own bounded inboxes hold the rest, and a consumer that stops
reading stops the provider just as a stalled Trio consumer does. No buffer grows with
the stream. The reader lets the event loop run once per batch, as a Trio consumer
checkpoints once per batch: a stream always a batch ahead would otherwise never suspend
it, and the loop's other tasks (other requests, a client's disconnect) would starve.

**What it costs.** A thread hop per hand-off, and asyncio's own ``async for``. The hops
are kept rare: a hand-off carries every chunk that has arrived (up to
:data:`HANDOFF_MOST`), the Trio side lets the stages upstream run while they have work
before handing over (:func:`_let_upstream_run`), and each side wakes the other only when
that one is parked. ``python3 -m benchmarks --only aio`` measures it against the Trio
API on the same stream (docs/asyncio.md).

**Loops and threads.** A host is one Trio thread, started on entering ``async with
AsyncHost.open()`` and joined on leaving it. Every call settles on its caller's running
loop, so a host opened by one loop serves tasks of others (a worker thread's
``asyncio.run``). The opening loop owns it: leaving its block closes it, and a loop
closed, or whose thread ended, without leaving the block closes it too (checked every
:data:`LOOP_WATCH` seconds while calls are in flight; an idle host sleeps until work
comes), the turns saved interrupted as on leaving. A stream whose reader's loop dies
(the opener's or another) ends its turn the same way, and the interpreter's exit closes
the hosts still open (:func:`_close_at_exit`). The cases, each against the Trio API,
are in docs/asyncio.md ("When things go wrong").
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import outcome
import trio

from runtime.actor_messages import TurnResult
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.app.session import FINAL_WAIT, Session, TurnStream
from runtime.approval import PendingCall, Recorded
from runtime.busy import OnBusy
from runtime.errors import ConfigurationError, HostClosed, SessionError
from runtime.logging import get_logger, log_exception
from runtime.media import UserInput
from runtime.messages import Message
from runtime.output import OutputChunk

T = TypeVar("T")

HANDOFF_MOST = 4096
"""Most chunks one hand-off carries to the asyncio side (give or take one inbox batch):
what a stalled asyncio consumer holds besides the chunks it is reading."""

HOLD_ROUNDS = 32
"""Most scheduler rounds the Trio side lets pass before a hand-off it did not have to
wait for (see :func:`_let_upstream_run`)."""

IDLE_ROUNDS = 3
"""Rounds in a row with no other Trio task runnable that end the hold: the pipeline is
idle (a provider waiting for the network), the hand-off goes."""

LOOP_WATCH = 1.0
"""Seconds between the checks that a loop is still there, made only while something
waits on it: the host thread looks at the loop which opened it while calls are in
flight (a loop closed, or whose thread ended, without leaving ``async with
AsyncHost.open()`` closes the host as leaving it would, turns saved interrupted, and the
thread ends instead of running on unseen), and a stream held back by its reader looks
at the reader's loop (a reader whose loop died ends the turn, saved interrupted). An
idle host sleeps until work comes: no timer."""

EXIT_WAIT = 10.0
"""Seconds the interpreter's exit waits, at most, for the hosts still open (never left,
their loop stopped where it was) to save their running turns interrupted and end their
threads (:func:`_close_at_exit`)."""

_open_hosts: set[AsyncHost] = set()
"""The hosts whose Trio thread runs: what the interpreter's exit closes."""

_exit_hook: list[bool] = []
"""Whether :func:`_close_at_exit` is registered (once, with the first host)."""


def _close_at_exit() -> None:
    """At the interpreter's exit (after the non-daemon threads ended, so nothing but a
    daemon thread can still use a host): close every host still open as leaving its
    block would, but for readers that will never read again (abort reason
    ``interpreter exit``, turns saved interrupted), and wait for their threads, at most
    :data:`EXIT_WAIT` in all. A host's daemon thread would otherwise be stopped where
    it is, its running turns never saved, as a Trio host's are on the way out of
    ``trio.run``."""
    hosts = [host for host in _open_hosts if host._thread.is_alive()]  # (not a fork's)
    for host in hosts:
        host._leave("interpreter exit")
    deadline = time.monotonic() + EXIT_WAIT
    for host in hosts:
        host._thread.join(max(0.0, deadline - time.monotonic()))


def _gone(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> bool:
    """Whether ``loop`` (run by ``thread``) will never run again: it is closed, or
    stopped with its thread ended. (The main thread ends when the interpreter exits:
    that is :func:`_close_at_exit`'s, which runs after the other threads it waits for
    ended; until then the main thread's loop may still be used by them.)"""
    if loop.is_closed():
        return True
    return thread is not threading.main_thread() and not thread.is_alive() and not loop.is_running()


async def _let_upstream_run() -> None:
    """Yield to the Trio scheduler while the stages upstream (provider, engine, turn
    runner, stream controller) are at work, for at most :data:`HOLD_ROUNDS` rounds, so
    that a hand-off carries what they had in flight. Each hand-off is a thread hop, the
    bridge's main cost: on a fast stream this makes them a few times fewer. No timer:
    once :data:`IDLE_ROUNDS` rounds in a row found nothing else runnable (a round of an
    idle Trio loop takes microseconds), the hand-off goes, so a paced stream's delta is
    not held back. One idle round is not enough: the count misses the tasks still to run
    in the current round."""
    idle = 0
    for _ in range(HOLD_ROUNDS):
        await trio.lowlevel.checkpoint()
        if trio.lowlevel.current_statistics().tasks_runnable:
            idle = 0
        else:
            idle += 1
            if idle == IDLE_ROUNDS:
                return


def _to_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn(*args)`` on ``loop``'s thread, soon (from the Trio thread)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _settle(future: asyncio.Future[Any], result: outcome.Outcome[Any]) -> None:
    """Hand a Trio task's outcome to its asyncio future (in the loop's thread)."""
    if future.done():
        return
    if isinstance(result, outcome.Error) and isinstance(result.error, asyncio.CancelledError):
        future.cancel()
    elif isinstance(result, outcome.Error):
        future.set_exception(result.error)
    else:
        future.set_result(result.unwrap())


def _in_a_task(loop: asyncio.AbstractEventLoop | None) -> bool:
    """Whether this runs in an asyncio task of ``loop`` (the one the block was entered
    in), so may wait: not when a task destroyed unfinished (its loop closed or gone) has
    its coroutine closed, ``GeneratorExit`` thrown in where it waited, by the garbage
    collector of whichever thread, one running a loop of its own included (whose task
    is not this coroutine's)."""
    try:
        return asyncio.get_running_loop() is loop and asyncio.current_task() is not None
    except RuntimeError:  # no running loop in this thread
        return False


async def _await_uncancelled(future: asyncio.Future[Any]) -> None:
    """Wait for ``future`` to be done, whatever cancellations the task receives meanwhile
    (the Trio side bounds how long: it is saving a cancelled turn); then re-raise one
    ``CancelledError`` if any came. The future's own error is not raised.

    Under anyio (loaded by Starlette, FastAPI, httpx), the wait is in a shielded anyio
    cancel scope: a cancelled anyio scope cancels its task again at every pass of the
    loop until the task leaves it (a client's disconnect, in Starlette), and each would
    wake this wait only for it to wait again, a busy loop for the whole save."""
    anyio = sys.modules.get("anyio")
    if anyio is None:
        cancelled = await _wait_out(future)
    else:
        with anyio.CancelScope(shield=True):
            cancelled = await _wait_out(future)
    if not future.cancelled():
        future.exception()  # retrieved: a caller that wants the outcome reads it itself
    if cancelled:
        raise asyncio.CancelledError


async def _wait_out(future: asyncio.Future[Any]) -> bool:
    """Wait for ``future`` to be done; whether a cancellation came meanwhile."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done():
                break
            cancelled = True
        except BaseException:
            break  # the future failed: its outcome is read by the caller, if wanted
    return cancelled


class AsyncHost:
    """A :class:`~runtime.app.host.Host` on its own Trio thread, used from asyncio. Create
    with :meth:`AsyncHost.open`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        """The loop that opened the host (others may use it too: each call settles on
        its caller's own loop)."""
        self._opener = threading.current_thread()
        self.host: Host
        """The Trio host. Use it only from Trio code on the host's thread
        (:meth:`call`)."""
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery
        self._stop = trio.Event()
        self._wake = trio.Event()
        """Set (on the Trio thread) when a call starts or ends, or the host is to close:
        wakes the host's main task, which otherwise sleeps (:meth:`_main`)."""
        self._left: str | None = None
        """Why the host closes without its opener leaving the block (``event loop
        closed``, ``interpreter exit``): nobody will read the streams, so the bridge
        tasks are cancelled at once, each turn saved interrupted with this reason."""
        self._thread: threading.Thread
        self._closed = False
        self._pending: set[asyncio.Future[Any]] = set()
        """The calls not settled yet, of every loop that uses the host."""

    @classmethod
    @asynccontextmanager
    async def open(cls, **options: Any) -> AsyncIterator[AsyncHost]:
        """Start a host on a new thread; takes :meth:`Host.open`'s options (``store``,
        ``idle_ttl``, ``max_sessions``, ``log_tap``...). Leaving the block cancels the
        running turns with reason ``host shutdown`` (each is saved, marked interrupted;
        its asyncio stream ends with ``abort``), closes the host and ends the thread.

        ``handle_signals`` is refused: signals reach the main thread, which belongs to
        the asyncio application (uvicorn, gunicorn); leaving the block on shutdown does
        what the host's own handler would."""
        if options.get("handle_signals"):
            raise ConfigurationError(
                "AsyncHost.open() takes no handle_signals: the asyncio application owns "
                "the signals; leaving `async with AsyncHost.open()` cancels and saves the "
                "running turns"
            )
        loop = asyncio.get_running_loop()
        host = cls(loop)
        started: asyncio.Future[None] = loop.create_future()
        finished: asyncio.Future[None] = loop.create_future()

        def run() -> None:
            result = outcome.capture(trio.run, host._main, options, started)
            _open_hosts.discard(host)
            host._abandon()
            host._to_asyncio(_settle, finished, result)
            if isinstance(result, outcome.Error):
                host._to_asyncio(_settle, started, result)

        thread = host._thread = threading.Thread(target=run, name="axon-trio-host", daemon=True)
        if not _exit_hook:
            _exit_hook.append(True)
            atexit.register(_close_at_exit)
        _open_hosts.add(host)
        thread.start()
        try:
            await started
        except BaseException:
            host._close()  # (a host still opening stops as soon as it is open)
            await _await_uncancelled(finished)
            thread.join()
            raise
        try:
            yield host
        except GeneratorExit:
            if _in_a_task(host._loop):  # an async generator's aclose(): it may wait
                await host._wind_down(finished, thread)
            else:  # the task destroyed unfinished (its loop gone): nothing can wait any
                host._close()  # more; the host's thread closes the host by itself
            raise
        except BaseException:
            await host._wind_down(finished, thread)
            raise
        await host._wind_down(finished, thread)

    async def _wind_down(self, finished: asyncio.Future[None], thread: threading.Thread) -> None:
        self._close()
        await _await_uncancelled(finished)
        thread.join()
        finished.result()  # an error closing the host comes out here

    async def _main(self, options: dict[str, Any], started: asyncio.Future[None]) -> None:
        """The Trio thread: the host, and a nursery for the calls bridged into it."""
        async with Host.open(**options) as host, trio.open_nursery() as nursery:
            self.host = host
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            if self._closed:  # the opener left while the host was opening
                self._stop.set()
            self._loop.call_soon_threadsafe(_settle, started, outcome.Value(None))
            while not self._stop.is_set():
                wake = self._wake = trio.Event()
                if nursery.child_tasks:  # calls in flight: look at the loop now and then
                    with trio.move_on_after(LOOP_WATCH):
                        await wake.wait()
                else:  # idle: sleep until a call starts or the host is to close
                    await wake.wait()
                if self._left is None and self._loop_gone():
                    self._left = "event loop closed"
                if self._left is not None:
                    # Nobody can leave the block any more, or will read: close as leaving
                    # it would, and cancel the bridge tasks, whose readers are gone (each
                    # cancelled pump saves its turn interrupted, as a cancelled Trio
                    # consumer does).
                    self._closed = True
                    host.cancel_turns(self._left)
                    nursery.cancel_scope.cancel()
                    return
            host.cancel_turns("host shutdown")
            # Consumers that keep reading get the rest (their abort chunks); the bridge
            # tasks of those that do not are cancelled after the bound.
            nursery.cancel_scope.deadline = trio.current_time() + FINAL_WAIT

    def _stop_soon(self) -> None:
        """On the Trio thread: end :meth:`_main`'s watch, closing the host."""
        self._stop.set()
        self._wake.set()

    def _loop_gone(self) -> bool:
        """Whether the loop that opened the host is closed, or stopped with its thread
        ended: then nothing will ever leave ``async with AsyncHost.open()``."""
        return _gone(self._loop, self._opener)

    def _leave(self, reason: str) -> None:
        """Close the host for good from any thread, its readers gone (``reason``: the
        abort reason of the running turns), as :meth:`_close` does for its opener."""
        self._left = reason
        self._closed = True
        if self._token is not None:  # (else the host stops as soon as it is open)
            with contextlib.suppress(HostClosed):  # the run is over already
                self._submit(self._stop_soon)

    def _close(self) -> None:
        """Stop the host (from the opener's thread). Before the Trio side has its token,
        ``_closed`` tells it, once open, to stop at once: it sets the token, then reads
        ``_closed``; this sets ``_closed``, then reads the token."""
        if not self._closed:
            self._closed = True
            if self._token is not None:
                with contextlib.suppress(HostClosed):  # the run is over already
                    self._submit(self._stop_soon)

    def _abandon(self) -> None:
        """The Trio run ended (on its thread): nothing will settle the calls still
        waiting, on whichever loop they wait."""
        for future in list(self._pending):
            error = HostClosed("the host's Trio thread ended")
            _to_loop(future.get_loop(), _settle, future, outcome.Error(error))

    def _submit(self, fn: Callable[[], object]) -> None:
        """Run the synchronous ``fn`` on the Trio thread, soon (from any thread). An
        exception it raises is logged: raised there, it would crash the Trio run."""
        if self._token is None:
            raise HostClosed("the host is not open")

        def guarded() -> None:
            try:
                fn()
            except Exception:
                log_exception(get_logger("axon.aio"), "aio.callback-failed")

        try:
            self._token.run_sync_soon(guarded)
        except trio.RunFinishedError:
            raise HostClosed("the host is closed") from None

    def _to_asyncio(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the opening loop's thread, soon (from the Trio thread)."""
        _to_loop(self._loop, fn, *args)

    def _spawn(
        self, afn: Callable[..., Awaitable[T]], *args: Any
    ) -> tuple[asyncio.Future[T], trio.CancelScope]:
        """Start ``afn(*args)`` as a Trio task in a cancel scope of its own; its outcome
        settles the returned future. The task cancelled through ``scope`` (by the asyncio
        side) cancels the future; cancelled by the host's closing, it fails with
        :class:`HostClosed`. The future belongs to the caller's running loop, whichever
        that is: a host opened by one loop serves the others too."""
        if self._closed:
            raise HostClosed("the host is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        scope = trio.CancelScope()

        async def task() -> None:
            result: outcome.Outcome[T] = outcome.Error(asyncio.CancelledError())
            try:
                with scope:
                    result = await outcome.acapture(afn, *args)
            finally:
                if len(self._nursery.child_tasks) == 1:  # the last call in flight:
                    self._wake.set()  # the host's main task sleeps from now on
                if isinstance(result, outcome.Error) and isinstance(result.error, trio.Cancelled):
                    if scope.cancel_called:
                        result = outcome.Error(asyncio.CancelledError())
                    else:
                        result = outcome.Error(HostClosed("the host closed"))
                _to_loop(loop, _settle, future, result)

        def start() -> None:
            try:
                self._nursery.start_soon(task)
                if len(self._nursery.child_tasks) == 1:  # the first call in flight: the
                    self._wake.set()  # host's main task watches the loop meanwhile
            except RuntimeError:  # the nursery is closed: the host is closing
                _to_loop(loop, _settle, future, outcome.Error(HostClosed("the host closed")))

        self._submit(start)
        return future, scope

    async def call(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Await ``afn(*args)`` run as a Trio task on the host's thread: the way to
        anything of the Trio API this class does not wrap (``afn`` may use
        :attr:`host`). Cancelling the asyncio task cancels the Trio task and waits for it
        to end; its exception is raised here as itself."""
        future, scope = self._spawn(afn, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                with contextlib.suppress(HostClosed):  # else the host's close cancels it
                    self._submit(scope.cancel)
                await _await_uncancelled(future)
            raise

    async def open_session(
        self,
        agent: Agent,
        session_id: str | None = None,
        *,
        meta: dict[str, Any] | None = None,
        deps: Any = None,
        history: Sequence[Message] | None = None,
        on_busy: OnBusy | None = None,
    ) -> AsyncSession:
        """:meth:`Host.open_session <runtime.app.host.Host.open_session>`, from asyncio."""

        async def open_it() -> Session:
            return await self.host.open_session(
                agent, session_id, meta=meta, deps=deps, history=history, on_busy=on_busy
            )

        return AsyncSession(self, await self.call(open_it))


class AsyncSession:
    """A :class:`~runtime.app.session.Session` used from asyncio (``host.open_session``)."""

    def __init__(self, host: AsyncHost, session: Session) -> None:
        self.host = host
        self.session = session
        """The Trio session. Use it only from Trio code (:meth:`AsyncHost.call`)."""

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def messages(self) -> tuple[Message, ...]:
        """The history as last published (an immutable snapshot; see
        :attr:`Session.messages <runtime.app.session.Session.messages>`)."""
        return self.session.messages

    def stream(self, input: UserInput, **options: Any) -> AsyncTurnStream:
        """Start a turn for ``input``: ``async with session.stream(text) as out``, then
        ``async for chunk in out``. Takes :meth:`Session.stream
        <runtime.app.session.Session.stream>`'s options (``regenerate``, ``turn_id``,
        ``message_id``, ``resume``, ``on_busy``); its errors are raised on entering the
        block."""
        return AsyncTurnStream(self, lambda: self.session.stream(input, **options))

    async def run(self, input: UserInput) -> TurnResult:
        """Run a whole turn and return its result (:meth:`Session.run
        <runtime.app.session.Session.run>`). Cancelling the asyncio task cancels the turn,
        which is saved interrupted before the ``CancelledError`` goes on."""
        return await self.host.call(self.session.run, input)

    @property
    def pending(self) -> tuple[PendingCall, ...]:
        """The calls the session's last turn waits for (docs/approval.md)."""
        return self.session.pending

    async def decide(self, id: str, **decision: Any) -> Recorded:
        """Record a decision for a waiting call without resuming (:meth:`Session.decide
        <runtime.app.session.Session.decide>`: ``approved``/``reason`` or ``output``/``error``)."""
        return await self.host.call(functools.partial(self.session.decide, id, **decision))

    def resume(self) -> AsyncTurnStream:
        """The continuation of a turn whose waiting calls are all decided:
        ``async with session.resume() as out`` (:meth:`Session.resume
        <runtime.app.session.Session.resume>`)."""
        return AsyncTurnStream(self, self.session.resume)

    async def respond(self, id: str, **decision: Any) -> TurnResult | None:
        """:meth:`decide`, then, if that decided the last waiting call, the continuation
        run to its end (:meth:`Session.respond <runtime.app.session.Session.respond>`)."""
        return await self.host.call(functools.partial(self.session.respond, id, **decision))

    async def close(self) -> None:
        """Stop the session's actors (after any running turn ends)."""
        await self.host.call(self.session.close)


class AsyncTurnStream:
    """One turn as an asyncio consumer sees it: an async iterator of output chunks, fed
    by a Trio task that reads the :class:`~runtime.app.session.TurnStream` in batches, one
    batch ahead at most. After the block, :attr:`result` holds the turn's result.

    The hand-off is a deque and a credit flag under a lock, shared by the two threads. A
    side wakes the other (a write to its loop's wake-up pipe) only when that side is
    parked waiting: while both keep up, a batch crosses with no system call at all.
    """

    def __init__(self, session: AsyncSession, open_stream: Callable[[], TurnStream]) -> None:
        self._host = session.host
        self._open_stream = open_stream
        """Makes the Trio stream, on the Trio thread (``session.stream(...)``; any other
        :class:`~runtime.app.session.TurnStream` maker bridges the same way)."""
        self.result: TurnResult | None = None
        """Set when the turn is over (after the ``async with`` block at the latest)."""
        self.turn_id: str | None = None
        self._trio: TurnStream | None = None
        self._lock = threading.Lock()
        self._credit = True
        """Whether the Trio side may hand over a batch (taken by a hand-off, given back
        when the asyncio side takes it)."""
        self._credit_waiter: trio.Event | None = None
        """Set while the Trio side is parked waiting for the credit."""
        self._reader_parked = False
        """Whether the asyncio side is parked on :attr:`_wakeup`."""
        self._started: asyncio.Future[str] | None = None
        self._finished: asyncio.Future[TurnResult | None] | None = None
        self._scope: trio.CancelScope | None = None
        self._reading: deque[OutputChunk] = deque()
        self._waiting: deque[list[OutputChunk]] = deque()
        """Batches handed over and not taken: one at most (one batch of credit)."""
        self._wakeup: asyncio.Future[None] | None = None
        self._receiving = False
        """Whether a task waits for a batch (as :class:`~runtime.app.session.TurnStream`,
        a second reader meanwhile is refused)."""
        self._ended = False
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop of the task that entered the block: where the chunks are read."""
        self._reader: threading.Thread | None = None
        """The thread that runs :attr:`_loop`."""

    # -- the Trio side -----------------------------------------------------------------

    async def _pump(self) -> TurnResult | None:
        """On the Trio thread: run the turn and hand its chunks over in batches."""
        assert self._started is not None
        stream = self._open_stream()
        async with stream as out:
            self._trio = out
            _to_loop(self._started.get_loop(), _settle, self._started, outcome.Value(out.turn_id))
            while True:
                batch = await out.next_batch(HANDOFF_MOST)
                if not await self._take_credit():
                    await _let_upstream_run()
                # and what came while the consumer read the batch before
                batch += out.take_ready(HANDOFF_MOST - len(batch))
                self._hand_over(batch)
                if not batch:
                    break
        return out.result

    async def _take_credit(self) -> bool:
        """Wait for the credit to hand a batch over; whether that meant waiting. While
        it waits, the reader's loop is looked at every :data:`LOOP_WATCH` seconds: a
        reader whose loop is closed, or stopped with its thread ended, will never give
        the credit back, and the turn ends as for a cancelled reader (reason ``event
        loop closed``, saved interrupted) instead of waiting for ever."""
        with self._lock:
            if self._credit:
                self._credit = False
                return False
            waiter = self._credit_waiter = trio.Event()
        while True:
            with trio.move_on_after(LOOP_WATCH):
                await waiter.wait()  # the reader gives the credit straight to us
                return True
            assert self._loop is not None and self._reader is not None
            if _gone(self._loop, self._reader):
                assert self._trio is not None and self._scope is not None
                self._trio.cancel("event loop closed")
                self._scope.cancel()
                await trio.lowlevel.checkpoint()  # (raises Cancelled)

    def _hand_over(self, batch: list[OutputChunk]) -> None:
        with self._lock:
            self._waiting.append(batch)
            parked, self._reader_parked = self._reader_parked, False
        if parked:
            assert self._loop is not None
            _to_loop(self._loop, self._wake)

    # -- the asyncio side --------------------------------------------------------------

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _pump_ended(self, finished: asyncio.Future[Any]) -> None:
        """The Trio side is done: wake a waiting reader, and fail the entry if the turn
        never started (with the pump's error, its cancellation, or :class:`HostClosed`)."""
        self._wake()
        started = self._started
        if started is None or started.done():
            return
        if finished.cancelled():
            started.cancel()
        else:
            started.set_exception(finished.exception() or HostClosed("the turn never started"))

    async def __aenter__(self) -> AsyncTurnStream:
        if self._started is not None:  # (it ran the same input again as another turn)
            raise SessionError(
                "this stream has run its turn already: call session.stream(...) again for another"
            )
        loop = self._loop = asyncio.get_running_loop()
        self._reader = threading.current_thread()
        self._started = loop.create_future()
        self._finished, self._scope = self._host._spawn(self._pump)
        self._finished.add_done_callback(self._pump_ended)
        try:
            self.turn_id = await asyncio.shield(self._started)
        except asyncio.CancelledError:
            self._stop("cancelled")
            await _await_uncancelled(self._finished)
            raise
        except BaseException:
            await _await_uncancelled(self._finished)
            raise
        return self

    def _stop(self, reason: str) -> None:
        """Cancel the turn with ``reason`` and stop the Trio side's reading."""
        scope = self._scope

        def stop() -> None:
            if self._trio is not None:
                self._trio.cancel(reason)
            assert scope is not None
            scope.cancel()

        with contextlib.suppress(HostClosed):  # else the host's own close cancelled the turn
            self._host._submit(stop)

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the turn: it ends with an ``abort`` chunk carrying ``reason``."""
        out = self._trio
        if out is not None:  # a closed host has ended the turn: nothing to stop (as in Trio)
            with contextlib.suppress(HostClosed):
                self._host._submit(lambda: out.cancel(reason))

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        finished = self._finished
        assert finished is not None
        if exc_type is GeneratorExit and not _in_a_task(self._loop):
            # the task destroyed unfinished (its loop gone): nothing can wait any more
            if not self._ended:
                self._stop("event loop closed")
            return
        if not self._ended:
            if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
                self._stop("cancelled")
            elif exc_type is not None:
                self._stop(f"consumer failed: {exc_type.__name__}")
            else:
                self._stop("consumer left the stream")
        await _await_uncancelled(finished)
        if not finished.cancelled() and finished.exception() is None:
            self.result = finished.result()
        elif self._trio is not None:
            self.result = self._trio.result

    def __aiter__(self) -> AsyncTurnStream:
        return self

    async def __anext__(self) -> OutputChunk:
        reading = self._reading
        if reading:
            return reading.popleft()
        # One pass of the event loop per batch, as a Trio consumer checkpoints per batch:
        # while the Trio side keeps a batch ready, the reader would never suspend, and
        # the loop's other tasks (other requests, a disconnect's callback) would starve.
        finished = self._finished
        if finished is None:  # (an AssertionError)
            raise SessionError(
                "a stream runs its turn once entered: async with session.stream(...) as "
                "out: async for chunk in out: ..."
            )
        if self._receiving:
            raise SessionError(
                "another task is reading this stream: each chunk goes to one reader, so "
                "two would each miss some; read it in one task and hand the chunks on "
                "(an asyncio.Queue per listener)"
            )
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # (its wake-ups go to the entering loop)
            raise SessionError(
                "this stream is read by another event loop than the one that entered its "
                "block: read it in a task of that loop (and hand the chunks on, to another "
                "thread's loop with call_soon_threadsafe)"
            )
        self._receiving = True
        try:
            return await self._receive(reading, finished, loop)
        finally:
            self._receiving = False

    async def _receive(
        self,
        reading: deque[OutputChunk],
        finished: asyncio.Future[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> OutputChunk:
        """Wait for the next batch (one reader at a time: a second one parked over the
        first would leave it waiting for ever)."""
        await asyncio.sleep(0)
        while True:
            with self._lock:
                batch = self._waiting.popleft() if self._waiting else None
                if batch is not None:
                    waiter, self._credit_waiter = self._credit_waiter, None
                    self._credit = waiter is None
                elif not finished.done():
                    self._reader_parked = True
                    wakeup = self._wakeup = loop.create_future()
            if batch is not None:
                if waiter is not None:
                    with contextlib.suppress(HostClosed):
                        self._host._submit(waiter.set)
                if not batch:
                    self._ended = True
                    raise StopAsyncIteration
                reading.extend(batch)
                return reading.popleft()
            if finished.done():  # the Trio side ended without the end of the stream
                self._ended = True
                if not finished.cancelled() and finished.exception() is not None:
                    raise finished.exception()  # type: ignore[misc]
                raise StopAsyncIteration
            await wakeup

    async def collect(self) -> list[OutputChunk]:
        """Every remaining chunk of the turn, as a list."""
        return [chunk async for chunk in self]
