"""AG-UI approve-with-edits: the interrupt's ``responseSchema`` offers ``editedArgs``, and
a resume payload carrying it runs the tool once with those arguments (docs/protocols-ag-ui.md,
"Frontend tools and approvals"); an edit the tool's schema refuses, or one sent with a
denial, is a 400 and records nothing. Every event and request is checked against the
official ``ag-ui-protocol`` types."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.app.web.agui_input import AGUIError, ResumeAnswer, approval_answer
from runtime.messages import ToolCallPart
from tests.test_agui import approval_agent, deleted, post, run, run_input, user
from tests.web.harness import web_server

ag_ui = pytest.importorskip("ag_ui.core")


def resumed(interrupt_id: str, payload: Any, run_id: str = "r2") -> dict[str, Any]:
    """The run that answers ``interrupt_id`` with ``payload``, as the official
    ``RunAgentInput`` reads it (a field it does not know would fail here)."""
    body = run_input(
        "t",
        user("delete it", "m1"),
        resume=[{"interruptId": interrupt_id, "status": "resolved", "payload": payload}],
        runId=run_id,
    )
    model = ag_ui.RunAgentInput.model_validate(body)
    assert model.resume[0].payload == payload
    return body


def waiting_call(record: Any) -> ToolCallPart:
    (call,) = [p for p in record.messages[1].content if isinstance(p, ToolCallPart)]
    return call


async def test_the_interrupt_offers_edited_args_and_a_resume_with_them_runs_the_edit():
    deleted.clear()
    async with web_server(approval_agent("It is gone."), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("delete it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        assert interrupt["responseSchema"]["properties"]["editedArgs"]["type"] == "object"
        assert ag_ui.Interrupt.model_validate(interrupt).response_schema is not None
        body = resumed(interrupt["id"], {"approved": True, "editedArgs": {"path": "/tmp/y"}})
        second = await run(server, body)
        again = await run(server, {**body, "runId": "r3"})  # the same resume, replayed
        record = await server.host.store.load("t")
    assert deleted == ["/tmp/y"]  # once, with the edit
    (result,) = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"].endswith(".s0.d1") and result["content"] == "deleted /tmp/y"
    assert second[-1]["outcome"] == {"type": "success"}
    assert [e["type"] for e in again] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    (snapshot,) = [e for e in again if e["type"] == "MESSAGES_SNAPSHOT"]
    (call,) = snapshot["messages"][1]["toolCalls"]
    assert call["function"]["arguments"] == '{"path":"/tmp/y"}'
    stored = waiting_call(record)
    assert stored.input == {"path": "/tmp/y"}
    assert stored.awaiting is not None and stored.awaiting.original_input == {"path": "/tmp/x"}


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"approved": True, "editedArgs": {"path": 3}}, "InvalidDecision"),
        ({"approved": True, "editedArgs": {"where": "/"}}, "InvalidDecision"),
        ({"approved": False, "editedArgs": {"path": "/tmp/y"}}, "InvalidDecision"),
        ({"approved": True, "editedArgs": ["/tmp/y"]}, "invalid_resume_payload"),
    ],
)
async def test_an_edit_that_does_not_fit_is_400_and_records_nothing(payload, code):
    deleted.clear()
    async with web_server(approval_agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("delete it", "m1")))
        interrupt_id = first[-1]["outcome"]["interrupts"][0]["id"]
        before = await server.host.store.load("t")
        r = await post(server, resumed(interrupt_id, payload))
        after = await server.host.store.load("t")
    assert r.status_code == 400 and r.json()["code"] == code, r.text
    assert after.version == before.version and after.messages == before.messages
    assert deleted == [] and not waiting_call(after).awaiting.decided


@given(
    payload=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["approved", "reason", "editedArgs", "x"]), inner, max_size=4
            )
        ),
        max_leaves=10,
    )
)
def test_any_resume_payload_is_an_answer_of_the_schemas_shape_or_a_400(payload):
    entry = ResumeAnswer(interrupt_id="i", status="resolved", payload=payload)
    try:
        approved, reason, edited = approval_answer(entry)
    except AGUIError as exc:
        assert exc.status == 400
        return
    assert isinstance(payload, dict) and approved is payload["approved"]
    assert isinstance(approved, bool) and isinstance(reason, str | None)
    assert edited is None or (isinstance(edited, dict) and edited is payload["editedArgs"])
