"""What the ``provfail`` attack left (branch ``provleft``, journal
``benchmarks/journal/pipeline.md``): the usage of a call that fails mid-stream, a
provider's pause held to the limit's ``max_pause`` and to the turn's own deadline, and an
``error`` event after a whole answer. Loopback SSE through the real SDK clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from runtime import Budget, RetryPolicy
from runtime.ratelimit import MAX_PAUSE, RateLimit
from tests.support.attacks import attack_rig
from tests.support.faults import consume
from tests.support.loopback import Reply
from tests.test_provider_attacks import http_error


async def turn(r, *replies: Reply, within: float = 900) -> tuple[list, object]:
    """One streamed turn served ``replies``, failing if it takes over ``within`` s."""
    r.server.add(*replies)
    with trio.fail_after(within):
        async with r.session.stream("hi") as out:
            chunks = await consume(out)
    r.server.replies.clear()
    return chunks, out.result


# -- a provider's pause: the limit's max_pause, the turn's deadline ---------------------------


def test_a_rate_limit_holds_a_provider_pause_600_s_by_default():
    assert RateLimit().max_pause == MAX_PAUSE == 600.0


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "600", True])
def test_a_max_pause_that_is_no_finite_number_of_seconds_is_refused(bad):
    from runtime.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        RateLimit(max_pause=bad)


async def test_a_rate_limit_max_pause_caps_a_provider_pause(autojump_clock):
    policy = RetryPolicy(max_attempts=2, jitter=0)
    limit = RateLimit(requests_per_minute=100, max_pause=300)
    async with attack_rig("openai", retry=policy, provider={"rate_limit": limit}) as r:
        t0 = trio.current_time()
        slow = http_error("openai", 429, "slow down", [("retry-after", "1e9")])
        _, result = await turn(r, slow, Reply(body=r.answer("ok")))
        assert (result.finish_reason, result.text) == ("stop", "ok")
        assert trio.current_time() - t0 == pytest.approx(300, abs=0.01)


async def test_a_pause_past_the_turns_deadline_fails_the_turn_at_once_saying_so(autojump_clock):
    """A 120 s deadline facing a 600 s pause. Before: the turn waited the 120 s and
    ended ``budget``/``deadline``, empty, the 429 nowhere said (branch ``provleft``
    pinned it). Now it fails at once with the provider's 429 saying why it is not
    retried."""
    policy = RetryPolicy(max_attempts=2, jitter=0)
    limit = RateLimit(requests_per_minute=100)
    agent = {"retry": policy, "budget": Budget(deadline=120)}
    async with attack_rig("openai", provider={"rate_limit": limit}, **agent) as r:
        t0 = trio.current_time()
        slow = http_error("openai", 429, "slow down", [("retry-after", "1e9")])
        _, result = await turn(r, slow, Reply(body=r.answer("ok")))
        assert trio.current_time() - t0 == pytest.approx(0, abs=0.01)
        assert (result.finish_reason, result.error.kind) == ("error", "RateLimited")
        assert "slow down" in result.error.message
        assert "600 s wait ends past the turn's deadline, 120 s away" in result.error.message
        assert not result.error.retryable
        assert len(r.server.requests) == 1
        stored = await r.host.store.load("s")
        assert stored.messages[-1].error.kind == "RateLimited"


async def test_a_rate_limit_wait_past_the_turns_deadline_fails_the_call_at_once(autojump_clock):
    """The limiter grants nothing for 300 s (a pause an earlier call's 429 set); a turn
    with a 120 s deadline waited its 120 s for nothing. Now it fails at once."""
    limit = RateLimit(requests_per_minute=100)
    agent = {"retry": RetryPolicy(max_attempts=2, jitter=0), "budget": Budget(deadline=120)}
    async with attack_rig("openai", provider={"rate_limit": limit}, **agent) as r:
        await r.provider.limiter.pause_for(300)
        t0 = trio.current_time()
        chunks, result = await turn(r, Reply(body=r.answer("ok")))
        assert trio.current_time() - t0 == pytest.approx(0, abs=0.01)
        assert (result.finish_reason, result.error.kind) == ("error", "RateLimited")
        assert "grants no call for 300 s" in result.error.message
        assert "past the turn's deadline, 120 s away" in result.error.message
        assert "throttled" in [c.type for c in chunks]  # (the wait was said first)
        assert not r.server.requests


async def test_a_pause_within_the_turns_deadline_is_waited(autojump_clock):
    """The same 300 s pause and a 400 s deadline: the turn waits and is answered."""
    limit = RateLimit(requests_per_minute=100)
    agent = {"retry": RetryPolicy(max_attempts=2, jitter=0), "budget": Budget(deadline=400)}
    async with attack_rig("openai", provider={"rate_limit": limit}, **agent) as r:
        await r.provider.limiter.pause_for(300)
        t0 = trio.current_time()
        _, result = await turn(r, Reply(body=r.answer("ok")))
        assert trio.current_time() - t0 == pytest.approx(300, abs=0.01)
        assert (result.finish_reason, result.text) == ("stop", "ok")


# -- the usage of a call that fails mid-stream -------------------------------------------------


async def test_an_anthropic_call_failing_mid_stream_counts_the_input_message_start_billed(
    autojump_clock,
):
    """``message_start`` counted 25 input tokens, then ``overloaded_error`` after "Hel":
    the turn's usage (and so its cost and budget) said 0 though the call was billed."""
    from tests.support.faults import a_body, a_error, a_start, a_text

    async with attack_rig("anthropic") as r:
        body = a_body(a_start(25), a_text(0, "Hel", stop=False), a_error())
        chunks, result = await turn(r, Reply(body=body))
        stored = await r.host.store.load("s")
    assert result.error.kind == "Overloaded" and result.text == "Hel"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (25, 1)
    assert chunks[-1].type == "error"
    assert stored.messages[-1].usage.input_tokens == 25
    assert len(r.server.requests) == 1


async def test_a_retried_anthropic_call_counts_each_attempt_once(autojump_clock):
    """An ``overloaded_error`` right after ``message_start`` (no output: retried), then
    a whole answer: 25 + 10 input tokens, 1 + 5 output, each attempt once."""
    from tests.support.faults import a_body, a_end, a_error, a_start, a_text

    policy = RetryPolicy(max_attempts=2, jitter=0)
    async with attack_rig("anthropic", retry=policy) as r:
        failed = Reply(body=a_body(a_start(25), a_error()))
        ok = Reply(body=a_body(a_start(10), a_text(0, "ok"), a_end(output_tokens=5)))
        _, result = await turn(r, failed, ok)
    assert (result.finish_reason, result.text) == ("stop", "ok")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (35, 6)
    assert len(r.server.requests) == 2


@asynccontextmanager
async def fallback_rig(
    primary: Reply, backup: Reply, kinds: tuple[str, str] = ("anthropic", "openai")
) -> AsyncIterator[Any]:
    """``kinds[0]`` failing, then ``kinds[1]`` behind a whole Host (no retries)."""
    from runtime import Agent, FallbackProvider, Host
    from tests.support.attacks import make
    from tests.support.faults import resolve_platform
    from tests.support.loopback import loopback_server

    async with loopback_server(primary) as a, loopback_server(backup) as o:
        first, second = make(kinds[0], a.url), make(kinds[1], o.url)
        resolve_platform(first)
        resolve_platform(second)
        try:
            async with Host.open(log_tap=False) as host:
                chain = FallbackProvider([first, second])
                agent = Agent(provider=chain, retry=RetryPolicy(max_attempts=1))
                session = await host.open_session(agent, session_id="s")
                yield SimpleNamespace(
                    host=host, session=session, a=a, o=o, first=first, second=second
                )
        finally:
            with trio.CancelScope(shield=True):
                await first.aclose()
                await second.aclose()


async def test_a_fallback_after_a_failed_anthropic_call_counts_both_calls_once(autojump_clock):
    """Anthropic billed 25 input tokens and failed after "Hel"; OpenAI made the step
    again (10 in, 5 out): the turn counts 35 in, 6 out (each call priced by its own
    provider's key; a loopback server is never priced, so no cost here)."""
    from tests.support.faults import a_body, a_error, a_start, a_text, oa_text

    failed = Reply(body=a_body(a_start(25), a_text(0, "Hel", stop=False), a_error()))
    async with fallback_rig(failed, Reply(body=oa_text("ok"))) as r:
        async with r.session.stream("hi") as out:
            await consume(out)
        stored = await r.host.store.load("s")
    result = out.result
    assert (result.finish_reason, result.text) == ("stop", "ok")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (35, 6)
    assert stored.messages[-1].usage == result.usage
    assert len(r.a.requests) == len(r.o.requests) == 1


@pytest.mark.parametrize("usage", [None, (25, 3)], ids=["no-usage", "usage-on-error"])
async def test_an_openai_call_failing_mid_stream_counts_the_usage_its_error_chunk_gave(
    usage, autojump_clock
):
    """Chat Completions sends usage only at the end: an error chunk after "Hel" leaves it
    unknown (0), unless the error chunk carries it (OpenRouter does): then it counts."""
    from tests.support.faults import oa_chunk, sse

    error: dict[str, Any] = {"error": {"message": "upstream died", "code": 502}}
    if usage:
        error["usage"] = {"prompt_tokens": 25, "completion_tokens": 3, "total_tokens": 28}
    body = sse(oa_chunk({"role": "assistant", "content": "Hel"}), error)
    async with attack_rig("openai") as r:
        _, result = await turn(r, Reply(body=body))
        stored = await r.host.store.load("s")
    assert result.error is not None and result.text == "Hel"
    seen = (result.usage.input_tokens, result.usage.output_tokens)
    assert seen == (usage or (0, 0))
    assert stored.messages[-1].usage == result.usage


def responses_failed(*events: dict[str, Any], usage: dict[str, int] | None) -> bytes:
    """A Responses stream: ``response.created``, ``events``, then ``response.failed``
    (``server_error``) carrying ``usage``."""
    import json

    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-5-mini",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    failed = {
        **response,
        "status": "failed",
        "error": {"code": "server_error", "message": "boom"},
        "usage": usage,
    }
    every = [
        {"type": "response.created", "response": {**response, "status": "in_progress"}},
        *events,
        {"type": "response.failed", "response": failed},
    ]
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n"
        for i, e in enumerate(every)
    ).encode()


