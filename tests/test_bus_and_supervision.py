"""The bus routes by type and session; observers never stall agents; crashes restart."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Actor, Agent, Bus, Host, Inbox, RestartPolicy, tool
from runtime import bus as bus_module
from runtime import events as ev
from runtime import output as o
from runtime.bus import Subscription
from runtime.chunks import Usage


def started(session_id: str) -> ev.StepStarted:
    return ev.StepStarted(session_id=session_id, turn_id="t", step=0)


async def test_bus_routes_by_event_type_and_session():
    bus = Bus()
    steps_s1 = bus.subscribe([ev.StepStarted], session_id="s1")
    everything = bus.subscribe(None)
    bus.publish_nowait(started("s1"))
    bus.publish_nowait(started("s2"))
    bus.publish_nowait(
        ev.StepFinished(session_id="s1", turn_id="t", step=0, finish_reason="stop", usage=Usage())
    )
    assert [e.session_id for e in _drain(steps_s1.inbox)] == ["s1"]
    assert len(_drain(everything.inbox)) == 3


async def test_while_no_subscription_is_scoped_a_session_s_events_route_by_class_alone():
    """With only subscriptions to every session's events (an embedded host's log tap),
    a new session's events are routed with no table of its own (a host opening a
    session per turn built one a turn, a tuple per event class in it); a subscription
    to one session brings the tables back, its unsubscribing takes them away, and
    delivery is the same throughout."""
    bus = Bus()
    everything = bus.subscribe(None)
    for sid in ("s1", "s2", "s3"):
        bus.publish_nowait(started(sid))
        assert bus.try_publish(started(sid)) and bus.wants(ev.StepStarted, sid)
    assert bus._routes == {} and len(_drain(everything.inbox)) == 6
    only_s1 = bus.subscribe([ev.StepStarted], session_id="s1")
    for sid in ("s1", "s2"):
        bus.publish_nowait(started(sid))
    assert set(bus._routes) == {"s1", "s2"}
    assert [e.session_id for e in _drain(only_s1.inbox)] == ["s1"]
    assert len(_drain(everything.inbox)) == 2
    only_s1.close()
    bus.publish_nowait(started("s1"))
    assert bus._routes == {} and len(_drain(everything.inbox)) == 1


async def test_publishing_with_no_subscriber_reaches_nobody():
    bus = Bus()
    assert not bus.wants(o.TextDelta, "s1")
    sub = bus.subscribe([ev.TurnStarted])
    assert not bus.wants(o.TextDelta, "s1") and bus.wants(ev.TurnStarted, "s1")
    sub.close()
    assert not bus.wants(ev.TurnStarted, "s1")


async def test_drop_oldest_keeps_the_newest_and_reports_how_many_were_lost():
    bus = Bus()
    sub = bus.subscribe([ev.StepStarted], policy="drop-oldest", capacity=2, name="slow")
    for i in range(5):
        bus.publish_nowait(ev.StepStarted(session_id="s", turn_id="t", step=i))
    first = await sub.inbox.get()
    assert isinstance(first, ev.Lagged) and first.dropped == 3 and first.subscriber == "slow"
    assert [(await sub.inbox.get()).step for _ in range(2)] == [3, 4]


async def test_block_policy_makes_the_publisher_wait_for_room():
    bus = Bus()
    sub = bus.subscribe([ev.StepStarted], policy="block", capacity=1)
    await bus.publish(started("s"))
    with trio.move_on_after(0.01) as scope:
        await bus.publish(started("s"))
    assert scope.cancelled_caught
    with pytest.raises(trio.WouldBlock):
        bus.publish_nowait(started("s"))
    await sub.inbox.get()
    await bus.publish(started("s"))


class _CountingBus(Bus):
    """A bus that notes each ``wants`` look-up."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[type] = []

    def wants(self, cls: type, session_id: str | None = None) -> bool:
        self.asked.append(cls)
        return super().wants(cls, session_id)


