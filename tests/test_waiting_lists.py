"""Waiting turns where sessions are listed (docs/approval.md): the stored meta says how
many calls a session's last turn waits for, so the web API's list, the page's sidebar
and the command line's ``sessions`` mark it without loading its history."""

from __future__ import annotations

import argparse
import json

import httpx

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Host
from runtime.app.cli import sessions_command
from runtime.approval import WAITING_META
from runtime.liveness import PAUSED_META, RUNNING_META
from runtime.messages import UserMessage
from tests.support import approval_agents
from tests.test_web_http import body
from tests.web.harness import web_server


def two_calls() -> Agent:
    """Asks for two approvals in one step, then answers."""
    steps = [
        [
            *tool_call("get_weather", {"city": "Oslo"}, tool_call_id="c0"),
            *tool_call("get_weather", {"city": "Paris"}, tool_call_id="c1"),
        ],
        ["Both checked."],
    ]
    return Agent(provider=ScriptedProvider(steps), tools=[approval_agents.get_weather])


async def test_the_stored_meta_counts_the_waiting_calls_down_to_zero(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(two_calls(), session_id="s")
        first = await session.run("weather?")
        waiting = [(await host.store.load("s")).meta[WAITING_META]]  # type: ignore[union-attr]
        await session.decide(first.pending[0].approval_id, approved=True)
        waiting.append((await host.store.load("s")).meta[WAITING_META])  # type: ignore[union-attr]
        result = await session.respond(first.pending[1].approval_id, approved=False)
        record = await host.store.load("s")
    assert waiting == [2, 1]
    assert result is not None and result.text == "Both checked."
    assert record is not None and record.meta[WAITING_META] == 0


async def test_a_new_message_clears_the_mark_of_the_turn_it_supersedes():
    steps = [[*tool_call("get_weather", {"city": "Oslo"})]]
    provider = ScriptedProvider(turns=[steps, [["something else"]]])
    agent = Agent(provider=provider, tools=[approval_agents.get_weather])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("weather?")
        marked = (await host.store.load("s")).meta[WAITING_META]  # type: ignore[union-attr]
        await session.run("never mind")
        record = await host.store.load("s")
    assert marked == 1 and record is not None and record.meta[WAITING_META] == 0


async def test_a_session_that_never_waited_has_no_mark():
    agent = Agent(provider=ScriptedProvider([["hi"]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("hello")
        await session.run("again")
        record = await host.store.load("s")
    assert record is not None and WAITING_META not in record.meta


async def test_the_web_api_lists_how_many_calls_a_session_waits_for():
    def agent_for(session_id: str) -> Agent:
        if session_id == "waits":
            return two_calls()
        return Agent(provider=ScriptedProvider([["hi"]]))

    async with (
        web_server(agent_for) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        await client.post("/api/chat", json=body("waits", "weather?"))
        await client.post("/api/chat", json=body("idle", "hello"))
        listed = (await client.get("/api/sessions")).json()["sessions"]
        one = (await client.get("/api/sessions/waits")).json()
    marks = {s["session_id"]: (s["busy"], s["waiting"]) for s in listed}
    assert marks == {"waits": (False, 2), "idle": (False, 0)}
    assert one["waiting"] == 2


async def test_the_sessions_command_marks_a_waiting_session(tmp_path, capsys):
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(approval_agents.agent, "s1")
        await session.run("weather?")
    capsys.readouterr()
    assert await sessions_command(argparse.Namespace(store=str(db))) == 0
    line = capsys.readouterr().out.strip()
    assert line == "s1\t2 messages\tasks\twaiting for input (1 call)"


async def test_the_sessions_commands_json_leaves_out_the_runners_own_meta(tmp_path, capsys):
    """``axon sessions --json`` shows a session's meta as the web lists and
    ``session.meta`` do (:func:`runtime.liveness.public_meta`): the running marker and
    the paused mark (the runner's own) left out, ``awaiting_input`` and the
    application's keys kept."""
    db = tmp_path / "s.db"
    meta = {RUNNING_META: {"turn_id": "t"}, PAUSED_META: None, WAITING_META: 1, "title": "t"}
    store = await SQLiteStore.open(db)
    await store.save("s1", 0, (UserMessage(content="hi"),), meta)
    await store.aclose()
    args = argparse.Namespace(store=str(db), json=True)
    assert await sessions_command(args) == 0
    listed = json.loads(capsys.readouterr().out)["sessions"]
    assert [s["meta"] for s in listed] == [{WAITING_META: 1, "title": "t"}]
