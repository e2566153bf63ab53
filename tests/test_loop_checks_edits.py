"""An approval's edited input from an AG-UI resume (``editedArgs``) or an AI SDK
continuation (``approval.axonEditedInput``) is checked against its tool's schema once,
a large one in a worker thread, as A2A's are (tests/test_a2a_loop_checks.py): it was
checked twice on the event loop, by the front end's check of every answer before any is
recorded and again as the session recorded it. Counted, never timed: each check of the
edit (``approval._edit_check``'s) and the thread it ran on."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, approval, tool
from runtime.app.web.answers import EDITED_INPUT
from runtime.messages import ToolCallPart
from tests.test_agui import run, run_input, user
from tests.test_approval_web import answer, post, request_of
from tests.test_web_http import body
from tests.web.harness import web_server

kept: list[int] = []


@tool(needs_approval=True)
async def keep(rows: list[int]) -> str:
    """Keep the rows (it needs a person's approval)."""
    kept.append(len(rows))
    return f"kept {len(rows)}"


LARGE = {"rows": list(range(2_500))}
"""2,500 values: past the thread's 2,000 (``LARGE_OUTPUT_NODES``), within the agent's
``max_tool_result_chars`` (its JSON 13 KB)."""
SMALL = {"rows": [7, 8]}


def agent() -> Agent:
    steps = [[*tool_call("keep", {"rows": [1]}, tool_call_id="K")], ["done"]]
    return Agent(name="keeper", provider=ScriptedProvider(steps), tools=[keep])


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each check of an edit: whether it ran on the event loop's (main) thread."""
    on_main: list[bool] = []
    edit_check = approval._edit_check

    def counted(*args: Any) -> Any:
        check, schema = edit_check(*args)

        def noting(arguments: Any) -> Any:
            on_main.append(threading.current_thread() is threading.main_thread())
            return check(arguments)

        return (None if check is None else noting), schema

    monkeypatch.setattr(approval, "_edit_check", counted)
    kept.clear()
    return on_main


def _stored_input(record: Any, at: int = 1) -> Any:
    """The input stored for the call of assistant message ``record.messages[at]``."""
    (call,) = [p for p in record.messages[at].content if isinstance(p, ToolCallPart)]
    return call.input


@pytest.mark.parametrize(("edit", "on_main"), [(LARGE, False), (SMALL, True)])
async def test_an_agui_edited_approval_is_checked_once(checks, edit, on_main):
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("keep", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": edit}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        second = await run(server, run_input("t", user("keep", "m1"), resume=resume, runId="r2"))
        record = await server.host.store.load("t")
    assert second[-1]["outcome"] == {"type": "success"}
    assert checks == [on_main]  # was [True, True]: the pre-check's and the recording's
    assert kept == [len(edit["rows"])]
    assert _stored_input(record) == edit


@pytest.mark.parametrize(("edit", "on_main"), [(LARGE, False), (SMALL, True)])
async def test_an_ai_sdk_edited_approval_is_checked_once(checks, edit, on_main):
    async with web_server(agent()) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first = await post(client, body("s"))
            part = {
                "type": "tool-keep",
                "toolCallId": "K",
                "state": "approval-responded",
                "input": {"rows": [1]},
                "approval": {
                    "id": request_of(first)["approvalId"],
                    "approved": True,
                    EDITED_INPUT: edit,
                },
            }
            second = await post(client, answer("s", first[0]["messageId"], part))
        record = await server.host.store.load("s")
    assert {
        "type": "tool-output-available",
        "toolCallId": "K",
        "output": f"kept {len(edit['rows'])}",
    } in second
    assert checks == [
        on_main
    ]  # was [False, True] large (the recording's on the loop), [True, True]
    assert _stored_input(record) == edit
