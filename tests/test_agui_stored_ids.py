"""A new AG-UI user message sent under an id its thread already stores for another
message (an answer's, an earlier user message's, or the last one's with other words):
a 409 ``id_taken`` and nothing stored, as the AI SDK endpoint refuses an earlier
message's id (:mod:`runtime.app.web.resend`), never the thread's snapshot with the
message dropped. The same message sent again (a replayed run) is still the snapshot."""

from __future__ import annotations

import pytest

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_agui import post, run, run_input, user
from tests.web.harness import web_server


def two_answers() -> Agent:
    return Agent(name="a", provider=ScriptedProvider([["One."], ["Two."]]))


def answer_id(events: list[dict]) -> str:
    (start,) = [e for e in events if e["type"] == "TEXT_MESSAGE_START"]
    return str(start["messageId"])


@pytest.mark.parametrize("taken", ["answer", "earlier", "last"])
async def test_a_new_user_message_under_an_id_the_thread_stores_is_409_and_stores_nothing(
    taken: str,
) -> None:
    async with web_server(two_answers(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("hi", "u1"), runId="r1"))
        held = [user("hi", "u1"), {"id": answer_id(first), "role": "assistant", "content": "One."}]
        if taken == "earlier":
            await run(server, run_input("t", *held, user("more", "u2"), runId="r2"))
        sent_id = {"answer": answer_id(first), "earlier": "u1", "last": "u1"}[taken]
        before = len((await server.host.store.load("t")).messages)
        r = await post(server, run_input("t", *held, user("other words", sent_id), runId="r3"))
        record = await server.host.store.load("t")
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "id_taken"
    assert len(record.messages) == before
    assert all("other words" not in str(m.content) for m in record.messages)


async def test_the_last_user_message_sent_again_is_the_threads_snapshot() -> None:
    async with web_server(two_answers(), protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("hi", "u1"), runId="r1"))
        again = await run(server, run_input("t", user("hi", "u1"), runId="r1"))
    assert [e["type"] for e in again] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]


async def test_on_a_worker_front_end_a_new_message_under_an_answers_id_is_409(
    pg_url: str,
) -> None:
    from tests.support.redis import require_redis
    from tests.test_frontend import deployment
    from tests.test_worker_protocols import agui_post, agui_run

    async with deployment(pg_url, require_redis(), two_answers(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        first = await agui_run(url, run_input("w", user("hi", "u1"), runId="r1"))
        held = [user("hi", "u1"), {"id": answer_id(first), "role": "assistant", "content": "One."}]
        r = await agui_post(url, run_input("w", *held, user("more", answer_id(first)), runId="r2"))
        record = await d.store.load("w")
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "id_taken"
    assert len(record.messages) == 2
