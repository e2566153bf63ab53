"""``Host``: runs actors and sessions in one Trio nursery.

The host owns the bus, the supervisor and the host-wide actors (persister, tool
executor, log tap, one actor per provider configuration); each session adds its own
turn runner, engine and stream controller. ``async with Host.open() as host`` starts
them; leaving the block cancels running turns (they are saved, marked interrupted) and
stops every actor.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from runtime.actor import Actor, RestartPolicy, Supervisor
from runtime.agent import Agent
from runtime.bus import Bus
from runtime.errors import SessionBusy
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.session import Session, SessionState
from runtime.store import validate_session_id


class Host:
    """Hosts sessions. Create with :meth:`Host.open`."""

    def __init__(
        self, nursery: trio.Nursery, *, store: Any, bus: Bus, supervisor: Supervisor
    ) -> None:
        self.nursery = nursery
        self.store = store
        self.bus = bus
        self.supervisor = supervisor
        self.sessions: dict[str, Session] = {}
        self._providers: dict[int, Actor] = {}
        self.mcp_servers: dict[Any, Actor] = {}
        """The running MCP server actors, by configuration (see :mod:`actors.mcp`)."""
        self._actors: list[Actor] = []
        self.persister: Actor
        self.shutting_down = False
        """Set once a shutdown signal arrived or the host is closing."""
        self.tool_executor: Actor

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        *,
        store: Any = None,
        log_tap: bool = True,
        restart_policy: RestartPolicy | None = None,
        handle_signals: bool = False,
        tool_executor: Actor | None = None,
    ) -> AsyncIterator[Host]:
        """Start a host. ``store`` is a path (an SQLite file, created if missing), a
        ``Store``, or ``None`` for memory. With ``handle_signals``, SIGINT and SIGTERM
        cancel every running turn with reason ``signal SIGINT`` / ``signal SIGTERM`` (each is
        saved, marked interrupted, and its stream ends with ``abort``); the application's
        own code then leaves the block as usual. ``tool_executor`` replaces the default
        executor with any actor that answers :class:`~runtime.protocol.ExecuteTools`."""
        import structlog

        from actors.persister import Persister
        from actors.stores import open_store
        from actors.tool_executor import ToolExecutor

        if not structlog.is_configured():  # quiet JSON on stderr unless the app configured it
            from runtime.logging import configure_logging

            configure_logging("warning")
        the_store = await open_store(store)
        bus = Bus()
        try:
            async with trio.open_nursery() as nursery:
                host = cls(
                    nursery, store=the_store, bus=bus, supervisor=Supervisor(bus, restart_policy)
                )
                host.persister = await host.start_actor(Persister(the_store))
                host.tool_executor = await host.start_actor(tool_executor or ToolExecutor())
                if log_tap:
                    from actors.log_tap import LogTap

                    await host.start_actor(LogTap())
                if handle_signals:
                    await nursery.start(host._watch_signals)
                try:
                    yield host
                finally:
                    with trio.CancelScope(shield=True):
                        await host._shutdown()
                    nursery.cancel_scope.cancel()
        finally:
            if store is None or isinstance(store, str | os.PathLike):  # we opened it
                with trio.CancelScope(shield=True):
                    await the_store.aclose()

    async def start_actor(self, actor: Actor, *, policy: RestartPolicy | None = None) -> Any:
        """Run ``actor`` under the host's supervisor; returns it once started."""
        self._actors.append(actor)
        await self.nursery.start(
            lambda task_status: self.supervisor.supervise(
                actor, policy=policy, task_status=task_status
            )
        )
        return actor

    async def provider_actor(self, provider: Any) -> Actor:
        """The running actor for a provider configuration (started on first use)."""
        actor = self._providers.get(id(provider))
        if actor is None:
            actor = await self.start_actor(provider)
            self._providers[id(provider)] = actor
        return actor

    async def open_session(
        self, agent: Agent, session_id: str | None = None, *, meta: dict[str, Any] | None = None
    ) -> Session:
        """Open (or resume, when ``session_id`` is stored) a session running ``agent``."""
        from actors.engine import Engine
        from actors.stream_controller import StreamController
        from actors.turn_runner import TurnRunner

        sid = validate_session_id(session_id) if session_id is not None else new_id("session")
        if sid in self.sessions:
            existing = self.sessions[sid]
            if existing.agent is not agent:
                raise SessionBusy(f"session {sid!r} is already open with another agent")
            return existing
        record = await self.store.load(sid)
        state = SessionState(session_id=sid)
        if record is not None:
            state.messages.extend(record.messages)
            state.saved_upto = len(record.messages)
            state.meta.update({k: v for k, v in record.meta.items() if k != "agent"})
        if meta:
            state.meta.update(meta)
        provider = agent.provider
        if provider is None:
            from actors.demo import demo_provider

            provider = demo_provider()
        provider_actor = await self.provider_actor(provider)
        if agent.mcp_servers:  # started once per host, shared by sessions (actors.mcp)
            from actors.mcp import start_servers

            await start_servers(self, agent)
        stream_inbox = Inbox(1024, "block", name="engine-output")
        engine = Engine(stream_inbox, tags=agent.think_tags, session_id=sid)
        controller = StreamController(session_id=sid)
        runner = TurnRunner(
            state=state,
            agent=agent,
            provider=provider_actor,
            engine=engine,
            controller=controller,
            tool_executor=self.tool_executor,
            persister=self.persister,
            stream_inbox=stream_inbox,
            host=self,
        )
        session = Session(self, agent, state, runner)
        session.actors = [engine, controller, runner]
        for actor in session.actors:
            await self.start_actor(actor)
        self.sessions[sid] = session
        return session

    async def close_session(self, session: Session) -> None:
        """Stop a session's actors (its history stays in the store)."""
        for actor in session.actors:
            actor.stop()
            if actor in self._actors:
                self._actors.remove(actor)
        self.sessions.pop(session.id, None)
        self.bus.forget_session(session.id)

    def cancel_turns(self, reason: str) -> int:
        """Cancel every running turn with ``reason``; returns how many were running."""
        running = [s.current for s in self.sessions.values() if s.current is not None]
        for stream in running:
            stream.cancel(reason)
        return len(running)

    async def _watch_signals(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        import signal

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for signum in signals:
                self.shutting_down = True
                self.cancel_turns(f"signal {signal.Signals(signum).name}")

    async def _shutdown(self) -> None:
        """Cancel running turns with a reason, let them save, then stop everything."""
        self.shutting_down = True
        with trio.move_on_after(15):
            running = [s.current for s in self.sessions.values() if s.current is not None]
            for stream in running:
                stream.cancel("host shutdown")
            for stream in running:
                await stream.done.wait()
            for session in list(self.sessions.values()):
                await self.close_session(session)
            # The persister drains what the turns queued before it stops.
            self.persister.stop()
            await self.persister.stopped.wait()
