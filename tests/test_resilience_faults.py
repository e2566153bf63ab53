"""Provider faults end to end: real SDK clients, a fault-injecting loopback server, the
whole Host.

For each fault: what the user saw (the output chunk types), what was saved (the session
and the store), and that the next turn's request body, as the server captured it, is
valid (every tool call paired with its result, no cut thinking sent back, Anthropic
roles alternating). Time runs on the autojump clock: ``retry-after``, backoff, stalls
and server-side delays cost no real time; the loopback sockets are real.
"""

from __future__ import annotations

import json

import pytest
import trio

from runtime import Budget, RetryPolicy, tool
from runtime import events as ev
from runtime.history import INTERRUPTED
from runtime.messages import AssistantMessage, ReasoningPart, TextPart, ToolCallPart, ToolMessage
from tests.support.faults import (
    GARBAGE,
    NOT_SSE,
    PROVIDERS,
    a_body,
    a_end,
    a_error,
    a_start,
    a_text,
    a_thinking,
    a_tool_use,
    compact,
    consume,
    cut_after,
    drain,
    oa_chunk,
    oa_text,
    oa_tool_calls,
    rig,
    types_of,
)
from tests.support.grammar import check_grammar
from tests.support.loopback import Reply, sse

NO_JITTER = RetryPolicy(max_attempts=3, jitter=0)
CLEAN_TEXT_TURN = [
    "start",
    "step-start",
    "text-start",
    "text-delta",
    "text-finish",
    "step-finish",
    "finish",
]


async def stream(session, text: str = "hi") -> tuple[list, object]:
    async with session.stream(text) as out:
        chunks = await consume(out)
    return chunks, out


def only_assistant(session) -> AssistantMessage:
    msgs = session.messages
    assert [m.role for m in msgs] == ["user", "assistant"], msgs
    return msgs[1]


# -- retries --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_429_with_retry_after_is_retried_once_after_exactly_that_wait(kind, autojump_clock):
    async with rig(kind, retry=RetryPolicy(max_attempts=3)) as r:
        r.server.add(r.error_reply(429, "slow down", headers=[("retry-after", "3")]))
        r.server.add(Reply(body=r.answer("Hel", "lo")))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        t0 = trio.current_time()
        chunks, out = await stream(r.session)
        waited = trio.current_time() - t0
        published = drain(watch.inbox)
        assert compact(types_of(chunks)) == CLEAN_TEXT_TURN
        assert out.result.finish_reason == "stop" and out.result.text == "Hello"
        assert len(r.server.requests) == 2  # exactly one retry
        assert waited == pytest.approx(3.0, abs=0.01)  # retry-after honoured, no backoff on top
        assert len(published) == 1
        retry = published[0]
        assert isinstance(retry, ev.ProviderRetry) and retry.kind == "provider.retry"
        assert (retry.attempt, retry.delay, retry.step) == (1, 3.0, 0)
        assert retry.error.kind == "RateLimited" and retry.error.retryable
        assert r.server.requests[0].body == r.server.requests[1].body  # the same request again
        assert only_assistant(r.session).text == "Hello"
        assert not only_assistant(r.session).interrupted
        body = await r.next_turn()
    assert [m["role"] for m in body["messages"] if m["role"] != "system"] == [
        "user",
        "assistant",
        "user",
    ]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_http_500_twice_then_success_takes_three_attempts(kind, autojump_clock):
    async with rig(kind, retry=NO_JITTER) as r:
        r.server.add(r.error_reply(500), r.error_reply(500), Reply(body=r.answer("ok")))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        t0 = trio.current_time()
        chunks, out = await stream(r.session)
        waited = trio.current_time() - t0
        published = drain(watch.inbox)
        assert compact(types_of(chunks)) == CLEAN_TEXT_TURN
        assert out.result.finish_reason == "stop" and out.result.text == "ok"
        assert len(r.server.requests) == 3
        assert [(e.attempt, e.error.kind) for e in published] == [
            (1, "ProviderUnavailable"),
            (2, "ProviderUnavailable"),
        ]
        assert waited == pytest.approx(0.5 + 1.0, abs=0.01)  # exponential: 0.5 s, then 1 s
        await r.next_turn()
        stored = await r.host.store.load("s")
    assert [m.role for m in stored.messages] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_http_500_on_every_attempt_ends_with_an_error_chunk_and_a_usable_session(
    kind, autojump_clock
):
    async with rig(kind, retry=NO_JITTER) as r:
        r.server.add(*(r.error_reply(500) for _ in range(3)))
        chunks, out = await stream(r.session)
        assert types_of(chunks) == ["start", "step-start", "error"]
        assert chunks[-1].error.kind == "ProviderUnavailable" and chunks[-1].error.retryable
        assert out.result.finish_reason == "error" and len(r.server.requests) == 3
        assistant = only_assistant(r.session)
        assert assistant.content == () and assistant.failed
        await r.next_turn()


