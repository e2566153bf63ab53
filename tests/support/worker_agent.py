"""The agent the worker tests run (``--agent tests.support.worker_agent:agent``).

A scripted provider whose answers depend only on the request, so a step re-run by the
worker that takes a turn over replays exactly what the dead worker's step would have:

* input ``tools ...``: step 0 calls ``record(n=1)``, step 1 calls ``record(n=2)``, step 2
  answers in ``ANSWER_WORDS`` words;
* input ``crash ...``: step 0 calls ``die``, which SIGKILLs the worker (a poison turn);
* input ``approve ...``: step 0 calls ``guarded(n=1)``, which needs a person's approval
  (the turn waits, docs/approval.md) and then records its effect like ``record``; step 1
  answers as a ``tools`` turn does (the denial's reason in it when denied);
* input ``sub ...``: step 0 calls the agent tool ``helper`` (a sub-turn in a sub-session,
  whose step 0 calls ``record(n=1)``, step 1 answers ``sub done``), step 1 answers as a
  ``tools`` turn does;
* any other input: one step answering ``echo: <input>``.

An input of parts is read as its text parts joined (its images and files are ignored).

Controlled by the environment of the worker process:

* ``AXON_TEST_DELAY``: seconds before each streamed chunk (default 0);
* ``AXON_TEST_APPROVAL_TIMEOUT``: the agent's ``approval_timeout`` (default none);
* ``AXON_TEST_ANSWER_TAG``: put before each word of a ``tools`` turn's answer (default
  none), so the worker that takes a turn over can answer otherwise than the dead one;
* ``AXON_TEST_TOOL_HOLD``: seconds ``record`` waits *after* its side effect, before it
  returns: a worker killed then dies between a tool's execution and its step's commit;
* ``AXON_TEST_GUARDED_HOLD``: the same for ``guarded``: a worker killed then dies in
  an approved turn's continuation, after the approved call ran, before its commit;
* ``AXON_TEST_LEDGER``: the ``postgresql://...?schema=`` URL where ``record`` writes its
  side effect, once per ``ToolContext.idempotency_key`` (``axon_test_ledger``), and every
  attempt (``axon_test_attempts``): the ledger proves a takeover repeats no effect;
* ``AXON_TEST_FINISH_HOLD``: seconds the save of a turn's last step waits in its
  transaction once it wrote the turn's row ``done``, before its commit (a
  ``pg_sleep`` in that statement, or after the save function in its call): a worker
  killed then dies inside the one transaction that stores the last step and finishes the
  turn.
* ``AXON_TEST_START_GATE``: a file path; the agent's ``on_turn_start`` hook waits until
  that file exists (the test creates it), so a turn is held between its ``start`` and its
  first ``step-start`` for as long as the test wants.
* ``AXON_TEST_TOOL_GATE``: a file path; the agent's ``on_tool_call`` hook creates
  ``<path>.at`` and waits until the path exists: the worker is held just before it runs
  its first tool, for as long as the test wants.
* ``AXON_TEST_SUB_TOOL_GATE``: the same, in the ``helper`` sub-agent's ``on_tool_call``:
  the worker is held inside a ``sub`` turn's sub-turn, just before its ``record``.
"""

from __future__ import annotations

import os
import signal
import time

import psycopg
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores.postgres import parse_url
from runtime.actor_messages import InferRequest
from runtime.agent import Agent, Hooks
from runtime.chunks import ReasoningChunk
from runtime.messages import TextPart, UserMessage
from runtime.tools import ToolContext, tool

