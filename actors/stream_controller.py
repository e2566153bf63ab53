"""The stream controller: renders the turn runner's raw items as the public stream.

It receives the turn runner's raw items (stream chunks, part markers, step, tool and
turn markers) and turns them into :mod:`runtime.output` chunks. It does not decide where
parts open and close: the turn runner's :class:`~actors.turn.parts.PartsManager` does, once
for the stream and the stored message alike, and marks it with
:class:`~runtime.actor_messages.PartBegin` / :class:`~runtime.actor_messages.PartEnd`; text and
reasoning
chunks between them are the deltas of that part. The controller stamps a session-wide
``seq``, and closes a part still open when another opens or the step or turn ends (only
a crash in the middle of a part can leave one open), so the grammar always holds. Each
chunk goes to the turn's consumer and, when anyone listens, onto the bus. The turn's
:class:`~runtime.actor_messages.TurnDone` (its result) goes to the consumer after its last
chunk, and then the consumer's inbox is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import trio

from runtime import output as o
from runtime.actor import Actor
from runtime.actor_messages import (
    MAX_BATCH,
    TEXT,
    ApprovalAsked,
    Batch,
    Batcher,
    BudgetWaitNotice,
    ConsumerItem,
    ObjectUpdate,
    PartBegin,
    PartEnd,
    SteeredNotice,
    StepBegin,
    StepEnd,
    StepReset,
    ThrottleNotice,
    ToolDenied,
    ToolDone,
    ToolStreamed,
    TurnBegin,
    TurnDone,
    TurnEnd,
)
from runtime.chunks import (
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
)
from runtime.errors import describe_exception
from runtime.fastbuild import column_builder, slot_builder
from runtime.inbox import Inbox
from runtime.output import OutputChunk
from runtime.provider import TextRun

_DELTA_FIELDS = ("step", "part_id", "text", "seq", "session_id", "turn_id")
_TEXT_DELTA = slot_builder(o.TextDelta, _DELTA_FIELDS)
_REASONING_DELTA = slot_builder(o.ReasoningDelta, _DELTA_FIELDS)
"""The delta chunks, built positionally through their slots (:mod:`runtime.fastbuild`):
one per delta, it was the costliest line of the controller (issue 24)."""
_TEXT_DELTAS = column_builder(o.TextDelta, _DELTA_FIELDS, ("text", "seq"))
"""A :class:`~runtime.provider.TextRun`'s deltas, all at once: one loop, each delta made as
``TextDelta``'s twin with its fields written by bytecode, then given its class
(:mod:`runtime.fastbuild`; 0.35 -> 0.19 us a delta, issue 24 goal 1)."""
_PIECE = MAX_BATCH
"""The most deltas of a run built before they go to the consumer: a run of more (up to
:data:`~runtime.inbox.MAX_RUN`) goes as pieces of this many, with a schedule point
between, so that no more chunk objects are in flight than a batch holds (issue 24)."""


class StreamController(Actor):
    """Per-session actor: raw items in, :data:`~runtime.output.OutputChunk` s out."""

    inbox_capacity = 128  # batches of up to MAX_RUN deltas (runtime.inbox)

    def __init__(self, *, session_id: str, name: str = "stream-controller") -> None:
        super().__init__(name=name, session_id=session_id)
        self.seq = 0
        """Last ``seq`` stamped; session-wide and monotonic across turns."""
        self._consumer: Batcher[OutputChunk] | None = None
        self._consumer_inbox: Inbox[ConsumerItem] | None = None
        self._turn_id = ""
        self._step = 0
        self._open_kind: str | None = None  # "text" | "reasoning"
        self._open_id = ""
        self._done: TurnDone | None = None  # hand over after this batch, then close
        self._handling: Batch[Any] | None = None
        """The batch being rendered: what a crash loses (:meth:`on_crash`)."""
        self._cut: str | None = None
        self._delivered: tuple[str | None, str] = (None, "")
        """The part open as far as the consumer knows (its kind, ``None`` for none, and
        id): as of the last chunks sent. A crash closes that one, not one whose start
        the crash lost."""
        """The turn whose stream a crash cut: its later items are dropped, but its
        :class:`TurnDone` (:meth:`_after_cut`)."""

    def on_crash(self, exc: BaseException) -> None:
        """End the turn's stream for its consumer: the batch the crash took is lost, so
        the stream could not go on whole, and a lost :class:`TurnDone` left the consumer
        waiting for ever. It gets an ``error`` chunk saying so, then the turn's result
        when the runner hands it over (the turn itself goes on and is saved)."""
        self._cut_stream(exc, "the turn goes on and is saved")

    def on_give_up(self, exc: BaseException) -> None:
        """End the turn's stream for its consumer, as after a crash, even when
        :meth:`on_crash` itself raised (a bug of ours or of a subclass's: the consumer
        waited for ever); nothing twice when it had answered. A :class:`TurnDone`
        already queued is handed over now; a later one, by the runner itself (this
        controller has ended: :meth:`~actors.turn.runner.TurnRunner._hand_over`). The
        session's next turn gets a fresh controller
        (:meth:`~runtime.app.host.Host._renew_given_up`)."""
        self._cut_stream(exc, "the turn ends with an error")
        queued: list[Any] = []
        self.inbox.drain_nowait(queued)
        for message in queued:
            if isinstance(message, Batch):
                message.taken = True
                for item in message:
                    if type(item) is TurnDone:
                        self._hand_over_now(item)

    def _cut_stream(self, exc: BaseException, then: str) -> None:
        """:meth:`on_crash`'s work, once per turn (``then``: what becomes of the turn)."""
        lost, self._handling = self._handling, None
        inbox = self._consumer_inbox
        if inbox is None or self._cut == self._turn_id:
            self._open_kind = None
            return
        out: list[Any] = []
        self._open_kind, self._open_id = self._delivered
        self._close_part(out)
        error = o.ErrorInfo(
            kind="ActorFailed",
            message=f"the stream controller crashed ({describe_exception(exc)}): the rest "
            f"of this turn's output is not streamed; {then}",
        )
        out.append(self._chunk(o.Error, error=error))
        batch: Batch[Any] = Batch(self._turn_id)
        batch.extend(out)
        self._cut = self._turn_id
        try:
            inbox.put_over(batch)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the consumer left
        done = self._done or next((i for i in lost or () if type(i) is TurnDone), None)
        if done is not None:
            self._hand_over_now(done)

    def _hand_over_now(self, done: TurnDone) -> None:
        """:meth:`_hand_over` without waiting (past the inbox's capacity)."""
        inbox, self._consumer_inbox, self._consumer = self._consumer_inbox, None, None
        self._done = None
        if inbox is not None:
            try:
                inbox.put_over(done)
                inbox.close()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    def _after_cut(self, message: Batch[Any]) -> bool:
        """Whether ``message`` is of the turn whose stream a crash cut (and so taken
        here): its items are dropped but its :class:`TurnDone`, handed over; a new
        turn's :class:`TurnBegin` streams again."""
        for i, item in enumerate(message):
            if type(item) is TurnBegin:
                self._cut = None
                del message[:i]
                return False
            if type(item) is TurnDone:
                self._hand_over_now(item)
        return True

    async def handle(self, message: Any) -> None:
        if not isinstance(message, Batch):
            return
        message.taken = True
        if self._cut is not None and self._after_cut(message):
            return
        self._handling = message
        out: list[Any] = []
        sid = self.session_id or ""
        handlers = self._HANDLERS
        append, text_delta, reasoning_delta = out.append, _TEXT_DELTA, _REASONING_DELTA
        text_deltas = _TEXT_DELTAS
        # The hot path, inlined: a delta of the open part, built directly from locals. Any
        # other item goes to its handler in the table (an unknown one is ignored), which may
        # move the state, so the locals are stored before it and read again after.
        seq, step, part_id, turn_id = self.seq, self._step, self._open_id, self._turn_id
        deltas_only = True  # no handler ran: ``out`` holds text and reasoning deltas only
        for item in message:
            t = type(item)
            if t is TextRun:  # each of its texts a delta of its own, in order
                texts = item.texts
                k = len(texts)
                if k > _PIECE:  # built and sent a piece at a time (see _PIECE)
                    self.seq = seq
                    await self._run_pieces(texts, out, deltas_only)
                    out, deltas_only = [], True
                    append, seq = out.append, self.seq
                    continue
                seqs = range(seq + 1, seq + 1 + k)
                out += text_deltas(k, step, part_id, texts, seqs, sid, turn_id)
                seq += k
            elif t is TextChunk or t is ReasoningChunk:
                seq += 1
                build = text_delta if t is TextChunk else reasoning_delta
                append(build(step, part_id, item.text, seq, sid, turn_id))
            else:
                handler = handlers.get(t)
                if handler is not None:
                    deltas_only = False
                    self.seq = seq
                    handler(self, item, out)
                    seq, step, part_id = self.seq, self._step, self._open_id
                    turn_id = self._turn_id
        self.seq = seq
        if out:
            await self._emit(out, deltas_only)
        done = self._done
        if done is not None:
            self._done = None
            # It may rest now (Actor.rests_after_turn), unless the hand-over waited: while
            # it waited for room the consumer may have taken the result and the next turn
            # started, its wake finding this actor awake, so a rest here would leave that
            # turn's items in an inbox nobody reads. Then it rests on REST, as before.
            self.turn_ended = await self._hand_over(done)
        self._handling = None  # rendered whole: an idle session keeps none of its turn

    async def _run_pieces(self, texts: list[str], out: list[Any], deltas_only: bool) -> None:
        """A run of more than :data:`_PIECE` deltas: ``out`` (what the batch made so far)
        with its first piece's deltas, sent; then each further piece's, after a schedule
        point. The same chunks, in the same order, as one build of the whole run; ``seq``
        is stored before each send, so the state is never behind what was sent."""
        seq, step, part_id = self.seq, self._step, self._open_id
        sid, turn_id = self.session_id or "", self._turn_id
        k = len(texts)
        for start in range(0, k, _PIECE):
            piece = texts[start : start + _PIECE]
            n = len(piece)
            seqs = range(seq + 1, seq + 1 + n)
            out += _TEXT_DELTAS(n, step, part_id, piece, seqs, sid, turn_id)
            seq += n
            self.seq = seq
            await self._emit(out, deltas_only)
            if start + _PIECE < k:
                # the consumer takes this piece before the next is built (cancel-shielded:
                # the batch is handled whole, as one without pieces is)
                await trio.lowlevel.cancel_shielded_checkpoint()
                out, deltas_only = [], True

    async def _hand_over(self, done: TurnDone) -> bool:
        """The turn's result to its consumer, after every chunk; then close the inbox.
        Not batched: the consumer tells it from the chunks per batch, not per chunk.
        Whether it was handed over without a schedule point (nothing else ran between
        the turn's end and the return)."""
        inbox, self._consumer_inbox, self._consumer = self._consumer_inbox, None, None
        if inbox is None:
            return True
        waits = inbox.would_wait()
        try:
            await inbox.put(done)
            inbox.close()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the consumer left (or the runner already handed the result over)
        return not waits

    def _chunk(self, cls: type, **fields: Any) -> Any:
        self.seq += 1
        return cls(seq=self.seq, session_id=self.session_id or "", turn_id=self._turn_id, **fields)

    def _close_part(self, out: list[Any]) -> None:
        kind = self._open_kind
        if kind is not None:
            cls = o.TextFinish if kind == TEXT else o.ReasoningFinish
            out.append(self._chunk(cls, step=self._step, part_id=self._open_id))
            self._open_kind = None

    # One handler per raw item type: the chunk(s) it becomes, and the state it moves.

    def _part_begin(self, item: PartBegin, out: list[Any]) -> None:
        self._close_part(out)
        self._open_kind, self._open_id = item.kind, item.part_id
        cls = o.TextStart if item.kind == TEXT else o.ReasoningStart
        out.append(self._chunk(cls, step=self._step, part_id=item.part_id))

    def _part_end(self, item: PartEnd, out: list[Any]) -> None:
        if item.part_id == self._open_id:
            self._close_part(out)

    def _object_update(self, item: ObjectUpdate, out: list[Any]) -> None:
        out.append(
            self._chunk(o.ObjectDelta, step=self._step, part_id=item.part_id, value=item.value)
        )

    def _tool_input_start(self, item: ToolInputStartChunk, out: list[Any]) -> None:
        out.append(
            self._chunk(
                o.ToolInputStart,
                step=self._step,
                tool_call_id=item.tool_call_id,
                tool_name=item.tool_name,
            )
        )

    def _tool_input_delta(self, item: ToolInputDeltaChunk, out: list[Any]) -> None:
        out.append(
            self._chunk(
                o.ToolInputDelta, step=self._step, tool_call_id=item.tool_call_id, delta=item.delta
            )
        )

    def _tool_call(self, item: ToolCallChunk, out: list[Any]) -> None:
        ids = {"tool_call_id": item.tool_call_id, "tool_name": item.tool_name}
        out.append(self._chunk(o.ToolCall, step=self._step, **ids, input=item.input))

    def _tool_done(self, item: ToolDone, out: list[Any]) -> None:
        oc = item.outcome
        ids = {"tool_call_id": oc.tool_call_id, "tool_name": oc.tool_name}
        if oc.error is None:
            out.append(self._chunk(o.ToolResult, step=item.step, **ids, output=oc.output))
        else:
            out.append(self._chunk(o.ToolError, step=item.step, **ids, error=oc.error))

    def _tool_streamed(self, item: ToolStreamed, out: list[Any]) -> None:
        pr = item.progress
        ids = {"tool_call_id": pr.tool_call_id, "tool_name": pr.tool_name}
        out.append(self._chunk(o.ToolStream, step=item.step, **ids, chunk=pr.chunk))

    def _throttled(self, item: ThrottleNotice, out: list[Any]) -> None:
        out.append(self._chunk(o.Throttled, step=item.step, wait=item.wait, reason=item.reason))

    def _budget_wait(self, item: BudgetWaitNotice, out: list[Any]) -> None:
        out.append(
            self._chunk(
                o.BudgetWait,
                step=item.step,
                want=item.want,
                available=item.available,
                held=item.held,
                ahead=item.ahead,
            )
        )

    def _steered(self, item: SteeredNotice, out: list[Any]) -> None:
        self._close_part(out)
        out.append(
            self._chunk(
                o.Steered,
                step=item.step,
                message_id=item.message_id,
                text=item.text,
                answer_id=item.answer_id,
                answered=item.answered,
            )
        )

    def _step_begin(self, item: StepBegin, out: list[Any]) -> None:
        self._step = item.step
        out.append(self._chunk(o.StepStart, step=item.step))

    def _step_reset(self, item: StepReset, out: list[Any]) -> None:
        """The step starts over on another provider: its open part is closed (the
        grammar holds for consumers that do not know ``reset-step``), then voided."""
        self._close_part(out)
        out.append(
            self._chunk(o.ResetStep, step=item.step, provider=item.provider, error=item.error)
        )

    def _step_end(self, item: StepEnd, out: list[Any]) -> None:
        self._close_part(out)
        out.append(
            self._chunk(
                o.StepFinish, step=item.step, finish_reason=item.finish_reason, usage=item.usage
            )
        )

    def _turn_begin(self, item: TurnBegin, out: list[Any]) -> None:
        self._turn_id = item.turn_id
        self._consumer_inbox = item.consumer
        self._consumer = Batcher(item.consumer, item.turn_id) if item.consumer is not None else None
        self._open_kind = None
        self._step = 0
        out.append(self._chunk(o.Start, message_id=item.message_id))

    def _turn_end(self, item: TurnEnd, out: list[Any]) -> None:
        self._close_part(out)
        if item.error is not None:
            out.append(self._chunk(o.Error, error=item.error))
        elif item.abort_reason is not None:
            out.append(self._chunk(o.Abort, reason=item.abort_reason))
        else:
            out.append(
                self._chunk(
                    o.Finish, budget=item.budget, finish_reason=item.finish_reason, usage=item.usage
                )
            )

    def _turn_done(self, item: TurnDone, out: list[Any]) -> None:
        self._done = item  # handed over after this batch's chunks (see :meth:`handle`)

    def _waiting(self, item: ApprovalAsked | ToolDenied, out: list[Any]) -> None:
        out.append(_waiting_chunk(self, item))

    _HANDLERS: ClassVar[dict[type, Callable[[StreamController, Any, list[Any]], None]]] = {
        PartBegin: _part_begin,
        PartEnd: _part_end,
        ObjectUpdate: _object_update,
        ToolInputStartChunk: _tool_input_start,
        ToolInputDeltaChunk: _tool_input_delta,
        ToolCallChunk: _tool_call,
        ToolDone: _tool_done,
        ApprovalAsked: _waiting,
        ToolDenied: _waiting,
        ToolStreamed: _tool_streamed,
        ThrottleNotice: _throttled,
        BudgetWaitNotice: _budget_wait,
        SteeredNotice: _steered,
        StepBegin: _step_begin,
        StepEnd: _step_end,
        StepReset: _step_reset,
        TurnBegin: _turn_begin,
        TurnEnd: _turn_end,
        TurnDone: _turn_done,
    }
    """The raw item types the controller renders (the text and reasoning deltas aside,
    which :meth:`handle` builds inline), each to its handler."""

    async def _emit(self, out: list[Any], deltas_only: bool = False) -> None:
        """``out`` onto the bus (the chunks someone subscribed to), then to the consumer.

        A batch of ``deltas_only`` (most of a turn's batches) skips the bus when nobody
        subscribes to text or reasoning deltas of this session: two look-ups a batch
        instead of a pass over its chunks (the log tap and other observers subscribe to
        events, so the bus has subscribers in nearly every turn; issue 24 goal 1)."""
        bus = self.bus
        if bus is not None and bus.has_subscribers():  # observers only pay when they exist
            sid = self.session_id
            if not deltas_only or bus.wants(o.TextDelta, sid) or bus.wants(o.ReasoningDelta, sid):
                wanted: dict[type, bool] = {}  # per batch: a batch is mostly one type (deltas)
                for chunk in out:
                    t = type(chunk)
                    wants = wanted.get(t)
                    if wants is None:
                        wants = wanted[t] = bus.wants(t, sid)
                    if wants:
                        await bus.publish(chunk)
        consumer = self._consumer
        if consumer is not None:
            try:
                await consumer.send_all(out)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._consumer = None  # the consumer left; the turn goes on being saved
        self._delivered = self._open_kind, self._open_id


def _waiting_chunk(ctrl: StreamController, item: ApprovalAsked | ToolDenied) -> Any:
    """The output chunk of a suspension marker (docs/approval.md)."""
    if isinstance(item, ApprovalAsked):
        return ctrl._chunk(
            o.ToolApprovalRequest,
            step=item.step,
            tool_call_id=item.tool_call_id,
            tool_name=item.tool_name,
            approval_id=item.approval_id,
            asked_tool=item.asked_tool,
            asked_input=item.asked_input,
            asked_via=item.asked_via,
        )
    oc = item.outcome
    return ctrl._chunk(
        o.ToolOutputDenied,
        step=item.step,
        tool_call_id=oc.tool_call_id,
        tool_name=oc.tool_name,
        reason=item.reason,
    )
