"""Every bus event becomes one structlog line with correlation ids; secrets never leak."""

from __future__ import annotations

import io
import itertools

import structlog
import trio
from structlog.testing import capture_logs

from actors.log_tap import LogTap
from actors.plugins import JsonlRecorder
from actors.plugins.recorder import read_jsonl
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, configure_logging, tool
from runtime.redact import redact


@tool
async def weather(city: str) -> str:
    """Weather."""
    return f"sunny in {city}"


def agent() -> Agent:
    steps = [[*tool_call("weather", {"city": "Oslo"}, tool_call_id="W")], ["It is sunny."]]
    return Agent(provider=ScriptedProvider(steps), tools=[weather])


async def run_logged(level: str) -> list[dict]:
    configure_logging(level)
    try:
        with capture_logs() as logs:
            async with Host.open() as host:
                session = await host.open_session(agent(), session_id="obs")
                await session.run("weather?")
                await trio.sleep(0.05)  # let the tap drain
    finally:
        configure_logging("warning")
    return [line for line in logs if line.get("logger") == "axon.events"]


async def test_one_turn_logs_each_event_with_its_correlation_ids():
    lines = await run_logged("debug")
    kinds = [line["event"] for line in lines]
    for kind in (
        "turn.started",
        "step.started",
        "output.text-delta",
        "tool.call-requested",
        "output.tool-result",
        "step.finished",
        "message.added",
        "turn.finished",
    ):
        assert kind in kinds, kind
    for line in lines:
        assert line["session_id"] == "obs"
        assert line["turn_id"].startswith("turn_")
        assert line["causation_id"]
    deltas = [line for line in lines if line["event"] == "output.text-delta"]
    assert all(
        line["part_id"] and "step" in line and line["log_level"] == "debug" for line in deltas
    )
    tool_result = next(line for line in lines if line["event"] == "output.tool-result")
    assert tool_result["causation_id"] == "W" and tool_result["step"] == 0


async def test_seq_is_gap_free_per_session_in_the_log():
    lines = await run_logged("debug")
    seqs = [line["seq"] for line in lines if line["event"].startswith("output.")]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


async def test_deltas_are_not_logged_at_info_and_errors_are_logged_at_error():
    lines = await run_logged("info")
    levels = {line["event"]: line["log_level"] for line in lines}
    assert "output.text-delta" not in levels
    assert levels["turn.finished"] == "info"
    tap = LogTap(logger=structlog.get_logger("x").bind())
    assert tap  # constructing a tap with any logger works


async def _count_redactions_of_the_prompt(monkeypatch, prompt: str) -> int:
    """How many times the redactor was handed the turn's prompt (logged once, in the
    ``turn.started`` line's ``input``), by anyone."""
    import runtime.redact as redact_module

    real = redact_module.redact_text
    calls = []

    def counting(text):
        if isinstance(text, str) and prompt in text:
            calls.append(text)
        return real(text)

    monkeypatch.setattr(redact_module, "redact_text", counting)
    async with Host.open() as host:
        session = await host.open_session(agent(), session_id="once")
        await session.run(prompt)
        await trio.sleep(0.05)  # let the tap drain
    return len(calls)


async def test_a_line_through_configure_logging_is_redacted_exactly_once(monkeypatch):
    out = io.StringIO()
    configure_logging("info", stream=out)
    try:
        count = await _count_redactions_of_the_prompt(monkeypatch, "once-marker-4711")
    finally:
        configure_logging("warning")
    assert '"input":"once-marker-4711"' in out.getvalue()  # the line was written
    assert count == 1  # by the processor chain only, not by the tap as well


async def test_a_tap_whose_logger_does_not_redact_redacts_the_line_itself(monkeypatch):
    configure_logging("info")
    try:
        with capture_logs() as logs:  # its chain has no redaction processor
            count = await _count_redactions_of_the_prompt(monkeypatch, "once-marker-4712")
    finally:
        configure_logging("warning")
    assert any(line.get("input") == "once-marker-4712" for line in logs)
    assert count == 1


def test_redact_scrubs_credential_keys_and_key_shaped_values():
    data = {
        "api_key": "sk-live-123456789",
        "headers": {"Authorization": "Bearer abc.def", "x-api-key": "k"},
        "note": "used key sk-proj-ABCDEFGH1234 for the call",
        "input_tokens": 12,
    }
    clean = redact(data)
    assert clean["api_key"] == "[redacted]" and clean["headers"]["Authorization"] == "[redacted]"
    assert clean["headers"]["x-api-key"] == "[redacted]"
    assert "sk-proj" not in clean["note"] and clean["input_tokens"] == 12


async def test_secrets_in_provider_options_never_reach_logs_or_recorded_events(tmp_path):
    secret = "sk-test-SUPERSECRET-0042"
    from runtime.errors import AuthenticationFailed

    steps = [[AuthenticationFailed(f"invalid key {secret}")]]
    bad = Agent(
        provider=ScriptedProvider(steps),
        settings={"api_key": secret, "extra_headers": {"Authorization": f"Bearer {secret}"}},
    )
    path = tmp_path / "events.jsonl"
    configure_logging("debug")
    try:
        with capture_logs() as logs:
            async with Host.open() as host:
                recorder = await host.start_actor(JsonlRecorder(path))
                session = await host.open_session(bad, session_id="secret")
                await session.run("hi")
                await trio.sleep(0.05)
                recorder.stop()
                await recorder.stopped.wait()
    finally:
        configure_logging("warning")
    assert logs, "the turn was logged"
    assert secret not in repr(logs)
    recorded = path.read_text()
    assert "turn.finished" in recorded and secret not in recorded
    assert any(e["kind"] == "output.error" for e in read_jsonl(path))


async def test_openai_and_anthropic_providers_never_describe_their_keys():
    from actors.providers import AnthropicProvider, OpenAIProvider

    for provider in (
        OpenAIProvider("m", api_key="sk-abc-SECRET"),
        AnthropicProvider("m", api_key="sk-ant-SECRET"),
    ):
        assert "SECRET" not in repr(provider.describe())


async def test_five_hundred_concurrent_sessions_complete_with_separate_histories():
    n = 500
    counter = itertools.count()

    def respond(request):
        last = request.messages[-1]
        if last.role == "tool":
            return [f"answer for {last.output}"]
        user = next(m for m in reversed(request.messages) if m.role == "user")
        return [*tool_call("weather", {"city": user.content}, tool_call_id=f"c{next(counter)}")]

    many = Agent(provider=ScriptedProvider(responder=respond), tools=[weather])
    async with Host.open() as host:
        sessions = [await host.open_session(many, session_id=f"s{i}") for i in range(n)]
        results: dict[str, object] = {}

        async def one(i: int) -> None:
            results[sessions[i].id] = await sessions[i].run(f"city{i}")

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
    assert len(results) == n
    assert all(r.finish_reason == "stop" for r in results.values())
    for i, s in enumerate(sessions):
        roles = [m.role for m in s.messages]
        assert roles == ["user", "assistant", "tool"]
        assert s.messages[0].content == f"city{i}"
        assert s.messages[2].output == f"sunny in city{i}"
        assert s.messages[1].text == f"answer for sunny in city{i}"
