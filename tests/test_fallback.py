"""Fallback at a step boundary: ``Agent(provider=[primary, fallback, ...])``.

A call the primary fails to make (after its retries, with a failure the fallback covers)
is made again by the next provider, in the same turn and step (after a ``reset-step`` if
it had streamed output: tests/test_fallback_reset.py for the encoders); the stored
message then holds parts of both, and the next turn replays it to any provider without a
400: the loopback servers refuse what the real APIs refuse (a thinking signature not
minted for the model, encrypted reasoning sealed elsewhere, a tool call without its
result)."""

from __future__ import annotations

import json
from itertools import groupby
from typing import Any

import attrs
import pytest

from actors.providers import AnthropicProvider, OpenAIProvider, OpenAIResponsesProvider
from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from runtime import Agent, FallbackProvider, Host, RetryPolicy, tool
from runtime import events as ev
from runtime.errors import BadRequest, ConfigurationError, Overloaded, RateLimited
from runtime.messages import ReasoningPart, TextPart, ToolCallPart
from runtime.provider import FALLBACK_ON
from tests.support.faults import (
    a_body,
    a_error_reply,
    a_start,
    a_thinking,
    a_tool_use,
    check_anthropic_body,
    check_openai_body,
    oa_text,
)
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.support.signing import SealingResponses, SigningAnthropic

NO_RETRY = RetryPolicy(max_attempts=1)


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


def busy() -> Overloaded:
    return Overloaded("overloaded", provider="scripted", status_code=529)


def agent_of(*providers: ScriptedProvider, **kw: Any) -> Agent:
    return Agent(provider=list(providers), tools=[echo], retry=kw.pop("retry", NO_RETRY), **kw)


TOOL_STEP = [*tool_call("echo", {"text": "a"}, tool_call_id="c1")]


async def run(agent: Agent, *inputs: str) -> tuple[list[Any], Any, list[Any]]:
    async with Host.open(log_tap=False) as host:
        watch = host.bus.subscribe([ev.ProviderFallback])
        session = await host.open_session(agent, session_id="s")
        results = [await session.run(text) for text in inputs]
        events = []
        while True:
            try:
                events.append(watch.inbox.get_nowait())
            except Exception:
                break
        return results, session.messages, events


# -- the turn goes on ----------------------------------------------------------------------


async def test_a_call_the_primary_cannot_make_is_made_by_the_fallback_in_the_same_step():
    primary = ScriptedProvider([TOOL_STEP, [busy()]], name="primary")
    backup = ScriptedProvider([["unused"], ["done by backup"]], name="backup")
    (result,), messages, events = await run(agent_of(primary, backup), "go")
    assert result.finish_reason == "stop" and result.text == "done by backup"
    assert result.steps == 2
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert [p.step for p in messages[1].content] == [0, 1]  # one message, steps in order
    (fallback,) = events
    assert (fallback.step, fallback.from_provider, fallback.to_provider) == (
        1,
        "primary",
        "backup",
    )
    assert fallback.error.kind == "Overloaded"
    # the fallback was sent the committed step: the call and its result
    sent = backup.requests[0].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]


async def test_the_turn_stays_on_the_fallback_and_the_next_turn_starts_on_the_primary():
    primary = ScriptedProvider(turns=[[[busy()]], [["primary again"]]], name="primary")
    backup = ScriptedProvider(turns=[[TOOL_STEP, ["backup twice"]]], name="backup")
    (first, second), _, _ = await run(agent_of(primary, backup), "one", "two")
    assert first.text == "backup twice" and len(backup.requests) == 2
    assert second.text == "primary again"


async def test_retries_come_first_and_the_fallback_gets_retries_of_its_own():
    retry = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    primary = ScriptedProvider([[busy()]], name="primary")
    flaky = ScriptedProvider(turns=[[[busy()]]], name="flaky")

    calls = {"n": 0}

    def answer(request: Any) -> list[Any]:
        calls["n"] += 1
        return [busy()] if calls["n"] == 1 else ["third time"]

    last = ScriptedProvider(responder=answer, name="last")
    (result,), _, events = await run(agent_of(primary, flaky, last, retry=retry), "go")
    assert result.text == "third time"
    assert (len(primary.requests), len(flaky.requests), len(last.requests)) == (2, 2, 2)
    assert [(e.from_provider, e.to_provider) for e in events] == [
        ("primary", "flaky"),
        ("flaky", "last"),
    ]


async def test_when_the_last_provider_fails_too_the_turn_fails_with_its_error():
    primary = ScriptedProvider([[busy()]], name="primary")
    backup = ScriptedProvider([[RateLimited("slow down", provider="scripted")]], name="backup")
    (result,), messages, _ = await run(agent_of(primary, backup), "go")
    assert result.finish_reason == "error" and result.error.kind == "RateLimited"
    assert messages[1].status == "failed"


