"""The approval path attacked as an attacker and as a careless user, on the embedded
app (docs/approval.md): the passed-up approval's descriptor forged under a valid
signature, one approval's signature put on the next, a deleted session's approval, a
lone surrogate in a reason, a decision at the very instant the wait expires, and the
relay losing a resumed stream while it holds its chunks back for signing. Each pins a
behaviour found to hold; none may run a tool twice, run one nobody approved, hang a
client or bring a session back."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from actors.relays import RedisRelay, attach_relay
from runtime import AlreadyDecided, Host
from runtime.app.web.answers import EDITED_INPUT
from runtime.app.web.ui_stream import ASKED_INPUT, ASKED_TOOL, ASKED_VIA
from runtime.errors import RelayTurnGone
from runtime.events import ToolApprovalDecided, TurnFinished
from runtime.output import ToolApprovalRequest
from tests import test_approval_signature_resume as gate_of
from tests.support.approval_tools import clear_ran, ran  # noqa: F401 (fixture)
from tests.support.redis import require_redis, unique_prefix
from tests.test_approval_expiry import agent as expiring_agent
from tests.test_approval_expiry import trio_wall
from tests.test_approval_nested_pass import ran as sub_ran
from tests.test_approval_signature_resume import (
    SECRET,
    gated_agent,
    seq_of_call,
)
from tests.test_approval_signature_resume import (
    fresh_gate as fresh_gate,  # (the fixture)
)
from tests.test_approval_web import DELETE, agent, answer, approval_part, post, request_of
from tests.test_approval_web import ran as web_ran
from tests.test_approval_web_nested_edits import helper_part
from tests.test_relay_web import chat_body, sse_events
from tests.test_web_http import body
from tests.web.harness import web_server

JSON = {"content-type": "application/json"}


@pytest.fixture(autouse=True)
def _clear_sub_ran() -> None:
    sub_ran.clear()
    web_ran.clear()


# -- (1) the descriptor is not signed: a forged one decides nothing ----------------------


async def test_a_forged_descriptor_under_a_valid_signature_checks_and_runs_the_stored_call():
    """The signature covers the agent tool's call, not ``approvalDescriptor``, which the
    client echoes. Signatures required, the request's own signature kept and the
    descriptor forged (another tool, input and agents between): an edit fitting the
    forged tool is a 400 naming the stored one, nothing recorded; an edit of the stored
    call goes through and is what runs, in the sub-agent's ``wire_money``, once."""
    from tests.test_approval_nested_pass import parent

    forged = {ASKED_TOOL: "delete_everything", ASKED_INPUT: {"path": "/"}, ASKED_VIA: ["ghost"]}
    options = {"approval_secret": "nested-secret", "require_approval_signature": True}
    async with web_server(parent(), **options) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            mid = first[0]["messageId"]
            approval = {
                "id": asked["approvalId"],
                "signature": asked["signature"],
                "descriptor": forged,
            }
            refused = await client.post(
                "/api/chat",
                json=answer("s", mid, helper_part({**approval, EDITED_INPUT: {"path": "/"}})),
            )
            still = (await client.get("/api/sessions/s")).json()["waiting"]
            taken = await client.post(
                "/api/chat",
                json=answer("s", mid, helper_part({**approval, EDITED_INPUT: {"to": "y"}})),
            )
    assert refused.status_code == 400 and "wire_money" in refused.text, refused.text
    assert still == 1
    assert taken.status_code == 200, taken.text
    assert sub_ran == ["y"]


