"""``CancelTask`` of an A2A task waiting for input (docs/protocols-a2a.md): its turn is ended
there, not only denied, so nothing resumes it after the client canceled it."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, TaskState

from runtime import NothingToResume, ToolMessage
from tests.support.approval_agents import agent as approval_agent
from tests.test_a2a import BOTH, collect, sdk, user
from tests.web.harness import web_server


async def test_a_canceled_waiting_task_can_no_longer_be_resumed():
    """Before: the call was denied and the turn left decided, never resumed: a
    ``resume()`` of its session ran the model on after the client had canceled it."""
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> Any:
            asked = await collect(client, user("weather?", message_id="q", context_id="w"))
            await client.cancel_task(CancelTaskRequest(id=asked[0].task.id))
            return await client.get_task(GetTaskRequest(id=asked[0].task.id))

        task = await sdk(server, run, streaming=False)
        session = server.host.sessions["w"]
        with pytest.raises(NothingToResume):
            async with session.resume() as out:
                async for _ in out:
                    pass
        stored = await server.host.store.load("w")
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    (result,) = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert result.error == "the tool call was denied: canceled by the A2A client"
