"""Two calls that need approval in one step, decided one at a time across a page
reload, by the real ``ai`` package's AbstractChat (the pinned 7 and 6) with
``sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses``: the
first decision sent on its own (202) or not sent at all, the reloaded page shows what
still waits, and its last decision sends the continuation; each approved call runs once.
Embedded (``serve``), and on a worker deployment (PostgreSQL + Redis, the suite's own)
with the page reloaded from the other front end."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent
from tests.support.approval_tools import delete_file, ran
from tests.test_approval_node import ai6_entry
from tests.test_frontend import deployment
from tests.test_worker_approval import redis_url as redis_url  # (the fixture)
from tests.web.harness import WEB, ensure_ai_package, web_server


def agent() -> Agent:
    calls = [
        *tool_call("delete_file", {"path": "/a"}, tool_call_id="A"),
        *tool_call("delete_file", {"path": "/b"}, tool_call_id="B"),
    ]
    return Agent(provider=ScriptedProvider([calls, ["Done."]]), tools=[delete_file])


@pytest.fixture(scope="module", params=["ai7", "ai6"])
def ai(request: pytest.FixtureRequest) -> dict[str, str]:
    node = ensure_ai_package()
    return {"node": node, **({} if request.param == "ai7" else {"ai": ai6_entry()})}


async def drive(ai: dict[str, str], send: bool, url: str, reload_url: str) -> tuple:
    """The chat's record (tests/web/two_approvals_chat.mjs: A approved, B denied) and
    the stored session's UI messages."""
    config = {"url": url, "reloadUrl": reload_url, "chatId": "s", "first": True}
    config |= {"second": False, "send": send, **({"ai": ai["ai"]} if "ai" in ai else {})}
    with trio.fail_after(60):
        proc = await trio.run_process(
            [ai["node"], str(WEB / "two_approvals_chat.mjs"), json.dumps(config)],
            capture_stdout=True,
            cwd=WEB,
        )
    async with httpx.AsyncClient(base_url=reload_url) as client:
        stored = (await client.get("/api/sessions/s?view=ui")).json()
    return json.loads(proc.stdout), stored


async def decide_across_a_reload(ai: dict[str, str], tmp_path: Any, send: bool) -> tuple:
    ran.clear()
    async with web_server(agent(), store=str(tmp_path / "w.db")) as server:
        return await drive(ai, send, server.url, server.url)


def states(message: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["toolCallId"], p["state"]) for p in message["parts"] if "toolCallId" in p]


@pytest.mark.parametrize("send", [True, False], ids=["sent-alone", "not-sent"])
async def test_two_approvals_decided_one_at_a_time_across_a_reload_run_once(ai, tmp_path, send):
    check(*await decide_across_a_reload(ai, tmp_path, send), send)


@pytest.mark.parametrize("send", [True, False], ids=["sent-alone", "not-sent"])
async def test_two_approvals_decided_across_a_reload_from_the_other_front_end_run_once(
    ai, pg_url, redis_url, send
):
    ran.clear()
    async with deployment(pg_url, redis_url, agent(), fronts=2) as d:
        chat, stored = await drive(ai, send, d.urls[0], d.urls[1])
    check(chat, stored, send)


def check(chat: dict[str, Any], stored: dict[str, Any], send: bool) -> None:
    assert chat["error"] is None and chat["firstError"] is None and chat["status"] == "ready"
    # sent alone, the first decision is recorded (202) and the reload shows only B waiting;
    # not sent, the reload shows both again
    assert chat["statuses"] == ([200, 202, 200] if send else [200, 200])
    assert chat["shown"] == (["B"] if send else ["A", "B"])
    message_id = chat["messages"][-1]["id"]
    assert [b.get("messageId") for b in chat["bodies"][1:]] == [message_id] * (
        len(chat["bodies"]) - 1
    )
    assert ran == ["/a"]
    assert states(chat["messages"][-1]) == [("A", "output-available"), ("B", "output-denied")]
    assert states(stored["ui_messages"][-1]) == states(chat["messages"][-1])
