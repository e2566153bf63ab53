"""A queued turn's output as a worker deployment's front end gets it, for any protocol.

In the embedded app a protocol adapter (the OpenAI endpoint, AG-UI, A2A) reads a turn's
output chunks from ``session.stream`` and encodes them its own way. A front end of a
worker deployment runs no turn: it submits the turn to the queue and reads its chunks
back from the relay (:mod:`runtime.app.web.frontend`). :class:`QueuedTurnOutput` is that
same sequence of :mod:`runtime.output` chunks for a queued turn, so each adapter keeps
its encoder and only swaps its source: ``async for chunk in out``, then ``out.result``
(a :class:`~runtime.output.TurnResult` built from the turn's row and stored
message) and ``out.session.messages`` (the history after it), as a ``TurnStream`` has.

What the relay cannot give is made up the way the AI SDK endpoint does: until a worker
claims the turn there is nothing to read (the front end's
:class:`~runtime.app.web.watch.TurnWatch` waits for its row to move); a turn that ended
without a stream (cancelled while queued, failed before it streamed) ends with ``abort``
or ``error``; a turn whose stream the relay lost is rebuilt from the stored message.

A takeover re-runs the step in flight. When the dead worker streamed any of it, the
re-run starts with a ``reset-step`` chunk (:class:`~runtime.output.ResetStep`, error kind
``Takeover``), which each protocol's encoder handles as it does a provider fallback's.
Streams written by older workers carry a relay-only marker instead
(:class:`~runtime.relay.StepRestarted`) and the re-run's own ``start-step``: the AI SDK
stream drops the step's parts with ``reset-step``, and for the other protocols
:class:`RestartFilter` passes over what the re-run repeats of what was sent (the same
text, the same calls) and sends only what is new, under the part ids the client has.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import attrs
import trio
from starlette.types import Receive, Scope, Send

from runtime import output as o
from runtime.actor_messages import TurnResult
from runtime.app.web.http import FRONT_END_CLOSING, relay_failed, store_failed
from runtime.app.web.resume import STOPPED, stored_turn_chunks
from runtime.app.web.ui_stream import DONE
from runtime.app.web.watch import POLL_FIRST, POLL_MAX, follow_turn
from runtime.app.web.writer import BodyPump, BodyWriter, Write
from runtime.approval import pending_calls
from runtime.chunks import Usage
from runtime.errors import RelayTurnGone, RelayUnavailable, StoreError
from runtime.logging import get_logger
from runtime.messages import AssistantMessage, Message, ToolMessage
from runtime.redact import redact
from runtime.relay import StepRestarted
from runtime.store import load_last_turns
from runtime.turn_queue import FINAL_STATUSES, RUNNING, WAITING, TurnStatus

_PART_STARTS = {o.TextStart: "text", o.ReasoningStart: "reasoning"}
_PART_DELTAS = {o.TextDelta: "text", o.ReasoningDelta: "reasoning"}
_PART_FINISHES = {o.TextFinish: "text", o.ReasoningFinish: "reasoning"}
_CALL_CHUNKS = (
    o.ToolInputStart,
    o.ToolInputDelta,
    o.ToolCall,
    o.ToolResult,
    o.ToolError,
    o.ToolApprovalRequest,
    o.ToolOutputDenied,
)


@attrs.define
class _Sent:
    """A text or reasoning part of the current step as the client got it."""

    kind: str
    part_id: str
    text: list[str] = attrs.Factory(list)
    finished: bool = False
    consumed: int = 0
    """During a re-run: how much of :attr:`text` the re-run has repeated so far."""


class RestartFilter:
    """Output chunks in, the chunks to send out: a step re-run by a takeover
    (:class:`~runtime.relay.StepRestarted`) sends only what it adds to what the client
    already got of that step, under the same part ids. A re-run that writes other text
    than the first run cannot take back what went out: from where they differ its own
    text follows (the stored message is the re-run's)."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._parts: list[_Sent] = []
        self._calls: dict[tuple[type, str], int] = {}
        """The call chunks sent, by kind and call id: the step of each."""
        self._step_finished = False
        self._replay: list[_Sent] | None = None
        self._at = 0
        self._ids: dict[str, _Sent] = {}

    def __call__(self, chunk: Any) -> list[Any]:
        kind = type(chunk)
        if kind is StepRestarted:
            if chunk.step == self._step:
                self._replay, self._at, self._ids = list(self._parts), 0, {}
            return []
        if kind is o.StepStart:
            if self._replay is not None and chunk.step == self._step:
                return []  # the client has this step's start
            self._step, self._parts, self._step_finished = chunk.step, [], False
            self._replay, self._ids = None, {}
            return [chunk]
        if kind is o.ResetStep:  # the step starts over (a fallback, a takeover): its parts
            self._parts, self._replay, self._ids = [], None, {}  # and calls are void
            self._calls = {k: s for k, s in self._calls.items() if s != chunk.step}
            return [chunk]
        if kind is o.StepFinish:
            if self._replay is not None and self._step_finished:
                return []
            self._step_finished = True
            return [chunk]
        if kind in _PART_STARTS:
            return self._start(chunk, _PART_STARTS[kind])
        if kind in _PART_DELTAS:
            return self._delta(chunk)
        if kind in _PART_FINISHES:
            return self._finish(chunk)
        if kind in _CALL_CHUNKS:
            key = (kind, chunk.tool_call_id)
            if key in self._calls:
                return []  # the re-run's call (same id) was sent already
            self._calls[key] = chunk.step
        return [chunk]

    def _start(self, chunk: Any, kind: str) -> list[Any]:
        replay = self._replay
        if replay is not None and self._at < len(replay) and replay[self._at].kind == kind:
            self._ids[chunk.part_id] = replay[self._at]
            self._at += 1
            return []  # the client has this part's start
        self._replay = None  # the re-run goes beyond what was sent
        self._parts.append(_Sent(kind, chunk.part_id))
        return [chunk]

    def _delta(self, chunk: Any) -> list[Any]:
        sent = self._ids.get(chunk.part_id)
        if sent is None:
            mine = next((p for p in self._parts if p.part_id == chunk.part_id), None)
            if mine is not None:
                mine.text.append(chunk.text)
            return [chunk]
        rest = "".join(sent.text)[sent.consumed :]
        text = chunk.text
        same = 0
        for a, b in zip(rest, text, strict=False):
            if a != b:
                break
            same += 1
        sent.consumed += same
        new = text[same:]
        if not new:
            return []
        sent.consumed = len("".join(sent.text)) + len(new)
        sent.text.append(new)
        return [attrs.evolve(chunk, part_id=sent.part_id, text=new)]

    def _finish(self, chunk: Any) -> list[Any]:
        sent = self._ids.get(chunk.part_id)
        if sent is None:
            mine = next((p for p in self._parts if p.part_id == chunk.part_id), None)
            if mine is not None:
                mine.finished = True
            return [chunk]
        if sent.finished:
            return []
        sent.finished = True
        return [attrs.evolve(chunk, part_id=sent.part_id)]


@attrs.frozen
class StoredSession:
    """What an encoder reads of the session once its turn is over (``out.session``):
    its messages from index ``first`` on (``0``: the whole history)."""

    id: str
    messages: tuple[Message, ...]
    first: int = 0


CUT_BY_CLOSING = f"{FRONT_END_CLOSING}; this turn goes on there, its answer saved in its session"
"""The error a stream of a protocol without a resume ends with when its front end
closes (:meth:`runtime.app.web.frontend.FrontEnd.close`): OpenAI's, AG-UI's, MCP's."""


def _error(kind: str, message: str) -> o.Error:
    return o.Error(error=o.ErrorInfo(kind=kind, message=message))


class QueuedTurnOutput:
    """The output chunks of the queued turn ``turn`` (``async for chunk in out``), read
    from the relay by the front end ``front`` (a :class:`~runtime.app.web.frontend.FrontEnd`);
    ``after_pauses`` reads only what follows the turn's ``after_pauses``-th wait for
    input (a continuation). Once the chunks end, :meth:`settle` reads how the turn ended:
    :attr:`result`, :attr:`session` and :attr:`status` (its row). :attr:`session` holds
    the turn's messages only (from its assistant message on), unless ``history`` (or
    what it returns, asked when the chunks ended) asks for the whole stored history
    (AG-UI's closing ``MESSAGES_SNAPSHOT``, sent only when the run waits for input or
    a step started over): the OpenAI, A2A and MCP answers need the turn alone, and read
    a few rows of a session of any length (they read all of it: a 5,000-message one
    1.5 MB a turn)."""

    def __init__(
        self,
        front: Any,
        turn: TurnStatus,
        *,
        after_pauses: int = 0,
        history: bool | Callable[[], bool] = False,
    ) -> None:
        self.front = front
        self.turn = turn
        self.turn_id = turn.turn_id
        self.session_id = turn.session_id
        self.message_id = turn.message_id
        self.after_pauses = after_pauses
        self.history = history
        self.sent = False
        """Whether any of the turn's chunks came out."""
        self.last: Any = None
        """The last ``finish``, ``error`` or ``abort`` chunk that came out."""
        self.result: TurnResult | None = None
        self.session = StoredSession(turn.session_id, ())
        self.status: TurnStatus | None = None
        self.done = trio.Event()
        """Set once :meth:`settle` read how the turn ended."""
        self.steered = False  # what a ``TurnStream`` has: a queued turn is never steered

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Any]:
        keep = RestartFilter()
        async for chunk in self._raw():
            for out in keep(chunk):
                if type(out) in (o.Finish, o.Error, o.Abort):
                    self.last = out
                self.sent = True
                yield out

    async def _raw(self) -> AsyncIterator[Any]:
        front = self.front
        delay = POLL_FIRST
        status: Any = object()  # not looked at yet
        try:
            while True:
                try:
                    async for chunk in self._relay():
                        yield chunk
                    if self.sent or not await self._continuing():
                        return
                    # The stream ended at a wait whose continuation a worker is about to
                    # stream (decided a moment ago): look at the relay again soon.
                    await trio.sleep(delay)
                    delay = min(delay * 2, POLL_MAX)
                    continue
                except RelayTurnGone as exc:
                    if self.sent:  # lost mid-stream: the rest cannot be shown whole,
                        if not self._ended():  # unless the turn's last chunk came
                            yield _error(
                                exc.kind, f"{exc.message}; the stored session has the turn"
                            )
                        return
                status = await front.watch.changed(
                    self.turn_id, status, math.inf if status == "queued" else delay
                )
                if status is None:
                    yield _error("TurnNotFound", f"turn {self.turn_id!r} does not exist")
                    return
                if status in FINAL_STATUSES or status == WAITING:
                    async for chunk in self._finished():
                        yield chunk
                    return
                if status != "queued":
                    delay = min(delay * 2, POLL_MAX)
        except RelayUnavailable as exc:
            # (its text names Redis's address: logged, the client told a fixed sentence)
            told = relay_failed(exc, turn_id=self.turn_id)
            if self.sent:  # its worker saves the turn all the same
                yield _error(exc.kind, f"{told}; the stored session has the turn")
                return
            # Its worker runs and saves the turn without the relay (``relay.unflushed``):
            # a client shown nothing of it waits on the queue for its end and gets what
            # the store then holds, as for a turn that ended unread.
            try:
                while status not in FINAL_STATUSES and status != WAITING:
                    status = await front.watch.changed(self.turn_id, status)
                    if status is None:
                        break
                async for chunk in self._stored():
                    yield chunk
            except StoreError as failed:
                # (the relay's error, which names no store: the stored session has it)
                store_failed(failed, "frontend.stream_store_failed", turn_id=self.turn_id)
                yield _error(exc.kind, told)
        except StoreError as exc:
            # The queue's store went away under the stream (PostgreSQL restarting): an
            # error in the protocol's shape, not a response the server cuts off; its
            # text the log's, the client's a stable sentence.
            why = store_failed(exc, "frontend.stream_store_failed", turn_id=self.turn_id)
            yield _error(exc.kind, why)

    def _relay(self) -> AsyncIterator[Any]:
        """The relay's read, given up once the queue says the turn ended and its stream
        still shows nothing (:func:`~runtime.app.web.watch.follow_turn`): lost, as a
        stream the relay lost is (a worker killed between the turn's last commit and
        its stream's end left its readers waiting a day, until the stream expired)."""
        front = self.front
        return follow_turn(
            front.relay,
            front.queue,
            self.turn_id,
            after_pauses=self.after_pauses,
            unseen=not self.sent,  # (answered from the store if the relay fails: _raw)
        )

    def _ended(self) -> bool:
        """Whether the turn's own end (its ``finish``, not a wait's; an ``error``, an
        ``abort``) came out: a stream lost after it lost only the relay's end marker (a
        worker killed between the turn's last commit and its stream's end), and the
        response ends as the turn's would, with its stored result (:meth:`settle`)."""
        last = self.last
        if type(last) is o.Finish:
            return last.finish_reason != "awaiting-input"
        return type(last) in (o.Error, o.Abort)

    async def _continuing(self) -> bool:
        turn = await self.front.queue.get_status(self.turn_id)
        return turn is not None and turn.status == RUNNING

    async def _finished(self) -> AsyncIterator[Any]:
        """A turn that ended while no stream of it was read: its stream after all (it
        ended between two looks), else its stored message, else why it ended."""
        try:
            async for chunk in self._relay():
                yield chunk
            return
        except RelayTurnGone:
            if self.sent:
                if not self._ended():
                    yield _error("RelayTurnGone", "the turn's stream was lost")
                return
        async for chunk in self._stored():
            yield chunk

    async def _stored(self) -> AsyncIterator[Any]:
        """An ended (or waiting) turn from the store: its stored message, else why it
        ended."""
        turn = await self.front.queue.get_status(self.turn_id)
        _, messages = await self._turn_messages(turn)
        if any(getattr(m, "id", None) == self.message_id for m in messages):
            for chunk in stored_turn_chunks(messages, self.message_id):
                yield chunk
        elif turn is not None and turn.status == "cancelled":
            yield o.Abort(reason=turn.cancel_reason or "cancelled")
        elif turn is not None and turn.status == "failed":
            yield _error("TurnFailed", turn.error or f"turn {self.turn_id!r} failed")
        else:
            yield _error("TurnNotFound", f"turn {self.turn_id!r} left nothing to show")

    async def settle(self) -> TurnResult | None:
        """Read how the turn ended (its row, its stored message) into :attr:`result`,
        :attr:`session` and :attr:`status`; call once the chunks ended."""
        try:
            self.status = await self.front.queue.get_status(self.turn_id)
            history = self.history() if callable(self.history) else self.history
            first, messages = await self._turn_messages(self.status, history=history)
        finally:
            self.done.set()
        self.session = StoredSession(self.session_id, messages, first)
        self.result = turn_result(self.turn_id, self.message_id, messages, self.status, self.last)
        return self.result

    async def _turn_messages(
        self, status: TurnStatus | None, *, history: bool = False
    ) -> tuple[int, tuple[Message, ...]]:
        """The messages :meth:`settle` reads (and a turn rebuilt from the store, its
        stream lost), with the index of the first, ``status`` the turn's row: none when the
        turn ended without a save of its own (its row says so: cancelled while queued,
        failed before its first step was stored); the turn from its assistant message
        on (:func:`read_turn`) when the store's last turns hold it; else (``history``
        asked for, a later turn ran since, the turn stored no answer) the whole
        history, which alone tells those apart."""
        store = self.front.store
        if not history:
            if status is not None and status.finished and not status.saved:
                return 0, ()
            found = await read_turn(store, self.session_id, self.message_id)
            if found is not None:
                return found
        record = await store.load(self.session_id)
        return 0, tuple(record.messages) if record is not None else ()

    async def cancel(self, reason: str = STOPPED) -> None:
        """Cancel the turn wherever it runs (a queued one never runs)."""
        turn = await self.front.queue.request_cancel(self.turn_id, reason)
        if turn is not None and turn.status == RUNNING:
            await self.front.relay.request_cancel(self.turn_id, reason)


