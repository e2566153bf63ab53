"""A plain turn's hops, counted (issue 24 goal 1): the scheduler's task steps per actor
and its rounds for a one-delta turn. A step or round saved is pinned here as a count
(never a timing); a change that adds one to every turn fails the count it moved."""

from __future__ import annotations

import collections

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from tests.support.steps import Steps, counted


async def _one_delta_turn(tmp_path) -> Steps:
    """A one-delta turn in a fresh session on SQLite, after a warm-up turn; counted from
    the session's open to its close."""
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        warm = await host.open_session(agent, session_id="warm")
        await warm.run("x")
        await warm.close()
        with counted() as steps:
            session = await host.open_session(agent, session_id="counted")
            async with session.stream("x") as out:
                texts = [c.text async for c in out if c.type == "text-delta"]
            await session.close()
        assert texts == ["hi"] and out.result is not None
        assert out.result.finish_reason == "stop"
    return steps


def _runner(steps: Steps) -> int:
    by: collections.Counter[str] = steps.by_actor()
    return by["turn-runner"]


async def test_a_turn_starts_its_first_model_call_in_the_runner_s_first_step(tmp_path):
    """From its RunTurn to its first model call the runner does not yield: the store's
    version query and the check that the turn was not cancelled before it began take no
    schedule point, nor does taking the RunTurn found in its inbox. Its steps: its start
    and the turn up to the model call, the delta, the finish (then waiting for the
    save), the turn's end and its rest (in that step: it rests as its turn ends when no
    other turn waits, issue 24 goal 1; a step of its own before)."""
    steps = await _one_delta_turn(tmp_path)
    assert _runner(steps) == 4, steps.by_actor()


async def test_a_turn_s_consumer_takes_its_result_without_a_schedule_point(tmp_path):
    """The turn's result, queued after its last batch, ends the stream without a yield
    of its own: the consumer wakes for the start, the delta, the step's end and the
    turn's end (its last batch, the result then taken at once), and no more."""
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    me = trio.lowlevel.current_task()
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="counted")
        await session.run("warm")
        stream = session.stream("x")
        await stream.__aenter__()
        with counted() as steps:
            chunks = [c.type async for c in stream]
        await stream.__aexit__(None, None, None)
    assert chunks[-1] == "finish" and stream.result is not None
    assert steps.of(me) == 4, chunks


async def test_a_turn_s_start_and_first_step_reach_the_controller_in_one_batch(tmp_path):
    """The runner sends ``TurnBegin`` and the first ``StepBegin`` in one step, so the
    controller wakes once for both, in every turn (it woke twice in about half of them
    while the runner yielded between the two): four steps a one-delta turn of a session,
    one of them for both starts, in every turn (42-43 for these eight turns before; five
    a turn before its rest joined the step of the turn's end)."""
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 9))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("warm")
        with counted() as steps:
            for _ in range(8):
                await session.run("x")
    assert steps.by_actor()["stream-controller"] == 8 * 4, steps.by_actor()


class _CountedBounds:
    """The ``trio`` module as the turn runner sees it, counting its timeouts entered."""

    def __init__(self) -> None:
        self.bounds = 0

    def __getattr__(self, name: str) -> object:
        return getattr(trio, name)

    def move_on_after(self, seconds: float, **kwargs: bool) -> trio.CancelScope:
        self.bounds += 1
        return trio.move_on_after(seconds, **kwargs)


class _CountedScopes(_CountedBounds):
    """Counting every cancel scope made: its timeouts and plain ``CancelScope`` s."""

    def CancelScope(self, **kwargs: object) -> trio.CancelScope:  # (trio's name)
        self.bounds += 1
        return trio.CancelScope(**kwargs)  # type: ignore[arg-type]


async def test_a_turn_announces_its_end_without_a_bound_when_nobody_would_wait(
    tmp_path, monkeypatch
):
    """The turn's ``TurnFinished`` goes to subscribers with room at once, so the runner
    enters no ``SAVE_TIMEOUT`` bound for it (a cancel scope: two generator context
    managers and a deadline heap push and pop, 5-8 us hot, issue 24 goal 1); the log tap
    still gets it (its ``turn.finished`` line)."""
    import actors.turn.runner as runner_module
    from runtime.events import TurnFinished

    counted_trio = _CountedBounds()
    monkeypatch.setattr(runner_module, "trio", counted_trio)
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        seen = host.bus.subscribe([TurnFinished], policy="block", capacity=4)
        session = await host.open_session(agent, session_id="s")
        await session.run("x")
        assert counted_trio.bounds == 0  # (1 before: the end's announcement)
        assert [type(e) for e in (seen.inbox.get_nowait(),)] == [TurnFinished]


