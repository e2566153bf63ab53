"""Signed tool approvals on ``POST /api/chat`` (docs/approval.md, runtime/app/web/signing.py):
the stream's ``tool-approval-request`` carries a ``signature`` with a secret configured,
``ui_messages`` the same one, and a continuation whose signature does not verify against
the stored call is refused with nothing recorded; the approval metadata the ``ai``
package copies into its answer (``descriptor``, ``inputSchemaInput``, ``signature``...)
is accepted with a secret or without."""

from __future__ import annotations

import argparse
import json
from typing import Any

import attrs
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent
from runtime import output as o
from runtime.app.web.answers import _answers
from runtime.app.web.http import ApiError
from runtime.app.web.serve import add_serve_parser, approval_secret
from runtime.app.web.signing import ApprovalSigner, for_session, input_digest
from runtime.app.web.ui_stream import UIStreamEncoder, ui_messages
from runtime.approval import PendingCall
from runtime.messages import AssistantMessage, Awaiting, ToolCallPart, ToolMessage, UserMessage
from tests.support.approval_tools import (
    clear_ran,  # noqa: F401 (fixture)
    delete_file,
    ran,
    waiting_delete,
)
from tests.support.redis import require_redis
from tests.test_approval_nested_pass import parent
from tests.test_approval_nested_pass import ran as nested_ran
from tests.test_approval_web import answer, approval_part, request_of
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_web_http import body, events
from tests.test_worker_approval import answer as worker_answer
from tests.test_worker_approval import approval_agent, payloads
from tests.test_worker_approval import chat as worker_chat
from tests.test_worker_approval import ran as worker_ran
from tests.web.harness import web_server

SECRET = "s3cret-approvals"
SIGNER = ApprovalSigner(secret=SECRET.encode())
METADATA = {
    "descriptor": {"scope": "files:delete"},
    "inputSchemaInput": {"path": "/x"},
    "requestReason": "deletes a file",
    "isAutomatic": False,
}
"""What the ``ai`` package (6 and 7) may keep in an answered approval besides its id,
answer and signature."""


def agent() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


# -- the signature ------------------------------------------------------------------------


def test_a_signature_names_session_approval_call_tool_and_input():
    sig = SIGNER.sign("s", "a1", "D", "delete_file", {"path": "/x", "n": 1})
    assert SIGNER.verify(sig, "s", "a1", "D", "delete_file", {"n": 1.0, "path": "/x"})
    for other in (
        ("t", "a1", "D", "delete_file", {"path": "/x", "n": 1}),
        ("s", "a2", "D", "delete_file", {"path": "/x", "n": 1}),
        ("s", "a1", "E", "delete_file", {"path": "/x", "n": 1}),
        ("s", "a1", "D", "read_file", {"path": "/x", "n": 1}),
        ("s", "a1", "D", "delete_file", {"path": "/y", "n": 1}),
    ):
        assert not SIGNER.verify(sig, *other)
    assert not ApprovalSigner(secret=b"other").verify(
        sig, "s", "a1", "D", "delete_file", {"path": "/x", "n": 1}
    )
    assert not SIGNER.verify("é" + sig[1:], "s", "a1", "D", "delete_file", {"path": "/x"})
    assert ApprovalSigner.of("") is None and ApprovalSigner.of(None) is None


def test_fields_cannot_be_shifted_into_each_other():
    # (a newline-joined payload, the AI SDK 6's, made "a\nb","c" and "a","b\nc" one)
    assert SIGNER.sign("s", "a\nb", "c", "t", None) != SIGNER.sign("s", "a", "b\nc", "t", None)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(_json)
def test_the_input_digest_survives_a_json_round_trip(value):
    # what the store gives back (JSON, jsonb: keys reordered, 1.0 for 1) digests the same
    back = json.loads(json.dumps(value, sort_keys=True))
    assert input_digest(back) == input_digest(value)


# -- the encoder and the stored form ------------------------------------------------------


def test_the_encoder_signs_the_request_of_a_call_it_showed():
    signer = for_session(SIGNER, "s")
    encoder = UIStreamEncoder(signer=signer)
    call = o.ToolCall(step=0, tool_call_id="D", tool_name="delete_file", input={"path": "/x"})
    ask = o.ToolApprovalRequest(step=0, tool_call_id="D", tool_name="delete_file", approval_id="a")
    encoder.encode(call)
    (chunk,) = encoder.encode(ask)
    assert chunk["signature"] == SIGNER.sign("s", "a", "D", "delete_file", {"path": "/x"})
    assert "signature" not in UIStreamEncoder(signer=signer).encode(ask)[0]  # input unseen
    plain = UIStreamEncoder()
    plain.encode(call)
    assert plain.encode(ask) == [
        {"type": "tool-approval-request", "approvalId": "a", "toolCallId": "D"}
    ]


