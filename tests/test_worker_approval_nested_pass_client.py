"""A sub-agent's client-side tool passed up (``as_tool(pass_approvals=True)``) in the
worker deployment (real PostgreSQL and Redis, in process): the calling row waits, its
stream shows the sub call (``tool-input-available``, id ``H.L``); the AI SDK
continuation answering that part resumes both turns on a worker; an output that does
not fit the client tool's schema is a 400 and one posted for the sub-session a 409,
both changing nothing; the sub-agent's ``approval_timeout`` expires the calling row;
of two racing outputs one is taken."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.approval import pending_calls
from runtime.messages import ToolMessage
from tests.support.redis import require_redis
from tests.test_approval_nested_pass_client import (
    ASKED,
    _clear,  # noqa: F401 (fixture)
    _helper_model,
    _parent_model,
    locate,
    sub_steps,
)
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, expire_waiting_turn, payloads, waiting_turn
from tests.test_worker_approval_nested_pass import _answer

SUB = "s1.helper.H"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def calling(timeout: float | None = None) -> Agent:
    helper = Agent(
        name="helper",
        provider=ScriptedProvider(responder=_helper_model),
        tools=[locate],
        approval_timeout=timeout,
    )
    return Agent(
        name="calls",
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


def _sub_part(output: Any) -> dict[str, Any]:
    return {
        "type": "tool-locate",
        "toolCallId": ASKED,
        "state": "output-available",
        "input": {"precise": True},
        "output": output,
    }


async def _suspend(d: Any, client: httpx.AsyncClient) -> tuple[str, list[dict[str, Any]]]:
    """The calling turn's message id and its stream's chunks."""
    response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "go"))
    events = payloads(sse_events(response.text))
    await waiting_turn(d)
    return events[0]["messageId"], events


async def test_a_workers_calling_turn_shows_the_sub_call_and_its_output_resumes_both(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, first = await _suspend(d, client)
            response = await client.post(
                f"{d.urls[0]}/api/chat",
                json=_answer("s1", message_id, _sub_part({"city": "Paris"})),
            )
        turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        sub = await d.store.load(SUB)
    shown = [
        (c["toolCallId"], c["toolName"], c.get("providerExecuted"))
        for c in first
        if c["type"] == "tool-input-available"
    ]  # H again, run by the server, before the sub call (useChat's automatic send)
    assert shown == [("H", "helper", None), ("H", "helper", True), (ASKED, "locate", None)]
    second = payloads(sse_events(response.text))
    done = [c for c in second if c["type"] == "tool-output-available" and not c.get("preliminary")]
    assert [(c["toolCallId"], c["output"]) for c in done] == [("H", "you are in Paris")]
    assert second[-1]["finishReason"] == "stop"
    assert turn is not None and turn.status == "done" and sub_steps == [0, 1]
    assert sub is not None and pending_calls(list(sub.messages)) == ()


async def test_a_workers_output_that_does_not_fit_is_a_400_and_one_for_the_sub_session_a_409(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, _ = await _suspend(d, client)
            before = await d.store.load("s1")
            bad = await client.post(
                f"{d.urls[0]}/api/chat",
                json=_answer("s1", message_id, _sub_part({"town": "Paris"})),
            )
            sub = await d.store.load(SUB)
            assert sub is not None
            part = {**_sub_part({"city": "Oslo"}), "toolCallId": "L"}
            foreign = await client.post(
                f"{d.urls[0]}/api/chat", json=_answer(SUB, sub.messages[1].id, part)
            )
            after = await d.store.load("s1")
            sub_after = await d.store.load(SUB)
    assert bad.status_code == 400, bad.text
    assert foreign.status_code == 409 and "'s1'" in foreign.text, foreign.text
    assert before is not None and after is not None and after.version == before.version
    assert sub_after is not None
    assert [c.decided for c in pending_calls(list(sub_after.messages))] == [False]
    assert sub_steps == [0]


async def test_the_sub_agents_timeout_expires_the_calling_row_and_errors_its_client_call(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling(timeout=600)) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            await _suspend(d, client)
        turn = await expire_waiting_turn(d)
        record = await d.store.load("s1")
        sub = await d.store.load(SUB)
    assert turn is not None and turn.status == "done"
    assert record is not None and sub is not None
    (result,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert result.output == "unknown place: timed out"
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert located.error == "timed out" and sub_steps == [0, 1]


async def test_two_racing_outputs_posted_to_a_worker_deployment_one_is_taken(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, _ = await _suspend(d, client)
            responses: list[httpx.Response] = []

            async def post(city: str) -> None:
                sent = _answer("s1", message_id, _sub_part({"city": city}))
                responses.append(await client.post(f"{d.urls[0]}/api/chat", json=sent))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "Paris")
                nursery.start_soon(post, "Rome")
        turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        sub = await d.store.load(SUB)
        record = await d.store.load("s1")
    statuses = sorted(r.status_code for r in responses)
    assert statuses[0] == 200 and 400 <= statuses[1] < 500, [r.text for r in responses]
    assert turn is not None and turn.status == "done" and sub_steps == [0, 1]
    assert sub is not None and record is not None
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    (h,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert h.output == f"you are in {located.output['city']}"


async def test_a_workers_stored_form_shows_each_sub_call_answered_in_turn(
    pg_url: str, redis_url: str
) -> None:
    """The sub-agent asks for two client calls in turn, each answered over HTTP and run
    on by a worker: a reload (``?view=ui``) shows both sub calls with their outputs, as
    the streams showed them (before: the last one only, the calling call's one wait)."""
    from tests.test_approval_nested_pass_client import _locates_twice_model

    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_locates_twice_model), tools=[locate]
    )
    agent = Agent(
        name="calls",
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    streams: list[list[dict[str, Any]]] = []
    async with deployment(pg_url, redis_url, agent) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, first = await _suspend(d, client)
            streams.append(first)
            for n, city in enumerate(["Paris", "Rome"]):
                part = {**_sub_part({"city": city}), "toolCallId": f"H.L{n}"}
                part["input"] = {"precise": n == 1}
                response = await client.post(
                    f"{d.urls[0]}/api/chat", json=_answer("s1", message_id, part)
                )
                assert response.status_code == 200, response.text
                streams.append(payloads(sse_events(response.text)))
            page = (await client.get(f"{d.urls[0]}/api/sessions/s1", params={"view": "ui"})).json()
    shown = [
        [c["toolCallId"] for c in events if c["type"] == "tool-input-available"]
        for events in streams
    ]
    assert shown == [["H", "H", "H.L0"], ["H.L1"], []]  # (each stream shows its own)
    parts = [p for p in page["ui_messages"][-1]["parts"] if p["type"].startswith("tool-")]
    assert [(p["toolCallId"], p["state"], p.get("output")) for p in parts] == [
        ("H", "output-available", "Paris then Rome"),
        ("H.L0", "output-available", {"city": "Paris"}),
        ("H.L1", "output-available", {"city": "Rome"}),
    ]
