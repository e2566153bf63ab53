"""Integers past 64 bits lose nothing, end to end (branch ``bigints``).

orjson, Axon's JSON library, reads an integer literal outside [-2**63, 2**64) as a float
(``123456789012345678901234567890`` is ``1.2345678901234568e+29``) and refuses to write
a Python ``int`` past it (``TypeError: Integer exceeds 64-bit range``). JSON and Python
have no such limit: a model's tool call, a tool's return value, a client's output may
hold one. Each test says what the user sees and what is saved; each failed before
(:func:`runtime.serde.dumps` writes such an integer exactly, :func:`runtime.serde.loads`
and :func:`runtime.serde.exact` read it back exactly; orjson stays the fast path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import httpx
import pydantic
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool
from runtime import output as o
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from tests.test_frontend import body, data, deployment
from tests.test_relay import USAGE, opened, read_all, redis_url
from tests.test_relay_web import sse_events
from tests.test_stores import store

__all__ = ["redis_url", "store"]  # (the fixtures)

ROOT = str(Path(__file__).resolve().parents[1])
BIG = 123456789012345678901234567890
"""Past 64 bits: orjson reads it as 1.2345678901234568e+29, which pydantic's ``int``
takes as the wrong integer 123456789012345677877719597056."""


@tool
async def double(n: int) -> dict:
    """Doubles n."""
    return {"n": n, "twice": 2 * n, "negative": -n}


def _doubled(n: int) -> dict[str, int]:
    return {"n": n, "twice": 2 * n, "negative": -n}


# -- the Redis relay -----------------------------------------------------------------------


async def test_a_relayed_call_and_result_with_integers_past_64_bits_read_back_exactly(
    redis_url: str,
) -> None:
    """A worker's stream goes through Redis to the front end that serves the user. The
    user sees the call's input and result as the tool had them; before, the writer's
    flush raised (orjson), the batch was lost and the readers told to reload."""
    chunks: list[Any] = [
        o.Start(message_id="m1", turn_id="t", session_id="s"),
        o.StepStart(step=0),
        o.ToolCall(step=0, tool_call_id="c", tool_name="double", input={"n": BIG}),
        o.ToolResult(step=0, tool_call_id="c", tool_name="double", output=_doubled(BIG)),
        o.StepFinish(step=0, finish_reason="tool-calls", usage=USAGE),
        o.Finish(finish_reason="stop", usage=USAGE),
    ]
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.extend(chunks)
        with trio.fail_after(10):
            await writer.aclose()
        got = await read_all(relay, "t")
    assert writer.lost == 0
    assert [attrs.evolve(c, seq=0) for c in got] == chunks
    call, result = got[2], got[3]
    assert type(call.input["n"]) is int and call.input["n"] == BIG
    assert result.output == _doubled(BIG) and type(result.output["twice"]) is int


async def test_a_worker_deployment_streams_and_stores_integers_past_64_bits_exactly(
    pg_url: str, redis_url: str
) -> None:
    """A model's call ``double(n=BIG)`` run by a worker, streamed to the user's POST
    through Redis and saved in PostgreSQL: the stream's ``tool-input-available`` and
    ``tool-output-available`` hold the exact integers (as JSON numbers), and so do the
    stored call and result. Before: the call was refused ("its input cannot be stored
    ...; send such a value as a string") and its input stored as text."""
    steps = [[*tool_call("double", {"n": BIG}, tool_call_id="D")], ["done"]]
    agent = Agent(name="a", provider=ScriptedProvider(steps), tools=[double])
    async with deployment(pg_url, redis_url, agent) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            response = await client.post("/api/chat", json=body("big"))
        record = await d.store.load("big")
    events = data(sse_events(response.text))
    assert [e for e in events if e["type"] == "error"] == []
    [shown_input] = [e["input"] for e in events if e["type"] == "tool-input-available"]
    [shown_output] = [e["output"] for e in events if e["type"] == "tool-output-available"]
    assert shown_input == {"n": BIG} and shown_output == _doubled(BIG)
    assert record is not None
    calls = [
        p
        for m in record.messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [c.input for c in calls] == [{"n": BIG}]
    assert [(r.output, r.error) for r in results] == [(_doubled(BIG), None)]
    assert json.loads(json.dumps(results[0].output)) == _doubled(BIG)


# -- structured output -----------------------------------------------------------------------


class Count(pydantic.BaseModel):
    n: int


@pytest.mark.parametrize("kind", ["json-schema", "pydantic"])
async def test_a_structured_answer_past_64_bits_is_the_output_exactly(
    tmp_path: Any, kind: str
) -> None:
    """The model answers ``{"n": BIG}`` for an ``output_type`` with an integer field: the
    user's ``result.output`` holds BIG and the stored answer reads back with it. Before,
    a JSON-schema ``output_type`` (read by orjson) gave ``{"n": 1.2345678901234568e+29}``,
    which its ``integer`` took (an integral float). (A pydantic type reads with
    pydantic's own parser, exact already.)"""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    output_type: Any = schema if kind == "json-schema" else Count
    agent = Agent(provider=ScriptedProvider([[f'{{"n": {BIG}}}']]), output_type=output_type)
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("count")
    async with Host.open(store=path, log_tap=False) as host:
        stored = (await host.store.load("s")).messages
    n = result.output["n"] if kind == "json-schema" else result.output.n
    assert n == BIG and type(n) is int
    assert agent.output_schema.parse(stored[-1].content[0].text) == result.output


# -- MCP -------------------------------------------------------------------------------------


async def test_an_mcp_tools_structured_result_past_64_bits_is_kept_exactly(tmp_path: Any) -> None:
    """The model calls the stdio MCP server's ``add(a=BIG, b=1)`` (its result is
    structured content): the server gets BIG, the user sees the result BIG + 1 and the
    store keeps it. Before, the call was refused ("its input cannot be stored ...")."""
    from tests.test_mcp import calling, stdio_server, tool_messages

    agent = Agent(provider=calling(("add", {"a": BIG, "b": 1})), tools=[stdio_server()])
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("go")
        live = tool_messages(session)["add"]
    async with Host.open(store=path, log_tap=False) as host:
        stored = (await host.store.load("s")).messages
    assert (result.finish_reason, result.error) == ("stop", None)
    assert (live.output, live.error) == (BIG + 1, None)
    assert [m.output for m in stored if isinstance(m, ToolMessage)] == [BIG + 1]


# -- the stores ------------------------------------------------------------------------------


async def test_each_store_keeps_integers_past_64_bits_in_messages_and_meta(store: Any) -> None:
    """A session whose call, result and meta hold integers past 64 bits (both signs, a
    list, a dict key) is saved by each built-in store and loaded back the same: what the
    user's next turn and ``GET /api/sessions`` read. Before, the save raised StoreError
    ("message 1 cannot be serialized": orjson), and nothing of the turn was kept."""
    call = ToolCallPart(tool_call_id="c", tool_name="t", input={"n": BIG, "m": [-BIG, 1]}, step=0)
    messages = [
        UserMessage(content="go", id="u1"),
        AssistantMessage(content=(call,), id="a1"),
        ToolMessage(
            tool_call_id="c", tool_name="t", step=0, output={"n": BIG, "k": 2**64}, id="t1"
        ),
    ]
    await store.save("s", 0, messages, {"counter": BIG})
    await store.save("s", 3, [UserMessage(content="more", id="u2")], {"other": -BIG})
    record = await store.load("s")
    assert list(record.messages) == [*messages, UserMessage(content="more", id="u2")]
    assert record.messages[1].content[0].input == {"n": BIG, "m": [-BIG, 1]}
    assert record.messages[2].output == {"n": BIG, "k": 2**64}
    assert (record.meta["counter"], record.meta["other"]) == (BIG, -BIG)


# -- the JSONL recorder ----------------------------------------------------------------------


async def test_a_recorded_call_and_result_past_64_bits_read_back_exactly(tmp_path: Any) -> None:
    """A ``JsonlRecorder`` writes a turn whose call and result hold BIG (its writer falls
    back to the standard library's); ``read_jsonl`` (what ``axon replay`` reads) gives
    BIG back. Before: 1.2345678901234568e+29 (orjson)."""
    from actors.plugins.recorder import JsonlRecorder, read_jsonl

    path = tmp_path / "events.jsonl"
    steps = [[*tool_call("double", {"n": BIG}, tool_call_id="D")], ["done"]]
    async with Host.open(log_tap=False) as host:
        recorder = await host.start_actor(JsonlRecorder(path))
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[double]), session_id="rec"
        )
        await session.run("go")
        await trio.sleep(0.1)
        recorder.stop()
        await recorder.stopped.wait()
    events = read_jsonl(path)
    [call] = [e for e in events if e["kind"] == "output.tool-call"]
    [result] = [e for e in events if e["kind"] == "output.tool-result"]
    assert call["input"] == {"n": BIG} and result["output"] == _doubled(BIG)