async def test_retry_after_is_capped_by_the_policy(autojump_clock):
    policy = RetryPolicy(max_attempts=2, retry_after_cap=2.0)
    async with rig("openai", retry=policy) as r:
        r.server.add(r.error_reply(429, headers=[("retry-after", "3600")]))
        r.server.add(Reply(body=r.answer("ok")))
        t0 = trio.current_time()
        result = await r.session.run("hi")
        assert trio.current_time() - t0 == pytest.approx(2.0, abs=0.01)
    assert result.text == "ok"


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (401, "invalid api key", "AuthenticationFailed"),
        (403, "forbidden", "AuthenticationFailed"),
        (
            400,
            "prompt is too long: 210000 tokens > 200000 maximum context length",
            "ContextTooLong",
        ),
        (400, "messages: bad field", "BadRequest"),
    ],
)
@pytest.mark.parametrize("kind", PROVIDERS)
async def test_errors_that_retrying_cannot_fix_are_classified_and_not_retried(
    kind, status, message, expected, autojump_clock
):
    async with rig(kind, retry=NO_JITTER) as r:
        reply = r.error_reply(status, message)
        r.server.add(reply)
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        chunks, out = await stream(r.session)
        assert types_of(chunks) == ["start", "step-start", "error"]
        err = chunks[-1].error
        assert (err.kind, err.retryable) == (expected, False)
        assert message.split(":")[0] in err.message
        assert out.result.error == err
        assert len(r.server.requests) == 1 and drain(watch.inbox) == []
        await r.next_turn()


async def test_openai_insufficient_quota_is_rate_limited_but_not_retried(autojump_clock):
    body = {
        "error": {
            "message": "You exceeded your current quota",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }
    }
    quota = Reply(status=429, body=json.dumps(body).encode(), content_type="application/json")
    async with rig("openai", quota, retry=NO_JITTER) as r:
        chunks, _ = await stream(r.session)
        assert (chunks[-1].error.kind, chunks[-1].error.retryable) == ("RateLimited", False)
        assert len(r.server.requests) == 1  # waiting does not refill a quota
        await r.next_turn()


async def test_anthropic_http_529_is_overloaded_and_retried(autojump_clock):
    async with rig("anthropic", retry=NO_JITTER) as r:
        r.server.add(r.error_reply(529, "Overloaded"), Reply(body=r.answer("ok")))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        result = await r.session.run("hi")
        assert result.text == "ok"
        assert [e.error.kind for e in drain(watch.inbox)] == ["Overloaded"]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_retry_in_a_later_step_resends_the_same_history(kind, autojump_clock):
    async with rig(kind, tools=[echo], retry=NO_JITTER) as r:
        r.server.add(Reply(body=echo_step(kind)), r.error_reply(500), Reply(body=r.answer("ok")))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        chunks, out = await stream(r.session)
        check_grammar(chunks)
        assert out.result.text == "ok" and out.result.steps == 2
        assert [(e.step, e.attempt) for e in drain(watch.inbox)] == [(1, 1)]
        assert r.body(1) == r.body(2)  # the retried step-1 request is the same request
        assert types_of(chunks).count("step-start") == 2  # the failed attempt left no trace
        await r.next_turn()


# -- Anthropic overloaded, before and after output -------------------------------------------


