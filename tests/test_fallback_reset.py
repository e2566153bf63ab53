"""Fallback after output: ``reset-step``.

Anthropic streams a signed thought and half an answer, then fails mid-stream with an
``overloaded_error``; the OpenAI Responses API makes the step again. Every consumer is
told (``reset-step``) to drop what the failed call showed; the stored message holds only
the fallback's parts of the step, and the next turn replays to all three providers. The
AI SDK stream is read by the real ``ai`` package (``readUIMessageStream``), which removes
the step's parts itself on its own ``reset-step`` chunk."""

from __future__ import annotations

import json
from itertools import groupby
from typing import Any

import attrs
import pytest

from actors.providers import OpenAIProvider, OpenAIResponsesProvider
from actors.stores import MemoryStore
from runtime import Agent, Host, RetryPolicy, tool
from runtime import output as o
from runtime.app.web.agui_wire import (
    RunEncoder,
)
from runtime.app.web.openai_wire import CompletionEncoder
from runtime.app.web.ui_stream import encode_turn
from runtime.chunks import Usage
from runtime.messages import ReasoningPart, TextPart
from tests.support.faults import a_body, a_error, a_start, a_text, a_thinking
from tests.support.grammar import check_grammar
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.support.signing import SealingResponses
from tests.test_fallback import PairingResponses, StrictChat, ToolAnthropic, claude
from tests.web.harness import ensure_ai_package, run_read_stream, web_server

RETRY = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
HALF = "Half an ans"


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


@attrs.define
class HalfwayAnthropic(ToolAnthropic):
    """:class:`ToolAnthropic`, with ``"halfway"``: a signed thought and the start of an
    answer, then an ``overloaded_error`` event in the middle of the stream."""

    def __call__(self, request: Recorded) -> Reply:
        if self.script and self.script[0] == "halfway":
            self.script.pop(0)
            body = request.json()
            self.requests.append(body)
            n, signature = self.signer.mint(body["model"])
            thought = a_thinking(0, f"thought {n}", signature=signature)
            return Reply(
                body=a_body(a_start(), thought, a_text(1, "Half ", "an ans", stop=False), a_error())
            )
        return super().__call__(request)


def responses_at(url: str) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider("gpt-5", base_url=url + "/v1", api_key="test", name="responses")


async def test_the_step_starts_over_on_the_fallback_and_only_its_parts_are_stored():
    anthropic = HalfwayAnthropic(["tool", "halfway"])
    responses = PairingResponses(SealingResponses("org-a"))
    chat = StrictChat()
    store = MemoryStore()
    async with (
        loopback_server(respond=anthropic) as a_server,
        loopback_server(respond=responses) as r_server,
        loopback_server(respond=chat) as c_server,
        Host.open(store=store, log_tap=False) as host,
    ):
        fallback = responses_at(r_server.url)
        agent = Agent(provider=[claude(a_server.url), fallback], tools=[echo], retry=RETRY)
        session = await host.open_session(agent, session_id="s1")
        async with session.stream("do it") as out:
            chunks = [c async for c in out]
        result = out.result
        assert result.finish_reason == "stop", result.error
        assert result.text == "answer 1"
        assert len(anthropic.requests) == 2  # no retry after output: straight to the fallback

        # the consumer saw the half answer, the reset, then the fallback's answer
        step1 = [k for k, _ in groupby(c.type for c in chunks if getattr(c, "step", -1) == 1)]
        assert step1 == [
            "step-start",
            "reasoning-start",
            "reasoning-delta",
            "reasoning-finish",
            "text-start",
            "text-delta",
            "text-finish",
            "reset-step",
            "reasoning-start",
            "reasoning-delta",
            "reasoning-finish",
            "text-start",
            "text-delta",
            "text-finish",
            "step-finish",
        ]
        check_grammar(chunks)
        texts = [c.text for c in chunks if c.type == "text-delta"]
        assert "".join(texts) == HALF + "answer 1"
        (reset,) = [c for c in chunks if isinstance(c, o.ResetStep)]
        assert (reset.provider, reset.error.kind) == ("responses", "Overloaded")
        part_ids = [c.part_id for c in chunks if c.type in ("text-start", "reasoning-start")]
        assert len(part_ids) == len(set(part_ids))  # the re-run's parts are new
        await host.close_session(session)

        stored = (await store.load("s1")).messages
        assert [m.role for m in stored] == ["user", "assistant", "tool"]
        assert HALF not in json.dumps([repr(p) for p in stored[1].content])
        step_parts = [(type(p).__name__, p.step) for p in stored[1].content]
        assert step_parts == [
            ("ReasoningPart", 0),
            ("ToolCallPart", 0),
            ("ReasoningPart", 1),
            ("TextPart", 1),
        ]
        reasoning = [p for p in stored[1].content if isinstance(p, ReasoningPart)]
        assert [p.provider for p in reasoning] == ["anthropic", "openai-responses"]
        assert [p.text for p in stored[1].content if isinstance(p, TextPart)] == ["answer 1"]

        # the next turn, on each provider in turn: no 400 anywhere
        for provider, expected in (
            (claude(a_server.url), "claude"),
            (fallback, "answer 2"),
            (OpenAIProvider("gpt-4o", base_url=c_server.url + "/v1", api_key="test"), "chat"),
        ):
            moved = await host.open_session(
                Agent(provider=provider, tools=[echo], retry=RETRY), session_id="s1"
            )
            again = await moved.run("and now?")
            assert again.finish_reason == "stop", (provider.name, again.error)
            assert again.text.startswith(expected)
            await host.close_session(moved)
    assert anthropic.signer.refused == [] and responses.sealer.refused == []
    # claude gets its own signed thought back, and of the step it lost only the text
    to_claude = [m["content"] for m in anthropic.requests[-1]["messages"][1:4]]
    assert [[b["type"] for b in c] for c in to_claude] == [
        ["thinking", "tool_use"],
        ["tool_result"],
        ["text"],
    ]
    assert to_claude[2][0]["text"] == "answer 1"


