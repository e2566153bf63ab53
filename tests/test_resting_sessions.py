"""An idle session's actors rest: no task, no channel, until its next turn (issue 24
item 5: ten thousand idle sessions in one host must cost little memory)."""

from __future__ import annotations

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, Bus, Host, Inbox, tool
from runtime import events as ev
from runtime.actor import REST, Actor
from runtime.provider import TextRun


@tool
async def lookup(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


def tool_agent() -> Agent:
    return Agent(
        name="a",
        provider=ScriptedProvider([tool_call("lookup", {"city": "Paris"}), ["sunny"]]),
        tools=[lookup],
    )


def host_tasks(host: Host) -> int:
    return len(host.nursery.child_tasks)


def rests(session) -> bool:
    """Every actor of the session rests, and every inbox it holds has no channel."""
    runner = session.runner
    inboxes = [a.inbox for a in session.actors]
    inboxes += [runner.stream_inbox, runner.tool_inbox, runner.save_replies]
    return all(a.resting for a in session.actors) and all(i.parked for i in inboxes)


async def test_an_opened_session_starts_no_task_and_opens_no_channel():
    agent = tool_agent()
    async with Host.open(log_tap=False) as host:
        await host.open_session(agent, session_id="warm")  # its provider's actor starts
        before = host_tasks(host)
        sessions = [await host.open_session(agent, session_id=f"s{i}") for i in range(10)]
        assert host_tasks(host) == before
        assert all(rests(s) for s in sessions)


async def test_after_its_turn_a_session_holds_no_task_and_runs_the_next_turn():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(tool_agent(), session_id="s")
        idle = host_tasks(host)
        first = await session.run("weather?")
        await trio.testing.wait_all_tasks_blocked()
        assert rests(session) and host_tasks(host) == idle
        assert not any(a.stopped.is_set() for a in session.actors)
        second = await session.run("again?")  # woken again: same actors, same history
        assert first.text == second.text == "sunny"
        assert len(session.messages) == 6  # user, assistant, tool result; twice
        await trio.testing.wait_all_tasks_blocked()
        assert rests(session) and host_tasks(host) == idle


async def test_turns_back_to_back_wake_actors_that_were_about_to_rest():
    agent = Agent(name="a", provider=ScriptedProvider([["one"]]), on_busy="enqueue")
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        for _ in range(3):  # the next turn starts before the last one's REST is read
            assert (await session.run("hi")).text == "one"
        async with trio.open_nursery() as nursery:  # queued turns: no rest in between
            for _ in range(3):
                nursery.start_soon(session.run, "hi")
        assert len(session.messages) == 12  # user and assistant, six turns
        await trio.testing.wait_all_tasks_blocked()
        assert rests(session)


async def test_a_queued_turn_starts_while_the_controller_waits_to_hand_over_a_result(
    autojump_clock,
):
    """The controller rests after handing a turn's result over (rests_after_turn) only if
    the hand-over did not wait: here its put waits on a consumer inbox full of a long
    answer, the consumer takes all of it at once (``take_ready``), the queued turn starts
    and finds the controller awake (no wake), then the controller resumes. Resting then
    left the queued turn's items in an inbox nobody read: that turn hung. Trio runs the
    two tasks in either order, so the race is run many times."""
    n = 16300  # with the turn's 6 other chunks: 128 full consumer batches, then the result
    provider = ScriptedProvider(turns=[[[TextRun(texts=["x"] * n)]], [["b"]]] * 16)
    agent = Agent(name="a", provider=provider, on_busy="enqueue")
    async with Host.open(log_tap=False) as host:
        for attempt in range(16):
            session = await host.open_session(agent, session_id=f"s{attempt}")
            second: list = []

            async def queued(session=session, second=second) -> None:
                async with session.stream("b") as out:
                    second.extend([c.type async for c in out])

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    async with session.stream("a") as out:
                        nursery.start_soon(queued)
                        await trio.testing.wait_all_tasks_blocked()
                        assert len(out._inbox) == 128  # full: the result's put waits
                        first = out.take_ready(10**6)
            assert sum(c.type == "text-delta" for c in first) == n and out.result is not None
            assert second[-1] == "finish" and out.result.text == "x" * n
            await trio.testing.wait_all_tasks_blocked()
            assert rests(session)  # after the queued turn, all rest


async def test_a_running_turn_keeps_its_actors_awake():
    agent = Agent(name="a", provider=ScriptedProvider([[Sleep(10), "late"]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "hi")
            await trio.testing.wait_all_tasks_blocked()
            assert session.busy and not any(a.resting for a in session.actors)
            host.rest(session)  # a stray REST while busy is ignored
            await trio.testing.wait_all_tasks_blocked()
            assert not any(a.resting for a in session.actors)
            session.current.cancel("enough")
        await trio.testing.wait_all_tasks_blocked()
        assert rests(session)


async def test_a_queued_turn_given_up_as_the_running_turn_ends_leaves_the_actors_resting():
    """The window of the same scheduler batch: the queued caller is cancelled in the step
    that hands the running turn its result, so that turn ends with a turn still queued
    (its actors do not rest, a turn is about to start) and the queued one then leaves
    without starting. Nothing would rest them until the next turn or the eviction."""
    agent = Agent(name="a", provider=ScriptedProvider([["one"]]), on_busy="enqueue")
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        leaving = trio.CancelScope()

        async def queued() -> None:
            with leaving:
                await session.run("second")

        async with trio.open_nursery() as nursery, session.stream("first") as out:
            nursery.start_soon(queued)
            await trio.testing.wait_all_tasks_blocked()  # the first turn is over, unread
            assert session.queued == 1 and session.busy
            leaving.cancel()  # the queued caller gives up...
            out.take_ready()  # ...in the step the first turn's result is taken
            assert out.result is not None and not session.busy
        await trio.testing.wait_all_tasks_blocked()
        assert leaving.cancelled_caught and session.queued == 0
        assert [m.role for m in session.messages] == ["user", "assistant"]
        assert rests(session)


async def test_closing_a_resting_session_stops_its_actors_for_good():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(tool_agent(), session_id="s")
        actors = list(session.actors)
        await session.close()
        assert all(a.stopped.is_set() for a in actors)
        host.wake(session)  # a stopped actor is not started again
        assert all(a.stopped.is_set() for a in actors)


class Counter(Actor):
    def __init__(self) -> None:
        super().__init__(name="counter")
        self.seen: list[object] = []

    async def handle(self, message: object) -> None:
        self.seen.append(message)


async def test_rest_ends_the_task_only_when_allowed_and_nothing_is_queued():
    may = [False]
    actor = Counter()
    actor.rests_when = lambda: may[0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await actor.send(REST)  # not allowed: ignored
        await trio.testing.wait_all_tasks_blocked()
        assert not actor.resting and actor.seen == []
        may[0] = True
        actor.inbox.put_nowait(REST)
        actor.inbox.put_nowait("queued after it")  # queued: it stays awake
        await trio.testing.wait_all_tasks_blocked()
        assert not actor.resting and actor.seen == ["queued after it"]
        await actor.send(REST)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.resting and actor.inbox.parked
        assert len(nursery.child_tasks) == 0 and not actor.stopped.is_set()
        await actor.send("while resting")  # waits in the inbox for the next start
        actor.resting = False
        nursery.start_soon(actor.run)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.seen == ["queued after it", "while resting"]
        actor.stop()


async def test_a_parked_inbox_opens_a_channel_again_on_use():
    inbox: Inbox[int] = Inbox(4)
    assert inbox.parked and len(inbox) == 0
    inbox.put_nowait(1)
    assert not inbox.parked and not inbox.park()  # a queued message keeps it
    assert inbox.get_nowait() == 1
    assert inbox.park() and inbox.parked
    await inbox.put(2)
    assert await inbox.get() == 2
    inbox.close()
    assert not inbox.park()  # a closed inbox keeps its channel: the reader sees the end
    assert [m async for m in inbox] == []


async def test_a_parked_inbox_keeps_a_channel_a_task_waits_on():
    inbox: Inbox[int] = Inbox(4)
    got: list[int] = []
    async with trio.open_nursery() as nursery:

        async def reader() -> None:
            got.append(await inbox.get())

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert not inbox.park()
        inbox.put_nowait(7)
    assert got == [7]


async def test_forgetting_a_session_drops_only_its_routes():
    bus = Bus()
    a = bus.subscribe([ev.StepStarted], session_id="a")
    b = bus.subscribe([ev.StepStarted], session_id="b")
    for sid in ("a", "b"):
        bus.publish_nowait(ev.StepStarted(session_id=sid, turn_id="t", step=0))
    bus.forget_session("a")
    assert set(bus._routes) == {"b"}
    bus.publish_nowait(ev.StepStarted(session_id="a", turn_id="t", step=1))
    assert len(a.inbox) == 2 and len(b.inbox) == 1


async def test_a_turn_makes_no_supervisor_logger_unless_an_actor_crashes(monkeypatch):
    """Each actor runs once per turn: a logger made per run was four tracked objects per
    actor for every full collection to walk with 10,000 turns in flight."""
    import runtime.actor

    made: list[str] = []
    real = runtime.actor.get_logger

    def counting(name: str = "axon") -> object:
        made.append(name)
        return real(name)

    monkeypatch.setattr(runtime.actor, "get_logger", counting)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(tool_agent(), session_id="s")
        for _ in range(3):
            assert (await session.run("weather?")).text == "sunny"
    assert made == []


async def test_sessions_share_an_empty_meta_view_and_their_host_s_tool_source():
    """Per session, an empty meta's read-only view and the runner's tool source were
    three more objects for every full collection to walk (issue 24 item 5)."""
    async with Host.open(log_tap=False) as host:
        a, b = [await host.open_session(tool_agent(), session_id=sid) for sid in "ab"]
        assert a.meta is b.meta and dict(a.meta) == {}
        assert a.runner.tool_source is b.runner.tool_source
        c = await host.open_session(tool_agent(), session_id="c", meta={"k": 1})
        assert dict(c.meta) == {"k": 1} and c.meta is not a.meta
        a.update_meta({"title": "t"})
        assert dict(a.meta) == {"title": "t"} and dict(b.meta) == {}
