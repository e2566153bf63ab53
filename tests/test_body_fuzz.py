"""Every HTTP endpoint of ``runtime serve``'s app, fuzzed (hypothesis): bodies the official
clients send, mutated.

For each endpoint family (the AI SDK chat with its approval and client-tool
continuations, regenerate, stop and delete; AG-UI's ``RunAgentInput`` with frontend tools
and resumes; A2A 1.0 and 0.3 JSON-RPC and the HTTP+JSON binding; the MCP endpoint after
its handshake; the OpenAI Chat Completions endpoint, named and stateless) a few valid
bodies are the seeds (a continuation's seed is made against a turn the example opens
first, so it answers a real wait), and hypothesis mutates them: keys dropped, duplicated
(in the JSON text) or added, wrong types and extreme numbers (past 64 bits, ``1e400``,
``-0``, ``NaN``) at any path, strings with lone surrogates (escaped in the JSON), NUL,
bidi marks and 20,000 characters, nesting past the parser's depth, empty containers,
``null``, the ids of other sessions, tasks and approvals, and bodies that are no JSON
object at all. Each body goes through the real app on a loopback port in the test's own
process (Hypercorn's Trio worker, as ``serve`` runs it) on the scripted provider and a
SQLite store (the memory store too in the large run).

After every example:

- the status is never 5xx (the host never closes here, so not 503 either);
- a refusal is the protocol's own error shape (``{"error": ...}`` for the AI SDK and
  AG-UI, OpenAI's error object, JSON-RPC error objects for A2A and MCP, a
  ``google.rpc.Status`` for A2A's HTTP+JSON), an event stream is whole JSON events, and
  no answer holds a Python traceback, an exception class name or a file path (what the
  body itself said aside);
- every session of the store loads, and the OpenAI, Anthropic and Gemini requests built
  from its history (and a next input) break no wire rule;
- no turn is left running and no task is left over in the server (counted against the
  task tree after a valid warm-up request);
- the server still answers a valid request of the endpoint.

The ordinary run is a few hundred examples, derandomized, with no example database.
``AXON_BODY_FUZZ=N`` runs ``N`` examples per family instead, on SQLite and on the memory
store (by hand: ``AXON_BODY_FUZZ=2000 pytest -p no:cacheprovider --timeout=0 -s
tests/test_body_fuzz.py``; the count of examples each family ran is printed).
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from actors.providers import anthropic as anthropic_wire
from actors.providers import gemini as gemini_wire
from actors.providers import openai as openai_wire
from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.memory import MemoryStore
from runtime import Agent, Tool, tool
from runtime.actor_messages import InferRequest
from runtime.compaction import apply_summaries
from runtime.errors import UnsupportedMedia
from runtime.history import repair
from runtime.messages import ToolMessage, UserMessage
from tests.support.wire_rules import anthropic_errors, chat_errors, gemini_errors
from tests.web.harness import web_server

LARGE = int(os.environ.get("AXON_BODY_FUZZ", "0") or 0)
"""Examples per family in the large run (by hand); 0: the ordinary run's counts."""

STORES = ["sqlite", "memory"] if LARGE else ["sqlite"]

COUNTS: dict[str, int] = {}
"""Examples run, by family and store (printed at the end of each test)."""


def fuzz_settings(ordinary: int) -> Any:
    return settings(
        max_examples=LARGE or ordinary,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )


# -- the agent ------------------------------------------------------------------------------


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file (it needs a person's approval)."""
    return f"deleted {path}"


@tool
async def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


pick_color = Tool.client("pick_color", {"type": "object", "properties": {}}, "Pick a color.")


def _respond(request: InferRequest) -> list[Any]:
    """By the last user input: ``approve`` calls a tool that waits for approval,
    ``client`` the client-side tool, ``tool`` a server tool; a step after a tool's
    result answers; anything else is text."""
    messages = list(request.messages)
    users = [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]
    last = users[-1] if users else -1
    if any(isinstance(m, ToolMessage) for m in messages[last + 1 :]):
        return ["Done."]
    text = ""
    if users:
        content = messages[last].content
        text = content if isinstance(content, str) else " ".join(map(str, content))
    if "approve" in text:
        return ["Deleting. ", *tool_call("delete_file", {"path": "/x"})]
    if "client" in text:
        return ["Asking. ", *tool_call("pick_color", {})]
    if "tool" in text:
        return [*tool_call("lookup", {"q": "a"})]
    return ["Hi ", "there."]


def fuzz_agent() -> Agent:
    return Agent(
        name="fuzz",
        provider=ScriptedProvider(responder=_respond),
        tools=[delete_file, lookup, pick_color],
    )


# -- mutations ------------------------------------------------------------------------------


@attrs.frozen
class Raw:
    """JSON text written as it is (a token Python's encoder does not write)."""

    text: str


@attrs.frozen
class Dup:
    """An object whose keys repeat (in order, as the JSON text has them)."""

    pairs: tuple[tuple[str, Any], ...]


def dump(value: Any) -> str:
    """``value`` as JSON text: ASCII only (a lone surrogate is its ``\\udXXX`` escape),
    :class:`Raw` tokens as they are, :class:`Dup` keys repeated."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Dup):
        pairs = value.pairs
    elif isinstance(value, dict):
        pairs = tuple(value.items())
    elif isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    else:
        return json.dumps(value)
    return "{" + ",".join(json.dumps(k) + ":" + dump(v) for k, v in pairs) + "}"


ODD_TEXT = [
    "",
    " ",
    "\ud800",
    "a\udfffb",
    "\udc00\ud800",
    "\x00",
    "\u202e\u2066x",
    "\ufeff",
    "NaN",
    "null",
    "undefined",
    "true",
    "-1",
    "1e400",
    "../x",
    "a/b",
    "x~y",
    "~",
    "%2F",
    "\n\r",
    "x" * 129,
    "x" * 20_000,
    "\U0001f600" * 100,
    "e\u0301" * 50,
    "ROLE_AGENT",
    "assistant",
    "tool",
    "approval-responded",
    "regenerate-message",
]
ODD_NUMBERS = [
    Raw("1e400"),
    Raw("-1e400"),
    Raw("-0"),
    Raw("NaN"),
    Raw("Infinity"),
    Raw("1.0e-400"),
    Raw("123456789012345678901234567890"),
    Raw("-18446744073709551617"),
    0,
    -1,
    1,
    2,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    0.5,
    -0.0,
]
DEEP = [
    Raw("[" * 300 + "]" * 300),
    Raw('{"a":' * 300 + "{}" + "}" * 300),
    Raw("[" * 1100 + "]" * 1100),
]


def odd_values(ids: list[str]) -> st.SearchStrategy[Any]:
    """A value of another type or shape than what a path holds."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(ODD_NUMBERS),
        st.sampled_from(ODD_TEXT),
        st.text(max_size=20),
        st.sampled_from(ids),
    )
    small = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=6,
    )
    return st.one_of(
        scalars, small, st.just([]), st.just({}), st.sampled_from(DEEP), st.just([None] * 50)
    )


def paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*at, i))


def get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def put(root: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    get(root, path[:-1])[path[-1]] = new
    return root


OPS = [
    "replace",
    "replace",
    "replace",
    "drop",
    "drop",
    "duplicate",
    "extra",
    "empty",
    "wrap",
    "other-id",
    "null",
    "repeat",
]


@st.composite
def mutated(draw: Any, seed: Any, ids: list[str]) -> bytes:
    """``seed`` with up to four mutations, as a body's bytes; now and then a body that
    is no JSON object at all."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        text = dump(seed)
        cut = len(text) * draw(st.integers(0, 999)) // 1000  # (a share: ids' lengths vary)
        return text[:cut].encode()
    if kind == 1:
        return draw(
            st.sampled_from(
                [b"", b"null", b"[]", b"[{}]", b'"x"', b"7", b"{}", b"{", b"\xff\xfe", b"{}{}"]
            )
        )
    value = copy.deepcopy(seed)
    for _ in range(draw(st.integers(0 if kind == 2 else 1, 4))):
        where = list(paths(value))
        path = where[draw(st.integers(0, len(where) - 1))]
        op = draw(st.sampled_from(OPS))
        here = get(value, path)
        parent = get(value, path[:-1]) if path else None
        if op == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == "drop" and isinstance(parent, list):
            del parent[path[-1]]
        elif op == "duplicate" and isinstance(parent, dict):
            again = draw(st.one_of(st.just(here), odd_values(ids)))
            pairs = (*parent.items(), (path[-1], again))
            if draw(st.booleans()):
                pairs = ((path[-1], again), *parent.items())
            value = put(value, path[:-1], Dup(pairs))
        elif op == "extra" and isinstance(here, dict):
            here[draw(st.sampled_from(["x", "__proto__", "id", "", "\ud800", "type"]))] = draw(
                odd_values(ids)
            )
        elif op == "empty" and isinstance(here, list | dict):
            here.clear()
        elif op == "wrap":
            value = put(value, path, [here])
        elif op == "other-id":
            value = put(value, path, draw(st.sampled_from(ids)))
        elif op == "null":
            value = put(value, path, None)
        elif op == "repeat" and isinstance(here, list) and here:
            here.extend(copy.deepcopy(here[-1:]) * draw(st.integers(1, 40)))
        else:
            value = put(value, path, draw(odd_values(ids)))
        if not isinstance(value, dict | list):
            break  # (a scalar at the root: nothing more to walk)
    return dump(value).encode()


# -- the rig --------------------------------------------------------------------------------


@attrs.define
class Call:
    """One request: its method, path, headers, and the body to mutate (``None``: none)."""

    method: str
    path: str
    body: Any = None
    headers: dict[str, str] = attrs.field(factory=dict)
    cleanup: Callable[[Any], None] | None = None
    """Called with the response (``None`` when none came) once the example is over."""
    response: Any = None
    """The fuzzed request's response, once it came (the example sets it)."""

    def __enter__(self) -> Call:
        return self

    def __exit__(self, *exc: object) -> None:
        """The cleanup, however the example ends: also at a draw hypothesis cuts short
        (``StopTest`` when an example's data runs out, common while shrinking), after
        the seed has opened what the cleanup closes. The header and worker fuzzers drew
        before their ``try``: such an example left its MCP session, and the SDK's two
        tasks for it (``run_server``, ``message_router``) until the idle timeout, 30
        minutes: the session "left after a DELETE" of branch ``fuzzmore`` (no DELETE was
        sent; ``mcpreap``)."""
        if self.cleanup is not None:
            self.cleanup(self.response)


LEAKS = re.compile(
    r"Traceback \(most recent|File \"|\.py\b|<class '|object at 0x|\b[A-Z][A-Za-z]*"
    r"(Error|Exception)\b|\bpydantic\b|\bTypeError\b|\bKeyError\b|\bAttributeError\b"
)
ALLOWED_ERROR_WORDS = {
    # the protocols' own error names (A2A's ErrorInfo reasons, the runtime's kinds that
    # a failed turn reports as `Kind: text` by design: docs/web.md)
    "InvalidParamsError",
    "TaskNotFoundError",
    "TaskNotCancelableError",
    "UnsupportedOperationError",
    "ContentTypeNotSupportedError",
    "PushNotificationNotSupportedError",
    "VersionNotSupportedError",
    "InvalidRequestError",
    "MethodNotFoundError",
    "JSONParseError",
    "InvalidAgentResponseError",
    "InternalError",
}


def leaks(text: str, sent: str) -> list[str]:
    """What of a traceback, class name or file path ``text`` holds that ``sent`` did not."""
    found = []
    for match in LEAKS.finditer(text):
        word = match.group(0)
        if word in ALLOWED_ERROR_WORDS or word in sent:
            continue
        found.append(text[max(0, match.start() - 60) : match.end() + 60])
    return found


def wire_errors(messages: Any) -> list[str]:
    """The rules the three providers' requests built from ``messages`` (and a next
    input) break. A provider that refuses a stored file it cannot take
    (``UnsupportedMedia``: a text file for Chat Completions, docs/media.md) breaks none:
    that is its documented answer, not a malformed request."""
    history = repair(apply_summaries([*messages, UserMessage(content="next")]))
    checks = [
        lambda: chat_errors(openai_wire.map_messages(None, history)),
        lambda: anthropic_errors(anthropic_wire.map_messages(None, history)[1]),
        lambda: gemini_errors(gemini_wire.map_messages(None, history)[1]),
    ]
    bad: list[str] = []
    for check in checks:
        try:
            bad += check()
        except UnsupportedMedia:
            continue
    return bad


SUPERVISOR = "runtime.app.host.Host._supervise"


def task_count() -> int:
    """The tasks of this Trio run."""

    def walk(task: Any) -> int:
        return 1 + sum(walk(t) for n in task.child_nurseries for t in n.child_tasks)

    return walk(trio.lowlevel.current_root_task())


def task_names() -> list[str]:
    out: list[str] = []

    def walk(task: Any) -> None:
        out.append(task.name)
        for n in task.child_nurseries:
            for t in n.child_tasks:
                walk(t)

    walk(trio.lowlevel.current_root_task())
    return out


class Rig:
    """The server of one test, driven from a worker thread (hypothesis runs there; the
    server runs in the test's Trio loop, reached with ``trio.from_thread``)."""

    def __init__(self, server: Any, family: str) -> None:
        self.server = server
        self.family = family
        self.http = httpx.Client(base_url=server.url, timeout=60)
        self.n = 0
        self.seen: dict[str, tuple[Any, ...]] = {}
        self.baseline = 0
        self.baseline_sessions = 0
        self.baseline_names: collections.Counter[str] = collections.Counter()
        self.ids: list[str] = ["other-done", "other-wait"]
        self.data: Any = None

    # -- requests -------------------------------------------------------------------------

    def fresh(self, prefix: str = "s") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Any:
        headers = {"content-type": "application/json", **headers}
        return self.http.request(method, path, content=body, headers=headers)

    def chat(self, session_id: str, text: str) -> list[Any]:
        """A valid AI SDK turn; its events."""
        r = self.send("POST", "/api/chat", json.dumps(chat_body(session_id, text)).encode(), {})
        assert r.status_code == 200, r.text
        return sse_events(r.text)

    # -- the checks -----------------------------------------------------------------------

    def check(self, shape: str, response: Any, sent: bytes) -> None:
        status = response.status_code
        text = response.text
        assert status < 500, (status, text[:2000])
        said = sent.decode("utf-8", "replace")
        assert not leaks(text, said), leaks(text, said)
        kind = response.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            for event in sse_events(text):
                if shape in ("a2a", "mcp") and event != "[DONE]":
                    assert event.get("jsonrpc") == "2.0" or shape == "a2a", event
            return
        if not text:
            assert status in (200, 202, 204) or (shape == "ai-sdk" and status == 307), status
            return  # (307: Starlette's redirect of a path with a trailing slash)
        if shape == "ai-sdk" and (
            (status, text) in ((404, "Not Found"), (405, "Method Not Allowed"))
        ):
            return  # (a path no route matches: Starlette's own answer, no body read)
        if not kind.startswith("application/json"):
            raise AssertionError(f"{status} {kind}: {text[:500]}")
        answer = json.loads(text)
        if shape in ("a2a", "mcp") and "jsonrpc" in answer:
            assert answer["jsonrpc"] == "2.0" and ("result" in answer) != ("error" in answer)
            if "error" in answer:
                error = answer["error"]
                assert isinstance(error["code"], int) and isinstance(error["message"], str)
            return
        if status < 400:
            return
        if shape == "openai":
            error = answer["error"]
            assert isinstance(error["message"], str) and isinstance(error["type"], str), answer
        elif shape == "a2a-rest":
            error = answer["error"]
            assert isinstance(error["code"], int) and isinstance(error["status"], str), answer
            assert isinstance(error["message"], str), answer
        elif shape == "ag-ui":
            assert isinstance(answer["error"], str), answer
            assert status in (401, 403, 408, 413, 415, 503) or "code" in answer, answer
        elif shape == "mcp" and status == 401:
            assert answer["error"] == "invalid_token", answer
        else:
            assert isinstance(answer.get("error"), str), (shape, answer)

    def settled(self) -> None:
        trio.from_thread.run(self._settled)

    async def _settled(self) -> None:
        """No turn running, no task left over, every stored session loads and maps."""
        host = self.server.host
        with trio.move_on_after(10):
            while True:
                running = [s for s in host.sessions.values() if s.busy]
                if not running and not self.left_over():
                    break
                await trio.sleep(0.005)
        running = [sid for sid, s in host.sessions.items() if s.busy]
        assert not running, f"turns left running: {running}"
        assert not self.left_over(), self.left_over()
        for info in await host.store.list_sessions():
            key = (info.cursor, info.message_count, repr(info.meta))
            if self.seen.get(info.session_id) == key:
                continue
            self.seen[info.session_id] = key
            record = await host.store.load(info.session_id)
            assert record is not None, info.session_id
            assert wire_errors(record.messages) == [], (info.session_id, record.messages)

    def left_over(self) -> dict[str, int]:
        """The tasks running now that did not before the first example, but for one
        supervisor per session the host holds open (an idle session keeps its own)."""
        extra = collections.Counter(task_names()) - self.baseline_names
        held = len(self.server.host.sessions) - self.baseline_sessions
        if extra[SUPERVISOR] <= held:
            del extra[SUPERVISOR]
        return dict(extra)

    async def _baseline(self) -> None:
        await trio.sleep(0.05)
        self.baseline = task_count()
        self.baseline_names = collections.Counter(task_names())
        self.baseline_sessions = len(self.server.host.sessions)


def chat_body(session_id: str, text: str, message_id: str | None = None) -> dict[str, Any]:
    """What ``useChat``'s ``DefaultChatTransport`` sends for a new message."""
    return {
        "id": session_id,
        "messages": [
            {
                "id": message_id or f"u-{session_id}-{abs(hash(text)) % 10**6}",
                "role": "user",
                "parts": [{"type": "text", "text": text}],
            }
        ],
        "trigger": "submit-message",
    }


def sse_events(text: str) -> list[Any]:
    """The ``data:`` events of an event stream, parsed (``"[DONE]"`` kept as text)."""
    out: list[Any] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            joined = "\n".join(data)
            out.append(joined if joined == "[DONE]" else json.loads(joined))
    return out


async def run_family(
    family: str,
    store_kind: str,
    tmp_path: Any,
    seeds: list[Callable[[Rig], Call]],
    valid: Callable[[Rig], None],
    ordinary: int,
    *,
    shape: str,
    protocols: tuple[str, ...],
    prepare: Callable[[Rig], None] | None = None,
) -> None:
    store = str(tmp_path / "fuzz.db") if store_kind == "sqlite" else MemoryStore()
    async with web_server(fuzz_agent(), store=store, protocols=protocols) as server:
        rig = Rig(server, family)
        ran = 0

        def setup() -> None:
            rig.chat("other-done", "hello")
            events = rig.chat("other-wait", "approve this")
            asked = [e for e in events if e != "[DONE]" and e["type"] == "tool-approval-request"]
            rig.ids += [asked[0]["approvalId"], asked[0]["toolCallId"], events[0]["messageId"]]
            if prepare is not None:
                prepare(rig)
            valid(rig)
            trio.from_thread.run(rig._baseline)

        @fuzz_settings(ordinary)
        @given(data=st.data())
        def example(data: Any) -> None:
            nonlocal ran
            ran += 1
            rig.data = data
            seed = data.draw(st.sampled_from(seeds), label="seed")
            with seed(rig) as call:
                body = None
                if call.body is not None:
                    body = data.draw(mutated(call.body, rig.ids), label="body")
                call.response = rig.send(call.method, call.path, body, call.headers)
                rig.check(shape, call.response, body or b"")
            rig.settled()
            valid(rig)
            rig.settled()

        def run() -> None:
            with rig.http:
                setup()
                example()

        await trio.to_thread.run_sync(run)
    COUNTS[f"{family}/{store_kind}"] = ran
    print(f"\nbody fuzz {family} on {store_kind}: {ran} examples")


# -- AI SDK ---------------------------------------------------------------------------------


def _asked(rig: Rig, text: str) -> tuple[str, list[Any]]:
    sid = rig.fresh("ui")
    return sid, rig.chat(sid, text)


def _continuation(sid: str, events: list[Any], part: dict[str, Any]) -> dict[str, Any]:
    sent = chat_body(sid, "approve it" if part["type"] == "tool-delete_file" else "client")
    message_id = events[0]["messageId"]
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


def ui_new(rig: Rig) -> Call:
    sid = rig.fresh("ui")
    body = chat_body(sid, "hello")
    body["messages"][0]["parts"].append(
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,iVBORw0KGgo="}
    )
    return Call("POST", "/api/chat", body)


def ui_next(rig: Rig) -> Call:
    sid, _ = _asked(rig, "hello")
    body = chat_body(sid, "use a tool")
    body["messages"].insert(
        0, {"id": "m1", "role": "assistant", "parts": [{"type": "text", "text": "Hi there."}]}
    )
    body["turnId"] = "turn-" + sid
    return Call("POST", "/api/chat", body)


def ui_approval(rig: Rig) -> Call:
    sid, events = _asked(rig, "approve it")
    asked = next(e for e in events if e != "[DONE]" and e["type"] == "tool-approval-request")
    part = {
        "type": "tool-delete_file",
        "toolCallId": asked["toolCallId"],
        "state": "approval-responded",
        "input": {"path": "/x"},
        "approval": {"id": asked["approvalId"], "approved": True, "reason": "ok"},
    }
    return Call("POST", "/api/chat", _continuation(sid, events, part))


def ui_client_tool(rig: Rig) -> Call:
    sid, events = _asked(rig, "client")
    call = next(e for e in events if e != "[DONE]" and e["type"] == "tool-input-available")
    part = {
        "type": "tool-pick_color",
        "toolCallId": call["toolCallId"],
        "state": "output-available",
        "input": {},
        "output": "red",
    }
    return Call("POST", "/api/chat", _continuation(sid, events, part))


def ui_regenerate(rig: Rig) -> Call:
    sid, events = _asked(rig, "hello")
    body = chat_body(sid, "hello")
    body["trigger"] = "regenerate-message"
    body["messageId"] = events[0]["messageId"]
    return Call("POST", "/api/chat", body)


def ui_edit(rig: Rig) -> Call:
    sid = rig.fresh("ui")
    rig.send("POST", "/api/chat", json.dumps(chat_body(sid, "hello", "edit-me")).encode(), {})
    return Call("POST", "/api/chat", chat_body(sid, "hello again", "edit-me"))


def ui_stop(rig: Rig) -> Call:
    sid, events = _asked(rig, "hello")
    body = {"turnId": "turn-" + sid, "messageId": events[0]["messageId"]}
    return Call("POST", f"/api/chat/{sid}/stop", body)


def ui_delete(rig: Rig) -> Call:
    sid, _ = _asked(rig, "approve it")
    return Call("DELETE", f"/api/sessions/{sid}", {})


def ui_valid(rig: Rig) -> None:
    events = rig.chat(rig.fresh("valid"), "hello")
    assert events[-1] == "[DONE]" and events[-2]["type"] == "finish", events


@pytest.mark.parametrize("store_kind", STORES)
async def test_ai_sdk_chat_bodies(store_kind, tmp_path):
    seeds = [
        ui_new,
        ui_next,
        ui_approval,
        ui_client_tool,
        ui_regenerate,
        ui_edit,
        ui_stop,
        ui_delete,
    ]
    await run_family(
        "ai-sdk", store_kind, tmp_path, seeds, ui_valid, 90, shape="ai-sdk", protocols=("ai-sdk",)
    )


PATH_IDS = [
    "",
    "x" * 129,
    "%00",
    "a%2Fb",
    "..",
    "%2E%2E",
    "other-wait",
    "other-done",
    "%F0%9F%98%80",
    "%ED%A0%80",
    "%FF",
    "a b",
    "s~t",
]


@st.composite
def path_calls(draw: Any) -> tuple[str, str, bytes | None]:
    session = draw(
        st.one_of(
            st.sampled_from(PATH_IDS), st.from_regex(r"[A-Za-z0-9_.:-]{1,12}", fullmatch=True)
        )
    )
    method, path = draw(
        st.sampled_from(
            [
                ("GET", "/api/chat/{}/stream"),
                ("POST", "/api/chat/{}/stop"),
                ("DELETE", "/api/sessions/{}"),
                ("GET", "/api/sessions/{}"),
                ("GET", "/api/sessions/{}?view=ui"),
                ("GET", "/api/sessions/{}?only=busy"),
                ("GET", "/api/sessions/{}?view=" + draw(st.sampled_from(["x", "%00", ""]))),
                ("GET", "/api/sessions?limit=" + draw(st.sampled_from(["-1", "0", "1e9", "x"]))),
                ("GET", "/api/sessions?cursor=" + draw(st.sampled_from(["x", "-1", "%ED%A0%80"]))),
            ]
        )
    )
    body = draw(st.one_of(st.none(), mutated({"turnId": "t1", "messageId": "u1"}, PATH_IDS)))
    return method, path.format(session), body


@pytest.mark.parametrize("store_kind", STORES)
async def test_ai_sdk_paths_and_stop_bodies(store_kind, tmp_path):
    store = str(tmp_path / "fuzz.db") if store_kind == "sqlite" else MemoryStore()
    async with web_server(fuzz_agent(), store=store) as server:
        rig = Rig(server, "ai-sdk-paths")
        ran = 0

        @fuzz_settings(60)
        @given(call=path_calls())
        def example(call: tuple[str, str, bytes | None]) -> None:
            nonlocal ran
            ran += 1
            method, path, body = call
            response = rig.send(method, path, body, {})
            rig.check("ai-sdk", response, (body or b"") + path.encode())
            rig.settled()
            ui_valid(rig)
            rig.settled()

        def run() -> None:
            with rig.http:
                rig.chat("other-done", "hello")
                rig.chat("other-wait", "approve this")
                ui_valid(rig)
                trio.from_thread.run(rig._baseline)
                example()

        await trio.to_thread.run_sync(run)
    print(f"\nbody fuzz ai-sdk paths on {store_kind}: {ran} examples")


# -- OpenAI ---------------------------------------------------------------------------------


def oa_body(*messages: dict[str, Any], stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fuzz", "messages": list(messages), "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def oa_named(rig: Rig) -> Call:
    sid = rig.fresh("oa")
    body = oa_body({"role": "user", "content": "hello"})
    return Call("POST", "/v1/chat/completions", body, {"x-axon-session": sid})


def oa_stateless(rig: Rig) -> Call:
    body = oa_body(
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "found a"},
        {"role": "assistant", "content": "Found it."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        stream=False,
    )
    body.update(temperature=0.2, max_tokens=100, n=1, tool_choice="auto")
    return Call("POST", "/v1/chat/completions", body)


def oa_other_session(rig: Rig) -> Call:
    body = oa_body({"role": "user", "content": "approve it"}, stream=False)
    return Call("POST", "/v1/chat/completions", body, {"x-axon-session": "other-wait"})


def oa_valid(rig: Rig) -> None:
    body = json.dumps(oa_body({"role": "user", "content": "hello"}, stream=False)).encode()
    r = rig.send("POST", "/v1/chat/completions", body, {})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


@pytest.mark.parametrize("store_kind", STORES)
async def test_openai_chat_completions_bodies(store_kind, tmp_path):
    seeds = [oa_named, oa_stateless, oa_other_session]
    await run_family(
        "openai",
        store_kind,
        tmp_path,
        seeds,
        oa_valid,
        60,
        shape="openai",
        protocols=("ai-sdk", "openai"),
    )


# -- AG-UI ----------------------------------------------------------------------------------

ASK_TOOL = {
    "name": "ask_user",
    "description": "Ask the user.",
    "parameters": {
        "type": "object",
        "properties": {"options": {"type": "array", "items": {"type": "string"}}},
        "required": ["options"],
    },
}


def run_input(thread: str, *messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": fields.pop("runId", f"run-{thread}"),
        "state": {},
        "messages": list(messages),
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **fields,
    }


def agui_events(rig: Rig, body: dict[str, Any]) -> list[Any]:
    r = rig.send("POST", "/ag-ui", json.dumps(body).encode(), {})
    assert r.status_code == 200, r.text
    return sse_events(r.text)


def ag_new(rig: Rig) -> Call:
    thread = rig.fresh("ag")
    body = run_input(
        thread,
        {"id": "sys", "role": "system", "content": "Be brief."},
        {"id": "u0", "role": "user", "content": "earlier"},
        {
            "id": "a0",
            "role": "assistant",
            "content": "ok",
            "toolCalls": [
                {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            ],
        },
        {"id": "t0", "role": "tool", "toolCallId": "c0", "content": "found"},
        {
            "id": "u1",
            "role": "user",
            "content": [
                {"type": "text", "text": "hello"},
                {
                    "type": "image",
                    "source": {"type": "data", "value": "iVBORw0KGgo=", "mimeType": "image/png"},
                },
            ],
        },
        tools=[ASK_TOOL],
        context=[{"description": "where", "value": "Oslo"}],
    )
    return Call("POST", "/ag-ui", body)


def ag_resume(rig: Rig) -> Call:
    thread = rig.fresh("ag")
    events = agui_events(rig, run_input(thread, {"id": "u1", "role": "user", "content": "approve"}))
    interrupt = events[-1]["outcome"]["interrupts"][0]
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    body = run_input(
        thread, {"id": "u1", "role": "user", "content": "approve"}, resume=resume, runId="r2"
    )
    return Call("POST", "/ag-ui", body)


def ag_tool_answer(rig: Rig) -> Call:
    thread = rig.fresh("ag")
    first = run_input(thread, {"id": "u1", "role": "user", "content": "client"})
    events = agui_events(rig, first)
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    message_id = start["parentMessageId"]
    body = run_input(
        thread,
        {"id": "u1", "role": "user", "content": "client"},
        {
            "id": message_id,
            "role": "assistant",
            "content": "Asking. ",
            "toolCalls": [
                {
                    "id": start["toolCallId"],
                    "type": "function",
                    "function": {"name": "pick_color", "arguments": "{}"},
                }
            ],
        },
        {"id": "answer-1", "role": "tool", "toolCallId": start["toolCallId"], "content": "blue"},
        runId="r2",
    )
    return Call("POST", "/ag-ui", body)


def ag_other(rig: Rig) -> Call:
    body = run_input("other-wait", {"id": "u9", "role": "user", "content": "hello"})
    return Call("POST", "/ag-ui", body)


def ag_valid(rig: Rig) -> None:
    events = agui_events(
        rig, run_input(rig.fresh("agv"), {"id": "u1", "role": "user", "content": "hello"})
    )
    assert events[-1]["type"] == "RUN_FINISHED", events


@pytest.mark.parametrize("store_kind", STORES)
async def test_agui_run_agent_input_bodies(store_kind, tmp_path):
    seeds = [ag_new, ag_resume, ag_tool_answer, ag_other]
    await run_family(
        "ag-ui",
        store_kind,
        tmp_path,
        seeds,
        ag_valid,
        60,
        shape="ag-ui",
        protocols=("ai-sdk", "ag-ui"),
    )


# -- A2A ------------------------------------------------------------------------------------


def rpc(method: str, params: Any, request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def a2a_message(rig: Rig, text: str, **fields: Any) -> dict[str, Any]:
    return {
        "messageId": rig.fresh("m"),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
        **fields,
    }


def a2a_send(rig: Rig, text: str, context: str) -> dict[str, Any]:
    """A valid blocking ``SendMessage``; its task."""
    body = rpc("SendMessage", {"message": a2a_message(rig, text, contextId=context)})
    r = rig.send("POST", "/a2a/jsonrpc", json.dumps(body).encode(), {})
    assert r.status_code == 200 and "result" in r.json(), r.text
    return r.json()["result"]["task"]


def a2a_prepare(rig: Rig) -> None:
    done = a2a_send(rig, "hello", "ctx-done")
    waiting = a2a_send(rig, "approve", "ctx-wait")
    rig.ids += [done["id"], waiting["id"], "ctx-done", "ctx-wait"]


def a2a_new(rig: Rig) -> Call:
    message = a2a_message(
        rig,
        "hello",
        contextId=rig.fresh("ctx"),
        metadata={"axonHops": 1},
    )
    message["parts"] += [
        {"raw": "aGk=", "mediaType": "text/plain", "filename": "a.txt"},
        {"url": "https://example.com/a.png", "mediaType": "image/png"},
        {"data": {"a": [1, 2]}},
    ]
    method = rig_choice(rig, ["SendMessage", "SendStreamingMessage"])
    return Call(
        "POST",
        "/a2a/jsonrpc",
        rpc(method, {"message": message, "configuration": {"returnImmediately": False}}),
    )


def rig_choice(rig: Rig, options: list[str]) -> str:
    """One of ``options``, drawn by the example (so that a replay makes the same call)."""
    return str(rig.data.draw(st.sampled_from(options)))


def a2a_decide(rig: Rig) -> Call:
    task = a2a_send(rig, "approve", rig.fresh("ctx"))
    pending = task["status"]["message"]["parts"][1]["data"]["pending"]
    decision = {"decisions": [{"id": pending[0]["id"], "approved": True, "reason": "ok"}]}
    message = a2a_message(rig, "", taskId=task["id"], contextId=task["contextId"])
    message["parts"] = [{"data": decision}]
    return Call("POST", "/a2a/jsonrpc", rpc("SendMessage", {"message": message}))


def a2a_client_output(rig: Rig) -> Call:
    task = a2a_send(rig, "client", rig.fresh("ctx"))
    message = a2a_message(rig, "", taskId=task["id"])
    message["parts"] = [{"data": {"decisions": [{"output": "red"}]}}]
    return Call("POST", "/a2a/jsonrpc", rpc("SendStreamingMessage", {"message": message}))


def a2a_task_call(rig: Rig) -> Call:
    task = a2a_send(rig, rig_choice(rig, ["approve", "hello"]), rig.fresh("ctx"))
    method = rig_choice(rig, ["GetTask", "CancelTask", "SubscribeToTask", "GetTask"])
    params: dict[str, Any] = {"id": task["id"]}
    if method == "GetTask":
        params["historyLength"] = 10
    return Call("POST", "/a2a/jsonrpc", rpc(method, params, "req-1"))


def a2a_legacy(rig: Rig) -> Call:
    method = rig_choice(
        rig, ["message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe"]
    )
    if method.startswith("message/"):
        params = {
            "message": {
                "kind": "message",
                "messageId": rig.fresh("m"),
                "role": "user",
                "contextId": rig.fresh("ctx"),
                "parts": [
                    {"kind": "text", "text": "hello"},
                    {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain"}},
                    {"kind": "data", "data": {"a": 1}},
                ],
            },
            "configuration": {"blocking": True, "acceptedOutputModes": ["text/plain"]},
        }
    else:
        task = a2a_send(rig, "approve", rig.fresh("ctx"))
        params = {"id": task["id"], "historyLength": 3}
    return Call("POST", "/a2a/jsonrpc", rpc(method, params, 7))


def a2a_valid(rig: Rig) -> None:
    task = a2a_send(rig, "hello", rig.fresh("ctxv"))
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task


@pytest.mark.parametrize("store_kind", STORES)
async def test_a2a_jsonrpc_bodies(store_kind, tmp_path):
    seeds = [a2a_new, a2a_decide, a2a_client_output, a2a_task_call, a2a_legacy]
    await run_family(
        "a2a",
        store_kind,
        tmp_path,
        seeds,
        a2a_valid,
        80,
        shape="a2a",
        protocols=("ai-sdk", "a2a"),
        prepare=a2a_prepare,
    )


def rest_send(rig: Rig) -> Call:
    path = rig_choice(rig, ["/a2a/message:send", "/a2a/message:stream"])
    message = a2a_message(rig, "hello", contextId=rig.fresh("ctx"))
    return Call("POST", path, {"message": message, "configuration": {"returnImmediately": False}})


def rest_decide(rig: Rig) -> Call:
    task = a2a_send(rig, "approve", rig.fresh("ctx"))
    pending = task["status"]["message"]["parts"][1]["data"]["pending"]
    message = a2a_message(rig, "", taskId=task["id"])
    message["parts"] = [{"data": {"decisions": [{"id": pending[0]["id"], "approved": False}]}}]
    return Call("POST", "/a2a/message:send", {"message": message})


def rest_task(rig: Rig) -> Call:
    task = a2a_send(rig, "approve", rig.fresh("ctx"))
    suffix = rig_choice(rig, [":cancel", ":subscribe"])
    return Call("POST", f"/a2a/tasks/{task['id']}{suffix}", {"id": task["id"]})


@pytest.mark.parametrize("store_kind", STORES)
async def test_a2a_http_json_bodies(store_kind, tmp_path):
    await run_family(
        "a2a-rest",
        store_kind,
        tmp_path,
        [rest_send, rest_decide, rest_task],
        a2a_valid,
        40,
        shape="a2a-rest",
        protocols=("ai-sdk", "a2a"),
        prepare=a2a_prepare,
    )


# -- MCP ------------------------------------------------------------------------------------

MCP_ACCEPT = {"accept": "application/json, text/event-stream"}
MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "fuzz", "version": "0"},
    },
}


def mcp_session(rig: Rig) -> dict[str, str]:
    opened = rig.send("POST", "/mcp", json.dumps(MCP_INIT).encode(), MCP_ACCEPT)
    assert opened.status_code == 200, opened.text
    headers = {
        **MCP_ACCEPT,
        "mcp-session-id": opened.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-11-25",
    }
    notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert rig.send("POST", "/mcp", json.dumps(notice).encode(), headers).status_code == 202
    return headers


def mcp_closing(rig: Rig, headers: dict[str, str]) -> Callable[[Any], None]:
    def close(response: Any) -> None:
        rig.http.request("DELETE", "/mcp", headers=headers)

    return close


def mcp_call(rig: Rig, body: dict[str, Any]) -> Call:
    headers = mcp_session(rig)
    return Call("POST", "/mcp", body, headers, cleanup=mcp_closing(rig, headers))


def mcp_tool(rig: Rig) -> Call:
    params = {
        "name": "fuzz",
        "arguments": {"prompt": "hello", "session_id": rig.fresh("mcp")},
        "_meta": {"progressToken": "p1"},
    }
    return mcp_call(rig, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})


def mcp_tool_other(rig: Rig) -> Call:
    params = {"name": "fuzz", "arguments": {"prompt": "approve", "session_id": "other-wait"}}
    return mcp_call(rig, {"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": params})


def mcp_list(rig: Rig) -> Call:
    method = rig_choice(rig, ["tools/list", "ping", "resources/list", "prompts/list"])
    return mcp_call(rig, {"jsonrpc": "2.0", "id": 3, "method": method, "params": {}})


def mcp_notice(rig: Rig) -> Call:
    body = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "changed my mind"},
    }
    return mcp_call(rig, body)


