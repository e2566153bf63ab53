"""The body fuzzer (:mod:`tests.test_body_fuzz`) where a turn is already running, and on
request headers: what the per-body families cannot reach.

- **busy sessions**: a turn held in a tool (:func:`hold_on`, released by the example)
  while fuzzed requests arrive for its session, under each busy strategy the app can
  be given (``steer``, ``interrupt``, ``enqueue``): a new user message (steered,
  interrupting or queued), a regenerate, a stop, a resume of its stream, or two of these
  at once; and two fuzzed requests at once on an idle session;
- **relay resume**: ``GET /api/chat/{id}/stream`` with a ``Last-Event-ID`` header or
  ``?after_seq=`` that is forged, out of range, negative, past 64 bits or no number,
  while the turn runs and after it ended;
- **headers**: every protocol's valid request sent with a lying ``Content-Type``, a
  huge header, a header repeated, a forged ``Host`` or ``Origin``, an odd ``Accept``,
  ``X-Forwarded-*`` headers.

The invariants are the body fuzzer's (:meth:`tests.test_body_fuzz.Rig.check` and
``settled``): no 5xx, the protocol's own error shape, nothing of a traceback, every
stored session loads and maps to the providers' requests, no turn or task left, and a
valid request works afterwards. ``AXON_BODY_FUZZ=N`` runs ``N`` examples per family (and
strategy) instead of the ordinary run's few.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.errors import StopTest

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.memory import MemoryStore
from runtime import Agent, tool
from runtime.actor_messages import InferRequest
from runtime.messages import ToolMessage, UserMessage
from tests.test_body_fuzz import (
    STORES,
    Call,
    Rig,
    _respond,
    a2a_new,
    a2a_prepare,
    a2a_valid,
    ag_new,
    ag_valid,
    chat_body,
    delete_file,
    fuzz_settings,
    lookup,
    mcp_tool,
    mcp_valid,
    mutated,
    oa_named,
    oa_valid,
    pick_color,
    ui_new,
    ui_valid,
)
from tests.test_mcp_session_ends import left
from tests.web.harness import web_server

GATE: dict[str, trio.Event] = {}
"""The events of the turn an example holds: ``entered`` (its tool runs), ``release``."""


@tool
async def hold_on() -> str:
    """Wait until the test lets the turn go on (a turn kept running while requests come)."""
    entered, release = GATE.get("entered"), GATE.get("release")
    if entered is not None:
        entered.set()
    with trio.move_on_after(20):  # (an example that failed before its release)
        if release is not None:
            await release.wait()
    return "held"


def _held_respond(request: InferRequest) -> list[Any]:
    """:func:`tests.test_body_fuzz._respond`, and ``hold`` calls :func:`hold_on`."""
    messages = list(request.messages)
    users = [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]
    last = users[-1] if users else -1
    text = messages[last].text if users else ""
    answered = any(isinstance(m, ToolMessage) for m in messages[last + 1 :])
    if "hold" in text and not answered:
        return ["Holding. ", *tool_call("hold_on", {})]
    return _respond(request)


def busy_agent() -> Agent:
    return Agent(
        name="fuzz",
        provider=ScriptedProvider(responder=_held_respond),
        tools=[delete_file, lookup, pick_color, hold_on],
    )


Request = tuple[str, str, bytes | None, list[tuple[str, bytes]]]
"""A request as sent: method, path, body, headers (pairs: a name may repeat)."""


class BusyRig(Rig):
    """A :class:`Rig` that sends requests in the background too (each on its own
    connection), and holds a turn open."""

    def __init__(self, server: Any, family: str) -> None:
        super().__init__(server, family)
        self.pool = ThreadPoolExecutor(4)

    def later(self, request: Request) -> Future[Any]:
        """``request`` sent on another thread and connection (:meth:`raw`); its response."""
        return self.pool.submit(self.raw, request)

    def raw(self, request: Request) -> Any:
        """``request`` written on a socket as it is (a repeated ``Host``, bytes no client
        would send): its response read with the standard library's parser."""
        method, path, body, pairs = request
        address = httpx.URL(self.server.url)
        head = [f"{method} {path} HTTP/1.1".encode()]
        if not any(name == "host" for name, _ in pairs):
            head.append(f"host: {address.host}:{address.port}".encode())
        if body is not None:
            head.append(f"content-length: {len(body)}".encode())
        head += [name.encode() + b": " + value for name, value in pairs]
        head.append(b"connection: close")
        with socket.create_connection((address.host, address.port), timeout=60) as sock:
            sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + (body or b""))
            response = http.client.HTTPResponse(sock, method=method)
            response.begin()
            content = response.read()
        return httpx.Response(response.status, headers=response.getheaders(), content=content)

    def hold(self, session_id: str) -> Future[Any]:
        """A turn on ``session_id`` started and held in its tool; its response."""
        trio.from_thread.run_sync(_new_gate)
        body = json.dumps(chat_body(session_id, "hold on")).encode()
        running = self.later(("POST", "/api/chat", body, JSON))
        trio.from_thread.run(_entered, running)
        return running

    def release(self) -> None:
        trio.from_thread.run_sync(_release)