async def test_a_passed_up_approvals_signature_does_not_answer_the_next_one_on_the_same_call():
    """A sub-agent asks twice on one calling call: the continuation's second request has
    the same ``toolCallId``, tool and input, but its own approval id, and is signed over
    the stored call, so the live client answers it where signatures are required (before,
    the continuation's encoder, told the call was known, had no input to sign it over:
    it went out unsigned, and the client's answer was a 403 until a reload). The first
    request's signature (a page holding the old card) is a 403 for it and records
    nothing; its own goes through."""
    from runtime.app.web.signing import ApprovalSigner
    from tests.test_approval_nested_pass_many import _calling, _pays_twice_model

    options = {"approval_secret": "nested-secret", "require_approval_signature": True}
    async with web_server(_calling(_pays_twice_model), **options) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            mid = first[0]["messageId"]
            both = "pay x and y"
            sign = {"id": asked["approvalId"], "signature": asked["signature"]}
            second = await post(client, answer("s", mid, helper_part(sign, both)))
            again = request_of(second)
            stale = {"id": again["approvalId"], "signature": asked["signature"]}
            refused = await client.post(
                "/api/chat", json=answer("s", mid, helper_part(stale, both))
            )
            own = {"id": again["approvalId"], "signature": again.get("signature")}
            taken = await client.post("/api/chat", json=answer("s", mid, helper_part(own, both)))
    assert again["approvalId"] != asked["approvalId"]
    signer = ApprovalSigner(secret=b"nested-secret")
    assert again.get("signature") == signer.sign(
        "s", again["approvalId"], "H", "helper", {"input": both}
    )
    assert refused.status_code == 403, refused.text
    assert taken.status_code == 200, taken.text
    assert sorted(sub_ran) == ["x", "y"]


# -- decisions a careless client or an attacker sends ------------------------------------


async def test_an_approval_of_a_deleted_session_is_404_and_brings_nothing_back():
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("d"))
            asked, mid = request_of(first), first[0]["messageId"]
            deleted = await client.delete("/api/sessions/d", headers=JSON)
            late = await client.post(
                "/api/chat", json=answer("d", mid, approval_part(asked["approvalId"], True))
            )
            shown = await client.get("/api/sessions/d")
    assert deleted.status_code == 204
    assert late.status_code == 404, late.text
    assert shown.status_code == 404
    assert web_ran == []


async def test_a_guessed_approval_id_of_another_session_is_told_apart_from_no_id_at_all():
    """Approval ids are sequential within a process (``approval_<prefix>_<n>``): an
    attacker who sees its own can guess a neighbour's. Posted on the attacker's own
    session, the victim's real id and an id that exists nowhere get the same 404 (the
    id aside: no oracle of which ids exist), nothing is recorded, and the victim's call
    still waits and runs only on its own answer."""
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            victim = await post(client, body("victim"))
            mine = await post(client, body("attacker"))
            theirs = request_of(victim)["approvalId"]
            prefix, _, n = request_of(mine)["approvalId"].rpartition("_")
            nowhere = f"{prefix}_{int(n) + 1000}"
            mid = mine[0]["messageId"]
            replies = [
                await client.post(
                    "/api/chat", json=answer("attacker", mid, approval_part(key, True))
                )
                for key in (theirs, nowhere)
            ]
            waiting = (await client.get("/api/sessions/victim")).json()["waiting"]
    assert [r.status_code for r in replies] == [404, 404]
    texts = [r.json()["error"] for r in replies]
    assert texts[0].replace(theirs, "ID") == texts[1].replace(nowhere, "ID")
    assert waiting == 1 and web_ran == []


async def test_a_decision_replayed_after_the_turn_finished_is_409_and_runs_nothing_again():
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked, mid = request_of(first), first[0]["messageId"]
            done = await client.post(
                "/api/chat", json=answer("s", mid, approval_part(asked["approvalId"], True))
            )
            replays = [
                await client.post(
                    "/api/chat", json=answer("s", mid, approval_part(asked["approvalId"], yes))
                )
                for yes in (True, False)
            ]
    assert done.status_code == 200
    assert [r.status_code for r in replays] == [409, 409]
    assert web_ran == ["/x"]


