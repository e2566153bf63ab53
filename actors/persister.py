"""The persister: the one writer of the session store.

Turn runners send it :class:`~runtime.protocol.SaveRequest` s at every step boundary
and at the end of each turn; it writes them in order and signals ``done``. Being its
own actor, its writes are not cancelled when a turn is: a turn that is aborted still
gets its final save, and the turn runner waits for it in a shielded, time-bounded scope.
"""

from __future__ import annotations

from typing import Any

from runtime.actor import Actor
from runtime.events import SessionSaved
from runtime.logging import get_logger
from runtime.protocol import SaveRequest
from runtime.redact import redact
from runtime.store import Store


class Persister(Actor):
    inbox_capacity = 4096

    def __init__(self, store: Store, *, name: str = "persister") -> None:
        super().__init__(name=name)
        self.store = store
        self._log = get_logger("axon.persister")

    async def handle(self, message: Any) -> None:
        if not isinstance(message, SaveRequest):
            return
        try:
            await self.store.save(message.session_id, message.start, message.messages, message.meta)
        except Exception as exc:  # a failed write is reported to the waiter, never lost
            message.error = exc
            self._log.error(
                "session.save-failed",
                session_id=message.session_id,
                turn_id=message.turn_id,
                error=redact(f"{type(exc).__name__}: {exc}"),
            )
        else:
            await self.publish(
                SessionSaved(
                    session_id=message.session_id,
                    turn_id=message.turn_id,
                    message_count=message.start + len(message.messages),
                    step=message.step,
                )
            )
        finally:
            if message.on_done is not None:
                message.on_done(message)
            message.done.set()
