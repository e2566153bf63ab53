"""Approve-with-edits attacked as a careless user and an attacker would (docs/approval.md,
"Approving with edits"): an edit is checked in the form the store gives back (the one
the tool runs with), a validator of the tool's own that raises refuses it (not a 500), a
key the tool does not take is refused (the tool would run without it), and what a
refusal echoes of the edit is bounded. Guards: deep nesting and non-JSON values are
refusals, a per-call approval rule does not ask again about the approved edit, two
racing edits record one whose input is the one run (embedded and on the worker
deployment's front ends), another session's call and a decided call take no edit."""

from __future__ import annotations

import math
from typing import Any

import httpx
import orjson
import pytest
import trio
from pydantic import BaseModel, field_validator

from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from runtime import Agent, Host, Tool, tool
from runtime.approval import ECHOED_CHARS
from runtime.errors import AlreadyDecided, InvalidDecision, SessionBusy, UnknownApproval
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage
from tests.support.redis import require_redis
from tests.test_agui import post as agui_post_embedded
from tests.test_agui import run, run_input, user
from tests.test_frontend import LIMIT
from tests.test_worker_protocols import agui_agent, agui_post, agui_run, protocols_deployment
from tests.web.harness import web_server

ran: list[Any] = []


@tool(needs_approval=True)
async def scale(x: float) -> str:
    """Scale by ``x``."""
    ran.append(x)
    return f"scaled {x}"


@tool(needs_approval=True)
async def tally(counts: dict[str, int]) -> str:
    """Tally ``counts``."""
    ran.append(counts)
    return "tallied"


@tool(needs_approval=True)
async def remove(path: str, recursive: bool = False) -> str:
    """Remove ``path``."""
    ran.append((path, recursive))
    return f"removed {path}"


@tool(needs_approval=True)
async def anything(key: str, data: Any = None) -> str:
    """Store ``data`` under ``key``."""
    ran.append((key, data))
    return "stored"


class Target(BaseModel):
    name: str

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name == "boom":
            raise TypeError("no such target")  # (pydantic passes a TypeError through)
        return name


@tool(needs_approval=True)
async def aim(target: Target) -> str:
    """Aim at ``target``."""
    ran.append(target.name)
    return f"aimed at {target.name}"


def _only_etc(arguments: dict[str, Any], ctx: Any) -> bool:
    return str(arguments["path"]).startswith("/etc")


@tool(needs_approval=_only_etc)
async def wipe(path: str) -> str:
    """Wipe ``path`` (asks only under /etc)."""
    ran.append(path)
    return f"wiped {path}"


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()


def agent(t: Tool, first: dict[str, Any]) -> Agent:
    steps = [[*tool_call(t.name, first, tool_call_id="c1")], ["done"], ["again"]]
    return Agent(provider=ScriptedProvider(steps), tools=[t])


def the_call(messages: Any) -> ToolCallPart:
    (call,) = [
        p
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]
    return call