async def test_a_continuation_its_client_never_reads_runs_the_tool_once_and_saves_the_answer():
    """The client posts its approval and never reads a byte of the continuation (a
    frozen tab, a script that fires and forgets), holding the connection open while the
    answer (3 MB) fills the socket: the turn still runs the tool once and ends saved
    whole, not interrupted."""
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent
    from tests.test_approval_web import delete_file

    steps = [DELETE, ["y" * 3_000_000]]
    big = Agent(provider=ScriptedProvider(steps, chunk_size=1000), tools=[delete_file])
    async with web_server(big, send_timeout=2.0) as server:
        finished = server.host.bus.subscribe([TurnFinished], name="finished")
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first = await post(client, body("s"))
            asked, mid = request_of(first), first[0]["messageId"]
            await finished.inbox.get()  # (the turn that asked)
            sent = answer("s", mid, approval_part(asked["approvalId"], True))
            async with client.stream("POST", "/api/chat", json=sent) as response:
                status = response.status_code  # (headers only: the body is never read)
                with trio.fail_after(30):
                    await finished.inbox.get()
            shown = (await client.get("/api/sessions/s")).json()
    assert status == 200
    assert web_ran == ["/x"]
    assert shown["waiting"] == 0
    answer_part = shown["ui_messages"][-1]
    assert answer_part["metadata"]["interrupted"] is False
    assert [len(p["text"]) for p in answer_part["parts"] if p["type"] == "text"] == [3_000_000]


@pytest.mark.parametrize(
    "reason", ["\\ud800 half", "a \\udfff b", "\\ud83d", "tail \\ud83d\\ud83d"]
)
async def test_a_reason_holding_half_a_character_is_a_400_and_the_call_still_waits(reason):
    """A denial whose reason holds a lone surrogate escape (half an emoji a client cut):
    the body is refused whole, saying why, nothing is recorded, and the call can still
    be answered."""
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked, mid = request_of(first), first[0]["messageId"]
            sent = answer("s", mid, approval_part(asked["approvalId"], False, reason="R"))
            raw = json.dumps(sent).replace('"reason": "R"', f'"reason": "{reason}"')
            refused = await client.post("/api/chat", content=raw, headers=JSON)
            waiting = (await client.get("/api/sessions/s")).json()["waiting"]
            fine = answer("s", mid, approval_part(asked["approvalId"], False, reason="no 😀"))
            taken = await client.post("/api/chat", json=fine)
    assert refused.status_code == 400 and "half a character" in refused.text
    assert waiting == 1
    assert taken.status_code == 200, taken.text
    assert web_ran == []


@pytest.mark.parametrize("offset", [-1e-6, 0.0, 1e-6])
async def test_a_decision_at_the_instant_the_wait_expires_is_either_taken_or_expired_not_both(
    autojump_clock, offset
):
    """The host's timer and a person's approval land at the deadline's instant (and a
    hair either side): exactly one decision is recorded, the continuation runs once,
    and the tool ran exactly when the person's decision was taken."""
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        decided = host.bus.subscribe([ToolApprovalDecided], name="decided")
        finished = host.bus.subscribe([TurnFinished], name="finished")
        session = await host.open_session(expiring_agent(60), session_id="s")
        first = await session.run("go")
        await trio.sleep(60 + offset - trio.current_time() + 0.0)
        try:
            await session.respond(first.pending[0].approval_id, approved=True)
            taken = True
        except AlreadyDecided:  # (WaitExpired, or the timer recorded it first)
            taken = False
        await trio.sleep(30)
        await trio.testing.wait_all_tasks_blocked()
        seen = []
        while True:
            try:
                seen.append(decided.inbox.get_nowait())
            except trio.WouldBlock:
                break
        turns = 0
        while True:
            try:
                finished.inbox.get_nowait()
                turns += 1
            except trio.WouldBlock:
                break
    assert len(seen) == 1 and seen[0].approved is taken
    assert turns == 2  # the turn that asked, and one continuation
    assert ran == (["/x"] if taken else [])
    if offset < 0:
        assert taken