async def test_a_failure_the_fallback_does_not_cover_ends_the_turn():
    primary = ScriptedProvider([[BadRequest("bad", provider="scripted")]], name="primary")
    backup = ScriptedProvider([["never"]], name="backup")
    (result,), _, events = await run(agent_of(primary, backup), "go")
    assert result.finish_reason == "error" and result.error.kind == "BadRequest"
    assert backup.requests == type(backup.requests)() and events == []


async def test_on_names_the_failures_that_fall_back():
    primary = ScriptedProvider([[busy()]], name="primary")
    backup = ScriptedProvider([["never"]], name="backup")
    agent = Agent(provider=FallbackProvider([primary, backup], on=(RateLimited,)), retry=NO_RETRY)
    (result,), _, _ = await run(agent, "go")
    assert result.finish_reason == "error" and result.error.kind == "Overloaded"
    assert len(backup.requests) == 0


async def test_a_call_that_failed_after_streaming_output_starts_its_step_over_on_the_fallback():
    primary = ScriptedProvider([TOOL_STEP, ["Half an ", "answer", busy()]], name="primary")
    backup = ScriptedProvider([["unused"], ["A whole answer"]], name="backup")
    async with Host.open(log_tap=False) as host:
        watch = host.bus.subscribe([ev.ProviderFallback])
        session = await host.open_session(agent_of(primary, backup), session_id="s")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
        fallback = watch.inbox.get_nowait()
        messages = session.messages
    result = out.result
    assert result.finish_reason == "stop" and result.text == "A whole answer"
    types = [k for k, _ in groupby(c.type for c in chunks if getattr(c, "step", None) == 1)]
    assert types == [
        "step-start",
        "text-start",
        "text-delta",
        "text-finish",
        "reset-step",
        "text-start",
        "text-delta",
        "text-finish",
        "step-finish",
    ]
    (reset,) = [c for c in chunks if c.type == "reset-step"]
    assert (reset.step, reset.provider, reset.error.kind) == (1, "backup", "Overloaded")
    ids = [c.part_id for c in chunks if c.type == "text-start"]
    assert len(ids) == len(set(ids)) == 2  # the re-run step's part is new
    assert fallback.reset is True and fallback.step == 1
    # the stored message holds the committed step and the fallback's answer, nothing else
    assert [(type(p).__name__, p.step) for p in messages[1].content] == [
        ("ToolCallPart", 0),
        ("TextPart", 1),
    ]
    assert messages[1].text == "A whole answer"
    shown = "".join(c.text for c in chunks if c.type == "text-delta")
    assert shown == "Half an answerA whole answer"  # the consumer saw both, then the reset


async def test_a_reset_step_drops_the_tool_input_and_reasoning_the_failed_call_streamed():
    from runtime import ReasoningChunk

    primary = ScriptedProvider(
        [[ReasoningChunk(text="thinking"), *tool_call("echo", {"text": "x"})[:2], busy()]],
        name="primary",
    )
    backup = ScriptedProvider([["fine"]], name="backup")
    (result,), messages, events = await run(agent_of(primary, backup), "go")
    assert result.text == "fine" and events[0].reset
    assert [type(p).__name__ for p in messages[1].content] == ["TextPart"]


async def test_a_key_inside_the_failed_calls_error_reaches_no_reset_step_or_event():
    """The reset-step chunk and the fallback event carry the failed call's error to every
    client and log: a credential quoted in it (a proxy echoing the request) is redacted."""
    from runtime.app.web.ui_stream import UIStreamEncoder

    key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 2
    leaky = Overloaded(f"overloaded (sent Authorization: Bearer {key})", provider="scripted")
    primary = ScriptedProvider([["Half an answer", leaky]], name="primary")
    backup = ScriptedProvider([["A whole answer"]], name="backup")
    async with Host.open(log_tap=False) as host:
        watch = host.bus.subscribe([ev.ProviderFallback])
        session = await host.open_session(agent_of(primary, backup), session_id="s")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
        fallback = watch.inbox.get_nowait()
    (reset,) = [c for c in chunks if c.type == "reset-step"]
    wire = repr(UIStreamEncoder().encode(reset))
    assert "overloaded" in reset.error.message and "[redacted]" in reset.error.message
    assert key not in reset.error.message and key not in wire
    assert key not in repr(fallback)
    assert out.result.text == "A whole answer"


async def test_a_call_that_streamed_output_and_has_no_fallback_left_keeps_what_was_shown():
    primary = ScriptedProvider([["Half an answer", busy()]], name="primary")
    backup = ScriptedProvider([["Half again", busy()]], name="backup")
    (result,), messages, _ = await run(agent_of(primary, backup), "go")
    assert result.finish_reason == "error" and len(backup.requests) == 1
    assert messages[1].text == "Half again"  # what the user saw last is kept


