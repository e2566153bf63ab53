"""A client tool's large answer is written as JSON, to be stored and cut to the agent's
``max_tool_result_chars``, in the worker thread that checks it, not again on the event
loop as the session records it: after loopchecks and a2aloop the recording still wrote
the whole answer twice on the loop (``_storable_output``'s ``dumps`` and
``truncate_output``'s), ~0.07 s at 100,000 rows. The decision carries the stored form
(the text cut, with its marker), which the recording keeps as it is. Counted, never
timed: each encode of the whole answer and the thread it ran on."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import orjson
import pytest

from runtime import ToolMessage, json_exact, results
from tests.test_agui import post, run, run_input, user
from tests.test_approval_web import answer
from tests.test_loop_checks import BIG, _output_part, _saved_cut, agent
from tests.test_loop_checks import checks as checks  # the fixture
from tests.test_web_http import body, events
from tests.web.harness import web_server


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each encode of the whole answer (``BIG``'s rows): whether on the loop's thread."""
    on_main: list[bool] = []

    def counting(original: Any) -> Any:
        def encode(value: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(value, dict) and len(value.get("rows") or ()) == len(BIG["rows"]):
                on_main.append(threading.current_thread() is threading.main_thread())
            return original(value, *args, **kwargs)

        return encode

    monkeypatch.setattr(json_exact, "dumps", counting(json_exact.dumps))
    monkeypatch.setattr(results, "dumps", counting(results.dumps))
    return on_main


async def test_an_agui_large_answer_is_encoded_in_the_thread_that_checks_it(checks, encodes):
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
        content = orjson.dumps(BIG).decode()
        answer_ = {"id": "a1", "role": "tool", "toolCallId": wire, "content": content}
        r = await post(server, run_input("s", user("go", "m1"), answer_, runId="r2"))
        record = await server.host.store.load("s")
    assert r.status_code == 200 and '"RUN_FINISHED"' in r.text, r.text
    assert checks.on_main == [False]
    assert encodes and True not in encodes, encodes  # was [..., True, True]: the recording's
    _saved_cut(record)


async def test_an_ai_sdk_large_output_is_encoded_in_the_thread_that_checks_it(checks, encodes):
    async with web_server(agent()) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            sent = answer("s", first[0]["messageId"], _output_part(BIG))
            second = await client.post("/api/chat", json=sent)
        record = await server.host.store.load("s")
    assert second.status_code == 200, second.text
    assert checks.on_main == [False]
    assert encodes and True not in encodes, encodes
    _saved_cut(record)


async def test_session_respond_encodes_a_large_output_in_the_thread_that_checks_it(checks, encodes):
    """``session.respond(call_id, output=BIG)`` from Python (``Session.decide``)."""
    from runtime import Host

    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        await session.run("go")
        done = await session.respond("c1", output=BIG)
        record = await host.store.load("s")
    assert done is not None and done.text == "ok"
    assert checks.on_main == [False]
    assert encodes and True not in encodes, encodes  # was [False, True, True]
    _saved_cut(record)


async def test_an_a2a_large_output_is_encoded_in_the_thread_that_checks_it(checks, encodes):
    """An A2A client's answer (``checked_decisions``, then ``Session.decide`` with the
    stored form): no encode of the whole answer on the loop."""
    from tests.test_a2a import BOTH, sdk
    from tests.test_a2a_loop_checks import _answer_over_a2a

    async with web_server(agent(), protocols=BOTH) as server:
        asked, _ = await sdk(server, lambda c: _answer_over_a2a(c, BIG), streaming=False)
        record = await server.host.store.load(asked.task.context_id)
    assert checks.on_main == [False]
    assert encodes and True not in encodes, encodes
    assert record is not None
    (saved,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert "characters omitted]" in saved.output  # (A2A numbers are doubles: not BIG's text)


async def test_a_decision_with_no_view_in_memory_encodes_a_large_output_in_its_thread(
    checks, encodes
):
    """``Session.decide`` on a session evicted from memory: read, then checked and
    written out in the thread."""
    from runtime import Host

    async with Host.open(max_sessions=1, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        await session.run("go")
        await host.open_session(agent(), session_id="other")  # evicts "s"
        assert session.held_record() is None
        recorded = await session.decide("c1", output=BIG)
        record = await host.store.load("s")
    assert recorded.complete
    assert checks.on_main == [False]
    assert encodes and True not in encodes, encodes
    assert record is not None  # the decision stored cut (decided, not resumed: no result yet)
    (wait,) = [
        p.awaiting
        for m in record.messages
        for p in getattr(m, "content", ())
        if getattr(p, "awaiting", None)
    ]
    assert isinstance(wait.output, str) and "characters omitted]" in wait.output
