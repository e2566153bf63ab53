"""A turn's own actor given up on mid-turn: its crash could not be handled (its
``on_crash`` raised: a bug of ours, or of a plug-in's subclass) or it crashed past its
restart policy. Giving it up must end what it was handling, as ``on_crash`` would have,
and the session's next turn must run on a fresh actor set, not fail on (or wait for)
the actor that ended.

Before, with the engine's ``on_crash`` raising, the turn's stream was still open after
60 s of virtual time; with the controller's, the turn failed with a bare
``ClosedResourceError``; and every later turn of the session failed so too."""

from __future__ import annotations

import pytest
import trio

from actors.engine import Engine
from actors.providers import ScriptedProvider
from actors.stream_controller import StreamController
from actors.turn.runner import TurnRunner
from runtime import Agent, Host
from runtime.actor import RestartPolicy
from runtime.actor_messages import Batch, BeginRequest, StreamFailed, TurnBegin
from runtime.inbox import Inbox
from tests.support.grammar import check_grammar
from tests.test_actor_crashes import crashing_on

HANG_GUARD = 60


def on_crash_raises(cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object, exc: BaseException) -> None:
        raise RuntimeError("a bug in on_crash")

    monkeypatch.setattr(cls, "on_crash", broken)


async def two_turns(store=None, policy: RestartPolicy | None = None):
    """The first turn's stream (chunks, result), then the second's, of session ``s``."""
    agent = Agent(provider=ScriptedProvider([["hello ", "world"]]))  # each turn
    turns = []
    async with Host.open(log_tap=False, store=store, restart_policy=policy) as host:
        session = await host.open_session(agent, session_id="s")
        with trio.fail_after(HANG_GUARD):
            for text in ("first", "second"):
                async with session.stream(text) as out:
                    chunks = [c async for c in out]
                turns.append((chunks, out.result))
        messages = session.messages
    return turns, messages


async def test_an_engine_given_up_mid_call_fails_the_turn_saying_so(monkeypatch, autojump_clock):
    crashing_on(Engine, "handle", 2, monkeypatch)  # the call's first batch of chunks
    on_crash_raises(Engine, monkeypatch)
    [(chunks, result), _], messages = await two_turns()
    check_grammar(chunks, ending="error")
    assert result.finish_reason == "error" and result.saved
    assert result.error.kind == "ActorFailed"
    assert "the engine crashed" in result.error.message
    first_answer = messages[1]
    assert first_answer.role == "assistant" and first_answer.error == result.error


async def test_the_next_turn_runs_on_a_fresh_engine_after_one_was_given_up(
    monkeypatch, autojump_clock
):
    crashing_on(Engine, "handle", 2, monkeypatch)
    on_crash_raises(Engine, monkeypatch)
    [_, (chunks, result)], messages = await two_turns()
    check_grammar(chunks)
    assert (result.finish_reason, result.text, result.saved) == ("stop", "hello world", True)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]


async def test_a_controller_given_up_mid_turn_ends_the_stream_with_an_error_and_a_result(
    monkeypatch, autojump_clock
):
    crashing_on(StreamController, "_emit", 2, monkeypatch)  # the text part's batch
    on_crash_raises(StreamController, monkeypatch)
    [(chunks, result), _], messages = await two_turns()
    check_grammar(chunks, ending="error")
    assert "the stream controller crashed" in chunks[-1].error.message
    assert (result.finish_reason, result.error.kind, result.saved) == ("error", "ActorFailed", True)
    assert "the stream controller was given up on" in result.error.message
    assert messages[1].error == result.error  # saved as failed


async def test_the_next_turn_streams_whole_on_a_fresh_controller_after_one_was_given_up(
    monkeypatch, autojump_clock
):
    crashing_on(StreamController, "_emit", 2, monkeypatch)
    on_crash_raises(StreamController, monkeypatch)
    [(first, _), (chunks, result)], _ = await two_turns()
    check_grammar(chunks)
    assert "".join(c.text for c in chunks if c.type == "text-delta") == "hello world"
    assert result.text == "hello world"
    assert chunks[0].seq > first[-1].seq  # seq stays session-wide and monotonic


