"""What crosses between actors is data: the turn runner owns the history and publishes
immutable snapshots, a turn's result arrives on its stream's inbox, the persister
answers on a reply inbox, and the application changes a session only through Session
methods."""

from __future__ import annotations

import attrs
import pytest
import trio

from actors.persister import Persister
from actors.providers.scripted import ScriptedProvider
from actors.stores import MemoryStore
from runtime import Agent, Host
from runtime.actor_messages import SaveRequest, SaveResult
from runtime.bus import Bus
from runtime.errors import SessionBusy
from runtime.inbox import Inbox
from runtime.messages import UserMessage


def agent(*answers: str) -> Agent:
    return Agent(provider=ScriptedProvider(steps=[[a] for a in answers or ("ok",)]))


def user_texts(messages) -> list[str]:
    return [m.content for m in messages if isinstance(m, UserMessage)]


# -- the history: owned by the runner, read as snapshots -----------------------------------


async def test_a_snapshot_of_the_history_never_changes_after_it_was_taken():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent("a", "b"), session_id="s")
        await session.run("one")
        before = session.state
        await session.run("two")
    assert user_texts(before.messages) == ["one"]  # the runner replaced it, never mutated it
    assert user_texts(session.messages) == ["one", "two"]


async def test_the_history_a_reader_gets_cannot_be_changed():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        await session.run("one")
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            session.state.messages = ()  # type: ignore[misc]
        assert isinstance(session.messages, tuple)


async def test_the_result_is_set_when_the_iteration_ends_inside_the_block():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent("hello"), session_id="s")
        async with session.stream("hi") as out:
            chunks = [c async for c in out]
            assert out.result is not None and out.result.text == "hello"
            assert not session.busy  # the next turn may start right away
            assert out.done.is_set()
    assert chunks[-1].type == "finish"


async def test_leaving_a_stream_early_frees_the_session_with_its_result():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent("hello there"), session_id="s")
        async with session.stream("hi") as out:
            async for _ in out:
                break
        assert out.result is not None and out.result.finish_reason == "aborted"
        assert out.result.abort_reason == "consumer left the stream"
        assert not session.busy
        assert (await session.run("again")).finish_reason == "stop"


async def test_a_turn_cancelled_before_the_runner_took_it_ends_with_that_reason():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        async with session.stream("hi") as out:
            out.cancel("changed my mind")
            chunks = await out.collect()
    assert chunks[-1].type == "abort" and chunks[-1].reason == "changed my mind"
    assert out.result is not None and out.result.abort_reason == "changed my mind"


async def test_a_second_stream_on_a_busy_session_is_refused_and_the_first_goes_on():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent("first"), session_id="s")
        async with session.stream("one") as out:
            with pytest.raises(SessionBusy):
                async with session.stream("two"):
                    pass
            assert session.busy
            await out.collect()
        assert out.result is not None and out.result.text == "first"
        assert user_texts(session.messages) == ["one"]


async def test_a_turn_after_the_stream_controller_is_gone_runs_on_a_fresh_one():
    # (A controller that ends mid-turn: tests/test_actor_give_up.py.)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        controller = next(a for a in session.actors if a.name == "stream-controller")
        controller.stop()
        await controller.stopped.wait()
        with trio.fail_after(30):
            result = await session.run("hi")
        assert result.finish_reason == "stop"  # before: "error", on the ended controller
        assert controller not in session.actors and not session.busy


# -- meta and regenerate through Session methods -------------------------------------------


async def test_a_title_set_on_the_session_is_saved_with_the_next_turn():
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        session.set_title("Paris weather")
        assert session.meta["title"] == "Paris weather"
        await session.run("hi")
    record = await store.load("s")
    assert record is not None and record.meta["title"] == "Paris weather"


async def test_the_meta_a_reader_gets_cannot_be_changed():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s", meta={"title": "t"})
        with pytest.raises(TypeError):
            session.meta["title"] = "changed"  # type: ignore[index]
        assert session.meta == {"title": "t"}