async def test_anthropic_overloaded_event_before_output_is_retried(autojump_clock):
    overloaded = a_body(a_start(), a_error("overloaded_error", "Overloaded"))
    async with rig("anthropic", retry=NO_JITTER) as r:
        r.server.add(Reply(body=overloaded), Reply(body=r.answer("ok")))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        chunks, out = await stream(r.session)
        published = drain(watch.inbox)
        assert compact(types_of(chunks)) == CLEAN_TEXT_TURN
        assert out.result.text == "ok" and len(r.server.requests) == 2
        assert [e.error.kind for e in published] == ["Overloaded"]
        await r.next_turn()


async def test_anthropic_overloaded_after_output_is_not_retried_and_keeps_the_text(
    autojump_clock,
):
    body = a_body(a_start(), a_text(0, "Partial ", "answer", stop=False), a_error())
    async with rig("anthropic", retry=NO_JITTER) as r:
        r.server.add(Reply(body=body))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        chunks, _ = await stream(r.session)
        check_grammar(chunks, ending="error")
        assert compact(types_of(chunks)) == [
            "start",
            "step-start",
            "text-start",
            "text-delta",
            "text-finish",
            "error",
        ]
        err = chunks[-1].error
        assert (err.kind, err.retryable) == ("Overloaded", True)
        assert len(r.server.requests) == 1 and drain(watch.inbox) == []  # never retried
        assistant = only_assistant(r.session)
        assert assistant.failed and assistant.text == "Partial answer"
        assert (await r.host.store.load("s")).messages[1] == assistant
        body = await r.next_turn()
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Partial answer"}],
    }


# -- dropped connections, stalls, garbage ----------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_connection_dropped_mid_text_ends_with_connection_lost_and_keeps_the_text(
    kind, autojump_clock
):
    if kind == "openai":
        full = oa_text("Hello ", "wor", "ld")
    else:
        full = a_body(a_start(), a_text(0, "Hello ", "wor", "ld"), a_end())
    async with rig(kind, retry=NO_JITTER) as r:
        r.server.add(Reply(body=full, drop_after=cut_after(full, '"wor"'), write_size=50))
        chunks, _ = await stream(r.session)
        check_grammar(chunks, ending="error")
        assert compact(types_of(chunks))[-3:] == ["text-delta", "text-finish", "error"]
        assert chunks[-1].error.kind == "ConnectionLost"
        assert len(r.server.requests) == 1  # output had started
        assistant = only_assistant(r.session)
        seen = "".join(c.text for c in chunks if c.type == "text-delta")
        assert assistant.failed and assistant.text == seen == "Hello wor"
        body = await r.next_turn()
    assert "Hello wor" in str(body["messages"])


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_stall_before_output_times_out_and_is_retried(kind, autojump_clock):
    async with rig(kind, provider={"timeout": 2.0}, retry=NO_JITTER) as r:
        r.server.add(Reply(body=r.answer("late"), stall=600), Reply(body=r.answer("ok")))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        t0 = trio.current_time()
        chunks, out = await stream(r.session)
        elapsed = trio.current_time() - t0
        assert compact(types_of(chunks)) == CLEAN_TEXT_TURN
        assert out.result.text == "ok"
        assert [e.error.kind for e in drain(watch.inbox)] == ["ProviderTimeout"]
        assert elapsed == pytest.approx(2.0 + 0.5, abs=0.01)  # read timeout, then backoff
        await r.next_turn()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_stall_after_output_started_is_a_timeout_error_not_a_retry(kind, autojump_clock):
    if kind == "openai":
        full = oa_text("Hello ", "there")
    else:
        full = a_body(a_start(), a_text(0, "Hello ", "there"), a_end())
    async with rig(kind, provider={"timeout": 2.0}, retry=NO_JITTER) as r:
        r.server.add(Reply(body=full, stall=600, stall_after=cut_after(full, '"Hello "')))
        chunks, _ = await stream(r.session)
        check_grammar(chunks, ending="error")
        assert chunks[-1].error.kind == "ProviderTimeout" and chunks[-1].error.retryable
        assert len(r.server.requests) == 1
        assert only_assistant(r.session).text == "Hello "
        assert only_assistant(r.session).failed
        await r.next_turn()


