"""An edited input is bounded (docs/approval.md, "Approving with edits"): its JSON may be
as long as the larger of the agent's ``max_tool_result_chars`` and the model's own input
for that call; a longer one is :class:`~runtime.errors.EditTooLarge` (a 400 over HTTP,
naming the limit and the size), nothing is recorded and the call still waits. Before, an
edit was bounded only by the HTTP body (``--max-body``, 48 MiB), stored as the call's
input and replayed to the model on every later call. Embedded host and app (SQLite);
the worker front end's is tests/test_worker_approval_edit_size.py."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from a2a.types.a2a_pb2 import GetTaskRequest, TaskState
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, EditTooLarge, Host
from runtime.messages import ToolCallPart
from tests.support.approval_agents import agent as weather_agent
from tests.support.approval_agents import get_weather, small_edits
from tests.test_a2a import BOTH, collect, sdk, user
from tests.test_agui import approval_agent as agui_agent
from tests.test_agui import delete_file, deleted, post, run, run_input
from tests.test_agui import user as agui_user
from tests.test_agui_edits import resumed
from tests.test_approval_nested_pass import SUB, parent
from tests.test_approval_nested_pass import ran as nested_ran
from tests.test_approval_web import agent as web_agent
from tests.test_approval_web import answer, approval_part, request_of
from tests.test_approval_web import post as web_post
from tests.test_approval_web import ran as web_ran
from tests.test_approval_web_edits import TWO
from tests.test_cli_approval import run_in_a_terminal
from tests.test_web_http import body
from tests.web.harness import web_server

DEFAULT = 100_000  # the default max_tool_result_chars
SMALL = 20  # small_edits' limit (its model's input, {"city":"Oslo"}, is 15)


def sized(key: str, chars: int) -> dict[str, str]:
    """``{key: "x..."}`` whose JSON is ``chars`` characters."""
    edit = {key: "x" * (chars - len(orjson.dumps({key: ""})))}
    assert len(orjson.dumps(edit)) == chars
    return edit


def calls(messages: Any) -> list[ToolCallPart]:
    return [p for m in messages for p in getattr(m, "content", ()) if isinstance(p, ToolCallPart)]


# -- Python: session.respond -----------------------------------------------------------


async def test_an_edit_one_character_over_the_limit_is_refused_and_one_at_it_runs(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(small_edits, session_id="s")
        (pending,) = (await session.run("hi")).pending
        before = await host.store.load("s")
        with pytest.raises(EditTooLarge) as caught:
            await session.respond(
                pending.approval_id, approved=True, edited_input=sized("city", SMALL + 1)
            )
        after = await host.store.load("s")
        still = session.pending
        result = await session.respond(
            pending.approval_id, approved=True, edited_input=sized("city", SMALL)
        )
    assert (caught.value.size, caught.value.limit) == (SMALL + 1, SMALL)
    assert "21 characters of JSON, more than the 20" in str(caught.value)
    assert before is not None and after is not None
    assert (after.version, after.messages) == (before.version, before.messages)
    assert [c.approval_id for c in still if not c.decided] == [pending.approval_id]
    assert result is not None and result.text == f"It is sunny in {'x' * 9}."


async def test_an_edit_as_long_as_the_models_own_input_is_taken_past_the_limit(tmp_path):
    own = sized("city", 40)
    agent = Agent(
        provider=ScriptedProvider([[*tool_call("get_weather", own)], ["done"]]),
        tools=[get_weather],
        budget=Budget(max_tool_result_chars=SMALL),
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        (pending,) = (await session.run("hi")).pending
        with pytest.raises(EditTooLarge) as caught:
            await session.respond(
                pending.approval_id, approved=True, edited_input=sized("city", 41)
            )
        edit = {"city": "y" * len(own["city"])}
        await session.respond(pending.approval_id, approved=True, edited_input=edit)
        record = await host.store.load("s")
    assert (caught.value.size, caught.value.limit) == (41, 40)
    assert record is not None and calls(record.messages)[0].input == edit


async def test_a_passed_up_approvals_edit_over_the_limit_is_refused_on_the_caller(tmp_path):
    nested_ran.clear()
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        (pending,) = (await session.run("go")).pending
        before = (await host.store.load("s"), await host.store.load(SUB))
        with pytest.raises(EditTooLarge) as caught:
            await session.respond(
                pending.approval_id, approved=True, edited_input=sized("to", DEFAULT + 1)
            )
        after = (await host.store.load("s"), await host.store.load(SUB))
    assert (caught.value.size, caught.value.limit) == (DEFAULT + 1, DEFAULT)
    assert "wire_money" in str(caught.value)
    assert [r.version for r in after] == [r.version for r in before]  # type: ignore[union-attr]
    assert nested_ran == []
    (held,) = calls(after[0].messages)  # type: ignore[union-attr]
    assert held.awaiting is not None and not held.awaiting.decided


# -- the AI SDK continuation (embedded app) ----------------------------------------------


async def test_a_body_whose_second_answer_has_too_long_an_edit_records_neither():
    """Checked before anything is recorded, as every answer of a body is: before the
    check passed the limit, the first answer was recorded and the second refused."""
    web_ran.clear()
    async with web_server(web_agent(TWO)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await web_post(client, body("s"))
            d, e = [c for c in first if c != "[DONE]" and c["type"] == "tool-approval-request"]
            sent = answer("s", first[0]["messageId"], approval_part(d["approvalId"], True))
            other = approval_part(e["approvalId"], True, axonEditedInput=sized("path", DEFAULT + 1))
            sent["messages"][-1]["parts"].append(
                {**other, "toolCallId": "E", "input": {"path": "/y"}}
            )
            before = (await client.get("/api/sessions/s")).json()
            refused = await client.post("/api/chat", json=sent)
            after = (await client.get("/api/sessions/s")).json()
    assert refused.status_code == 400, refused.text
    assert "100,001 characters of JSON, more than the 100,000" in refused.json()["error"]
    assert after == before and before["waiting"] == 2
    assert web_ran == []


async def test_an_edit_at_the_limit_over_the_ai_sdk_continuation_runs():
    web_ran.clear()
    edit = sized("path", DEFAULT)
    async with web_server(
        web_agent([*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")])
    ) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await web_post(client, body("s"))
            part = approval_part(request_of(first)["approvalId"], True, axonEditedInput=edit)
            second = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
    assert second.status_code == 200, second.text
    assert web_ran == [edit["path"]]


# -- AG-UI --------------------------------------------------------------------------------


async def test_an_ag_ui_resume_with_too_long_edited_args_is_400_and_records_nothing():
    deleted.clear()
    async with web_server(agui_agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", agui_user("delete it", "m1")))
        interrupt_id = first[-1]["outcome"]["interrupts"][0]["id"]
        before = await server.host.store.load("t")
        payload = {"approved": True, "editedArgs": sized("path", DEFAULT + 1)}
        r = await post(server, resumed(interrupt_id, payload))
        after = await server.host.store.load("t")
    assert r.status_code == 400 and r.json()["code"] == "EditTooLarge", r.text
    assert "max_tool_result_chars, 100,000" in r.json()["error"]
    assert (after.version, after.messages) == (before.version, before.messages)
    assert deleted == []


async def test_an_ag_ui_resume_whose_second_answer_has_too_long_an_edit_records_neither():
    """Both interrupts' answers are checked before either is recorded, with the limit
    the recording uses: checked without it, the first was recorded and the second
    refused (a 400 that had changed the thread)."""
    deleted.clear()
    two = [
        *tool_call("delete_file", {"path": "/tmp/x"}, tool_call_id="d1"),
        *tool_call("delete_file", {"path": "/tmp/y"}, tool_call_id="d2"),
    ]
    agent = Agent(provider=ScriptedProvider([two, ["Done."]]), tools=[delete_file])
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", agui_user("delete them", "m1")))
        a, b = [i["id"] for i in first[-1]["outcome"]["interrupts"]]
        big = {"approved": True, "editedArgs": sized("path", DEFAULT + 1)}
        resume = [
            {"interruptId": a, "status": "resolved", "payload": {"approved": True}},
            {"interruptId": b, "status": "resolved", "payload": big},
        ]
        before = await server.host.store.load("t")
        r = await post(
            server, run_input("t", agui_user("delete them", "m1"), resume=resume, runId="r2")
        )
        after = await server.host.store.load("t")
    assert r.status_code == 400 and r.json()["code"] == "EditTooLarge", r.text
    assert (after.version, after.messages) == (before.version, before.messages)
    assert deleted == []


# -- A2A ----------------------------------------------------------------------------------


async def test_an_a2a_decision_with_too_long_an_edit_is_invalid_params_and_records_nothing():
    async with web_server(weather_agent, protocols=BOTH) as server:

        async def go(client: Any) -> tuple[Any, Any]:
            asked = await collect(client, user("weather?", message_id="q"))
            task = asked[0].task
            pending = MessageToDict(asked[-1].status_update.status.message.parts[1].data)
            edit = {
                "id": pending["pending"][0]["id"],
                "approved": True,
                "editedInput": sized("city", DEFAULT + 1),
            }
            with pytest.raises(InvalidParamsError) as caught:
                await collect(
                    client, user(message_id="d", task_id=task.id, data={"decisions": [edit]})
                )
            return caught.value, await client.get_task(GetTaskRequest(id=task.id))

        error, again = await sdk(server, go)
        stored = await server.host.store.load(again.context_id)
    assert "more than the 100,000" in error.message
    assert again.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    (call,) = calls(stored.messages)
    assert call.awaiting is not None and not call.awaiting.decided


async def test_an_a2a_message_whose_second_decision_has_too_long_an_edit_records_neither():
    """Checked before either is recorded, with the limit the recording uses."""
    two = [
        *tool_call("get_weather", {"city": "Oslo"}, tool_call_id="c0"),
        *tool_call("get_weather", {"city": "Paris"}, tool_call_id="c1"),
    ]
    agent = Agent(provider=ScriptedProvider([two, ["Done."]]), tools=[get_weather])
    async with web_server(agent, protocols=BOTH) as server:

        async def go(client: Any) -> tuple[Any, Any]:
            asked = await collect(client, user("weather?", message_id="q"))
            task = asked[0].task
            pending = MessageToDict(asked[-1].status_update.status.message.parts[1].data)
            first, second = [p["id"] for p in pending["pending"]]
            decisions = [
                {"id": first, "approved": True},
                {"id": second, "approved": True, "editedInput": sized("city", DEFAULT + 1)},
            ]
            with pytest.raises(InvalidParamsError) as caught:
                await collect(
                    client,
                    user(message_id="d", task_id=task.id, data={"decisions": decisions}),
                )
            return caught.value, await client.get_task(GetTaskRequest(id=task.id))

        error, again = await sdk(server, go)
        stored = await server.host.store.load(again.context_id)
    assert "more than the 100,000" in error.message
    assert again.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert [c.awaiting.decided for c in calls(stored.messages)] == [False, False]


# -- the command line's prompt ------------------------------------------------------------


def test_e_at_the_prompt_with_too_long_an_edit_says_so_and_asks_again():
    proc = run_in_a_terminal(
        'e\n{"city": "Bergen-Bergen"}\ne\n{"city": "Bergen"}', agent="small_edits"
    )
    assert proc.returncode == 0, proc.stderr
    (refused,) = [line for line in proc.stderr.splitlines() if line.endswith("asked again")]
    assert "24 characters of JSON, more than the 20" in refused
    assert proc.stdout.count("[y/N] ") == 2
    assert proc.stdout.count("result sunny in Bergen") == 1
    assert "Bergen-Bergen" not in proc.stdout.split("[y/N] ")[-1]