STEERED_MARK = "-s"
"""What a turn's steered assistant message id puts after its first one's (``<id>-s<step>``:
:func:`actors.turn.takeover.steered_message_id`, which this module cannot import)."""

MAX_TURNS_BACK = 64
"""How many assistant messages :func:`read_turn` goes back at most for a steered turn
(one a steer; doubled a read) before it gives up and the whole history is read."""


def of_turn(message_id: str, turn_message_id: str) -> bool:
    """Whether ``message_id`` is the turn's first assistant message's or one a message
    steered into the turn started."""
    if message_id == turn_message_id:
        return True
    steered = turn_message_id + STEERED_MARK
    return message_id.startswith(steered) and message_id[len(steered) :].isdigit()


async def read_turn(
    store: Any, session_id: str, message_id: str
) -> tuple[int, tuple[Message, ...]] | None:
    """The stored messages from the turn's assistant message ``message_id`` on, with the
    index of the first, read from the session's last turns
    (:func:`~runtime.store.load_last_turns`): the last one, and twice as many again
    while the read starts at one of the turn's steered assistant messages (a message
    steered into the turn starts another: ``<id>-s<step>``), so a turn steered ``k``
    times costs ``log2(k) + 2`` reads of its own messages, not the session. ``(0, ())``
    for a session never saved; ``None`` when the last turn is another's (a later turn
    ran since, or this one stored no answer), which only the whole history tells apart."""
    turns = 1
    while True:
        last = await load_last_turns(store, session_id, turns)
        if last is None:
            return 0, ()
        first, record = last
        messages = tuple(record.messages)
        if any(m.role == "assistant" and m.id == message_id for m in messages):
            return first, messages
        if first == 0:  # the whole history, without the turn's message
            return 0, messages
        head = messages[0] if messages else None
        if not isinstance(head, AssistantMessage) or not of_turn(head.id, message_id):
            return None
        if turns >= MAX_TURNS_BACK:
            return None
        turns *= 2