JSON = [("content-type", b"application/json")]


def _new_gate() -> None:
    GATE["entered"], GATE["release"] = trio.Event(), trio.Event()


def _release() -> None:
    if "release" in GATE:
        GATE["release"].set()


async def _entered(running: Future[Any]) -> None:
    with trio.fail_after(20):
        while not GATE["entered"].is_set():
            assert not running.done(), running.result().text[:2000]
            await trio.sleep(0.005)


# -- what comes while a turn runs -----------------------------------------------------------

EVENT_IDS = [
    "",
    "0",
    "1",
    "2",
    "3",
    "7",
    "-1",
    "+1",
    " 1",
    "1 ",
    "01",
    "1.5",
    "1e3",
    "0x10",
    "NaN",
    "99999",
    "999999999999999999",
    "9999999999999999999",
    "18446744073709551617",
    "1" * 200,
    "\u0661",
    "\u00b2",
    "\uff11",
    "1,2",
    "abc",
    "%00",
]


def resume_request(data: Any, session_id: str) -> Request:
    """A resume of ``session_id``'s stream: a ``Last-Event-ID`` or ``after_seq`` drawn
    (forged, out of range, no number), or both, or neither."""
    seen = data.draw(st.sampled_from(EVENT_IDS), label="event id")
    how = data.draw(st.sampled_from(["header", "query", "both", "none", "other-session"]))
    path = f"/api/chat/{session_id}/stream"
    headers: list[tuple[str, bytes]] = []
    if how in ("query", "both"):
        path += "?after_seq=" + quote(seen, safe="")
    if how in ("header", "both"):
        headers.append(("last-event-id", seen.encode()))
    if how == "other-session":
        path = "/api/chat/other-wait/stream"
        headers.append(("last-event-id", seen.encode()))
    return ("GET", path, None, headers)


def busy_request(rig: BusyRig, data: Any, session_id: str, messages: list[Any]) -> Request:
    """One fuzzed request for ``session_id`` while its turn may run."""
    kind = data.draw(
        st.sampled_from(["message", "message", "regenerate", "stop", "resume", "delete"]),
        label="kind",
    )
    if kind == "resume":
        return resume_request(data, session_id)
    if kind == "delete":
        return ("DELETE", f"/api/sessions/{session_id}", None, [])
    if kind == "stop":
        seed: Any = {"turnId": "turn-x", "messageId": "u1"}
        path = f"/api/chat/{session_id}/stop"
    else:
        text = data.draw(st.sampled_from(["steer this", "approve it", "client", "hold", "tool"]))
        seed = chat_body(session_id, text)
        if kind == "regenerate":
            seed["trigger"] = "regenerate-message"
            seed["messageId"] = "msg-x"
        if messages:  # (what useChat sends while it shows the running turn)
            seed["messages"].insert(0, messages[0])
        path = "/api/chat"
    body = data.draw(mutated(seed, [*rig.ids, session_id]), label="body")
    return ("POST", path, body, JSON)