@pytest.mark.parametrize("garbage", [GARBAGE, NOT_SSE], ids=["binary", "html"])
@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_body_that_is_not_sse_is_malformed_and_retried(kind, garbage, autojump_clock):
    async with rig(kind, retry=NO_JITTER) as r:
        r.server.add(Reply(body=garbage), Reply(body=r.answer("ok")))
        watch = r.host.bus.subscribe([ev.ProviderRetry])
        chunks, out = await stream(r.session)
        assert compact(types_of(chunks)) == CLEAN_TEXT_TURN
        assert [e.error.kind for e in drain(watch.inbox)] == ["MalformedStream"]
        assert out.result.text == "ok"
        await r.next_turn()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_garbage_on_every_attempt_ends_with_a_malformed_stream_error(kind, autojump_clock):
    async with rig(kind, retry=NO_JITTER) as r:
        r.server.add(*(Reply(body=GARBAGE) for _ in range(3)))
        chunks, _ = await stream(r.session)
        assert types_of(chunks) == ["start", "step-start", "error"]
        assert chunks[-1].error.kind == "MalformedStream"
        assert len(r.server.requests) == 3
        await r.next_turn()


async def test_broken_json_in_an_openai_event_is_malformed_and_retried(autojump_clock):
    broken = b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "Hi\n\n'
    async with rig("openai", retry=NO_JITTER) as r:
        r.server.add(Reply(body=broken), Reply(body=r.answer("ok")))
        result = await r.session.run("hi")
        assert result.text == "ok" and len(r.server.requests) == 2
        await r.next_turn()


# -- thinking cut mid-block ------------------------------------------------------------------


async def test_thinking_cut_before_its_signature_is_saved_unsigned_and_never_sent_back(
    autojump_clock,
):
    full = a_body(
        a_start(),
        a_thinking(0, "Let me ", "think about", signature="SIG-OF-THE-WHOLE-BLOCK"),
        a_text(1, "Answer"),
        a_end(),
    )
    drop = cut_after(full, '"think about"')  # after the thinking deltas, before the signature
    async with rig("anthropic", provider={"thinking_budget": 1024}, retry=NO_JITTER) as r:
        r.server.add(Reply(body=full, drop_after=drop))
        chunks, _ = await stream(r.session)
        check_grammar(chunks, ending="error")
        assert compact(types_of(chunks))[-4:] == [
            "reasoning-start",
            "reasoning-delta",
            "reasoning-finish",
            "error",
        ]
        assert chunks[-1].error.kind == "ConnectionLost"
        assistant = only_assistant(r.session)
        assert assistant.failed
        (part,) = assistant.content
        assert isinstance(part, ReasoningPart)
        assert (part.text, part.signature, part.provider) == (
            "Let me think about",
            None,
            "anthropic",
        )
        body = await r.next_turn()
    sent = str(body["messages"])
    assert "thinking" not in sent and "think about" not in sent
    assert body["messages"][0]["role"] == "user" and len(body["messages"]) == 1


async def test_signed_thinking_before_a_drop_goes_back_verbatim(autojump_clock):
    full = a_body(
        a_start(),
        a_thinking(0, "Plan.", signature="SIG-1"),
        a_text(1, "Partial ", "answer"),
        a_end(),
    )
    async with rig("anthropic", provider={"thinking_budget": 1024}, retry=NO_JITTER) as r:
        r.server.add(Reply(body=full, drop_after=cut_after(full, '"Partial "')))
        chunks, _ = await stream(r.session)
        assert chunks[-1].type == "error"
        reasoning, text = only_assistant(r.session).content
        assert reasoning.signature == "SIG-1" and text.text == "Partial "
        body = await r.next_turn()
    assert body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Plan.", "signature": "SIG-1"},
        {"type": "text", "text": "Partial "},
    ]


# -- tool calls in a failed step -------------------------------------------------------------