def _controller_batches() -> list:
    from runtime.actor_messages import Batch, PartBegin, StepBegin, TurnBegin
    from runtime.chunks import ReasoningChunk, TextChunk

    opening = Batch("t")
    opening += [TurnBegin(turn_id="t", message_id="m", consumer=None), StepBegin(step=0)]
    opening += [PartBegin(kind="reasoning", part_id="r"), ReasoningChunk(text="hm")]
    thinking = Batch("t")
    thinking += [ReasoningChunk(text=f"r{i}") for i in range(5)]
    texts = Batch("t")
    texts += [PartBegin(kind="text", part_id="p"), TextChunk(text="a")]
    deltas = Batch("t")
    deltas += [TextChunk(text=f"d{i}") for i in range(40)]
    return [opening, thinking, texts, deltas]


async def test_a_delta_only_batch_asks_the_bus_twice_when_nobody_wants_deltas():
    """The bus has subscribers (the log tap's events), none to deltas: a batch made only
    of deltas costs two look-ups (text, reasoning), not a pass over its chunks (issue 24)."""
    from actors.stream_controller import StreamController

    bus = _CountingBus()
    bus.subscribe([ev.TurnStarted])
    controller = StreamController(session_id="s")
    controller.attach(bus)
    opening, thinking, texts, deltas = _controller_batches()
    for batch in (opening, texts):
        await controller.handle(batch)
    bus.asked.clear()
    await controller.handle(deltas)
    await controller.handle(thinking)
    assert bus.asked == [o.TextDelta, o.ReasoningDelta] * 2


@pytest.mark.parametrize(
    "kinds",
    [[o.TextDelta], [o.ReasoningDelta], [o.TextDelta, o.ReasoningDelta], None],
)
async def test_a_bus_subscriber_to_deltas_still_gets_every_one(kinds):
    from actors.stream_controller import StreamController

    bus = Bus()
    sub = bus.subscribe(kinds, session_id="s", capacity=1000)
    controller = StreamController(session_id="s")
    controller.attach(bus)
    batches = _controller_batches()
    for batch in batches:
        await controller.handle(batch)
    got = _drain(sub.inbox)
    want = [c for b in batches for c in b if type(c).__name__ in ("TextChunk", "ReasoningChunk")]
    wanted = (o.TextDelta, o.ReasoningDelta) if kinds is None else tuple(kinds)
    deltas = [c for c in got if isinstance(c, (o.TextDelta, o.ReasoningDelta))]
    assert [c.text for c in deltas] == [
        c.text
        for c in want
        if (o.TextDelta if type(c).__name__ == "TextChunk" else o.ReasoningDelta) in wanted
    ]
    assert all(isinstance(c, wanted) for c in deltas)
    assert [c.seq for c in deltas] == sorted(c.seq for c in deltas)
    if kinds is None:  # everything, the other chunks too, in order
        assert [c.type for c in got][:3] == ["start", "step-start", "reasoning-start"]
        assert [c.seq for c in got] == list(range(1, len(got) + 1))


def _drain(inbox: Inbox) -> list:
    out = []
    while True:
        try:
            out.append(inbox.get_nowait())
        except trio.WouldBlock:
            return out


@tool
async def echo(text: str) -> str:
    """Echo."""
    return text


def two_step_agent() -> Agent:
    steps = [[*tool_call("echo", {"text": "hi"}, tool_call_id="E")], ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[echo])


class CrashingObserver(Actor):
    """Crashes on the first two events it sees, then records the rest."""

    subscribes_to = (ev.StepStarted, ev.TurnFinished)
    overflow = "drop-oldest"

    def __init__(self) -> None:
        super().__init__(name="crashy")
        self.crashes_left = 2
        self.seen: list[str] = []

    async def handle(self, message) -> None:
        if self.crashes_left:
            self.crashes_left -= 1
            raise RuntimeError("observer bug")
        self.seen.append(message.kind)