def test_the_stored_form_signs_only_the_approvals_still_to_answer():
    waiting = ToolCallPart(
        tool_call_id="D",
        tool_name="delete_file",
        input={"path": "/x"},
        step=0,
        awaiting=Awaiting(kind="approval", id="a", turn_id="t"),
    )
    ran_one = attrs.evolve(
        waiting,
        tool_call_id="E",
        awaiting=Awaiting(kind="approval", id="b", turn_id="t", decided=True, approved=True),
    )
    history = [
        UserMessage(content="go"),
        AssistantMessage(content=[ran_one, waiting]),
        ToolMessage(tool_call_id="E", tool_name="delete_file", output="ok", step=0),
    ]
    parts = ui_messages(history, for_session(SIGNER, "s"))[-1]["parts"]
    approvals = {p["toolCallId"]: p["approval"] for p in parts if "approval" in p}
    assert approvals == {
        "E": {"id": "b", "approved": True},
        "D": {"id": "a", "signature": SIGNER.sign("s", "a", "D", "delete_file", {"path": "/x"})},
    }
    assert "signature" not in str(ui_messages(history))


# -- the continuation's parser ------------------------------------------------------------


def _waiting() -> list[PendingCall]:
    return [waiting_delete("a")]


def _message(**approval: Any) -> dict[str, Any]:
    return {"role": "assistant", "parts": [approval_part("a", True, **approval)]}


def test_the_parser_takes_the_sdks_approval_metadata_with_or_without_a_signer():
    good = SIGNER.sign("s", "a", "D", "delete_file", {"path": "/x"})
    for signer in (None, for_session(SIGNER, "s")):
        (got,) = _answers(_message(**METADATA, signature=good), _waiting(), signer)
        assert got[0] == "a" and got[1].approved is True
        assert len(_answers(_message(**METADATA), _waiting(), signer)) == 1  # none: old clients


def test_the_parser_refuses_a_signature_that_does_not_verify():
    signer = for_session(SIGNER, "s")
    bad = [
        SIGNER.sign("other", "a", "D", "delete_file", {"path": "/x"}),  # another session's
        SIGNER.sign("s", "a", "D", "delete_file", {"path": "/y"}),  # another input
        ApprovalSigner(secret=b"forged").sign("s", "a", "D", "delete_file", {"path": "/x"}),
        "",
    ]
    for signature in bad:
        with pytest.raises(ApiError) as refused:
            _answers(_message(signature=signature), _waiting(), signer)
        assert refused.value.status == 403
    with pytest.raises(ApiError) as typed:
        _answers(_message(signature=7), _waiting(), None)
    assert typed.value.status == 400


# -- over HTTP (embedded) -----------------------------------------------------------------


