"""AG-UI on a worker deployment's front end (real PostgreSQL and Redis, in process) and
a sub-agent's client calls passed up (``as_tool(pass_approvals=True)``): a client that
reconnects gets the sub call it is told to answer in the snapshot, and a run that sends
back its answer to the one before is taken (a 404 before), as in the embedded app
(tests/test_agui_nested.py)."""

from __future__ import annotations

import pytest

from tests.support.redis import require_redis
from tests.test_agui import run_input, user
from tests.test_agui_nested import (
    answer,
    answer_at_once,
    calls_of,
    check_one_recorded,
    locating,
    pending,
    read_together,
    snapshot_of,
    tool_messages,
)
from tests.test_approval_nested_pass import parent, ran
from tests.test_frontend import deployment
from tests.test_worker_protocols import agui_run, text_of


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_reconnecting_client_answers_each_passed_up_client_call_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    history = [user("go", "m1"), answer("H.L0", "Paris")]
    async with deployment(pg_url, redis_url, locating(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        first = await agui_run(url, run_input("s", user("go", "m1")))
        again = await agui_run(url, run_input("s", runId="reconnect"))
        await agui_run(url, run_input("s", *history, runId="r2"))
        later = await agui_run(url, run_input("s", runId="reconnect-2"))
        last = await agui_run(url, run_input("s", *history, answer("H.L1", "Rome"), runId="r3"))
    assert pending(first) == pending(again) == ["H.L0"]
    assert calls_of(snapshot_of(again)) == [("H", "helper"), ("H.L0", "locate")]
    assert calls_of(snapshot_of(later))[-1] == ("H.L1", "locate")
    assert tool_messages(snapshot_of(later)) == [("H.L0", "Paris")]
    assert text_of(last) == "parent saw: Paris then Rome"
    assert last[-1]["outcome"]["type"] == "success"


async def test_two_clients_answering_one_passed_up_approval_at_once_on_a_worker(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front end's decision through the queue refused the later answer as
    ``AlreadyDecided`` (the class's name) too; now ``already_answered``."""
    ran.clear()
    async with deployment(pg_url, redis_url, parent(), protocols=("ag-ui",)) as d:
        first = await agui_run(d.urls[0], run_input("s", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        read_together(monkeypatch)
        replies = await answer_at_once(d.urls[0], interrupt["id"])
    check_one_recorded(replies)