async def refused(tmp_path: Any, t: Tool, first: dict[str, Any], edit: Any) -> str:
    """The refusal of ``edit`` (its text), checked to have recorded nothing: the call
    still waits and a plain approval then runs the model's input."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent(t, first), session_id="s")
        waited = await session.run("go")
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision) as caught:
            await session.respond(waited.pending[0].approval_id, approved=True, edited_input=edit)
        after = await host.store.load("s")
        assert before is not None and after is not None
        assert after.version == before.version and after.messages == before.messages
        assert ran == []
        await session.respond(waited.pending[0].approval_id, approved=True)
    assert len(ran) == 1
    return str(caught.value)


# -- findings -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
async def test_an_edit_the_store_would_turn_into_input_the_tool_refuses_is_refused(tmp_path, value):
    # Checked as given, {"x": nan} passed the float parameter, was stored {"x": null}
    # and ran into "invalid arguments for scale" after the person approved it.
    says = await refused(tmp_path, scale, {"x": 2.0}, {"x": value})
    assert "invalid arguments for scale" in says and "x:" in says
    assert ran == [2.0]


async def test_a_tool_validator_that_raises_refuses_the_edit_as_400_not_500():
    async with web_server(agent(aim, {"target": {"name": "a"}}), protocols=("ag-ui",)) as srv:
        first = await run(srv, run_input("t", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": {"target": {"name": "boom"}}}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        before = await srv.host.store.load("t")
        answer = await agui_post_embedded(
            srv, run_input("t", user("go", "m1"), resume=resume, runId="r2")
        )
        after = await srv.host.store.load("t")
    assert (answer.status_code, answer.json()["code"]) == (400, "InvalidDecision"), answer.text
    assert "validation raised TypeError" in answer.json()["error"]
    assert before is not None and after is not None and after.version == before.version
    assert ran == []


@pytest.mark.parametrize(
    "edit",
    [
        {"path": "/tmp/x", "recursve": True},  # misspelt: ran without it
        {"path": "/tmp/x", "ctx": "anything"},
        {"path": "/tmp/x", "k" * 10_000: 1},  # (within max_tool_result_chars: its echo cut)
    ],
)
async def test_an_edit_naming_an_argument_the_tool_does_not_take_is_refused(tmp_path, edit):
    says = await refused(tmp_path, remove, {"path": "/tmp/a"}, edit)
    assert "does not take" in says and "path, recursive" in says
    assert len(says) < 2 * ECHOED_CHARS + 300
    assert ran == [("/tmp/a", False)]


async def test_a_key_the_models_own_input_had_may_stay_in_the_edit(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(
            agent(remove, {"path": "/tmp/a", "note": "x"}), session_id="s"
        )
        waited = await session.run("go")
        edit = {"path": "/tmp/b", "note": "x"}
        await session.respond(waited.pending[0].approval_id, approved=True, edited_input=edit)
    assert ran == [("/tmp/b", False)]


@pytest.mark.parametrize("keys", [1, 5])
async def test_what_a_refusal_echoes_of_the_edit_is_bounded(tmp_path, keys):
    # The tool's error names each bad key: a 100 KB key was a 100 KB refusal (a 400's
    # body), five of them 500 KB. (10 KB keys here: an edit past the agent's
    # max_tool_result_chars is refused before the tool's check, EditTooLarge.)
    edit = {"counts": {f"k{i}" + "x" * 10_000: "not a number" for i in range(keys)}}
    says = await refused(tmp_path, tally, {"counts": {"a": 1}}, edit)
    assert "invalid arguments for tally" in says and "characters cut" in says
    assert len(says) <= ECHOED_CHARS + 200


# -- guards -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xff", "cannot be stored as JSON"),
        ("bad\ud800", "cannot be stored as JSON"),
    ],
)
async def test_an_edit_the_store_cannot_write_is_refused(tmp_path, data, says):
    text = await refused(tmp_path, anything, {"key": "a"}, {"key": "b", "data": data})
    assert says in text and "tool returned" not in text


@pytest.mark.parametrize("depth", [300, 5_000])
async def test_an_edit_nested_past_the_stores_depth_is_refused(tmp_path, depth):
    data: Any = 1
    for _ in range(depth):
        data = {"a": data}
    text = await refused(tmp_path, anything, {"key": "a"}, {"key": "b", "data": data})
    assert "cannot be stored as JSON" in text


async def test_an_agui_edit_nested_deeper_than_the_store_takes_is_400(tmp_path):
    async with web_server(agent(anything, {"key": "a"}), protocols=("ag-ui",)) as srv:
        first = await run(srv, run_input("t", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        codes = []
        for depth in (300, 1_000, 5_000):  # the store's depth, orjson's parse limit, past it
            body = run_input(
                "t",
                user("go", "m1"),
                resume=[
                    {
                        "interruptId": interrupt["id"],
                        "status": "resolved",
                        "payload": {"approved": True, "editedArgs": {"key": "b", "data": 0}},
                    }
                ],
                runId=f"r{depth}",
            )
            raw = orjson.dumps(body).replace(
                b'"data":0', b'"data":' + b'{"a":' * depth + b"1" + b"}" * depth
            )
            codes.append((await agui_post_embedded(srv, raw)).status_code)
    assert codes == [400, 400, 400] and ran == []


async def test_an_edit_a_per_call_rule_would_not_ask_about_runs_once_as_approved(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent(wipe, {"path": "/etc/x"}), session_id="s")
        waited = await session.run("go")
        (call,) = waited.pending
        result = await session.respond(
            call.approval_id, approved=True, edited_input={"path": "/tmp/x"}
        )
        record = await host.store.load("s")
    assert result is not None and result.finish_reason == "stop" and ran == ["/tmp/x"]
    assert record is not None
    part = the_call(record.messages)
    assert part.input == {"path": "/tmp/x"} and part.awaiting is not None
    assert part.awaiting.original_input == {"path": "/etc/x"}
    assert [m.output for m in record.messages if isinstance(m, ToolMessage)] == ["wiped /tmp/x"]


async def test_two_racing_edits_record_one_and_it_is_the_input_run(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent(remove, {"path": "/a"}), session_id="s")
        waited = await session.run("go")
        approval_id = waited.pending[0].approval_id
        outcomes: dict[str, str] = {}

        async def edit(path: str) -> None:
            try:
                await session.respond(approval_id, approved=True, edited_input={"path": path})
                outcomes[path] = "recorded"
            except (SessionBusy, AlreadyDecided) as exc:
                outcomes[path] = type(exc).__name__

        async with trio.open_nursery() as nursery:
            nursery.start_soon(edit, "/b")
            nursery.start_soon(edit, "/c")
        with pytest.raises(AlreadyDecided):  # and a third, later, is refused
            await session.respond(approval_id, approved=True, edited_input={"path": "/d"})
        record = await host.store.load("s")
    (winner,) = [p for p, o in outcomes.items() if o == "recorded"]
    assert ran == [(winner, False)]
    assert record is not None and the_call(record.messages).input == {"path": winner}


async def test_another_sessions_call_takes_no_edit(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        mine = await host.open_session(agent(remove, {"path": "/a"}), session_id="mine")
        theirs = await host.open_session(agent(remove, {"path": "/b"}), session_id="theirs")
        await mine.run("go")
        waited = await theirs.run("go")
        before = await host.store.load("theirs")
        with pytest.raises(UnknownApproval):
            await mine.respond(
                waited.pending[0].approval_id, approved=True, edited_input={"path": "/x"}
            )
        after = await host.store.load("theirs")
    assert before is not None and after is not None and after.version == before.version
    assert ran == []


# -- the worker deployment (the suite's PostgreSQL and Redis) -------------------------------


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_two_racing_agui_edits_on_two_front_ends_record_one_and_run_it(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent(), fronts=2) as d:
        first = await agui_run(d.urls[0], run_input("r1", user("approve it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        codes: dict[int, int] = {}

        async def edit(url: str, n: int) -> None:
            payload = {"approved": True, "editedArgs": {"n": n}}
            resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
            body = run_input("r1", user("approve it", "m1"), resume=resume, runId=f"r{n}")
            codes[n] = (await agui_post(url, body)).status_code

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(edit, d.urls[0], 7)
                nursery.start_soon(edit, d.urls[1], 8)
        turn = await d.queue.wait_finished((await d.queue.turns("r1"))[0].turn_id, LIMIT)
        record = await d.store.load("r1")
    (winner,) = [n for n, code in codes.items() if code == 200]
    assert sorted(codes.values()) == [200, 409], codes
    assert turn is not None and turn.resumes == 1
    assert record is not None
    call = the_call(record.messages)
    assert call.input == {"n": winner} and call.awaiting is not None
    assert call.awaiting.original_input == {"n": 1}
    results = [m.output for m in record.messages if isinstance(m, ToolMessage)]
    assert results == [f"recorded {winner}"]


async def test_an_agui_edit_past_javascripts_safe_integers_round_trips_jsonb_exactly(
    pg_url: str, redis_url: str
) -> None:
    big = 2**60 + 1  # not a double: jsonb keeps it exactly, and the tool gets it exactly
    async with protocols_deployment(pg_url, redis_url, agui_agent(), fronts=2) as d:
        first = await agui_run(d.urls[0], run_input("r2", user("approve it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": {"n": big}}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        await agui_run(
            d.urls[1], run_input("r2", user("approve it", "m1"), resume=resume, runId="r2")
        )
        record = await d.store.load("r2")
    assert record is not None and the_call(record.messages).input == {"n": big}
    results = [m.output for m in record.messages if isinstance(m, ToolMessage)]
    assert results == [f"recorded {big}"]


# -- the command line's `e` -----------------------------------------------------------------


def test_an_edit_typed_nested_past_the_parsers_depth_is_asked_again():
    from tests.test_cli_approval import run_in_a_terminal

    proc = run_in_a_terminal("e\n" + "[" * 1_500 + '\ne\n{"city": "Bergen"}')
    assert proc.returncode == 0, proc.stderr
    assert "RecursionError" not in proc.stderr
    (again,) = [line for line in proc.stderr.splitlines() if line.endswith("asked again")]
    assert "not JSON" in again and len(again) < 300
    assert "It is sunny in Bergen." in proc.stdout


@pytest.mark.parametrize(("model", "edit"), [(True, 1), (False, 0), (1, True), ([True], [1])])
async def test_an_edit_that_differs_only_in_bool_against_number_is_an_edit(tmp_path, model, edit):
    # `True == 1` in Python: the edit was taken for the model's own input, a plain
    # approval, and the tool ran with the model's value.
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(
            agent(anything, {"key": "a", "data": model}), session_id="s"
        )
        waited = await session.run("go")
        await session.respond(
            waited.pending[0].approval_id, approved=True, edited_input={"key": "a", "data": edit}
        )
        record = await host.store.load("s")
    assert ran == [("a", edit)] and type(ran[0][1]) is type(edit)
    assert record is not None
    part = the_call(record.messages)
    assert part.awaiting is not None and part.awaiting.original_input == {"key": "a", "data": model}


async def test_the_models_input_sent_back_with_a_float_as_an_integer_is_a_plain_approval(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent(scale, {"x": 2.0}), session_id="s")
        waited = await session.run("go")
        await session.respond(waited.pending[0].approval_id, approved=True, edited_input={"x": 2})
        record = await host.store.load("s")
    assert record is not None and ran == [2.0]
    part = the_call(record.messages)
    assert part.input == {"x": 2.0} and part.awaiting is not None
    assert part.awaiting.original_input is None


async def test_an_edit_after_the_deadline_is_refused_and_the_edit_is_not_kept():
    from runtime import WaitExpired

    now = [1_700_000_000.0]
    steps = [[*tool_call("remove", {"path": "/a"}, tool_call_id="c1")], ["answered"]]
    timed = Agent(provider=ScriptedProvider(steps), tools=[remove], approval_timeout=60)
    async with Host.open(log_tap=False) as host:
        host.clock = lambda: now[0]  # past the deadline; the timer sleeps on
        session = await host.open_session(timed, session_id="s")
        first = await session.run("go")
        now[0] += 61
        with pytest.raises(WaitExpired):
            await session.respond(
                first.pending[0].approval_id, approved=True, edited_input={"path": "/b"}
            )
        record = await host.store.load("s")  # (denied "timed out" now, or soon: either way)
    assert ran == [] and record is not None
    part = the_call(record.messages)
    assert part.input == {"path": "/a"} and part.awaiting is not None
    assert part.awaiting.original_input is None and part.awaiting.approved is not True


async def test_every_view_of_an_edited_call_shows_the_edit_and_its_result():
    async with web_server(agent(remove, {"path": "/a"}), protocols=("ai-sdk", "ag-ui")) as srv:
        first = await run(srv, run_input("t", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": {"path": "/b"}}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        await run(srv, run_input("t", user("go", "m1"), resume=resume, runId="r2"))
        replay = await run(srv, run_input("t", resume=resume, runId="r3"))
        async with httpx.AsyncClient(base_url=srv.url) as client:
            got = await client.get("/api/sessions/t")
            assert got.status_code == 200, (got.status_code, got.text[:300])
            stored = got.json()
    assert ran == [("/b", False)]
    (snapshot,) = [e for e in replay if e["type"] == "MESSAGES_SNAPSHOT"]
    (call,) = [c for m in snapshot["messages"] for c in m.get("toolCalls") or ()]
    assert orjson.loads(call["function"]["arguments"]) == {"path": "/b"}
    (result,) = [m for m in snapshot["messages"] if m["role"] == "tool"]
    assert result["content"] == "removed /b"
    (part,) = [p for m in stored["ui_messages"] for p in m["parts"] if p.get("toolCallId")]
    assert part["input"] == {"path": "/b"} and part["output"] == "removed /b"
    # the model's input is kept for the record where the page reads it, nowhere else
    assert part["toolMetadata"] == {"axonOriginalInput": {"path": "/a"}}
    del part["toolMetadata"]
    assert "/a" not in orjson.dumps(stored["ui_messages"]).decode()