async def test_embedded_the_signature_round_trips_and_the_metadata_is_accepted(tmp_path):
    ran.clear()
    async with web_server(agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            sent = body("s", message_id="u-once")
            first = events((await client.post("/api/chat", json=sent)).content)
            asked = request_of(first)
            expected = SIGNER.sign("s", asked["approvalId"], "D", "delete_file", {"path": "/x"})
            assert asked["signature"] == expected
            # the same message sent again (a retry) gets the turn rebuilt: signed alike
            again = events((await client.post("/api/chat", json=sent)).content)
            assert request_of(again) == asked
            stored = (await client.get("/api/sessions/s")).json()
            (part,) = [p for p in stored["ui_messages"][-1]["parts"] if p.get("toolCallId")]
            assert part["approval"] == {"id": asked["approvalId"], "signature": expected}
            message_id = first[0]["messageId"]
            extra = {**METADATA, "signature": asked["signature"]}
            sent = answer("s", message_id, approval_part(asked["approvalId"], True, **extra))
            second = events((await client.post("/api/chat", json=sent)).content)
    assert ran == ["/x"]
    assert [c["type"] for c in second if c != "[DONE]"][-1] == "finish"


FORGERIES = {
    "another input": lambda a: SIGNER.sign("s", a, "D", "delete_file", {"path": "/etc"}),
    "another session": lambda a: SIGNER.sign("t", a, "D", "delete_file", {"path": "/x"}),
    "another call": lambda a: SIGNER.sign("s", a, "E", "delete_file", {"path": "/x"}),
    "another secret": lambda a: ApprovalSigner(secret=b"guess").sign(
        "s", a, "D", "delete_file", {"path": "/x"}
    ),
    "altered": lambda a: SIGNER.sign("s", a, "D", "delete_file", {"path": "/x"})[:-2] + "AA",
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
async def test_embedded_a_forged_signature_is_403_and_nothing_is_recorded(tmp_path, forgery):
    ran.clear()
    async with web_server(agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            approval_id = request_of(first)["approvalId"]
            signature = FORGERIES[forgery](approval_id)
            assert signature != request_of(first)["signature"]
            part = approval_part(approval_id, True, signature=signature)
            refused = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
            after = (await client.get("/api/sessions/s")).json()
    assert refused.status_code == 403 and "signature" in refused.json()["error"]
    assert ran == [] and after["waiting"] == 1
    (call,) = [p for p in after["ui_messages"][-1]["parts"] if p.get("toolCallId")]
    assert call["state"] == "approval-requested"  # nothing recorded


async def test_embedded_without_a_secret_nothing_is_signed_and_a_signature_is_passed_over(
    tmp_path,
):
    ran.clear()
    async with web_server(agent(), store=str(tmp_path / "w.db")) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = request_of(first)
            assert "signature" not in asked
            extra = {**METADATA, "signature": "anything"}
            sent = answer(
                "s", first[0]["messageId"], approval_part(asked["approvalId"], True, **extra)
            )
            response = await client.post("/api/chat", json=sent)
    assert response.status_code == 200 and ran == ["/x"]


# -- the worker deployment's front ends ---------------------------------------------------


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def _worker_round(
    pg_url: str, redis_url: str, secrets: tuple[str | None, str | None], **approval: Any
) -> tuple[list[Any], httpx.Response, int]:
    """A turn asks on front end 0 (its secret ``secrets[0]``); the answer, with the
    request's own signature unless ``approval`` says otherwise, goes to front end 1:
    the request, the answer's response, and how many calls the session still waits for."""

    async with deployment(pg_url, redis_url, approval_agent(), fronts=0) as d:
        for secret in secrets:
            d.app_options = {} if secret is None else {"approval_secret": secret}
            await d.start_front_end()
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            posted = await client.post(f"{a}/api/chat", json=worker_chat("s1"))
            first = payloads(sse_events(posted.text))
            asked = request_of(first)
            extra = {
                **METADATA,
                **({"signature": asked["signature"]} if "signature" in asked else {}),
            }
            sent = worker_answer(
                "s1", first[0]["messageId"], asked["approvalId"], True, **{**extra, **approval}
            )
            response = await client.post(f"{b}/api/chat", json=sent)
            if response.status_code == 200:
                await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
            waiting = (await client.get(f"{b}/api/sessions/s1")).json()["waiting"]
    return first, response, waiting


async def test_worker_front_ends_with_one_secret_verify_each_others_signatures(pg_url, redis_url):
    worker_ran.clear()
    first, response, waiting = await _worker_round(pg_url, redis_url, (SECRET, SECRET))
    asked = request_of(first)
    assert asked["signature"] == SIGNER.sign(
        "s1", asked["approvalId"], "D", "delete_file", {"path": "/x"}
    )
    assert response.status_code == 200 and waiting == 0 and worker_ran == ["/x"]


async def test_worker_front_end_refuses_a_forged_signature_recording_nothing(pg_url, redis_url):
    worker_ran.clear()
    forged = "A" * 43
    _, response, waiting = await _worker_round(
        pg_url, redis_url, (SECRET, SECRET), signature=forged
    )
    assert response.status_code == 403 and "signature" in response.json()["error"]
    assert waiting == 1 and worker_ran == []


async def test_worker_front_end_with_another_secret_refuses_the_signature(pg_url, redis_url):
    _, response, waiting = await _worker_round(pg_url, redis_url, (SECRET, "another"))
    assert response.status_code == 403 and waiting == 1


async def test_worker_front_end_without_a_secret_takes_the_sdks_metadata(pg_url, redis_url):
    worker_ran.clear()
    first, response, waiting = await _worker_round(
        pg_url, redis_url, (None, None), signature="unchecked"
    )
    assert "signature" not in request_of(first)
    assert response.status_code == 200 and waiting == 0 and worker_ran == ["/x"]


async def test_a_sub_agents_approval_on_the_calling_call_is_signed_and_verifies(tmp_path):
    """``as_tool(pass_approvals=True)``: the request shows on the calling call ``H``
    (the agent tool, its input) with the sub-turn's approval id; its signature names
    that call as the store holds it, and the answer echoing it runs the tool once."""
    nested_ran.clear()
    async with web_server(parent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = request_of(first)
            signature = SIGNER.sign("s", asked["approvalId"], "H", "helper", {"input": "pay x"})
            assert asked["toolCallId"] == "H" and asked["signature"] == signature
            part = {
                "type": "tool-helper",
                "toolCallId": "H",
                "state": "approval-responded",
                "input": {"input": "pay x"},
                "approval": {"id": asked["approvalId"], "approved": True, "signature": signature},
            }
            second = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
    assert second.status_code == 200 and nested_ran == ["x"]


def test_serve_takes_the_secret_from_its_option_else_the_environment(monkeypatch):
    parser = add_serve_parser(argparse.ArgumentParser().add_subparsers())
    monkeypatch.delenv("AXON_APPROVAL_SECRET", raising=False)
    monkeypatch.delenv("AXON_APPROVAL_SECRET_FILE", raising=False)
    assert approval_secret(parser.parse_args([])) is None
    monkeypatch.setenv("AXON_APPROVAL_SECRET", "from-env")
    assert approval_secret(parser.parse_args([])) == "from-env"
    assert approval_secret(parser.parse_args(["--approval-secret", "given"])) == "given"