def busy_example(rig: BusyRig, data: Any) -> None:
    """A fresh session's turn held in its tool (or none), one or two fuzzed requests for
    it sent at once, the turn let go (at once, or after a while): each answer checked."""
    session_id = rig.fresh("busy")
    held = data.draw(st.booleans(), label="held")
    try:
        running = rig.hold(session_id) if held else None
        shown = [{"id": "m-shown", "role": "assistant", "parts": []}] if held else []
        requests = [busy_request(rig, data, session_id, shown)]
        if data.draw(st.booleans(), label="two at once"):
            requests.append(busy_request(rig, data, session_id, shown))
        pending = [rig.later(r) for r in requests]
        time.sleep(data.draw(st.sampled_from([0, 0.01, 0.2]), label="release after"))
    finally:
        rig.release()  # (a failed example's turn too: the next must not find it held)
    for request, response in zip(requests, pending, strict=True):
        _, path, body, headers = request
        sent = (body or b"") + path.encode() + repr(headers).encode()
        rig.check("ai-sdk", response.result(), sent)
    if running is not None:
        rig.check("ai-sdk", running.result(), b"")


async def run_busy(on_busy: str, store_kind: str, tmp_path: Any, ordinary: int) -> int:
    store = str(tmp_path / "fuzz.db") if store_kind == "sqlite" else MemoryStore()
    async with web_server(busy_agent(), store=store, on_busy=on_busy) as server:
        rig = BusyRig(server, f"busy-{on_busy}")
        ran = 0

        @fuzz_settings(ordinary)
        @given(data=st.data())
        def example(data: Any) -> None:
            nonlocal ran
            ran += 1
            rig.data = data
            busy_example(rig, data)
            rig.settled()
            ui_valid(rig)
            rig.settled()

        def run() -> None:
            with rig.http, rig.pool:
                rig.chat("other-done", "hello")
                events = rig.chat("other-wait", "approve this")
                asked = [
                    e for e in events if e != "[DONE]" and e["type"] == "tool-approval-request"
                ]
                rig.ids += [asked[0]["approvalId"], asked[0]["toolCallId"]]
                ui_valid(rig)
                trio.from_thread.run(rig._baseline)
                example()

        await trio.to_thread.run_sync(run)
    print(f"\nbody fuzz busy ({on_busy}) on {store_kind}: {ran} examples")
    return ran


@pytest.mark.parametrize("store_kind", STORES)
@pytest.mark.parametrize("on_busy", ["steer", "interrupt", "enqueue"])
async def test_requests_for_a_session_whose_turn_runs(on_busy, store_kind, tmp_path):
    assert await run_busy(on_busy, store_kind, tmp_path, 12) > 0


async def test_resume_ids_after_the_turn_ended(tmp_path):
    """A resume of a finished turn's stream, with every forged or out-of-range id."""
    async with web_server(busy_agent(), store=str(tmp_path / "fuzz.db")) as server:
        rig = BusyRig(server, "resume")
        ran = 0

        @fuzz_settings(20)
        @given(data=st.data())
        def example(data: Any) -> None:
            nonlocal ran
            ran += 1
            request = resume_request(data, "other-done")
            _, path, _, headers = request
            response = rig.raw(request)
            rig.check("ai-sdk", response, path.encode() + repr(headers).encode())
            rig.settled()

        def run() -> None:
            with rig.http, rig.pool:
                rig.chat("other-done", "hello")
                rig.chat("other-wait", "approve this")
                trio.from_thread.run(rig._baseline)
                example()

        await trio.to_thread.run_sync(run)
    print(f"\nresume fuzz after the turn: {ran} examples")


# -- headers --------------------------------------------------------------------------------

