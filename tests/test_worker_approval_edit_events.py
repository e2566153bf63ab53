"""A sub-agent's approval passed up and approved with edits, on the worker deployment
(the suite's PostgreSQL and Redis, in process): the edit is the sub call's
(``Awaiting.edited_input``), and ``tool.approval-decided`` on the front end that
recorded it says ``edited`` all the same (it said ``False``); two agents deep, the edit
reaches the innermost call and only that session's model is told it."""

from __future__ import annotations

import httpx
import pytest

from actors.providers import anthropic
from runtime.app.web.answers import EDITED_INPUT
from runtime.events import ToolApprovalDecided
from runtime.history import EDIT_NOTE
from tests.support.redis import require_redis
from tests.test_approval_nested_pass import (
    _clear,  # noqa: F401 (fixture)
    _grand_parent,
)
from tests.test_approval_nested_pass import ran as wired
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, payloads, waiting_turn
from tests.test_worker_approval_nested_pass import _answer, _on_h, _suspend
from tests.test_worker_approval_nested_pass import calling as nested_agent


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.mark.parametrize("edit", [{"to": "y"}, None], ids=["edited", "as-asked"])
async def test_a_front_ends_decision_event_of_a_passed_up_approval_says_if_it_was_edited(
    pg_url: str, redis_url: str, edit: dict[str, str] | None
) -> None:
    async with deployment(pg_url, redis_url, nested_agent()) as d:
        events = d.hosts[0].bus.subscribe([ToolApprovalDecided], name="t")
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            part = _on_h(approval_id, True)
            if edit is not None:
                part["approval"][EDITED_INPUT] = edit
            response = await client.post(
                f"{d.urls[0]}/api/chat", json=_answer("s1", message_id, part)
            )
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        decided = events.inbox.get_nowait()
    assert response.status_code == 200, response.text
    assert wired == ["y" if edit else "x"]
    assert (decided.session_id, decided.approved, decided.edited) == ("s1", True, bool(edit))


async def test_an_edit_two_agents_deep_decided_on_a_front_end_runs_and_is_told_innermost(
    pg_url: str, redis_url: str
) -> None:
    """top -> middle -> helper on a worker: the front end checks the edit of helper's
    call, the worker passes it down two sessions, the tool runs it once, and only the
    innermost session's replay to its model tells the edit (the model's own input kept)."""

    async with deployment(pg_url, redis_url, _grand_parent(), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "go"))
            events = payloads(sse_events(first.text))
            await waiting_turn(d)
            asked = next(c for c in events if c["type"] == "tool-approval-request")
            part = {
                "type": "tool-middle",
                "toolCallId": "T",
                "state": "approval-responded",
                "input": {"input": "have x paid"},
                "approval": {
                    "id": asked["approvalId"],
                    "approved": True,
                    EDITED_INPUT: {"to": "deep"},
                },
            }
            response = await client.post(
                f"{d.urls[1]}/api/chat", json=_answer("s1", events[0]["messageId"], part)
            )
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        records = {
            sid: await d.store.load(sid) for sid in ("s1", "s1.middle.T", "s1.middle.T.helper.M")
        }
    assert response.status_code == 200, response.text
    assert wired == ["deep"]
    note = EDIT_NOTE.format(input='{"to": "deep"}')
    told = []
    for sid, record in records.items():
        assert record is not None
        _, sent = anthropic.map_messages(None, list(record.messages))
        if note in str(sent):
            told.append(sid)
            assert str(sent).count("'to': 'x'") == 1  # the model's own input, replayed
    assert told == ["s1.middle.T.helper.M"]
