"""Cancellation at every point of a turn, against the real SDK clients through the Host.

Each test streams a slow answer from the loopback server (one SSE event per write, half
a second apart on the autojump clock), stops the turn when the consumer sees a given
chunk type, and checks: the stream ends with ``abort`` and its open parts were closed;
the saved assistant message is marked interrupted and holds exactly what was streamed
(cut reasoning unsigned); every started tool call has an ``interrupted`` result; and the
next turn on the same session succeeds with a valid request body.
"""

from __future__ import annotations

import pytest
import trio

from actors.stores import MemoryStore
from actors.turn.runner import SAVE_TIMEOUT
from runtime import tool
from runtime.history import INTERRUPTED
from runtime.messages import ReasoningPart, TextPart, ToolCallPart, ToolMessage
from tests.support.faults import (
    PROVIDERS,
    Rig,
    a_body,
    a_end,
    a_start,
    a_text,
    a_thinking,
    a_tool_use,
    check_history,
    consume,
    oa_reasoning_then_text,
    oa_text,
    oa_tool_calls,
    rig,
    types_of,
)
from tests.support.grammar import check_grammar
from tests.support.loopback import Reply

WORDS = [f"w{i} " for i in range(12)]


def slow(body: bytes) -> Reply:
    return Reply(body=body, write_events=True, delay=0.5)


def seen(chunks, kind: str) -> str:
    return "".join(c.text for c in chunks if c.type == f"{kind}-delta")


async def cancel_on(r: Rig, chunk_type: str, reason: str = "user pressed stop"):
    """Stream a turn, ``out.cancel(reason)`` at the first ``chunk_type``, read to the end."""
    with trio.fail_after(60):
        async with r.session.stream("hi") as out:
            chunks = await consume(out, stop_when=lambda c: c.type == chunk_type, reason=reason)
    check_grammar(chunks, ending="abort")
    assert chunks[-1].reason == reason
    assert out.result.finish_reason == "aborted" and out.result.abort_reason == reason
    return chunks, out


async def assert_saved_as_seen(r: Rig) -> None:
    """The store holds what the session holds, and that history is valid."""
    stored = await r.host.store.load("s")
    assert stored is not None and stored.messages == r.session.messages
    check_history(r.session.messages)


# -- during reasoning ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_during_reasoning_saves_it_unsigned_and_never_sends_it_back(
    kind, autojump_clock
):
    thoughts = ["Let ", "me ", "think ", "this ", "through ", "carefully."]
    if kind == "openai":
        body = oa_reasoning_then_text(thoughts, ["Answer."])
        options = {}
    else:
        body = a_body(
            a_start(), a_thinking(0, *thoughts, signature="SIG"), a_text(1, "Answer."), a_end()
        )
        options = {"thinking_budget": 1024}
    async with rig(kind, slow(body), provider=options) as r:
        chunks, _ = await cancel_on(r, "reasoning-delta")
        assert types_of(chunks)[-2] == "reasoning-finish"
        assert "text-start" not in types_of(chunks)
        assistant = r.session.messages[1]
        assert assistant.interrupted
        (part,) = assistant.content
        assert isinstance(part, ReasoningPart)
        assert part.text == seen(chunks, "reasoning") and part.text.startswith("Let ")
        assert part.signature is None  # cut before its signature: unsigned
        await assert_saved_as_seen(r)
        body = await r.next_turn()
    assert "Let " not in str(body["messages"])  # neither as thinking nor as text


async def test_cancel_inside_think_tags_keeps_the_reasoning_seen_and_sends_none_back(
    autojump_clock,
):
    # an OpenAI-compatible server that writes its reasoning into the text, tags cut anywhere
    body = oa_text("<thi", "nk>ponder", "ing ", "deeply</th", "ink>The ", "answer")
    async with rig("openai", slow(body)) as r:
        chunks, _ = await cancel_on(r, "reasoning-delta")
        assert "text-start" not in types_of(chunks)
        (part,) = r.session.messages[1].content
        assert isinstance(part, ReasoningPart) and part.signature is None
        assert part.text == seen(chunks, "reasoning") == "ponder"
        assert r.session.messages[1].interrupted
        body = await r.next_turn()
    assert "ponder" not in str(body["messages"]) and "<think>" not in str(body["messages"])


# -- during text -----------------------------------------------------------------------------


