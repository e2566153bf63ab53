"""Streaming a turn from the relay: the AI SDK resume endpoint and "stop from anywhere".

``GET /api/chat/{id}/stream``
    The AI SDK's ``useChat({resume: true})`` reconnect. 204 when the session has no
    turn streaming; otherwise the turn as a UI message stream, read from the relay
    (:mod:`runtime.relay`), so it works on any front end, not only the one that runs the
    turn. With no ``Last-Event-ID`` header and no ``?after_seq=`` the turn is replayed
    from its start (what the AI SDK expects of a resume); with either, only the chunks
    after that seq. Every event carries ``id: <seq>`` for the next reconnect. Leaving
    this stream never cancels the turn: it is only a viewer.
``POST /api/chat/{id}/stop``
    Cancel the session's running turn wherever it runs (the partial output is saved,
    marked interrupted): 202 ``{"turn_id": ...}``, or 204 when none is running.

A restarted step (a takeover re-runs it) goes out as the AI SDK's ``reset-step`` chunk,
which drops the current step's parts from the message; the re-run's own ``start-step``
for that step is then not repeated. When the relay lost the turn or cannot prove what it
has is the turn whole (expired, Redis restarted, a writer overflowed, a takeover started
the stream over, junk in its keys: :mod:`actors.relays.redis_entries`) a full replay is
rebuilt from the stored message; a resume after a seq gets an ``error`` chunk telling the
client to reload the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import orjson
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from runtime import output as o
from runtime.app.web.guard import is_number
from runtime.app.web.http import (
    ApiError,
    json_response,
    relay_failed,
    session_id_param,
    web_state,
)
from runtime.app.web.signing import ApprovalSigner, SessionSigner, for_session
from runtime.app.web.ui_stream import DONE, HEADERS, UIStreamEncoder, error_text, sse
from runtime.app.web.writer import BodyPump, BodyWriter, Write
from runtime.approval import pending_calls
from runtime.busy import HELD_STOP_ID_MAX
from runtime.chunks import Usage
from runtime.errors import RelayTurnGone, RelayUnavailable, StoreError
from runtime.liveness import RUNNING_META
from runtime.messages import AssistantMessage, ReasoningPart, TextPart, ToolCallPart, ToolMessage
from runtime.output import ErrorInfo
from runtime.relay import StepRestarted
from runtime.store import load_last_turn

HELD_MAX = 256
"""The most chunks a resumed stream holds back after an approval request it cannot sign
yet (:meth:`RelayStreamResponse._relay_events`): a suspending turn ends a few chunks
after its requests (the step's finish, the other requests, the turn's)."""

_TURN_ENDS = (o.Finish, o.Error, o.Abort)

STOPPED = "stopped by user"
"""The abort reason of a turn stopped through ``POST /api/chat/{id}/stop``."""


def parse_after_seq(request: Request) -> int | None:
    """The seq a reconnecting client saw last: ``?after_seq=`` or ``Last-Event-ID``."""
    raw = request.query_params.get("after_seq") or request.headers.get("last-event-id")
    if raw is None or raw == "":
        return None
    if not is_number(raw) or len(raw) > 18:
        raise ApiError(400, "after_seq / Last-Event-ID must be a non-negative integer")
    return int(raw)


class RelayEncoder(UIStreamEncoder):
    """The UI message stream encoder, plus relay markers and SSE ids.

    A turn taken over by another worker streams its ``start`` again (the new worker
    starts the same message over): the client already has that message, and a second
    ``start`` would open a second one, so a ``start`` for a message id already started is
    dropped."""

    def __init__(self, announced: Iterable[str] = (), signer: SessionSigner | None = None) -> None:
        super().__init__(announced, signer)
        self._reset_step: int | None = None
        self._started: set[str] = set()

    def encode(self, chunk: Any) -> list[dict[str, Any]]:
        if type(chunk) is o.Start:
            if chunk.message_id in self._started:
                return []
            self._started.add(chunk.message_id)
        elif type(chunk) is StepRestarted:
            self._reset_step = chunk.step
            self.restart_step(chunk.step)
            return [{"type": "reset-step"}]
        if type(chunk) is o.StepStart and chunk.step == self._reset_step:
            self._reset_step = None
            return []  # ``reset-step`` kept the step's ``step-start`` part
        return super().encode(chunk)

    def events(self, chunk: Any) -> bytes:
        seq = getattr(chunk, "seq", 0)
        prefix = f"id: {seq}\n".encode() if seq else b""
        return b"".join(prefix + sse(c) for c in self.encode(chunk))


def stored_turn_chunks(
    messages: Any, message_id: str | None = None, *, only: bool = False
) -> list[Any]:
    """An assistant message of a stored history as output chunks (a rebuilt turn): the
    one with id ``message_id`` when it is stored, else (unless ``only``: nothing then)
    the last one."""
    messages = list(messages)
    assistants = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]
    index = next((i for i in assistants if messages[i].id == message_id), None)
    if index is None and assistants and not only:
        index = assistants[-1]
    if index is None:
        return []
    message = messages[index]
    results = {m.tool_call_id: m for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
    usage = Usage(input_tokens=0, output_tokens=0, total_tokens=0)
    out: list[Any] = [o.Start(message_id=message.id)]
    suspended = False  # a call still waits for a decision (docs/approval.md)
    n = 0
    for step_parts in message.steps():
        if not step_parts:
            continue
        step = step_parts[0].step
        out.append(o.StepStart(step=step))
        for part in step_parts:
            n += 1
            out += _part_chunks(part, step, f"{message.id}-p{n}", results)
            suspended = suspended or _undecided(part, results)
        out.append(o.StepFinish(step=step, finish_reason="other", usage=usage))
    if message.error is not None:
        out.append(o.Error(error=message.error))
    elif message.interrupted:
        out.append(o.Abort(reason="interrupted"))
    else:
        reason = "awaiting-input" if suspended else "stop"
        out.append(o.Finish(finish_reason=reason, usage=usage))
    return out


def _part_chunks(part: Any, step: int, pid: str, results: dict[str, ToolMessage]) -> list[Any]:
    """One stored part as the chunks that streamed it (whole, one delta each): a text or
    reasoning part's start, delta and finish; a tool call and what became of it."""
    if isinstance(part, TextPart):
        return [
            o.TextStart(step=step, part_id=pid),
            o.TextDelta(step=step, part_id=pid, text=part.text),
            o.TextFinish(step=step, part_id=pid),
        ]
    if isinstance(part, ReasoningPart) and part.text:
        return [
            o.ReasoningStart(step=step, part_id=pid),
            o.ReasoningDelta(step=step, part_id=pid, text=part.text),
            o.ReasoningFinish(step=step, part_id=pid),
        ]
    if isinstance(part, ToolCallPart):
        call = o.ToolCall(
            step=step, tool_call_id=part.tool_call_id, tool_name=part.tool_name, input=part.input
        )
        return [call, *_call_outcome(part, step, results)]
    return []


