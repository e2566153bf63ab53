"""Integers past 64 bits in what the worker deployment keeps in PostgreSQL besides the
messages (branch ``exactints2``, after ``bigints``): a queued turn's meta, and a session's
meta merged by a guarded or fenced save (the Python merge, not the SQL one).

orjson refuses to write an integer outside [-2**63, 2**64) and reads one as a float;
:func:`runtime.serde.dumps` writes it exactly, :func:`runtime.serde.loads` reads it back."""

from __future__ import annotations

from typing import Any

from actors.stores.postgres import PostgresStore
from runtime.messages import UserMessage

BIG = 123456789012345678901234567890
"""Past 64 bits: orjson reads it as 1.2345678901234568e+29."""


async def test_a_queued_turns_meta_past_64_bits_is_kept_and_read_back_exactly(
    store_and_queue: Any,
) -> None:
    """A front end submits a turn whose meta holds BIG (both signs, in a list): the
    submit is taken (before: StoreError "input or meta cannot be serialized", orjson),
    and the worker that reads the turn, the claim and the sessions page get BIG, ints."""
    _store, queue = store_and_queue
    meta = {"n": BIG, "m": [-BIG, 1], "small": 2**63}
    submitted = await queue.submit("s", "hi", meta=meta)
    got = await queue.get(submitted.turn_id)
    assert got is not None and got.meta == meta
    assert type(got.meta["n"]) is int and type(got.meta["m"][0]) is int
    assert await queue.unsaved_sessions() == [("s", meta)]
    claim = await queue.claim("w1")
    assert claim is not None and claim.turn.meta == meta


async def test_a_guarded_saves_merged_meta_past_64_bits_is_stored_exactly(pg_url: str) -> None:
    """A save with a guard (the approval decision's path: the meta merged in Python)
    whose meta, or whose stored meta, holds BIG: stored (before: orjson refused the
    merged meta, StoreError), and loaded back the same."""
    store = await PostgresStore.open(pg_url)
    try:
        first = [UserMessage(content="one", id="u1")]
        v = await store.save("s", 0, first, {"n": BIG}, guard=lambda conn: None)
        later = [UserMessage(content="two", id="u2")]
        await store.save("s", 1, later, {"m": -BIG}, expected_version=v, guard=lambda conn: None)
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None
    assert (record.meta["n"], record.meta["m"]) == (BIG, -BIG)
    assert [m.text for m in record.messages] == ["one", "two"]
