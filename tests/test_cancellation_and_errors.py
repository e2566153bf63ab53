"""What the user sees and what is saved when a turn is cut short."""

from __future__ import annotations

import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.stores.memory import MemoryStore
from runtime import (
    Agent,
    Host,
    Overloaded,
    RateLimited,
    ReasoningChunk,
    RetryPolicy,
    TextChunk,
    ToolMessage,
    tool,
)
from runtime.history import INTERRUPTED
from tests.support.grammar import check_grammar


@tool
async def wait_forever() -> str:
    """Never returns."""
    await trio.sleep_forever()
    return ""


async def test_leaving_the_stream_mid_text_aborts_and_saves_what_was_seen(autojump_clock):
    steps = [[TextChunk(text="Hello "), TextChunk(text="wor"), Sleep(60), TextChunk(text="ld")]]
    agent = Agent(provider=ScriptedProvider(steps))
    seen: list = []
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="c")
        async with session.stream("hi") as out:
            async for chunk in out:
                seen.append(chunk)
                if chunk.type == "text-delta" and chunk.text == "wor":
                    break
        assistant = session.messages[1]
        stored = await host.store.load("c")
    assert out.result.finish_reason == "aborted"
    assert out.result.abort_reason == "consumer left the stream"
    assert assistant.interrupted and assistant.text == "Hello wor"
    assert stored.messages[1] == assistant


async def test_cancel_with_reason_ends_the_stream_with_abort_and_closes_parts(autojump_clock):
    steps = [[ReasoningChunk(text="thinking"), Sleep(60), ReasoningChunk(text="", signature="s")]]
    agent = Agent(provider=ScriptedProvider(steps))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            chunks = []
            async for chunk in out:
                chunks.append(chunk)
                if chunk.type == "reasoning-delta":
                    out.cancel("user pressed stop")
    check_grammar(chunks, ending="abort")
    assert chunks[-1].reason == "user pressed stop"
    assert chunks[-2].type == "reasoning-finish"
    part = session.messages[1].content[0]
    assert part.text == "thinking" and part.signature is None  # cut reasoning stays unsigned