def mcp_initialize(rig: Rig) -> Call:
    def close(response: Any) -> None:  # (the session a fuzzed handshake opened, if one)
        opened = response.headers.get("mcp-session-id") if response is not None else None
        if opened:
            rig.http.request("DELETE", "/mcp", headers={**MCP_ACCEPT, "mcp-session-id": opened})

    return Call("POST", "/mcp", copy.deepcopy(MCP_INIT), dict(MCP_ACCEPT), cleanup=close)


MCP_2026 = "2026-07-28"


def mcp_envelope(rig: Rig) -> Call:
    """The 2026 era's per-request envelope (no handshake, no session), as the official
    client sends it."""
    method = rig_choice(rig, ["server/discover", "tools/call", "tools/list"])
    params: dict[str, Any] = {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MCP_2026,
            "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    }
    headers = {**MCP_ACCEPT, "mcp-protocol-version": MCP_2026, "mcp-method": method}
    if method == "tools/call":
        params.update(name="fuzz", arguments={"prompt": "hello", "session_id": rig.fresh("mcp")})
        headers["mcp-name"] = "fuzz"
    return Call(
        "POST", "/mcp", {"jsonrpc": "2.0", "id": 2, "method": method, "params": params}, headers
    )


def mcp_valid(rig: Rig) -> None:
    headers = mcp_session(rig)
    try:
        params = {"name": "fuzz", "arguments": {"prompt": "hello"}}
        body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
        r = rig.send("POST", "/mcp", json.dumps(body).encode(), headers)
        assert r.status_code == 200 and "Hi there." in r.text, r.text
    finally:
        mcp_closing(rig, headers)(None)


@pytest.mark.parametrize("store_kind", STORES)
async def test_mcp_endpoint_bodies(store_kind, tmp_path):
    await run_family(
        "mcp",
        store_kind,
        tmp_path,
        [mcp_tool, mcp_tool_other, mcp_list, mcp_notice, mcp_initialize, mcp_envelope],
        mcp_valid,
        60,
        shape="mcp",
        protocols=("ai-sdk", "mcp"),
    )


# -- what the fuzzer found ------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"null", b'{"jsonrpc": "2.0", "id": 1, "method": 7}'])
async def test_an_mcp_body_that_is_no_jsonrpc_message_is_told_so_without_pydantics_report(body):
    # The transport answered it with pydantic's validation report as the error's message:
    # "4 validation errors for union[JSONRPCRequest,JSONRPCNotification,...]", the input
    # echoed, and a link to errors.pydantic.dev.
    async with web_server(fuzz_agent(), protocols=("ai-sdk", "mcp")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            opened = await http.post("/mcp", json=MCP_INIT, headers=MCP_ACCEPT)
            headers = {
                **MCP_ACCEPT,
                "content-type": "application/json",
                "mcp-session-id": opened.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-11-25",
            }
            r = await http.post("/mcp", content=body, headers=headers)
    assert r.status_code == 400
    assert int(r.headers["content-length"]) == len(r.content)
    answer = r.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == -32602
    assert answer["error"]["message"].startswith("Validation error: not a JSON-RPC 2.0 message")
    assert not leaks(r.text, body.decode()), r.text


@pytest.mark.parametrize("call_id", [[], {"a": 1}])
async def test_a_client_tools_output_part_whose_call_id_is_a_list_is_passed_over_not_a_500(call_id):
    # `call_id in calls` with a list or an object raised TypeError (unhashable): a 500
    # and a traceback in the log for a continuation body.
    async with web_server(fuzz_agent()) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            first = sse_events((await http.post("/api/chat", json=chat_body("s", "client"))).text)
            part = {
                "type": "tool-pick_color",
                "toolCallId": call_id,
                "state": "output-available",
                "input": {},
                "output": "red",
            }
            r = await http.post("/api/chat", json=_continuation("s", first, part))
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "the assistant message answers no call the turn waits for"}


async def test_what_the_mcp_transport_sends_after_its_whole_response_is_dropped():
    # A notification is answered 202, then handed to its session; a session ended in
    # between (the client's DELETE right after: 46 times in 1,170 examples of the large
    # run) had the transport start a 500 on the finished response, which Hypercorn raised
    # out of the app ("Error in ASGI Framework", a second traceback in the log).
    from runtime.app.web.mcp_endpoint import _Refusals

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    sending = _Refusals(send)
    await sending({"type": "http.response.start", "status": 202, "headers": []})
    await sending({"type": "http.response.body", "body": b""})
    await sending({"type": "http.response.start", "status": 500, "headers": []})
    await sending({"type": "http.response.body", "body": b'{"error": "late"}'})
    assert [m.get("status") for m in sent] == [202, None]
    assert sending.finished  # (the ClosedResourceError the transport raises next ends there)
