"""The live-output relay contract: how a turn's chunks reach front ends in other processes.

In the embedded mode a turn's :data:`~runtime.output.OutputChunk` s go straight from the
stream controller to the one consumer in the same process. When turns run on worker
processes, the worker that runs a turn appends its chunks to a :class:`RelayWriter`, and
any front end reads them back with a :class:`Relay` from any ``seq`` on, so a client that
reconnects to another front end resumes with nothing missing or repeated.

This module only states the contract (it imports nothing of the project above the output
vocabulary); the Redis Streams implementation lives with the other adapters.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import attrs

RESTART_STEP = "relay.restart-step"


@attrs.frozen(kw_only=True, slots=True)
class StepRestarted:
    """Read from a relay among the chunks: a takeover re-runs ``step``, so a reader drops
    what it showed of that step (the AI SDK stream maps it to ``reset-step``). ``seq`` is
    the marker's own place in the turn's relay stream."""

    step: int
    seq: int = 0
    type: str = RESTART_STEP


@runtime_checkable
class RelayWriter(Protocol):
    """One turn's outgoing side. Owned by the task that consumes the turn's stream."""

    def append(self, chunk: Any) -> None:
        """Queue ``chunk`` (an ``OutputChunk``); never blocks, never waits for more.

        Chunks already queued are written together (coalesced), so a token-by-token turn
        costs one write per batch, not one per delta. A writer may hold a flush a little
        to coalesce more (the Redis relay: a burst up to 5 ms, the turn's last chunk up
        to 50 ms for :meth:`aclose`'s end), never a turn's first, and never reorders.
        """
        ...

    async def restart_step(self, step: int) -> None:
        """Tell readers the partial ``step`` is dropped with a relay-only marker
        (:class:`StepRestarted`). Workers now send the public ``reset-step`` chunk instead
        (see :meth:`shown`); readers still take the marker from streams older workers
        wrote."""
        ...

    async def shown(self, step: int) -> list[Any] | None:
        """What an earlier process streamed of ``step`` (a takeover asks before it re-runs
        the step): ``None`` when the turn's stream holds nothing of it; otherwise the
        ``*-finish`` chunks that close the text and reasoning parts it left open (empty
        when none), which the caller appends before its ``reset-step``
        (:class:`~runtime.output.ResetStep`). When the relay cannot tell, the writer
        makes readers rebuild the turn from the store and returns ``None``. A writer
        that can tell which messages the stream shows steered into ``step``
        (:class:`~runtime.output.Steered`) says so in a ``steered_shown`` attribute
        (their ids) once this returns: the takeover does not show them again."""
        ...

    async def aclose(self, *, final: bool = True, paused: bool = False) -> None:
        """Flush what is queued; with ``final``, mark the turn's stream ended, or with
        ``paused`` too, the turn waiting for input (docs/approval.md): the process that
        resumes it continues this stream, its seqs following on."""
        ...


@runtime_checkable
class Relay(Protocol):
    """Opens writers for turns this process runs and reads turns any process runs."""

    def writer(
        self,
        *,
        session_id: str,
        turn_id: str,
        takeover: bool = False,
        fresh: bool = False,
        resumed: bool = False,
        first_step: int | None = None,
        pauses: int = 0,
    ) -> RelayWriter:
        """The writer of a turn this process runs. ``takeover``: another process ran
        the turn before (its stream may hold part of it): the writer continues that
        stream, and when the relay has lost it, makes readers rebuild from the store
        rather than show the turn without what the earlier process streamed. ``fresh``:
        the caller knows nothing streamed the turn before (a worker's first claim of
        it: no takeover, no continuation), so the writer need not look for a stream
        to continue; by default it looks (an in-process continuation after a wait
        reuses its turn's stream without saying so). ``resumed``: a continuation after
        a wait (with ``takeover``): the stream it continues must end with its pause;
        one that does not (the process that suspended the turn stopped before it
        streamed that) makes readers rebuild from the store too. ``first_step``: the
        step a ``takeover`` re-runs first, when the caller knows it as it starts (no
        step of the turn was committed: ``0``); otherwise the writer learns it from
        :meth:`RelayWriter.shown` or the first ``step-start``. ``pauses``: how many
        times the turn waited for input before (a continuation's number, the queue's
        ``resumes``): a ``takeover`` whose stream holds fewer pauses and does not end with
        one (the process that suspended the turn, and the continuation's first, stopped
        before they streamed the wait's end) makes readers rebuild from the store too."""
        ...

    def read(
        self,
        turn_id: str,
        *,
        after_seq: int | None = None,
        after_pauses: int = 0,
        on_quiet: Callable[[float], Awaitable[None]] | None = None,
        unseen: bool = False,
    ) -> AsyncIterator[Any]:
        """The turn's chunks with ``seq > after_seq`` (all when ``None``), live until it ends
        or waits for input. A wait that has its continuation after it is passed over (the
        continuation's ``start`` comes again, same message id); ``after_pauses=k`` reads
        only what follows the turn's k-th wait, waiting for it if need be.

        ``on_quiet(seconds)``, if given, is awaited now and then while the live read
        waits, with how long the stream has shown nothing new; what it raises ends the
        read (a reader that learns elsewhere that nobody will end the stream gives it
        up: :class:`runtime.app.web.watch.EndedTurnLook`).

        ``unseen``: the reader was shown nothing of the turn yet and answers from the
        store if the relay fails it: a relay server that cannot be reached at all may
        fail the read at once rather than after its retry window.

        Raises :class:`LookupError` when the relay no longer has the turn, or cannot
        prove that what it has is the turn without a hole or a splice, including what a
        client resuming after ``after_seq`` saw (the relay is a cache): the caller then
        rebuilds from the committed messages in the store. Repeats of the turn's
        ``start`` (a takeover starts the message over) are left out.
        """
        ...

    async def aclose(self) -> None: ...


__all__ = ["RESTART_STEP", "Relay", "RelayWriter", "StepRestarted"]
