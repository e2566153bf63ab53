"""The worker deployment's approval path attacked as an attacker and as a careless user
(docs/approval.md, "The worker deployment"): real PostgreSQL and Redis (the suite's own
servers), front ends and a worker in this process. Each decision below is one a client
can send; none may run a tool twice, run one nobody approved, or bring a session back."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from runtime.messages import ToolMessage
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import (
    _clear_ran as _clear_ran,  # (the fixture)
)
from tests.test_worker_approval import (
    answer,
    approval_agent,
    asked,
    first_part,
    payloads,
    ran,
)
from tests.test_worker_approval import (
    redis_url as redis_url,  # (the fixture)
)

JSON = {"content-type": "application/json"}


async def test_the_same_approval_from_two_front_ends_at_once_runs_the_tool_once(
    pg_url: str, redis_url: str
) -> None:
    """Two tabs (or a double click through two front ends) approve the same call at the
    same moment: both answers are the same, so the loser is a repeat, not a conflict;
    whatever each is told, the turn resumes once and the tool runs once."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        answers: list[httpx.Response] = []

        async def approve(url: str) -> None:
            async with httpx.AsyncClient(timeout=LIMIT) as client:
                sent = answer("s1", message_id, approval_id, True)
                answers.append(await client.post(f"{url}/api/chat", json=sent))

        async with trio.open_nursery() as nursery:
            for url in d.urls:
                nursery.start_soon(approve, url)
        turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        record = await d.store.load("s1")
    assert sorted(r.status_code for r in answers)[0] == 200, [r.text for r in answers]
    assert all(r.status_code in (200, 409) for r in answers), [r.text for r in answers]
    assert turn is not None and turn.resumes == 1
    assert ran == ["/x"]
    assert record is not None
    assert len([m for m in record.messages if isinstance(m, ToolMessage)]) == 1


async def test_a_decision_replayed_after_the_turn_finished_is_409_and_runs_nothing_again(
    pg_url: str, redis_url: str
) -> None:
    """A client sends its approval again once the turn is over (a retry, a stale tab, an
    attacker replaying a captured body), the same answer or the other one: 409 on either
    front end, no second resume, the tool not run again, the session unchanged."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            done = await client.post(
                f"{d.urls[0]}/api/chat", json=answer("s1", message_id, approval_id, True)
            )
            turn_id = (await d.queue.turns("s1"))[0].turn_id
            await d.queue.wait_finished(turn_id, LIMIT)
            before = await d.store.load("s1")
            replays = [
                await client.post(
                    f"{url}/api/chat", json=answer("s1", message_id, approval_id, approved)
                )
                for url in d.urls
                for approved in (True, False)
            ]
        after = await d.store.load("s1")
        turn = await d.queue.get(turn_id)
    assert done.status_code == 200
    assert [r.status_code for r in replays] == [409] * 4, [r.text for r in replays]
    assert turn is not None and turn.resumes == 1
    assert ran == ["/x"]
    assert before is not None and after is not None and after.version == before.version


async def test_an_approval_of_a_deleted_session_is_404_and_brings_nothing_back(
    pg_url: str, redis_url: str
) -> None:
    """The session whose turn waits is deleted (another tab, an operator); the page
    still holding its request approves it on another front end: 404, the tool does not
    run, no queue row resumes and no session is stored again under that id."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            deleted = await client.delete(f"{d.urls[0]}/api/sessions/s1", headers=JSON)
            late = await client.post(
                f"{d.urls[1]}/api/chat", json=answer("s1", message_id, approval_id, True)
            )
            shown = await client.get(f"{d.urls[1]}/api/sessions/s1")
        await trio.sleep(0.5)  # (a resume the decision would have queued: none runs)
        record = await d.store.load("s1")
        turns = await d.queue.turns("s1")
    assert deleted.status_code == 204, deleted.text
    assert late.status_code == 404, late.text
    assert shown.status_code == 404
    assert record is None
    assert all(not t.waiting and t.resumes == 0 for t in turns)
    assert ran == []