async def test_cancel_while_tools_run_gives_every_started_call_an_interrupted_result(
    autojump_clock,
):
    steps = [[*tool_call("wait_forever", {}, tool_call_id="W")], ["never"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[wait_forever])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        with trio.move_on_after(5):
            async with session.stream("go") as out:
                async for _ in out:
                    pass
        messages = session.messages
        next_turn_provider = ScriptedProvider([["fine"]])
        # the next turn on the same session works: its history is valid
        session.runner.provider = await host.provider_actor(next_turn_provider)
        result = await session.run("again")
    assert out.result.finish_reason == "aborted" and out.result.abort_reason == "cancelled"
    tool_msg = next(m for m in messages if isinstance(m, ToolMessage))
    assert tool_msg.tool_call_id == "W" and tool_msg.error == INTERRUPTED
    assert result.text == "fine"


async def test_provider_error_after_output_ends_with_error_chunk_and_keeps_the_text(autojump_clock):
    steps = [[TextChunk(text="partial answer"), Overloaded("overloaded_error", provider="x")]]
    agent = Agent(provider=ScriptedProvider(steps))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            chunks = [c async for c in out]
    check_grammar(chunks, ending="error")
    assert chunks[-1].error.kind == "Overloaded" and chunks[-1].error.retryable
    assert [c.type for c in chunks[-3:]] == ["text-delta", "text-finish", "error"]
    assistant = session.messages[1]
    assert assistant.failed and not assistant.interrupted and assistant.text == "partial answer"
    assert len(agent.provider.requests) == 1  # output had started: never retried


async def test_provider_error_before_output_is_retried_after_retry_after(autojump_clock):
    calls = {"n": 0}

    def respond(request):
        calls["n"] += 1
        if calls["n"] == 1:
            return [RateLimited("slow down", retry_after=7)]
        return ["ok"]

    agent = Agent(provider=ScriptedProvider(responder=respond), retry=RetryPolicy(max_attempts=3))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        t0 = trio.current_time()
        result = await session.run("hi")
        waited = trio.current_time() - t0
    assert result.text == "ok" and calls["n"] == 2
    assert waited == 7


async def test_retries_stop_after_max_attempts_with_a_classified_error(autojump_clock):
    agent = Agent(
        provider=ScriptedProvider([[Overloaded("busy")]]),
        retry=RetryPolicy(max_attempts=2, jitter=0),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            chunks = [c async for c in out]
    assert chunks[-1].type == "error" and chunks[-1].error.kind == "Overloaded"
    assert len(agent.provider.requests) == 2
    assert out.result.finish_reason == "error"


async def test_a_failing_hook_fails_the_turn_loudly():
    from runtime import Hooks

    async def bad_hook(event):
        raise RuntimeError("hook bug")

    agent = Agent(provider=ScriptedProvider([["x"]]), hooks=Hooks(on_step_finish=bad_hook))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            chunks = [c async for c in out]
    assert chunks[-1].type == "error"
    assert chunks[-1].error.kind == "RuntimeError" and "hook bug" in chunks[-1].error.message


async def test_host_shutdown_cancels_running_turns_and_saves_them(autojump_clock, tmp_path):
    path = str(tmp_path / "h.db")
    steps = [[TextChunk(text="working"), Sleep(1000), TextChunk(text="done")]]
    agent = Agent(provider=ScriptedProvider(steps))
    results = []

    async def consume(session):
        async with session.stream("go") as out:
            async for _ in out:
                pass
        results.append(out.result)

    async with trio.open_nursery() as nursery:
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(agent, session_id="shut")
            nursery.start_soon(consume, session)
            await trio.sleep(1)
    assert results[0].finish_reason == "aborted" and results[0].abort_reason == "host shutdown"
    async with Host.open(store=path, log_tap=False) as host:
        again = await host.open_session(agent, session_id="shut")
        assert again.messages[1].interrupted and again.messages[1].text == "working"


class _StuckStore(MemoryStore):
    """A store whose read of a session's version (with its deletion mark, as a turn of a
    session not stored reads it) outlasts the host's shutdown bound and cannot be
    cancelled, like a store call running in a worker thread."""

    def __init__(self, *, checkpoint_after: bool) -> None:
        super().__init__()
        self.checkpoint_after = checkpoint_after

    async def version(self, session_id: str) -> int:
        found = await super().version(session_id)
        await self._stuck()
        return found

    async def version_and_deletions(self, session_id: str) -> tuple[int, int]:
        found = await super().version_and_deletions(session_id)
        await self._stuck()
        return found

    async def _stuck(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(60)  # past the shutdown's 15 s: the host tears its actors down
        if self.checkpoint_after:
            await trio.lowlevel.checkpoint()  # the teardown's cancellation lands here


async def _consume_through_a_stuck_shutdown(store: MemoryStore) -> list:
    agent = Agent(provider=ScriptedProvider([["never streamed"]]))
    results = []

    async def consume(session):
        async with session.stream("go") as out:
            async for _ in out:
                pass
        results.append(out.result)

    with trio.fail_after(600):  # a consumer left waiting fails here instead of hanging
        async with trio.open_nursery() as nursery:
            async with Host.open(store=store, log_tap=False) as host:
                session = await host.open_session(agent, session_id="stuck")
                nursery.start_soon(consume, session)
                await trio.sleep(1)
    return results


async def test_a_turn_that_outlives_the_shutdown_bound_still_hands_its_result_over(
    autojump_clock,
):
    # Its stream controller is gone by the time the turn ends: the result goes straight
    # to the consumer instead of into the dead controller's inbox.
    results = await _consume_through_a_stuck_shutdown(_StuckStore(checkpoint_after=False))
    assert results[0].finish_reason == "aborted" and results[0].abort_reason == "host shutdown"


async def test_a_turn_cancelled_before_it_began_ends_its_stream_when_the_host_closes(
    autojump_clock,
):
    # The runner is cancelled before the turn exists, so no result is ever made: the host
    # ends the stream once its actors are gone, and the consumer's iteration ends.
    results = await _consume_through_a_stuck_shutdown(_StuckStore(checkpoint_after=True))
    assert results == [None]


async def test_deadline_budget_ends_the_turn_cleanly_and_marks_it_interrupted(autojump_clock):
    from runtime import Budget

    steps = [[TextChunk(text="slow "), Sleep(100), TextChunk(text="never")]]
    agent = Agent(provider=ScriptedProvider(steps), budget=Budget(deadline=5))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        t0 = trio.current_time()
        async with session.stream("hi") as out:
            chunks = [c async for c in out]
        assert trio.current_time() - t0 == 5
    assert out.result.finish_reason == "budget" and out.result.budget == "deadline"
    assert chunks[-1].type == "finish" and chunks[-1].finish_reason == "budget"
    assert chunks[-1].budget == "deadline"
    check_grammar(chunks)  # the cut step is closed: text-finish, step-finish, finish
    assert [c.type for c in chunks[-3:-1]] == ["text-finish", "step-finish"]
    assert session.messages[1].interrupted and session.messages[1].text == "slow "


async def test_token_budget_stops_before_the_next_step():
    from runtime import Budget, Usage

    steps = [[*tool_call("wait_forever", {}, tool_call_id="T")], ["never"]]
    big = Usage(input_tokens=900, output_tokens=200, total_tokens=1100)
    agent = Agent(
        provider=ScriptedProvider(steps, usage=big), tools=[], budget=Budget(max_total_tokens=1000)
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("hi")
    assert result.finish_reason == "budget" and result.budget == "max_total_tokens"
    assert result.steps == 1 and len(agent.provider.requests) == 1


async def test_a_turn_whose_deadline_has_passed_as_it_begins_makes_no_model_call():
    """A deadline already past as the turn begins (``deadline=0``) ends it on its budget
    and no request reaches the provider, though the check that a turn was not cut before
    it began no longer yields when nothing was cancelled (issue 24 goal 1)."""
    from runtime import Budget

    provider = ScriptedProvider([["never"]])
    agent = Agent(provider=provider, budget=Budget(deadline=0))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("hi")
    assert result.finish_reason == "budget" and result.budget == "deadline"
    assert list(provider.requests) == []
