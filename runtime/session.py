"""Sessions and the consumer's view of a turn (:class:`TurnStream`).

A session runs one turn at a time. ``session.stream(input)`` starts a turn and yields a
:class:`TurnStream`: iterate it for :data:`~runtime.output.OutputChunk` s, as they
arrive. Leaving the ``async with`` before the turn finished cancels the turn (the
stream ends with ``abort``, and what was streamed is saved, marked interrupted);
``output.cancel(reason)`` does the same from anywhere. After the block,
``output.result`` holds the :class:`~runtime.protocol.TurnResult`.

A host may free an idle session from memory (``Host.open(idle_ttl=, max_sessions=)``).
The :class:`Session` object stays valid: the next turn, or ``await session.reopen()``,
loads its history from the store again. Until then its synchronous views of the history
(``messages``, ``state``) raise :class:`~runtime.errors.SessionNotLoaded`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import attrs
import trio

from runtime.errors import SessionBusy, SessionNotLoaded
from runtime.inbox import Inbox
from runtime.media import UserInput, check_limits, user_content
from runtime.messages import Message, UserContent
from runtime.protocol import Batch, TurnResult

if TYPE_CHECKING:
    from runtime.agent import Agent
    from runtime.host import Host

FINAL_WAIT = 10.0
"""Seconds a leaving consumer waits (shielded) for the cancelled turn to be saved."""


@attrs.define(kw_only=True, slots=True, eq=False)
class SessionState:
    """What a session's actors share: its id and history (owned by the turn runner)."""

    session_id: str
    messages: list[Message] = attrs.field(factory=list)
    meta: dict[str, Any] = attrs.field(factory=dict)
    busy: bool = False
    saved_upto: int = 0
    """How many messages the store is known to hold; saves start no later than this."""
    version: int = 0
    """The store's version of the session that ``messages[:saved_upto]`` matches (``0``:
    not stored); saves are based on it, so one that another writer overtook conflicts."""


@attrs.define(kw_only=True, slots=True, eq=False)
class RunTurn:
    """The request a :class:`TurnStream` sends the session's turn runner."""

    input: UserContent
    """The user message's content: text, or parts (text, images, files)."""
    consumer: Inbox | None
    stream: TurnStream


