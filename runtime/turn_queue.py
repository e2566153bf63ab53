"""The durable turn queue contract: turns as rows any worker may claim, run and commit.

In the worker deployment (docs/deployment.md) front ends *submit* user inputs to a queue
that lives in the shared store, and worker processes *claim* them, run them under a
lease, commit every step fenced by their claim, and *finish* them. This module states
what a front end and a worker need of that queue (:class:`TurnQueue`) and the values it
hands out (:class:`TurnStatus`, :class:`QueuedTurn`, :class:`Claim`, :class:`Renewal`),
so that the worker and the front end depend on no particular database. PostgreSQL's
implementation is :class:`actors.stores.turns.TurnQueue`; the application obtains one
through :func:`actors.stores.turn_queue`, keyed by the store's URL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol, runtime_checkable

import attrs

from runtime.approval import AWAITING_INPUT, Decision, Recorded
from runtime.busy import OnBusy
from runtime.messages import Message, UserContent
from runtime.store import SessionRecord, Store
from runtime.tools import Tool

QUEUED: Final = "queued"
RUNNING: Final = "running"
DONE: Final = "done"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
FINAL_STATUSES: Final = frozenset({DONE, FAILED, CANCELLED})
"""The statuses a turn ends in; :meth:`TurnQueue.finish` accepts only these."""
WAITING: Final = AWAITING_INPUT
"""A turn that suspended to wait for a person (docs/approval.md): no owner, no lease,
nothing held; the decision that completes its calls puts it back to be claimed."""
SUPERSEDED: Final = "superseded"
"""The finish reason of a waiting turn that a later turn of its session replaced."""
STEERED: Final = "steered"
"""The finish reason of a queued message that joined the running turn it was submitted
to steer (``on_busy="steer"``): it is ``done`` without running, its input stored in that
turn (before the step whose model call first saw it)."""


@attrs.frozen(kw_only=True, slots=True)
class ClientToolSpec:
    """A client-side tool as a queued turn carries it (:meth:`runtime.tools.Tool.client`
    is rebuilt from it by the worker): a protocol's caller declares its own tools per
    request (AG-UI's ``tools``), and the worker that runs the turn is another process."""

    name: str
    schema: dict[str, Any]
    """The JSON schema of the arguments object."""
    description: str = ""

    @classmethod
    def of(cls, tool: Tool) -> ClientToolSpec:
        """The spec of a client-side tool (:meth:`runtime.tools.Tool.client`)."""
        return cls(name=tool.name, schema=dict(tool.parameters), description=tool.description)

    def tool(self, budget: list[int] | None = None) -> Tool:
        """The client-side tool, its schema a caller's (untrusted): its patterns run in
        linear time, compiled within ``budget`` (shared by a turn's tools;
        :func:`runtime.tools.linear_schema_validator`)."""
        return Tool.client(self.name, self.schema, self.description, trusted=False, budget=budget)


@attrs.frozen(kw_only=True, slots=True)
class TurnOptions:
    """What a queued turn carries beyond its input: what a protocol's request says of
    this turn alone (AG-UI, the OpenAI endpoint, A2A), which the embedded app hands to
    ``session.stream`` directly and a worker deployment's front end puts in the row.
    None of it is part of the input a retry is compared by."""

    user_message_id: str | None = None
    """The id the turn's user message is stored under (the client's), so the protocol
    recognises it again (a replayed AG-UI run, an A2A ``messageId`` sent twice)."""
    tools: tuple[ClientToolSpec, ...] = ()
    """Client-side tools offered to the model for this turn only (continuations too)."""
    instructions: str | None = None
    """Added after the agent's instructions for this turn only."""
    history: tuple[Message, ...] | None = None
    """Messages a session that is not stored yet starts from (an AG-UI thread the client
    already holds, a stateless OpenAI request's conversation)."""
    ephemeral: bool = False
    """The session is only this turn's: the worker deletes it once the turn is over (a
    stateless OpenAI request), and a turn that would wait for input ends instead, since
    nobody can answer it."""
    regenerates: str | None = None
    """A regenerate's: the id of the assistant message it replaces (the AI SDK's
    ``messageId``). The worker refuses the turn as it would start
    (:class:`~runtime.errors.RegenerateOutdated`: it fails, nothing cut or stored) when
    a user message follows that message in the session: the turn it waited for answered
    a later message, whose turn it would cut. ``None`` (a row queued before this field):
    the last turn is replaced whatever it is, as before."""
    follows: str | None = None
    """A steering message's (``on_busy="steer"``): the id of the assistant message its
    client shows the running turn's answer in (the message before it in a ``useChat``
    body). When that is one of the running turn's answers, the client reads the rest of
    the turn from this message's own stream: the stream showing that answer ends at the
    ``steered`` chunk (:mod:`runtime.app.web.frontend`), as the embedded app's
    ``follow`` does."""

    @property
    def empty(self) -> bool:
        return self == NO_OPTIONS


NO_OPTIONS: Final = TurnOptions()


@attrs.frozen(kw_only=True, slots=True)
class TurnStatus:
    """Where a turn stands, without its input: what front ends poll and show.

    Status reads (:meth:`TurnQueue.get_status`, :meth:`~TurnQueue.active`,
    :meth:`~TurnQueue.request_cancel`) never decode a turn's input, which may be
    thousands of parts. A :class:`QueuedTurn` is a status with its input."""

    turn_id: str
    session_id: str
    seq: int
    """Submission order across the whole queue: orders a session's turns."""
    status: str
    """``queued``, ``running``, ``done``, ``failed``, ``cancelled`` or ``awaiting-input``."""
    owner: str | None
    epoch: int
    """Bumped by every claim: the fence that tells the current worker from earlier ones."""
    attempts: int
    saved: bool
    """A fenced save of this turn committed (it may have steps in the session)."""
    cancel_requested: bool
    cancel_reason: str | None
    finish_reason: str | None
    error: str | None
    resumes: int = 0
    """How many times the turn went on after waiting for input: its continuation number
    (the relay stream's pauses it follows)."""
    expires_at: float | None = None
    """While it waits: when the wait expires (wall-clock seconds since the epoch)."""

    @property
    def message_id(self) -> str:
        """The id of the turn's assistant message: stable, so a worker taking the turn
        over continues the message its predecessor saved instead of starting another."""
        return f"msg_{self.turn_id}"

    @property
    def finished(self) -> bool:
        """The turn ended (``done``, ``failed`` or ``cancelled``)."""
        return self.status in FINAL_STATUSES

    @property
    def waiting(self) -> bool:
        """The turn waits for a person's input (``awaiting-input``)."""
        return self.status == WAITING


@attrs.frozen(kw_only=True, slots=True)
class QueuedTurn(TurnStatus):
    """One queued turn: a user input and where its run stands."""

    input: UserContent
    meta: dict[str, Any]
    """What the front end attached to the turn (merged into the session's meta by the runner)."""
    regenerate: bool
    """Replace the session's last answer instead of adding a new input."""
    idempotency_key: str | None
    """The queue's unique key of this submission (a hash of the caller's key, the input
    and the turn an edit replaces), not the caller's key; ``None`` for an unkeyed one."""
    options: TurnOptions = NO_OPTIONS
    """What the turn carries beyond its input (:class:`TurnOptions`)."""
    steer_of: str | None = None
    """The running turn this message was submitted to steer (``on_busy="steer"``): that
    turn's worker takes it at its next step boundary (:meth:`TurnQueue.take_steering`);
    if the turn ends first, this row runs as a turn of its own, in its place in line."""

    @property
    def user_message_id(self) -> str:
        """The id of the turn's user message when it steers another turn: the client's,
        else one derived from the turn id (stable: a worker taking that turn over stores
        the same message)."""
        return self.options.user_message_id or f"msg_user_{self.turn_id}"


@attrs.frozen(kw_only=True, slots=True)
class Claim:
    """A worker's hold on a running turn: the turn as claimed and its ``(owner, epoch)``."""

    turn: QueuedTurn
    owner: str
    epoch: int
    takeover: bool
    """Another worker held the turn before (its lease expired or it released the turn):
    the session may already hold steps of this turn, which the runner resumes from."""
    resumed: bool = False
    """The turn waited for input and its calls are decided now: this claim runs its
    continuation (in the same assistant message, its relay stream going on after the
    wait), not a takeover."""
    stored: SessionRecord | None = None
    """The session as the claim read it (a continuation's in the claim's transaction: its
    decisions were recorded elsewhere; another turn's right after it, when the worker
    asked: ``load``), for the turn to start from without reading it again
    (``RunTurn.stored``; a session not stored yet is an empty record at version 0);
    ``None``: the turn reads it."""


@attrs.frozen(kw_only=True, slots=True)
class Decided:
    """What :meth:`TurnQueue.decide` recorded: the decision, and the waiting turn's row
    as it stands after it (put back to be claimed, ``resumes`` counted, when the
    decision was the last its turn waited for)."""

    recorded: Recorded
    turn: TurnStatus


@attrs.frozen(kw_only=True, slots=True)
class Renewal:
    """What a lease renewal learnt: whether the lease still holds, and whether someone
    asked for the turn to be cancelled."""

    held: bool
    cancel_requested: bool = False
    cancel_reason: str | None = None
    let_go: bool = False
    """Not held because this claim's own commit let the row go (the step that made the
    turn wait for a person, or its last step: no other claim since, but the claim of
    the continuation a decision started): no loss. A renewal can run between that commit
    and its answer reaching the worker, and a decision can come in between too."""
    deleted: bool = False
    """Not held because the turn's session was deleted while it ran (the delete ended
    the row ``cancelled`` at this claim's epoch, no owner, reason ``session deleted``):
    no other worker holds it, and there is nothing left to save it in. No loss either."""


class LeaseRenewer(Protocol):
    """Renews leases from a thread of the worker's own (:class:`runtime.app.worker.LeaseKeeper`),
    on a connection of its own, so that nothing the event loop does can delay a renewal.
    Blocking; a renewal that raises is retried on a new renewer."""

    def renew(self, turn_id: str, owner: str, epoch: int) -> Renewal:
        """Extend the lease of the claim ``(turn_id, owner, epoch)``, if it still holds."""
        ...

    def close(self) -> None: ...


@attrs.define(eq=False)
class SteerWatch:
    """What a claimed turn's fenced saves learn of the steering submitted to it, so its
    worker reads the queue's steering rows only when there are new ones.

    A ``steer`` submit counts itself on the running turn's row (``steers``) in the
    transaction that queues its message; every fenced save reads the count with the
    fence check it makes anyway (no statement more) and leaves it in :attr:`steers`.
    At a step boundary (the runner waits for the previous step's save first) the worker
    reads the rows only when :attr:`steers` passed :attr:`taken`, the count its last read
    of them saw. That read returns the count from its own snapshot, so a message
    submitted after it is counted past it: taken at a later boundary, or run as a turn
    of its own if the turn ends first."""

    steers: int = 0
    """The highest count a committed fenced save of the turn read on its row."""
    taken: int = 0
    """The count as of the last read of the steering rows (``-1``: read at the first
    boundary whatever the saves say: a takeover, whose turn may hold steering its
    earlier worker never took)."""

    @property
    def pending(self) -> bool:
        """Steering submitted since the last read of the rows, as far as saves tell."""
        return self.steers > self.taken

    def saw(self, steers: int) -> None:
        """A fenced save of the turn committed, having read ``steers`` on its row."""
        self.steers = max(self.steers, steers)


@attrs.frozen(kw_only=True, eq=False)
class NextClaim:
    """How a worker lets a turn's last save claim the next turn for the slot the turn
    frees (:meth:`TurnQueue.fenced`'s ``claim_next``: one store call where there were
    two, the save's and then the claim's); the save of the step that makes the turn
    wait for a person frees the slot too, and claims alike. The queue asks
    :attr:`wanted` right before it sends such a save; when the call claimed a turn, it calls
    :attr:`on_claimed` (as :meth:`TurnQueue.claim`'s) and then :attr:`claimed`, both
    at once, on the event loop, with nothing awaited since the answer: the claim is the
    worker's to start or give back from then on."""

    wanted: Callable[[], bool]
    """Whether the worker will run a turn in the slot (not stopping...)."""
    on_claimed: Callable[[str, str, int], None]
    """``(turn_id, owner, epoch)`` of the claimed turn: its lease is held from here."""
    claimed: Callable[[NextClaimed], None]
    """The claimed turn, to be read (:attr:`NextClaimed.take`) and started."""
    load: Callable[[str], bool] | None = None
    """As :meth:`TurnQueue.claim`'s: whether the claimed turn's session is read for it."""
    found_none: Callable[[], None] | None = None
    """Called, as :attr:`claimed` would be, when the save's claim found nothing to take:
    no head claimable, no expired lease, no decided turn as of the save's commit (not
    when it was not made, nor when its answer was lost): the worker's loop then has no
    claim to make before it waits for the queue's next ``NOTIFY``."""


@attrs.frozen(kw_only=True, eq=False)
class NextClaimed:
    """A turn claimed by a last save (:class:`NextClaim`), not read yet."""

    turn_id: str
    owner: str
    epoch: int
    take: Callable[[], Any]
    """``await take()``: the :class:`Claim` (its input decoded, its session read if
    asked): what :meth:`TurnQueue.claim` would have returned."""


@runtime_checkable
class TurnQueue(Protocol):
    """Durable turns in a shared store: what a front end submits and reads, and what a
    worker claims, holds and ends.

    Turns of one session run one at a time, in submission order; turns of different
    sessions run in parallel on any workers. A claim is a lease of :attr:`lease`
    seconds: a worker that stops renewing loses the turn, and the next claim takes it
    over (``epoch + 1``); every save of the session made inside :meth:`fenced` is refused
    once the claim no longer holds the turn."""

    @property
    def store(self) -> Store:
        """The store the queue lives in: the sessions its turns run on."""
        ...

    @property
    def lease(self) -> float:
        """Seconds a claim or renewal holds a turn."""
        ...

    # -- front ends -------------------------------------------------------------------------

    async def submit(
        self,
        session_id: str,
        input: UserContent,
        *,
        idempotency_key: str | None = None,
        meta: dict[str, Any] | None = None,
        regenerate: bool = False,
        turn_id: str | None = None,
        options: TurnOptions | None = None,
        on_busy: OnBusy | None = None,
        stop_name: str | None = None,
    ) -> QueuedTurn:
        """Queue a turn for ``session_id`` and wake the workers; a resubmit with the same
        ``idempotency_key`` and input returns the turn already queued. ``options`` are
        what the turn carries beyond its input (:class:`TurnOptions`). Raises
        :class:`~runtime.errors.QueueFull` over a cap, :class:`~runtime.errors.TurnConflict`
        for a key another turn holds. ``on_busy`` (``enqueue``, the default; ``reject``:
        :class:`~runtime.errors.SessionBusy` while a turn of the session is queued or
        running; ``interrupt``: those are cancelled first; ``steer``: the row names the
        session's running turn in :attr:`QueuedTurn.steer_of`, whose worker takes it at
        its next step boundary) is decided atomically with the insert. ``stop_name``:
        the client's id a stop names this message by; a message never submitted before
        takes the stop :meth:`hold_stop` kept for it, and its turn is stopped as it
        starts."""
        ...

    async def hold_stop(
        self,
        session_id: str,
        message_id: str | None,
        keys: Sequence[str],
        reason: str,
        *,
        turn_id: str | None = None,
    ) -> None:
        """Keep, for a minute, a stop naming the client's message ``message_id`` whose
        turn was not found (its POST may come after it), unless a turn was ever submitted
        under one of ``keys``, or continued the answer ``message_id`` names (a late
        stop), or has the id ``turn_id`` the stop names too; bounded, each used once by
        the submit that names it (``stop_name``). With no ``message_id``, a stop naming
        turn ``turn_id`` only, kept while no turn has that id, for the submit that
        creates it (its caller's ``turn_id``: a new message, an edit or a regenerate)."""
        ...

    async def get(self, turn_id: str) -> QueuedTurn | None: ...

    async def get_status(self, turn_id: str) -> TurnStatus | None:
        """Where the turn stands, its input not read."""
        ...

    async def active(self, session_id: str) -> TurnStatus | None:
        """The session's running turn, else its oldest queued one, else ``None``."""
        ...

    async def statuses(self, turn_ids: list[str]) -> dict[str, str]:
        """The status of each of ``turn_ids`` that exists, in one read."""
        ...

    async def busy_sessions(self) -> set[str]:
        """The sessions with a turn queued or running."""
        ...

    async def unsaved_sessions(self) -> list[tuple[str, dict[str, Any]]]:
        """The sessions with a turn queued or running and nothing stored yet, most
        recently submitted first: ``(session id, its oldest open turn's meta)``."""
        ...

    async def open_by_key(
        self, session_id: str, keys: Sequence[str], *, message_id: str | None = None
    ) -> TurnStatus | None:
        """The session's running turn submitted under one of ``keys`` (idempotency keys
        as :meth:`submit` was given them), else its oldest such queued one, else the
        open turn that a message so submitted to steer it took in (:data:`STEERED`),
        else ``None`` (a stop naming a message by the client's id). With
        ``message_id``, also the open turn whose answer (:attr:`TurnStatus.message_id`)
        it is, once continued (``resumes``): a continuation named by its answer."""
        ...

    async def steering(self, session_id: str, steer_of: str, key: str) -> QueuedTurn | None:
        """The latest turn of the session submitted under the idempotency key ``key`` to
        steer turn ``steer_of``, whatever its status: a front end asks when the running
        turn's stream shows a message steered in (a few a turn at most)."""
        ...

    async def request_cancel(
        self, turn_id: str, reason: str = "cancelled", *, waiting: bool = False
    ) -> TurnStatus | None:
        """Cancel a turn: a queued one at once, a running one through its worker; with
        ``waiting``, one that waits for input at once too (no decision resumes it then)."""
        ...

    async def turns(self, session_id: str) -> list[QueuedTurn]:
        """Every turn of the session, in submission order."""
        ...

    async def wait_finished(self, turn_id: str, timeout: float) -> QueuedTurn | None:  # noqa: ASYNC109
        """The turn once it finished, or ``None`` after ``timeout`` seconds."""
        ...

    # -- workers ----------------------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        *,
        on_claimed: Callable[[str, str, int], None] | None = None,
        load: Callable[[str], bool] | None = None,
    ) -> Claim | None:
        """The next turn for worker ``owner`` to run, or ``None``; ``on_claimed(turn_id,
        owner, epoch)`` is called as soon as it is claimed, before its input is decoded.
        When ``load(session_id)`` says so, the claim reads the turn's session too
        (:attr:`Claim.stored`)."""
        ...

    async def claim_unread(
        self,
        owner: str,
        *,
        on_claimed: Callable[[str, str, int], None] | None = None,
        load: Callable[[str], bool] | None = None,
    ) -> Claim | NextClaimed | None:
        """:meth:`claim`, but a turn that is neither a takeover nor a continuation may be
        returned as a :class:`NextClaimed` at once, its reading (input decoded, session
        read if asked) left to its ``take()``, so that a worker's claim loop goes on
        while a long session is read."""
        ...

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Block until the queue may have work (a submit, a decision, a turn's end that
        frees a turn of its session queued behind it), or ``timeout`` passes."""
        ...

    async def check_listening(self) -> bool:
        """Whether what :meth:`wait` listens on answers (one round trip on it, between two
        waits); ``False`` when it broke or cannot be opened. One that does not answer is
        dropped when the caller gives up (cancels the check): the next wait opens another.
        A worker's health beat asks it: a worker that hears no notification takes new
        turns only every ``poll`` seconds."""
        ...

    def open_renewer(self) -> LeaseRenewer:
        """A renewer on a connection of its own (blocking: call it from a thread)."""
        ...

    async def renew(self, claim: Claim) -> Renewal: ...

    def fenced(
        self,
        claim: Claim,
        on_lost: Callable[[], None] | None = None,
        on_suspended: Callable[[], None] | None = None,
        steered: Sequence[str] = (),
        watch: SteerWatch | None = None,
        on_finished: Callable[[], None] | None = None,
        on_finishing: Callable[[], None] | None = None,
        claim_next: NextClaim | None = None,
        on_deleted: Callable[[], None] | None = None,
    ) -> AbstractContextManager[None]:
        """While inside, every save of the claimed turn's session is refused
        (:class:`~runtime.errors.LeaseLost`) once the claim no longer holds the turn;
        ``on_lost`` is called then, or ``on_deleted`` (when given) for a save refused
        because the session was deleted while the turn ran (the refusal is also a
        :class:`~runtime.errors.SessionDeleted`). With ``on_suspended``, the save of the step that
        makes the turn wait for a person also suspends it (:meth:`suspend`) in the save's
        commit, and ``on_suspended`` is called once that committed. ``steered`` (read at
        each save: the worker appends to it) names the messages the turn took from
        :meth:`take_steering`: each save marks those still queued ``done``
        (:data:`STEERED`) in its commit, the one that stores them in the session.
        ``watch`` learns from each save the turn's count of steering submits
        (:class:`SteerWatch`). With ``on_finished``, the save that ends the turn
        (``SaveRequest.ends``) also finishes it ``done`` (:meth:`finish`) in its commit:
        ``on_finishing`` is called in the save's thread before the commit, ``on_finished``
        once it committed. With ``claim_next`` too, that save (and one that suspends
        the turn, with ``on_suspended``) may also claim the next turn for the worker
        (:class:`NextClaim`), in the same commit: a save refused (the fence) or failed
        claims nothing."""
        ...

    async def take_steering(
        self, claim: Claim, watch: SteerWatch | None = None
    ) -> list[QueuedTurn]:
        """The messages submitted to steer the claimed turn that are still queued, in
        order: what its worker inserts at a step boundary (one indexed read). Nothing is
        written: the save that stores them marks them (:meth:`fenced`'s ``steered``).
        ``watch.taken`` gets the turn's count of steering submits as of that read."""
        ...

    def close_fences(self) -> None:
        """Refuse every fenced save from now on (a worker stopping at once)."""
        ...

    async def finish(
        self,
        claim: Claim,
        *,
        status: str,
        finish_reason: str | None = None,
        error: str | None = None,
    ) -> bool:
        """End the claimed turn with a final ``status``; ``False`` if no longer held."""
        ...

    async def release(self, claim: Claim, *, keep_attempt: bool = False) -> bool:
        """Give the claimed turn back at once, to be taken over (a worker stopping; a
        turn whose final save was not confirmed, ``keep_attempt``: it counts towards
        ``max_attempts``, so a store that never confirms one fails the turn at last)."""
        ...

    # -- turns that wait for a person ---------------------------------------------------------

    async def suspend(self, claim: Claim, *, expires_at: float | None = None) -> bool:
        """The claimed turn suspended (its calls wait for a decision, all committed): it
        becomes ``awaiting-input`` with no owner and no lease, until ``expires_at`` (wall
        clock; ``None``: no deadline). ``False`` (nothing written) if no longer held."""
        ...

    async def decide(
        self,
        session_id: str,
        key: str,
        decision: Decision,
        tools: Mapping[str, Any],
        *,
        known: SessionRecord | None = None,
        max_chars: int | None = None,
        expiry: bool = False,
    ) -> Decided:
        """Record ``decision`` for the waiting call ``key`` of session ``session_id``
        (:func:`runtime.approval.record_decision`) in one transaction with its turn's
        row: refused (:class:`~runtime.errors.AlreadyDecided`) unless the turn still
        waits, and when it decides the turn's last waiting call, the turn is put back to
        be claimed (:attr:`Claim.resumed`), so whichever worker is free resumes it.
        ``known``: the session as the caller just read it, decided on first (the save's
        version check says whether it was current; a stale or refusing view is not
        believed: the store is read). ``max_chars``: the agent's
        ``max_tool_result_chars``, what the client gave is stored cut to
        (:func:`~runtime.approval.record_decision`). A call past its stored deadline by
        the queue's clock (:meth:`now`) is refused, :class:`~runtime.errors.WaitExpired`,
        checked as the decision is recorded; ``expiry``: the decision is the expiry's
        own denial (``timed out``), which is not."""
        ...

    async def now(self) -> float:
        """The queue's clock, in seconds since the epoch (PostgreSQL's): what every
        worker sets and expires wait deadlines by, whatever its own wall clock says."""
        ...

    async def take_expired(self, now: float, limit: int = 100) -> list[TurnStatus]:
        """Waiting turns whose deadline is at or before ``now``, each held back from
        other callers for a while (so that two workers do not expire it at once)."""
        ...

    async def set_expiry(self, turn_id: str, expires_at: float | None) -> None:
        """The waiting turn's next deadline (after some of its calls expired)."""
        ...

    async def aclose(self) -> None:
        """Close what the queue opened (not its store: that is the caller's)."""
        ...


__all__ = [
    "CANCELLED",
    "DONE",
    "FAILED",
    "FINAL_STATUSES",
    "NO_OPTIONS",
    "QUEUED",
    "RUNNING",
    "STEERED",
    "SUPERSEDED",
    "WAITING",
    "Claim",
    "ClientToolSpec",
    "Decided",
    "LeaseRenewer",
    "QueuedTurn",
    "Renewal",
    "SteerWatch",
    "TurnOptions",
    "TurnQueue",
    "TurnStatus",
]