async def test_anthropic_tool_call_streaming_when_the_stream_failed_is_not_executed(
    autojump_clock,
):
    ran: list[str] = []

    @tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        ran.append(city)
        return city

    full = a_body(
        a_start(),
        a_text(0, "Checking."),
        a_tool_use(1, "toolu_A", "lookup", '{"city": ', '"Paris"}'),
        a_tool_use(2, "toolu_B", "lookup", '{"city": ', '"Oslo"}'),
        a_end("tool_use"),
    )
    async with rig("anthropic", tools=[lookup], retry=NO_JITTER) as r:
        # A's block completed; B was streaming its input when the connection dropped
        r.server.add(Reply(body=full, drop_after=cut_after(full, "Oslo"), write_size=64))
        chunks, _ = await stream(r.session)
        check_grammar(chunks, ending="error")
        types = types_of(chunks)
        assert types.count("tool-input-start") == 2 and types.count("tool-call") == 1
        assert [c.tool_call_id for c in chunks if c.type == "tool-call"] == ["toolu_A"]
        assert "tool-result" not in types  # nothing ran; the cut call is answered as interrupted
        assert [c.error for c in chunks if c.type == "tool-error"] == [INTERRUPTED]
        assert chunks[-1].error.kind == "ConnectionLost"
        assert ran == []  # the step failed: no tool ran, not even the complete call
        msgs = r.session.messages
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]
        calls = [p for p in msgs[1].content if isinstance(p, ToolCallPart)]
        assert [c.tool_call_id for c in calls] == ["toolu_A"]  # only the completed block
        assert msgs[1].failed
        assert msgs[2].tool_call_id == "toolu_A" and msgs[2].error == INTERRUPTED
        body = await r.next_turn()
    assistant, results = body["messages"][1], body["messages"][2]
    assert [b["type"] for b in assistant["content"]] == ["text", "tool_use"]
    assert results["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_A",
        "content": INTERRUPTED,
        "is_error": True,
    }
    assert ran == []


async def test_openai_tool_call_cut_by_a_drop_is_neither_kept_nor_executed(autojump_clock):
    ran: list[str] = []

    @tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        ran.append(city)
        return city

    full = oa_tool_calls(("call_A", "lookup", ['{"city": ', '"Paris"}']), text=["Checking."])
    async with rig("openai", tools=[lookup], retry=NO_JITTER) as r:
        r.server.add(Reply(body=full, drop_after=cut_after(full, "Paris"), write_size=64))
        chunks, _ = await stream(r.session)
        check_grammar(chunks, ending="error")
        types = types_of(chunks)
        assert "tool-input-start" in types and "tool-call" not in types
        assert chunks[-1].error.kind == "ConnectionLost"
        assert ran == []
        assistant = only_assistant(r.session)
        assert [type(p) for p in assistant.content] == [TextPart] and assistant.failed
        body = await r.next_turn()
    assert body["messages"][1] == {"role": "assistant", "content": "Checking."}


async def test_openai_error_event_after_a_completed_tool_step_keeps_that_step(autojump_clock):
    @tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        return f"sunny in {city}"

    step1 = oa_tool_calls(("call_A", "lookup", ['{"city": "Paris"}']))
    failing = (
        sse(
            oa_chunk({"role": "assistant", "content": ""}),
            oa_chunk({"content": "It is"}),
            done=False,
        )
        + b'event: error\ndata: {"error": {"message": "upstream died", "type": "server_error"}}\n\n'
    )
    async with rig("openai", tools=[lookup], retry=NO_JITTER) as r:
        r.server.add(Reply(body=step1), Reply(body=failing))
        chunks, _ = await stream(r.session)
        check_grammar(chunks, ending="error")
        assert chunks[-1].error.kind == "ProviderUnavailable"
        assert "tool-result" in types_of(chunks)
        msgs = r.session.messages
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]
        assert msgs[2].output == "sunny in Paris"  # the completed step's result is kept
        assert msgs[1].failed and msgs[1].text == "It is"
        assert len(r.server.requests) == 2  # the failed step had output: not retried
        body = await r.next_turn()
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    assert body["messages"][3] == {"role": "assistant", "content": "It is"}