async def test_a_guessed_approval_id_of_another_session_is_no_oracle_on_a_front_end(
    pg_url: str, redis_url: str
) -> None:
    """The victim's real approval id and one that exists nowhere, each posted on the
    attacker's own session through the other front end: the same 404 (the id aside),
    nothing recorded, the victim's turn still waiting."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        theirs = asked(await first_part(d, d.urls[0], "victim"))["approvalId"]
        mine = await first_part(d, d.urls[0], "attacker")
        prefix, _, n = asked(mine)["approvalId"].rpartition("_")
        nowhere = f"{prefix}_{int(n) + 1000}"
        mid = payloads(mine)[0]["messageId"]
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            replies = [
                await client.post(f"{d.urls[1]}/api/chat", json=answer("attacker", mid, key, True))
                for key in (theirs, nowhere)
            ]
        victim = (await d.queue.turns("victim"))[-1]
    assert [r.status_code for r in replies] == [404, 404], [r.text for r in replies]
    texts = [r.json()["error"] for r in replies]
    assert texts[0].replace(theirs, "ID") == texts[1].replace(nowhere, "ID")
    assert victim.waiting and ran == []


async def test_a_continuation_its_client_never_reads_still_runs_once_and_finishes(
    pg_url: str, redis_url: str
) -> None:
    """The client posts its approval and never reads the response (a script that
    fires and forgets, a tab frozen in the background): the turn is the worker's, not
    the connection's, so it resumes, runs the tool once and finishes; a reload shows
    the answer."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=1) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        turn_id = (await d.queue.turns("s1"))[0].turn_id
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            sent = answer("s1", message_id, approval_id, True)
            async with client.stream("POST", f"{d.urls[0]}/api/chat", json=sent) as response:
                status = response.status_code  # (headers only: not one byte of the body)
                turn = await d.queue.wait_finished(turn_id, LIMIT)
            shown = (await client.get(f"{d.urls[0]}/api/sessions/s1")).json()
    assert status == 200
    assert turn is not None and turn.status == "done" and turn.resumes == 1
    assert ran == ["/x"]
    texts = [p.get("text", "") for m in shown["ui_messages"] for p in m["parts"]]
    assert any(t.startswith("Result: deleted /x.") for t in texts)


async def test_a_sub_agents_second_approval_in_a_continuation_is_signed_on_a_front_end(
    pg_url: str, redis_url: str
) -> None:
    """The worker deployment's continuation of a passed-up approval that asks again on
    the same calling call: its new request is signed over the stored call (the front end
    holds it back until the turn waits, then signs it from the store), so the live client
    answers it where signatures are required, and both sub calls run once."""
    from runtime.app.web.signing import ApprovalSigner
    from tests.test_approval_nested_pass import ran as sub_ran
    from tests.test_approval_nested_pass_many import _calling, _pays_twice_model
    from tests.test_approval_web_nested_edits import helper_part

    secret = "front-secret"
    sub_ran.clear()
    async with deployment(pg_url, redis_url, _calling(_pays_twice_model), fronts=0) as d:
        d.app_options = {"approval_secret": secret, "require_approval_signature": True}
        await d.start_front_end()
        await d.start_front_end()
        both = "pay x and y"
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = payloads(
                sse_events((await client.post(f"{d.urls[0]}/api/chat", json=_go())).text)
            )
            request = asked_of(first)
            mid = first[0]["messageId"]
            own = {"id": request["approvalId"], "signature": request["signature"]}
            r = await client.post(f"{d.urls[1]}/api/chat", json=_reply(mid, helper_part(own, both)))
            second = payloads(sse_events(r.text))
            again = asked_of(second)
            own = {"id": again["approvalId"], "signature": again.get("signature")}
            done = await client.post(
                f"{d.urls[0]}/api/chat", json=_reply(mid, helper_part(own, both))
            )
    signer = ApprovalSigner(secret=secret.encode())
    assert again["approvalId"] != request["approvalId"]
    assert again.get("signature") == signer.sign(
        "s", again["approvalId"], "H", "helper", {"input": both}
    )
    assert done.status_code == 200, done.text
    assert sorted(sub_ran) == ["x", "y"]