def text_body(kind: str) -> bytes:
    if kind == "openai":
        return oa_text(*WORDS)
    return a_body(a_start(), a_text(0, *WORDS), a_end())


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_during_text_keeps_exactly_the_text_that_was_streamed(kind, autojump_clock):
    async with rig(kind, slow(text_body(kind))) as r:
        chunks, out = await cancel_on(r, "text-delta")
        assert types_of(chunks)[-3:] == ["text-delta", "text-finish", "abort"]
        assistant = r.session.messages[1]
        shown = seen(chunks, "text")
        assert shown.startswith("w0 ") and "w11" not in shown
        assert assistant.interrupted and assistant.text == shown
        assert out.result.message == assistant
        await assert_saved_as_seen(r)
        body = await r.next_turn()
    assert shown.strip() in str(body["messages"])


@pytest.mark.parametrize("how", ["leave the block", "cancel the consumer's scope"])
@pytest.mark.parametrize("kind", PROVIDERS)
async def test_every_way_of_stopping_mid_text_aborts_and_saves(kind, how, autojump_clock):
    async with rig(kind, slow(text_body(kind))) as r:
        chunks: list = []
        with trio.CancelScope() as scope:
            async with r.session.stream("hi") as out:
                async for chunk in out:
                    chunks.append(chunk)
                    if chunk.type == "text-delta" and chunk.text == "w2 ":
                        if how == "leave the block":
                            break
                        scope.cancel()
        expected = "consumer left the stream" if how == "leave the block" else "cancelled"
        assert out.result.finish_reason == "aborted" and out.result.abort_reason == expected
        assistant = r.session.messages[1]
        assert assistant.interrupted and assistant.text.startswith(seen(chunks, "text"))
        await assert_saved_as_seen(r)
        await r.next_turn()


# -- during tool input streaming -------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_during_tool_input_keeps_no_call_and_runs_nothing(kind, autojump_clock):
    ran: list[str] = []

    @tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        ran.append(city)
        return city

    pieces = ['{"ci', 'ty": ', '"Pa', "ris", '"}']
    if kind == "openai":
        body = oa_tool_calls(("call_A", "lookup", pieces), text=["Checking."])
    else:
        body = a_body(
            a_start(),
            a_text(0, "Checking."),
            a_tool_use(1, "call_A", "lookup", *pieces),
            a_end("tool_use"),
        )
    async with rig(kind, slow(body), tools=[lookup]) as r:
        chunks, _ = await cancel_on(r, "tool-input-delta")
        types = types_of(chunks)
        assert "tool-input-start" in types and "tool-call" not in types
        assert ran == []
        assistant = r.session.messages[1]
        assert assistant.interrupted
        assert [type(p) for p in assistant.content] == [TextPart]  # the call never completed
        assert assistant.text == "Checking."
        assert not any(isinstance(m, ToolMessage) for m in r.session.messages)
        await assert_saved_as_seen(r)
        body = await r.next_turn()
    assert "call_A" not in str(body["messages"]) and ran == []


# -- while tools run -------------------------------------------------------------------------


def slow_tool(started: trio.Event, outcome: list[str]):
    @tool
    async def slow_lookup(city: str) -> str:
        """Look a city up, slowly."""
        started.set()
        try:
            await trio.sleep(1000)
        except trio.Cancelled:
            outcome.append("cancelled")
            raise
        outcome.append("finished")
        return city

    return slow_lookup


@tool
async def quick(city: str) -> str:
    """Answer at once."""
    return f"quick {city}"


def tool_step(kind: str, *calls: tuple[str, str, str]) -> bytes:
    if kind == "openai":
        return oa_tool_calls(*((i, n, [a]) for i, n, a in calls))
    blocks = [a_tool_use(k, i, n, a) for k, (i, n, a) in enumerate(calls)]
    return a_body(a_start(), *blocks, a_end("tool_use"))