# -- (4) the relay loses the turn while a resumed stream holds its chunks ---------------


class LosesAfterRequest:
    """The real relay, except that a read with ``after_seq`` (a resume) loses the turn
    (:class:`RelayTurnGone`, as when Redis expired or lost the stream) right after it
    gave the approval request: what the resumed stream holds back for signing then."""

    def __init__(self, relay: Any) -> None:
        self._relay = relay

    def __getattr__(self, name: str) -> Any:
        return getattr(self._relay, name)

    def read(self, turn_id: str, **kwargs: Any) -> Any:
        inner = self._relay.read(turn_id, **kwargs)
        if kwargs.get("after_seq") is None:
            return inner

        async def losing() -> Any:
            async for chunk in inner:
                yield chunk
                if type(chunk) is ToolApprovalRequest:
                    raise RelayTurnGone(f"the relay's stream of turn {turn_id!r} was lost")

        return losing()


async def resumed_while_released(
    client: httpx.AsyncClient, chat_url: str, stream_url: str, gate: trio.Event
) -> list[Any]:
    """POST ``chat_body("s")`` to ``chat_url``; once call D's input shows on the stream,
    resume ``stream_url`` after it and let ``gate`` go: the resumed stream's events, once
    the POST is back (the turn waits). A resume that hangs fails after 20 s."""
    resumed: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: client.post(chat_url, json=chat_body("s")))
        after = await seq_of_call(client, stream_url, "D")

        async def resume() -> None:
            with trio.fail_after(20):  # (a hang fails here)
                r = await client.get(stream_url, headers={"last-event-id": after})
            resumed.extend(sse_events(r.text))

        nursery.start_soon(resume)
        await trio.sleep(0.3)  # (the resume reading; the result does not rest on it)
        gate.set()
    return resumed


async def test_a_resume_whose_relay_loses_the_turn_while_it_holds_the_request_ends_clean(
    tmp_path: Any,
) -> None:
    """A stream resumed after the call's input holds the approval request back (it signs
    it once the turn ended); the relay loses the turn meanwhile. The client gets one
    ``error`` telling it to reload the session and ``[DONE]``, never the unsigned request
    nor a hang; the reload gives the request signed, and answering it runs the tool
    once."""
    from runtime.app.web.signing import ApprovalSigner

    redis_url = require_redis()
    async with (
        RedisRelay.open(redis_url, prefix=unique_prefix()) as real,
        web_server(
            gated_agent(),
            store=str(tmp_path / "w.db"),
            relay=LosesAfterRequest(real),
            approval_secret=SECRET,
            require_approval_signature=True,
        ) as server,
    ):
        await attach_relay(server.host, real)
        stream_url = f"{server.url}/api/chat/s/stream"
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            resumed = await resumed_while_released(
                client, f"{server.url}/api/chat", stream_url, gate_of.gate
            )
            ui = (await client.get("/api/sessions/s")).json()["ui_messages"]
            part = next(p for m in ui for p in m["parts"] if p.get("toolCallId") == "D")
            approval = part["approval"]
            mid = ui[-1]["id"]
            reply = {
                **part,
                "state": "approval-responded",
                "approval": {**approval, "approved": True},
            }
            done = await client.post("/api/chat", json=answer("s", mid, reply))
    kinds = [d if d == "[DONE]" else d["type"] for _, d in resumed]
    assert "tool-approval-request" not in kinds
    assert kinds[-2:] == ["error", "[DONE]"], kinds
    assert "reload the session" in resumed[-2][1]["errorText"]
    assert approval["signature"] == ApprovalSigner(secret=SECRET.encode()).sign(
        "s", approval["id"], "D", "delete_file", {"path": "/x", "n": 1}
    )
    assert done.status_code == 200, done.text
    assert ran == ["/x"]