def _go() -> dict[str, Any]:
    return {
        "id": "s",
        "messages": [{"id": "u0", "role": "user", "parts": [{"type": "text", "text": "go"}]}],
        "trigger": "submit-message",
    }


def _reply(message_id: str, part: dict[str, Any]) -> dict[str, Any]:
    sent = _go()
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


def asked_of(chunks: list[Any]) -> dict[str, Any]:
    return next(c for c in chunks if c["type"] == "tool-approval-request")


async def test_a_front_ends_resume_whose_relay_loses_the_turn_while_it_holds_the_request_ends_clean(
    pg_url: str, redis_url: str
) -> None:
    """A worker front end's stream resumed after the call's input holds the approval
    request back to sign it; the relay loses the turn there. The client gets one
    ``error`` telling it to reload and ``[DONE]`` (no hang, no unsigned request, nothing
    twice); the reload's request is signed and its answer runs the tool once."""
    from tests import test_approval_signature_resume as gated
    from tests.test_approval_signature_resume import SECRET, gated_agent
    from tests.test_approval_wait_attacks import LosesAfterRequest, resumed_while_released
    from tests.test_relay_web import chat_body

    gated.gate = trio.Event()
    gated.ran.clear()
    async with deployment(pg_url, redis_url, gated_agent(), fronts=0) as d:
        d.app_options = {"approval_secret": SECRET, "require_approval_signature": True}
        url = await d.start_front_end()
        front = d.fronts[0]
        front.relay = LosesAfterRequest(front.relay)
        stream_url = f"{url}/api/chat/s/stream"
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            resumed = await resumed_while_released(
                client, f"{url}/api/chat", stream_url, gated.gate
            )
            ui = (await client.get(f"{url}/api/sessions/s")).json()["ui_messages"]
            part = next(p for m in ui for p in m["parts"] if p.get("toolCallId") == "D")
            reply = {
                **part,
                "state": "approval-responded",
                "approval": {**part["approval"], "approved": True},
            }
            sent = chat_body("s")
            sent["messages"].append(
                {"id": ui[-1]["id"], "role": "assistant", "parts": [{"type": "step-start"}, reply]}
            )
            sent["messageId"] = ui[-1]["id"]
            done = await client.post(f"{url}/api/chat", json=sent)
            await d.queue.wait_finished((await d.queue.turns("s"))[-1].turn_id, LIMIT)
    kinds = [e if e == "[DONE]" else e["type"] for _, e in resumed]
    assert "tool-approval-request" not in kinds
    assert kinds[-2:] == ["error", "[DONE]"], kinds
    assert "reload the session" in resumed[-2][1]["errorText"]
    assert "signature" in part["approval"]
    assert done.status_code == 200, done.text
    assert gated.ran == ["/x"]


async def test_an_approval_posted_while_no_worker_runs_streams_once_a_worker_comes_back(
    pg_url: str, redis_url: str
) -> None:
    """Every worker is down (a deploy, a crash) when the person approves: the front end
    records the decision and its POST waits on the queue instead of failing; the worker
    started afterwards resumes the turn once, and that same POST streams the
    continuation in the same message, the tool run once."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        await d.stop_workers()
        got: list[httpx.Response] = []
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def approve() -> None:
                    sent = answer("s1", message_id, approval_id, True)
                    got.append(await client.post(f"{d.urls[1]}/api/chat", json=sent))

                nursery.start_soon(approve)
                await _decided(d, "s1")
                assert ran == []  # decided, and nothing runs it yet
                await d.start_worker()
        turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
    (response,) = got
    assert response.status_code == 200, response.text
    events = payloads(sse_events(response.text))
    assert events[0] == {"type": "start", "messageId": message_id}
    assert any(e["type"] == "tool-output-available" for e in events)
    assert turn is not None and turn.resumes == 1
    assert ran == ["/x"]


async def _decided(d: Any, session_id: str) -> None:
    """Until the session's turn no longer waits (a decision put its row back)."""
    with trio.fail_after(LIMIT):
        while True:
            if not (await d.queue.turns(session_id))[-1].waiting:
                return
            await trio.sleep(0.05)