def _undecided(part: Any, results: dict[str, ToolMessage]) -> bool:
    """Whether ``part`` is a call that still waits for a decision (no result yet)."""
    if not isinstance(part, ToolCallPart):
        return False
    waiting = part.awaiting
    return waiting is not None and part.tool_call_id not in results and not waiting.decided


def _call_outcome(part: ToolCallPart, step: int, results: dict[str, ToolMessage]) -> list[Any]:
    """What became of a stored call: its approval request while it waits for one, its
    denial, its error or its result (nothing while it runs or waits for the client)."""
    name, call = part.tool_name, part.tool_call_id
    result = results.get(call)
    waiting = part.awaiting
    if _undecided(part, results):
        assert waiting is not None
        if waiting.kind != "approval":
            return []
        return [
            o.ToolApprovalRequest(
                step=step,
                tool_call_id=call,
                tool_name=name,
                approval_id=waiting.id,
                asked_tool=waiting.asked_tool,
                asked_input=waiting.asked_input,
                asked_via=waiting.asked_via,
            )
        ]
    if waiting is not None and result is not None and waiting.approved is False:
        return [
            o.ToolOutputDenied(step=step, tool_call_id=call, tool_name=name, reason=waiting.reason)
        ]
    if result is not None and result.error is not None:
        return [o.ToolError(step=step, tool_call_id=call, tool_name=name, error=result.error)]
    if result is not None:
        return [o.ToolResult(step=step, tool_call_id=call, tool_name=name, output=result.output)]
    return []


