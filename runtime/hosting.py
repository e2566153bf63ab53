"""What an actor, or a tool, may ask of the host that runs it.

The host (:class:`runtime.app.host.Host`) is the application: it assembles the actors,
and no actor or contract module may import it. Those that need something of it name one
of the small protocols below instead, each the few questions its user asks and nothing
more; ``Host`` satisfies them all by its shape, and the type checker proves it where the
host hands itself over (``TurnRunner(host=self)``, ``start_servers(..., self, ...)``).

* :class:`ToolHost`: what a tool's :class:`~runtime.tools.ToolContext` gives it: the bus,
  and sub-sessions (an agent used as a tool opens one per call);
* :class:`TurnHost`: what a turn runner asks: a :class:`ToolHost` for its tools, plus
  whether other writers share the store, the wall clock and the timer that approval
  deadlines run on, and whether an actor decides approvals in process;
* :class:`ActorStarter` and :class:`TurnCanceller`: starting an actor under the host's
  supervisor (an MCP server, the relay publisher), and cancelling a turn the host runs;
* :data:`ToolSource`: where a turn runner gets the tools of its agent's next model call;
  the host builds it (from the agent's own tools and its MCP servers' current ones), so
  the runner imports no MCP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeAlias, TypeVar

import trio

from runtime.actor import Actor, RestartPolicy
from runtime.actor_messages import TurnResult
from runtime.agent import Agent
from runtime.bus import Bus
from runtime.media import UserInput
from runtime.messages import Message
from runtime.output import OutputChunk
from runtime.store import SessionRecord
from runtime.tools import Tool

A = TypeVar("A", bound=Actor)


class SubTurn(Protocol):
    """A turn of a session a tool opened, as the tool reads it: ``async for`` its output
    chunks, then :attr:`result`."""

    @property
    def result(self) -> TurnResult | None:
        """Set once the turn is over (``None`` before, or if it never answered)."""

    def __aiter__(self) -> AsyncIterator[OutputChunk]: ...


class SubSession(Protocol):
    """A session a tool opened (``ToolHost.open_session``): one turn, then closed."""

    def stream(
        self,
        input: UserInput,
        *,
        turn_id: str | None = None,
        message_id: str | None = None,
        resume: bool = False,
        stored: SessionRecord | None = None,
    ) -> AbstractAsyncContextManager[SubTurn]:
        """Start a turn for ``input``; ``async with session.stream(task) as out``. With
        ``resume``, the turn named ``turn_id``/``message_id`` goes on from its committed
        steps, if the history holds it (``Session.stream``'s durable turn). ``stored``:
        the session as the open just read it (:meth:`take_loaded`), which the turn
        starts from instead of reading it again."""

    def take_loaded(self) -> SessionRecord | None:
        """The record the open read the session from, once (``None`` after that, or if
        the session was open already)."""

    @property
    def messages(self) -> Sequence[Message]:
        """The session's history, as loaded."""

    async def close(self) -> None:
        """Stop the session's actors (after any running turn ends)."""

    async def end_wait(self, reason: str) -> None:
        """End the turn that waits for input without resuming it, its waiting calls
        denied with ``reason`` and given their results (docs/approval.md): how an agent
        used as a tool closes a sub-turn that suspended."""


class ToolHost(Protocol):
    """What a tool may ask of the host running its call (:attr:`ToolContext.host`)."""

    @property
    def bus(self) -> Bus:
        """The host's bus: a tool may publish events of its own on it."""

    async def open_session(
        self,
        agent: Agent,
        session_id: str | None = None,
        *,
        meta: dict[str, Any] | None = None,
        deps: Any = None,
    ) -> SubSession:
        """Open (or resume) a session running ``agent`` on this host."""


class WaitWatch(Protocol):
    """The host's timer of waits with a deadline (:mod:`runtime.app.expiry`)."""

    def note(self, session_id: str, agent: Agent, messages: Sequence[Message]) -> None:
        """Watch the session if its last turn waits with a deadline."""


class TurnHost(ToolHost, Protocol):
    """What a turn runner asks of its host, beyond what its tools may
    (:class:`~actors.turn.runner.TurnRunner`)."""

    @property
    def expects_other_writers(self) -> bool:
        """Whether other processes writing the host's sessions is normal operation (the
        workers of one deployment): taking in their turns is then no warning."""

    @property
    def claims_turns(self) -> bool:
        """Whether a new turn saves its user message before its first model call (a
        host that saw another process write its sessions, :meth:`saw_other_writer`):
        the same message posted to another process at once is then refused before
        either pays a second model run. One store write more a turn; none elsewhere."""

    def saw_other_writer(self) -> None:
        """Told when a turn took in another process's writes of its session (a reload,
        a rebased save): the store is shared, so the host's turns claim their message
        from then on (:attr:`claims_turns`), unless its deployment dedupes messages
        itself (:attr:`expects_other_writers`: workers' turn queue)."""

    async def shares_store(self) -> bool:
        """Whether another host writes the store now, by the store's registry of the
        hosts writing it (read as a new turn starts: no write); if so the host claims
        its turns from then on (:attr:`claims_turns`). ``False`` for a store that keeps
        no registry, and on a worker's host."""

    @property
    def nursery(self) -> trio.Nursery:
        """Where a turn's background work runs (its marker's refreshes during a long
        step, :meth:`~actors.turn.saving.Saving._touching`)."""

    @property
    def marker_id(self) -> str:
        """This host instance's name in the running markers its turns store
        (:data:`runtime.liveness.HOST_KEY`), so it tells its own leftover marker from
        another's running turn."""

    @property
    def forgets_unsaved(self) -> bool:
        """Whether a turn whose final save the store refused is dropped from the
        session's history once it is over (``serve``: its client was told it was not
        saved), so the session's next turn, one queued behind it too, starts from what
        the store holds; otherwise it stays in memory and the next save writes it."""

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock (seconds since the epoch) approval deadlines are set by."""

    @property
    def expiry(self) -> WaitWatch:
        """The timer that expires waits when their deadline passes."""

    def approves_in_process(self) -> bool:
        """Whether an actor on the host decides approvals in process (an
        :class:`~actors.plugins.ApprovalActor` runs): a call that needs approval then
        waits for it in memory instead of suspending its turn."""

    def wake_actor(self, actor: Actor) -> None:
        """Start ``actor`` again if it rests (its next message waits in its inbox): the
        session's engine, which rests as the model call that ended its turn ends, when
        the turn makes another call after all."""


class ActorStarter(Protocol):
    """Starts actors under the host's supervisor (MCP servers, the relay publisher)."""

    async def start_actor(self, actor: A, *, policy: RestartPolicy | None = None) -> A:
        """Run ``actor`` under the host's supervisor; returns it once started."""


class TurnCanceller(ActorStarter, Protocol):
    """What the relay publisher asks of the host whose turns it publishes."""

    @property
    def nursery(self) -> trio.Nursery:
        """Where the publisher's background task (watching for cancel requests) runs."""

    def cancel_turn(self, turn_id: str, reason: str) -> bool:
        """Cancel the turn ``turn_id`` if the host runs it; whether it did."""

    def stop_named(
        self,
        session_id: str,
        *,
        message_id: str | None,
        turn_id: str | None,
        reason: str,
    ) -> tuple[str, bool] | None:
        """Stop what a stop naming ``message_id`` or ``turn_id`` of ``session_id`` names,
        if the host holds it (a waiting message taken out, or the running turn
        cancelled): ``(turn_id, queued)``, or ``None``."""

    def hold_stop(
        self, session_id: str, *, message_id: str | None, turn_id: str | None, reason: str
    ) -> None:
        """Keep a named stop that found nothing so named here (:meth:`stop_named`
        ``None``) for the new message it names, whose POST may not have reached the host
        yet: stopped when it comes."""


ToolSource: TypeAlias = Callable[[Agent], Awaitable[tuple[Tool, ...]]]
"""The tools to offer an agent's next model call: its own, then those of its MCP servers
as they are now (a server may announce a change between two calls)."""


__all__ = [
    "ActorStarter",
    "SubSession",
    "SubTurn",
    "ToolHost",
    "ToolSource",
    "TurnCanceller",
    "TurnHost",
    "WaitWatch",
]
