"""Signed approvals (``serve --approval-secret``, runtime/app/web/signing.py) attacked: a
signature moved to another call of the same session, or to another session, is
refused with nothing recorded; a huge or odd signature is a refusal, not an error; a
refusal says what to check when front ends disagree on the secret; and the secret
appears nowhere a client or an operator reads (answers, the stream, logs, reprs,
``serve --help``)."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent
from runtime.app.web.serve import add_serve_parser
from runtime.app.web.signing import SECRET_ENV, ApprovalSigner, for_session
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)
from tests.support.redis import require_redis
from tests.test_approval_signature import _worker_round
from tests.test_approval_web import answer, request_of
from tests.test_web_http import body, events
from tests.web.harness import web_server

SECRET = "correct horse battery staple quince"
"""Distinctive, and no key pattern the log redaction would hide anyway."""


def two_calls() -> Agent:
    steps = [
        [
            *tool_call("delete_file", {"path": "/a"}, tool_call_id="A"),
            *tool_call("delete_file", {"path": "/b"}, tool_call_id="B"),
        ],
        ["done"],
    ]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


def one_call() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


def part(call_id: str, path: str, approval_id: str, **approval: Any) -> dict[str, Any]:
    return {
        "type": "tool-delete_file",
        "toolCallId": call_id,
        "state": "approval-responded",
        "input": {"path": path},
        "approval": {"id": approval_id, "approved": True, **approval},
    }


def requests_of(chunks: list[Any]) -> dict[str, dict[str, Any]]:
    """The stream's approval requests by call id."""
    return {
        c["toolCallId"]: c for c in chunks if c != "[DONE]" and c["type"] == "tool-approval-request"
    }


