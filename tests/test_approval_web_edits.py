"""Approve with edits through the AI SDK continuation (``POST /api/chat``): the tool
part's ``approval.axonEditedInput`` (an Axon extension; the page at ``/`` sends it) runs
the call with that input, checked like every edit (docs/approval.md, "Approving with
edits"), in the embedded app (SQLite) and through a worker deployment's front end (the
suite's PostgreSQL and Redis). The part's ``input`` and ``signature`` stay the call's as
streamed, so a signed approval with an edit verifies."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import tool_call
from runtime.app.web.answers import EDITED_INPUT, _answers
from runtime.app.web.http import ApiError
from tests.support.approval_tools import waiting_delete
from tests.support.redis import require_redis
from tests.test_approval_node import ai as ai  # the fixtures
from tests.test_approval_node import node as node
from tests.test_approval_web import DELETE, agent, answer, approval_part, post, ran, request_of
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_web_http import body
from tests.test_worker_approval import answer as worker_answer
from tests.test_worker_approval import approval_agent, payloads
from tests.test_worker_approval import chat as worker_chat
from tests.test_worker_approval import ran as worker_ran
from tests.web.harness import WEB, web_server

SECRET = "edit-secret"
TWO = [*DELETE, *tool_call("delete_file", {"path": "/y"}, tool_call_id="E")]


def parsed(approval: dict[str, Any]) -> Any:
    part = {**approval_part("A", True), "approval": {"id": "A", **approval}}
    return _answers({"parts": [part]}, [waiting_delete("A")])


def test_the_parser_reads_the_edit_into_the_decision():
    ((key, decision),) = parsed({"approved": True, EDITED_INPUT: {"path": "/y"}})
    assert key == "A" and decision.approved is True
    assert decision.edited_input == {"path": "/y"}
    ((_, plain),) = parsed({"approved": True})
    assert plain.edited_input is None


@pytest.mark.parametrize("edit", [[1], "x", 5, True])
def test_the_parser_refuses_an_edit_that_is_no_object(edit: Any):
    with pytest.raises(ApiError) as caught:
        parsed({"approved": True, EDITED_INPUT: edit})
    assert caught.value.status == 400 and EDITED_INPUT in str(caught.value)


async def test_an_edited_approval_runs_the_call_with_the_edit_and_the_reload_shows_it():
    ran.clear()
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            part = approval_part(request_of(first)["approvalId"], True)
            part["approval"][EDITED_INPUT] = {"path": "/y"}
            second = await post(client, answer("s", first[0]["messageId"], part))
            stored = (await client.get("/api/sessions/s")).json()
    assert ran == ["/y"]
    assert {"type": "tool-output-available", "toolCallId": "D", "output": "deleted /y"} in second
    (shown,) = [p for m in stored["ui_messages"] for p in m["parts"] if p.get("toolCallId") == "D"]
    assert shown["input"] == {"path": "/y"} and shown["state"] == "output-available"
    assert shown["toolMetadata"] == {"axonOriginalInput": {"path": "/x"}}


@pytest.mark.parametrize(
    "approval",
    [
        {"approved": True, EDITED_INPUT: {"path": 5}},  # the tool's schema refuses it
        {"approved": True, EDITED_INPUT: {"nope": "/y"}},
        {"approved": False, EDITED_INPUT: {"path": "/y"}},  # an edit of a denial
        {"approved": True, EDITED_INPUT: ["/y"]},
    ],
    ids=["wrong-type", "wrong-key", "denied", "not-object"],
)
async def test_an_invalid_edit_is_a_400_that_records_nothing(approval: dict[str, Any]):
    ran.clear()
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            approval_id = request_of(first)["approvalId"]
            before = (await client.get("/api/sessions/s")).json()
            part = {**approval_part(approval_id, True), "approval": {"id": approval_id, **approval}}
            refused = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
            after = (await client.get("/api/sessions/s")).json()
            plain = approval_part(approval_id, True)  # the call still waits
            second = await post(client, answer("s", first[0]["messageId"], plain))
    assert refused.status_code == 400 and refused.json()["error"]
    assert after == before  # nothing recorded
    assert before["waiting"] == 1
    assert ran == ["/x"]
    assert {"type": "tool-output-available", "toolCallId": "D", "output": "deleted /x"} in second


async def test_a_signed_edit_of_one_of_two_calls_verifies_and_its_echo_is_taken():
    """The page answers one call, gets 202, then sends both answers: the first part
    still carries the model's input, its signature and its edit, while the store holds
    the edited input. Its input and signature are checked against the call either way
    (the model's input it was asked with), and the edit repeats the recorded one."""
    ran.clear()
    async with web_server(agent(TWO), approval_secret=SECRET) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            d, e = [c for c in first if c != "[DONE]" and c["type"] == "tool-approval-request"]
            mid = first[0]["messageId"]
            part = approval_part(d["approvalId"], True, signature=d["signature"])
            part["approval"][EDITED_INPUT] = {"path": "/z"}
            partly = await client.post("/api/chat", json=answer("s", mid, part))
            both = answer("s", mid, part)
            other = approval_part(e["approvalId"], True, signature=e["signature"])
            both["messages"][-1]["parts"].append(
                {**other, "toolCallId": "E", "input": {"path": "/y"}}
            )
            r = await client.post("/api/chat", json=both)
    assert (partly.status_code, partly.json()) == (202, {"recorded": True, "waiting": 1})
    assert r.status_code == 200, r.text
    assert sorted(ran) == ["/y", "/z"]


async def test_a_signature_for_another_input_is_refused_with_an_edit():
    ran.clear()
    async with web_server(agent(DELETE), approval_secret=SECRET) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            part = approval_part(asked["approvalId"], True, signature=asked["signature"])
            part["approval"][EDITED_INPUT] = {"path": "/y"}
            part["input"] = {"path": "/y"}  # the edit put where the call's input goes
            refused = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
    assert refused.status_code == 400  # another input than the call's: nothing recorded
    assert ran == []


# -- the worker deployment's front end ----------------------------------------------------


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.mark.parametrize("secret", [None, SECRET], ids=["unsigned", "signed"])
async def test_a_worker_front_end_records_the_edit_and_the_worker_runs_it(
    pg_url: str, redis_url: str, secret: str | None
):
    worker_ran.clear()
    async with deployment(pg_url, redis_url, approval_agent(), fronts=0) as d:
        d.app_options = {} if secret is None else {"approval_secret": secret}
        await d.start_front_end()
        await d.start_front_end()
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = payloads(
                sse_events((await client.post(f"{a}/api/chat", json=worker_chat("s1"))).text)
            )
            asked = next(c for c in first if c["type"] == "tool-approval-request")
            extra: dict[str, Any] = {EDITED_INPUT: {"path": "/edited"}}
            if secret is not None:
                extra["signature"] = asked["signature"]
            sent = worker_answer("s1", first[0]["messageId"], asked["approvalId"], True, **extra)
            response = await client.post(f"{b}/api/chat", json=sent)
            await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
            stored = (await client.get(f"{a}/api/sessions/s1")).json()
    assert response.status_code == 200, response.text
    assert worker_ran == ["/edited"]
    (shown,) = [p for m in stored["ui_messages"] for p in m["parts"] if p.get("toolCallId") == "D"]
    assert shown["input"] == {"path": "/edited"}
    assert shown["toolMetadata"] == {"axonOriginalInput": {"path": "/x"}}


async def test_a_worker_front_end_refuses_an_invalid_edit_and_records_nothing(
    pg_url: str, redis_url: str
):
    worker_ran.clear()
    async with deployment(pg_url, redis_url, approval_agent(), fronts=1) as d:
        (a,) = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = payloads(
                sse_events((await client.post(f"{a}/api/chat", json=worker_chat("s1"))).text)
            )
            asked = next(c for c in first if c["type"] == "tool-approval-request")
            before = await d.store.load("s1")
            sent = worker_answer(
                "s1",
                first[0]["messageId"],
                asked["approvalId"],
                True,
                **{EDITED_INPUT: {"path": 7}},
            )
            refused = await client.post(f"{a}/api/chat", json=sent)
            after = await d.store.load("s1")
            turns = await d.queue.turns("s1")
    assert refused.status_code == 400 and "path" in refused.json()["error"]
    assert before is not None and after is not None
    assert after.version == before.version and after.messages == before.messages
    assert [t.status for t in turns] == ["awaiting-input"]
    assert worker_ran == []


# -- the stored form, validated by the real `ai` package ----------------------------------

VALIDATE = """
const config = JSON.parse(process.argv[1]);
const { validateUIMessages } = await import(config.ai || "ai");
try {
  const messages = await validateUIMessages({ messages: config.messages });
  console.log(JSON.stringify({ messages }));
} catch (error) {
  console.log(JSON.stringify({ error: String((error && error.message) || error) }));
}
"""


async def test_the_ui_messages_of_edited_calls_pass_the_ai_packages_validation(node, ai):
    """``toolMetadata`` (a JSON object the UIMessage tool part has for the app's own
    data, in ``ai`` 6 and 7) says the call was approved with edits and keeps the model's
    input; ``input`` is the one that ran. An edited call that ran, and one approved with
    edits that waits for the other call's answer (``approval-responded``)."""
    ran.clear()
    three = [*TWO, *tool_call("delete_file", {"path": "/w"}, tool_call_id="F")]
    async with web_server(agent(three)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            d, *_ = [c for c in first if c != "[DONE]" and c["type"] == "tool-approval-request"]
            mid = first[0]["messageId"]
            part = approval_part(d["approvalId"], True)
            part["approval"][EDITED_INPUT] = {"path": "/z"}
            await client.post("/api/chat", json=answer("s", mid, part))
            waiting = (await client.get("/api/sessions/s")).json()["ui_messages"]
    config = json.dumps({"messages": waiting, **ai})
    with trio.fail_after(60):
        proc = await trio.run_process(
            [node, "--input-type=module", "-e", VALIDATE, config], capture_stdout=True, cwd=WEB
        )
    out = json.loads(proc.stdout)
    assert "error" not in out, out
    (shown,) = [p for m in out["messages"] for p in m["parts"] if p.get("toolCallId") == "D"]
    assert shown["state"] == "approval-responded" and shown["input"] == {"path": "/z"}
    assert shown["toolMetadata"] == {"axonOriginalInput": {"path": "/x"}}
    assert ran == []


async def test_a_body_answering_again_with_another_edit_is_refused():
    """The echo of a call approved with edits is taken only with the recorded edit: one
    with another edit is a second decision for a decided call (409), nothing recorded."""
    ran.clear()
    async with web_server(agent(TWO)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            d, e = [c for c in first if c != "[DONE]" and c["type"] == "tool-approval-request"]
            mid = first[0]["messageId"]
            part = approval_part(d["approvalId"], True)
            part["approval"][EDITED_INPUT] = {"path": "/z"}
            await client.post("/api/chat", json=answer("s", mid, part))
            before = (await client.get("/api/sessions/s")).json()
            other = {**part, "approval": {**part["approval"], EDITED_INPUT: {"path": "/q"}}}
            both = answer("s", mid, other)
            both["messages"][-1]["parts"].append(
                {**approval_part(e["approvalId"], True), "toolCallId": "E", "input": {"path": "/y"}}
            )
            r = await client.post("/api/chat", json=both)
            after = (await client.get("/api/sessions/s")).json()
    assert r.status_code == 409, r.text
    assert after == before and ran == []
