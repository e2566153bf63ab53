"""How the A2A endpoint records the answers of a task waiting for input: checked against
the session as this process last stored it, read from the store only when that view is
behind (``runtime/app/web/a2a_tasks.py``, ``_record``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from a2a.types.a2a_pb2 import TaskState
from a2a.utils.errors import UnsupportedOperationError
from google.protobuf.json_format import MessageToDict

from runtime.approval import Decision, record_decision
from tests.support.approval_agents import agent as approval_agent
from tests.test_a2a import BOTH, answer_of, collect, last_state, sdk, user
from tests.web.harness import web_server


def _count_reads(store: Any) -> Counter[str]:
    """Count the store's ``load`` and ``version`` calls from now on."""
    calls: Counter[str] = Counter()
    for name in ("load", "version"):
        original = getattr(store, name)

        async def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return await _original(*args)

        setattr(store, name, counted)
    return calls


async def _ask(client: Any) -> tuple[Any, str]:
    asked = await collect(client, user("weather?", message_id="q"))
    pending = MessageToDict(asked[-1].status_update.status.message.parts[1].data)["pending"]
    return asked[0].task, pending[0]["id"]


def _approve(task: Any, approval_id: str, message_id: str = "d") -> Any:
    decision = {"decisions": [{"id": approval_id, "approved": True}]}
    return user(message_id=message_id, task_id=task.id, context_id=task.context_id, data=decision)


async def test_an_answer_to_a_task_this_process_holds_reads_nothing_from_the_store():
    async with web_server(approval_agent, protocols=BOTH) as server:
        task, approval_id = await sdk(server, _ask)
        reads = _count_reads(server.host.store)
        answered = await sdk(server, lambda c: collect(c, _approve(task, approval_id)))
        seen = Counter(reads)
        stored = await server.host.store.load(task.context_id)
    assert answer_of(answered) == "It is sunny in Oslo."
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    assert seen == Counter()  # neither the answer nor its continuation read the session
    assert [m.role for m in stored.messages] == ["user", "assistant", "tool"]


async def test_an_answer_on_a_view_the_store_moved_past_is_checked_on_the_store_and_taken():
    async with web_server(approval_agent, protocols=BOTH) as server:
        task, approval_id = await sdk(server, _ask)
        store = server.host.store
        record = await store.load(task.context_id)
        # another process saved the session since (the same messages, a new version)
        await store.save(task.context_id, 0, record.messages, expected_version=record.version)
        reads = _count_reads(store)
        answered = await sdk(server, lambda c: collect(c, _approve(task, approval_id)))
    assert answer_of(answered) == "It is sunny in Oslo."
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    assert reads["load"] >= 1  # the view was stale: the answer was checked on what is stored


async def test_an_answer_for_a_call_decided_elsewhere_is_refused_and_that_decision_stands():
    async with web_server(approval_agent, protocols=BOTH) as server:
        task, approval_id = await sdk(server, _ask)
        store = server.host.store
        tools = {t.name: t for t in approval_agent.tools}
        # another process denied it first (this process's view still shows it waiting)
        denial = Decision(approved=False, reason="no")
        await record_decision(store, task.context_id, approval_id, denial, tools)

        async def answer(client: Any) -> Exception:
            with pytest.raises(UnsupportedOperationError) as caught:
                await collect(client, _approve(task, approval_id))
            return caught.value

        error = await sdk(server, answer)
        stored = await store.load(task.context_id)
    assert "does not wait for input any more" in str(error)
    (call,) = [p for p in stored.messages[1].content if p.type == "tool-call"]
    assert call.awaiting is not None
    assert (call.awaiting.decided, call.awaiting.approved) == (True, False)