async def test_regenerate_replaces_the_last_turn_in_memory_and_in_the_store():
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent("a", "b", "c"), session_id="s")
        await session.run("one")
        await session.run("two")
        async with session.regenerate("two, again") as out:
            await out.collect()
        assert user_texts(session.messages) == ["one", "two, again"]
    record = await store.load("s")
    assert record is not None and user_texts(record.messages) == ["one", "two, again"]


async def test_regenerate_on_an_empty_session_just_runs_the_turn():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent("a"), session_id="s")
        async with session.stream("first", regenerate=True) as out:
            await out.collect()
        assert user_texts(session.messages) == ["first"]


# -- the persister answers on a reply inbox ------------------------------------------------


def save(request_id: str, start: int, *texts: str, **fields) -> SaveRequest:
    return SaveRequest(
        request_id=request_id,
        session_id="s",
        turn_id="t",
        start=start,
        messages=tuple(UserMessage(content=t, id=t) for t in texts),
        **fields,
    )


async def run_persister(store, *requests: SaveRequest) -> None:
    persister = Persister(store)
    persister.attach(Bus())
    for request in requests:
        await persister.handle(request)


async def test_the_persister_answers_each_save_with_a_result_on_its_reply_inbox():
    replies: Inbox[SaveResult] = Inbox(4, "drop-oldest")
    request = save("r1", 0, "a", expected_version=0, reply=replies)
    await run_persister(MemoryStore(), request)
    result = replies.get_nowait()
    assert (result.request_id, result.version, result.error, result.base) == ("r1", 1, None, None)


async def test_a_save_based_on_the_previous_request_is_written_in_place():
    store, replies = MemoryStore(), Inbox[SaveResult](4, "drop-oldest")
    first = save("r1", 0, "a", expected_version=0, reply=replies)
    second = save("r2", 1, "b", after="r1", reply=replies)
    await run_persister(store, first, second)
    replies.get_nowait()
    result = replies.get_nowait()
    assert (result.version, result.in_place) == (2, True)
    record = await store.load("s")
    assert record is not None and user_texts(record.messages) == ["a", "b"]


async def test_a_save_after_an_unknown_request_is_rebased_and_loses_nothing():
    store, replies = MemoryStore(), Inbox[SaveResult](4, "drop-oldest")
    await store.save("s", 0, [UserMessage(content="theirs", id="theirs")])
    await run_persister(store, save("r2", 0, "ours", after="gone", reply=replies))
    result = replies.get_nowait()
    assert result.base is not None and not result.in_place
    record = await store.load("s")
    assert record is not None and user_texts(record.messages) == ["theirs", "ours"]


async def test_a_failed_save_is_answered_with_its_error_and_the_request_is_untouched():
    class Broken(MemoryStore):
        async def save(self, *args, **kwargs):
            raise OSError("disk full")

    replies: Inbox[SaveResult] = Inbox(4, "drop-oldest")
    request = save("r1", 0, "a", expected_version=0, reply=replies)
    await run_persister(Broken(), request)
    result = replies.get_nowait()
    assert isinstance(result.error, OSError) and result.version is None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        request.start = 1  # type: ignore[misc]


async def test_the_persister_never_waits_for_a_requester_that_does_not_read():
    replies: Inbox[SaveResult] = Inbox(1, "block")
    replies.put_nowait(SaveResult(request_id="old", session_id="s", version=1))  # full
    with trio.fail_after(5):
        await run_persister(MemoryStore(), save("r1", 0, "a", expected_version=0, reply=replies))
    assert replies.get_nowait().request_id == "old"


# -- the public seams of the inbox and the bus ---------------------------------------------


def test_an_inbox_is_closed_only_once_close_was_called():
    inbox: Inbox[int] = Inbox(1)
    inbox.close_receiver()  # the reader left: sends fail, but nobody closed the inbox
    assert not inbox.closed
    inbox.close()
    assert inbox.closed


def test_the_bus_says_whether_anyone_subscribed():
    bus = Bus()
    assert not bus.has_subscribers()
    first, second = bus.subscribe(), bus.subscribe()
    bus.unsubscribe(first)
    assert bus.has_subscribers()
    second.close()
    assert not bus.has_subscribers() and bus.subscription_count == 0