CONTENT_TYPES = [
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=utf-16",
    "application/json; charset=latin-1",
    "application/json; charset=nope",
    "application/json;;;",
    "APPLICATION/JSON",
    "application/jsonx",
    "application/json, text/plain",
    "application/json-seq",
    "application/merge-patch+json",
    "",
    ";",
    "*/*",
]
ACCEPTS = [
    "text/html",
    "application/json",
    "text/event-stream",
    "*/*",
    "",
    "application/xml;q=1, */*;q=0",
    "text/event-stream;q=0",
    "x" * 4000,
    ",,,",
]
HOSTS = [
    "attacker.example",
    "attacker.example:80",
    "127.0.0.1.attacker.example",
    "localhost.",
    "[::1]",
    "[::1",
    "127.0.0.1:99999",
    "127.0.0.1:-1",
    "",
    "a b",
    "127.0.0.1:80:80",
    "0",
]
ORIGINS = [
    "http://attacker.example",
    "null",
    "",
    "http://127.0.0.1",
    "http://localhost:1",
    "file://",
    "http://[::1",
    "http://127.0.0.1:99999",
    "x" * 2000,
]
FORWARDED = [
    ("x-forwarded-for", "1.2.3.4, 127.0.0.1"),
    ("x-forwarded-host", "attacker.example"),
    ("x-forwarded-proto", "https"),
    ("x-forwarded-proto", "gopher"),
    ("forwarded", "for=1.2.3.4;host=attacker.example;proto=https"),
    ("x-real-ip", "::1"),
    ("x-forwarded-prefix", "/../x"),
]
NAMES = [
    "content-type",
    "accept",
    "authorization",
    "last-event-id",
    "x-axon-session",
    "mcp-session-id",
    "mcp-protocol-version",
    "origin",
    "sec-fetch-site",
    "x-custom",
    "cookie",
    "content-encoding",
    "transfer-encoding",
    "expect",
]


@st.composite
def header_mutations(draw: Any, headers: dict[str, str]) -> list[tuple[str, bytes]]:
    """``headers`` (and a JSON content type) with up to three mutations, as pairs (a
    name may repeat)."""
    pairs = [*JSON, *((k.lower(), v.encode()) for k, v in headers.items())]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(
            st.sampled_from(
                ["type", "accept", "huge", "dup", "host", "origin", "forward", "drop", "odd"]
            )
        )
        if op == "type":
            pairs = [p for p in pairs if p[0] != "content-type"]
            pairs.append(("content-type", draw(st.sampled_from(CONTENT_TYPES)).encode()))
        elif op == "accept":
            pairs = [p for p in pairs if p[0] != "accept"]
            pairs.append(("accept", draw(st.sampled_from(ACCEPTS)).encode()))
        elif op == "huge":
            size = draw(st.sampled_from([8_000, 15_000, 70_000]))
            pairs.append((draw(st.sampled_from(NAMES)), b"x" * size))
        elif op == "dup" and pairs:
            name, value = pairs[draw(st.integers(0, len(pairs) - 1))]
            again = draw(st.sampled_from([value, b"", b"text/plain", b"other"]))
            pairs.insert(draw(st.integers(0, len(pairs))), (name, again))
        elif op == "host":
            pairs.append(("host", draw(st.sampled_from(HOSTS)).encode()))
        elif op == "origin":
            pairs.append(("origin", draw(st.sampled_from(ORIGINS)).encode()))
            if draw(st.booleans()):
                pairs.append(("sec-fetch-site", b"cross-site"))
        elif op == "forward":
            name, value = draw(st.sampled_from(FORWARDED))
            pairs.append((name, value.encode()))
        elif op == "drop" and pairs:
            del pairs[draw(st.integers(0, len(pairs) - 1))]
        else:
            name = draw(st.sampled_from(NAMES))
            value = draw(st.sampled_from([b"", b" ", b"\xff\xfe", b"\xc3\xa9", b"null", b"-1"]))
            pairs.append((name, value))
    return pairs


HEAD_LIMIT = 16 * 1024
"""Hypercorn's limit of a request's head (``h11_max_incomplete_size``): past it, its own
431 with no body, before any app runs."""