async def test_a_turn_s_end_enters_one_cancel_scope_its_save_s(tmp_path, monkeypatch):
    """A turn that ends well enters one cancel scope from its end on, its final save's
    bound (shielded), where it entered two: a shield around the whole end, and the
    save's bound inside it (a scope is 5-6 us hot, issue 24 goal 1). The end is shielded
    where it waits (``tests/test_resilience_cancel.py``: a turn cut by a host's
    shutdown is still saved and answered)."""
    import actors.turn.runner as runner_module
    import actors.turn.saving as saving_module

    counted_trio = _CountedScopes()
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("warm")
        monkeypatch.setattr(runner_module, "trio", counted_trio)
        monkeypatch.setattr(saving_module, "trio", counted_trio)
        result = await session.run("x")
        monkeypatch.undo()
        assert result.finish_reason == "stop" and result.saved
        assert counted_trio.bounds == 1  # (2 before)
        record = await host.store.load("s")
        assert record is not None and record.messages[-1] == result.message


async def test_a_turn_s_end_waits_for_its_save_shielded_when_cancelled(autojump_clock):
    """A turn's runner cancelled from outside while its final save is on its way (as a
    host's nursery at shutdown cancels it) still waits for the save, and hands the
    result over: the end is shielded where it waits, not as a whole. (Fails with the
    save's bound unshielded: the result comes back unsaved.)"""
    from runtime.actor_messages import SaveRequest

    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]]))
    async with Host.open(log_tap=False) as host:
        persister = host.persister
        handle = persister.handle
        saved: list[int] = []

        async def slow_handle(message: object) -> None:
            if isinstance(message, SaveRequest):
                runner_scope.cancel()  # the runner waits for this save now
                await trio.sleep(1)  # the save takes a while
                saved.append(len(message.messages))
            await handle(message)

        persister.handle = slow_handle  # type: ignore[method-assign]
        runner_scope = trio.CancelScope()
        supervise_first = host._supervise_first

        async def in_scope(actor: object, others: list) -> None:
            with runner_scope:  # the runner's task alone, cancellable from here
                await supervise_first(actor, others)  # type: ignore[arg-type]

        host._supervise_first = in_scope  # type: ignore[method-assign]
        session = await host.open_session(agent, session_id="s")
        async with session.stream("x") as out:
            texts = [chunk.text async for chunk in out if chunk.type == "text-delta"]
        assert runner_scope.cancel_called and texts == ["hi"]
        assert out.result is not None and out.result.saved, out.result
        assert out.result.finish_reason == "stop"
        assert saved == [2]
        record = await host.store.load("s")
        assert record is not None and record.messages[-1] == out.result.message


async def test_a_turn_s_end_is_still_bounded_by_a_full_blocking_subscriber(autojump_clock):
    """A subscriber whose ``block`` inbox is full makes the announcement wait: bounded
    by ``SAVE_TIMEOUT`` as before, and then given up on; nobody got the event twice."""
    from actors.turn.runner import SAVE_TIMEOUT
    from runtime.events import TurnFinished

    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    async with Host.open(log_tap=False) as host:
        roomy = host.bus.subscribe([TurnFinished], policy="block", capacity=4)
        full = host.bus.subscribe([TurnFinished], policy="block", capacity=1)
        full.inbox.put_nowait("occupied")
        session = await host.open_session(agent, session_id="s")
        t0 = trio.current_time()
        result = await session.run("x")
        assert result.finish_reason == "stop"
        assert trio.current_time() - t0 >= SAVE_TIMEOUT
        assert len(roomy.inbox) == 1 and len(full.inbox) == 1  # the wait was cut there


async def test_a_turn_on_sqlite_asks_the_version_outside_any_bound(tmp_path, monkeypatch):
    """Before a turn the runner reads the session's version with the store's
    ``version_now`` (no await, no cancel scope) and, the session not having moved,
    enters no ``SAVE_TIMEOUT`` bound for it: the turn's only bound in ``saving`` is its
    final save's (two before, issue 24 goal 1). A session that moved is still reloaded
    (``tests/test_concurrent_writers.py``)."""
    import actors.turn.saving as saving_module

    counted_trio = _CountedBounds()
    monkeypatch.setattr(saving_module, "trio", counted_trio)
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("x")
        assert counted_trio.bounds == 1
        await session.run("y")
        assert counted_trio.bounds == 2


async def test_a_turn_handed_its_session_as_stored_enters_no_bound_to_look_at_it(
    tmp_path, monkeypatch
):
    """A turn whose caller hands the session as it just read it (``TurnStream.stored``: a
    worker's claim of a first turn hands the empty record), at the version the session
    holds, takes nothing from it and enters no ``SAVE_TIMEOUT`` bound to find that out:
    its only bound in ``saving`` is its final save's (two before, issue 24 goal 3)."""
    import actors.turn.saving as saving_module
    from runtime.store import SessionRecord

    counted_trio = _CountedBounds()
    monkeypatch.setattr(saving_module, "trio", counted_trio)
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]]))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        stream = session.stream("x")
        stream.stored = SessionRecord(session_id="s", messages=())
        async with stream as out:
            async for _ in out:
                pass
        assert out.result is not None and out.result.saved
        assert counted_trio.bounds == 1
        record = await host.store.load("s")
        assert record is not None and len(record.messages) == 2


