"""Bodies cheap to send and dear to parse: the JSON values a body parsed in the server's
process may hold (``MAX_JSON_VALUES``), and where a large one is parsed. Parsed, 48 MiB of
``[[],[],...]`` was 1.2 GB resident (24 times the body; journal pipeline.md, ``###
weberrors``). Real sockets to the in-process server; the cap made small."""

from __future__ import annotations

import json
import threading
from typing import Any

import orjson
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.web import a2a, chat_input
from runtime.app.web.chat_body import json_values, json_values_bound
from tests.test_http_attacks_2 import head_of
from tests.test_web_body_budget import exchange, sized
from tests.web.harness import web_server

CAP = 1_000


def agent() -> Agent:
    return Agent(name="m", provider=ScriptedProvider(responder=lambda request: ["ok"]))


@pytest.mark.parametrize(
    ("path", "protocol"),
    [
        ("/v1/chat/completions", "openai"),
        ("/ag-ui", "ag-ui"),
        ("/a2a/jsonrpc", "a2a"),
        ("/mcp", "mcp"),
    ],
)
async def test_a_body_of_more_json_values_than_the_cap_is_refused_413_naming_the_limit(
    path, protocol, monkeypatch
):
    monkeypatch.setattr(chat_input, "MAX_JSON_VALUES", CAP)
    parsed: list[bytes] = []
    real_loads = orjson.loads
    monkeypatch.setattr(orjson, "loads", lambda raw: parsed.append(raw) or real_loads(raw))
    payload = b'{"x": [' + b",".join([b"[]"] * CAP) + b"]}"  # 1,002 values, 6 KB
    async with web_server(agent(), protocols=("ai-sdk", protocol)) as server:
        response = await exchange(server, sized(server, path, payload))
    head, _, text = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), response
    assert b"more than 1,000 JSON values" in text, response
    assert payload not in parsed  # refused before it was parsed


async def test_a_long_text_full_of_commas_is_not_refused_for_them(monkeypatch):
    # Counting the body's punctuation is a bound; past the cap its strings are taken out
    # and the count made again: commas in a text are no JSON values.
    monkeypatch.setattr(chat_input, "MAX_JSON_VALUES", CAP)
    payload = {"model": "m", "messages": [{"role": "user", "content": "a, [b]: {c}" * CAP}]}
    async with web_server(agent(), protocols=("ai-sdk", "openai")) as server:
        response = await exchange(
            server, sized(server, "/v1/chat/completions", json.dumps(payload).encode())
        )
    assert head_of(response).startswith(b"HTTP/1.1 200"), response
    assert json.loads(response.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "raw",
    [b"[]", b'{"a": 1, "b": [2, {}, "x,y:{["]}', b'["\\"", "\\\\", ",", {"k": [1, 2.5]}]'],
)
def test_the_count_of_json_values_is_never_under_them(raw):
    values = 0

    def walk(value: Any) -> None:
        nonlocal values
        values += 1 + (len(value) if isinstance(value, dict) else 0)  # keys too
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict | list):
            for child in children:
                walk(child)

    walk(json.loads(raw))
    empty = raw.count(b"[]") + raw.count(b"{}")
    assert json_values(raw) == values + empty <= json_values_bound(raw)


async def test_a_large_a2a_body_is_parsed_off_the_event_loop(monkeypatch):
    # A2A parsed its body on the event loop whatever its size: 48 MiB of small values is
    # seconds of parsing, with no other request of the process answered meanwhile.
    where: list[bool] = []
    real_loads = orjson.loads

    def loads(raw: bytes) -> Any:
        where.append(threading.current_thread() is threading.main_thread())
        return real_loads(raw)

    monkeypatch.setattr(a2a.orjson, "loads", loads)
    text = "x" * (chat_input.INLINE_BODY + 1)
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": text}]}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with web_server(agent(), protocols=("ai-sdk", "a2a")) as server:
        with trio.fail_after(30):
            response = await exchange(
                server, sized(server, "/a2a/jsonrpc", json.dumps(body).encode())
            )
    assert head_of(response).startswith(b"HTTP/1.1 200"), response
    assert where[:1] == [False]  # the body's parse, in a worker thread


@pytest.mark.parametrize("where", ["message.parts[1]", "message.metadata"])
async def test_an_a2a_message_nested_past_what_json_writes_is_invalid_params_not_a_500(where):
    # orjson reads 1,024 levels and writes 254: a data part in between parsed, then its
    # JSON text raised out of the handler (a 500, and a traceback in the log).
    deep = orjson.loads(b"[" * 300 + b"]" * 300)
    message: dict[str, Any] = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    if where == "message.metadata":
        message["metadata"] = {"x": deep}
    else:
        message["parts"].append({"data": deep})
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with web_server(agent(), protocols=("ai-sdk", "a2a")) as server:
        with trio.fail_after(30):
            response = await exchange(
                server, sized(server, "/a2a/jsonrpc", json.dumps(body).encode())
            )
    error = json.loads(response.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == -32602, response
    assert error["message"] == f"{where} is nested deeper than 254 levels"
