"""Hostile or odd text followed end to end: half a character (a lone surrogate, as a
server's ``"\\ud83d"`` escape gives it), NUL, terminal escapes, from a model, a tool or
a stored session, through the providers' readers, the web protocols' streams and the
terminal. Each test says what the user sees and what is saved (journal
``benchmarks/journal/pipeline.md``, ``### textedges``)."""

from __future__ import annotations

import argparse
import io
import itertools
import json
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from actors.turn.parts import PartsManager
from runtime import Agent, Host, ProviderError, RetryPolicy
from runtime import output as o
from runtime.app.cli import describe_call, sessions_command, show_command
from runtime.app.render import TerminalRenderer
from runtime.approval import PendingCall
from runtime.chunks import TextChunk
from tests.support.attacks import KINDS, attack_rig
from tests.support.loopback import Reply
from tests.support.redis import require_redis
from tests.test_agui import user as agui_user
from tests.test_cli_attacks import axon
from tests.test_mcp_server import MCP, Progress, mcp_client
from tests.test_provider_attacks import ONCE, texts, turn
from tests.test_relay import opened, read_all, text_turn
from tests.test_web_http import body
from tests.web.harness import wait_idle, web_server

HALVES = ("a\ud83d", "\ude00b\u0000c\ud800d")
"""Two deltas as a server escapes them in JSON: an emoji's surrogate pair split between
them, then a NUL and a half with no other half."""


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delta_escaping_half_a_character_is_read_as_the_sdk_reads_it(kind, autojump_clock):
    """Before: OpenAI's and Anthropic's readers (orjson) refused the event that the SDK
    (``json.loads``) reads, and the user got ``MalformedStream`` with nothing saved, on
    every retry. Gemini's next request sent the lone half as its escape, which a strict
    JSON reader refuses. Now the user sees the answer as it came; the session keeps what
    the store writes (the two halves one emoji, the lone half U+FFFD), and the next
    request sends that."""
    async with attack_rig(kind, retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=r.answer(*HALVES)))
        assert (result.finish_reason, result.error) == ("stop", None)
        shown = "".join(c.text for c in chunks if c.type == "text-delta")
        assert shown == "a😀b\u0000c\ud800d"  # the halves one emoji (branch emoji)
        assert texts(r.session.messages[1]) == "a😀b\u0000c\ufffdd"  # as the store keeps it
        await r.next_turn()
        raw = r.server.requests[-1].body
    sent = orjson.dumps(orjson.loads(raw)).decode()  # orjson refuses a lone half
    assert "a😀b\\u0000c\ufffdd" in sent


# -- the web protocols' streams ----------------------------------------------------------------

SPLIT = [TextChunk(text="a\ud83d"), TextChunk(text="\ude00b"), TextChunk(text="c\ud800d")]
"""A model's deltas holding halves of characters, as a provider's reader gives them."""


