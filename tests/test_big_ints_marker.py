"""The mark before an integer past 64 bits (a tab, :data:`runtime.serde.BIG_INT_MARK`),
attacked (branch ``exactints2``).

:func:`runtime.serde.dumps` writes such an integer after a tab, JSON whitespace that
orjson never writes, and :func:`runtime.serde.loads` reads bytes holding a tab again with
the standard library's reader. Outside input holding tabs (a user's text, a tool's
string, a client's pretty-printed JSON) must neither be taken for the mark nor change
meaning; the mark itself must never reach what a model or a person reads as text; and a
value written by a fallback writer must keep its integers."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Host, serde
from runtime.app.web.chat_input import INLINE_BODY
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from runtime.results import truncate_output
from tests.test_approval_web import answer
from tests.test_big_ints_web import pick
from tests.test_stores import store
from tests.test_web_http import body, events
from tests.web.harness import web_server

__all__ = ["store"]  # (the fixture)

ROOT = str(Path(__file__).resolve().parents[1])
BIG = 123456789012345678901234567890
"""Past 64 bits: orjson reads it as 1.2345678901234568e+29."""

_TEXTS = st.text(alphabet=st.sampled_from(["\t", " ", "a", "\n", '"', "\\", "1", "é"]))
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**100), max_value=2**100)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXTS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXTS, inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_a_values_strings_with_tabs_are_never_the_mark_and_every_value_reads_back(
    value: Any,
) -> None:
    """Any JSON value (strings full of tabs, integers of any size): what ``dumps`` writes
    holds a raw tab only as a mark (orjson escapes a string's tab as ``\\t``), and
    ``loads`` gives the value back, each integer an ``int``."""
    data = serde.dumps(value)
    marks = data.count(serde.BIG_INT_MARK)
    assert marks == _bigs(value)
    assert serde.loads(data) == value
    assert serde.dumps(value, marked=False).count(b"\t") == 0


def _bigs(value: Any) -> int:
    if type(value) is int:
        return int(not serde.INT_MIN <= value <= serde.INT_MAX)
    if isinstance(value, dict):
        return sum(map(_bigs, value.values()))
    if isinstance(value, list):
        return sum(map(_bigs, value))
    return 0


@given(_JSON)
def test_json_from_outside_indented_with_tabs_reads_as_it_means(value: Any) -> None:
    """JSON someone else wrote with tabs as its whitespace (a client's pretty-printed
    body, a file): ``loads`` takes its tabs for the mark and reads it with the standard
    library's reader, which gives the same value (its integers exact), never another."""
    text = json.dumps(value, indent="\t")
    assert serde.loads(text) == serde.loads(text.encode()) == json.loads(text)
    if not _bigs(value):
        assert serde.loads(text.encode()) == orjson.loads(text)


async def test_texts_starting_with_or_holding_tabs_are_stored_as_they_are(store: Any) -> None:
    """A user's message, a tool's string result and a call's input that start with a tab,
    hold one, or hold a tab and digits (``"\\t1234..."``, what a mark looks like) are
    stored and read back the very strings: not numbers, not trimmed."""
    texts = ["\tstarts", "mid\tdle", f"\t{BIG}", "\t", f"{BIG}\t"]
    call = ToolCallPart(tool_call_id="c", tool_name="t", input={"q": texts, "n": BIG}, step=0)
    messages = [
        UserMessage(content=f"\t{BIG}", id="u1"),
        AssistantMessage(content=(call,), id="a1"),
        ToolMessage(tool_call_id="c", tool_name="t", step=0, output=f"\t{BIG}", id="t1"),
        ToolMessage(tool_call_id="d", tool_name="t", step=0, output=texts, id="t2"),
    ]
    await store.save("s", 0, messages, {"note": "\tx", "n": BIG})
    record = await store.load("s")
    assert list(record.messages) == messages
    assert record.messages[0].content == f"\t{BIG}"
    assert record.messages[2].output == f"\t{BIG}"
    assert record.messages[1].content[0].input == {"q": texts, "n": BIG}
    assert record.meta["note"] == "\tx" and record.meta["n"] == BIG


def test_a_cut_outputs_text_holds_no_mark() -> None:
    """A tool's output longer than the call's limit is cut to text the model reads: the
    integer past 64 bits in it as its digits, no tab before them, counted as they are.
    Before: ``{"n":\\t1234...`` (the mark, one character more than the value's JSON)."""
    output = {"n": BIG, "s": "x" * 100, "m": [-BIG]}
    cut = truncate_output(output, 40)
    whole = json.dumps(output, separators=(",", ":"))
    assert isinstance(cut, str) and "\t" not in cut
    assert cut.startswith(whole[:40]) and f"of {len(whole)} characters" in cut
    assert truncate_output(output, len(whole)) == output  # (it fits: the value itself)


async def test_a_call_nested_past_orjsons_levels_keeps_its_integer_past_64_bits(
    tmp_path: Any,
) -> None:
    """A model's call nested 300 levels deep (past the 254 orjson writes; the standard
    library writes it) whose innermost value is BIG: stored in SQLite and read back as
    BIG, an int. Before: written without the mark, read back as the float 1.23e29."""
    deep: Any = BIG
    for _ in range(300):
        deep = [deep]
    call = ToolCallPart(tool_call_id="c", tool_name="t", input={"v": deep}, step=0)
    messages = [UserMessage(content="go", id="u1"), AssistantMessage(content=(call,), id="a1")]
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.save("s", 0, messages)
        record = await store.load("s")
    finally:
        await store.aclose()
    value = record.messages[1].content[0].input["v"]
    for _ in range(300):
        value = value[0]
    assert (type(value), value) == (int, BIG)
    with sqlite3.connect(tmp_path / "s.db") as db:
        bodies = [bytes(b) for (b,) in db.execute("SELECT body FROM messages")]
    assert json.loads(bodies[1])["content"][0]["input"]["v"] == deep  # (valid JSON)


@pytest.mark.parametrize("size", ["inline", "parsed-in-a-child"])
async def test_a_client_body_starting_with_and_indented_by_tabs_means_what_it_says(
    tmp_path: Any, size: str
) -> None:
    """``useChat``'s answer to a client tool, posted as JSON that starts with a tab and
    is indented with tabs (the mark's byte, everywhere), its output a string holding tabs
    and an object holding BIG: the user's stream is JSON a strict reader takes, with the
    string as it was sent and BIG as an integer; the store keeps both."""
    steps = [[*tool_call("pick", {}, tool_call_id="C")], ["thanks"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[pick])
    output = {"text": "\t{\t}\t", "n": BIG, "tab": f"\t{BIG}"}
    async with web_server(agent, store=tmp_path / "s.db") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            part = {
                "type": "tool-pick",
                "toolCallId": "C",
                "state": "output-available",
                "input": {},
                "output": output,
            }
            sent = answer("s", first[0]["messageId"], part)
            if size == "parsed-in-a-child":
                sent["messages"][0]["parts"][0]["text"] = "x" * INLINE_BODY
            raw = ("\t" + json.dumps(sent, indent="\t")).encode()
            response = await client.post(
                "/api/chat", content=raw, headers={"content-type": "application/json"}
            )
            record = await server.host.store.load("s")
    assert response.status_code == 200, response.text
    lines = [ln[6:] for ln in response.text.split("\n") if ln.startswith("data: {")]
    chunks = [json.loads(ln) for ln in lines]  # (each a JSON text: tabs only as whitespace)
    [shown] = [c for c in chunks if c["type"] == "tool-output-available"]
    assert f'"n":\t{BIG}' in response.text  # (the mark: JSON whitespace, valid for any reader)
    assert shown["output"] == output and type(shown["output"]["n"]) is int
    outputs = [getattr(m, "output", None) for m in record.messages if m.role == "tool"]
    assert outputs == [output]


async def test_a_session_opened_with_meta_past_64_bits_runs_and_is_listed(tmp_path: Any) -> None:
    """``host.open_session(meta={"n": BIG})``: the session opens and runs, the store keeps
    BIG, and ``axon sessions --json`` prints it (valid JSON, no mark). Before: InvalidMeta
    "session meta is not JSON ... Integer exceeds 64-bit range" (orjson's check), and the
    listing a traceback."""
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(["ok"])), session_id="s", meta={"n": BIG}
        )
        result = await session.run("hi")
        record = await host.store.load("s")
    listed = await trio.run_process(
        [sys.executable, "-m", "runtime", "sessions", "--store", str(path), "--json"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=ROOT,
    )
    assert (result.text, record.meta["n"]) == ("ok", BIG)
    assert listed.returncode == 0, listed.stderr
    assert b"\t" not in listed.stdout
    [info] = json.loads(listed.stdout)["sessions"]
    assert info["meta"]["n"] == BIG
