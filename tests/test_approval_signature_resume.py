"""A stream resumed after an approval's call went out (``GET /api/chat/{id}/stream`` with
``Last-Event-ID``) signs the ``tool-approval-request`` from the stored call
(runtime/app/web/resume.py): the reconnecting client can answer with a signature, as
one that read the stream whole. Before, the request came unsigned (no input in the
resumed window to sign), and with ``--require-approval-signature`` that client could
not answer at all without reloading the session.

The turn is held between its call's ``tool-input-available`` and its request by a
gated server tool of the same step (a step's requests go out once its other calls ran),
so the resume starts after the call and before the request, on the embedded app with a
relay and on a worker deployment's front end."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.relays import RedisRelay, attach_relay
from runtime import Agent, tool
from runtime.app.web.signing import ApprovalSigner
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)
from tests.support.redis import require_redis, unique_prefix
from tests.test_approval_web import answer
from tests.test_relay_web import chat_body, sse_events
from tests.web.harness import web_server

SECRET = "resume-secret"
SIGNER = ApprovalSigner(secret=SECRET.encode())

gate = trio.Event()
"""Set by the test once its resumed stream is open: the slow tool returns."""


@tool
async def slow() -> str:
    """Wait for the test's gate."""
    await gate.wait()
    return "slow done"


def gated_agent() -> Agent:
    steps = [
        [
            *tool_call("delete_file", {"path": "/x", "n": 1}, tool_call_id="D"),
            *tool_call("slow", {}, tool_call_id="S"),
        ],
        ["done"],
    ]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file, slow])


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def fresh_gate() -> None:
    global gate
    gate = trio.Event()


async def seq_of_call(client: httpx.AsyncClient, url: str, call_id: str) -> str:
    """The SSE id of call ``call_id``'s ``tool-input-available`` in the resume stream at
    ``url`` (read from the turn's start until it shows)."""
    with trio.fail_after(20):
        while True:
            async with client.stream("GET", url) as response:
                if response.status_code == 200:
                    raw = ""
                    async for text in response.aiter_text():
                        raw += text
                        blocks = raw.split("\n\n")[:-1]
                        for event_id, data in sse_events("\n\n".join(blocks) + "\n\n"):
                            if (
                                isinstance(data, dict)
                                and data["type"] == "tool-input-available"
                                and data["toolCallId"] == call_id
                            ):
                                assert event_id is not None
                                return event_id
            await trio.sleep(0.02)


async def resumed_after_the_call(client: httpx.AsyncClient, stream_url: str) -> list[Any]:
    """The events of a resume from after call D's input, the turn let go on meanwhile."""
    after = await seq_of_call(client, stream_url, "D")
    got: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def resume() -> None:
            r = await client.get(stream_url, headers={"last-event-id": after})
            got.extend(sse_events(r.text))

        nursery.start_soon(resume)
        await trio.sleep(0.3)  # (the resume reading the relay; the result does not rest on it)
        gate.set()
    assert got and all(int(i) > int(after) for i, _ in got if i is not None)
    assert not any(
        isinstance(d, dict) and d.get("toolCallId") == "D" and "input" in d for _, d in got
    )
    return got


def count_reads(store: Any) -> dict[str, int]:
    """How often ``store`` (a front end's) is asked for session ``s``, by method."""
    reads: dict[str, int] = {}
    for name in ("load", "load_last_turn"):
        real = getattr(store, name)

        async def counted(session_id: str, *args: Any, _real: Any = real, _name: str = name) -> Any:
            if session_id == "s":
                reads[_name] = reads.get(_name, 0) + 1
            return await _real(session_id, *args)

        setattr(store, name, counted)
    return reads


def the_request(events: list[Any]) -> dict[str, Any]:
    (request,) = [
        d for _, d in events if isinstance(d, dict) and d["type"] == "tool-approval-request"
    ]
    return request


async def test_an_embedded_resume_after_the_call_gets_the_request_signed(
    redis_url: str, tmp_path: Any
) -> None:
    prefix = unique_prefix()
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as relay,
        web_server(
            gated_agent(), store=str(tmp_path / "w.db"), relay=relay, approval_secret=SECRET
        ) as server,
    ):
        await attach_relay(server.host, relay)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first: list[Any] = []
            async with trio.open_nursery() as nursery:

                async def chat() -> None:
                    r = await client.post("/api/chat", json=chat_body("s"))
                    first.extend(sse_events(r.text))

                nursery.start_soon(chat)
                resumed = await resumed_after_the_call(client, f"{server.url}/api/chat/s/stream")
            request = the_request(resumed)
            expected = SIGNER.sign(
                "s", request["approvalId"], "D", "delete_file", {"path": "/x", "n": 1}
            )
            assert request["signature"] == expected
            assert the_request(first)["signature"] == expected  # what the live stream gave
            # the events after the request keep their order and ids
            ids = [int(i) for i, _ in resumed if i is not None]
            assert ids == sorted(set(ids))
            assert [d["type"] for _, d in resumed if d != "[DONE]"][-2:] == [
                "finish-step",
                "finish",
            ]
            # and the reconnecting client's answer with it verifies: the tool runs once
            message_id = next(
                d["messageId"] for _, d in first if d != "[DONE]" and d["type"] == "start"
            )
            part = {
                "type": "tool-delete_file",
                "toolCallId": "D",
                "state": "approval-responded",
                "approval": {"id": request["approvalId"], "approved": True, "signature": expected},
            }
            done = await client.post("/api/chat", json=answer("s", message_id, part))
    assert done.status_code == 200, done.text
    assert ran == ["/x"]


async def test_a_worker_front_ends_resume_after_the_call_gets_the_request_signed(
    pg_url: str, redis_url: str
) -> None:
    from tests.test_frontend import deployment

    async with deployment(pg_url, redis_url, gated_agent(), fronts=0) as d:
        d.app_options = {"approval_secret": SECRET}
        await d.start_front_end()
        (url,) = d.urls
        reads = count_reads(d.hosts[0].store)
        async with httpx.AsyncClient(timeout=30) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: client.post(f"{url}/api/chat", json=chat_body("s")))
                resumed = await resumed_after_the_call(client, f"{url}/api/chat/s/stream")
    # the front end read the last turn's rows once for it, never the whole session
    assert reads == {"load_last_turn": 1}
    request = the_request(resumed)
    assert request["signature"] == SIGNER.sign(
        "s", request["approvalId"], "D", "delete_file", {"path": "/x", "n": 1}
    )
    assert json.dumps(resumed).count("tool-approval-request") == 1
