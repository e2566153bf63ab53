"""The agent of the embedded deployment's seeded fault run
(``serve --agent tests.support.embedded_agent:agent``; :mod:`tests.support.embchaos`).

A scripted provider whose answers depend only on the request:

The tools' results name the idempotency key (``recorded <n> <key>``).

* input ``tools ...``: step 0 calls ``record(n=1)``, step 1 ``record(n=2)``, step 2
  answers ``done <input>: w0 w1 ...``;
* input ``approve ...``: step 0 says ``I need your approval. `` and calls ``guarded(n=1)``
  (it waits for a person); step 1 answers as ``tools`` does, or ``not done: <denial>``;
* input ``client ...``: step 0 calls the client-side tool ``locate``; step 1 answers
  ``located: <its output>`` (or ``no place: <its error>``);
* any other input: ``echo: <input>``.

``record`` and ``guarded`` write their side effect into an SQLite ledger
(``AXON_TEST_LEDGER``, a file path), once per ``ToolContext.idempotency_key``, and count
every attempt. ``AXON_TEST_DELAY`` paces the streamed chunks; ``AXON_TEST_TOOL_HOLD`` is
what ``record`` waits after its effect (a kill then falls between effect and commit).
"""

from __future__ import annotations

import os
import sqlite3

import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.messages import TextPart, ToolMessage, UserMessage
from runtime.tools import Tool, ToolContext, tool

ANSWER_WORDS = 12


def _ledger(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, pid INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS attempts (key TEXT NOT NULL, pid INTEGER)")
    return conn


def write_effect(path: str, key: str) -> None:
    """The side effect: at most one ``effects`` row per key; every attempt counted."""
    conn = _ledger(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO attempts VALUES (?, ?)", (key, os.getpid()))
        conn.execute("INSERT OR IGNORE INTO effects VALUES (?, ?)", (key, os.getpid()))
        conn.execute("COMMIT")
    finally:
        conn.close()


def read_ledger(path: str) -> tuple[dict[str, int], dict[str, int]]:
    """``(effects per key, attempts per key)``."""
    conn = _ledger(path)
    try:
        effects = dict(conn.execute("SELECT key, count(*) FROM effects GROUP BY key"))
        attempts = dict(conn.execute("SELECT key, count(*) FROM attempts GROUP BY key"))
    finally:
        conn.close()
    return effects, attempts


async def _effect(ctx: ToolContext) -> None:
    path = os.environ.get("AXON_TEST_LEDGER")
    if path:
        await trio.to_thread.run_sync(write_effect, path, ctx.idempotency_key)


@tool
async def record(n: int, ctx: ToolContext) -> str:
    """Record effect number ``n`` (once per idempotency key)."""
    await _effect(ctx)
    hold = float(os.environ.get("AXON_TEST_TOOL_HOLD", "0") or 0)
    if hold:
        await trio.sleep(hold)
    return f"recorded {n} {ctx.idempotency_key}"


@tool(needs_approval=True)
async def guarded(n: int, ctx: ToolContext) -> str:
    """Record effect number ``n`` once a person approved it."""
    await _effect(ctx)
    return f"recorded {n} {ctx.idempotency_key}"


locate = Tool.client(
    "locate",
    {"type": "object", "properties": {}},
    "Where the user is.",
)


def _last_input(request: InferRequest) -> str:
    for message in reversed(request.messages):
        if type(message) is UserMessage:
            content = message.content
            if isinstance(content, str):
                return content
            return "".join(p.text for p in content if isinstance(p, TextPart))
    return ""


def answer_text(user: str) -> str:
    return f"done {user}: " + " ".join(f"w{i}" for i in range(ANSWER_WORDS))


def respond(request: InferRequest) -> list:  # type: ignore[type-arg]
    user = _last_input(request)
    step = current_step(request.messages)
    last = request.messages[-1]
    if user.startswith("approve"):
        if step == 0:
            return [
                "I need your approval. ",
                *tool_call("guarded", {"n": 1}, tool_call_id="call_a"),
            ]
        denied = last.error if isinstance(last, ToolMessage) else "no result"
        return [answer_text(user) if denied is None else f"not done: {denied}"]
    if user.startswith("client"):
        if step == 0:
            return tool_call("locate", {}, tool_call_id="call_c")
        if isinstance(last, ToolMessage) and last.error is None:
            return [f"located: {last.output}"]
        return [f"no place: {getattr(last, 'error', None)}"]
    if user.startswith("tools"):
        if step < 2:
            return tool_call("record", {"n": step + 1}, tool_call_id=f"call_{step + 1}")
        return [answer_text(user)]
    return [f"echo: {user}"]


agent = Agent(
    name="embedded-chaos",
    provider=ScriptedProvider(
        responder=respond,
        delay=float(os.environ.get("AXON_TEST_DELAY", "0") or 0),
        keep_requests=0,
        chunk_size=8,
    ),
    instructions="test",
    tools=[record, guarded, locate],
)