# -- the encoders -------------------------------------------------------------------------


def _turn() -> list[Any]:
    """A one-step turn that streamed text, was reset, and answered on the fallback."""
    from runtime.output import ErrorInfo

    err = ErrorInfo(kind="Overloaded", message="Overloaded")
    return [
        o.Start(message_id="msg_1"),
        o.StepStart(step=0),
        o.TextStart(step=0, part_id="p1"),
        o.TextDelta(step=0, part_id="p1", text=HALF),
        o.TextFinish(step=0, part_id="p1"),
        o.ToolInputStart(step=0, tool_call_id="c1", tool_name="echo"),
        o.ResetStep(step=0, provider="backup", error=err),
        o.TextStart(step=0, part_id="p2"),
        o.TextDelta(step=0, part_id="p2", text="whole"),
        o.TextFinish(step=0, part_id="p2"),
        o.StepFinish(step=0, finish_reason="stop", usage=Usage()),
        o.Finish(finish_reason="stop", usage=Usage()),
    ]


def test_the_ai_sdk_stream_carries_its_own_reset_step_and_the_reason_as_transient_data():
    ui = encode_turn(_turn())
    at = [c["type"] for c in ui].index("reset-step")
    assert ui[at + 1]["type"] == "data-reset-step" and ui[at + 1]["transient"] is True
    assert ui[at + 1]["data"]["provider"] == "backup"


def test_ag_ui_closes_the_failed_call_says_reset_and_ends_with_a_snapshot():
    from runtime.messages import AssistantMessage, UserMessage

    enc = RunEncoder("t", "r")
    events = [e for c in _turn() for e in enc.encode(c)]
    kinds = [e["type"] for e in events]
    custom = kinds.index("CUSTOM")
    assert events[custom]["name"] == "axon.reset-step"
    assert kinds[custom - 1] == "TOOL_CALL_END"  # the failed call's open tool call
    stored = [
        UserMessage(content="go"),
        AssistantMessage(id="msg_1", content=(TextPart(text="whole", step=0),)),
    ]
    ends = enc.closing(None, stored)
    assert [e["type"] for e in ends] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert ends[0]["messages"][-1]["content"] == "whole"


def test_an_openai_stream_that_showed_the_void_text_ends_with_an_error_the_completion_drops_it():
    enc = CompletionEncoder("m")
    sent = [e for c in _turn() for e in enc.chunks(c)]
    assert sent[-1]["error"]["code"] == "step_reset"
    assert all("whole" not in json.dumps(e) for e in sent)  # nothing after the error
    assert enc.completion()["choices"][0]["message"]["content"] == "whole"
    assert enc.error is None  # answered whole (no stream), the turn is a success