# -- budgets ---------------------------------------------------------------------------------


@tool
async def echo(text: str) -> str:
    """Echo the text back."""
    return text


def echo_step(kind: str, call_id: str = "call_1") -> bytes:
    if kind == "openai":
        return oa_tool_calls((call_id, "echo", ['{"text": "a"}']))
    return a_body(a_start(), a_tool_use(0, call_id, "echo", '{"text": "a"}'), a_end("tool_use"))


@pytest.mark.parametrize(
    ("name", "limit", "step_usage"),
    [
        ("max_input_tokens", 15, (20, 5)),
        ("max_output_tokens", 8, (10, 10)),
        ("max_total_tokens", 18, (10, 10)),
    ],
)
@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_token_budget_ends_the_turn_with_finish_reason_budget_naming_it(
    kind, name, limit, step_usage, autojump_clock
):
    # the tool step goes over the limit; the next turn's plain answer (10 in, 5 out) does not
    if kind == "openai":
        step = oa_tool_calls(("call_1", "echo", ['{"text": "a"}']), usage=step_usage)
    else:
        step = a_body(
            a_start(step_usage[0]),
            a_tool_use(0, "call_1", "echo", '{"text": "a"}'),
            a_end("tool_use", step_usage[1]),
        )
    async with rig(kind, tools=[echo], budget=Budget(**{name: limit})) as r:
        r.server.add(Reply(body=step))
        chunks, out = await stream(r.session)
        check_grammar(chunks, ending="finish")
        assert chunks[-1].finish_reason == "budget"
        assert out.result.finish_reason == "budget" and out.result.budget == name
        assert len(r.server.requests) == 1  # no second model call
        await r.next_turn()


async def test_a_step_over_the_token_budget_does_not_run_its_tools(autojump_clock):
    ran: list[str] = []

    @tool
    async def act(text: str) -> str:
        """Do something with side effects."""
        ran.append(text)
        return text

    body = oa_tool_calls(("call_1", "act", ['{"text": "a"}']))
    async with rig("openai", tools=[act], budget=Budget(max_total_tokens=12)) as r:
        r.server.add(Reply(body=body))
        result = await r.session.run("hi")
    assert result.finish_reason == "budget"
    assert ran == []


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_max_steps_budget_stops_before_the_next_model_call(kind, autojump_clock):
    async with rig(kind, tools=[echo], budget=Budget(max_steps=1)) as r:
        r.server.add(Reply(body=echo_step(kind)))
        chunks, out = await stream(r.session)
        check_grammar(chunks)
        assert out.result.finish_reason == "budget" and out.result.budget == "max_steps"
        assert types_of(chunks).count("step-start") == 1
        assert isinstance(r.session.messages[2], ToolMessage)  # the call got its real result
        assert r.session.messages[2].output == "a"
        await r.next_turn()


async def test_max_tool_calls_budget_refuses_extra_calls_and_stops(autojump_clock):
    body = oa_tool_calls(
        ("call_1", "echo", ['{"text": "a"}']), ("call_2", "echo", ['{"text": "b"}'])
    )
    async with rig("openai", tools=[echo], budget=Budget(max_tool_calls=1)) as r:
        r.server.add(Reply(body=body))
        chunks, out = await stream(r.session)
        check_grammar(chunks)
        assert out.result.budget == "max_tool_calls"
        results = {m.tool_call_id: m for m in r.session.messages if isinstance(m, ToolMessage)}
        assert results["call_1"].output == "a"
        assert "max_tool_calls=1" in results["call_2"].error
        await r.next_turn()


