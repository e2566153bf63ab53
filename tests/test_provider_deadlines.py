"""A model call that never ends does not hold its turn for ever (branch ``provdeadline``).

Every provider (OpenAI Chat Completions, which also serves the OpenAI-compatible servers,
OpenAI Responses, Anthropic, Gemini; Claude on Bedrock and Vertex) runs over its real SDK
client against the loopback server (:mod:`tests.support.loopback`), which sends headers
and then nothing, keep-alives for ever (SSE comments, blank lines, Anthropic ``ping``
events, Bedrock frames of another event type), some text and then keep-alives, or text
that never ends. Each keep-alive resets the HTTP read timeout (``timeout``), so before
these deadlines such a call held its turn for ever; what each test asserts is what the
user sees (the typed error, whether it was retried) and what is saved (what was
streamed, marked failed, as any mid-stream failure), then that the session's next turn
works.

Real sockets cannot run on the autojump clock (it jumps while a read is on its way), so
the deadlines are small and real, and no test asserts how long anything took.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from actors.providers.anthropic import AnthropicBedrockProvider
from runtime import Agent, FallbackProvider, RetryPolicy
from runtime.chunks import FinishChunk, TextChunk
from runtime.errors import CallTimeout, ConfigurationError, IdleTimeout, ProviderTimeout
from runtime.inbox import Inbox
from runtime.provider import FALLBACK_ON, StreamFailed
from tests.support.attacks import KEY, KINDS, AttackRig, attack_rig, gemini_chunk, make
from tests.support.eventstream import bedrock_stream, message
from tests.support.faults import a_text_answer, consume, oa_chunk, oa_text
from tests.support.loopback import Reply, anthropic_start, loopback_server, sse
from tests.test_provider_anthropic_platforms import BEDROCK_KEY, BEDROCK_MODEL, EVENTSTREAM, vertex
from tests.test_provider_attacks import check_saved, head

ONCE = RetryPolicy(max_attempts=1)
TWICE = RetryPolicy(max_attempts=2, initial_delay=0.01, jitter=0)
"""Two attempts, at once: whether a failure is retried shows in the server's requests."""

IDLE = 1.0
"""Seconds of idle deadline: long enough for a loaded machine to connect and read the
first event, short enough for a test."""


def deadlines(
    *, idle: float | None = IDLE, call: float | None = 30.0, read: float | None = 30.0
) -> dict[str, Any]:
    """Provider options: the deadlines under test, a read timeout that does not come
    first (``read``; ``None``: none)."""
    return {"idle_timeout": idle, "call_timeout": call, "timeout": read}


def keep_alive(kind: str, style: str) -> bytes:
    """One keep-alive of ``style`` in ``kind``'s framing."""
    sep = "\r\n" if kind == "gemini" else "\n"
    if style == "comment":
        return f": ping{sep}{sep}".encode()
    if style == "blank":
        return sep.encode()
    assert kind == "anthropic"  # Anthropic's own ping event
    return b'event: ping\ndata: {"type": "ping"}\n\n'


KEEP_ALIVES = [
    *[pytest.param(k, "comment", id=f"{k}-comment") for k in KINDS],
    *[pytest.param(k, "blank", id=f"{k}-blank") for k in KINDS],
    pytest.param("anthropic", "ping-event", id="anthropic-ping-event"),
]


def more_text(kind: str) -> bytes:
    """One more text delta ``.`` of the answer's first text part, in ``kind``'s framing."""
    if kind == "openai":
        return sse(oa_chunk({"content": "."}), done=False)
    if kind == "anthropic":
        event = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "."},
        }
        return f"event: content_block_delta\ndata: {json.dumps(event)}\n\n".encode()
    if kind == "responses":
        event = {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": ".",
            "logprobs": [],
        }
        return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
    return f"data: {json.dumps(gemini_chunk([{'text': '.'}]))}\r\n\r\n".encode()


async def turn(r: AttackRig, *replies: Reply) -> tuple[list[Any], Any]:
    """One streamed turn served ``replies``: its chunks and its result (the safety
    deadline is far above every deadline under test)."""
    r.server.add(*replies)
    with trio.fail_after(60):
        async with r.session.stream("hi") as out:
            chunks = await consume(out)
    r.server.replies.clear()
    return chunks, out.result