async def test_a_failed_responses_call_counts_the_usage_its_response_failed_gave(
    autojump_clock,
):
    """``response.failed`` after "Hel" says 25 tokens in, 3 out: the turn said 0."""
    from tests.support.attacks import responses_message

    usage = {"input_tokens": 25, "output_tokens": 3, "total_tokens": 28}
    text = responses_message(0, "msg_1", "Hel")[:-1]  # the item never done
    async with attack_rig("responses") as r:
        _, result = await turn(r, Reply(body=responses_failed(*text, usage=usage)))
        stored = await r.host.store.load("s")
    assert result.error is not None and result.text == "Hel"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (25, 3)
    assert stored.messages[-1].usage.input_tokens == 25


# -- an error event after a whole answer ------------------------------------------------------


@pytest.mark.parametrize("stop", [False, True], ids=["after-message-delta", "after-message-stop"])
async def test_an_anthropic_error_after_a_whole_answer_keeps_it_and_asks_no_fallback(
    stop, autojump_clock
):
    """``message_delta`` said ``end_turn`` (then maybe ``message_stop``), then an
    ``overloaded_error``: the answer was whole, yet the turn failed, and with a fallback
    the step was asked again (billed twice) after a ``reset-step``."""
    from tests.support.faults import a_body, a_end, a_error, a_start, a_text, oa_text

    end = a_end(output_tokens=5) if stop else a_end(output_tokens=5)[:1]
    whole = Reply(body=a_body(a_start(10), a_text(0, "ok"), end, a_error()))
    async with fallback_rig(whole, Reply(body=oa_text("again"))) as r:
        async with r.session.stream("hi") as out:
            chunks = await consume(out)
        stored = await r.host.store.load("s")
    result = out.result
    assert (result.finish_reason, result.text, result.error) == ("stop", "ok", None)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (10, 5)
    assert "reset-step" not in [c.type for c in chunks] and chunks[-1].type == "finish"
    assert len(r.a.requests) == 1 and not r.o.requests
    saved = stored.messages[-1]
    assert saved.error is None and not saved.interrupted and saved.content[0].text == "ok"


