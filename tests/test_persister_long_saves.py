"""The persister writes a long save (more than ``OFF_LOOP_MESSAGES`` messages) in a task
of its own: other sessions' saves go on meanwhile, the session's own wait behind it.

Written in line, a session's first save of a client's history of 600,000 messages held
the persister for seconds, and with it every other turn of the worker at its next step's
save (benchmarks/bystander_workers.py: a bystander's deltas stopped 7.7 s)."""

from __future__ import annotations

from typing import Any

import trio

from actors.stores import MemoryStore
from runtime import Host
from runtime.actor_messages import SaveRequest, SaveResult
from runtime.history import OFF_LOOP_MESSAGES
from runtime.inbox import Inbox
from runtime.messages import Message, UserMessage

LONG = OFF_LOOP_MESSAGES + 1


class HeldStore(MemoryStore):
    """A memory store whose saves of session ``held`` wait until :attr:`open` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.open = trio.Event()
        self.holding = trio.Event()
        self.saved: list[tuple[str, int]] = []

    async def save(self, session_id: str, start: int, messages: Any, *args: Any, **kw: Any) -> int:
        if session_id == "held":
            self.holding.set()
            await self.open.wait()
        version = await super().save(session_id, start, messages, *args, **kw)
        self.saved.append((session_id, len(messages)))
        return version


def history(n: int, first: int = 0) -> tuple[Message, ...]:
    return tuple(UserMessage(content="x", id=f"m{i}") for i in range(first, first + n))


def request(
    replies: Inbox[SaveResult], session_id: str, start: int, messages: Any, **kw: Any
) -> SaveRequest:
    return SaveRequest(
        request_id=f"{session_id}-{start}",
        session_id=session_id,
        turn_id="t",
        start=start,
        messages=messages,
        reply=replies,
        **kw,
    )


async def test_a_long_save_holds_up_no_other_session_s_save_and_its_own_wait_behind_it():
    store = HeldStore()
    replies: Inbox[SaveResult] = Inbox(16, name="replies")
    async with Host.open(store=store, log_tap=False) as host:
        await host.persister.send(request(replies, "held", 0, history(LONG), expected_version=0))
        await store.holding.wait()
        await host.persister.send(request(replies, "held", LONG, history(1, LONG), after="held-0"))
        await host.persister.send(request(replies, "other", 0, history(2), expected_version=0))
        with trio.fail_after(5):
            first = await replies.get()
        assert (first.session_id, first.version, first.error) == ("other", 1, None)
        assert store.saved == [("other", 2)]
        store.open.set()
        with trio.fail_after(5):
            replies = [await replies.get(), await replies.get()]
    assert [(r.request_id, r.in_place) for r in replies] == [
        ("held-0", True),
        (f"held-{LONG}", True),
    ]
    assert store.saved == [("other", 2), ("held", LONG), ("held", 1)]
    record = await store.load("held")
    assert record is not None and record.messages == history(LONG + 1)