async def test_the_log_tap_makes_the_events_waiting_together_in_one_step(tmp_path):
    """The log tap (at ``info``, no window: an embedded host's) makes the events already
    waiting behind the one it woke for in the same step: a turn's lifecycle events come
    two or three in a round (its start and first step's; its step's end and message), and
    it took a step each (six a one-delta turn, three or four now). Every line is still
    written, each before the tap waits again."""
    import io
    import json

    from runtime.logging import configure_logging

    out = io.StringIO()
    configure_logging("info", stream=out)
    try:
        agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 9))
        async with Host.open(store=str(tmp_path / "s.db")) as host:
            warm = await host.open_session(agent, session_id="warm")
            await warm.run("x")
            await warm.close()
            before = out.getvalue().count("\n")
            with counted() as steps:
                for n in range(8):
                    session = await host.open_session(agent, session_id=f"s{n}")
                    await session.run("x")
                    await session.close()
        lines = out.getvalue().splitlines()[before:]  # (the host drained its tap)
    finally:
        configure_logging("warning")
    kinds = [json.loads(line)["event"] for line in lines]
    assert kinds.count("turn.finished") == 8 and kinds.count("session.saved") == 8, kinds
    assert steps.by_actor()["log-tap"] <= 8 * 4, steps.by_actor()  # 8 * 6 before


async def test_a_session_s_engine_and_controller_take_their_first_message_as_they_start(
    tmp_path,
):
    """A session's actors rest between its turns; its engine and stream controller are
    started from the turn runner's first step, so they start with their first message
    (the model call's, the turn's start) waiting and handle it in their first step:
    four steps each a one-delta turn of a fresh session (five and six before: a step to
    start and wait, then one for the message; and the controller's rest), the engine
    three (it rests in the step that forwards its call's end, not on ``REST``)."""
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 9))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        warm = await host.open_session(agent, session_id="warm")
        await warm.run("x")
        await warm.close()
        with counted() as steps:
            for n in range(8):
                session = await host.open_session(agent, session_id=f"s{n}")
                result = await session.run("x")
                assert result.message.text == "hi"
                await session.close()
    by = steps.by_actor()
    assert (by["engine"], by["stream-controller"]) == (8 * 3, 8 * 4), by  # (8 * 4, 8 * 4)


async def test_the_runner_and_controller_rest_in_the_step_that_ends_their_turn(tmp_path):
    """When no other turn waits, the turn runner rests in the step that ends its turn,
    and the stream controller in the step that hands the result over: both rest before
    the consumer has the result, so neither wakes for ``REST`` (a step each a turn,
    issue 24 goal 1). The engine rests in the step that forwards the end of a call
    with no tool call to follow (it woke for ``REST`` before); the next turn wakes all
    three, and runs as before."""
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]], [["ho"]]]))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        engine, controller, runner = session.actors
        result = await session.run("x")
        assert (runner.resting, controller.resting, engine.resting) == (True, True, True)
        with counted() as steps:
            await trio.testing.wait_all_tasks_blocked()
        assert steps.by_actor()["engine"] == 0  # (1 before: its REST)
        again = await session.run("y")
        assert (result.message.text, again.message.text) == ("hi", "ho")
        record = await host.store.load("s")
        assert record is not None and record.messages[-1] == again.message


async def test_an_actor_handles_the_message_waiting_at_its_start_in_its_first_step():
    """The first ``get`` of an actor's task takes a waiting message without a schedule
    point of its own (the task was just scheduled); later ones keep theirs."""
    from runtime.actor import Actor

    seen: list[str] = []

    class Echo(Actor):
        async def handle(self, message: str) -> None:
            seen.append(message)

    echo = Echo(name="echo")
    echo.inbox.put_nowait("a")
    echo.inbox.put_nowait("b")
    with counted() as steps:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo.run, name="echo-run")
            await trio.testing.wait_all_tasks_blocked()
            assert seen == ["a", "b"]
            echo.stop()
    assert steps.named("echo-run") == 3  # "a" at the start; "b" after a yield; the end


async def test_a_turn_that_calls_again_after_a_call_s_end_wakes_its_engine(tmp_path):
    """The engine rests as a call ends without tool calls; a turn that calls the model
    again all the same (a structured answer sent back with its error) wakes it first:
    the second call streams and the answer is the second one, and the engine rests at
    the end (six steps for the two calls, seven before: the last for ``REST``)."""
    from pydantic import BaseModel

    class Answer(BaseModel):
        n: int

    agent = Agent(
        provider=ScriptedProvider(turns=[[['{"n": "one"}'], ['{"n": 1}']]]), output_type=Answer
    )
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        engine = session.actors[0]
        with counted() as steps:
            result = await session.run("x")
            await trio.testing.wait_all_tasks_blocked()
        assert result.finish_reason == "stop" and result.output == Answer(n=1)
        assert engine.resting and steps.by_actor()["engine"] == 6, steps.by_actor()
        record = await host.store.load("s")
        assert record is not None and record.messages[-1] == result.message
