"""AG-UI tool call ids on a worker deployment's front end (real PostgreSQL and Redis, in
process), as in the embedded app (tests/test_agui_call_ids.py): each turn's ``call_0``
under its own wire id, live and in every snapshot; a waiting call answered by its wire id
or its call id alone; an id naming no waiting call refused, nothing recorded; a thread
forked from a snapshot replays the calls as the model made them; a run id chosen so that
its message's id (``msg_<runId>``) spells a seeded call's wire id gets one of its own."""

from __future__ import annotations

from functools import partial

import pytest

from tests.support.redis import require_redis
from tests.test_agui_call_ids import _clear as _clear  # the fixture
from tests.test_agui_call_ids import (
    agent,
    answered_by,
    foreign_ids_refused,
    forked_thread_replays_the_calls_as_made,
    ids_unique_and_the_same_live_and_in_snapshots,
)
from tests.test_agui_wire_ids import (
    an_answer_recorded_since_the_run_read_the_thread,
    seeded_call_and_chosen_run_id,
)
from tests.test_frontend import deployment
from tests.test_worker_protocols import agui_post, agui_run


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_call_ids_are_unique_and_the_same_live_and_in_snapshots_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        await ids_unique_and_the_same_live_and_in_snapshots(partial(agui_run, d.urls[0]))


@pytest.mark.parametrize("how", ["wire", "raw"])
async def test_a_waiting_client_call_is_answered_by_either_id_on_a_worker(
    pg_url: str, redis_url: str, how: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        await answered_by(partial(agui_run, d.urls[0]), how)


async def test_an_id_naming_no_waiting_call_is_refused_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        await foreign_ids_refused(partial(agui_run, url), partial(agui_post, url))


async def test_a_thread_forked_from_a_snapshot_replays_the_calls_as_made_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        await forked_thread_replays_the_calls_as_made(partial(agui_run, d.urls[0]))


async def test_a_run_id_chosen_to_collide_with_a_seeded_call_gets_its_own_wire_id_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        await seeded_call_and_chosen_run_id(partial(agui_run, url), worker=True)


async def test_an_answer_come_late_is_refused_naming_the_id_sent_on_a_worker(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        await an_answer_recorded_since_the_run_read_the_thread(
            partial(agui_run, url), partial(agui_post, url), monkeypatch
        )
