"""A crash of a turn's own actors mid-turn: the engine (between the provider and the
runner) and the stream controller (between the runner and the consumer) lose the batch
they were handling. The turn must still end for whoever waits on it, with a clear error
where output was lost, and what the store holds must say what happened.

Before, an engine crash left the runner waiting for the call's end for ever, and a
controller crash either left the consumer waiting for the turn's result for ever (the
lost batch held it) or streamed deltas of a part whose start was lost."""

from __future__ import annotations

import trio

from actors.engine import Engine
from actors.providers import ScriptedProvider
from actors.stream_controller import StreamController
from runtime import Agent, Host
from runtime.actor_messages import TurnDone
from tests.support.grammar import check_grammar


def crashing_on(cls: type, method: str, call: int, monkeypatch, when=None) -> None:
    """Make ``cls.method`` raise on its ``call``-th call (counted from 1), or on the
    first call whose argument ``when`` accepts."""
    original = getattr(cls, method)
    calls = {"n": 0}

    async def wrapped(self, *args, **kwargs):
        calls["n"] += 1
        if (when is None and calls["n"] == call) or (when is not None and when(*args)):
            raise TypeError("a bug in the actor")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, wrapped)


async def run(text_steps: list[list[str]]):
    agent = Agent(provider=ScriptedProvider(text_steps))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        with trio.fail_after(60):
            async with session.stream("go") as out:
                chunks = [c async for c in out]
        return session, out.result, chunks


async def test_an_engine_crash_mid_call_fails_the_turn_saying_so(monkeypatch, autojump_clock):
    # The engine's second message is the call's first batch of chunks (after BeginRequest).
    crashing_on(Engine, "handle", 2, monkeypatch)
    session, result, chunks = await run([["hello ", "world"]])
    check_grammar(chunks, ending="error")
    assert result.finish_reason == "error"
    assert result.error.kind == "ActorFailed"
    assert "the engine crashed" in result.error.message
    assert "a bug in the actor" in result.error.message
    saved = session.messages[-1]
    assert saved.role == "assistant" and saved.error == result.error


async def test_a_controller_crash_cuts_the_stream_with_an_error_and_the_result_still_comes(
    monkeypatch, autojump_clock
):
    # Its second send to the consumer: the batch with the text part's start and deltas.
    crashing_on(StreamController, "_emit", 2, monkeypatch)
    session, result, chunks = await run([["hello ", "world"]])
    check_grammar(chunks, ending="error")  # no delta or finish of a part whose start was lost
    assert "the stream controller crashed" in chunks[-1].error.message
    assert (result.text, result.finish_reason) == ("hello world", "stop")
    assert session.messages[-1].content[0].text == "hello world"  # the turn went on, saved


async def test_a_controller_crash_in_the_batch_holding_the_result_still_hands_it_over(
    monkeypatch, autojump_clock
):
    # The controller takes the batch holding the turn's TurnDone, and crashes in it.
    original = StreamController._HANDLERS[TurnDone]

    def done_then_crash(self, item, out):
        original(self, item, out)
        raise TypeError("a bug in the actor")

    monkeypatch.setitem(StreamController._HANDLERS, TurnDone, done_then_crash)
    _, result, chunks = await run([["hello"]])
    assert result is not None and result.text == "hello"
    assert chunks[-1].type == "error"
    check_grammar(chunks, ending="error")


async def test_the_next_turn_streams_whole_after_a_controller_crash(monkeypatch, autojump_clock):
    crashing_on(StreamController, "_emit", 2, monkeypatch)
    agent = Agent(provider=ScriptedProvider([["again"]]))  # each turn
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        with trio.fail_after(60):
            async with session.stream("a") as out:
                [c async for c in out]
            async with session.stream("b") as out:
                chunks = [c async for c in out]
    check_grammar(chunks)
    assert [c.text for c in chunks if c.type == "text-delta"] == ["again"]
    assert out.result.text == "again"


async def test_a_runner_crash_at_the_turns_end_streams_an_error_and_a_result(
    monkeypatch, autojump_clock, tmp_path
):
    # Past the turn's own error handling (its last save, its end): before, the stream
    # just stopped, with no terminal chunk and no result.
    from actors.turn.runner import TurnRunner

    crashing_on(TurnRunner, "_save_last", 1, monkeypatch)
    agent = Agent(provider=ScriptedProvider([["hello"]]))  # each turn
    async with Host.open(log_tap=False, store=tmp_path / "s.db") as host:
        session = await host.open_session(agent, session_id="s")
        with trio.fail_after(60):
            async with session.stream("first") as out:
                chunks = [c async for c in out]
            second = await session.run("second")
    check_grammar(chunks, ending="error")
    assert "the turn runner crashed" in chunks[-1].error.message
    assert (out.result.finish_reason, out.result.saved) == ("error", False)
    assert out.result.error.kind == "ActorFailed"
    assert second.saved and second.text == "hello"
    async with Host.open(log_tap=False, store=tmp_path / "s.db") as host:
        stored = (await host.open_session(agent, session_id="s")).messages
    assert [(m.role, getattr(m, "content", None)) for m in stored if m.role == "user"] == [
        ("user", "first"),
        ("user", "second"),
    ]  # the crashed turn's messages were written by the next turn's save