# -- (a) headers, then nothing ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_headers_then_nothing_with_no_read_timeout_fail_with_an_idle_timeout(kind):
    """No read timeout (``timeout=None``) and a server that sends its headers and then
    nothing: the call waited for ever; the idle deadline ends it, retried as the read
    timeout's ``ProviderTimeout`` is (nothing was streamed), then the turn fails."""
    async with attack_rig(kind, provider=deadlines(read=None), retry=TWICE) as r:
        reply = Reply(body=r.answer("Hel", "lo"), stall=1e6)
        _, result = await turn(r, reply, reply)
        assert result.finish_reason == "error"
        assert (result.error.kind, result.error.retryable) == ("IdleTimeout", True)
        assert "idle_timeout" in result.error.message
        assert len(r.server.requests) == 2  # retried once
        await check_saved(r, text="", failed=True)
        await r.next_turn()


# -- (b) keep-alives for ever, no content ----------------------------------------------------


@pytest.mark.parametrize(("kind", "style"), KEEP_ALIVES)
async def test_keep_alives_alone_fail_the_call_with_an_idle_timeout_that_is_retried(kind, style):
    """Headers, then only keep-alives: each reset the read timeout, so the call never
    ended. Now the idle deadline ends it (keep-alives are no content), and since nothing
    was streamed the call is retried, as a read timeout is."""
    async with attack_rig(kind, provider=deadlines(), retry=TWICE) as r:
        reply = Reply(body=r.answer("Hel", "lo"), stall=1e6, keep_alive=keep_alive(kind, style))
        _, result = await turn(r, reply, reply)
        assert result.finish_reason == "error"
        assert (result.error.kind, result.error.retryable) == ("IdleTimeout", True)
        assert f"streamed nothing for {IDLE:g} s" in result.error.message
        assert len(r.server.requests) == 2
        await check_saved(r, text="", failed=True)
        await r.next_turn()


# -- (c) some text, then keep-alives ---------------------------------------------------------


@pytest.mark.parametrize(("kind", "style"), KEEP_ALIVES)
async def test_text_then_keep_alives_fail_with_an_idle_timeout_and_keep_the_text(kind, style):
    """The answer's first delta, then keep-alives for ever: an ``IdleTimeout`` after the
    idle deadline, not retried (the call streamed output: a retry would stream it
    twice), the text saved and marked failed as after any mid-stream failure."""
    async with attack_rig(kind, provider=deadlines(), retry=TWICE) as r:
        body = r.answer("Hel", "lo")
        reply = Reply(
            body=body,
            stall=1e6,
            stall_after=len(head(kind, body)),
            keep_alive=keep_alive(kind, style),
        )
        _, result = await turn(r, reply, reply)
        assert (result.finish_reason, result.text) == ("error", "Hel")
        assert (result.error.kind, result.error.retryable) == ("IdleTimeout", True)
        assert len(r.server.requests) == 1  # not retried after output
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


# -- the overall deadline --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_keep_alives_do_not_extend_the_call_timeout_and_it_is_not_retried(kind):
    """No idle deadline, keep-alives for ever: the call deadline ends the call with a
    ``CallTimeout``, not retried (the call had all its time), nothing saved but the
    failed step's empty message."""
    options = deadlines(idle=None, call=1.5)
    async with attack_rig(kind, provider=options, retry=TWICE) as r:
        reply = Reply(body=r.answer("Hel", "lo"), stall=1e6, keep_alive=keep_alive(kind, "comment"))
        _, result = await turn(r, reply, reply)
        assert result.finish_reason == "error"
        assert (result.error.kind, result.error.retryable) == ("CallTimeout", False)
        assert result.error.message == "the model call did not end within 1.5 s (call_timeout)"
        assert len(r.server.requests) == 1
        await check_saved(r, text="", failed=True)
        await r.next_turn()