class TurnStream:
    """One turn as its consumer sees it: an async iterator of output chunks."""

    def __init__(self, session: Session, text: UserContent, *, capacity: int = 256) -> None:
        self.session = session
        self.input = text
        self.result: TurnResult | None = None
        """Set when the turn is over (after the ``async with`` block at the latest)."""
        self.turn_id: str | None = None
        self.cancel_reason: str | None = None
        self.done = trio.Event()
        self._scope: trio.CancelScope | None = None
        self._inbox = Inbox(capacity, "block", name="consumer")
        self._buffer: deque[Any] = deque()
        self._ended = False

    # -- the turn runner's side ---------------------------------------------------------

    def bind_scope(self, scope: trio.CancelScope) -> None:
        """Called by the turn runner when the turn starts, with the turn's scope."""
        self._scope = scope
        if self.cancel_reason is not None:
            scope.cancel()

    def finish(self, result: TurnResult) -> None:
        self.result = result
        self.session.state.busy = False
        if self.session.current is self:
            self.session.current = None
        self.session.host.touch(self.session)  # an idle session's age counts from here
        self.done.set()

    # -- the consumer's side ------------------------------------------------------------

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the turn: it ends with an ``abort`` chunk carrying ``reason``."""
        if self.done.is_set() or self.cancel_reason is not None:
            return
        self.cancel_reason = reason
        if self._scope is not None:
            self._scope.cancel()

    async def __aenter__(self) -> TurnStream:
        if not self.session.loaded:
            await self.session.reopen()
        # From here to ``busy = True`` nothing yields: an idle host cannot evict it between.
        self.session.host.touch(self.session)
        state = self.session.state
        if state.busy:
            raise SessionBusy(f"session {state.session_id!r} is already running a turn")
        state.busy = True
        self.session.current = self
        try:
            await self.session.runner.send(
                RunTurn(input=self.input, consumer=self._inbox, stream=self)
            )
        except BaseException:
            state.busy = False
            self.session.current = None
            raise
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.done.is_set():
            if exc_type is not None and issubclass(exc_type, trio.Cancelled):
                self.cancel("cancelled")
            elif exc_type is not None:
                self.cancel(f"consumer failed: {exc_type.__name__}")
            else:
                self.cancel("consumer left the stream")
        self._inbox.close_receiver()
        with trio.CancelScope(shield=True), trio.move_on_after(FINAL_WAIT):
            await self.done.wait()

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> Any:
        buf = self._buffer
        if buf:
            return buf.popleft()
        if self._ended:
            raise StopAsyncIteration
        try:
            batch = await self._inbox.get()
        except trio.EndOfChannel:
            self._ended = True
            raise StopAsyncIteration from None
        if isinstance(batch, Batch):
            batch.taken = True
            buf.extend(batch)
        else:  # pragma: no cover - the controller only sends batches
            buf.append(batch)
        if not buf:
            return await self.__anext__()
        return buf.popleft()

    async def collect(self) -> list[Any]:
        """Every remaining chunk of the turn, as a list."""
        return [chunk async for chunk in self]


class Session:
    """A conversation with one agent, hosted by a :class:`~runtime.host.Host`."""

    def __init__(self, host: Host, agent: Agent, state: SessionState, runner: Any) -> None:
        self.host = host
        self.agent = agent
        self._id = state.session_id
        self._state: SessionState | None = state
        self.runner = runner
        self.actors: list[Any] = []
        self.current: TurnStream | None = None
        """The turn in progress, if any."""
        self.last_used = 0.0
        """Trio time of the last use (open, turn start or end, a read through the web API)."""
        self.unsaved_meta: dict[str, Any] | None = None
        """Meta of a session evicted before anything of it was saved, applied on reopen."""

    @property
    def id(self) -> str:
        return self._id

    @property
    def loaded(self) -> bool:
        """Whether the session is in memory: open on its host and not evicted."""
        return self._state is not None and self.host.sessions.get(self._id) is self

    @property
    def state(self) -> SessionState:
        """What the session's actors share. Raises
        :class:`~runtime.errors.SessionNotLoaded` after an eviction, until reopened."""
        if self._state is None:
            raise SessionNotLoaded(
                f"session {self._id!r} was evicted from memory while idle; its history is in "
                "the store: `await session.reopen()` (or start a turn) to load it again"
            )
        return self._state

    @property
    def messages(self) -> tuple[Message, ...]:
        """The history: system/user/assistant/tool messages, in order. Raises
        :class:`~runtime.errors.SessionNotLoaded` after an eviction, until reopened."""
        return tuple(self.state.messages)

    @property
    def busy(self) -> bool:
        return self._state is not None and self._state.busy

    async def reopen(self) -> None:
        """Load the session again after its host evicted it (or it was closed): its
        history from the store, fresh actors. A no-op while it is loaded."""
        if not self.loaded:
            await self.host.reopen_session(self)

    def attach(self, state: SessionState, runner: Any, actors: list[Any]) -> None:
        """Called by the host when it (re)loads the session: the new state and actors."""
        self._state = state
        self.runner = runner
        self.actors = actors
        self.unsaved_meta = None

    def detach(self) -> None:
        """Called by the host when it evicts the session: drop the history and actors."""
        state = self._state
        if state is not None and state.saved_upto == 0 and state.meta:
            self.unsaved_meta = dict(state.meta)
        self._state = None
        self.runner = None
        self.actors = []
        self.current = None

    def stream(self, input: UserInput) -> TurnStream:
        """Start a turn for user ``input``; use as ``async with session.stream(t) as out``.

        ``input`` is text, or a list of text, :class:`~runtime.messages.Image` and
        :class:`~runtime.messages.File` values (one image or file alone also works). It is
        checked here, before anything is stored: a value of another kind or a bad image
        raises :class:`~runtime.errors.InvalidMedia`, media bigger than the agent's
        ``media_limits`` :class:`~runtime.errors.MediaTooLarge`.

        A session runs one turn at a time: entering while a turn runs raises
        :class:`~runtime.errors.SessionBusy`.
        """
        content = user_content(input)
        check_limits(content, self.agent.media_limits)
        return TurnStream(self, content)

    async def run(self, text: UserInput) -> TurnResult:
        """Run a whole turn, discarding the stream; returns its result."""
        async with self.stream(text) as out:
            async for _ in out:
                pass
        assert out.result is not None
        return out.result

    async def close(self) -> None:
        """Stop this session's actors (after any running turn ends)."""
        await self.host.close_session(self)
