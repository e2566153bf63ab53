"""AG-UI on a worker deployment's front end (real PostgreSQL and Redis, in process) and
a client tool whose output schema wants an object: the tool message's text is read as
the JSON it holds, for a top-level call and for a sub-agent's call passed up (``H.L``),
and text the schema takes neither way is a 400 recording nothing, as in the embedded
app (tests/test_agui_client_output.py)."""

from __future__ import annotations

import pytest

from tests.support.redis import require_redis
from tests.test_agui import run_input, user
from tests.test_agui_client_output import PLACE, asking, seen, tool_answer
from tests.test_agui_nested import answer, pending
from tests.test_approval_nested_pass_client import parent
from tests.test_frontend import deployment
from tests.test_worker_protocols import agui_post, agui_run, text_of


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_passed_up_sub_call_is_answered_with_json_text_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, parent(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        first = await agui_run(url, run_input("s", user("go", "m1")))
        refused = await agui_post(
            url, run_input("s", user("go", "m1"), answer("H.L", "Paris"), runId="r2")
        )
        body = run_input("s", user("go", "m1"), answer("H.L", '{"city": "Paris"}'), runId="r3")
        last = await agui_run(url, body)
    assert pending(first) == ["H.L"]
    assert refused.status_code == 400 and refused.json()["code"] == "InvalidDecision"
    assert "as JSON text" in refused.json()["error"]
    assert text_of(last) == "parent saw: you are in Paris"


async def test_a_top_level_call_is_answered_with_json_text_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    seen.clear()
    async with deployment(pg_url, redis_url, asking(PLACE), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        await agui_run(url, run_input("s", user("go", "m1")))
        body = run_input("s", user("go", "m1"), tool_answer("c1", '{"city": "Paris"}'))
        last = await agui_run(url, {**body, "runId": "r2"})
    assert last[-1]["outcome"]["type"] == "success"
    assert seen == [{"city": "Paris"}]