# -- the command line ------------------------------------------------------------------------


async def test_show_prints_a_stored_call_and_result_past_64_bits(tmp_path: Any) -> None:
    """``axon show`` of a session whose call and result hold BIG prints their digits
    (and ``--json`` the integers). Before, it raised ``TypeError: Integer exceeds 64-bit
    range`` (orjson) and printed a traceback."""
    import sys

    steps = [[*tool_call("double", {"n": BIG}, tool_call_id="D")], ["done"]]
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[double]), session_id="s"
        )
        await session.run("go")
    shown = [
        await trio.run_process(
            [sys.executable, "-m", "runtime", "show", "s", "--store", str(path), *json_flag],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
        )
        for json_flag in ([], ["--json"])
    ]
    assert [p.returncode for p in shown] == [0, 0], [p.stderr for p in shown]
    assert str(BIG) in shown[0].stdout.decode() and str(2 * BIG) in shown[0].stdout.decode()
    messages = json.loads(shown[1].stdout)
    assert messages[1]["content"][0]["input"] == {"n": BIG}
    assert messages[2]["output"] == _doubled(BIG)


def test_serde_reads_back_what_it_wrote_from_bytes_text_and_memoryviews() -> None:
    """What a store's driver may hand back (bytes, text, a memoryview): each reads the
    integers exactly; a memoryview's ``in`` compares items, so its mark went unseen."""
    from runtime import serde

    data = serde.dumps({"n": BIG, "m": [-(2**63) - 1, 2**64 - 1, 1.5]})
    want = {"n": BIG, "m": [-(2**63) - 1, 2**64 - 1, 1.5]}
    for given in (data, data.decode(), memoryview(data), bytearray(data)):
        assert serde.loads(given) == want and type(serde.loads(given)["n"]) is int
    assert serde.dumps({"n": BIG}, marked=False) == f'{{"n":{BIG}}}'.encode()
    assert serde.exact_loads(b"[1e19, 1.5]") == [1e19, 1.5]  # a float stays a float
