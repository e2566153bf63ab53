"""A sub-agent's approval passed up (``as_tool(pass_approvals=True)``) over the AI SDK
stream and UI messages: the ``tool-approval-request`` of the agent tool's call carries
``approvalDescriptor: {"axonAskedTool", "axonAskedInput"}`` (the sub call the person
approves, and what an edit is of), which the real ``ai`` package (7 and 6) keeps as the
tool part's ``approval.descriptor``; ``GET /api/sessions/{id}``'s ``ui_messages`` give the
stored part the same, and once approved with edits ``toolMetadata.axonAskedEditedInput``.
An edit sent as ``approval.axonEditedInput`` runs once in the sub-agent
(docs/approval.md, "Approving with edits", "The page")."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from runtime import Host
from runtime import output as o
from runtime.app.web.answers import EDITED_INPUT
from runtime.app.web.resume import stored_turn_chunks
from runtime.app.web.ui_stream import (
    ASKED_EDIT,
    ASKED_INPUT,
    ASKED_TOOL,
    ASKED_VIA,
    UIStreamEncoder,
)
from runtime.output import ToolApprovalRequest
from runtime.serde import from_json, to_json
from tests.test_approval_nested_pass import SUB, parent, ran
from tests.test_approval_node import ai as ai  # the fixtures
from tests.test_approval_node import node as node
from tests.test_approval_web import DELETE, agent, answer, post, request_of
from tests.test_approval_web_edits import VALIDATE
from tests.test_web_http import body
from tests.web.harness import WEB, run_node_script, web_server

ASKED = {ASKED_TOOL: "wire_money", ASKED_INPUT: {"to": "x"}}
"""The descriptor of ``parent()``'s passed-up approval: helper's ``wire_money({"to": "x"})``."""


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def helper_part(approval: dict[str, Any], said: str = "pay x") -> dict[str, Any]:
    """The agent tool's part (its prompt ``said``) as a client answers it, ``approval``
    as it got it."""
    return {
        "type": "tool-helper",
        "toolCallId": "H",
        "state": "approval-responded",
        "input": {"input": said},
        "approval": {**approval, "approved": True},
    }


def part_of(ui: list[dict[str, Any]], call: str) -> dict[str, Any]:
    (found,) = [p for m in ui for p in m.get("parts", ()) if p.get("toolCallId") == call]
    return found


async def validated(node: str, ai: dict[str, str], messages: Any) -> Any:
    """``messages`` through the ``ai`` package's validateUIMessages: what it gives back."""
    config = json.dumps({"messages": messages, **ai})
    with trio.fail_after(60):
        proc = await trio.run_process(
            [node, "--input-type=module", "-e", VALIDATE, config], capture_stdout=True, cwd=WEB
        )
    out = json.loads(proc.stdout)
    assert "error" not in out, out
    return out["messages"]


