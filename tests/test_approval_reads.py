"""What deciding and resuming a waiting turn reads from the store (issue 21: suspending
and resuming should cost about a step commit). In the process that holds the session,
the decision is checked against the history in memory and the continuation starts from
what the decision stored: no session is read back. A view that another writer made
stale is never trusted: the store is read then, as before."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import AlreadyDecided, Host, NothingToResume
from runtime.approval import Decision, record_decision, supersede, waiting_calls
from runtime.messages import UserMessage
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)


def count_calls(store: Any) -> Counter[str]:
    """Count the store's loads, saves and version queries (wrapping the instance)."""
    calls: Counter[str] = Counter()
    for name in ("load", "save", "version"):
        original = getattr(store, name)

        def counted(*args: Any, _original: Any = original, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kw)

        setattr(store, name, counted)
    return calls


async def suspended(host: Host) -> tuple[Any, Any]:
    from runtime import Agent

    steps = [tool_call("delete_file", {"path": "/x"}, tool_call_id="D"), ["done"]]
    session = await host.open_session(
        Agent(provider=ScriptedProvider(steps), tools=[delete_file]), session_id="s"
    )
    result = await session.run("go")
    assert result.finish_reason == "awaiting-input"
    return session, result


async def test_a_decision_and_its_continuation_in_one_process_read_no_session(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, waiting = await suspended(host)
        calls = count_calls(host.store)
        recorded = await session.decide(waiting.pending[0].approval_id, approved=True)
        decided = dict(calls)
        calls.clear()
        async with session.resume() as out:
            async for _ in out:
                pass
        resumed = dict(calls)
        stored = await host.store.load("s")
    assert decided == {"save": 1}  # checked against the history in memory
    # The continuation took what was saved, once it checked that nobody wrote since; then
    # committed the approved call's result, and its last step.
    assert recorded.complete and resumed == {"version": 1, "save": 2}
    assert ran == ["/x"] and out.result.finish_reason == "stop" and out.result.text == "done"
    assert out.result.message.id == waiting.message.id
    assert stored.messages[1].content[0].awaiting.approved is True
    assert [type(m).__name__ for m in stored.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
    ]


async def test_respond_resumes_from_its_own_decision_without_asking_the_store(tmp_path):
    """``respond`` decides and resumes at once: the continuation takes what its own
    decision stored, without the version query ``resume()`` makes (``Session.take_decided``
    says why that is safe); the only store calls are the three saves."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, waiting = await suspended(host)
        calls = count_calls(host.store)
        result = await session.respond(waiting.pending[0].approval_id, approved=True)
        responded = dict(calls)
        stored = await host.store.load("s")
    # the decision's save, the approved call's result, the last step
    assert responded == {"save": 3}
    assert ran == ["/x"] and result is not None and result.text == "done"
    assert result.message.id == waiting.message.id
    assert stored is not None and stored.messages[1].content[0].awaiting.approved is True


async def test_a_decision_overtaken_in_this_process_is_not_taken_as_it_is(tmp_path):
    """The decision ``respond`` resumes from is taken without asking the store only while
    it is the session's latest: after a new input in this process it is not, and the
    continuation reads the store, which says nothing waits any more."""
    from runtime.app.session import ResumeStream

    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, waiting = await suspended(host)
        recorded = await session.decide(waiting.pending[0].approval_id, approved=True)
        assert recorded.complete
        await session.run("something else")  # supersedes the decided wait: runs it
        assert session.take_decided(recorded) is None
        calls = count_calls(host.store)
        with pytest.raises(NothingToResume):
            async with ResumeStream(session, decided=recorded):
                pass
    assert calls["load"] == 1 and ran == ["/x"]  # once, by the new message's turn


async def test_a_decision_records_the_waiting_calls_it_found(tmp_path):
    """``Recorded.waiting`` is the turn's waiting calls as the decision left them, from
    the one scan that checked it: what ``waiting_calls`` of the stored history says."""
    steps = [
        [
            *tool_call("delete_file", {"path": "/a"}, tool_call_id="A"),
            *tool_call("delete_file", {"path": "/b"}, tool_call_id="B"),
        ],
        ["done"],
    ]
    from runtime import Agent

    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[delete_file]), session_id="s"
        )
        waiting = await session.run("go")
        a, b = waiting.pending
        first = await record_decision(host.store, "s", a.approval_id, Decision(approved=True), {})
        stored = await host.store.load("s")
        assert stored is not None
        assert first.waiting == waiting_calls(stored.messages)
        assert [(c.tool_call_id, c.decided) for c in first.waiting] == [("A", True), ("B", False)]
        assert not first.complete
        second = await record_decision(host.store, "s", b.approval_id, Decision(approved=False), {})
        stored = await host.store.load("s")
        assert stored is not None and second.complete
        assert second.waiting == waiting_calls(stored.messages)
        assert all(c.decided for c in second.waiting)


async def test_a_decision_another_writer_made_first_is_found_in_the_store(tmp_path):
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session, waiting = await suspended(host)
        key = waiting.pending[0].approval_id
        async with Host.open(store=path, log_tap=False) as other:  # another process
            await record_decision(other.store, "s", key, Decision(approved=False), {})
        calls = count_calls(host.store)
        with pytest.raises(AlreadyDecided):  # the view in memory still shows it waiting
            await session.decide(key, approved=True)
    assert calls["load"] == 1  # the stale view's save conflicted: the store was read
    assert ran == []


async def test_a_view_in_memory_without_the_call_does_not_refuse_it(tmp_path):
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session, waiting = await suspended(host)
        key = waiting.pending[0].approval_id
        before = await host.store.load("s")
        await session.run("something else")  # supersedes the wait in memory and store
        async with Host.open(store=path, log_tap=False) as other:  # restores it elsewhere
            version = await other.store.version("s")
            assert before is not None
            await other.store.save("s", 0, before.messages, expected_version=version)
        result = await session.respond(key, approved=True)
    assert ran == ["/x"] and result is not None and result.finish_reason == "stop"


async def test_a_continuation_does_not_trust_a_decision_another_writer_overtook(tmp_path):
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session, waiting = await suspended(host)
        await session.decide(waiting.pending[0].approval_id, approved=True)
        async with Host.open(store=path, log_tap=False) as other:  # a new message elsewhere
            record = await other.store.load("s")
            assert record is not None
            messages = list(record.messages)
            supersede(messages)
            messages.append(UserMessage(content="never mind"))
            await other.store.save("s", 0, messages, expected_version=record.version)
        calls = count_calls(host.store)
        with pytest.raises(NothingToResume):
            async with session.resume():
                pass
    assert calls["load"] == 1 and ran == []


async def test_a_continuations_claim_reads_the_session_and_the_worker_does_not_again(
    pg_url: str,
) -> None:
    """On workers the decision is recorded elsewhere (a front end), so the continuation
    must read the session: the claim does, in its own transaction, and the turn starts
    from that record instead of loading it in a round trip of its own."""
    from actors.providers.scripted import current_step
    from actors.stores import open_store, turn_queue
    from runtime import Agent
    from runtime.app.worker import Worker

    def respond(request: Any) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("delete_file", {"path": "/x"}, tool_call_id="D")
        return ["done"]

    agent = Agent(provider=ScriptedProvider(responder=respond), tools=[delete_file])
    store = await open_store(pg_url)
    queue = turn_queue(store)
    claims: list[Any] = []
    try:
        async with trio.open_nursery() as nursery:
            worker = Worker(store=store, agent=agent, poll=0.05, concurrency=1)
            claim = worker.queue.claim_unread

            async def claim_and_keep(*args: Any, **kw: Any) -> Any:
                found = await claim(*args, **kw)
                if found is not None:
                    claims.append(found)
                return found

            worker.queue.claim_unread = claim_and_keep  # type: ignore[method-assign]
            await nursery.start(worker.run)
            turn = await queue.submit("w1", "go")
            await until(queue, turn.turn_id, lambda s: s.waiting)
            record = await store.load("w1")
            assert record is not None
            tools = {t.name: t for t in agent.tools}
            (call,) = [c for c in record.messages[1].content if c.awaiting is not None]
            calls = count_calls(store)
            await queue.decide("w1", call.awaiting.id, Decision(approved=True), tools)
            decided = calls["load"]
            await until(queue, turn.turn_id, lambda s: s.finished)
            loads = calls["load"] - decided
            worker.stop()
        stored = await store.load("w1")
    finally:
        await queue.aclose()
    resumed = claims[-1]
    assert resumed.resumed and resumed.stored is not None
    assert resumed.stored.messages[1].content[0].awaiting.approved is True  # decided
    assert loads == 0  # the worker's turn started from the claim's record
    assert ran == ["/x"] and stored is not None
    assert [type(m).__name__ for m in stored.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
    ]
    assert stored.messages[1].content[-1].text == "done"


async def until(queue: Any, turn_id: str, done: Any) -> Any:
    with trio.fail_after(30):
        while True:
            status = await queue.get_status(turn_id)
            if status is not None and done(status):
                return status
            await trio.sleep(0.01)


async def test_a_workers_turn_starts_from_the_session_it_loaded_for_it(pg_url: str) -> None:
    """A worker's claim reads the claimed turn's session when the worker does not have
    it in memory (in the claim's thread hop, after its commit): no other worker may save
    it meanwhile, so the turn neither loads it again nor asks the store for its version
    before it starts (issue 24). A session the worker still had open from an earlier
    turn is not read: the turn asks for its version, as another worker may have run
    turns of it since."""
    from actors.stores import open_store, turn_queue
    from runtime import Agent
    from runtime.app.worker import Worker

    agent = Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))
    store = await open_store(pg_url)
    queue = turn_queue(store)
    calls = count_calls(store)
    try:
        async with trio.open_nursery() as nursery:
            worker = Worker(store=store, agent=agent, poll=0.05, concurrency=1)
            await nursery.start(worker.run)
            first = await queue.submit("v1", "one")
            await until(queue, first.turn_id, lambda s: s.finished)
            after_first = Counter(calls)
            second = await queue.submit("v1", "two")
            await until(queue, second.turn_id, lambda s: s.finished)
            worker.stop()
        after_second = Counter(calls)
        stored = await store.load("v1")
    finally:
        await queue.aclose()
    assert after_first["load"] == 0 and after_first["version"] == 0
    # open already: asked, not read
    assert after_second["load"] == 0 and after_second["version"] == 1
    assert stored is not None
    assert [m.content for m in stored.messages if isinstance(m, UserMessage)] == ["one", "two"]