class RelayStreamResponse:
    """Streams a turn from the relay; the client leaving only stops this stream."""

    def __init__(
        self,
        relay: Any,
        store: Any,
        session_id: str,
        turn_id: str,
        *,
        after_seq: int | None,
        keepalive: float,
        send_timeout: float | None,
        background: trio.Nursery | None,
        after_pauses: int = 0,
        announced: Iterable[str] = (),
        load: Any = None,
        host: Any = None,
        signer: ApprovalSigner | None = None,
    ) -> None:
        self.relay = relay
        self.signer = for_session(signer, session_id)
        """Signs the approval requests streamed (:mod:`runtime.app.web.signing`)."""
        self.store = store
        self.load = load
        self.host = host
        """The embedded host serving the resume, if any: what it knows of the turn's
        message (:meth:`_message_of`)."""
        """How the stored session is read when the relay lost the turn (an embedded
        host's :meth:`~runtime.app.host.Host.load_settled`: a turn whose host was killed
        is replayed ending interrupted, as the page then shows it)."""
        self.session_id = session_id
        self.turn_id = turn_id
        self.after_seq = after_seq
        self.after_pauses = after_pauses
        """Stream only what follows the turn's ``after_pauses``-th wait for input (the
        continuation a decision started)."""
        self.announced = tuple(announced)
        """Calls the client knows (a continuation's waiting calls): no input for them again."""
        self.keepalive = keepalive
        self.send_timeout = send_timeout
        self.background = background
        self.sent = False
        """Whether any of the turn's events went out."""
        self.handed = False
        """Whether the stream was handed over at a message its client steered in (it
        ended with that ``finish`` and ``[DONE]``: :mod:`runtime.app.web.frontend`)."""
        self.cut = False
        """Whether the stream was ended before its turn did (a front end closing:
        :mod:`runtime.app.web.frontend`): no ``[DONE]``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = BodyWriter.ok(send, HEADERS, timeout=self.send_timeout)
        async with trio.open_nursery() as local:
            (self.background or local).start_soon(writer.run)
            ok = True
            try:
                ok = await self._pump(receive, writer)
            except BaseException:
                writer.abandon()
                raise
            if not ok or writer.stalled or not await writer.close():
                writer.abandon()

    async def _pump(self, receive: Receive, writer: BodyWriter) -> bool:
        encoder = RelayEncoder(self.announced, self.signer)

        async def body(write: Write) -> None:
            await self._body(write, encoder)
            if not (self.handed or self.cut):
                await write(DONE)

        pump = BodyPump(writer, self.keepalive)
        await pump.run(receive, body)
        return pump.left is None

    async def _body(self, write: Any, encoder: RelayEncoder) -> None:
        """The turn's events, written with ``await write(data)`` (the relay's, else what
        the store has)."""
        try:
            await self._relay_events(write, encoder)
        except RelayTurnGone as exc:
            replay = self.after_seq is None and not self.sent
            await write(await self._rebuilt(exc, replay=replay))
        except RelayUnavailable as exc:
            await write(unavailable_event(exc, self.session_id))

    async def _relay_events(self, write: Any, encoder: RelayEncoder) -> None:
        """Write the turn's events from the relay until it ends (:attr:`sent` tells
        whether any went out, also when this raised).

        With a signer, an approval request whose call went out before this stream's
        first seq (a resume with ``Last-Event-ID``) has no input here to sign, and the
        store does not hold the call yet when the request reaches the relay (the step
        is saved after it). So from such a request on the chunks are held, in their
        order, until the turn's end (its ``finish``, ``error`` or ``abort``: the
        suspended step saved by then), at most :data:`HELD_MAX` of them; then the
        store's waiting calls give the inputs (:meth:`_learn_inputs`) and the held
        chunks go out, each with its own id, the requests signed. Before, the
        reconnecting client got the request unsigned."""
        held: list[Any] = []
        async for chunk in self._read():
            if held or (type(chunk) is o.ToolApprovalRequest and encoder.unsigned(chunk)):
                await self._write_events(write, encoder, await self._release(chunk, encoder, held))
                continue
            data = encoder.events(chunk)
            if data:
                self.sent = True
                await write(data)
        await self._write_events(write, encoder, await self._release(None, encoder, held))

    async def _release(self, chunk: Any, encoder: RelayEncoder, held: list[Any]) -> list[Any]:
        """The chunks to write now that ``chunk`` was read (``None``: the read ended),
        with ``held`` the ones held back so far (:meth:`_relay_events`)."""
        if chunk is not None:
            if not (held or encoder.unsigned(chunk)):
                return [chunk]
            held.append(chunk)
            if type(chunk) not in _TURN_ENDS and len(held) < HELD_MAX:
                return []
        if not held:
            return []
        await self._learn_inputs(encoder, held)
        out = held[:]
        held.clear()
        return out

    async def _write_events(self, write: Any, encoder: RelayEncoder, chunks: list[Any]) -> None:
        data = b"".join([encoder.events(c) for c in chunks])
        if data:
            self.sent = True
            await write(data)

    async def _learn_inputs(self, encoder: RelayEncoder, chunks: list[Any]) -> None:
        """Give ``encoder`` the stored input of each call an approval request among
        ``chunks`` names and it cannot sign: the waiting call of that approval id as the
        store holds it (what a continuation's signature is checked against). One the
        store does not hold undecided (a save that failed, decided meanwhile), or a
        store that does not answer, leaves its request unsigned, as before."""
        wanted = {(c.approval_id, c.tool_call_id) for c in chunks if encoder.unsigned(c)}
        if not wanted:
            return
        try:
            last = await load_last_turn(self.store, self.session_id)  # (not the history)
        except StoreError:
            return
        for call in pending_calls(last[1].messages) if last is not None else ():
            if (call.approval_id, call.tool_call_id) in wanted:
                encoder.learn_input(call.tool_call_id, call.input)

    def _read(self) -> AsyncIterator[Any]:
        """The relay's read of the turn (after :attr:`after_seq`, :attr:`after_pauses`)."""
        pauses = {"after_pauses": self.after_pauses} if self.after_pauses else {}
        return self.relay.read(self.turn_id, after_seq=self.after_seq, **pauses)  # type: ignore[no-any-return]

    async def _rebuilt(
        self, exc: RelayTurnGone, *, replay: bool, message_id: str | None = None
    ) -> bytes:
        """What a client gets when the relay lost the turn: the stored message replayed
        (a full replay not yet begun), else an error telling it to reload the session."""
        if replay:
            if message_id is None:  # (a worker's front end names it from the turn's row)
                message_id, told = await self._message_of()
                if told is not None:  # as its live stream ended (runtime.app.unsaved)
                    return sse({"type": "error", "errorText": error_text(told.kind, told.message)})
            record = await (self.load or self.store.load)(self.session_id)
            chunks = (
                stored_turn_chunks(record.messages, message_id, only=True)
                if record is not None and message_id is not None
                else []
            )
            if chunks:
                encoder = UIStreamEncoder(signer=self.signer)
                return b"".join(encoder.events(c) for c in chunks)
        text = error_text(
            exc.kind, f"{exc.message}; reload the session (GET /api/sessions/{self.session_id})"
        )
        return sse({"type": "error", "errorText": text})

    async def _message_of(self) -> tuple[str | None, ErrorInfo | None]:
        """The id of the turn's assistant message, when something ties one to the turn,
        and what its client was told when it was not saved: the host's own record of its
        last turn (it ran here), else the store's running marker (a step of it
        committed, it runs or its writer died). Nothing else may be rebuilt: the store's
        last assistant message is the previous turn's when this one was not stored (its
        save refused, or not reached yet), and was shown, ending ``finish``, as this
        turn's answer."""
        session = self.host.sessions.get(self.session_id) if self.host is not None else None
        last = getattr(session, "last_turn", None)
        if last is not None and last[0] == self.turn_id:
            return last[1], last[2]
        record = await self.store.load(self.session_id)  # (before a dead writer's settling)
        marker = record.meta.get(RUNNING_META) if record is not None else None
        if isinstance(marker, Mapping) and marker.get("turn_id") == self.turn_id:
            found = marker.get("message_id")
            return (found if isinstance(found, str) else None), None
        return None, None


def unavailable_event(exc: RelayUnavailable, session_id: str | None = None) -> bytes:
    """The ``error`` event of a stream whose relay stopped answering; with
    ``session_id`` (a client shown part of the turn, whose worker saves it all the
    same), it tells the client to reload the session for the saved answer. Its text is
    :data:`~runtime.app.web.http.RELAY_UNAVAILABLE`, the error's own (Redis's address)
    logged."""
    message = relay_failed(exc, session_id=session_id)
    if session_id is not None:
        message += f"; reload the session (GET /api/sessions/{session_id})"
    return sse({"type": "error", "errorText": error_text(exc.kind, message)})


async def local_turn_id(host: Any, session_id: str) -> str | None:
    """The id of the turn ``host`` itself runs for ``session_id``, if any."""
    session = host.sessions.get(session_id)
    current = session.current if session is not None else None
    return current.turn_id if current is not None else None


async def cancel_turn(state: Any, session_id: str) -> str | None:
    """Cancel the session's running turn wherever it runs; the turn id, or ``None``.

    Local first (this process runs it), then ``state.cancel_hook`` (a worker deployment's
    ``request_cancel``), then the relay's cancel channel (another embedded host)."""
    session = state.host.sessions.get(session_id)
    current = session.current if session is not None else None
    if current is not None:
        current.cancel(STOPPED)
        return current.turn_id or ""
    relay = state.relay
    turn_id = await relay.active_turn(session_id) if relay is not None else None
    if turn_id is None:
        return None
    if state.cancel_hook is not None:
        await state.cancel_hook(turn_id)
    if relay is not None and hasattr(relay, "request_cancel"):
        await relay.request_cancel(turn_id, STOPPED)
    return turn_id


async def forward_stop(
    relay: Any, session_id: str, message_id: str | None, named_turn: str | None
) -> str | None:
    """Send a stop naming ``message_id`` or ``named_turn`` to the embedded host that runs
    the session's turn (this one holds nothing of the session): over the relay's cancel
    channel, as a named stop that host matches as its own ``POST .../stop`` would
    (``Host.stop_named``). The session's running turn id; ``""`` when the relay streams
    none: a turn may have started on another host and not written its first chunk yet,
    so the stop is sent to every host all the same (the one that holds what it names
    stops it; before, it was dropped and that turn ran to its end), and each that holds
    nothing so named keeps it for a new message's turn it names that starts there within
    a minute (its POST not there yet: :mod:`actors.relays.publisher`); ``None`` when the
    relay cannot forward a stop."""
    if not hasattr(relay, "request_cancel"):
        return None
    turn_id: str = await relay.active_turn(session_id) or ""
    await relay.request_cancel(
        turn_id, STOPPED, session_id=session_id, message_id=message_id, named_turn=named_turn
    )
    return turn_id


async def _unavailable_as_503(call: Any) -> Any:
    try:
        return await call
    except RelayUnavailable as exc:
        raise ApiError(503, relay_failed(exc), {"retry-after": "1"}) from None


async def turn_to_resume(
    relay: Any, store: Any, session_id: str, after_seq: int | None
) -> str | None:
    """The turn a resume of ``session_id`` (``GET /api/chat/{id}/stream``) streams: the
    one streaming, or, resumed after ``after_seq``, the latest one that ended while the
    relay keeps its stream (``RedisRelay.resumable_turn``), unless the store no longer
    holds the session (one query, for such a turn only).

    Why: the relay keeps an ended turn's stream 15 minutes whatever happens to its
    session, so a session deleted after its turn ended (and each sub-session of its agent
    tools, deleted with it) was replayed whole to ``Last-Event-ID: 0``, on every front
    end."""
    resumable = getattr(relay, "resumable_turn", None)
    if resumable is None:
        turn_id: str | None = await _unavailable_as_503(
            relay.active_turn(session_id, after_seq=after_seq)
        )
        return turn_id
    found = await _unavailable_as_503(resumable(session_id, after_seq=after_seq))
    if found is None:
        return None
    turn_id, ended = found
    if ended and await store.version(session_id) == 0:
        return None  # (deleted since: nothing of it is shown again)
    return turn_id


async def resume_stream(request: Request) -> Any:
    state = web_state(request)
    state.host.check_not_closing()  # (503: a stream of a turn its shutdown ends)
    session_id = session_id_param(request.path_params["session_id"])
    after_seq = parse_after_seq(request)
    relay = state.relay
    if relay is None:
        return Response(status_code=204)  # no relay: nothing can be resumed
    turn_id = await turn_to_resume(relay, state.host.store, session_id, after_seq)
    if turn_id is None:
        return Response(status_code=204)
    return RelayStreamResponse(
        relay,
        state.host.store,
        session_id,
        turn_id,
        after_seq=after_seq,
        keepalive=state.keepalive,
        send_timeout=state.send_timeout,
        background=state.background,
        load=state.host.load_settled,
        host=state.host,
        signer=state.signer,
    )


async def stop_target(request: Request) -> tuple[str | None, str | None]:
    """The ``(messageId, turnId)`` a stop's JSON body names, each optional."""
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        raise ApiError(400, "the body of a stop must be a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body of a stop must be a JSON object")
    named = []
    for field in ("messageId", "turnId"):
        value = body.get(field)
        if value is not None and (not isinstance(value, str) or not value):
            raise ApiError(400, f"{field} must be a non-empty string")
        named.append(value)
    return named[0], named[1]


async def stop_turn(request: Request) -> Response:
    """Stop the session's running turn; a body naming a message (``messageId``, the
    client's id of a user message, or of the answer a regenerate replaces) or a turn
    (``turnId``) that waits for that turn (queued, or to be steered into it) takes it
    out instead: it never runs, its client's stream ends (``abort``, the reason
    :data:`STOPPED`), nothing is stored for it, the running turn goes on. One that names
    neither a waiting nor the running turn here stops nothing (204); with a relay, a host
    running no turn of the session forwards it (202 ``forwarded``, :func:`forward_stop`),
    also when the relay streams no turn of the session (``turn_id`` null): a turn that
    has not written its first chunk yet runs on another host all the same."""
    state = web_state(request)
    # Closing: 503, nothing stopped, held or forwarded (the shutdown stops its turns; a
    # stop held on the way out would stop a message the client sends elsewhere).
    state.host.check_not_closing()
    session_id = session_id_param(request.path_params["session_id"])
    message_id, named_turn = await stop_target(request)
    if message_id is not None or named_turn is not None:
        stopped = state.host.stop_named(
            session_id, message_id=message_id, turn_id=named_turn, reason=STOPPED
        )
        if stopped is not None:
            turn_id, queued = stopped
            return json_response({"turn_id": turn_id, **({"queued": True} if queued else {})}, 202)
        # The message it names may be on its way still (its POST and this stop race):
        # kept, it is taken out if it comes to wait for the running turn.
        state.host.hold_stop(session_id, message_id=message_id, turn_id=named_turn, reason=STOPPED)
        session = state.host.sessions.get(session_id)
        if state.relay is None or (session is not None and session.current is not None):
            return Response(status_code=204)  # not this session's running turn: left alone
        if len(message_id or "") > HELD_STOP_ID_MAX or len(named_turn or "") > HELD_STOP_ID_MAX:
            # (names no message or turn a client sends, and would cost every host of the
            # relay its bytes, Redis too: a 48 MiB body's id, 60 s; not forwarded)
            return Response(status_code=204)
        forwarded = await _unavailable_as_503(
            forward_stop(state.relay, session_id, message_id, named_turn)
        )
        if forwarded is None:
            return Response(status_code=204)
        return json_response({"turn_id": forwarded or None, "forwarded": True}, 202)
    turn_id = await _unavailable_as_503(cancel_turn(state, session_id))
    if turn_id is None:
        return Response(status_code=204)
    return json_response({"turn_id": turn_id}, 202)


__all__ = [
    "RelayEncoder",
    "RelayStreamResponse",
    "cancel_turn",
    "parse_after_seq",
    "resume_stream",
    "stop_target",
    "stop_turn",
    "stored_turn_chunks",
    "turn_to_resume",
]