async def test_crashing_observer_is_restarted_and_the_turn_still_completes():
    from structlog.testing import capture_logs

    watcher_events: list = []
    with capture_logs() as logs:
        async with Host.open() as host:
            watch = host.bus.subscribe([ev.ActorCrashed, ev.ActorRestarted], name="watch")
            observer = await host.start_actor(CrashingObserver(), policy=RestartPolicy(intensity=5))
            session = await host.open_session(two_step_agent())
            result = await session.run("go")
            await trio.sleep(0.1)
            watcher_events = _drain(watch.inbox)
    logged = [(line["event"], line.get("actor")) for line in logs]
    assert logged.count(("actor.crashed", "crashy")) >= 2  # the crash is in the log...
    assert ("actor.restarted", "crashy") in logged  # ...and so is the restart
    assert result.finish_reason == "stop" and result.text == "done"
    kinds = [e.kind for e in watcher_events]
    assert kinds.count("actor.crashed") == 2 and kinds.count("actor.restarted") == 2
    assert all(e.actor == "crashy" for e in watcher_events)
    assert observer.seen == ["turn.finished"]  # it handled what came after its restarts


async def test_actor_past_its_restart_intensity_gives_up_and_says_so():
    class AlwaysCrashes(Actor):
        async def handle(self, message):
            raise ValueError("nope")

    async with Host.open(log_tap=False) as host:
        watch = host.bus.subscribe([ev.ActorGaveUp])
        actor = await host.start_actor(
            AlwaysCrashes(name="doomed"), policy=RestartPolicy(intensity=1, period=60)
        )
        for _ in range(3):
            try:
                await actor.send("boom")
            except trio.ClosedResourceError:
                break
        await actor.stopped.wait()
        gave_up = _drain(watch.inbox)
    assert [e.actor for e in gave_up] == ["doomed"]
    assert actor.inbox.closed


class SlowObserver(Actor):
    subscribes_to = Actor.ALL
    overflow = "drop-oldest"
    inbox_capacity = 4

    def __init__(self) -> None:
        super().__init__(name="slow-ui")
        self.handled = 0
        self.lagged = 0

    async def handle(self, message) -> None:
        if isinstance(message, ev.Lagged):
            self.lagged += message.dropped
        self.handled += 1
        await trio.sleep(10)


async def test_slow_drop_oldest_observer_never_delays_the_turn(autojump_clock):
    async with Host.open(log_tap=False) as host:
        slow = await host.start_actor(SlowObserver())
        session = await host.open_session(two_step_agent())
        t0 = trio.current_time()
        result = await session.run("go")
        elapsed = trio.current_time() - t0
        await trio.sleep(25)
    assert result.finish_reason == "stop"
    assert elapsed == 0  # the observer sleeps 10 s per event; the turn never waited
    assert slow.lagged > 0  # and it was told what it missed


async def test_an_actor_whose_handling_waits_takes_a_queued_message_without_a_step():
    """An actor marked ``handling_waits`` (the turn runner) takes a message already in its
    inbox in the step that finished the one before; any other actor yields once per
    message after its first (the task's first step takes it: it was just scheduled), so
    a backlog never runs in one step."""
    from runtime.actor import Actor
    from tests.support.steps import counted

    class Counting(Actor):
        def __init__(self, waits: bool) -> None:
            super().__init__(name=f"counting-{waits}")
            self.handling_waits = waits
            self.seen: list[int] = []

        async def handle(self, message: Any) -> None:
            self.seen.append(message)

    for waits, expected in ((True, 1), (False, 3)):
        actor = Counting(waits)
        for n in range(3):
            actor.inbox.put_nowait(n)
        actor.inbox.close()
        with counted() as steps:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(actor.run)
        assert actor.seen == [0, 1, 2]
        assert steps.named("Actor.run") == expected, waits