ANSWER_WORDS = 40
_FINISH_HOLD = os.environ.get("AXON_TEST_FINISH_HOLD")
if _FINISH_HOLD:
    from actors.stores import postgres, turn_claims

    turn_claims._FINISH_IN_SAVE = turn_claims._FINISH_IN_SAVE.replace(  # type: ignore[misc]
        "SELECT pg_notify(", f"SELECT pg_sleep({float(_FINISH_HOLD)}), pg_notify("
    )
    # The save function's call: its result row (the function ran, the row is written
    # ``done``) held in the same statement, before its commit.
    postgres._SAVE_SQL_ENDING = (
        postgres._SAVE_SQL.replace(
            b"SELECT * FROM ", b"SELECT f.*, pg_sleep(%a) FROM " % float(_FINISH_HOLD)
        )
        + b" AS f"
    )
    postgres._SAVE_NEXT_SQL = (
        postgres._SAVE_NEXT_SQL.replace(  # type: ignore[misc]
            b"SELECT * FROM ", b"SELECT f.*, pg_sleep(%a) FROM " % float(_FINISH_HOLD)
        )
        + b" AS f"
    )
LEDGER_SQL = (
    """CREATE TABLE IF NOT EXISTS axon_test_ledger (
        key TEXT PRIMARY KEY, pid INTEGER NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS axon_test_attempts (
        id SERIAL PRIMARY KEY, key TEXT NOT NULL, pid INTEGER NOT NULL)""",
)


def _ledger_connect(url: str):  # type: ignore[no-untyped-def]
    libpq, schema = parse_url(url)
    conn = psycopg.connect(libpq, autocommit=True, connect_timeout=10)
    # ``CREATE ... IF NOT EXISTS`` from two connections at once can both find the table
    # missing and one fail with a ``UniqueViolation`` on ``pg_class`` (a test polling
    # the ledger while the worker's tool writes its first effect): one creator at a time.
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('axon_test_ledger'))")
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(f"SET search_path TO {schema}")
        for statement in LEDGER_SQL:
            conn.execute(statement)
    return conn


def write_effect(url: str, key: str) -> None:
    """The tool's side effect: at most one ledger row per key, every attempt counted.
    Retried for 30 s while PostgreSQL cannot be reached (a test restarts it), as a real
    tool with a side effect would."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return _write_effect(url, key)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _write_effect(url: str, key: str) -> None:
    with _ledger_connect(url) as conn:
        conn.execute(
            "INSERT INTO axon_test_attempts (key, pid) VALUES (%s, %s)", (key, os.getpid())
        )
        conn.execute(
            "INSERT INTO axon_test_ledger (key, pid) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
            (key, os.getpid()),
        )


def read_ledger(url: str) -> tuple[dict[str, int], dict[str, int]]:
    """``(effects per key, attempts per key)``."""
    with _ledger_connect(url) as conn:
        effects = dict(
            conn.execute("SELECT key, count(*) FROM axon_test_ledger GROUP BY key").fetchall()
        )
        attempts = dict(
            conn.execute("SELECT key, count(*) FROM axon_test_attempts GROUP BY key").fetchall()
        )
    return effects, attempts


@tool
async def record(n: int, ctx: ToolContext) -> str:
    """Record effect number ``n`` (once per idempotency key)."""
    url = os.environ.get("AXON_TEST_LEDGER")
    if url:
        await trio.to_thread.run_sync(write_effect, url, ctx.idempotency_key)
    hold = float(os.environ.get("AXON_TEST_TOOL_HOLD", "0") or 0)
    if hold:
        await trio.sleep(hold)
    return f"recorded {n}"


@tool(needs_approval=True)
async def guarded(n: int, ctx: ToolContext) -> str:
    """Record effect number ``n`` once a person approved it (once per idempotency key)."""
    url = os.environ.get("AXON_TEST_LEDGER")
    if url:
        await trio.to_thread.run_sync(write_effect, url, ctx.idempotency_key)
    hold = float(os.environ.get("AXON_TEST_GUARDED_HOLD", "0") or 0)
    if hold:
        await trio.sleep(hold)
    return f"recorded {n}"


@tool
async def die() -> str:
    """Kill the worker process running this call (a turn that kills its workers)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def _last_input(request: InferRequest) -> str:
    for message in reversed(request.messages):
        if type(message) is UserMessage:
            content = message.content
            if isinstance(content, str):
                return content
            return "".join(p.text for p in content if isinstance(p, TextPart))
    return ""