def slow_text(kind: str) -> Reply:
    """Twenty words, one event every half second: an answer of more than ten seconds."""
    words = [f"w{i} " for i in range(20)]
    if kind == "openai":
        full = oa_text(*words)
    else:
        full = a_body(a_start(), a_text(0, *words), a_end())
    return Reply(body=full, write_events=True, delay=0.5)


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_deadline_ends_a_slow_turn_with_budget_deadline(kind, autojump_clock):
    async with rig(kind, budget=Budget(deadline=5)) as r:
        r.server.add(slow_text(kind))
        t0 = trio.current_time()
        chunks, out = await stream(r.session)
        elapsed = trio.current_time() - t0
        assert elapsed == pytest.approx(5, abs=0.01)
        assert out.result.finish_reason == "budget" and out.result.budget == "deadline"
        assert chunks[-1].type == "finish" and chunks[-1].finish_reason == "budget"
        seen = "".join(c.text for c in chunks if c.type == "text-delta")
        assert seen.startswith("w0 w1 ") and "w19" not in seen
        assistant = only_assistant(r.session)
        assert assistant.text == seen and assistant.interrupted  # what was streamed is kept
        assert types_of(chunks)[-3:-1] == ["text-finish", "step-finish"]  # closed, in order
        assert (await r.host.store.load("s")).messages[1] == assistant
        await r.next_turn()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_deadline_mid_step_keeps_the_output_grammar(kind, autojump_clock):
    async with rig(kind, budget=Budget(deadline=5)) as r:
        r.server.add(slow_text(kind))
        chunks, _ = await stream(r.session)
    check_grammar(chunks, ending="finish")


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_deadline_while_a_tool_runs_interrupts_it_and_pairs_the_call(kind, autojump_clock):
    @tool
    async def slow() -> str:
        """Take forever."""
        await trio.sleep(1000)
        return "never"

    if kind == "openai":
        step = oa_tool_calls(("call_1", "slow", ["{}"]))
    else:
        step = a_body(a_start(), a_tool_use(0, "call_1", "slow", "{}"), a_end("tool_use"))
    async with rig(kind, tools=[slow], budget=Budget(deadline=5, tool_timeout=None)) as r:
        r.server.add(Reply(body=step))
        t0 = trio.current_time()
        chunks, out = await stream(r.session)
        assert trio.current_time() - t0 == pytest.approx(5, abs=0.01)
        assert out.result.finish_reason == "budget" and out.result.budget == "deadline"
        assert chunks[-1].type == "finish"
        msgs = r.session.messages
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]
        assert msgs[1].interrupted and msgs[2].error == INTERRUPTED
        await r.next_turn()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_huge_tool_output_is_truncated_with_a_visible_marker(kind, autojump_clock):
    @tool
    async def dump() -> str:
        """Return a lot of text."""
        return "x" * 5000

    if kind == "openai":
        step = oa_tool_calls(("call_1", "dump", ["{}"]))
    else:
        step = a_body(a_start(), a_tool_use(0, "call_1", "dump", "{}"), a_end("tool_use"))
    budget = Budget(max_tool_result_chars=100)
    async with rig(kind, tools=[dump], budget=budget) as r:
        r.server.add(Reply(body=step), Reply(body=r.answer("done")))
        chunks, _ = await stream(r.session)
        check_grammar(chunks)
        (result,) = [c for c in chunks if c.type == "tool-result"]
        marker = "…[truncated: 4900 of 5000 characters omitted]"
        assert result.output == "x" * 100 + marker
        assert r.session.messages[2].output == result.output
        body = r.body()  # the second step's request: the model saw the marker
        await r.next_turn()
    sent = [m for m in body["messages"] if m["role"] in ("tool", "user")]
    assert marker in str(sent)


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_tool_past_its_timeout_becomes_an_error_result_the_model_sees(kind, autojump_clock):
    @tool(timeout=2)
    async def slow() -> str:
        """Take forever."""
        await trio.sleep(1000)
        return "never"

    if kind == "openai":
        step = oa_tool_calls(("call_1", "slow", ["{}"]))
    else:
        step = a_body(a_start(), a_tool_use(0, "call_1", "slow", "{}"), a_end("tool_use"))
    async with rig(kind, tools=[slow]) as r:
        r.server.add(Reply(body=step), Reply(body=r.answer("gave up")))
        t0 = trio.current_time()
        chunks, out = await stream(r.session)
        assert trio.current_time() - t0 == pytest.approx(2, abs=0.01)
        check_grammar(chunks)
        (err,) = [c for c in chunks if c.type == "tool-error"]
        assert err.error == "tool slow timed out after 2s"
        assert out.result.text == "gave up"
        body = r.body()
        await r.next_turn()
    assert "timed out after 2s" in str(body["messages"])


