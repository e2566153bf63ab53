"""The memory store finds a deleted session's sub-sessions in an index of the callers
their metas name, kept by its saves: a delete reads the metas of the sessions it deletes,
not those of every stored session once per session of the tree (1,000 other sessions
and a caller with two sub-sessions: 3,009 reads before, 3 now). The behaviour itself is
the conformance kit's ``StoreSubSessions`` (tests/test_stores.py)."""

from __future__ import annotations

from typing import Any

import pytest

import actors.stores.memory as memory
from actors.stores.memory import MemoryStore
from runtime.messages import UserMessage
from runtime.tools import PARENT_SESSION_META


def _say(text: str) -> list[UserMessage]:
    return [UserMessage(content=text)]


async def test_a_delete_reads_the_metas_of_its_own_tree_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    for n in range(1000):
        await store.save(f"other{n}", 0, _say("x"), {PARENT_SESSION_META: "someone"})
    await store.save("c", 0, _say("hi"))
    await store.save("c.a", 0, _say("a"), {PARENT_SESSION_META: "c"})
    await store.save("c.a.b", 0, _say("b"), {PARENT_SESSION_META: "c.a"})
    reads: list[Any] = []
    real = memory.caller_of

    def counted(meta: Any) -> str | None:
        reads.append(meta)
        return real(meta)

    monkeypatch.setattr(memory, "caller_of", counted)
    await store.delete("c")
    assert len(reads) <= 3  # (one a deleted session at most)
    assert [await store.load(s) for s in ("c", "c.a", "c.a.b")] == [None, None, None]
    assert await store.load("other7") is not None


async def test_the_callers_index_follows_a_meta_that_names_another_caller_since() -> None:
    store = MemoryStore()
    await store.save("s", 0, _say("s"), {PARENT_SESSION_META: "a"})
    await store.save("s", 1, _say("t"), {PARENT_SESSION_META: "b"})  # moved to b
    await store.save("u", 0, _say("u"), {PARENT_SESSION_META: "a"})
    await store.save("u", 1, _say("v"), {PARENT_SESSION_META: None})  # names none since
    await store.delete("a")
    assert await store.load("s") is not None and await store.load("u") is not None
    await store.delete("b")
    assert await store.load("s") is None
    # Deleted and saved again under another caller: found by that one only.
    await store.save("s", 0, _say("again"), {PARENT_SESSION_META: "d"})
    await store.delete("b")
    assert await store.load("s") is not None
    await store.delete("d")
    assert await store.load("s") is None
    assert store._by_caller == {}  # (nothing left behind by the deleted)
