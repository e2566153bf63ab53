"""The calls a PostgreSQL store sends from the event loop (:class:`~actors.stores.postgres.
LoopLane`: a step's save as one call of ``axon_save_v2``, a claim's common case) attacked
as a careless deployment would: a connection whose client encoding is not UTF-8, a
database that is not UTF-8, arguments past what the function's parameters hold. Each
holds what the store's transaction in a thread held before the lane took these calls.
"""

from __future__ import annotations

from typing import Any

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.messages import UserMessage


def said(*texts: str) -> list[UserMessage]:
    return [UserMessage(content=text) for text in texts]


async def _turn_row(store: PostgresStore, turn_id: str) -> tuple[Any, ...]:
    return await store.run(
        "row",
        lambda conn: conn.execute(
            "SELECT status, owner, finish_reason FROM axon_turns WHERE turn_id = %s", (turn_id,)
        ).fetchone(),
        transaction=False,
    )


async def test_a_claim_and_its_saves_on_the_loop_hold_under_a_latin1_client_encoding(pg_url):
    """The lane writes its text parameters and reads its text columns as UTF-8, so its
    connections tell the server so, whatever client encoding the URL (or
    ``PGCLIENTENCODING``, or a LATIN1 database's default) gives: the turn's input
    ``héllo`` is claimed as itself (it was read as UTF-8 from LATIN1 bytes: a
    ``UnicodeDecodeError`` out of the claim), and the worker ``wörker`` is stored as
    itself (it was stored as ``wÃ¶rker``: every renewal, sent by psycopg in LATIN1, was
    refused, the turn lost)."""
    store = await PostgresStore.open(pg_url + "&client_encoding=latin1")
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    lost: list[bool] = []
    finished: list[bool] = []
    try:
        turn = await queue.submit("s", "héllo")
        claim = await queue.claim("wörker")
        assert claim is not None and claim.turn.input == "héllo"
        assert await _turn_row(store, turn.turn_id) == ("running", "wörker", None)
        assert (await queue.renew(claim)).held
        with queue.fenced(
            claim, on_lost=lambda: lost.append(True), on_finished=lambda: finished.append(True)
        ):
            await store.save("s", 0, said("héllo", "ça va"), {"clé": "été"}, ends="stop")
        assert (lost, finished) == ([], [True])
        assert await _turn_row(store, turn.turn_id) == ("done", "wörker", "stop")
        record = await store.load("s")
        assert record is not None
        assert [m.text for m in record.messages] == ["héllo", "ça va"]
        assert record.meta == {"clé": "été"}
    finally:
        await queue.aclose()
        await store.aclose()