def test_a_list_of_providers_is_a_fallback_provider_with_the_default_failures():
    a, b = ScriptedProvider(["a"]), ScriptedProvider(["b"])
    chain = Agent(provider=[a, b]).provider
    assert isinstance(chain, FallbackProvider)
    assert chain.providers == (a, b) and chain.primary is a and chain.on == FALLBACK_ON


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        ((), {}, "at least one provider"),
        (("not a provider",), {}, "takes providers"),
        ((ScriptedProvider(["a"]),), {"on": ("Overloaded",)}, "takes error classes"),
    ],
)
def test_a_malformed_fallback_provider_is_refused_when_it_is_made(args, kw, message):
    with pytest.raises(ConfigurationError, match=message):
        FallbackProvider(list(args), **kw)


# -- Anthropic overloaded at step 2, the Responses API finishes; the history replays -------


@attrs.define
class ToolAnthropic:
    """An Anthropic server with :class:`SigningAnthropic`'s rules (a thinking signature is
    valid only for the model it was minted for) that also refuses, as the API does, a
    request whose tool calls and results do not pair up. It answers by ``script``: a
    signed thought and a tool call (``"tool"``), a 529 (``"overloaded"``), or a signed
    thought and text (``"text"``)."""

    script: list[str]
    signer: SigningAnthropic = attrs.field(factory=SigningAnthropic)
    requests: list[dict[str, Any]] = attrs.field(factory=list)

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        self.requests.append(body)
        invalid = _invalid(check_anthropic_body, body)
        if invalid is not None:
            return a_error_reply(400, "invalid_request_error", invalid)
        refusal = self.signer.refusal(body, body["model"])
        if refusal is not None:
            return refusal
        what = self.script.pop(0) if self.script else "text"
        if what == "overloaded":
            return a_error_reply(529, "overloaded_error", "Overloaded")
        n, signature = self.signer.mint(body["model"])
        thought = a_thinking(0, f"thought {n}", signature=signature)
        if what == "tool":
            step = a_tool_use(1, f"toolu_{n}", "echo", json.dumps({"text": f"t{n}"}))
            end = _a_end("tool_use")
        else:
            step = [
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "text", "text": ""},
                },
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "text_delta", "text": f"claude {n}"},
                },
                {"type": "content_block_stop", "index": 1},
            ]
            end = _a_end("end_turn")
        return Reply(body=a_body(a_start(), thought, step, end))


def _a_end(stop_reason: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]


def _invalid(check: Any, body: dict[str, Any]) -> str | None:
    try:
        check(body)
    except AssertionError as exc:
        return f"invalid request: {exc}"
    return None


@attrs.define
class PairingResponses:
    """:class:`SealingResponses` (encrypted reasoning only where it was sealed) that also
    refuses, as the API does, a ``function_call`` without its ``function_call_output``
    (or an output without its call)."""

    sealer: SealingResponses
    requests: list[dict[str, Any]] = attrs.field(factory=list)

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        self.requests.append(body)
        calls = [i["call_id"] for i in body["input"] if i.get("type") == "function_call"]
        outputs = [i["call_id"] for i in body["input"] if i.get("type") == "function_call_output"]
        if sorted(calls) != sorted(outputs):
            error = {
                "message": f"No tool output found for function call ({calls} / {outputs}).",
                "type": "invalid_request_error",
                "param": "input",
                "code": None,
            }
            return Reply(
                status=400,
                content_type="application/json",
                body=json.dumps({"error": error}).encode(),
            )
        return self.sealer(request)


@attrs.define
class StrictChat:
    """A Chat Completions server that refuses an unpaired tool call or result, and an
    assistant message whose content is anything but text (another API's blocks)."""

    requests: list[dict[str, Any]] = attrs.field(factory=list)

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        self.requests.append(body)
        invalid = _invalid(check_openai_body, body)
        for message in body["messages"]:
            content = message.get("content")
            if message["role"] == "assistant" and isinstance(content, list):
                if any(part.get("type") != "text" for part in content):
                    invalid = f"invalid content part in an assistant message: {content}"
        if invalid is not None:
            error = {"message": invalid, "type": "invalid_request_error", "param": None}
            return Reply(
                status=400,
                content_type="application/json",
                body=json.dumps({"error": error, "code": None}).encode(),
            )
        return Reply(body=oa_text("chat answer"))


def claude(url: str) -> AnthropicProvider:
    return AnthropicProvider(
        "claude-sonnet-4-5",
        base_url=url,
        api_key="test",
        thinking_budget=1024,
        max_tokens=2048,
        name="claude",
    )