def turn_result(
    turn_id: str,
    message_id: str,
    messages: Sequence[Message],
    status: TurnStatus | None,
    last: Any,
) -> TurnResult | None:
    """The :class:`~runtime.output.TurnResult` of a queued turn that ended, as
    its row, its stored message and the last chunk its stream ended with tell it;
    ``None`` when none of them says how it ended."""
    index = next(
        (
            i
            for i, m in enumerate(messages)
            if isinstance(m, AssistantMessage) and m.id == message_id
        ),
        None,
    )
    message: Any = (
        messages[index] if index is not None else AssistantMessage(content=(), id=message_id)
    )
    after = messages[index + 1 :] if index is not None else ()
    tools = []
    for m in after:
        if not isinstance(m, ToolMessage):
            break
        tools.append(m)
    usage = last.usage if type(last) is o.Finish else Usage()
    error = last.error if type(last) is o.Error else None
    abort = last.reason if type(last) is o.Abort else None
    row = status.status if status is not None else None
    if row == WAITING or (type(last) is o.Finish and last.finish_reason == "awaiting-input"):
        reason = "awaiting-input"
    elif type(last) is o.Finish:
        reason = last.finish_reason
    elif error is not None or row == "failed":
        reason = "error"
        if error is None:
            why = (status.error if status is not None else None) or "the turn failed"
            error = o.ErrorInfo(kind="TurnFailed", message=why)
    elif abort is not None or row == "cancelled":
        reason = "aborted"
        abort = abort or (status.cancel_reason if status else None) or "cancelled"
    elif row == "done":
        reason = (status.finish_reason if status else None) or "stop"
    else:
        return None
    pending = (
        tuple(c for c in pending_calls(messages) if c.message_id == message_id)
        if reason == "awaiting-input"
        else ()
    )
    steps = len({getattr(p, "step", 0) for p in message.content}) if message.content else 0
    return TurnResult(
        turn_id=turn_id,
        finish_reason=reason,
        usage=usage,
        steps=steps,
        message=message,
        tool_messages=tuple(tools),
        error=error,
        abort_reason=abort,
        budget=last.budget if type(last) is o.Finish else None,
        pending=pending,
    )


