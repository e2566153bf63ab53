"""A2A tasks in a worker deployment's front end: a task is a row of the turn queue.

The embedded app's :class:`~runtime.app.web.a2a_tasks.TaskBook` runs a task's turn on its
own host. A front end runs no turn: :class:`QueuedTaskBook` submits it to the queue
(:class:`runtime.turn_queue.TurnQueue`) and follows it from the relay
(:class:`~runtime.app.web.queued_turn.QueuedTurnOutput`), so any front end answers for any
task: the task's id is ``<contextId>~msg_<turn id>`` (the turn's assistant message id), and
``GetTask``, ``CancelTask`` and ``SubscribeToTask`` read the row (where the turn stands),
the store (its history) and the relay (its answer as it streams).

* **Sending.** A message is checked as the embedded book checks it, then submitted with
  its stored id as the user message's (``TurnOptions.user_message_id``) and an
  idempotency key made of it: a message sent again gives the task it started (from the
  store once saved, else from the context's queued or running row), never a second turn.
  A context with a turn queued or running refuses another task, as the embedded one does.
* **Following.** While a task's turn is queued or running, the front end that holds it
  follows it in its background nursery: every text delta becomes an artifact update,
  and the turn's end (its row and stored message) the final state.
* **Input required.** A turn that waits is a row ``awaiting-input``; a message with the
  decisions records them through the queue (``TurnQueue.decide``), and the one that
  completes them puts the turn back for any worker: the task follows its continuation.
* **Cancel.** A queued or running turn is cancelled through the queue and the relay's
  cancel channel (a queued one at once). A waiting one ends at once through the queue
  (no decision resumes it any more), and its calls are denied in its stored message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson
import trio

from actors.a2a import wire
from runtime.app.session import FINAL_WAIT
from runtime.app.web.a2a_tasks import (
    CANCELED_REASON,
    LiveTask,
    TaskBook,
    _agent_note,
    _busy,
    _decisions,
    check_resend,
    checked_decisions,
    derive,
    fingerprint,
    split_task_id,
    task_id_of,
    user_message,
)
from runtime.app.web.http import ApiError
from runtime.app.web.queued_turn import QueuedTurnOutput, settle_quietly
from runtime.approval import APPROVAL, Decision, pending_calls, record_decision
from runtime.errors import DecisionError
from runtime.ids import new_id
from runtime.messages import AssistantMessage, Message, UserMessage
from runtime.store import has_user_messages
from runtime.tools import AGENT_DEPTH_META
from runtime.turn_queue import FINAL_STATUSES, QUEUED, RUNNING, TurnOptions, TurnStatus

TURN_PREFIX = "msg_"
"""A queued turn's assistant message id is ``msg_<turn id>``
(:attr:`runtime.turn_queue.TurnStatus.message_id`)."""

_REFUSALS = {429: "UnsupportedOperation", 409: "UnsupportedOperation", 503: "Internal"}


def _refused(exc: ApiError) -> wire.A2AError:
    """A queue's refusal (:meth:`runtime.app.web.frontend.FrontEnd.submit`) in A2A's terms."""
    return wire.A2AError(_REFUSALS.get(exc.status, "InvalidParams"), exc.message, status=exc.status)


def _message_key(context_id: str, stored_id: str) -> str:
    return hashlib.sha256(orjson.dumps([context_id, "a2a", stored_id])).hexdigest()


class QueuedTaskBook(TaskBook):
    """The A2A tasks of a worker deployment's front end (``state.front``): rows of the
    turn queue, followed from the relay; the module docstring says how."""

    @property
    def front(self) -> Any:
        return self.state.front

    # -- reading ------------------------------------------------------------------------

    async def find(self, task_id: str) -> LiveTask:
        """The task ``task_id``: as followed here, or from the queue's row and the store.

        A task followed here lags its turn by the relay's delivery: another front end
        may have streamed its end already. Once the row says the turn ended, the row and
        the store answer (the follower still brings the end to who follows it here), so
        every front end reports the same state after any one of them reported the end.
        """
        followed = self.live.get(task_id)
        if followed is not None and not followed.running:
            return followed
        context_id, message_id = split_task_id(task_id)
        turn = None
        if message_id.startswith(TURN_PREFIX):
            turn = await self.front.queue.get_status(message_id[len(TURN_PREFIX) :])
        if turn is not None and turn.session_id != context_id:
            turn = None
        if followed is not None and (turn is None or not turn.finished):
            return followed
        record = await self.front.store.load(context_id)
        messages: tuple[Message, ...] = tuple(record.messages) if record is not None else ()
        index = next(
            (
                i
                for i, m in enumerate(messages)
                if isinstance(m, AssistantMessage) and m.id == message_id
            ),
            None,
        )
        if turn is None:
            if index is None:
                raise wire.task_not_found(task_id)
            # a turn the queue does not know (run before the deployment had one): as stored
            return self._keep(derive(messages, index, task_id, context_id, running=False))
        if index is not None:
            live = derive(messages, index, task_id, context_id, running=False)
        else:
            live = await self._unstored(turn, task_id)
        if turn.finished:
            _settle_from_row(live, turn)
            if followed is not None:
                return live  # not kept: the follower here goes on to its end
        elif turn.status in (QUEUED, RUNNING):
            if turn.resumes == 0:
                live.text = []  # followed from the relay's start, which repeats it
            self._follow(live, turn)
        return self._keep(live)

    async def _unstored(self, turn: TurnStatus, task_id: str) -> LiveTask:
        """A task whose turn left nothing in the store yet (queued, cancelled before it
        ran, failed before it saved): its user message from the row."""
        live = LiveTask(task_id, turn.session_id, turn.message_id)
        full = await self.front.queue.get(turn.turn_id)
        if full is not None:
            stored_id = full.options.user_message_id or new_id("msg")
            message = UserMessage(content=full.input, id=stored_id)
            live.history.append(user_message(message, turn.session_id, task_id))
            live.seen[stored_id] = fingerprint(full.input)
        live.state = wire.WORKING if turn.status in (QUEUED, RUNNING) else wire.COMPLETED
        return live

    def _follow(self, live: LiveTask, turn: TurnStatus) -> None:
        """Follow the queued turn ``turn`` of ``live`` in the background, from the
        relay (only its continuation when it went on after a wait)."""
        background = self.state.background
        if background is None:
            raise wire.A2AError(
                "Internal",
                "the A2A endpoint follows tasks in the app's lifespan, which is not running",
            )
        live.running = True
        live.set_state(wire.WORKING)
        background.start_soon(self._drive_queued, live, turn)

    async def _drive_queued(self, live: LiveTask, turn: TurnStatus) -> None:
        out = QueuedTurnOutput(self.front, turn, after_pauses=turn.resumes)
        try:
            async for chunk in out:
                live.take(chunk)
            await settle_quietly(out)
            self._finish(live, out.result)
            if out.status is not None and out.status.finished:
                _settle_from_row(live, out.status)
        except Exception as exc:
            live.running = False
            live.set_state(
                wire.FAILED,
                _agent_note(live.id, live.context_id, f"internal error: {type(exc).__name__}"),
            )
        finally:
            # A front end shutting down stops following; the turn goes on on its worker.
            live.running = False

    # -- sending ------------------------------------------------------------------------

    async def send(self, request: wire.SendRequest) -> LiveTask:
        self.front.check_open()  # closing: 503, nothing queued or decided
        incoming = request.message
        if incoming.task_id is not None:
            return await self._continue(incoming)
        opened = self._opening(incoming)
        if isinstance(opened, LiveTask):
            return opened
        context_id, stored_id, content = opened
        earlier = await self._sent_earlier(context_id, stored_id, incoming, content)
        if earlier is not None:
            return earlier
        self._check_capacity()
        try:
            depth = wire.hops(incoming.metadata)
            turn = await self.front.submit(
                context_id,
                content,
                _message_key(context_id, stored_id),
                False,
                options=TurnOptions(user_message_id=stored_id),
                meta={AGENT_DEPTH_META: depth} if depth else None,  # the turn runs that deep
            )
        except ApiError as exc:
            raise _refused(exc) from None
        task_id = task_id_of(context_id, turn.message_id)
        twin = self.live.get(task_id)
        if twin is not None:  # the same message, sent twice at once: one turn
            return twin
        live = LiveTask(task_id, context_id, turn.message_id)
        live.seen[stored_id] = fingerprint(content)
        live.history.append(self._history_entry(incoming, context_id, live.id, stored_id))
        waiting = [
            t
            for t in self.live.values()
            if t.context_id == context_id and t.state == wire.INPUT_REQUIRED
        ]
        self.live[task_id] = live
        if turn.status in FINAL_STATUSES:  # a retry of a message whose turn ended
            _settle_from_row(live, turn)
        else:
            self._follow(live, turn)
        for old in waiting:  # the new turn supersedes what they waited for
            old.set_state(
                wire.CANCELED, _agent_note(old.id, context_id, f"superseded by task {live.id}")
            )
        return self._keep(live)

    async def _sent_earlier(
        self, context_id: str, stored_id: str, incoming: wire.Incoming, content: Any
    ) -> LiveTask | None:
        """The task that message ``stored_id`` started before (its turn saved, else
        queued or running); ``None`` when it started none. A context running another
        turn refuses a new task; a message that reuses the id of another is refused
        (:func:`~runtime.app.web.a2a_tasks.check_resend`)."""
        says = fingerprint(content)
        messages: tuple[Message, ...] = ()
        # The whole context only when the id is in it (a retry or a reused id): a new
        # message's send read every message of the context, 5,000 of them 1.2 MB a send.
        if stored_id in await has_user_messages(self.front.store, context_id, (stored_id,)):
            record = await self.front.store.load(context_id)
            messages = record.messages if record is not None else ()
        at = next(
            (i for i, m in enumerate(messages) if isinstance(m, UserMessage) and m.id == stored_id),
            None,
        )
        if at is not None:
            sent = messages[at]
            assert isinstance(sent, UserMessage)
            check_resend(fingerprint(sent.content), says, incoming, context_id)
            answer = next((m for m in messages[at + 1 :] if isinstance(m, AssistantMessage)), None)
            if answer is not None:
                return await self.find(task_id_of(context_id, answer.id))
        active = await self.front.queue.active(context_id)
        if active is None:
            return None
        row = await self.front.queue.get(active.turn_id)
        if row is not None and row.options.user_message_id == stored_id:
            check_resend(fingerprint(row.input), says, incoming, context_id)
            return await self.find(task_id_of(context_id, row.message_id))
        raise _busy(context_id, self._running_in(context_id))

    async def _continue(self, incoming: wire.Incoming) -> LiveTask:
        live, stored_id = await self._task_waiting(incoming)
        if stored_id is None:
            return live
        turn, remaining = await self._record_queued(live, incoming)
        self._took_answers(live, incoming, stored_id, None if turn is not None else remaining)
        if turn is not None:
            self._follow(live, turn)
        return live

    async def _record_queued(
        self, live: LiveTask, incoming: wire.Incoming
    ) -> tuple[TurnStatus | None, Sequence[Any]]:
        """Record the decisions a message carries through the queue (all checked first:
        a bad one records nothing); the turn they put back when they completed its
        calls (else ``None``), and the calls still waiting."""
        record = await self.front.store.load(live.context_id)
        stored: Sequence[Message] = record.messages if record is not None else ()
        pending = pending_calls(stored)
        if not pending or pending[0].message_id != live.message_id:
            raise wire.A2AError(
                "UnsupportedOperation", f"task {live.id!r} does not wait for input any more"
            )
        answers = _decisions(wire.data_parts(incoming.parts), pending)
        tools = self.state.agent_for(live.context_id).tool_map
        limit = self.state.agent_for(live.context_id).budget.max_tool_result_chars
        bus = self.state.host.bus
        resumed = None
        try:  # (a large output checked in a thread, once: the recording does not again)
            answers, stored = await checked_decisions(stored, answers, tools, limit)
            known = record  # the checks' read: the first decision is made on it
            for key, decision in answers:
                decided = await self.front.decide(
                    bus, live.context_id, key, decision, tools, known=known, max_chars=limit
                )
                known = None  # (it moved the session: the next reads the store)
                if decided.recorded.complete:
                    resumed = decided.turn
        except DecisionError as exc:
            raise wire.invalid_params(str(exc)) from None
        except ApiError as exc:
            raise _refused(exc) from None
        return resumed, pending_calls(stored)

    # -- canceling ----------------------------------------------------------------------

    async def cancel(self, task_id: str) -> LiveTask:
        live = await self.find(task_id)
        if live.state == wire.CANCELED and not live.running:
            return live
        if live.state in wire.TERMINAL:
            raise wire.A2AError(
                "TaskNotCancelable", f"task {task_id!r} is {live.state}: it cannot be canceled"
            )
        turn_id = live.message_id.removeprefix(TURN_PREFIX)
        try:
            if live.running:
                turn = await self.front.queue.request_cancel(turn_id, CANCELED_REASON)
                if turn is not None and turn.status == RUNNING:
                    await self.front.relay.request_cancel(turn_id, CANCELED_REASON)
                with trio.move_on_after(FINAL_WAIT * 2):
                    await live.wait_settled()
                return live
            await self._deny_waiting(live, turn_id)
        except ApiError as exc:
            raise _refused(exc) from None
        live.set_state(wire.CANCELED, _agent_note(live.id, live.context_id, CANCELED_REASON))
        return live

    async def _deny_waiting(self, live: LiveTask, turn_id: str) -> None:
        """End a waiting task's turn through the queue (at once: no decision resumes it
        from then on), then deny what it waited for in its stored message, as the
        embedded book does. A decision that resumed it just before is cancelled with
        its continuation, through the worker that runs it."""
        turn = await self.front.queue.request_cancel(turn_id, CANCELED_REASON, waiting=True)
        if turn is not None and turn.status == RUNNING:
            await self.front.relay.request_cancel(turn_id, CANCELED_REASON)
            return
        record = await self.front.store.load(live.context_id)
        pending = pending_calls(record.messages) if record is not None else ()
        tools = self.state.agent_for(live.context_id).tool_map
        for call in pending:
            if call.message_id != live.message_id:
                continue
            decision = (
                Decision(approved=False, reason=CANCELED_REASON)
                if call.kind == APPROVAL
                else Decision(error=CANCELED_REASON)
            )
            try:
                await record_decision(
                    self.front.store, live.context_id, call.approval_id, decision, tools
                )
            except DecisionError:
                pass  # decided meanwhile

    def cancel_all(self, reason: str) -> int:
        """Nothing: a front end's tasks run on the workers, which a front end shutting
        down leaves running (a client may subscribe again on another front end)."""
        return 0


def _settle_from_row(live: LiveTask, turn: TurnStatus) -> None:
    """What the row of a turn that ended says over what its history says: a turn
    cancelled or failed before its message told so (nothing saved, cut while queued)."""
    ids = (live.id, live.context_id)
    if turn.status == "cancelled" and live.state != wire.CANCELED:
        live.set_state(wire.CANCELED, _agent_note(*ids, turn.cancel_reason or "canceled"))
    elif turn.status == "failed" and live.state != wire.FAILED:
        live.set_state(wire.FAILED, _agent_note(*ids, turn.error or "the turn failed"))
    elif turn.finish_reason == "superseded" and live.state != wire.CANCELED:
        live.set_state(wire.CANCELED, _agent_note(*ids, "superseded by a later message"))


__all__ = ["QueuedTaskBook"]
