"""A session with a long history in PostgreSQL (and SQLite): its encoding for a save and
its decoding on a load or a claim run in a worker thread, past ``OFF_LOOP_MESSAGES``
messages.

Encoding 600,000 messages took a worker's event loop 9 s (and the save function's
arrays 1.3 s more), decoding them 4.7 s: every other session's stream on that worker, or
every other request to that front end, waited meanwhile (benchmarks/bystander_workers.py).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

import actors.stores.postgres_rows as postgres_rows
import actors.stores.validation as validation
from actors.stores.postgres import PostgresStore
from actors.stores.sqlite import SQLiteStore
from actors.stores.turns import TurnQueue
from runtime.history import OFF_LOOP_MESSAGES
from runtime.messages import AssistantMessage, Message, TextPart, UserMessage

LONG = OFF_LOOP_MESSAGES + 1


def history(n: int, first: int = 0) -> list[Message]:
    return [
        UserMessage(content=f"q{i}", id=f"m{i}")
        if i % 2 == 0
        else AssistantMessage(content=(TextPart(text=f"a{i}", step=0),), id=f"m{i}")
        for i in range(first, first + n)
    ]


def walks(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, at: int = 0) -> list[Any]:
    """Patch ``owner.name`` to record, for each call, the length of its argument ``at``
    and whether it ran off the main thread."""
    seen: list[tuple[int, bool]] = []
    original = getattr(owner, name)

    def spy(*args: Any) -> Any:
        seen.append((len(args[at]), threading.current_thread() is not threading.main_thread()))
        return original(*args)

    monkeypatch.setattr(owner, name, spy)
    return seen


async def test_a_long_save_is_encoded_off_the_loop_and_a_short_one_on_it(pg_url, monkeypatch):
    encoded = walks(monkeypatch, validation, "encode_rows", at=2)
    arrays = walks(monkeypatch, postgres_rows, "_arrays")
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("s", 0, history(LONG))
        await store.save("s", LONG, history(2, LONG))
        record = await store.load("s")
    finally:
        await store.aclose()
    assert encoded == [(LONG, True), (2, False)]
    assert arrays == [(LONG, True), (2, False)]  # the save function's parameters
    assert record is not None and list(record.messages) == history(LONG + 2)


async def test_a_long_save_to_sqlite_is_encoded_off_the_loop(tmp_path, monkeypatch):
    encoded = walks(monkeypatch, validation, "encode_rows", at=2)
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        await store.save("s", 0, history(LONG))
        await store.save("s", LONG, history(2, LONG))
        record = await store.load("s")
    finally:
        await store.aclose()
    assert encoded == [(LONG, True), (2, False)]
    assert record is not None and list(record.messages) == history(LONG + 2)


async def test_a_long_session_is_decoded_off_the_loop_when_loaded(pg_url, monkeypatch):
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("long", 0, history(LONG))
        await store.save("short", 0, history(2))
        decoded = walks(monkeypatch, PostgresStore, "record", at=2)
        long, short = await store.load("long"), await store.load("short")
    finally:
        await store.aclose()
    assert decoded == [(LONG, True), (2, False)]
    assert long is not None and list(long.messages) == history(LONG)
    assert short is not None and list(short.messages) == history(2)


async def test_a_claim_that_reads_a_long_session_decodes_it_off_the_loop(pg_url, monkeypatch):
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("s", 0, history(LONG))
        queue = TurnQueue(store)
        await queue.submit("s", "next")
        decoded = walks(monkeypatch, PostgresStore, "record", at=2)
        claim = await queue.claim("w", load=lambda session_id: True)
    finally:
        await store.aclose()
    assert claim is not None and claim.stored is not None
    assert list(claim.stored.messages) == history(LONG)
    assert decoded == [(LONG, True)]


async def test_a_long_save_cancelled_while_it_encodes_writes_nothing(pg_url, monkeypatch):
    store = await PostgresStore.open(pg_url)
    entered, release = threading.Event(), threading.Event()
    encode_rows = validation.encode_rows

    def held(*args: Any) -> Any:
        entered.set()
        release.wait(10)  # (on the loop, without the thread: the cancel comes too late)
        return encode_rows(*args)

    try:
        version = await store.save("s", 0, history(2))
        monkeypatch.setattr(validation, "encode_rows", held)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_encoding() -> None:
                    await trio.to_thread.run_sync(entered.wait, 10)
                    scope.cancel()
                    release.set()

                nursery.start_soon(cancel_once_encoding)
                await store.save("s", 2, history(LONG, 2), expected_version=version)
        record = await store.load("s")
    finally:
        release.set()
        await store.aclose()
    assert scope.cancelled_caught
    assert record is not None and record.version == version
    assert list(record.messages) == history(2)