class QueuedStreamResponse:
    """Streams a queued turn's output (:class:`QueuedTurnOutput`) with a protocol's
    ``encoder`` (``events(chunk) -> bytes``; a ``final(out) -> bytes`` ends the stream
    once the turn is over, else ``data: [DONE]``), as the embedded app's
    :class:`~runtime.app.web.app.TurnResponse` streams ``session.stream``: keep-alive
    comments, a client that stops reading dropped after ``send_timeout``. With
    ``cancel_on_leave`` a client that leaves (or stops reading) cancels the turn, as it
    does in the embedded app (a request of these protocols is the turn's one viewer);
    without, the turn goes on."""

    def __init__(
        self,
        out: QueuedTurnOutput,
        encoder: Any,
        *,
        headers: dict[str, str],
        keepalive: float,
        send_timeout: float | None,
        background: trio.Nursery | None,
        cancel_on_leave: bool = True,
    ) -> None:
        self.out = out
        self.encoder = encoder
        self.headers = headers
        self.keepalive = keepalive
        self.send_timeout = send_timeout
        self.background = background
        self.cancel_on_leave = cancel_on_leave
        self.left: str | None = None
        """Why the client's stream ended early (it left, it stopped reading), if it did."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = BodyWriter.ok(send, self.headers, timeout=self.send_timeout)
        async with trio.open_nursery() as local:
            (self.background or local).start_soon(writer.run)
            try:
                await self._pump(receive, BodyPump(writer, self.keepalive))
            except BaseException:
                writer.abandon()
                raise
            finally:
                if self.left is not None and self.cancel_on_leave:
                    with trio.CancelScope(shield=True), trio.move_on_after(10):
                        await cancel_quietly(self.out, self.left)
            if self.left is not None or writer.stalled or not await writer.close():
                writer.abandon()

    async def _pump(self, receive: Receive, pump: BodyPump) -> None:
        async def body(write: Write) -> None:
            with self.out.front.viewing() as viewing:
                async for chunk in self.out:
                    data = self.encoder.events(chunk)
                    if data:
                        await write(data)
            if viewing.cancelled_caught:  # the front end closes: the turn goes on
                await write(self.encoder.events(_error("unavailable", CUT_BY_CLOSING)))
            else:
                await settle_quietly(self.out)
            final = getattr(self.encoder, "final", None)
            ending = final(self.out) if final is not None else DONE
            if ending:
                await write(ending)

        try:
            await pump.run(receive, body)
        finally:
            self.left = pump.left


async def settle_quietly(out: QueuedTurnOutput) -> None:
    """:meth:`QueuedTurnOutput.settle`; a store that cannot be read leaves the result
    unknown (``None``), which the encoders answer as a turn without a result."""
    try:
        await out.settle()
    except StoreError as exc:
        get_logger("axon.web").warning(
            "frontend.settle_failed", turn_id=out.turn_id, error=redact(str(exc))
        )


async def cancel_quietly(out: QueuedTurnOutput, reason: str) -> None:
    """:meth:`QueuedTurnOutput.cancel`; a store or relay that cannot be reached is logged
    (the turn goes on: its worker ends it, or a reaper does)."""
    try:
        await out.cancel(reason)
    except (StoreError, RelayUnavailable) as exc:
        get_logger("axon.web").warning(
            "frontend.cancel_failed", turn_id=out.turn_id, error=redact(str(exc))
        )


__all__ = [
    "QueuedStreamResponse",
    "QueuedTurnOutput",
    "RestartFilter",
    "StoredSession",
    "cancel_quietly",
    "settle_quietly",
    "turn_result",
]
