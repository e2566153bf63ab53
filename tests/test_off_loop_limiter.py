"""The threads long histories are walked in (round 4, ``atk4``).

:func:`runtime.history.run_long_off_loop` took its thread through trio's default limiter
(40 threads), which every other ``to_thread.run_sync`` of the process shares: a burst of
long histories (clients' Chat Completions histories of 600,000 messages, long sessions
decoded) took every one of them, and a submit's encoding or a name's resolution waited
behind the walks. Now a walk goes through the limiter its caller hands (a front end's
``parse_limiter`` for a history a client sent), else the history module's own
(:data:`~runtime.history.OFF_LOOP_THREADS`), never the default. Pinned by counts of the
limiters' borrowed tokens while the walks are held, not by times.
"""

from __future__ import annotations

import threading
from typing import Any

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider
from actors.stores.validation import encoded_off_loop
from runtime import Agent
from runtime import history as history_module
from runtime.app.web import openai_compat
from runtime.history import OFF_LOOP_MESSAGES, OFF_LOOP_THREADS, off_loop_limiter
from runtime.messages import UserMessage
from tests.test_openai_compat import openai_client
from tests.web.harness import web_server

WALKS = 10
"""Long histories walked at once (more than :data:`OFF_LOOP_THREADS`)."""


async def _held_walks(**limiter: Any) -> tuple[int, int, int]:
    """:data:`WALKS` walks held in their threads (or waiting for one); the tokens trio's
    default limiter lent, the off-loop limiter's (or the one handed) lent, and the walks
    waiting for one."""
    release = threading.Event()
    used = limiter.get("limiter") or off_loop_limiter()

    def walk(_: Any) -> None:
        release.wait(30)

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(WALKS):
                nursery.start_soon(
                    lambda: history_module.run_long_off_loop(
                        OFF_LOOP_MESSAGES + 1, walk, None, **limiter
                    )
                )
            await trio.testing.wait_all_tasks_blocked()
            default = trio.to_thread.current_default_thread_limiter().borrowed_tokens
            lent, waiting = used.borrowed_tokens, used.statistics().tasks_waiting
            release.set()
    finally:
        release.set()
    return default, lent, waiting


async def test_long_walks_at_once_take_no_thread_of_trios_default_limiter():
    """Ten walks at once: none borrows from trio's default limiter (before: all ten
    did); :data:`OFF_LOOP_THREADS` run, the rest wait for theirs."""
    assert await _held_walks() == (0, OFF_LOOP_THREADS, WALKS - OFF_LOOP_THREADS)


async def test_a_walk_handed_a_limiter_takes_its_thread_there():
    parse = trio.CapacityLimiter(2)
    assert await _held_walks(limiter=parse) == (0, 2, WALKS - 2)


async def test_a_short_history_takes_no_thread_at_all():
    before = off_loop_limiter().statistics()
    checked = await history_module.checked_off_loop([UserMessage(content="hi")])
    assert len(checked) == 1 and off_loop_limiter().statistics() == before


async def test_a_chat_completions_history_is_checked_under_the_front_ends_parse_limiter(
    monkeypatch,
):
    """A stateless Chat Completions request's history (the client's) is checked through
    the app's ``parse_limiter``, the limiter of the work a client's body costs."""
    real = openai_compat.checked_off_loop
    handed: list[Any] = []

    async def checked(history: Any, **kwargs: Any) -> Any:
        handed.append(kwargs.get("limiter"))
        return await real(history, **kwargs)

    monkeypatch.setattr(openai_compat, "checked_off_loop", checked)
    agent = Agent(name="geo", provider=ScriptedProvider(["Paris."]))
    async with web_server(agent, protocols=("ai-sdk", "openai")) as server:
        async with openai_client(server) as client:
            completion = await client.chat.completions.create(
                model="geo",
                messages=[
                    {"role": "user", "content": "Capital of France?"},
                    {"role": "assistant", "content": "Which one?"},
                    {"role": "user", "content": "So?"},
                ],
            )
        parse_limiter = server.app.state.axon.parse_limiter
    assert completion.choices[0].message.content == "Paris."
    assert handed == [parse_limiter] and isinstance(parse_limiter, trio.CapacityLimiter)


async def test_a_long_saves_encoding_takes_the_off_loop_limiter(monkeypatch):
    """A store's encoding of a long save (600,000 messages seeded into a first save)
    walks the history as a check does: through the off-loop limiter, not the default."""
    real = trio.to_thread.run_sync
    handed: list[Any] = []

    async def run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        handed.append(kwargs.get("limiter"))
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)
    history = [UserMessage(content=f"m{i}") for i in range(OFF_LOOP_MESSAGES + 1)]
    new, rows = await encoded_off_loop("s", 0, history, None)
    assert len(new) == len(rows) == OFF_LOOP_MESSAGES + 1
    assert handed == [off_loop_limiter()]
