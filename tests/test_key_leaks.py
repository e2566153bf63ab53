"""A provider's 401 that quotes the key: the key leaves the process nowhere, and the turn
is stored as failed (with its redacted error), not as interrupted.

The real ``openai`` / ``anthropic`` SDKs talk to a loopback server that refuses the key
with each provider's own error body, quoting the key in full (as some compatible servers
and proxies do). One key has a known prefix, one has none: the configured key's own value
must be replaced whatever its shape.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import orjson
import pytest
import trio

from actors.plugins import JsonlRecorder
from actors.providers import AnthropicProvider, OpenAIProvider
from runtime import Agent, Host
from runtime.app.web.ui_stream import encode_turn, ui_messages
from runtime.logging import configure_logging
from runtime.serde import to_json
from tests.support.loopback import Reply, loopback_server

ROOT = Path(__file__).resolve().parents[1]


def refusal(kind: str, key: str) -> Reply:
    """The provider's real 401 body, quoting the key it was sent."""
    if kind == "openai":
        error = {
            "message": f"Incorrect API key provided: {key}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
        body = {"error": error}
    else:
        error = {"type": "authentication_error", "message": f"invalid x-api-key: {key}"}
        body = {"type": "error", "error": error, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
    return Reply(status=401, body=json.dumps(body).encode(), content_type="application/json")


def make_provider(kind: str, url: str, key: str | None) -> OpenAIProvider | AnthropicProvider:
    if kind == "openai":
        return OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=key)
    return AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=key)


KEYS = [
    pytest.param("openai", "gsk_Q9zT4mLr8vXw2Yb7NcK1pD5eHj3s", id="openai-groq-key"),
    pytest.param("anthropic", "sk-ant-api03-Zr7Kp2Lw9Qx4Vb8Nm1Tc6Yd3Fh5Gj0", id="anthropic-key"),
    pytest.param("openai", "letmein.corp-proxy.credential", id="openai-key-of-no-known-shape"),
]


async def refused_turn(kind: str, key: str | None, tmp_path: Path, quoted: str = ""):
    """One turn the server refuses (quoting ``quoted`` or the configured ``key``), with the
    log tap and a JSONL recorder attached."""
    async with loopback_server(refusal(kind, quoted or key or "")) as server:
        provider = make_provider(kind, server.url, key)
        try:
            async with Host.open(store=str(tmp_path / "s.db")) as host:
                recorder = await host.start_actor(JsonlRecorder(tmp_path / "events.jsonl"))
                session = await host.open_session(Agent(provider=provider), session_id="k")
                async with session.stream("hi") as out:
                    chunks = [c async for c in out]
                recorder.stop()
                await recorder.stopped.wait()
                stored = await host.store.load("k")
        finally:
            with trio.CancelScope(shield=True):
                await provider.aclose()
    assert len(server.requests) == 1
    return chunks, out.result, session, stored, server.requests[0]


@pytest.mark.parametrize(("kind", "key"), KEYS)
async def test_a_401_quoting_the_key_leaks_it_into_no_output(kind, key, tmp_path):
    log = io.StringIO()
    configure_logging("debug", stream=log)
    try:
        chunks, result, session, stored, request = await refused_turn(kind, key, tmp_path)
    finally:
        configure_logging("warning")
    sent = request.headers.get("authorization", "") + request.headers.get("x-api-key", "")
    assert key in sent  # the SDK really was configured with it
    web = encode_turn(chunks) + ui_messages(stored.messages)
    error_text = next(c["errorText"] for c in web if c["type"] == "error")
    assert error_text.startswith("AuthenticationFailed: ") and "[redacted]" in error_text
    outputs = {
        "output chunks": to_json(chunks).decode(),
        "TurnResult": repr(result) + to_json(result.message).decode(),
        "session messages": to_json(list(session.messages)).decode(),
        "stored messages": to_json(list(stored.messages)).decode(),
        "log lines": log.getvalue(),
        "JSONL recording": (tmp_path / "events.jsonl").read_text(),
        "web stream and restored UI messages": orjson.dumps(web).decode(),
    }
    assert '"turn.failed"' in outputs["log lines"]
    assert '"output.error"' in outputs["JSONL recording"]
    leaks = [where for where, text in outputs.items() if key in text]
    assert leaks == []


@pytest.mark.parametrize(("kind", "key"), KEYS[:2])
async def test_a_turn_that_failed_on_a_401_is_stored_failed_not_interrupted(kind, key, tmp_path):
    _, result, _, stored, _ = await refused_turn(kind, key, tmp_path)
    assistant = stored.messages[1]
    assert result.finish_reason == "error" and result.message == assistant
    assert assistant.status == "failed" and not assistant.interrupted
    assert assistant.error == result.error
    assert assistant.error.kind == "AuthenticationFailed"
    assert "[redacted]" in assistant.error.message


async def test_a_key_the_sdk_reads_from_its_environment_variable_is_redacted_too(
    tmp_path, monkeypatch
):
    key = "env.only.credential-without-prefix"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    chunks, result, *_ = await refused_turn("openai", None, tmp_path, quoted=key)
    assert chunks[-1].type == "error" and key not in chunks[-1].error.message
    assert "[redacted]" in result.error.message


@pytest.mark.parametrize("mode", [["--jsonl"], []], ids=["jsonl", "terminal"])
async def test_the_cli_run_prints_and_records_no_key(mode, tmp_path):
    key = "letmein.cli-proxy.credential"
    record = tmp_path / "events.jsonl"
    async with loopback_server(refusal("openai", key)) as server:
        args = ["--provider", "openai", "--base-url", server.url + "/v1", "--api-key", key]
        args += ["--record", str(record), "--log-level", "debug", *mode, "hi"]
        proc = await trio.run_process(
            [sys.executable, "-m", "runtime", "run", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
        )
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1, stderr
    assert "AuthenticationFailed" in stdout and "[redacted]" in stdout
    assert key not in stdout and key not in stderr and key not in record.read_text()
    assert '"turn.failed"' in stderr  # the log was written, redacted


async def test_show_marks_a_failed_turn_failed_with_its_error(tmp_path):
    await refused_turn("anthropic", "sk-ant-api03-Show7Kp2Lw9Qx4Vb8", tmp_path)
    proc = await trio.run_process(
        [sys.executable, "-m", "runtime", "show", "k", "--store", str(tmp_path / "s.db")],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=ROOT,
    )
    stdout = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    lines = stdout.splitlines()
    assert "assistant (failed)" in lines
    assert any(line.startswith("  error: AuthenticationFailed: ") for line in lines)
    assert "interrupted" not in stdout and "Show7Kp2" not in stdout