async def test_anthropic_overloaded_at_step_2_the_responses_api_finishes_and_all_three_replay():
    anthropic = ToolAnthropic(["tool", "tool", "overloaded", "overloaded"])
    responses = PairingResponses(SealingResponses("org-a"))
    chat = StrictChat()
    store = MemoryStore()
    retry = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    async with (
        loopback_server(respond=anthropic) as a_server,
        loopback_server(respond=responses) as r_server,
        loopback_server(respond=chat) as c_server,
    ):
        primary = claude(a_server.url)
        fallback = OpenAIResponsesProvider(
            "gpt-5", base_url=r_server.url + "/v1", api_key="test", name="responses"
        )
        chat_provider = OpenAIProvider("gpt-4o", base_url=c_server.url + "/v1", api_key="test")
        agent = Agent(provider=[primary, fallback], tools=[echo], retry=retry)
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(agent, session_id="s1")
            async with session.stream("do it") as out:
                chunks = [c async for c in out]
            result = out.result
            assert result.finish_reason == "stop", result.error
            assert result.text == "answer 1"  # the Responses server's
            assert [c.step for c in chunks if c.type == "step-start"] == [0, 1, 2]
            assert len(anthropic.requests) == 4  # two steps, then 529 twice (one retry)
            assert len(responses.requests) == 1
            await host.close_session(session)

            stored = (await store.load("s1")).messages
            assert [m.role for m in stored] == ["user", "assistant", "tool", "tool"]
            reasoning = [p for p in stored[1].content if isinstance(p, ReasoningPart)]
            assert [(p.step, p.provider, p.model) for p in reasoning] == [
                (0, "anthropic", "claude-sonnet-4-5"),
                (1, "anthropic", "claude-sonnet-4-5"),
                (2, "openai-responses", "gpt-5"),
            ]
            calls = [p for p in stored[1].content if isinstance(p, ToolCallPart)]
            texts = [p for p in stored[1].content if isinstance(p, TextPart)]
            assert [c.step for c in calls] == [0, 1] and [t.step for t in texts] == [2]

            # the next turn, on each provider in turn: no 400 anywhere
            for provider, expected in (
                (claude(a_server.url), "claude"),
                (fallback, "answer 2"),
                (chat_provider, "chat answer"),
            ):
                moved = await host.open_session(
                    Agent(provider=provider, tools=[echo], retry=NO_RETRY), session_id="s1"
                )
                again = await moved.run("and now?")
                assert again.finish_reason == "stop", (provider.name, again.error)
                assert again.text.startswith(expected)
                await host.close_session(moved)
    assert anthropic.signer.refused == [] and responses.sealer.refused == []
    # each replay sent back exactly the reasoning its own provider made
    to_claude = anthropic.requests[-1]["messages"][1]["content"]
    assert [b["type"] for b in to_claude] == ["thinking", "tool_use"]
    sealed = [i for i in responses.requests[-1]["input"] if i.get("type") == "reasoning"]
    assert [i["encrypted_content"] for i in sealed] == ["enc:org-a:1"]


async def test_the_chat_span_of_a_step_that_fell_back_names_the_fallback_and_says_why():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from actors.plugins import OpenTelemetryActor

    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    primary = ScriptedProvider([TOOL_STEP, [busy()]], model="big", name="primary")
    backup = ScriptedProvider([["unused"], ["done"]], model="small", name="backup")
    async with Host.open(log_tap=False) as host:
        await host.start_actor(OpenTelemetryActor(tracer_provider=tracing))
        session = await host.open_session(agent_of(primary, backup))
        await session.run("go")
    chats = sorted(
        (s for s in exporter.get_finished_spans() if s.name.startswith("chat")),
        key=lambda s: s.attributes["axon.step"],
    )
    assert [(c.name, c.attributes["gen_ai.request.model"]) for c in chats] == [
        ("chat big", "big"),
        ("chat small", "small"),
    ]
    (event,) = chats[1].events
    assert event.name == "axon.provider.fallback"
    assert event.attributes["axon.fallback.to"] == "backup"
    assert event.attributes["error.type"] == "Overloaded"


async def test_a_structured_answer_that_started_over_is_parsed_from_the_fallback_alone():
    import pydantic

    class City(pydantic.BaseModel):
        name: str
        population: int

    primary = ScriptedProvider([['{"name": "Atlan', busy()]], name="primary")
    backup = ScriptedProvider([['{"name": "Paris", "population": 2100000}']], name="backup")
    agent = Agent(provider=[primary, backup], output_type=City, retry=NO_RETRY)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("go") as out:
            chunks = [c async for c in out]
    assert out.result.output == City(name="Paris", population=2100000)
    kinds = [c.type for c in chunks]
    after = kinds[kinds.index("reset-step") :]
    objects = [c.value for c in chunks[len(kinds) - len(after) :] if c.type == "object-delta"]
    assert objects and all(v.get("name") != "Atlan" for v in objects)
    assert objects[-1] == {"name": "Paris", "population": 2100000}