@pytest.mark.parametrize("kind", KINDS)
async def test_text_that_never_ends_fails_at_the_call_timeout_and_keeps_what_came(kind):
    """A delta every 50 ms for ever (no idle deadline reaches it): the call deadline ends
    it; the text streamed is saved, marked failed."""
    async with attack_rig(kind, provider=deadlines(call=2.0), retry=TWICE) as r:
        body = r.answer("Hel", "lo")
        reply = Reply(
            body=body, stall=1e6, stall_after=len(head(kind, body)), keep_alive=more_text(kind)
        )
        _, result = await turn(r, reply, reply)
        assert (result.error.kind, result.error.retryable) == ("CallTimeout", False)
        assert result.text.startswith("Hel.") and set(result.text[3:]) == {"."}
        assert len(r.server.requests) == 1
        await check_saved(r, text=result.text, failed=True)
        await r.next_turn()


async def test_a_call_timeout_falls_back_to_the_next_provider():
    """``CallTimeout`` is a ``ProviderTimeout``: a fallback chain covers it by default,
    and the turn is answered by the next provider."""
    assert issubclass(CallTimeout, FALLBACK_ON) and issubclass(IdleTimeout, FALLBACK_ON)
    from runtime import Host

    async with loopback_server() as hung, loopback_server() as fine:
        primary = make("openai", hung.url, **deadlines(idle=None, call=1.0))
        second = make("anthropic", fine.url)
        hung.add(Reply(body=b": hi\n\n", stall=1e6, keep_alive=b": ping\n\n"))
        fine.add(Reply(body=a_text_answer("ok")))
        try:
            async with Host.open(log_tap=False) as host:
                agent = Agent(provider=FallbackProvider([primary, second]), retry=ONCE)
                session = await host.open_session(agent)
                with trio.fail_after(60):
                    result = await session.run("hi")
        finally:
            await primary.aclose()
            await second.aclose()
    assert (result.finish_reason, result.text) == ("stop", "ok"), result.error


# -- (d) Chat Completions: the finish, no usage, the body kept open --------------------------


def finished_without_usage() -> bytes:
    """``Hello`` and the finish chunk, no usage chunk (a server that ignores
    ``stream_options``), no ``[DONE]``."""
    return sse(
        oa_chunk({"role": "assistant", "content": ""}),
        oa_chunk({"content": "Hel"}),
        oa_chunk({"content": "lo"}),
        oa_chunk({}, "stop"),
        done=False,
    )


@pytest.mark.parametrize("style", ["silent", "comment", "blank"])
async def test_a_finish_without_the_usage_asked_ends_the_answer_after_the_grace(style):
    """The finish chunk, then no usage and the body kept open (silent: the answer
    failed with a ``ProviderTimeout`` at the read timeout; keep-alives: it never ended):
    the answer ends whole after :data:`USAGE_GRACE`, its usage unknown (empty), saved
    as a finished answer."""
    async with attack_rig("openai", provider=deadlines(), retry=ONCE) as r:
        r.turns += 1
        body = finished_without_usage()
        ping = b"" if style == "silent" else keep_alive("openai", style)
        _, result = await turn(
            r, Reply(body=body, stall=1e6, stall_after=len(body), keep_alive=ping)
        )
        assert (result.finish_reason, result.text, result.error) == ("stop", "Hello", None)
        assert result.usage.empty  # unknown: no tokens, no cost
        await check_saved(r, text="Hello", failed=False)
        stored = (await r.host.store.load("s")).messages
        assert stored[1].usage is None or stored[1].usage.empty
        await r.next_turn()


# -- the platforms: Claude on Bedrock and Vertex --------------------------------------------


async def served(
    provider: Any, *, reply: Any = None, late: float = 0.0, within: float = 60.0
) -> list[Any]:
    """One request through the actor path (``provider.serve``), its batches read as they
    come (as the engine reads them), after ``late`` seconds: every item, in order, up to
    the finish or the failure. ``reply``: the requester's inbox (a fresh one); ``within``:
    the safety deadline."""
    from tests.support.provider_calls import make_request

    request = make_request()
    if reply is not None:
        request.reply = reply
    items: list[Any] = []

    async def read() -> None:
        await trio.sleep(late)
        async for batch in request.reply:
            batch.taken = True
            items.extend(batch)
            if isinstance(items[-1], (FinishChunk, StreamFailed)):
                return

    with trio.fail_after(within):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await provider.serve(request)
    return items