def test_an_openai_stream_whose_reset_step_showed_nothing_streams_on():
    enc = CompletionEncoder("m")
    turn = [c for c in _turn() if c.type not in ("text-delta",) or c.part_id == "p2"]
    sent = [e for c in turn for e in enc.chunks(c)]
    assert not any("error" in e for e in sent)
    assert (
        "".join(e["choices"][0]["delta"].get("content", "") for e in sent if e.get("choices"))
        == "whole"
    )


def test_an_a2a_task_replaces_its_answer_artifact_without_the_void_text():
    from runtime.app.web.a2a_tasks import LiveTask

    live = LiveTask("task", "ctx", "msg_1")
    for chunk in _turn():
        live.take(chunk)
    updates = [e["artifactUpdate"] for e in live.events if "artifactUpdate" in e]
    texts = [(u["artifact"]["parts"][0]["text"], u.get("append", False)) for u in updates]
    assert texts == [(HALF, False), ("", False), ("whole", False)]  # each one replaces
    assert "".join(live.text) == "whole"


async def test_the_a2a_client_drops_the_replaced_text_of_a_remote_agent():
    from actors.a2a.agent import _Nested, _Tracker

    got: list[Any] = []

    async def emit(chunk: Any) -> None:
        got.append(chunk)

    tracker = _Tracker(_Nested(emit))
    art = {"artifactId": "answer"}
    for text, append in ((HALF, False), ("", False), ("whole", True)):
        update = {"artifact": {**art, "parts": [{"text": text}]}}
        if append:
            update["append"] = True
        await tracker.take({"artifactUpdate": update})
    assert "".join(tracker.nested.text) == "whole"
    assert [c.type for c in got].count("reset-step") == 1


def test_the_terminal_says_the_step_starts_over():
    from io import StringIO

    from rich.console import Console

    from runtime.app.render import TerminalRenderer

    console = Console(file=StringIO(), width=200)
    renderer = TerminalRenderer(console)
    for chunk in _turn():
        renderer.render(chunk)
    shown = console.file.getvalue()
    assert "step 0 starts over on backup" in shown
    assert shown.index(HALF) < shown.index("starts over") < shown.index("whole")


# -- the AI SDK, read by the `ai` package -------------------------------------------------


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


async def test_the_ai_package_ends_with_one_assistant_message_without_the_void_text(node):
    anthropic = HalfwayAnthropic(["tool", "halfway"])
    responses = PairingResponses(SealingResponses("org-a"))
    async with (
        loopback_server(respond=anthropic) as a_server,
        loopback_server(respond=responses) as r_server,
    ):
        agent = Agent(
            provider=[claude(a_server.url), responses_at(r_server.url)], tools=[echo], retry=RETRY
        )
        async with web_server(agent, token="tok") as server:
            config = {
                "url": server.url,
                "token": "tok",
                "requests": [{"chatId": "s1", "text": "go"}],
            }
            (read,) = await run_read_stream(node, config)
    assert read["error"] is None, read["error"]
    assert "reset-step" in read["chunks"]
    message = read["message"]
    assert message["role"] == "assistant"
    assert HALF not in json.dumps(message)
    parts = [p["type"] for p in message["parts"]]
    assert parts == ["step-start", "reasoning", "tool-echo", "step-start", "reasoning", "text"]
    assert message["parts"][-1]["text"] == "answer 1"
    # the stored session (validateUIMessages) has the same parts
    stored = read["stored"]
    assert [p["type"] for p in stored[-1]["parts"]] == parts
    assert HALF not in json.dumps(stored)


async def test_mcp_progress_says_the_step_starts_over():
    from runtime.app.mcp_tools import Progress

    said: list[str] = []

    async def report(progress: float, message: str | None) -> None:
        said.append(message or "")

    progress = Progress(report)
    for chunk in _turn():
        await progress.chunk(chunk)
    assert said == [HALF, "[reset-step 0: the step starts over on backup]", "whole"]


def test_a_relayed_stream_passes_the_reset_on_and_forgets_the_void_parts():
    from runtime.app.web.queued_turn import RestartFilter

    keep = RestartFilter()
    out = [c for chunk in _turn() for c in keep(chunk)]
    assert [c.type for c in out] == [c.type for c in _turn()]
    assert keep._parts[0].part_id == "p2"  # only the re-run's part is the step's now


def test_a_reset_step_survives_the_relay_s_serialisation():
    from runtime import serde

    (reset,) = [c for c in _turn() if isinstance(c, o.ResetStep)]
    data = serde.unstructure(reset)
    assert data["type"] == "reset-step" and data["error"]["kind"] == "Overloaded"
    assert serde.structure(data, o.OutputChunk) == reset