async def test_an_openai_error_chunk_after_finish_reason_stop_keeps_the_answer(autojump_clock):
    """A chunk with ``finish_reason: stop``, then an error chunk (where the usage chunk
    would be): the answer was whole, yet the turn failed and the fallback asked again."""
    from tests.support.faults import a_text_answer, oa_chunk, sse

    error = {"error": {"message": "upstream hiccup", "type": "server_error", "code": 502}}
    body = sse(oa_chunk({"role": "assistant", "content": "ok"}), oa_chunk({}, "stop"), error)
    async with fallback_rig(
        Reply(body=body), Reply(body=a_text_answer("again")), ("openai", "anthropic")
    ) as r:
        async with r.session.stream("hi") as out:
            chunks = await consume(out)
        stored = await r.host.store.load("s")
    result = out.result
    assert (result.finish_reason, result.text, result.error) == ("stop", "ok", None)
    assert "reset-step" not in [c.type for c in chunks] and chunks[-1].type == "finish"
    assert len(r.a.requests) == 1 and not r.o.requests
    saved = stored.messages[-1]
    assert saved.error is None and not saved.interrupted and saved.content[0].text == "ok"


GEMINI_ERROR = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}


@pytest.mark.parametrize("then", ["error", "cut"])
async def test_a_gemini_call_failing_mid_stream_counts_the_usage_its_chunks_gave(
    then, autojump_clock
):
    """A chunk of "Hel" said 25 tokens in, 1 out (Gemini's running totals), then an
    error object, or the body ended without a ``finishReason``: the turn said 0, where
    Anthropic's and OpenAI's failed calls count theirs (branch ``provleft``)."""
    from tests.support.attacks import gemini_chunk, gemini_sse

    hel = gemini_chunk([{"text": "Hel"}])
    hel["usageMetadata"] = {"promptTokenCount": 25, "candidatesTokenCount": 1}
    body = gemini_sse(hel, GEMINI_ERROR) if then == "error" else gemini_sse(hel)
    async with attack_rig("gemini", retry=RetryPolicy(max_attempts=1)) as r:
        _, result = await turn(r, Reply(body=body))
        stored = await r.host.store.load("s")
    assert result.error is not None and result.text == "Hel"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (25, 1)
    assert stored.messages[-1].usage == result.usage
    assert len(r.server.requests) == 1