def a2a_stream(text: str) -> dict[str, Any]:
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": text}]}
    params = {"message": {**message, "contextId": "c1"}}
    return {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": params}


USER = {"role": "user", "content": "go"}
WEB_STREAMS = {
    "ai-sdk": ("/api/chat", body("s1", "go")),
    "ag-ui": ("/ag-ui", {"threadId": "t1", "runId": "r1", "messages": [agui_user("go")]}),
    "openai": ("/v1/chat/completions", {"model": "m", "stream": True, "messages": [USER]}),
    "openai-whole": ("/v1/chat/completions", {"model": "m", "messages": [USER]}),
    "a2a": ("/a2a/jsonrpc", a2a_stream("go")),
}


@pytest.mark.parametrize("protocol", list(WEB_STREAMS))
async def test_a_delta_holding_half_a_character_is_sent_as_json_every_client_reads(protocol):
    """Before: orjson refused the event, the server raised in the middle of the stream
    and the client saw the connection cut (``incomplete chunked read``), the answer and
    its end lost. Now each half alone is U+FFFD in the event (the saved message keeps
    the emoji whole: the test above)."""
    path, payload = WEB_STREAMS[protocol]
    agent = Agent(name="m", provider=ScriptedProvider([SPLIT]))
    name = protocol.removesuffix("-whole")
    async with web_server(agent, protocols=("ai-sdk", name)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post(path, json=payload)
    assert r.status_code == 200
    if protocol == "openai-whole":
        answer = orjson.loads(r.content)["choices"][0]["message"]["content"]
        assert answer == "a😀bc\ufffdd"
        return
    lines = [line for line in r.content.split(b"\n") if line.startswith(b"data: ")]
    events = [orjson.loads(line[6:]) for line in lines if line != b"data: [DONE]"]
    text = orjson.dumps(events).decode()
    assert "c\ufffdd" in text and "\ud800" not in text


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_relayed_batch_holding_half_a_character_is_written_not_dropped(redis_url):
    """Before: the Redis relay's flush raised on the batch (``relay.flush_refused``),
    every chunk of it was dropped and readers in other processes were told to rebuild
    the turn from the store. Now the batch is written; each half alone reads U+FFFD."""
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["a\ud83d", "\ude00b"]):
            writer.append(chunk)
        await writer.aclose()
        assert writer.lost == 0
        read = await read_all(relay, "t")
    assert [c.text for c in read if c.type == "text-delta"] == ["a\ufffd", "\ufffdb"]


async def test_a_progress_message_holding_half_a_character_does_not_fail_the_mcp_call():
    """Before: the official MCP client could not parse the progress notification whose
    message was a delta ending with half an emoji, and the whole call failed (-32700,
    ``Failed to parse SSE message``) though the turn ran and was saved. Now each half
    alone is U+FFFD in the notification; the call's answer has the emoji whole."""
    progress = Progress()
    agent = Agent(name="m", provider=ScriptedProvider([SPLIT]))
    async with web_server(agent, protocols=MCP) as server, mcp_client(server) as client:
        result = await client.call_tool("m", {"prompt": "go"}, progress_callback=progress)
    assert [block.text for block in result.content] == ["a😀bc\ufffdd"]
    assert [message for _, message in progress.seen] == ["a\ufffd", "\ufffdb", "c\ufffdd"]


# -- PostgreSQL's turn queue --------------------------------------------------------------------


@pytest.mark.parametrize("odd", ["\x00", "\ud800"])
async def test_a_turn_failed_by_an_error_quoting_a_nul_or_half_a_character_ends_failed_with_it(
    pg_url, odd
):
    """A provider's error quoting a NUL or a lone ``"\\ud800"`` escape (its message is the
    turn's error). Before: the worker's ``finish`` raised (a ``StoreError``: PostgreSQL
    text refuses a NUL; a raw ``UnicodeEncodeError`` for the half) and the worker marked
    the turn failed with that error, and front ends told the user it, not the provider's.
    Now the row holds the provider's message, the character U+FFFD."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        turn = await queue.submit("s", "go")
        claim = await queue.claim("w1")
        assert claim is not None
        error = f"Bad request: {odd} is no text"
        assert await queue.finish(claim, status="failed", finish_reason="error", error=error)
        row = await queue.get(turn.turn_id)
    finally:
        await queue.aclose()
        await store.aclose()
    assert row is not None and (row.status, row.error) == (
        "failed",
        "Bad request: \ufffd is no text",
    )


# -- the terminal --------------------------------------------------------------------------------

CLIPBOARD = "\x1b]52;c;aGk=\x07"  # OSC 52: writes "hi" into the user's clipboard


def test_replay_names_an_unfinished_turn_with_its_escapes_shown_not_obeyed(tmp_path):
    """A shared recording whose turn id is an escape sequence. Before: the ``is
    incomplete`` line on stderr printed it as it was, and the terminal wrote the user's
    clipboard. Now the user reads ``\\x1b]52;c;aGk=\\x07`` (the text is shown as before)."""
    log = tmp_path / "events.jsonl"
    record = {"kind": "output.text-delta", "turn_id": CLIPBOARD, "seq": 0, "step": 0}
    log.write_text(json.dumps({**record, "part_id": "p", "text": "hi"}) + "\n")
    proc = axon("replay", str(log))
    assert proc.returncode == 1 and proc.stdout == "hi\n"
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert "turn \\x1b]52;c;aGk=\\x07 has no turn.finished event" in proc.stderr


def test_replay_of_a_turn_id_that_is_no_text_is_one_error_line(tmp_path):
    """Before: a traceback (``unhashable type: 'dict'``)."""
    log = tmp_path / "events.jsonl"
    log.write_text('{"kind":"turn.started","turn_id":{"a":1}}\n')
    proc = axon("replay", str(log))
    assert (proc.returncode, proc.stderr) == (
        2,
        f"error: {log} is not a JSONL event log: line 1's turn_id is no text\n",
    )


SPOOF = "mine\r\x08\x08\x08\x08theirs\x07\nfake-session\t9 messages"
"""A name that rewrites its line with a CR and backspaces, rings the bell, and adds a line
of its own: rich drops CR, BS and BEL, a plain write passes them to the terminal."""


async def test_sessions_lists_a_stored_agent_name_on_its_line_with_its_controls_shown(
    tmp_path, capsys
):
    """Before: the listing wrote the stored agent name as it was: the terminal showed
    ``theirs`` over ``mine``, rang, and listed a session ``fake-session`` that is not in
    the store. Now one line per session, the name's controls as escapes (stored as is)."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        agent = Agent(name=SPOOF, provider=ScriptedProvider([["ok"]]))
        session = await host.open_session(agent, "s1")
        await session.run("hi")
    capsys.readouterr()
    assert await sessions_command(argparse.Namespace(store=str(db), json=False)) == 0
    out = capsys.readouterr().out
    assert out == (
        "s1\t2 messages\tmine\\x0d\\x08\\x08\\x08\\x08theirs\\x07\\x0afake-session\\x099 messages\n"
    )