async def test_bedrock_text_then_keep_alive_frames_fail_with_an_idle_timeout():
    """Bedrock's keep-alive is a frame of another event type: each resets the read
    timeout (``test_keep_alive_frames_without_end_stream_until_the_users_cancel``); the
    idle deadline ends the call, the text streamed before it kept."""
    other = message({":event-type": "metrics", ":message-type": "event"}, b"{}")
    head_frames = bedrock_stream(
        anthropic_start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Hello"},
        },
    )
    reply = Reply(
        body=head_frames,
        content_type=EVENTSTREAM,
        stall=1e6,
        stall_after=len(head_frames),
        keep_alive=other,
    )
    async with loopback_server(reply) as server:
        provider = AnthropicBedrockProvider(
            BEDROCK_MODEL,
            base_url=server.url,
            region="us-east-1",
            api_key=BEDROCK_KEY,
            **deadlines(),
        )
        try:
            items = await served(provider)
        finally:
            await provider.aclose()
    assert "".join(getattr(c, "text", "") for c in items[:-1]) == "Hello"
    assert isinstance(items[-1], StreamFailed) and isinstance(items[-1].error, IdleTimeout)


async def test_vertex_ping_events_alone_fail_with_an_idle_timeout():
    reply = Reply(body=b"", stall=1e6, keep_alive=keep_alive("anthropic", "ping-event"))
    async with loopback_server(reply) as server:
        provider = vertex(server.url)
        provider.idle_timeout, provider.timeout = IDLE, 30.0
        try:
            items = await served(provider)
        finally:
            await provider.aclose()
    assert len(items) == 1 and isinstance(items[0], StreamFailed)
    assert isinstance(items[0].error, IdleTimeout)


# -- what the idle deadline does not count ---------------------------------------------------


async def test_a_requester_that_reads_late_is_not_idle():
    """The server sends a long answer at once; the requester's inbox takes one batch and
    it reads nothing for three idle deadlines: the provider waits to send (backpressure),
    which is not the server's silence, and the answer ends whole."""
    pieces = [f"w{i} " for i in range(400)]  # more than three batches of text chunks
    async with loopback_server(Reply(body=oa_text(*pieces))) as server:
        provider = make("openai", server.url, **deadlines(idle=0.3))
        try:
            items = await served(provider, reply=Inbox(capacity=1), late=1.0)
        finally:
            await provider.aclose()
    assert isinstance(items[-1], FinishChunk), items[-1]
    assert "".join(c.text for c in items if isinstance(c, TextChunk)) == "".join(pieces)


# -- the options -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_deadlines_are_described_and_never_sent_as_request_options(kind):
    provider = make(kind, "http://127.0.0.1:9", call_timeout=120, idle_timeout=30)
    described = provider.describe()
    assert (described["call_timeout"], described["idle_timeout"]) == (120.0, 30.0)
    assert "call_timeout" not in provider.request_options
    assert "idle_timeout" not in described["options"]
    assert KEY not in repr(described)


@pytest.mark.parametrize("kind", KINDS)
def test_the_sdk_providers_have_both_deadlines_by_default(kind):
    from runtime.provider import CALL_TIMEOUT, IDLE_TIMEOUT

    provider = make(kind, "http://127.0.0.1:9")
    assert (provider.call_timeout, provider.idle_timeout) == (CALL_TIMEOUT, IDLE_TIMEOUT)
    assert provider.timeout < IDLE_TIMEOUT < CALL_TIMEOUT  # silence: the read timeout first


@pytest.mark.parametrize("bad", [0, -1, "60", True, float("nan")])
def test_a_deadline_that_is_no_positive_number_is_a_configuration_error(bad):
    with pytest.raises(ConfigurationError, match="idle_timeout must be a number of seconds"):
        make("openai", "http://127.0.0.1:9", idle_timeout=bad)


def test_both_timeouts_are_provider_timeouts_and_only_the_idle_one_is_retried():
    assert issubclass(CallTimeout, ProviderTimeout) and issubclass(IdleTimeout, ProviderTimeout)
    assert (CallTimeout().retryable, IdleTimeout().retryable) == (False, True)