def test_try_publish_delivers_to_every_subscriber_or_to_none():
    """``Bus.try_publish``: everyone at once when no ``block`` inbox is full (a full
    ``drop-oldest`` one drops its oldest, a closed one is unsubscribed), else nobody."""
    from runtime.bus import Bus
    from runtime.events import TurnStarted

    bus = Bus()
    block = bus.subscribe([TurnStarted], policy="block", capacity=1)
    lossy = bus.subscribe([TurnStarted], policy="drop-oldest", capacity=1)
    gone = bus.subscribe([TurnStarted], policy="block", capacity=1)
    gone.inbox.close()
    event = TurnStarted(session_id="s", turn_id="t", input="x", agent="a")
    lossy.inbox.put_nowait("old")
    assert bus.try_publish(event)
    assert block.inbox.get_nowait() is event
    assert type(lossy.inbox.get_nowait()).__name__ == "Lagged"  # "old" dropped for it
    assert lossy.inbox.get_nowait() is event
    assert bus.subscription_count == 2  # the closed one is gone, as publish drops it
    block.inbox.put_nowait("full")
    assert not bus.try_publish(event)
    assert len(lossy.inbox) == 0 and block.inbox.get_nowait() == "full"  # nobody got it


def test_try_publish_to_an_inbox_subscribed_twice_delivers_both_or_neither():
    """One ``block`` inbox behind two subscriptions takes an event twice (as ``publish``
    puts it twice). With room for one only, ``try_publish`` used to check each
    subscription alone, deliver the first and raise ``WouldBlock`` on the second: a
    turn's end announced so crashed its runner. It says ``False`` now, nothing sent (the
    caller then publishes, waiting for the room)."""
    from runtime.bus import Bus
    from runtime.events import TurnStarted
    from runtime.inbox import Inbox

    bus = Bus()
    box: Inbox[object] = Inbox(3, "block")
    bus.subscribe([TurnStarted], inbox=box)
    bus.subscribe(None, inbox=box)
    event = TurnStarted(session_id="s", turn_id="t", input="x", agent="a")
    assert bus.try_publish(event)  # room for both
    assert [box.get_nowait(), box.get_nowait()] == [event, event]
    box.put_nowait("a")
    box.put_nowait("b")  # room for one
    assert not bus.try_publish(event)
    assert len(box) == 2


async def test_closing_one_of_two_scoped_subscriptions_keeps_routing_by_session():
    bus = Bus()
    first = bus.subscribe(session_id="s1", name="first")
    second = bus.subscribe(session_id="s1", name="second")
    everything = bus.subscribe(name="all")
    first.close()
    first.close()  # twice: nothing more happens
    bus.publish_nowait(started("s2"))
    bus.publish_nowait(started("s1"))
    assert [e.session_id for e in _drain(second.inbox)] == ["s1"]
    assert [e.session_id for e in _drain(everything.inbox)] == ["s2", "s1"]
    assert bus.subscription_count == 2


def test_closing_ten_thousand_unscoped_subscriptions_looks_at_each_once(monkeypatch):
    # Each close scanned every subscription left (list.remove, then any() for a scoped
    # one): 10,000 closes looked 50 million times, seconds of the loop held.
    looks = [0]

    class Counted(Subscription):
        __slots__ = ()
        __hash__ = object.__hash__

        def __eq__(self, other: object) -> bool:
            looks[0] += 1
            return self is other

        def __getattribute__(self, name: str) -> Any:
            if name in ("session_id", "kinds"):
                looks[0] += 1
            return object.__getattribute__(self, name)

    monkeypatch.setattr(bus_module, "Subscription", Counted)
    bus = Bus()
    subs = [bus.subscribe(name=f"sub{n}") for n in range(10_000)]
    looks[0] = 0
    for sub in subs:
        sub.close()
    assert bus.subscription_count == 0 and looks[0] <= 10_000
