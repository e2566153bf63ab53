"""The OpenTelemetry plug-in: bus events become GenAI-convention spans, read back from the
SDK's in-memory exporter; ``--otel`` exports over OTLP to a loopback collector."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from actors.plugins import OpenTelemetryActor
from actors.plugins import otel as otel_module
from actors.plugins.otel import build_tracer_provider
from actors.providers import OpenAIResponsesProvider
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool
from runtime.chunks import Usage
from runtime.errors import BadRequest, ConfigurationError
from runtime.events import Lagged, StepStarted, TurnStarted
from tests.support.loopback import Reply, loopback_server
from tests.support.signing import SealingResponses

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-live0123456789abcdef"


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
async def explode(why: str) -> str:
    """Always fails."""
    raise ValueError(f"cannot: {why}")


@tool
async def wait_forever() -> str:
    """Never returns."""
    await trio.sleep_forever()
    return "unreachable"


def two_step_agent() -> Agent:
    steps = [[*tool_call("add", {"a": 1, "b": 2}, tool_call_id="A")], ["3"]]
    return Agent(name="calc", provider=ScriptedProvider(steps), tools=[add, explode, wait_forever])


async def traced(agent: Agent, prompt: str = "go", **actor_options):
    """Run one turn with the actor on; returns (result, finished spans by name)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Host.open(log_tap=False) as host:
        await host.start_actor(OpenTelemetryActor(tracer_provider=provider, **actor_options))
        session = await host.open_session(agent, session_id="s1")
        result = await session.run(prompt)
    return result, exporter.get_finished_spans()


def named(spans, prefix: str):
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_two_step_turn_with_a_tool_is_one_turn_two_chat_and_one_tool_span():
    _, spans = await traced(two_step_agent())
    assert sorted(s.name for s in spans) == [
        "chat scripted",
        "chat scripted",
        "execute_tool add",
        "invoke_agent calc",
    ]
    (turn,) = named(spans, "invoke_agent")
    assert turn.parent is None
    for child in spans:
        if child is not turn:
            assert child.parent.span_id == turn.context.span_id
            assert child.context.trace_id == turn.context.trace_id


async def test_the_turn_span_usage_equals_the_turn_result_usage_and_the_chat_spans_sum_to_it():
    result, spans = await traced(two_step_agent())
    (turn,) = named(spans, "invoke_agent")
    assert turn.attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens > 0
    assert turn.attributes["gen_ai.usage.output_tokens"] == result.usage.output_tokens > 0
    chats = named(spans, "chat")
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats) == (
        result.usage.input_tokens
    )


async def test_chat_spans_carry_the_provider_model_step_and_finish_reason():
    _, spans = await traced(two_step_agent())
    chats = sorted(named(spans, "chat"), key=lambda s: s.attributes["axon.step"])
    assert [c.attributes["gen_ai.response.finish_reasons"] for c in chats] == [
        ("tool_call",),
        ("stop",),
    ]
    attrs = chats[0].attributes
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "scripted"
    assert attrs["gen_ai.request.model"] == "scripted"
    assert attrs["gen_ai.conversation.id"] == "s1"


async def test_the_responses_provider_is_named_openai_as_the_conventions_require():
    async with loopback_server(respond=SealingResponses("otel")) as server:
        provider = OpenAIResponsesProvider("gpt-5-mini", base_url=server.url, api_key="t")
        result, spans = await traced(Agent(name="calc", provider=provider))
    assert result.error is None
    for span in (*named(spans, "chat"), *named(spans, "invoke_agent")):
        assert span.attributes["gen_ai.provider.name"] == "openai"
        assert span.attributes["axon.provider"] == "openai-responses"


def test_the_new_providers_are_named_by_the_conventions_platform_values():
    from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
        GenAiProviderNameValues as Names,
    )

    from actors.plugins.otel import provider_attributes

    for registry_name, value in [
        ("google", Names.GCP_GEMINI.value),
        ("anthropic-vertex", Names.GCP_VERTEX_AI.value),
        ("anthropic-bedrock", Names.AWS_BEDROCK.value),
        ("anthropic", Names.ANTHROPIC.value),
    ]:
        attributes = provider_attributes(registry_name)
        assert attributes["gen_ai.provider.name"] == value
        assert attributes.get("axon.provider", registry_name) == registry_name


