"""The decision event of a sub-agent's approval passed up and approved with edits, on the
worker deployment's front end (the suite's PostgreSQL and Redis, in process): the edit
is the sub call's (``Awaiting.edited_input``), and ``tool.approval-decided`` on the
front end that recorded it says ``edited`` all the same (it said ``False``)."""

from __future__ import annotations

import httpx
import pytest

from runtime.app.web.answers import EDITED_INPUT
from runtime.events import ToolApprovalDecided
from tests.support.redis import require_redis
from tests.test_approval_nested_pass import _clear  # noqa: F401 (fixture)
from tests.test_approval_nested_pass import ran as wired
from tests.test_frontend import LIMIT, deployment
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