def refused_by_the_server(response: Any, pairs: list[tuple[str, bytes]]) -> bool:
    """Whether ``response`` is Hypercorn's (h11's) own refusal of a request's framing,
    sent before any app runs, with no body: 431 for a head past its limit, 400 for a
    ``Host`` repeated, 501 for a transfer coding other than ``chunked`` (RFC 9112 6.1
    says 501)."""
    if response.content:
        return False
    names = [name for name, _ in pairs]
    codings = [value.strip().lower() for name, value in pairs if name == "transfer-encoding"]
    size = sum(len(name) + len(value) + 4 for name, value in pairs)
    return (
        (response.status_code == 431 and size > HEAD_LIMIT)
        or (response.status_code == 400 and names.count("host") > 1)
        or (response.status_code == 501 and any(c != b"chunked" for c in codings))
    )


HEADER_FAMILIES: dict[str, tuple[Callable[[Rig], Any], Callable[[Rig], None], str]] = {
    "ai-sdk": (ui_new, ui_valid, "ai-sdk"),
    "openai": (oa_named, oa_valid, "openai"),
    "ag-ui": (ag_new, ag_valid, "ag-ui"),
    "a2a": (a2a_new, a2a_valid, "a2a"),
    "mcp": (mcp_tool, mcp_valid, "mcp"),
}


def headers_sent(rig: BusyRig, seed: Callable[[Rig], Call], shape: str) -> None:
    """One header example: ``seed``'s request with its headers drawn (from ``rig.data``)
    and mutated, sent and its answer checked; the seed's cleanup runs however it ends."""
    with seed(rig) as call:
        headers = rig.data.draw(header_mutations(call.headers), label="headers")
        body = json.dumps(call.body).encode()
        call.response = rig.raw((call.method, call.path, body, headers))
        if not refused_by_the_server(call.response, headers):
            rig.check(shape, call.response, body + repr(headers).encode())


@pytest.mark.parametrize("family", list(HEADER_FAMILIES))
async def test_request_headers(family, tmp_path):
    seed, valid, shape = HEADER_FAMILIES[family]
    protocols = ("ai-sdk",) if family == "ai-sdk" else ("ai-sdk", family)
    store = str(tmp_path / "fuzz.db")
    async with web_server(busy_agent(), store=store, protocols=protocols) as server:
        rig = BusyRig(server, f"headers-{family}")
        ran = 0

        @fuzz_settings(12)
        @given(data=st.data())
        def example(data: Any) -> None:
            nonlocal ran
            ran += 1
            rig.data = data
            headers_sent(rig, seed, shape)
            rig.settled()
            valid(rig)
            rig.settled()

        def run() -> None:
            with rig.http, rig.pool:
                rig.chat("other-done", "hello")
                rig.chat("other-wait", "approve this")
                if family == "a2a":
                    a2a_prepare(rig)
                valid(rig)
                trio.from_thread.run(rig._baseline)
                example()

        await trio.to_thread.run_sync(run)
    print(f"\nheader fuzz {family}: {ran} examples")


class _CutShort:
    """A hypothesis ``data`` whose draws end the example, as hypothesis does at a draw past
    an example's data (``StopTest``; common while it shrinks)."""

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        raise StopTest(0)


async def test_a_header_example_cut_short_at_its_draw_still_closes_its_mcp_session():
    # Its seed opened the session before the draw: the example drew before its `try`,
    # and a cut-short draw left the session and the SDK's two tasks for it (branch
    # mcpreap: the session the large header run found "left after a DELETE").
    async with web_server(busy_agent(), protocols=("ai-sdk", "mcp")) as server:
        rig = BusyRig(server, "headers-mcp")
        rig.data = _CutShort()

        def run() -> None:
            with rig.http, rig.pool, pytest.raises(StopTest):
                headers_sent(rig, mcp_tool, "mcp")

        await trio.to_thread.run_sync(run)
        assert await left(server) == (0, {})