def answer_text(user: str, tag: str = "") -> str:
    """The final answer of a ``tools`` turn (``tag``: the worker's
    ``AXON_TEST_ANSWER_TAG``, so a re-run of the step can answer otherwise)."""
    words = " ".join(f"{tag}w{i}" for i in range(ANSWER_WORDS))
    return f"done {user}: {words}"


def respond(request: InferRequest) -> list:  # type: ignore[type-arg]
    user = _last_input(request)
    if user.startswith("crash"):
        return tool_call("die", {}, tool_call_id="call_die")
    if user.startswith("approve"):
        if current_step(request.messages) == 0:
            return [
                "I need your approval. ",
                *tool_call("guarded", {"n": 1}, tool_call_id="call_a"),
            ]
        result = request.messages[-1]
        denied = getattr(result, "error", None)
        return [answer_text(user) if denied is None else f"not done: {denied}"]
    if user.startswith("sub"):
        if current_step(request.messages) == 0:
            return tool_call("helper", {"input": "record one"}, tool_call_id="call_h")
        return [answer_text(user)]
    if not user.startswith("tools"):
        return [f"echo: {user}"]
    step = current_step(request.messages)
    if step == 0:
        return [
            ReasoningChunk(text="I will record two effects."),
            *tool_call("record", {"n": 1}, tool_call_id="call_1"),
        ]
    if step == 1:
        return tool_call("record", {"n": 2}, tool_call_id="call_2")
    return [answer_text(user, os.environ.get("AXON_TEST_ANSWER_TAG", ""))]


async def _start_gate(event: object) -> None:
    """Wait until the file ``AXON_TEST_START_GATE`` names exists."""
    gate = trio.Path(os.environ.get("AXON_TEST_START_GATE", ""))
    while not await gate.exists():  # noqa: ASYNC110
        await trio.sleep(0.02)


async def _tool_gate(event: object, variable: str = "AXON_TEST_TOOL_GATE") -> None:
    """Say so (``<AXON_TEST_TOOL_GATE>.at``), then wait until ``AXON_TEST_TOOL_GATE``
    exists."""
    gate = trio.Path(os.environ.get(variable, ""))
    await trio.Path(f"{gate}.at").touch()
    while not await gate.exists():  # noqa: ASYNC110
        await trio.sleep(0.02)


async def _sub_tool_gate(event: object) -> None:
    await _tool_gate(event, "AXON_TEST_SUB_TOOL_GATE")


def _helper_respond(request: InferRequest) -> list:  # type: ignore[type-arg]
    if current_step(request.messages) == 0:
        return tool_call("record", {"n": 1}, tool_call_id="call_s")
    return ["sub done"]


helper = Agent(
    name="helper",
    provider=ScriptedProvider(responder=_helper_respond, keep_requests=0),
    instructions="test helper",
    tools=[record],
    hooks=Hooks(on_tool_call=_sub_tool_gate if os.environ.get("AXON_TEST_SUB_TOOL_GATE") else None),
)
"""The ``helper`` agent a ``sub`` turn calls as a tool."""


agent = Agent(
    name="worker-test",
    provider=ScriptedProvider(
        responder=respond,
        delay=float(os.environ.get("AXON_TEST_DELAY", "0") or 0),
        keep_requests=0,
        chunk_size=8,
    ),
    instructions="test",
    tools=[record, guarded, die, helper.as_tool()],
    approval_timeout=float(os.environ.get("AXON_TEST_APPROVAL_TIMEOUT", "0") or 0) or None,
    hooks=Hooks(
        on_turn_start=_start_gate if os.environ.get("AXON_TEST_START_GATE") else None,
        on_tool_call=_tool_gate if os.environ.get("AXON_TEST_TOOL_GATE") else None,
    ),
)
"""The worker tests' agent, for every session."""