def _stalled_after_usage(kind: str) -> Reply:
    """A body that said 25 tokens in (and "Hel") and then sends nothing."""
    from tests.support.attacks import gemini_chunk, gemini_sse
    from tests.support.faults import a_body, a_start, a_text

    if kind == "anthropic":
        first = a_body(a_start(25), a_text(0, "Hel", stop=False))
    else:
        hel = gemini_chunk([{"text": "Hel"}])
        hel["usageMetadata"] = {"promptTokenCount": 25, "candidatesTokenCount": 1}
        first = gemini_sse(hel)
    return Reply(body=first + first, stall=1e6, stall_after=len(first))


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
async def test_a_call_cut_by_its_call_timeout_counts_the_usage_it_streamed(kind, autojump_clock):
    """The stream said 25 tokens in, then stalled until the provider's ``call_timeout``
    cut it: the turn said 0 (a cancel, not a failure the parser saw), where a call that
    fails counts its usage."""
    deadlines = {"call_timeout": 30.0, "idle_timeout": None}
    async with attack_rig(kind, provider=deadlines, retry=RetryPolicy(max_attempts=1)) as r:
        _, result = await turn(r, _stalled_after_usage(kind))
        stored = await r.host.store.load("s")
    assert result.error.kind == "CallTimeout" and result.text == "Hel"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (25, 1)
    assert stored.messages[-1].usage == result.usage