async def test_budget_tool_timeout_is_the_default_per_tool_timeout(autojump_clock):
    @tool
    async def slow() -> str:
        """Take forever."""
        await trio.sleep(1000)
        return "never"

    step = oa_tool_calls(("call_1", "slow", ["{}"]))
    async with rig("openai", tools=[slow], budget=Budget(tool_timeout=3)) as r:
        r.server.add(Reply(body=step), Reply(body=r.answer("ok")))
        result = await r.session.run("hi")
    assert result.tool_messages[0].error == "tool slow timed out after 3s"


# -- bad input from a real stream -------------------------------------------------------------


async def test_invalid_json_tool_arguments_become_an_error_result_and_are_not_run(
    autojump_clock,
):
    ran: list[str] = []

    @tool
    async def get_weather(city: str) -> str:
        """Weather for a city."""
        ran.append(city)
        return "sunny"

    bad = oa_tool_calls(("call_Bad", "get_weather", ['{"city": ', "Paris}"]))
    async with rig("openai", tools=[get_weather]) as r:
        r.server.add(Reply(body=bad), Reply(body=r.answer("Sorry.")))
        chunks, out = await stream(r.session)
        check_grammar(chunks)
        (err,) = [c for c in chunks if c.type == "tool-error"]
        assert err.tool_call_id == "call_Bad" and "invalid JSON" in err.error
        assert ran == [] and out.result.text == "Sorry."
        second = r.body()
        await r.next_turn()
    assistant, result = second["messages"][1], second["messages"][2]
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"city": Paris}'
    assert result["role"] == "tool" and result["tool_call_id"] == "call_Bad"
    assert "invalid JSON" in result["content"]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_an_unknown_tool_from_the_model_is_an_error_result_naming_the_tools(
    kind, autojump_clock
):
    if kind == "openai":
        step = oa_tool_calls(("call_X", "delete_everything", ["{}"]))
    else:
        step = a_body(
            a_start(), a_tool_use(0, "call_X", "delete_everything", "{}"), a_end("tool_use")
        )
    async with rig(kind, tools=[echo]) as r:
        r.server.add(Reply(body=step), Reply(body=r.answer("ok")))
        chunks, _ = await stream(r.session)
        check_grammar(chunks)
        (err,) = [c for c in chunks if c.type == "tool-error"]
        assert err.error == "unknown tool 'delete_everything'; available tools: echo"
        r.body()
        await r.next_turn()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_tools_that_raise_or_return_unserializable_values_give_error_results(
    kind, autojump_clock
):
    @tool
    async def broken() -> str:
        """Raise."""
        raise KeyError("missing")

    @tool
    async def weird() -> object:
        """Return something that is not JSON."""
        return object()

    if kind == "openai":
        step = oa_tool_calls(("c1", "broken", ["{}"]), ("c2", "weird", ["{}"]))
    else:
        step = a_body(
            a_start(),
            a_tool_use(0, "c1", "broken", "{}"),
            a_tool_use(1, "c2", "weird", "{}"),
            a_end("tool_use"),
        )
    async with rig(kind, tools=[broken, weird]) as r:
        r.server.add(Reply(body=step), Reply(body=r.answer("ok")))
        result = await r.session.run("hi")
        assert result.finish_reason == "stop"
        errors = {m.tool_call_id: m.error for m in result.tool_messages}
        assert errors["c1"] == "tool broken raised KeyError: 'missing'"
        assert "not JSON" in errors["c2"] or "serialized" in errors["c2"]
        r.body()
        await r.next_turn()


async def test_an_invalid_session_id_is_refused_at_open_session():
    from runtime import InvalidSessionId

    async with rig("openai") as r:
        for bad in ("", "has space", "../etc/passwd", "x" * 129, "é"):
            with pytest.raises(InvalidSessionId):
                await r.host.open_session(r.agent, session_id=bad)
        assert list(r.host.sessions) == ["s"]