def test_the_approval_prompt_shows_a_stored_tool_names_cr_and_backspaces():
    """The prompt is a plain write. Before: a waiting call of a stored session named
    ``delete\\rread`` read ``read(...)?`` at the prompt, the call approved being
    ``delete``. Now the name is shown with its CR escaped."""
    call = PendingCall(
        approval_id="a1",
        tool_call_id="c1",
        tool_name="delete\rread",
        input={},
        kind="approval",
        step=0,
        message_id="m1",
        turn_id="t1",
    )
    assert describe_call(call) == "delete\\x0dread({})"


async def test_a_stored_error_holding_half_a_character_does_not_stop_the_conversation_loading():
    """A provider's error quoting half a character, kept in the session (the memory
    store keeps it as it came). Before: ``GET /api/sessions/s1`` answered 500, and the
    chat page could not load the conversation again. Now it loads; the error reads
    U+FFFD where the half was."""
    provider = ScriptedProvider([["hi", ProviderError("bad \ud800 input", provider="x")]])
    agent = Agent(name="m", provider=provider, retry=RetryPolicy(max_attempts=1))
    async with web_server(agent) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            await client.post("/api/chat", json=body("s1", "go"))
            await wait_idle(server, "s1")
            r = await client.get("/api/sessions/s1")
    assert r.status_code == 200
    assert "ProviderError: bad \ufffd input" in r.text


async def test_a_whole_openai_completion_failed_by_an_error_quoting_half_a_character_says_so():
    """``/v1/chat/completions`` without streaming, the turn failed by a provider's error
    quoting half a character. Before: a bare 500 ``Internal Server Error``, the provider's
    message lost. Now OpenAI's error shape (500 ``server_error``) with the message,
    U+FFFD for the half."""
    provider = ScriptedProvider([[ProviderError("bad \ud800 input", provider="x")]])
    agent = Agent(name="m", provider=provider, retry=RetryPolicy(max_attempts=1))
    async with web_server(agent, protocols=("ai-sdk", "openai")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post("/v1/chat/completions", json={"model": "m", "messages": [USER]})
    error = orjson.loads(r.content)["error"]  # was b"Internal Server Error"
    assert (error["code"], error["message"]) == ("ProviderError", "ProviderError: bad \ufffd input")


# -- the parts a model's deltas make -------------------------------------------------------------


def utf16_halves(text: str) -> str:
    """``text`` with each astral character as its two surrogate halves (what
    ``json.loads`` gives for a server's ``"\\ud83d\\ude00"`` cut between deltas)."""
    return "".join(
        chr(0xD800 + ((ord(c) - 0x10000) >> 10)) + chr(0xDC00 + ((ord(c) - 0x10000) & 0x3FF))
        if ord(c) >= 0x10000
        else c
        for c in text
    )


@given(st.text(), st.lists(st.integers(0, 10**6)))
def test_a_text_cut_into_deltas_anywhere_closes_as_the_same_characters(text, cuts):
    """Any text (astral characters, ZWJ sequences, NUL, CR, U+2028 included) cut into
    deltas at any UTF-16 position, an emoji's halves in two deltas: the saved part is the
    text as the model wrote it, which UTF-8 writes."""
    units = utf16_halves(text)
    points = sorted({c % (len(units) + 1) for c in cuts} | {0, len(units)})
    parts, out = PartsManager(), []
    for a, b in itertools.pairwise(points):
        parts.text(TextChunk(text=units[a:b]), out)
    parts.close(out)
    saved = "".join(p.text for p in parts.content)
    assert saved == text
    saved.encode()  # UTF-8 holds it: the store and every provider write it as it is


LINK = "[link=https://evil.example]lookup[/link]"
"""Rich markup for a hyperlink: rendered, ``lookup`` is a link to another site."""


def test_a_tool_name_that_is_rich_markup_titles_its_card_as_written():
    """A model calling a tool by a name that is rich markup (it gets an ``unknown tool``
    error card). Before: the card's title was read as markup, and the terminal showed
    ``lookup`` as a hyperlink (OSC 8) to the model's site. Now the title shows the
    name as the model wrote it, brackets and all."""
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=True, color_system=None)
    renderer = TerminalRenderer(console)
    renderer.render(o.ToolError(step=0, tool_call_id="c", tool_name=LINK, error="unknown"))
    shown = buf.getvalue()
    assert "\x1b]8" not in shown and f"tool · {LINK}" in shown