async def stop_once_running(r: Rig, started: trio.Event, after: str) -> list:
    """Stream a turn; at the first ``after`` chunk wait until the slow tool runs, then
    ``out.cancel("stop")``; read to the end."""
    chunks: list = []
    with trio.fail_after(60):
        async with r.session.stream("hi") as out:
            async for chunk in out:
                chunks.append(chunk)
                if chunk.type == after and out.cancel_reason is None:
                    await started.wait()
                    out.cancel("stop")
    check_grammar(chunks, ending="abort")
    assert out.result.finish_reason == "aborted"
    return chunks


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_while_a_tool_runs_cancels_it_and_saves_an_interrupted_result(
    kind, autojump_clock
):
    started, outcome = trio.Event(), []
    body = tool_step(kind, ("call_A", "slow_lookup", '{"city": "Paris"}'))
    async with rig(kind, Reply(body=body), tools=[slow_tool(started, outcome)]) as r:
        chunks = await stop_once_running(r, started, "tool-call")
        # the cut call is answered in the stream too: the UI never shows a call without outcome
        assert types_of(chunks)[-3:] == ["tool-call", "tool-error", "abort"]
        assert chunks[-2].error == INTERRUPTED
        assert outcome == ["cancelled"]  # the running tool was cancelled, not left behind
        msgs = r.session.messages
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]
        assert msgs[1].interrupted
        assert [p.tool_call_id for p in msgs[1].content if isinstance(p, ToolCallPart)] == [
            "call_A"
        ]
        assert msgs[2].tool_call_id == "call_A" and msgs[2].error == INTERRUPTED
        await assert_saved_as_seen(r)
        body = await r.next_turn()
    if kind == "openai":
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "user"]
        assert body["messages"][2] == {
            "role": "tool",
            "tool_call_id": "call_A",
            "content": INTERRUPTED,
        }
    else:
        assert body["messages"][2]["content"] == [
            {
                "type": "tool_result",
                "tool_use_id": "call_A",
                "content": INTERRUPTED,
                "is_error": True,
            },
            {"type": "text", "text": "next"},
        ]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_while_tools_run_keeps_the_results_that_were_already_streamed(
    kind, autojump_clock
):
    started, outcome = trio.Event(), []
    body = tool_step(
        kind,
        ("call_A", "slow_lookup", '{"city": "Paris"}'),
        ("call_B", "quick", '{"city": "Oslo"}'),
    )
    async with rig(kind, Reply(body=body), tools=[slow_tool(started, outcome), quick]) as r:
        chunks = await stop_once_running(r, started, "tool-result")
        shown = [(c.tool_call_id, c.output) for c in chunks if c.type == "tool-result"]
        assert shown == [("call_B", "quick Oslo")]
        results = {m.tool_call_id: m for m in r.session.messages if isinstance(m, ToolMessage)}
        assert results["call_A"].error == INTERRUPTED
        assert (results["call_B"].output, results["call_B"].error) == ("quick Oslo", None)


# -- before any output: in a retry wait, in a stall ------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_during_a_retry_wait_aborts_at_once_without_retrying(kind, autojump_clock):
    async with rig(kind) as r:
        r.server.add(r.error_reply(429, headers=[("retry-after", "30")]))
        async with r.session.stream("hi") as out:
            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_after, out, 1.0)
                chunks = await consume(out)
            elapsed = trio.current_time() - t0
        check_grammar(chunks, ending="abort")
        assert types_of(chunks) == ["start", "step-start", "abort"]
        assert elapsed == pytest.approx(1.0, abs=0.01)
        assert len(r.server.requests) == 1  # a cancellation is never retried
        assert r.session.messages[1].interrupted and r.session.messages[1].content == ()
        await r.next_turn()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_while_the_server_stalls_aborts_promptly(kind, autojump_clock):
    async with rig(kind) as r:
        r.server.add(Reply(body=r.answer("late"), stall=500))
        async with r.session.stream("hi") as out:
            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_after, out, 2.0)
                chunks = await consume(out)
        assert trio.current_time() - t0 == pytest.approx(2.0, abs=0.01)
        assert types_of(chunks) == ["start", "step-start", "abort"]
        await r.next_turn()


async def _cancel_after(out, seconds: float) -> None:
    await trio.sleep(seconds)
    out.cancel("stop")


# -- during the persister's write -------------------------------------------------------------


class SlowStore(MemoryStore):
    """A memory store whose every save takes ``delay`` seconds (``None``: forever)."""

    def __init__(self, delay: float | None) -> None:
        super().__init__()
        self.delay = delay
        self.saving = trio.Event()
        self.started = 0
        self.done = 0

    async def save(self, session_id, start, messages, meta=None, **kwargs):
        self.started += 1
        self.saving.set()
        if self.delay is None:
            await trio.sleep_forever()
        await trio.sleep(self.delay)
        version = await super().save(session_id, start, messages, meta, **kwargs)
        self.done += 1
        return version


