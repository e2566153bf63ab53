"""Bounded inboxes with an overflow policy.

An actor owns one inbox and handles one message at a time. The policy decides what a
full inbox does to its sender:

* ``"block"``: the sender waits (backpressure). For actors on the critical path.
* ``"drop-oldest"``: the oldest message is discarded and the receiver is later handed a
  :class:`~runtime.events.Lagged` notice saying how many it missed. For observers, so a
  slow UI or logger never stalls an agent.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, Literal, Protocol, TypeVar

import trio
from outcome import Error, Value
from trio.lowlevel import Task

from runtime import lifecycle  # Lagged, on the first drop (runtime/lifecycle.py)

OverflowPolicy = Literal["block", "drop-oldest"]
T = TypeVar("T")
D = TypeVar("D")
_now = time.perf_counter


class Inbox(Generic[T]):
    """A bounded queue of messages of type ``T`` for one actor (or one bus subscriber).

    Generic like the Trio memory channel it behaves as (``Inbox[SaveResult]``), so a
    reader and a type checker can follow what travels where. Under ``drop-oldest`` the
    receiver may also get a :class:`~runtime.events.Lagged` notice (see :meth:`get`).

    It is a deque and, only while a task waits, a table of waiting tasks, with the
    semantics of a Trio memory channel of ``capacity`` (the same errors, the same
    checkpoints): a memory channel is eight tracked objects (its state, both ends, two
    tables of waiting tasks, two sets, the deque), six of them per turn in flight, and
    with ten thousand turns in flight every full garbage collection walked them all
    (issue 24 item 5). The deque and the tables are made on first use, and :meth:`park`
    drops them while nothing is queued or waiting: an idle session's inboxes cost a
    small object each, also after its turns (six tables a session otherwise stayed).
    """

    __slots__ = (
        "_buffer",
        "_closed",
        "_getters",
        "_putters",
        "_receiver_closed",
        "capacity",
        "dropped",
        "name",
        "policy",
    )

    def __init__(
        self, capacity: int = 256, policy: OverflowPolicy = "block", *, name: str = "inbox"
    ) -> None:
        if policy not in ("block", "drop-oldest"):
            raise ValueError(f"unknown overflow policy {policy!r}")
        if capacity < 1:
            raise ValueError("an inbox needs a capacity of at least 1")
        self.name = name
        self.capacity = capacity
        self.policy: OverflowPolicy = policy
        self.dropped = 0
        self._closed = False
        self._receiver_closed = False
        self._buffer: deque[T] | None = None
        self._getters: OrderedDict[Task, None] | None = None
        """Tasks waiting in :meth:`get`, first come first served (only while any waits)."""
        self._putters: OrderedDict[Task, T] | None = None
        """Tasks waiting in :meth:`put` for room, with what each brings."""

    def park(self) -> bool:
        """Drop the deque if it is empty and no task waits (the next message makes a new
        one); whether the inbox is parked now. A closed inbox, or one whose receiver is
        closed or owes a :class:`Lagged` notice, is not parked."""
        if self._closed or self._receiver_closed or self.dropped:
            return False
        if self._buffer or self._getters or self._putters:
            return False
        self._buffer = self._getters = self._putters = None  # a waiter makes a new table
        return True

    @property
    def parked(self) -> bool:
        """Whether the inbox holds no queue now (never used, or :meth:`park` ed)."""
        return (
            self._buffer is None
            and not self._getters
            and not self._putters
            and not (self._closed or self._receiver_closed or self.dropped)
        )

    # -- sending -----------------------------------------------------------------------

    async def put(self, message: T) -> None:
        """Deliver ``message``; waits for room only under the ``block`` policy.

        Under ``block`` this does not yield when there is room: a producer keeps going
        and the consumer picks up whatever has accumulated in one go (batching).
        """
        try:
            self._deliver(message)
        except trio.WouldBlock:
            if self.policy != "block":
                self._drop_one_and_put(message)
                return
            await self._wait_for_room(message)

    def would_wait(self) -> bool:
        """Whether :meth:`put` would wait now: a ``block`` inbox, open, full, with no
        receiver waiting (any other :meth:`put` delivers, drops or raises at once)."""
        buffer = self._buffer
        return (
            self.policy == "block"
            and buffer is not None
            and len(buffer) >= self.capacity
            and not self._getters
            and not self._closed
            and not self._receiver_closed
        )

    def put_nowait(self, message: T) -> None:
        """Deliver without waiting: drops the oldest under ``drop-oldest``, raises
        :class:`trio.WouldBlock` when a ``block`` inbox is full."""
        try:
            self._deliver(message)
        except trio.WouldBlock:
            if self.policy == "block":
                raise
            self._drop_one_and_put(message)

    def put_over(self, message: T) -> None:
        """Deliver without waiting, past the capacity if the inbox is full: behind the
        messages of the senders waiting for room (each let through, so the order holds),
        which makes the inbox hold at most that many and one more. For a message that
        must arrive whoever reads late (a turn's end, :meth:`Batcher.send_over`)."""
        try:
            self._deliver(message)
        except trio.WouldBlock:
            buffer = self._buffer
            assert buffer is not None  # (full, so made)
            putters = self._putters
            while putters:
                task, waiting = putters.popitem(last=False)
                trio.lowlevel.reschedule(task)
                buffer.append(waiting)
            buffer.append(message)

    def _deliver(self, message: T) -> None:
        """A memory channel's ``send_nowait``: to a waiting receiver, else into the deque."""
        if self._closed:
            raise trio.ClosedResourceError
        if self._receiver_closed:
            raise trio.BrokenResourceError
        getters = self._getters
        if getters:
            task, _ = getters.popitem(last=False)
            trio.lowlevel.reschedule(task, Value(message))
            return
        buffer = self._buffer
        if buffer is None:
            buffer = self._buffer = deque()
        if len(buffer) >= self.capacity:
            raise trio.WouldBlock
        buffer.append(message)

    async def _wait_for_room(self, message: T) -> None:
        """A memory channel's ``send`` once the deque is full: wait in line."""
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        putters = self._putters
        if putters is None:
            putters = self._putters = OrderedDict()
        putters[task] = message

        def abort(_: Any) -> trio.lowlevel.Abort:
            del putters[task]
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _drop_one_and_put(self, message: T) -> None:
        buffer = self._buffer
        if buffer:
            buffer.popleft()
            self.dropped += 1
        self._deliver(message)

    # -- receiving ---------------------------------------------------------------------

    async def get(self) -> T:
        """The next message; a :class:`Lagged` notice first if messages were dropped
        (typed as ``T``: only a ``drop-oldest`` inbox ever returns one, and its readers
        are observers that take any event)."""
        if self.dropped:
            return self._lagged()
        await trio.lowlevel.checkpoint_if_cancelled()
        if not (self._buffer or self._putters or self._closed or self._receiver_closed):
            # Nothing to take: wait, without :meth:`_take`'s ``WouldBlock``. Why asked
            # first: an actor waits on its empty inbox ~18 times a turn, and an exception
            # raised and caught each time cost ~2,500 instructions (issue 24 goal 1).
            return await self._wait()
        message = self._take()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return message

    async def take(self) -> T:
        """:meth:`get` without its schedule point when a message is already waiting
        (cancellation is still checked): for a receiver whose handling of the message
        waits anyway (the turn runner's turn), or that ends with it (a turn's consumer
        taking the turn's result). Each such schedule point is a task step and a round
        of the scheduler more per turn (issue 24 goal 1). Not for a loop over a backlog:
        it would run the whole backlog in one step, the other tasks waiting."""
        if self.dropped:
            return self._lagged()
        await trio.lowlevel.checkpoint_if_cancelled()
        if not (self._buffer or self._putters or self._closed or self._receiver_closed):
            return await self._wait()  # (see get)
        return self._take()

    async def _wait(self) -> T:
        """Wait in line for the next message (the queue is empty)."""
        task = trio.lowlevel.current_task()
        getters = self._getters
        if getters is None:
            getters = self._getters = OrderedDict()
        getters[task] = None

        def abort(_: Any) -> trio.lowlevel.Abort:
            del getters[task]
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    def get_nowait(self) -> T:
        if self.dropped:
            return self._lagged()
        return self._take()

    def poll(self, default: D) -> T | D:
        """:meth:`get_nowait`, or ``default`` where it would raise :class:`trio.WouldBlock`
        (nothing waiting, the inbox open at both ends). For a receiver that looks without
        waiting, often at an empty inbox: the exception raised and caught cost ~2,500
        instructions each time (issue 24 goal 1)."""
        if not (self.dropped or self._buffer or self._putters or self._closed):
            if not self._receiver_closed:
                return default
        return self.get_nowait()

    def _take(self) -> T:
        """A memory channel's ``receive_nowait``: the oldest message, a waiting sender's
        message moving up into the deque."""
        if self._receiver_closed:
            raise trio.ClosedResourceError
        buffer = self._buffer
        putters = self._putters
        if putters:
            task, waiting = putters.popitem(last=False)
            trio.lowlevel.reschedule(task)
            if buffer is None:  # pragma: no cover - a sender waits only on a full deque
                buffer = self._buffer = deque()
            buffer.append(waiting)
        if buffer:
            return buffer.popleft()
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    def discard(self, unwanted: Callable[[T], bool]) -> int:
        """Take the queued messages ``unwanted`` says yes to out of the queue, and those of
        senders waiting for room (whose puts then return, as delivered); how many. The
        others keep their order, and waiting senders' move up into the room made. For
        what nobody will read: a model call cancelled by its turn left batches in the
        engine's inbox (its provider's puts with room do not yield, so one may come after
        the cancel) and in the runner's stream inbox (the engine waiting for room there),
        kept, unread, by an idle session until its next call. An inbox left empty is
        parked."""
        buffer, putters = self._buffer, self._putters
        if not buffer and not putters:
            return 0
        kept: deque[T] = deque(m for m in buffer or () if not unwanted(m))
        n = len(buffer or ()) - len(kept)
        if not n and (not putters or not unwanted(next(iter(putters.values())))):
            return 0  # (a sender waits only on a full queue: nothing moves up)
        while putters:
            task, waiting = next(iter(putters.items()))
            if unwanted(waiting):
                n += 1
            elif len(kept) < self.capacity:
                kept.append(waiting)
            else:
                break
            del putters[task]
            trio.lowlevel.reschedule(task)
        self._buffer = kept
        if not kept:
            self.park()
        return n

    def drain_nowait(self, into: list[T], limit: int = 4096) -> None:
        """Append every message already waiting (up to ``limit``) to ``into``."""
        if self._buffer is None and not self._putters:
            return
        try:
            for _ in range(limit):
                into.append(self._take())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            pass

    def _lagged(self) -> T:
        n, self.dropped = self.dropped, 0
        return lifecycle.Lagged(subscriber=self.name, dropped=n)  # type: ignore[return-value]

    def close(self) -> None:
        """No more messages will be accepted; the receiver ends after draining."""
        if self._closed:
            return
        self._closed = True
        putters, self._putters = self._putters, None
        for task in putters or ():
            trio.lowlevel.reschedule(task, Error(trio.ClosedResourceError()))
        getters, self._getters = self._getters, None
        for task in getters or ():
            trio.lowlevel.reschedule(task, Error(trio.EndOfChannel()))

    def close_receiver(self) -> None:
        """The receiver is gone: further sends raise :class:`trio.BrokenResourceError`."""
        if self._receiver_closed:
            return
        self._receiver_closed = True
        getters, self._getters = self._getters, None
        for task in getters or ():
            trio.lowlevel.reschedule(task, Error(trio.ClosedResourceError()))
        putters, self._putters = self._putters, None
        for task in putters or ():
            trio.lowlevel.reschedule(task, Error(trio.BrokenResourceError()))
        self._buffer = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: the inbox accepts no more messages."""
        return self._closed

    def __aiter__(self) -> Inbox[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.get()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def __len__(self) -> int:
        buffer = self._buffer
        return 0 if buffer is None else len(buffer)

    def last(self) -> T | None:
        """The newest message waiting to be taken, if any (not taken)."""
        buffer = self._buffer
        return buffer[-1] if buffer else None


# -- streams between actors: batches -------------------------------------------------


class Batch(list[T]):
    """A list of stream items sent as one inbox message; ``tag`` says which request."""

    __slots__ = ("tag", "taken")

    def __init__(self, tag: Any) -> None:
        super().__init__()
        self.tag = tag
        self.taken = False


MAX_BATCH = 128
"""Most items one :class:`Batch` carries. A receiver that does not keep up then finds its
inbox full of full batches, and the bounded inbox makes the sender wait: backpressure
reaches the producer instead of the whole stream piling up in one batch.

128, not 64 (issue 24 goal 1): a batch costs each stage it crosses an inbox put, a get
and a scheduler round, and a fast stream fills its batches (one network read holds
70-150 deltas), so twice the items a batch halves those per delta. The inboxes that
carry chunk batches (the engine's, its output, the stream controller's, a turn's
consumer) were halved with it, so what a stalled receiver can hold up, capacity times
``MAX_BATCH``, did not grow."""

MAX_RUN = 512
"""Most text deltas one :class:`Batch` of :class:`~runtime.provider.TextRun` s carries
(still at most :data:`MAX_BATCH` items): a run's deltas are strings, not objects, until
the stream controller makes each its ``text-delta`` chunk, which it does
:data:`MAX_BATCH` at a time with a schedule point between (so no more chunk objects are
in flight at a young collection than before). Why (issue 24 goal 1): each batch costs
the provider a yield and each stage it crosses (engine, turn runner, controller) an
inbox put, a get and a scheduler round, ~0.2 us a delta of a fast stream at 128 deltas
a batch. The inboxes that carry such batches hold a quarter of the batches they did, so
what a stalled receiver can hold up, capacity times the deltas of a batch, did not
grow."""


class BatchSink(Protocol[T]):
    """Where a :class:`Batcher` puts its batches: any inbox that takes ``Batch[T]``
    (a consumer's inbox also takes its :class:`~runtime.actor_messages.TurnDone`)."""

    async def put(self, message: Batch[T]) -> None: ...

    def put_nowait(self, message: Batch[T]) -> None: ...

    def put_over(self, message: Batch[T]) -> None: ...


class Batcher(Generic[T]):
    """Sends items to an inbox in :class:`Batch` es, merging what is not yet received.

    A batch takes at most ``max_items`` items (:data:`MAX_BATCH`); past that the next
    item opens a new batch, so what a stalled receiver holds up is bounded by its inbox's
    capacity times ``max_items``, and the sender blocks (under the ``block`` policy).

    With ``max_hold``, the sender yields to the scheduler right after its first batch
    and then whenever the receiver has left a batch waiting that long (seconds): a
    producer that parses a large buffered burst (a whole SSE body in one network read)
    would otherwise hold its first delta back until it has parsed the last one. Each
    time it yields ``hold_rounds`` scheduler rounds in a row, because a stage downstream
    runs one round after the stage before it: with one round, the batch moved one stage
    per ``max_hold`` of parsing (the first delta of a burst reached the consumer about
    10 ms late through four stages); with as many rounds as there are stages it reaches
    the consumer before parsing resumes. Yielding by time, not by count, costs at most
    ``hold_rounds`` scheduler rounds per ``max_hold``, however small the deltas.

    A batch becomes the one to append to only once the inbox accepted it: a put that is
    cancelled while waiting for room leaves nothing behind that later items could be
    appended to and lost with.
    """

    __slots__ = ("_pending", "_sealed", "_since", "hold_rounds", "inbox", "max_hold", "tag")

    max_items: int = MAX_BATCH

    def __init__(
        self,
        inbox: BatchSink[T],
        tag: Any = None,
        *,
        max_hold: float | None = None,
        hold_rounds: int = 1,
    ) -> None:
        self.inbox = inbox
        self.tag = tag
        self.max_hold = max_hold
        self.hold_rounds = hold_rounds
        self._pending: Batch[T] | None = None
        self._sealed = False  # the waiting batch holds runs: nothing joins it
        self._since = 0.0

    async def send(self, item: T) -> None:
        pending = self._pending
        if (
            pending is not None
            and not pending.taken
            and len(pending) < self.max_items
            and not self._sealed
        ):
            pending.append(item)
            if self.max_hold is not None and _now() - self._since > self.max_hold:
                await self._yield()
            return
        first = self._pending is None
        batch: Batch[T] = Batch(self.tag)
        batch.append(item)
        await self.inbox.put(batch)
        self._pending = batch
        self._sealed = False
        if self.max_hold is not None:
            if first:
                await self._yield()  # the first delta goes through before parsing goes on
            self._since = _now()

    __call__ = send
    """A batcher is a provider's ``emit`` (:data:`runtime.provider.Emit`), which also
    offers :meth:`send_all` to a provider that parses a network read at a time."""

    async def _yield(self) -> None:
        for _ in range(self.hold_rounds):
            await trio.lowlevel.checkpoint()
        self._since = _now()

    async def send_all(self, items: Sequence[T], *, whole: bool = False) -> None:
        """:meth:`send` for each of ``items``, in one go; with ``max_hold``, the same
        yields (after the first batch, and when the receiver left a batch waiting).

        ``whole``: ``items`` hold more than one stream item each (a
        :class:`~runtime.provider.TextRun` of up to :data:`MAX_RUN` deltas), so they go
        in batches of their own, never merged with a waiting batch nor it with them: a
        batch then carries one producer's batch, and what a stalled receiver holds up is
        still its capacity times about :data:`MAX_RUN` deltas, not that many runs."""
        if not items:
            return
        limit = self.max_items
        pending = self._pending
        first = pending is None
        if whole:
            pending = None  # nothing joins the waiting batch...
        if pending is not None and not pending.taken and not self._sealed:
            room = limit - len(pending)
            if len(items) <= room:
                pending.extend(items)
                if self.max_hold is not None and _now() - self._since > self.max_hold:
                    await self._yield()
                return
            if room > 0:
                pending.extend(items[:room])
                items = items[room:]
        for start in range(0, len(items), limit):
            batch: Batch[T] = Batch(self.tag)
            batch.extend(items[start : start + limit])
            await self.inbox.put(batch)
            self._pending = batch
        self._sealed = whole  # ...and nothing joins a batch of runs
        if self.max_hold is not None:
            if first:
                await self._yield()  # the first delta goes through before parsing goes on
            self._since = _now()

    async def send_over(self, items: Sequence[T], wait: float) -> bool:
        """``items`` in one batch of their own, once the inbox has room or, after
        ``wait`` seconds (shielded), past its capacity (:meth:`Inbox.put_over`): what
        must reach the receiver behind everything sent before, however late it reads (a
        turn's end, whose consumer stopped reading while the pipeline was full). Whether
        it went within the capacity."""
        batch: Batch[T] = Batch(self.tag)
        batch.extend(items)
        self._pending, self._sealed = batch, True
        with trio.move_on_after(wait, shield=True):
            await self.inbox.put(batch)
            return True
        self.inbox.put_over(batch)
        return False

    def recall(self, inbox: Inbox[Any]) -> int:
        """This batcher's batches that their receiver has not taken, out of ``inbox``
        (the inbox behind :attr:`inbox`, which may wrap it) again
        (:meth:`Inbox.discard`): what a cancelled sender put for nobody. How many."""
        tag = self.tag
        n = inbox.discard(lambda m: isinstance(m, Batch) and m.tag == tag and not m.taken)
        if n:
            self._pending = None
        return n

    def mark(self) -> tuple[Batch[T] | None, int]:
        """What changes whenever an item is sent: the batch items go to and its length.
        Two marks that differ say something was sent between them; a watchdog compares
        them (a provider's idle deadline, :meth:`runtime.provider.Provider.serve`) where
        counting each item would cost every send. The batch itself is held, not its id,
        so a new batch is never taken for one freed since."""
        pending = self._pending
        return pending, 0 if pending is None else len(pending)

    def try_send_all(self, items: Sequence[T]) -> bool:
        """:meth:`send_all` if it would not wait: the same items in the same batches,
        and ``True``; else (a full ``block`` inbox, or ``max_hold``, which yields) nothing
        sent and ``False``. :meth:`send_all` does not yield while the inbox has room, so
        a caller that bounds the wait (a cancel scope with a deadline) can skip entering
        the scope when nothing would wait: a turn's end sends this way (the scope costs
        about 10 us, the send a fraction of it)."""
        if self.max_hold is not None:
            return False
        if not items:
            return True
        limit = self.max_items
        pending = self._pending
        if pending is None or pending.taken or self._sealed:
            room = 0
        else:
            room = limit - len(pending)
        rest = items[room:] if room > 0 else items
        if len(rest) > limit:
            return False  # more than one new batch: the second could wait
        if rest:
            batch: Batch[T] = Batch(self.tag)
            batch.extend(rest)
            try:
                self.inbox.put_nowait(batch)
            except trio.WouldBlock:
                return False  # (nothing changed yet)
        if room > 0 and pending is not None:
            pending.extend(items[:room])
        if rest:
            self._pending = batch
            self._sealed = False
        return True