async def test_the_stream_and_the_ui_messages_name_the_call_a_passed_up_approval_asks_for():
    async with web_server(parent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            waiting = (await client.get("/api/sessions/s")).json()["ui_messages"]
            mid = first[0]["messageId"]
            sent = answer(s := "s", mid, helper_part(part_of(waiting, "H")["approval"]))
            sent["messages"][-1]["parts"][-1]["approval"][EDITED_INPUT] = {"to": "y"}
            r = await client.post("/api/chat", json=sent)
            done = (await client.get(f"/api/sessions/{s}")).json()["ui_messages"]
            sub = await server.host.store.load(SUB)
    assert asked["toolCallId"] == "H" and asked["approvalDescriptor"] == ASKED
    shown = part_of(waiting, "H")
    assert shown["state"] == "approval-requested" and shown["input"] == {"input": "pay x"}
    assert shown["approval"]["descriptor"] == ASKED  # as the stream's request had it
    assert "toolMetadata" not in shown
    assert r.status_code == 200, r.text
    assert ran == ["y"]  # once, the edit, in the sub-agent
    ran_part = part_of(done, "H")
    assert ran_part["state"] == "output-available" and ran_part["input"] == {"input": "pay x"}
    assert ran_part["approval"]["descriptor"] == ASKED  # the model's, what was asked
    assert ran_part["toolMetadata"] == {ASKED_EDIT: {"to": "y"}}  # what ran
    assert sub is not None and "wire_money" in repr(sub.messages)


async def test_a_call_that_asks_for_itself_carries_no_descriptor():
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            asked = request_of(await post(client, body("s")))
            ui = (await client.get("/api/sessions/s")).json()["ui_messages"]
    assert "approvalDescriptor" not in asked
    assert "descriptor" not in part_of(ui, "D")["approval"]


async def test_a_plain_approval_of_a_passed_up_approval_has_no_edit_in_the_ui_messages():
    async with web_server(parent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            mid = first[0]["messageId"]
            approval = {"id": request_of(first)["approvalId"], "descriptor": ASKED}
            r = await client.post("/api/chat", json=answer("s", mid, helper_part(approval)))
            done = (await client.get("/api/sessions/s")).json()["ui_messages"]
    assert r.status_code == 200, r.text
    assert ran == ["x"]
    assert "toolMetadata" not in part_of(done, "H")


async def test_the_ai_package_keeps_the_asking_call_and_validates_the_stored_parts(node, ai):
    """``ai`` 7 and 6: the stream's request read by the package's own client (its chunk
    schema, readUIMessageStream through AbstractChat) keeps the descriptor as
    ``approval.descriptor`` and sends it back with the answer (plus the edit a page adds);
    the edit runs once; validateUIMessages keeps the descriptor and ``toolMetadata`` of
    the stored parts, waiting and approved with edits."""
    async with web_server(parent()) as server:
        chat = await run_node_script(
            node,
            WEB / "approve_chat.mjs",
            {"url": server.url, "chatId": "s", "approved": True, "editedInput": {"to": "y"}, **ai},
        )
        async with httpx.AsyncClient(base_url=server.url) as client:
            done = (await client.get("/api/sessions/s")).json()
    assert chat["error"] is None and chat["status"] == "ready", chat
    _, second = chat["bodies"]
    sent = part_of(second["messages"], "H")
    assert sent["approval"]["descriptor"] == ASKED  # kept by the package, sent back
    assert sent["approval"][EDITED_INPUT] == {"to": "y"}
    kept = part_of([chat["messages"][-1]], "H")
    assert kept["approval"]["descriptor"] == ASKED and kept["state"] == "output-available"
    assert ran == ["y"]
    checked = part_of(await validated(node, ai, done["ui_messages"]), "H")
    assert checked["approval"]["descriptor"] == ASKED
    assert checked["toolMetadata"] == {ASKED_EDIT: {"to": "y"}}


async def test_the_waiting_ui_messages_of_a_passed_up_approval_pass_validation(node, ai):
    async with web_server(parent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            waiting = (await client.get("/api/sessions/s")).json()["ui_messages"]
    checked = part_of(await validated(node, ai, waiting), "H")
    assert checked["state"] == "approval-requested"
    assert checked["approval"]["descriptor"] == ASKED
    assert ran == []


async def test_the_ai_packages_chunk_schema_keeps_the_descriptor_of_the_request(node):
    """The chunk as the encoder makes it, parsed by the pinned package's
    uiMessageChunkSchema and built into a message by readUIMessageStream (both packages
    read it through AbstractChat above)."""
    encoder = UIStreamEncoder()
    chunks = [
        o.Start(message_id="m"),
        o.StepStart(step=0),
        o.ToolCall(step=0, tool_call_id="H", tool_name="helper", input={"input": "pay x"}),
        ToolApprovalRequest(
            step=0,
            tool_call_id="H",
            tool_name="helper",
            approval_id="ap",
            asked_tool="wire_money",
            asked_input={"to": "x"},
        ),
    ]
    sse = b"".join(encoder.events(c) for c in chunks).decode()
    out = await run_node_script(node, WEB / "read_stream.mjs", {"sse": sse, "read": True})
    assert all(p["success"] for p in out["parsed"]), out["parsed"]
    (request,) = [
        p["value"] for p in out["parsed"] if p["value"]["type"] == "tool-approval-request"
    ]
    assert request["approvalDescriptor"] == ASKED
    assert out["error"] is None
    (part,) = [p for p in out["message"]["parts"] if p.get("toolCallId") == "H"]
    assert part["approval"] == {"id": "ap", "descriptor": ASKED}


def test_the_chunk_keeps_its_json_unless_it_names_an_asking_call():
    plain = ToolApprovalRequest(step=0, tool_call_id="D", tool_name="t", approval_id="a")
    assert b"asked" not in to_json(plain)
    asked = ToolApprovalRequest(
        step=0,
        tool_call_id="H",
        tool_name="helper",
        approval_id="a",
        asked_tool="wire_money",
        asked_input={"to": "x"},
    )
    back = from_json(to_json(asked), ToolApprovalRequest)
    assert back == asked and back.asked_input == {"to": "x"}


async def test_a_stream_rebuilt_from_the_store_names_the_asking_call(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        await session.run("go")
        record = await host.store.load("s")
    assert record is not None
    (request,) = [c for c in stored_turn_chunks(record.messages) if type(c) is ToolApprovalRequest]
    assert (request.asked_tool, request.asked_input) == ("wire_money", {"to": "x"})
    (ui,) = [u for u in UIStreamEncoder().encode(request)]
    assert ui["approvalDescriptor"] == ASKED


async def test_a_takeover_of_a_turn_waiting_for_a_passed_up_approval_names_the_asking_call():
    """A durable turn taken over (``resume=True``) that still waits streams its step again
    (``_show_waiting``): its request names the sub call too, as the first stream's did."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        ids = {"turn_id": "turn_w", "message_id": "msg_w", "resume": True}
        streams = []
        for _ in range(2):
            async with session.stream("go", **ids) as out:
                streams.append([c async for c in out if type(c) is ToolApprovalRequest])
    first, again = streams
    assert [(c.approval_id, c.asked_tool, c.asked_input) for c in again] == [
        (c.approval_id, "wire_money", {"to": "x"}) for c in first
    ]
    assert len(first) == 1 and ran == []


async def test_a_second_approval_the_same_call_passes_up_names_its_own_sub_call():
    """A sub-step asking for two approvals passes them up one at a time on the same
    agent tool's call: the continuation's new request (same ``toolCallId``, a new
    ``approvalId``) names the second sub call, and the reloaded part asks for it with no
    edit of the first left on it; each edit runs in its own call."""
    from tests.test_approval_nested_pass_many import _calling, _pays_twice_model

    async with web_server(_calling(_pays_twice_model)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            mid = first[0]["messageId"]
            both = "pay x and y"
            part = helper_part(
                {"id": asked["approvalId"], "descriptor": asked["approvalDescriptor"]}, both
            )
            part["approval"][EDITED_INPUT] = {"to": "x2"}
            second = await post(client, answer("s", mid, part))
            again = request_of(second)
            ui = (await client.get("/api/sessions/s")).json()["ui_messages"]
            part = helper_part(
                {"id": again["approvalId"], "descriptor": again["approvalDescriptor"]}, both
            )
            part["approval"][EDITED_INPUT] = {"to": "y2"}
            r = await client.post("/api/chat", json=answer("s", mid, part))
    assert asked["approvalDescriptor"] == ASKED
    assert again["toolCallId"] == "H" and again["approvalId"] != asked["approvalId"]
    assert again["approvalDescriptor"] == {ASKED_TOOL: "wire_money", ASKED_INPUT: {"to": "y"}}
    shown = part_of(ui, "H")
    assert shown["state"] == "approval-requested"
    assert shown["approval"]["descriptor"] == again["approvalDescriptor"]
    assert "toolMetadata" not in shown
    assert r.status_code == 200, r.text
    assert sorted(ran) == ["x2", "y2"]


async def test_a_signed_edit_of_a_passed_up_approval_verifies_where_signatures_are_required():
    """The signature is over the agent tool's call as streamed (the descriptor and the
    edit beside it decide nothing of it): a required signature with an edit goes through;
    the same answer without it is a 403 that records nothing."""
    options = {"approval_secret": "nested-secret", "require_approval_signature": True}
    async with web_server(parent(), **options) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            mid = first[0]["messageId"]
            approval = {
                "id": asked["approvalId"],
                "descriptor": asked["approvalDescriptor"],
                EDITED_INPUT: {"to": "y"},
            }
            unsigned = await client.post("/api/chat", json=answer("s", mid, helper_part(approval)))
            approval["signature"] = asked["signature"]
            signed = await client.post("/api/chat", json=answer("s", mid, helper_part(approval)))
    assert unsigned.status_code == 403 and "no signature" in unsigned.text
    assert signed.status_code == 200, signed.text
    assert ran == ["y"]


async def test_a_descriptor_the_client_altered_decides_nothing():
    """The descriptor comes back from the client: one that names another tool or input
    changes nothing. The edit is checked against the sub call the store holds (a key
    ``wire_money`` does not take is still a 400, nothing recorded), and what runs is
    ``wire_money`` with the edit."""
    forged = {ASKED_TOOL: "delete_everything", ASKED_INPUT: {"path": "/"}}
    async with web_server(parent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            mid = first[0]["messageId"]
            approval = {"id": request_of(first)["approvalId"], "descriptor": forged}
            refused = await client.post(
                "/api/chat",
                json=answer("s", mid, helper_part({**approval, EDITED_INPUT: {"path": "/"}})),
            )
            before = (await client.get("/api/sessions/s")).json()["ui_messages"]
            r = await client.post(
                "/api/chat",
                json=answer("s", mid, helper_part({**approval, EDITED_INPUT: {"to": "y"}})),
            )
    assert refused.status_code == 400 and "wire_money" in refused.text
    assert part_of(before, "H")["state"] == "approval-requested"
    assert part_of(before, "H")["approval"]["descriptor"] == ASKED  # the store's, not the echo
    assert r.status_code == 200, r.text
    assert ran == ["y"]


async def test_two_agents_deep_the_request_names_the_innermost_call_and_the_edit_runs_there():
    """``top`` -> ``middle`` -> ``helper``: the top call's request names ``helper``'s
    ``wire_money`` call (the one the person approves), and the edit runs there."""
    from tests.test_approval_nested_pass import _grand_parent

    async with web_server(_grand_parent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            part = {
                "type": "tool-middle",
                "toolCallId": asked["toolCallId"],
                "state": "approval-responded",
                "input": part_of(
                    (await client.get("/api/sessions/s")).json()["ui_messages"],
                    asked["toolCallId"],
                )["input"],
                "approval": {
                    "id": asked["approvalId"],
                    "approved": True,
                    "descriptor": asked["approvalDescriptor"],
                    EDITED_INPUT: {"to": "deep"},
                },
            }
            r = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
            done = (await client.get("/api/sessions/s")).json()["ui_messages"]
    assert asked["approvalDescriptor"] == {**ASKED, ASKED_VIA: ["helper"]}  # (through helper)
    assert r.status_code == 200, r.text
    assert ran == ["deep"]
    assert part_of(done, asked["toolCallId"])["toolMetadata"] == {ASKED_EDIT: {"to": "deep"}}


async def test_an_approval_two_agents_deep_names_the_agents_between_live_and_stored(node, ai):
    """``top`` calls ``middle``, whose ``helper`` asks: the descriptor named the asking
    call only, not the agent tools it is asked through (``Awaiting.asked_via``). It has
    ``axonAskedVia`` now, in the stream's request and the stored part alike, which the
    ``ai`` package (7 and 6) keeps, sends back and validates."""
    from tests.test_approval_nested_pass import _grand_parent

    via = {**ASKED, ASKED_VIA: ["helper"]}
    async with web_server(_grand_parent()) as server:
        chat = await run_node_script(
            node,
            WEB / "approve_chat.mjs",
            {"url": server.url, "chatId": "s", "approved": True, **ai},
        )
        async with httpx.AsyncClient(base_url=server.url) as client:
            done = (await client.get("/api/sessions/s")).json()
    assert chat["error"] is None and chat["status"] == "ready", chat
    _, second = chat["bodies"]
    assert part_of(second["messages"], "T")["approval"]["descriptor"] == via  # kept, sent
    kept = part_of([chat["messages"][-1]], "T")
    assert kept["state"] == "output-available" and ran == ["x"]
    stored = part_of(done["ui_messages"], "T")
    assert stored["approval"]["descriptor"] == via == kept["approval"]["descriptor"]
    checked = part_of(await validated(node, ai, done["ui_messages"]), "T")
    assert checked["approval"]["descriptor"] == via


def test_a_sub_agents_own_approval_has_no_via_in_its_descriptor():
    """One agent deep, nothing between: the descriptor is as it was (no ``axonAskedVia``),
    in the stream and the stored form."""
    request = ToolApprovalRequest(
        step=0,
        tool_call_id="H",
        tool_name="helper",
        approval_id="a",
        asked_tool="wire_money",
        asked_input={"to": "x"},
    )
    (ui,) = UIStreamEncoder().encode(request)
    assert ui["approvalDescriptor"] == ASKED
    assert "asked_via" not in to_json(request).decode()