async def test_calls_at_once_share_their_providers_one_idle_watchdog(autojump_clock):
    """Each call with an idle deadline ran a watchdog task of its own, in a nursery of its
    own, cancelled at its end: ~2.8 % more instructions an Anthropic 1,000-delta turn.
    One task a provider looks at every call, and ends once none is left; the deadline
    still fires for the call that goes quiet."""
    from actors.providers.scripted import ScriptedProvider, Sleep
    from runtime import Host

    provider = ScriptedProvider(responder=lambda request: [Sleep(100), "hi"])
    provider.idle_timeout = 1000.0
    watchdogs: list[int] = []
    answers: list[str] = []

    async def ask(session: Any) -> None:
        answers.append((await session.run("hello")).text)

    def count() -> int:
        nursery = provider._nursery
        assert nursery is not None
        return sum(1 for t in nursery.child_tasks if "_look_at_idle_calls" in t.name)

    async with Host.open(log_tap=False) as host:
        sessions = [await host.open_session(Agent(provider=provider)) for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(ask, session)
            await trio.sleep(50)  # every call waits in its Sleep
            watchdogs.append(count())
        await trio.sleep(1000)  # no call left: the watchdog's next look ends it
        watchdogs.append(count())
        provider.idle_timeout = 40.0
        quiet = await sessions[0].run("again")
    assert watchdogs == [1, 0]
    assert answers == ["hi"] * 3
    assert (quiet.finish_reason, quiet.text) == ("error", "")


async def test_a_requester_that_reads_late_does_not_spend_the_call_timeout(autojump_clock):
    """The server sends a long answer at once; the requester's inbox takes one batch and
    it reads nothing for 31 minutes, past the 30-minute call deadline: the provider
    waits to send (backpressure: a UI reading slowly), which is our own consumer's time,
    not the server's, and the answer ends whole. It failed with ``CallTimeout``.

    On the autojump clock over real sockets: the loopback server writes the whole answer
    in the same loop, so every read finds its bytes already there, and the clock jumps
    only while every task waits on time (the reader's 31 minutes); the threshold keeps it
    from jumping while the connection is being made."""
    autojump_clock.autojump_threshold = 0.05
    pieces = [f"w{i} " for i in range(400)]  # more than three batches of text chunks
    async with loopback_server(Reply(body=oa_text(*pieces))) as server:
        provider = make("openai", server.url, **deadlines(idle=None, call=1800.0, read=None))
        try:
            items = await served(provider, reply=Inbox(capacity=1), late=31 * 60, within=3600)
        finally:
            await provider.aclose()
    assert isinstance(items[-1], FinishChunk), items[-1]
    assert "".join(c.text for c in items if isinstance(c, TextChunk)) == "".join(pieces)


async def test_a_call_s_deadline_is_given_to_its_scope_not_set_on_it_entered(
    autojump_clock, monkeypatch
):
    """The call deadline's cancel scope is made with its deadline: a deadline set on an
    entered scope is taken out of Trio's deadline heap and put back (~11k instructions a
    call, issue 24 goal 1). Counted: no scope's deadline set during a call that neither
    waits for room nor ends early; the deadline still ends a call that outlives it."""
    from actors.providers.scripted import ScriptedProvider, Sleep

    sets: list[float] = []
    deadline = trio.CancelScope.deadline

    def set_deadline(scope: trio.CancelScope, value: float) -> None:
        sets.append(value)
        deadline.fset(scope, value)  # type: ignore[misc]

    monkeypatch.setattr(trio.CancelScope, "deadline", property(deadline.fget, set_deadline))
    provider = ScriptedProvider(responder=lambda request: ["hi"])
    provider.call_timeout, provider.idle_timeout = 60.0, 30.0
    items = await served(provider)
    assert isinstance(items[-1], FinishChunk)
    assert sets == []
    slow = ScriptedProvider(responder=lambda request: [Sleep(100), "late"])
    slow.call_timeout = 60.0
    items = await served(slow, within=1000)
    assert isinstance(items[-1], StreamFailed)
    assert isinstance(items[-1].error, CallTimeout)