async def test_show_prints_a_stored_texts_emoji_codes_as_written(tmp_path, capsys):
    """``show`` prints with rich, whose emoji codes turned a stored ``:warning:`` into
    ⚠: the user did not read what the session holds. Now it is printed as stored."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        agent = Agent(provider=ScriptedProvider([["run :rm: now :warning:"]]))
        session = await host.open_session(agent, "s1")
        await session.run("hi")
    capsys.readouterr()
    assert await show_command(argparse.Namespace(session_id="s1", store=str(db), json=False)) == 0
    assert "text: run :rm: now :warning:" in capsys.readouterr().out


async def test_an_mcp_call_failed_by_an_error_quoting_half_a_character_says_why():
    """Before: the official client could not parse the ``isError`` result and the call
    raised ``Failed to parse JSON response``. Now the result says the turn failed and
    why, U+FFFD for the half."""
    provider = ScriptedProvider([["hi", ProviderError("bad \ud800 input", provider="x")]])
    agent = Agent(name="m", provider=provider, retry=RetryPolicy(max_attempts=1))
    async with web_server(agent, protocols=MCP) as server, mcp_client(server) as client:
        result = await client.call_tool("m", {"prompt": "go"})
    assert result.is_error
    assert result.content[0].text.startswith("the turn failed: bad \ufffd input (session ")


HALF_IN_BODY = {
    "/api/chat": b'{"id":"s1","messages":[{"id":"u1","role":"user","parts":[{"type":"text",'
    b'"text":"a\\ud800"}]}],"trigger":"submit-message"}',
    "/v1/chat/completions": b'{"model":"m","messages":[{"role":"user","content":"a\\ud800"}]}',
    "/ag-ui": b'{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user",'
    b'"content":"a\\ud800"}]}',
    "/a2a/jsonrpc": b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":'
    b'{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a\\ud800"}]}}}',
}


@pytest.mark.parametrize("path", list(HALF_IN_BODY))
async def test_a_message_holding_half_a_character_is_refused_saying_so(path):
    """A client's text holding a lone surrogate (a browser's ``JSON.stringify`` writes
    it as ``"\\ud800"``). Before: refused as "the body is not JSON", sending the person
    to look for a syntax error. Now the refusal names the half character; nothing runs."""
    agent = Agent(name="m", provider=ScriptedProvider(responder=lambda request: ["ok"]))
    async with web_server(agent, protocols=("ai-sdk", "ag-ui", "a2a", "openai")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post(
                path, content=HALF_IN_BODY[path], headers={"content-type": "application/json"}
            )
    assert r.status_code == (200 if path == "/a2a/jsonrpc" else 400)  # A2A: JSON-RPC -32700
    assert "holds half a character (a lone surrogate escape such as \\\\ud800)" in r.text


def test_an_agui_error_quoting_half_a_character_is_answered_as_json():
    """AG-UI's refusals quote what they refuse (a stored tool's name in a decision's
    error, a store's message). Before: written with bare orjson, which refuses half a
    character: the refusal raised instead of answering (a 500 without its reason). Now
    the shared writer (``serde.utf8_dumps``): U+FFFD where the half was."""
    from runtime.app.web.agui import error_response
    from runtime.app.web.agui_input import AGUIError

    response = error_response(AGUIError(409, "call 'c1' (look\ud800) waits", "not_waiting"))
    assert response.status_code == 409
    said = orjson.loads(response.body)
    assert said == {"error": "call 'c1' (look\ufffd) waits", "code": "not_waiting"}
