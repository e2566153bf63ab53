"""A2A approve-with-edits (docs/protocols-a2a.md, "Input required"): a decision
``{"id", "approved": true, "editedInput": {...}}`` resumes the task with the tool run on
the edited input; an edit the tool's schema refuses, one sent with a denial or one that
is not an object is ``InvalidParamsError`` and records nothing."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.types.a2a_pb2 import GetTaskRequest, TaskState
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from runtime.messages import ToolCallPart
from tests.support.approval_agents import agent as approval_agent
from tests.test_a2a import BOTH, answer_of, collect, last_state, sdk, user
from tests.web.harness import web_server


def the_call(stored: Any) -> ToolCallPart:
    (call,) = [p for p in stored.messages[1].content if isinstance(p, ToolCallPart)]
    return call


async def test_an_edited_decision_resumes_the_task_with_the_tool_run_on_the_edit():
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any]:
            asked = await collect(client, user("weather?", message_id="q"))
            task = asked[0].task
            pending = MessageToDict(asked[-1].status_update.status.message.parts[1].data)
            key = pending["pending"][0]["id"]
            edit = {"id": key, "approved": True, "editedInput": {"city": "Bergen"}}
            answered = await collect(
                client, user(message_id="d", task_id=task.id, data={"decisions": [edit]})
            )
            return asked, answered

        asked, answered = await sdk(server, run)
        stored = await server.host.store.load(asked[0].task.context_id)
    assert answer_of(answered) == "It is sunny in Bergen."
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    call = the_call(stored)
    assert call.input == {"city": "Bergen"}
    assert call.awaiting is not None and call.awaiting.original_input == {"city": "Oslo"}


@pytest.mark.parametrize(
    ("decision", "says"),
    [
        ({"approved": True, "editedInput": {"city": 3}}, "invalid arguments for get_weather"),
        ({"approved": False, "editedInput": {"city": "Bergen"}}, "approved=True only"),
        ({"approved": True, "editedInput": "Bergen"}, "editedInput must be an object"),
    ],
)
async def test_an_edit_that_does_not_fit_is_invalid_params_and_records_nothing(decision, says):
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any]:
            asked = await collect(client, user("weather?", message_id="q"))
            task = asked[0].task
            with pytest.raises(InvalidParamsError) as caught:
                await collect(
                    client, user(message_id="d", task_id=task.id, data={"decisions": [decision]})
                )
            return caught.value, await client.get_task(GetTaskRequest(id=task.id))

        error, again = await sdk(server, run)
        stored = await server.host.store.load(again.context_id)
    assert says in error.message
    assert again.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    call = the_call(stored)
    assert call.input == {"city": "Oslo"} and call.awaiting is not None
    assert not call.awaiting.decided