async def test_a_runner_given_up_after_its_crash_ends_the_turn_and_the_next_runs(
    monkeypatch, autojump_clock, tmp_path
):
    crashing_on(TurnRunner, "_save_last", 1, monkeypatch)  # past the turn's own handling
    on_crash_raises(TurnRunner, monkeypatch)
    [(first, failed), (chunks, result)], _ = await two_turns(store=tmp_path / "s.db")
    check_grammar(first, ending="error")
    assert (failed.finish_reason, failed.error.kind) == ("error", "ActorFailed")
    check_grammar(chunks)
    assert (result.finish_reason, result.text, result.saved) == ("stop", "hello world", True)


async def test_a_session_past_its_restart_policy_runs_its_next_turn_on_fresh_actors(
    monkeypatch, autojump_clock
):
    # on_crash answered (the turn failed saying so); give-up adds nothing, and the
    # session goes on.
    crashing_on(Engine, "handle", 2, monkeypatch)
    [(chunks, failed), (_, result)], _ = await two_turns(policy=RestartPolicy(intensity=0))
    assert [c.type for c in chunks].count("error") == 1
    assert "the engine crashed" in failed.error.message
    assert (result.finish_reason, result.text) == ("stop", "hello world")


def test_an_engine_given_up_after_its_on_crash_answered_fails_the_call_once():
    output: Inbox = Inbox(8, "block")
    engine = Engine(output, session_id="s")
    trio.run(engine.handle, BeginRequest(request_id="r"))
    crash = TypeError("a bug")
    engine.on_crash(crash)
    engine.on_give_up(crash)
    got: list = []
    output.drain_nowait(got)
    assert [type(item) for batch in got for item in batch] == [StreamFailed]


def test_a_controller_given_up_after_its_on_crash_answered_says_so_once():
    consumer: Inbox = Inbox(8, "block")
    ctrl = StreamController(session_id="s")
    begin: Batch = Batch("t")
    begin.append(TurnBegin(turn_id="t", message_id="m", consumer=consumer))
    trio.run(ctrl.handle, begin)
    crash = TypeError("a bug")
    ctrl.on_crash(crash)
    ctrl.on_give_up(crash)
    got: list = []
    consumer.drain_nowait(got)
    chunks = [chunk for batch in got for chunk in batch]
    assert [c.type for c in chunks] == ["start", "error"]


def test_an_engine_given_up_when_its_on_crash_failed_fails_the_call():
    output: Inbox = Inbox(8, "block")
    engine = Engine(output, session_id="s")
    trio.run(engine.handle, BeginRequest(request_id="r"))
    engine.on_give_up(TypeError("a bug"))  # (its on_crash raised before answering)
    got: list = []
    output.drain_nowait(got)
    (batch,) = got
    (failure,) = batch
    assert batch.tag == "r" and "the engine crashed" in str(failure.error)


def test_a_controller_given_up_when_its_on_crash_failed_ends_the_stream_with_an_error():
    consumer: Inbox = Inbox(8, "block")
    ctrl = StreamController(session_id="s")
    begin: Batch = Batch("t")
    begin.append(TurnBegin(turn_id="t", message_id="m", consumer=consumer))
    trio.run(ctrl.handle, begin)
    ctrl.on_give_up(TypeError("a bug"))  # (its on_crash raised before answering)
    got: list = []
    consumer.drain_nowait(got)
    chunks = [chunk for batch in got for chunk in batch]
    assert [c.type for c in chunks] == ["start", "error"]
    assert "the turn ends with an error" in chunks[-1].error.message


async def test_a_turn_sent_to_a_runner_as_it_is_given_up_ends_its_stream(autojump_clock):
    # Sent while the runner's crash was being handled (its last turn's result was
    # already out): nobody would ever take it from the closed inbox.
    from runtime.actor_messages import RunTurn, TurnCancel

    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
        runner = session.runner
        consumer: Inbox = Inbox(8, "block")
        runner.inbox.put_nowait(
            RunTurn(turn_id="t", input="late", consumer=consumer, cancel=TurnCancel())
        )
        runner.on_give_up(TypeError("a bug"))
        with trio.fail_after(HANG_GUARD), pytest.raises(trio.EndOfChannel):
            await consumer.get()  # the stream ends (no result), not a wait for ever
