"""Reading the turn queue: a turn, its status, a session's turns, and a finished turn
awaited by polling (the reads of :class:`~actors.stores.turns.TurnQueue`).

Also the decoding of a turn's row into a :class:`~runtime.turn_queue.QueuedTurn`, which
every part that returns a turn (a submit, a claim, the steering a turn takes) shares:
:meth:`TurnReads._decoded` moves a large input's decoding off the event loop
(:data:`DECODE_INLINE`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import trio

from actors.stores.turn_sql import _COLUMNS, _STATUS_COLUMNS, _status
from actors.stores.turn_submit import _message_key
from runtime import serde
from runtime.errors import StoreCorrupt
from runtime.history import off_loop_limiter
from runtime.messages import UserContent
from runtime.store import validate_session_id
from runtime.turn_queue import QueuedTurn, TurnOptions, TurnStatus

if TYPE_CHECKING:
    from actors.stores.postgres import PostgresStore

DECODE_INLINE = 64 << 10
"""A turn input up to this many bytes of JSON is decoded on the event loop; a larger one
in a thread, so decoding thousands of parts never holds up the loop (or a lease)."""


class TurnReads:
    """The turn queue's reads (mixed into :class:`~actors.stores.turns.TurnQueue`, whose
    store they read), and the decoding of a turn's row its other parts share."""

    if TYPE_CHECKING:  # provided by the turn queue
        store: PostgresStore

    async def get(self, turn_id: str) -> QueuedTurn | None:
        """The turn ``turn_id``, or ``None`` if there is none."""
        row = await self.store.run(
            f"read of turn {turn_id}",
            lambda conn: conn.execute(
                f"SELECT {_COLUMNS} FROM axon_turns WHERE turn_id = %s", (turn_id,)
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else await self._decoded(row)

    async def get_status(self, turn_id: str) -> TurnStatus | None:
        """Where the turn ``turn_id`` stands (its input is not read), or ``None`` if
        there is no such turn."""
        row = await self.store.run(
            f"status of turn {turn_id}",
            lambda conn: conn.execute(
                f"SELECT {_STATUS_COLUMNS} FROM axon_turns WHERE turn_id = %s", (turn_id,)
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else _status(row)

    async def active(self, session_id: str) -> TurnStatus | None:
        """The status of the session's running turn, else of its oldest queued one, else
        ``None`` (its input is not read)."""
        validate_session_id(session_id)
        row = await self.store.run(
            f"active turn of session {session_id!r}",
            lambda conn: conn.execute(
                f"""SELECT {_STATUS_COLUMNS} FROM axon_turns
                WHERE session_id = %s AND status IN ('running', 'queued')
                ORDER BY status = 'running' DESC, seq LIMIT 1""",
                (session_id,),
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else _status(row)

    async def statuses(self, turn_ids: list[str]) -> dict[str, str]:
        """The status of each of ``turn_ids`` that exists, in one query (a front end's
        viewers of queued turns share it: :mod:`runtime.app.web.watch`)."""
        if not turn_ids:
            return {}
        rows = await self.store.run(
            f"status of {len(turn_ids)} turns",
            lambda conn: conn.execute(
                "SELECT turn_id, status FROM axon_turns WHERE turn_id = ANY(%s)", (turn_ids,)
            ).fetchall(),
            transaction=False,
        )
        return {turn_id: status for turn_id, status in rows}

    async def busy_sessions(self) -> set[str]:
        """The sessions with a turn queued or running (one indexed scan of the open
        turns, for a list of sessions that says which are busy)."""
        rows = await self.store.run(
            "busy sessions",
            lambda conn: conn.execute(
                "SELECT DISTINCT session_id FROM axon_turns WHERE status IN ('queued', 'running')"
            ).fetchall(),
            transaction=False,
        )
        return {row[0] for row in rows}

    async def unsaved_sessions(self) -> list[tuple[str, dict[str, Any]]]:
        """The sessions with a turn queued or running and nothing stored yet (a first
        turn no step of which was saved), most recently submitted first, each with the
        meta of its oldest open turn: ``(session id, meta)``. One read, for the first page
        of a list of sessions (which leads with them, docs/web.md)."""
        rows = await self.store.run(
            "unsaved sessions",
            lambda conn: conn.execute(
                """SELECT t.session_id, (array_agg(t.meta ORDER BY t.seq))[1]
                FROM axon_turns AS t
                WHERE t.status IN ('queued', 'running') AND NOT EXISTS
                    (SELECT 1 FROM axon_sessions AS s WHERE s.session_id = t.session_id)
                GROUP BY t.session_id ORDER BY max(t.seq) DESC"""
            ).fetchall(),
            transaction=False,
        )
        out = []
        for session_id, meta in rows:
            try:
                decoded = serde.loads(bytes(meta))  # (an integer past 64 bits exactly)
            except orjson.JSONDecodeError:
                decoded = None
            out.append((session_id, decoded if isinstance(decoded, dict) else {}))
        return out

    async def turns(self, session_id: str) -> list[QueuedTurn]:
        """Every turn of the session, in submission order."""
        validate_session_id(session_id)
        rows = await self.store.run(
            f"turns of session {session_id!r}",
            lambda conn: conn.execute(
                f"SELECT {_COLUMNS} FROM axon_turns WHERE session_id = %s ORDER BY seq",
                (session_id,),
            ).fetchall(),
            transaction=False,
        )
        return [self._decode(row) for row in rows]

    async def steering(self, session_id: str, steer_of: str, key: str) -> QueuedTurn | None:
        """The latest turn of the session submitted under ``key`` to steer ``steer_of``."""
        validate_session_id(session_id)
        hashed = _message_key(key)
        row = await self.store.run(
            f"steering of turn {steer_of!r}",
            lambda conn: conn.execute(
                f"""SELECT {_COLUMNS} FROM axon_turns
                WHERE session_id = %s AND message_key = %s AND steer_of = %s
                ORDER BY seq DESC LIMIT 1""",
                (session_id, hashed, steer_of),
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else await self._decoded(row)

    async def wait_finished(self, turn_id: str, timeout: float) -> QueuedTurn | None:  # noqa: ASYNC109
        """Poll until turn ``turn_id`` is ``done``, ``failed`` or ``cancelled`` and return
        it; ``None`` if it did not finish within ``timeout`` seconds (or does not exist:
        :meth:`get` tells the two apart). For front ends and tests; it does not use the
        workers' ``LISTEN`` connection, so any number may wait at once."""
        delay = 0.02
        with trio.move_on_after(timeout):
            while True:
                status = await self.get_status(turn_id)  # the input is read once, at the end
                if status is not None and status.finished:
                    return await self.get(turn_id)
                await trio.sleep(delay)
                delay = min(delay * 2, 0.25)
        return None

    async def _decoded(self, row: tuple[Any, ...]) -> QueuedTurn:
        """:meth:`_decode`, in a thread when the input is large (see :data:`DECODE_INLINE`)."""
        if len(row[3]) + len(row[-1]) <= DECODE_INLINE:
            return self._decode(row)
        # Not trio's default limiter: runtime.history.off_loop_limiter says why.
        return await trio.to_thread.run_sync(self._decode, row, limiter=off_loop_limiter())

    def _decode(self, row: tuple[Any, ...]) -> QueuedTurn:
        (
            turn_id,
            session_id,
            seq,
            body,
            meta,
            regenerate,
            status,
            owner,
            epoch,
            attempts,
            saved,
            cancel_requested,
            cancel_reason,
            finish_reason,
            error,
            idempotency_key,
            resumes,
            expires_at,
            steer_of,
            options,
        ) = row
        try:
            content = serde.from_json(body, UserContent)
            decoded_meta = serde.loads(bytes(meta))  # (an integer past 64 bits exactly)
            raw_options = bytes(options)
            decoded_options = (
                TurnOptions() if raw_options == b"{}" else serde.from_json(raw_options, TurnOptions)
            )
        except Exception as err:
            raise StoreCorrupt(
                f"turn store {self.store.url}: turn {turn_id!r} cannot be read: {err!r}"
            ) from err
        if not isinstance(decoded_meta, dict):
            raise StoreCorrupt(
                f"turn store {self.store.url}: meta of turn {turn_id!r} is not a JSON object"
            )
        return QueuedTurn(
            turn_id=turn_id,
            session_id=session_id,
            seq=seq,
            input=content,
            meta=decoded_meta,
            regenerate=regenerate,
            status=status,
            owner=owner,
            epoch=epoch,
            attempts=attempts,
            saved=saved,
            cancel_requested=cancel_requested,
            cancel_reason=cancel_reason,
            finish_reason=finish_reason,
            error=error,
            idempotency_key=idempotency_key,
            resumes=resumes,
            expires_at=expires_at,
            options=decoded_options,
            steer_of=steer_of,
        )