async def test_a_signature_moved_to_the_other_call_of_the_session_is_refused(tmp_path):
    async with web_server(two_calls(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = requests_of(first)
            a, b = asked["A"], asked["B"]
            swapped = answer("s", first[0]["messageId"], part("A", "/a", a["approvalId"]))
            swapped["messages"][-1]["parts"] = [
                {"type": "step-start"},
                part("A", "/a", a["approvalId"], signature=b["signature"]),
                part("B", "/b", b["approvalId"], signature=a["signature"]),
            ]
            refused = await client.post("/api/chat", json=swapped)
            after = (await client.get("/api/sessions/s")).json()
    assert refused.status_code == 403, refused.text
    assert after["waiting"] == 2 and ran == []


async def test_a_signed_answer_replayed_into_another_session_is_refused(tmp_path):
    async with web_server(one_call(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            mine = events((await client.post("/api/chat", json=body("mine"))).content)
            theirs = events((await client.post("/api/chat", json=body("theirs"))).content)
            m, t = request_of(mine), request_of(theirs)
            # their approval id with my signature, in their session: the ids are the
            # session's, so my whole answer names no call of theirs (404), and theirs
            # carrying my signature does not verify (403)
            whole = answer("theirs", theirs[0]["messageId"], part("D", "/x", m["approvalId"]))
            whole["messages"][-1]["parts"][1]["approval"]["signature"] = m["signature"]
            moved = answer(
                "theirs",
                theirs[0]["messageId"],
                part("D", "/x", t["approvalId"], signature=m["signature"]),
            )
            codes = [(await client.post("/api/chat", json=x)).status_code for x in (whole, moved)]
            after = (await client.get("/api/sessions/theirs")).json()
    assert codes == [404, 403]
    assert after["waiting"] == 1 and ran == []


@pytest.mark.parametrize(
    "signature",
    ["A" * 1_000_000, "", "\u00e9" * 43, "A" * 43 + "\u202e", "x" * 42],
    ids=["huge", "empty", "non-ascii", "bidi", "short"],
)
async def test_an_odd_signature_is_a_403_recording_nothing(tmp_path, signature):
    async with web_server(one_call(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            approval_id = request_of(first)["approvalId"]
            sent = answer(
                "s", first[0]["messageId"], part("D", "/x", approval_id, signature=signature)
            )
            refused = await client.post("/api/chat", json=sent)
            after = (await client.get("/api/sessions/s")).json()
    assert refused.status_code == 403 and len(refused.text) < 1_000
    assert after["waiting"] == 1 and ran == []


@pytest.mark.parametrize("signature", [123, ["a"], {"a": 1}, True])
async def test_a_signature_that_is_not_text_is_a_400(tmp_path, signature):
    async with web_server(one_call(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            approval_id = request_of(first)["approvalId"]
            sent = answer(
                "s", first[0]["messageId"], part("D", "/x", approval_id, signature=signature)
            )
            refused = await client.post("/api/chat", json=sent)
    assert refused.status_code == 400 and ran == []


async def test_a_refused_signature_says_front_ends_must_share_the_secret(tmp_path):
    # Two front ends with different secrets: every answer signed on one is refused on the
    # other, and a reload there signs anew, refused again on the first. "Reload" alone
    # sent the person round in that circle; the operator is told what to check.
    other = ApprovalSigner(secret=b"another front end's secret")
    async with web_server(one_call(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            approval_id = request_of(first)["approvalId"]
            signed = other.sign("s", approval_id, "D", "delete_file", {"path": "/x"})
            sent = answer(
                "s", first[0]["messageId"], part("D", "/x", approval_id, signature=signed)
            )
            refused = await client.post("/api/chat", json=sent)
    error = refused.json()["error"]
    assert refused.status_code == 403 and "nothing was recorded" in error
    assert "--approval-secret" in error and SECRET_ENV in error
    assert SECRET not in refused.text


async def test_the_secret_appears_in_no_answer_stream_log_or_repr(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with web_server(one_call(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        seen += [repr(srv.app.state.axon), repr(srv.app.state.axon.signer)]
        seen += [repr(for_session(srv.app.state.axon.signer, "s"))]
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = await client.post("/api/chat", json=body("s"))
            seen.append(first.text)
            chunks = events(first.content)
            approval_id = request_of(chunks)["approvalId"]
            signature = request_of(chunks)["signature"]
            for forged in ("A" * 43, 7):
                sent = answer(
                    "s", chunks[0]["messageId"], part("D", "/x", approval_id, signature=forged)
                )
                seen.append((await client.post("/api/chat", json=sent)).text)
            for path in ("/api/info", "/api/sessions", "/api/sessions/s"):
                seen.append((await client.get(path)).text)
            good = answer(
                "s", chunks[0]["messageId"], part("D", "/x", approval_id, signature=signature)
            )
            seen.append((await client.post("/api/chat", json=good)).text)
            seen.append((await client.get("/api/sessions/s")).text)
    seen += [r.getMessage() for r in caplog.records]
    seen += [str(r.args) for r in caplog.records]
    assert ran == ["/x"] and len(seen) > 10
    leaked = [s[:200] for s in seen if SECRET in s or SECRET.encode().hex() in s]
    assert leaked == []


def test_serve_help_shows_no_secret_from_the_environment():
    env = {SECRET_ENV: SECRET}
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
        timeout=60,
    )
    assert out.returncode == 0 and "--approval-secret" in out.stdout
    assert SECRET not in out.stdout + out.stderr
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    assert SECRET not in repr(parser.parse_args(["serve"]))


# -- the worker deployment (the suite's PostgreSQL and Redis) -------------------------------


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_worker_front_ends_with_different_secrets_say_so_and_record_nothing(
    pg_url: str, redis_url: str
) -> None:
    _, response, waiting = await _worker_round(pg_url, redis_url, (SECRET, "Velvet-Ostrich-9"))
    error = response.json()["error"]
    assert response.status_code == 403 and waiting == 1
    assert "--approval-secret" in error and "nothing was recorded" in error
    assert SECRET not in response.text and "Velvet-Ostrich-9" not in response.text