async def test_the_tool_span_names_the_tool_and_call_and_ends_before_the_next_model_call():
    _, spans = await traced(two_step_agent())
    (call,) = named(spans, "execute_tool")
    assert call.attributes["gen_ai.operation.name"] == "execute_tool"
    assert call.attributes["gen_ai.tool.name"] == "add"
    assert call.attributes["gen_ai.tool.call.id"] == "A"
    first, second = sorted(named(spans, "chat"), key=lambda s: s.attributes["axon.step"])
    assert first.end_time <= call.start_time <= call.end_time <= second.start_time


async def test_a_failing_tool_span_is_an_error_with_the_exception_as_error_type():
    steps = [[*tool_call("explode", {"why": "no"}, tool_call_id="X")], ["sorry"]]
    agent = Agent(name="calc", provider=ScriptedProvider(steps), tools=[explode])
    result, spans = await traced(agent)
    (call,) = named(spans, "execute_tool")
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes["error.type"] == "ValueError"
    assert "cannot: no" in call.status.description
    (turn,) = named(spans, "invoke_agent")  # the model saw the error; the turn went on
    assert result.finish_reason == "stop" and turn.status.status_code is StatusCode.UNSET


async def test_a_provider_error_marks_the_turn_and_its_chat_span_as_errors():
    agent = Agent(name="calc", provider=ScriptedProvider([[BadRequest("bad model name")]]))
    result, spans = await traced(agent)
    assert result.finish_reason == "error"
    (turn,) = named(spans, "invoke_agent")
    (chat,) = named(spans, "chat")
    for span in (turn, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "BadRequest"
        assert "bad model name" in span.status.description


async def test_a_secret_in_an_error_text_is_redacted_in_span_data():
    steps = [[*tool_call("explode", {"why": f"key {SECRET}"}, tool_call_id="X")], ["no"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[explode])
    _, tool_spans = await traced(agent)
    failing = Agent(provider=ScriptedProvider([[BadRequest(f"invalid api key {SECRET}")]]))
    _, turn_spans = await traced(failing)
    for span in [*tool_spans, *turn_spans]:
        if span.status.status_code is StatusCode.ERROR:
            assert "[redacted]" in span.status.description
        assert SECRET not in repr(span.to_json())


async def test_an_aborted_turn_ends_its_spans_marked_aborted_with_the_reason(autojump_clock):
    steps = [[*tool_call("wait_forever", {}, tool_call_id="W")], ["never"]]
    agent = Agent(name="calc", provider=ScriptedProvider(steps), tools=[wait_forever])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Host.open(log_tap=False) as host:
        await host.start_actor(OpenTelemetryActor(tracer_provider=provider))
        session = await host.open_session(agent)
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "tool-call":
                    out.cancel("user pressed stop")
    assert out.result.finish_reason == "aborted"
    spans = exporter.get_finished_spans()
    (turn,) = named(spans, "invoke_agent")
    (call,) = named(spans, "execute_tool")
    for span in (turn, call):
        assert span.attributes["axon.turn.aborted"] is True
        assert span.attributes["axon.turn.abort_reason"] == "user pressed stop"
    assert turn.status.status_code is StatusCode.UNSET  # stopping is not a failure


async def test_a_sub_agent_turn_nests_under_the_parent_tool_span():
    helper = Agent(name="helper", provider=ScriptedProvider([["sub answer"]]))
    steps = [[*tool_call("helper", {"input": "do it"}, tool_call_id="P1")], ["done"]]
    parent = Agent(name="boss", provider=ScriptedProvider(steps), tools=[helper.as_tool()])
    _, spans = await traced(parent)
    (outer,) = named(spans, "invoke_agent boss")
    (inner,) = named(spans, "invoke_agent helper")
    (call,) = named(spans, "execute_tool helper")
    assert inner.parent.span_id == call.context.span_id
    assert inner.context.trace_id == outer.context.trace_id
    assert inner.attributes["gen_ai.conversation.id"] != "s1"  # the sub-agent's own session


async def test_tool_arguments_and_results_are_not_recorded_by_default():
    _, spans = await traced(two_step_agent())
    (call,) = named(spans, "execute_tool")
    assert "gen_ai.tool.call.arguments" not in call.attributes
    assert "gen_ai.tool.call.result" not in call.attributes


async def test_capture_content_records_tool_arguments_and_results_redacted():
    steps = [[*tool_call("add", {"a": 1, "b": 2, "api_key": SECRET}, tool_call_id="A")], ["3"]]

    @tool
    async def add(a: int, b: int, api_key: str) -> int:
        """Add two numbers."""
        return a + b

    agent = Agent(provider=ScriptedProvider(steps), tools=[add])
    _, spans = await traced(agent, capture_content=True)
    (call,) = named(spans, "execute_tool")
    assert json.loads(call.attributes["gen_ai.tool.call.arguments"]) == {
        "a": 1,
        "b": 2,
        "api_key": "[redacted]",
    }
    assert json.loads(call.attributes["gen_ai.tool.call.result"]) == 3


async def test_a_provider_retry_is_an_event_on_the_chat_span(autojump_clock):
    from runtime.errors import RateLimited

    calls = {"n": 0}

    def respond(request):
        calls["n"] += 1
        return [RateLimited("slow down", retry_after=1)] if calls["n"] == 1 else ["ok"]

    _, spans = await traced(Agent(provider=ScriptedProvider(responder=respond)))
    (chat,) = named(spans, "chat")
    (retry,) = chat.events
    assert retry.name == "axon.provider.retry"
    assert retry.attributes["error.type"] == "RateLimited"
    assert retry.attributes["axon.retry.attempt"] == 1


def collected_actor() -> tuple[OpenTelemetryActor, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryActor(tracer_provider=provider), exporter


def test_a_turn_whose_finish_was_dropped_ends_incomplete_when_the_next_turn_starts():
    actor, exporter = collected_actor()
    start = TurnStarted(session_id="s", turn_id="t1", agent="a", input="x")
    actor.record((1_000, start))
    actor.record((2_000, StepStarted(session_id="s", turn_id="t1", step=0)))
    actor.record(Lagged(subscriber="otel", dropped=5))
    assert exporter.get_finished_spans() == ()
    actor.record((9_000, TurnStarted(session_id="s", turn_id="t2", agent="a", input="y")))
    ended = {s.name: s for s in exporter.get_finished_spans()}
    assert set(ended) == {"invoke_agent a", "chat"}
    assert all(s.attributes["axon.trace.incomplete"] is True for s in ended.values())
    assert ended["invoke_agent a"].end_time == 9_000 and actor.dropped == 5


async def test_spans_still_open_when_the_host_closes_are_ended_and_exported():
    actor, exporter = collected_actor()
    async with Host.open(log_tap=False) as host:
        await host.start_actor(actor)
        await host.bus.publish(TurnStarted(session_id="s", turn_id="t", agent="a", input="x"))
    (turn,) = exporter.get_finished_spans()
    assert turn.name == "invoke_agent a" and turn.attributes["axon.trace.incomplete"] is True


def test_usage_detail_counters_are_recorded_only_when_the_provider_gave_them():
    class Span:
        def __init__(self):
            self.attributes = {}

        def set_attribute(self, key, value):
            self.attributes[key] = value

    plain, detailed = Span(), Span()
    otel_module._set_usage(plain, Usage(input_tokens=3, output_tokens=4))
    otel_module._set_usage(detailed, Usage(input_tokens=3, cache_read=2, reasoning_tokens=1))
    assert "gen_ai.usage.cache_read.input_tokens" not in plain.attributes
    assert detailed.attributes["gen_ai.usage.cache_read.input_tokens"] == 2
    assert detailed.attributes["gen_ai.usage.reasoning.output_tokens"] == 1


def test_attribute_names_match_the_installed_semantic_conventions():
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
    from opentelemetry.semconv.attributes import error_attributes

    pairs = {
        otel_module.OPERATION_NAME: gen_ai.GEN_AI_OPERATION_NAME,
        otel_module.PROVIDER_NAME: gen_ai.GEN_AI_PROVIDER_NAME,
        otel_module.REQUEST_MODEL: gen_ai.GEN_AI_REQUEST_MODEL,
        otel_module.AGENT_NAME: gen_ai.GEN_AI_AGENT_NAME,
        otel_module.CONVERSATION_ID: gen_ai.GEN_AI_CONVERSATION_ID,
        otel_module.RESPONSE_FINISH_REASONS: gen_ai.GEN_AI_RESPONSE_FINISH_REASONS,
        otel_module.USAGE_INPUT_TOKENS: gen_ai.GEN_AI_USAGE_INPUT_TOKENS,
        otel_module.USAGE_OUTPUT_TOKENS: gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS,
        otel_module.USAGE_CACHE_READ: gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
        otel_module.USAGE_CACHE_CREATION: gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
        otel_module.USAGE_REASONING: gen_ai.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
        otel_module.TOOL_NAME: gen_ai.GEN_AI_TOOL_NAME,
        otel_module.TOOL_CALL_ID: gen_ai.GEN_AI_TOOL_CALL_ID,
        otel_module.TOOL_TYPE: gen_ai.GEN_AI_TOOL_TYPE,
        otel_module.TOOL_CALL_ARGUMENTS: gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS,
        otel_module.TOOL_CALL_RESULT: gen_ai.GEN_AI_TOOL_CALL_RESULT,
        otel_module.ERROR_TYPE: error_attributes.ERROR_TYPE,
    }
    assert all(ours == theirs for ours, theirs in pairs.items()), pairs
    operations = {op.value for op in gen_ai.GenAiOperationNameValues}
    assert {"invoke_agent", "chat", "execute_tool"} <= operations


def test_without_the_actor_opentelemetry_is_never_imported():
    code = (
        "import sys, trio\n"
        "import runtime, actors, actors.plugins, actors.plugins.otel\n"
        "from runtime import Host\n"
        "from runtime.app.demo import demo_agent\n"
        "async def main():\n"
        "    async with Host.open() as host:\n"
        "        await (await host.open_session(demo_agent())).run('hi')\n"
        "trio.run(main)\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_without_the_packages_the_actor_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails as if missing
    with pytest.raises(ConfigurationError, match=r"pip install 'axon-runtime\[otel\]'"):
        OpenTelemetryActor()


def test_an_unknown_exporter_is_refused_naming_the_installed_ones(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "bogus")
    with pytest.raises(ConfigurationError, match=r"'bogus'.*installed: .*console"):
        build_tracer_provider()


def test_cli_otel_with_a_bad_exporter_prints_the_reason_and_exits_2():
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "run", "--otel", "hi"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "bogus"},
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: OTEL_TRACES_EXPORTER names 'bogus'")
    assert proc.stdout == ""  # no turn ran


def exported_span_names(requests) -> list[str]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    names = []
    for request in requests:
        assert request.method == "POST" and request.path == "/v1/traces" and request.body
        export = ExportTraceServiceRequest.FromString(request.body)
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                names += [span.name for span in scope.spans]
    return sorted(names)


def otlp_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": url, "PYTHONUNBUFFERED": "1"}


OK = Reply(status=200, content_type="application/x-protobuf")


def test_cli_otel_with_no_collector_exits_saying_so_once_without_retry_warnings():
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.run(
        # run's default level is critical; at warning the failed export is said once
        [
            sys.executable,
            "-m",
            "runtime",
            "run",
            "--otel",
            "--log-level",
            "warning",
            "Weather in Paris?",
        ],
        capture_output=True,
        text=True,
        timeout=30,  # the exporters' defaults took 9-11 s of retries; this only bounds a hang
        cwd=ROOT,
        env=otlp_env(f"http://127.0.0.1:{port}"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "retrying" not in proc.stderr and "Transient error" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert json.loads(line)["event"] == "otel.export_failed"


async def test_cli_otel_exports_the_turn_to_an_otlp_endpoint():
    async with loopback_server(*[OK] * 5) as collector:
        proc = await trio.run_process(
            [sys.executable, "-m", "runtime", "run", "--jsonl", "--otel", "Weather in Paris?"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=otlp_env(collector.url),
            cwd=ROOT,
        )
        requests = list(collector.requests)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["type"] == "finish"  # stdout stays JSONL
    assert exported_span_names(requests) == [
        "chat scripted",
        "chat scripted",
        "execute_tool get_weather",
        "invoke_agent scripted",
    ]


async def test_serve_otel_exports_a_chat_turn_to_an_otlp_endpoint():
    async with loopback_server(*[OK] * 5) as collector:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "runtime", "serve", "--port", "0", "--delay", "0", "--otel"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=otlp_env(collector.url),
            cwd=ROOT,
        )
        try:
            with trio.fail_after(30):
                line = b""
                while not line.endswith(b"\n"):
                    line += await proc.stdout.receive_some(1)
                assert "OpenTelemetry traces" in line.decode()
                url = line.decode().split(" on ", 1)[1].split("/", 3)[:3]
                async with httpx.AsyncClient(base_url="/".join(url)) as client:
                    chat = {
                        "id": "web",
                        "messages": [
                            {"id": "m0", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
                        ],
                        "trigger": "submit-message",
                        "messageId": None,
                    }
                    response = await client.post("/api/chat", json=chat)
                    assert response.status_code == 200
                proc.send_signal(signal.SIGINT)
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        requests = list(collector.requests)
    assert "invoke_agent scripted" in exported_span_names(requests)
