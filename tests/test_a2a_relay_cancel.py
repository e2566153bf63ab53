"""A2A ``CancelTask`` sent to an embedded host that does not run the task's turn
(``serve --redis``: another embedded host on the same store runs and publishes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.relays import RedisRelay, attach_relay
from runtime.app.web.a2a_tasks import task_id_of
from runtime.messages import AssistantMessage
from tests.support.redis import require_redis, unique_prefix
from tests.test_busy import Script, held, holding, looking
from tests.test_busy_web import agent_of
from tests.test_web_http import body
from tests.web.harness import wait_idle, web_server

LIMIT = 10
JSON = {"content-type": "application/json"}


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


async def _stored_answer(store: Any, session_id: str) -> AssistantMessage:
    with trio.fail_after(LIMIT):
        while True:
            record = await store.load(session_id)
            answers = (
                [m for m in record.messages if isinstance(m, AssistantMessage)] if record else []
            )
            if answers:
                return answers[-1]
            await trio.sleep(0.01)


async def test_a_cancel_on_another_embedded_host_stops_the_tasks_turn(
    redis_url: str, tmp_path: Path
) -> None:
    # B read the task back from the store (its first step saved), found no turn of its
    # own, and answered it canceled while A's turn ran on.
    script = Script(looking(), holding(), ["never"])
    path = str(tmp_path / "sessions.db")
    prefix = unique_prefix()
    protocols = ("ai-sdk", "a2a")
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as relay_a,
        RedisRelay.open(redis_url, prefix=prefix) as relay_b,
        web_server(agent_of(script), store=path, relay=relay_a, protocols=protocols) as a,
        web_server(agent_of(script), store=path, relay=relay_b, protocols=protocols) as b,
        httpx.AsyncClient(timeout=20) as client,
    ):
        await attach_relay(a.host, relay_a)
        replies: list[httpx.Response] = []

        async def run_on_a() -> None:
            replies.append(
                await client.post(f"{a.url}/api/chat", json=body("k", "go", message_id="u1"))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_on_a)
            await held["open"].wait()  # its second step: the first is saved
            answer = await _stored_answer(b.host.store, "k")
            cancel = await client.post(
                f"{b.url}/a2a/tasks/{task_id_of('k', answer.id)}:cancel", headers=JSON
            )
            with trio.move_on_after(3):  # (before: A's turn ran on, held by its tool)
                while not replies:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            held["release"].set()
        await wait_idle(a, "k")
        stored = await _stored_answer(a.host.store, "k")
    assert 'data: {"type":"abort","reason":"canceled by the A2A client"}' in replies[0].text
    assert stored.interrupted
    assert cancel.status_code == 200 and cancel.json()["status"]["state"] == "TASK_STATE_CANCELED"
    assert len(script.requests) == 2  # never the third step
