"""An AG-UI wire id as spelled before aguiwire escaped its message part, sent back to a
worker deployment's front end (real PostgreSQL and Redis, in process): the one place a
message id has a dot (``msg_<runId>``), so the one place the spellings differ
(tests/test_agui_legacy_wire_ids.py)."""

from __future__ import annotations

from functools import partial

import pytest

from tests.support.redis import require_redis
from tests.test_agui_call_ids import _clear as _clear  # the fixture
from tests.test_agui_call_ids import agent
from tests.test_agui_legacy_wire_ids import old_spelling_answers_the_waiting_call
from tests.test_frontend import deployment
from tests.test_worker_protocols import agui_run


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_waiting_call_answered_by_its_old_wire_id_runs_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        await old_spelling_answers_the_waiting_call(partial(agui_run, d.urls[0]))
