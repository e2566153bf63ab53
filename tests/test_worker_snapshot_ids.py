"""Message ids on a worker deployment's front end (real PostgreSQL and Redis, in
process), where a turn's answer is ``msg_<runId>`` (AG-UI) or ``msg_<turnId>`` (the AI
SDK body's): a client naming its user message ``msg_Q`` and a run ``Q`` made two
messages of one id (in every AG-UI snapshot and in the AI SDK's form). The run gets a
turn id of the server's then. Also the embedded scenario of user messages named as a
reasoning or result message (tests/test_agui_snapshot_ids.py)."""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

import httpx

from runtime.messages import AssistantMessage
from tests.test_agui import run_input, user
from tests.test_agui_snapshot_ids import _clear as _clear  # the fixture
from tests.test_agui_snapshot_ids import _snapshot, agent, hostile_user_ids
from tests.test_frontend import LIMIT, body, deployment, redis_url
from tests.test_worker_protocols import agui_run

__all__ = ["redis_url"]  # (the fixture)


def _repeated(ids: list[str]) -> list[str]:
    return [i for i, n in Counter(ids).items() if n > 1]


async def test_user_messages_named_as_derived_ids_get_distinct_snapshot_ids_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        await hostile_user_ids(partial(agui_run, d.urls[0]))


async def test_a_run_named_as_an_earlier_user_message_gets_its_own_answer_id(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        run_ = partial(agui_run, d.urls[0])
        await run_(run_input("q", user("one", "msg_Q"), runId="r1"))
        held = _snapshot(await run_(run_input("q", runId="s1")))
        await run_(run_input("q", *held, user("two", "m2"), runId="Q"))
        held = _snapshot(await run_(run_input("q", runId="s2")))
        record = await d.store.load("q")
    assert _repeated([m["id"] for m in held]) == [], held
    assert record is not None
    assert "msg_Q" not in [m.id for m in record.messages if isinstance(m, AssistantMessage)]


async def test_a_run_named_as_its_own_user_message_gets_its_own_answer_id(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        run_ = partial(agui_run, d.urls[0])
        await run_(run_input("p", user("one", "msg_P"), runId="P"))
        held = _snapshot(await run_(run_input("p", runId="s1")))
    assert _repeated([m["id"] for m in held]) == [], held


async def test_an_ai_sdk_turn_named_as_its_own_user_message_gets_its_own_answer_id(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent()) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            r = await client.post("/api/chat", json={**body("a", "one", "msg_T"), "turnId": "T"})
        record = await d.store.load("a")
    assert r.status_code == 200, r.text
    assert record is not None
    ids: list[Any] = [m.id for m in record.messages]
    assert _repeated(ids) == [] and "msg_T" in ids, ids


async def test_an_ai_sdk_turn_named_as_an_earlier_user_message_gets_its_own_answer_id(
    pg_url: str, redis_url: str
) -> None:
    # The AI SDK's ``turnId`` Q after a user message ``msg_Q``: its answer, msg_<turnId>,
    # would be a second message of that id (the front end reads the store's user ids).
    async with deployment(pg_url, redis_url, agent()) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            one = await client.post("/api/chat", json=body("a", "one", "msg_Q"))
            two = await client.post("/api/chat", json={**body("a", "two", "m2"), "turnId": "Q"})
        record = await d.store.load("a")
    assert (one.status_code, two.status_code) == (200, 200), two.text
    assert record is not None
    ids: list[Any] = [m.id for m in record.messages]
    assert _repeated(ids) == [] and ids.count("msg_Q") == 1 and "m2" in ids, ids