def two_step(kind: str) -> tuple[bytes, bytes]:
    if kind == "openai":
        return oa_tool_calls(("call_A", "echo", ['{"text": "a"}'])), oa_text(*WORDS)
    first = a_body(a_start(), a_tool_use(0, "call_A", "echo", '{"text": "a"}'), a_end("tool_use"))
    return first, a_body(a_start(), a_text(0, *WORDS), a_end())


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancelling_the_consumer_during_a_save_still_completes_every_save(
    kind, autojump_clock
):
    store = SlowStore(delay=2.0)
    first, second = two_step(kind)
    async with rig(kind, Reply(body=first), slow(second), store=store, tools=[echo]) as r:
        chunks: list = []
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as scope:

                async def cancel_when_saving() -> None:
                    await store.saving.wait()  # step 0's save is being written
                    scope.cancel()

                nursery.start_soon(cancel_when_saving)
                async with r.session.stream("hi") as out:
                    async for chunk in out:
                        chunks.append(chunk)
        left_after = trio.current_time() - t0
        assert scope.cancelled_caught
        assert out.result.finish_reason == "aborted" and out.result.abort_reason == "cancelled"
        # the consumer waited for the shielded saves: step 0's (2 s) and the final one (2 s)
        assert store.started == store.done == 2
        assert left_after == pytest.approx(4.0, abs=0.01) and left_after < SAVE_TIMEOUT
        stored = await store.load("s")
        assert stored.messages == r.session.messages
        assert [m.role for m in stored.messages] == ["user", "assistant", "tool"]
        assert stored.messages[1].interrupted and stored.messages[2].output == "a"
        r.server.replies.clear()  # step 1's reply, if the cancel came before its request
        await r.next_turn()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_save_that_hangs_does_not_hang_the_cancelled_turn(kind, autojump_clock):
    store = SlowStore(delay=None)
    async with rig(kind, slow(text_body(kind)), store=store) as r:
        t0 = trio.current_time()
        with trio.CancelScope() as scope:
            async with r.session.stream("hi") as out:
                async for chunk in out:
                    if chunk.type == "text-delta":
                        scope.cancel()
        waited = trio.current_time() - t0
        assert out.result is not None and out.result.finish_reason == "aborted"
        assert waited <= SAVE_TIMEOUT + 2  # bounded: the final save was given up on
        assert r.session.messages[1].interrupted  # the session itself still has it
        assert store.done == 0


# -- host shutdown ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_host_shutdown_mid_stream_aborts_the_turn_and_saves_it(kind, autojump_clock):
    store = MemoryStore()
    got: dict = {}

    async def consumer(session) -> None:
        async with session.stream("hi") as out:
            got["chunks"] = await consume(out)
        got["result"] = out.result

    async with trio.open_nursery() as nursery:
        async with rig(kind, slow(text_body(kind)), store=store) as r:
            nursery.start_soon(consumer, r.session)
            await trio.sleep(3)  # mid-answer
    chunks, result = got["chunks"], got["result"]
    check_grammar(chunks, ending="abort")
    assert chunks[-1].reason == "host shutdown"
    assert result.finish_reason == "aborted" and result.abort_reason == "host shutdown"
    stored = (await store.load("s")).messages
    assert stored[1].interrupted and stored[1].text == seen(chunks, "text") != ""


async def test_the_hand_over_to_a_controller_that_takes_nothing_is_bounded(autojump_clock):
    """The turn's end enters its ``SAVE_TIMEOUT`` bound only when a send would wait: a
    controller with room takes the result at once; a full one that never reads gets it
    past its capacity after the bound (the runner then hands the result to the consumer
    itself too: the first to arrive ends the stream)."""
    from types import SimpleNamespace

    from actors.turn.runner import TurnRunner
    from runtime.actor_messages import MAX_BATCH, Batcher, TurnDone
    from runtime.inbox import Inbox

    done = TurnDone(result=None)  # type: ignore[arg-type]
    roomy = SimpleNamespace(ctrl=Batcher(Inbox(4)))
    t0 = trio.current_time()
    assert await TurnRunner._to_controller(roomy, done)  # type: ignore[arg-type]
    assert trio.current_time() == t0
    full = Inbox(1)
    stuck = SimpleNamespace(ctrl=Batcher(full))
    await stuck.ctrl.send_all(list(range(MAX_BATCH)))  # a full batch fills the inbox
    assert not await TurnRunner._to_controller(stuck, done)  # type: ignore[arg-type]
    assert trio.current_time() - t0 == pytest.approx(SAVE_TIMEOUT)
    assert len(full) == 2 and len(full.get_nowait()) == MAX_BATCH  # and then the result
    assert list(full.get_nowait()) == [done]
