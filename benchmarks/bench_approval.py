"""10. A turn that waits for approval (issue 21): what suspending and resuming cost.

**Time, embedded on SQLite.** One host (``Host.open(store=<SQLite file>)``, log tap at
``info`` into a file, as the other benchmarks run it) and the same scripted stream on
both sides: the model calls ``act``, then answers in 50 text deltas. Each round opens a
fresh session per side (off the clock) and times, sides alternating:

* **plain**: ``session.run(...)``, ``act`` needing no approval: two steps, two commits.
* **approved**: the same turn, ``act`` with ``needs_approval=True``: ``session.run(...)``
  (the step committed, the turn ends ``awaiting-input``), then at once
  ``session.decide(id, approved=True)`` and the continuation (``session.resume()``, as
  the embedded app's HTTP continuation runs it; ``session.respond`` runs the same less
  the continuation's version query since branch ``apperf``, a row of
  :mod:`benchmarks.approval_breakdown`): the turn's own time, without the person's.
* **commit**: a step commit as the turn runner makes the first one, ``store.save`` of
  the user message, the assistant message with the call and the tool's result,
  version-checked, into a new session: the unit the issue sets the cost in.

The figures: approved / plain, informational, and (approved - plain) / commit: how many
step commits suspending and resuming add (issue 21: at most one).

**Time, workers on PostgreSQL.** One worker in process (a :class:`~runtime.app.worker.Worker`
on PostgreSQL with the Redis relay, as ``python -m runtime worker`` runs it):

* **plain**: the same turn, ``act`` needing no approval. Timed from the submit to the
  queue's ``done``.
* **approved**: ``act`` needing approval. Timed from the submit to the row
  ``awaiting-input`` (the step committed, the row and relay stream paused), plus from the
  decision's return (:meth:`~runtime.turn_queue.TurnQueue.decide`: the turn put back) to
  ``done`` (a claim, the session reloaded, the tool run, the answer): the turn's time
  without the person's.
* **decide**: what recording the decision takes, as a front end's continuation POST
  records it: the session read (``store.load``: the POST checks the body's answers on
  it), then :meth:`~runtime.turn_queue.TurnQueue.decide` on that read (``known``: the
  compare-and-set save with the row's check and requeue, one call of the decision's
  function, whose version check proves the read current; before branch ``apw`` the
  decision read the session again).
* **a step commit**: a ``PostgresStore.save`` of one assistant and one tool message
  with its version check.

Sides alternate per round; the figures are medians. The client looks at the turn's row
every millisecond (both sides alike). Runs on the throwaway PostgreSQL and
Redis the benchmark starts (or ``AXON_BENCH_PG`` / ``AXON_BENCH_REDIS``); skipped, saying
why, if they cannot start.

**Two ways of seeing the turn end, two rows.** Looking at the row sees the plain turn
end once and the approved one twice (its wait, then its end): each look lands up to a
poll (1 ms) and a status read after the change, so the approved side pays that latency
once more, an artifact of the method no user meets (branch ``apwk`` put it at 1.4 ms of
the extra). That row (``approval.workers.overhead``) is kept as it is, for continuity
with earlier sessions' figures. A second row (``approval.workers.overhead_read``, branch
``apwkobs``) observes both sides as a worker deployment's front end streams a turn
(:func:`_read_turn`): **plain (relay)** from the submit to the end of the turn's relay
stream; **approved (relay)** from the submit to the stream's pause (the approval request
is read from the stream's ``tool-approval-request`` chunk), then, after the decision
(the session read and :meth:`~runtime.turn_queue.TurnQueue.decide` with that request's
id, as the continuation POST does; not timed, as above), from the decision's return to
the end of the continuation read after that pause. Both sides read with the same
function, the relay's chunks as they come (a blocking ``XREAD``), no row polled and no
timer: nothing on either side waits for a clock. The worker writes a stream's end or
pause marker only once the row is done or waits (``Worker._stream_turn``), so the reads
end after all the worker's work, its last save included. The approved side still sees
two stream ends, as a front end does: the pause must reach the client before a person
can decide. The reader runs in the worker's process and event loop, as the row-looking
client does (a front end is another process: its decoding of the chunks here takes the
worker's loop time, on both sides; :mod:`benchmarks.approval_worker_reader` runs the same
sides with the reader in a child process beside these, and did not tell the two
placements' extras apart). Checked off the clock on every round of both sides
(:func:`_check_read`): the turn as a front end makes it up when its stream ends (its
row, its stored message, the stream's last chunk) passes :func:`_check` (the wait: one
step, ``awaiting-input``; the end: two steps, ``stop``), the tool's result is in the
stream and the store exactly once (none at the wait), the continuation starts the same
message. Neither row times the decision's call, and the worker in this process may start
claiming the continuation before that call has returned to the client (the ``NOTIFY``
comes with its commit): :mod:`benchmarks.approval_worker_phases` saw the claim start 0.5
ms before the return to 0.2 ms after it, so up to about half a millisecond of the
continuation's claim can fall outside the approved side's time, in both rows alike.
The five sides (the two rows' four and the commit) alternate in one rotation,
so both rows meet the same machine; until branch ``apwkobs`` the row-looking sides
alternated with the commit alone.

**Memory.** Fresh child processes (``python -m benchmarks.bench_approval memory KIND N``):
a host that keeps one session in memory (``max_sessions=1``: each session opened evicts
the one before, as a long-running server evicts idle ones), warmed up with 20 turns of
each kind, then N sessions each run one turn and are let go: **waiting** (the turn
suspends for approval: N waiting turns) or **idle** (a turn with the same stored history
size that ends, the idle evicted sessions the issue compares with). Resident memory
(``/proc/self/statm``) after a full collection, before and after the N, each once every
task waits (``wait_all_tasks_blocked``): the last session stays loaded, and when its
turn has just suspended its engine still holds a task until it reads the ``REST`` the
turn's end sent (an idle turn's engine rests in the step that forwards the call's end),
about 50 Python blocks that counted on the waiting side only. The figure is waiting
growth / idle growth (issue 21: at most 1); "evicted Session objects left" counts those
beyond the loaded one. A third child runs the waiting turns
with ``approval_timeout`` set, informational: the host's expiry timer then keeps one
entry (the session id, its deadline) per waiting session. The children run with the log
redaction's cache of short strings (:data:`runtime.redact._checked`, 8,192 entries,
emptied when full) kept to one entry: it is bounded whatever the number of sessions, but
where it stands in its cycle when the N end differs by side (a waiting turn logs more
distinct ids and timestamps than an idle one), which measured the waiting side 2-12%
above the idle one (+10,468 against +5,720 Python blocks) with nothing of the waiting
turns left; and with the log's time stamps warmed up (:func:`_warm_time_stamps`) for
the same reason. Each reading is taken in one state of two more process-wide caches
(:func:`_settle`, branch ``apmem2``): the interpreter's free lists of 1- to 3-tuples
(2,000 a size, emptied by every full collection) refilled to their cap, and the C
allocator's whole free pages given back (``malloc_trim``, glibc only). Until branch
``apmem2`` a waiting turn left two tuples in the free list of 1-tuples (its pending-call
reads' ``tuple(genexpr)``; an idle turn none), so from an emptied list the waiting child
met up to 94 KB of Python pools more, a constant from about 1,000 turns on; and whether
SQLite's page cache (0.86 KB a session on either side, up to its 2 MB bound) landed in
free pages already resident or in new ones varied with the process's layout (the same
code read +0.2 MB, or +1.1 MB importing a checkout's ``.pyc``). Five children a kind
(``approval_memory_rounds``): the figure is the medians' ratio, passing when the
waiting median is within the idle children's own spread (or two pages) of the idle
median; SQLite's memory (``sqlite3_status``) is reported.
"""

from __future__ import annotations

import gc
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import trio
import trio.testing

from benchmarks.bench_workers import (
    REDIS_URL,
    _drop_schema,
    _schema_url,
    pg_unavailable,
    redis_unavailable,
)
from benchmarks.common import (
    PROMPT,
    REPO,
    Figure,
    LogSink,
    Sizes,
    alternate,
    median,
    now,
    python_env,
    rss_bytes,
)

WORDS = 50
"""Text deltas of the answer (the second step)."""
COMMITS_TARGET = 1.0
"""Issue 21: suspending and resuming cost no more than a step commit."""
MEMORY_TARGET = 1.0
"""Issue 21: N waiting turns grow the resident memory no more than N idle evicted sessions."""
PAGE = 4096
RESOLUTION = 2 * PAGE
"""Bytes within which two RSS growths count as equal at least: RSS counts pages. The
idle children's own spread (max - min), when larger, is the bound instead: two children
of one kind differ by that much with nothing of either kind's sessions left."""
TUPLE_FREE_LIST = 2000
"""CPython's cap on each size's free list of tuples (``PyTuple_MAXFREELIST``, 3.11-3.13)."""
WARM = 20


def _answer() -> list[Any]:
    from runtime import TextChunk

    return [TextChunk(text=f" w{i}") for i in range(WORDS)]


def _agents(approval_timeout: float | None = None) -> dict[str, Any]:
    """``plain`` (``act`` runs at once), ``asks`` (``act`` needs approval) and ``idle``
    (one step whose text is as long as a waiting turn's stored call, for the memory
    baseline)."""
    from actors.providers.scripted import ScriptedProvider, current_step, tool_call
    from runtime import Agent, tool

    answer = _answer()

    def respond(request: Any) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("act", {"n": 1}, tool_call_id="call_act")
        return answer

    async def act(n: int) -> str:
        """Do it."""
        return f"done {n}"

    def agent(name: str, **kw: Any) -> Any:
        return Agent(name=name, provider=ScriptedProvider(responder=respond, keep_requests=0), **kw)

    return {
        "plain": agent("plain", tools=[tool(act)]),
        "asks": agent(
            "asks", tools=[tool(needs_approval=True)(act)], approval_timeout=approval_timeout
        ),
    }


def _check(result: Any, finish: str, steps: int, side: str) -> None:
    if result is None or result.finish_reason != finish or result.steps != steps:
        raise RuntimeError(f"approval ({side}): the turn ended {result}")


# -- time, embedded ----------------------------------------------------------------------


async def _embedded(sizes: Sizes, directory: str) -> list[Figure]:
    from runtime import Host
    from runtime.messages import (
        AssistantMessage,
        Message,
        ToolCallPart,
        ToolMessage,
        UserMessage,
    )

    agents = _agents()
    tags = itertools.count()
    phases: dict[str, list[float]] = {"suspend": [], "decide": [], "resume": []}
    phases_cpu: dict[str, list[float]] = {"suspend": [], "decide": [], "resume": []}
    cpu: dict[str, list[float]] = {"plain": [], "approved": [], "commit": []}
    async with Host.open(store=str(Path(directory) / "approval.db")) as host:
        store = host.store

        async def plain() -> float:
            session = await host.open_session(agents["plain"], f"plain-{next(tags)}")
            t0, c0 = now(), time.process_time()
            result = await session.run(PROMPT)
            seconds = now() - t0
            cpu["plain"].append(time.process_time() - c0)
            _check(result, "stop", 2, "plain")
            await session.close()
            return seconds

        async def approved() -> float:
            session = await host.open_session(agents["asks"], f"ask-{next(tags)}")
            t0, c0 = now(), time.process_time()
            waiting = await session.run(PROMPT)
            t1, c1 = now(), time.process_time()
            _check(waiting, "awaiting-input", 1, "suspend")
            recorded = await session.decide(waiting.pending[0].approval_id, approved=True)
            t2, c2 = now(), time.process_time()
            assert recorded.complete
            async with session.resume() as out:
                async for _ in out:
                    pass
            t3, c3 = now(), time.process_time()
            cpu["approved"].append(c3 - c0)
            for name, spent in (("suspend", c1 - c0), ("decide", c2 - c1), ("resume", c3 - c2)):
                phases_cpu[name].append(spent)
            _check(out.result, "stop", 2, "resume")
            if out.result is None or out.result.message.id != waiting.message.id:
                raise RuntimeError("approval: the continuation is another message")
            phases["suspend"].append(t1 - t0)
            phases["decide"].append(t2 - t1)
            phases["resume"].append(t3 - t2)
            await session.close()
            return t3 - t0

        async def commit() -> float:  # a turn's first step commit, as the runner's
            message = AssistantMessage(
                id="m",
                content=(
                    ToolCallPart(tool_call_id="call_act", tool_name="act", input={"n": 1}, step=0),
                ),
            )
            result = ToolMessage(tool_call_id="call_act", tool_name="act", step=0, output="x")
            step: list[Message] = [UserMessage(content=PROMPT), message, result]
            t0, c0 = now(), time.process_time()
            await store.save(f"commit-{next(tags)}", 0, step, {}, expected_version=0)
            seconds = now() - t0
            cpu["commit"].append(time.process_time() - c0)
            return seconds

        times = await alternate(
            sizes.approval_rounds,
            sizes.warmup,
            {"plain": plain, "approved": approved, "commit": commit},
        )
    rounds = sizes.approval_rounds
    for part in (phases, phases_cpu, cpu):  # the measured rounds' (``alternate`` warms up first)
        for name in part:
            part[name] = part[name][-rounds:]
    plain_s, approved_s, commit_s = (median(times[k]) for k in ("plain", "approved", "commit"))
    extra = approved_s - plain_s
    commits = extra / commit_s
    ratios = [a / p for a, p in zip(times["approved"], times["plain"], strict=True)]
    ms = {k: median(v) * 1e3 for k, v in phases.items()}
    cpu_ms = {k: median(v) * 1e3 for k, v in cpu.items()}
    cpu_commits = (cpu_ms["approved"] - cpu_ms["plain"]) / cpu_ms["commit"]
    phase_cpu_ms = {k: median(v) * 1e3 for k, v in phases_cpu.items()}
    return [
        Figure(
            key="approval.embedded.ratio",
            title="10. Embedded: approved turn (suspend + resume) / plain turn",
            value=median(ratios),
            unit="x",
            detail=f"approved {approved_s * 1e3:.2f} ms (suspend {ms['suspend']:.2f}, decide "
            f"{ms['decide']:.2f}, resume {ms['resume']:.2f}) vs plain "
            f"{plain_s * 1e3:.2f} ms; SQLite, median of {rounds} rounds",
            data={
                **times,
                **{f"{k}_s": v for k, v in phases.items()},
                **{f"{k}_cpu_s": v for k, v in cpu.items()},
            },
        ),
        Figure(
            key="approval.embedded.commits",
            title="10. Embedded: (approved - plain) in step commits",
            value=commits,
            unit="x",
            target=f"<= {COMMITS_TARGET:g}",
            passed=commits <= COMMITS_TARGET,
            detail=f"+{extra * 1e3:.2f} ms; a step commit (store.save) "
            f"{commit_s * 1e3:.2f} ms; plain's per step {plain_s / 2 * 1e3:.2f} ms; "
            f"CPU: +{cpu_ms['approved'] - cpu_ms['plain']:.2f} ms, {cpu_commits:.1f} commits "
            f"(plain {cpu_ms['plain']:.2f}; suspend {phase_cpu_ms['suspend']:.2f}, decide "
            f"{phase_cpu_ms['decide']:.2f}, resume {phase_cpu_ms['resume']:.2f}; a commit "
            f"{cpu_ms['commit']:.2f})",
            data={
                "extra_s": extra,
                "commit_s": commit_s,
                "cpu_ms": cpu_ms,
                "phase_cpu_ms": phase_cpu_ms,
            },
        ),
    ]


# -- time, workers on PostgreSQL ------------------------------------------------------------


def _worker_agents() -> Callable[[str], Any]:
    """The agent of a session: ``act`` needs approval in the ``ask-`` sessions only."""
    from actors.providers.scripted import ScriptedProvider, current_step, tool_call
    from runtime.agent import Agent
    from runtime.chunks import TextChunk
    from runtime.tools import tool

    answer = [TextChunk(text=f" w{i}") for i in range(WORDS)]

    def respond(request: Any) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("act", {"n": 1}, tool_call_id="call_act")
        return answer

    async def act(n: int) -> str:
        """Do it."""
        return f"done {n}"

    plain = Agent(
        name="plain",
        provider=ScriptedProvider(responder=respond, keep_requests=0),
        tools=[tool(act)],
    )
    asks = Agent(
        name="asks",
        provider=ScriptedProvider(responder=respond, keep_requests=0),
        tools=[tool(needs_approval=True)(act)],
    )
    return lambda session_id: asks if session_id.startswith("ask-") else plain


POLL = 0.001
"""Seconds between the client's looks at the turn's row (a primary-key read of its status
columns). Waiting on the queue's ``LISTEN`` wake-ups instead cost tens of milliseconds
per wake-up on a loaded machine, and the approved side waits twice as often."""


async def _until(queue: Any, turn_id: str, done: Callable[[Any], bool]) -> Any:
    """The turn's status once ``done(status)``, looked at every :data:`POLL` seconds."""
    with trio.fail_after(60):
        while True:
            status = await queue.get_status(turn_id)
            if status is not None and done(status):
                return status
            await trio.sleep(POLL)


async def _read_turn(relay: Any, turn_id: str, *, after_pauses: int = 0) -> list[Any]:
    """The turn's output chunks as a worker deployment's front end streams them
    (:class:`~runtime.app.web.frontend.QueuedTurnResponse`, :class:`~runtime.app.web.
    queued_turn.QueuedTurnOutput`): ``relay.read`` of the turn's stream to its end, or to
    its pause (the turn waits: the front end's stream ends there, the approval request
    among its chunks); ``after_pauses=k`` reads the continuation after the turn's k-th
    pause, as the front end that recorded the decision streams it.

    A turn no worker has claimed yet has no stream (:class:`~runtime.errors.
    RelayTurnGone`): the front end then waits for its row to move
    (:class:`~runtime.app.web.watch.TurnWatch`, its first look 20 ms on, the same for
    every turn); here the reader blocks on the stream's first entry instead
    (:func:`_first_entry`), then reads it, so neither side waits on a timer."""
    from runtime.errors import RelayTurnGone

    pauses = {"after_pauses": after_pauses} if after_pauses else {}
    chunks: list[Any] = []
    with trio.fail_after(60):
        try:
            async for chunk in relay.read(turn_id, **pauses):
                chunks.append(chunk)
            return chunks
        except RelayTurnGone:
            if chunks:  # lost mid-stream: not a turn that has not started
                raise
        await _first_entry(relay, turn_id)
        return [chunk async for chunk in relay.read(turn_id, **pauses)]


async def _first_entry(relay: Any, turn_id: str) -> None:
    """Return once the turn's relay stream has an entry (a blocking ``XREAD`` from its
    start: Redis answers it when the worker's first flush creates the stream)."""
    key = relay.turn_key(turn_id)
    while not await relay.client.xread({key: "0-0"}, count=1, block=1000):
        pass


def _check_read(
    chunks: list[Any], status: Any, messages: Any, finish: str, steps: int, side: str
) -> Any:
    """The turn as a front end makes it up once its stream ends
    (:func:`~runtime.app.web.queued_turn.turn_result`: its row, its stored message, the
    last chunk read), checked with :func:`_check`; the stream ended with that turn's
    ``finish``."""
    from runtime import output as o
    from runtime.app.web.queued_turn import turn_result

    last = chunks[-1] if chunks else None
    if type(last) is not o.Finish or last.finish_reason != finish:
        raise RuntimeError(f"approval ({side}): the stream ended with {last}")
    result = turn_result(status.turn_id, status.message_id, messages, status, last)
    _check(result, finish, steps, side)
    return result


class _RelayClient:
    """The relay-reading sides (module doc): a client of the worker deployment that
    submits a turn, reads it from the relay as a front end streams it (:func:`_read_turn`)
    and records the decision as a front end's continuation POST does. ``tags`` numbers
    the sessions; :attr:`cpu` keeps this process's CPU time of each timed side."""

    def __init__(
        self, queue: Any, store: Any, relay: Any, agents: Callable[[str], Any], tags: Any
    ) -> None:
        self.queue, self.store, self.relay, self.agents, self.tags = (
            queue,
            store,
            relay,
            agents,
            tags,
        )
        self.cpu: dict[str, list[float]] = {"plain": [], "approved": []}

    async def plain(self) -> float:
        """Submit to the end of the turn's stream; the seconds."""
        t0, c0 = now(), time.process_time()
        turn = await self.queue.submit(f"plain-{next(self.tags)}", PROMPT)
        chunks = await _read_turn(self.relay, turn.turn_id)
        seconds = now() - t0
        self.cpu["plain"].append(time.process_time() - c0)
        await self._checked(turn, chunks, "plain (relay)")
        return seconds

    async def approved(self) -> float:
        """Submit to the stream's pause, plus the decision's return to the end of the
        continuation read after that pause; the seconds."""
        from runtime import output as o
        from runtime.approval import Decision

        session_id = f"ask-{next(self.tags)}"
        t0, c0 = now(), time.process_time()
        turn = await self.queue.submit(session_id, PROMPT)
        first = await _read_turn(self.relay, turn.turn_id)
        t1, c1 = now(), time.process_time()
        # off the clock (the person's time): the wait checked as it was read
        waiting = await self._checked(turn, first, "suspend (relay)")
        (call,) = waiting.pending
        requests = [c for c in first if type(c) is o.ToolApprovalRequest]
        if [c.approval_id for c in requests] != [call.approval_id]:
            raise RuntimeError(f"approval (relay): the stream asked {requests}")
        # what the continuation POST does with the request's id (FrontEnd._continue)
        record = await self.store.load(session_id)
        tools = {t.name: t for t in self.agents(session_id).tools}
        decided = await self.queue.decide(
            session_id, call.approval_id, Decision(approved=True), tools, known=record
        )
        t2, c2 = now(), time.process_time()
        rest = await _read_turn(self.relay, turn.turn_id, after_pauses=decided.turn.resumes)
        t3 = now()
        self.cpu["approved"].append((c1 - c0) + (time.process_time() - c2))
        done = await self._checked(turn, rest, "resume (relay)")
        if type(rest[0]) is not o.Start or rest[0].message_id != turn.message_id:
            raise RuntimeError(f"approval (relay): the continuation began {rest[0]}")
        if done.message.id != waiting.message.id:
            raise RuntimeError("approval (relay): the continuation is another message")
        return (t1 - t0) + (t3 - t2)

    async def _checked(self, turn: Any, chunks: list[Any], side: str) -> Any:
        """The read turn checked (:func:`_check_read`) on its row and stored messages,
        read after it ended; the tool ran once, in the stream and the store, on its
        ending part (none at the wait)."""
        from runtime import output as o

        status = await self.queue.get_status(turn.turn_id)
        record = await self.store.load(turn.session_id)
        assert status is not None and record is not None
        waits = side.startswith("suspend")
        finish, steps = ("awaiting-input", 1) if waits else ("stop", 2)
        result = _check_read(chunks, status, record.messages, finish, steps, side)
        ran = [c.output for c in chunks if type(c) is o.ToolResult]
        outputs = [m.output for m in result.tool_messages]
        if (ran, outputs) != (([], []) if waits else (["done 1"], ["done 1"])):
            raise RuntimeError(f"approval ({side}): the tool gave {ran}, {outputs}")
        return result


def step_commit(store: Any, tags: Iterator[int]) -> Callable[[], Awaitable[float]]:
    """The workers' unit, a step commit: a side timing a ``PostgresStore.save`` of one
    assistant and one tool message with its version check, each into a new session."""
    from runtime.messages import AssistantMessage, TextPart, ToolMessage

    async def commit() -> float:
        session_id = f"commit-{next(tags)}"
        version = await store.save(session_id, 0, [])
        message = AssistantMessage(id="m", content=(TextPart(text="w " * WORDS, step=0),))
        result = ToolMessage(tool_call_id="c", tool_name="act", step=0, output="done")
        t0 = now()
        await store.save(session_id, 0, [message, result], expected_version=version)
        return now() - t0

    return commit


async def _workers(sizes: Sizes) -> list[Figure]:
    from actors.relays import RedisRelay
    from actors.stores import open_store, turn_queue
    from runtime.app.worker import Worker
    from runtime.approval import Decision, pending_calls

    schema, url = _schema_url()
    tags = itertools.count()
    agents = _worker_agents()
    decide_s: list[float] = []
    store = await open_store(url)
    queue = turn_queue(store)
    try:
        async with (
            RedisRelay.open(REDIS_URL, prefix=f"axon-bench-{schema}:") as relay,
            trio.open_nursery() as nursery,
        ):
            worker = Worker(store=store, relay=relay, agent=agents, poll=0.5, concurrency=1)
            await nursery.start(worker.run)
            reader = _RelayClient(queue, store, relay, agents, tags)

            async def plain() -> float:
                t0 = now()
                turn = await queue.submit(f"plain-{next(tags)}", PROMPT)
                await _until(queue, turn.turn_id, lambda s: s.finished)
                return now() - t0

            async def approved() -> float:
                session_id = f"ask-{next(tags)}"
                t0 = now()
                turn = await queue.submit(session_id, PROMPT)
                await _until(queue, turn.turn_id, lambda s: s.waiting)
                t1 = now()
                record = await store.load(session_id)
                assert record is not None
                (call,) = pending_calls(record.messages)
                tools = {t.name: t for t in agents(session_id).tools}
                await queue.decide(
                    session_id, call.approval_id, Decision(approved=True), tools, known=record
                )
                t2 = now()
                await _until(queue, turn.turn_id, lambda s: s.finished)
                decide_s.append(t2 - t1)
                return (t1 - t0) + (now() - t2)

            commit = step_commit(store, tags)

            times = await alternate(
                sizes.approval_rounds,
                sizes.warmup,
                {
                    "plain": plain,
                    "approved": approved,
                    "commit": commit,
                    "plain (relay)": reader.plain,
                    "approved (relay)": reader.approved,
                },
            )
            worker.stop()
    finally:
        await queue.aclose()
        await store.aclose()
        await trio.to_thread.run_sync(_drop_schema, schema)
    rounds = sizes.approval_rounds
    decide_s = decide_s[-rounds:]  # the measured rounds' (``alternate`` warms up first)
    plain_s, approved_s = median(times["plain"]), median(times["approved"])
    commit_s, decided_s = median(times["commit"]), median(decide_s)
    overhead = approved_s - plain_s
    read_plain_s, read_approved_s = (
        median(times["plain (relay)"]),
        median(times["approved (relay)"]),
    )
    read_overhead = read_approved_s - read_plain_s
    cpu_ms = {k: median(v[-rounds:]) * 1e3 for k, v in reader.cpu.items()}
    return [
        Figure(
            key="approval.workers.overhead",
            title="10. Workers: approved turn / (plain turn + a step commit)",
            value=approved_s / (plain_s + commit_s),
            unit="x",
            target="<= 1",
            passed=overhead <= commit_s,
            detail=f"approved {approved_s * 1e3:.1f} ms (without the person's wait) vs plain "
            f"{plain_s * 1e3:.1f} ms: +{overhead * 1e3:.1f} ms; a step commit "
            f"{commit_s * 1e3:.2f} ms; median of {rounds} rounds",
            data={k: times[k] for k in ("plain", "approved", "commit")},
        ),
        Figure(
            key="approval.workers.overhead_read",
            title="10. Workers, read from the relay as a front end streams it: approved turn "
            "/ (plain turn + a step commit)",
            value=read_approved_s / (read_plain_s + commit_s),
            unit="x",
            target="<= 1",
            passed=read_overhead <= commit_s,
            detail=f"approved {read_approved_s * 1e3:.1f} ms (submit to the stream's pause, "
            f"the decision's return to its end) vs plain {read_plain_s * 1e3:.1f} ms (submit "
            f"to the stream's end): +{read_overhead * 1e3:.1f} ms; each stream read to its "
            "end marker (written once the row is done or waits), no row polled; "
            f"this process's CPU (the worker's and the reader's) {cpu_ms['approved']:.2f} vs "
            f"{cpu_ms['plain']:.2f} ms; median of {rounds} rounds",
            data={
                **{k: times[k] for k in ("plain (relay)", "approved (relay)", "commit")},
                **{f"{k} (relay) cpu_s": v[-rounds:] for k, v in reader.cpu.items()},
            },
        ),
        Figure(
            key="approval.workers.decide",
            title="10. Workers: recording the decision",
            value=decided_s * 1e3,
            unit="ms",
            detail="load + compare-and-set save on it with the row's check and requeue; "
            f"median of {len(decide_s)}",
            data={"decide_s": decide_s},
        ),
    ]


def _workers_figures(sizes: Sizes) -> list[Figure]:
    why = pg_unavailable() or redis_unavailable()
    if why:
        return [
            Figure(key=key, title=title, value=None, unit="x", detail=f"skipped: {why}")
            for key, title in (
                (
                    "approval.workers.overhead",
                    "10. Workers: approved turn / (plain turn + a step commit)",
                ),
                (
                    "approval.workers.overhead_read",
                    "10. Workers, read from the relay as a front end streams it: approved "
                    "turn / (plain turn + a step commit)",
                ),
            )
        ]
    return trio.run(_workers, sizes)


# -- memory, in child processes ------------------------------------------------------------


async def _memory(kind: str, n: int, directory: str) -> dict[str, Any]:
    """RSS growth of ``n`` sessions of ``kind`` (waiting, idle), each run and let go."""
    from runtime import Host

    timeout = 86_400.0 if kind == "waiting-timeout" else None
    agents = _agents(approval_timeout=timeout)
    idle = _idle_agent(agents)
    tags = itertools.count()

    async def waiting_turn(host: Any, session_id: str) -> None:
        session = await host.open_session(agents["asks"], session_id)
        _check(await session.run(PROMPT), "awaiting-input", 1, "waiting")

    async def idle_turn(host: Any, session_id: str) -> None:
        # The meta a waiting session stores ({"awaiting_input": 1}), in as many bytes.
        session = await host.open_session(idle, session_id, meta={"as_much_stored": 1})
        _check(await session.run(PROMPT), "stop", 1, "idle")

    turn = idle_turn if kind == "idle" else waiting_turn
    import runtime.redact

    runtime.redact._CHECKED_MAX = 1  # bounded, but filled unevenly by side (docstring)
    _warm_time_stamps()  # bounded, but filled unevenly by side (docstring)
    async with Host.open(store=str(Path(directory) / "memory.db"), max_sessions=1) as host:
        # Warm up both kinds (every code path and lazy import has run, caches are filled).
        for _ in range(WARM):
            await waiting_turn(host, f"warm-{next(tags)}")
            await idle_turn(host, f"warm-{next(tags)}")
        await trio.testing.wait_all_tasks_blocked()  # at rest (docstring)
        _settle()
        before, blocks, sql = rss_bytes(), sys.getallocatedblocks(), _sqlite_memory()
        for i in range(n):  # ids of one length on every side: the same bytes stored
            await turn(host, f"{kind[0]}-{i:07d}")
        await trio.testing.wait_all_tasks_blocked()
        _settle()
        after, blocks = rss_bytes(), sys.getallocatedblocks() - blocks
        sql = None if sql is None else (_sqlite_memory() or 0) - sql
        from runtime.app.session import Session

        loaded = len(host.sessions)  # the last session, kept in memory (max_sessions=1)
        sessions = sum(isinstance(o, Session) for o in gc.get_objects()) - loaded
        watched = len(host.expiry._due)
    stored = await _stored_bytes(Path(directory) / "memory.db", kind)
    return {
        "kind": kind,
        "sessions": n,
        "rss_before": before,
        "rss_after": after,
        "growth": after - before,
        "python_blocks_growth": blocks,
        "sqlite_memory_growth": sql,
        "session_objects_left": sessions,
        "sessions_loaded": loaded,
        "expiry_watched": watched,
        "stored_bytes_per_session": stored,
    }


def _settle() -> None:
    """A full collection, then the two caches :func:`_memory` reads RSS with in one state
    (docstring): the tuple free lists full, the allocator's whole free pages returned."""
    gc.collect()  # (empties the free lists)
    # The sizes turns have left in them (a 3-tuple a turn of either kind; two 1-tuples
    # a waiting turn until branch apmem2); filling every size's (4.5 MB) left whole
    # arenas of it pinned by a few blocks the turns took from the lists and kept.
    kept = [tuple(range(size)) for size in (1, 2, 3) for _ in range(TUPLE_FREE_LIST)]
    del kept  # each size's free list takes back its 2,000
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def _sqlite_memory() -> int | None:
    """Bytes SQLite has allocated in this process (``sqlite3_status64``'s memory used:
    the page caches first), or ``None`` where the library's symbols cannot be reached."""
    try:
        import _sqlite3
        import ctypes

        lib = ctypes.CDLL(_sqlite3.__file__)  # (its libsqlite3, linked or built in)
        current, high = ctypes.c_int64(), ctypes.c_int64()
        if lib.sqlite3_status64(0, ctypes.byref(current), ctypes.byref(high), 0) != 0:
            return None
        return current.value
    except (OSError, AttributeError, ImportError):  # pragma: no cover - platform
        return None


def _warm_time_stamps() -> None:
    """Format an hour of seconds as the log's time stamp does
    (:class:`runtime.logging.UtcStamper`, once a second): CPython's ``strftime`` of a
    timezone-aware ``datetime`` leaves a 52-byte block for each new value it meets, up
    to about 140 in a process (reachable from no Python object; none after its first
    three minutes of seconds), so a child would otherwise count as many more as seconds
    went by while its N turns ran."""
    import datetime

    start = int(time.time())
    for second in range(start, start + 3600):
        datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _idle_agent(agents: dict[str, Any]) -> Any:
    """One step whose text stands for the waiting turn's call (see :func:`_stored_bytes`):
    the same number of messages, about the same bytes stored."""
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent, TextChunk

    text = [TextChunk(text=" w" * 102)]
    provider = ScriptedProvider([text], keep_requests=0)
    return Agent(name="idle", provider=provider, tools=agents["plain"].tools)


async def _stored_bytes(db: Path, kind: str) -> float:
    """Mean bytes of stored messages per session of ``kind``, to check both sides store
    histories of the same size."""
    import sqlite3

    def read() -> float:
        with sqlite3.connect(db) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if "messages" not in tables:
                return 0.0
            row = conn.execute(
                "SELECT sum(length(body)), count(DISTINCT session_id) FROM messages "
                "WHERE session_id LIKE ?",
                (f"{kind[0]}-%",),
            ).fetchone()
            return (row[0] or 0) / max(1, row[1])

    try:
        return await trio.to_thread.run_sync(read)
    except Exception:  # the schema changed: informational only
        return 0.0


def _memory_child(kind: str, n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            result = trio.run(_memory, kind, n, directory)
        finally:
            sink.close()
    print(json.dumps(result))


def _child(kind: str, n: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_approval", "memory", kind, str(n)],
        cwd=REPO,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _memory_figures(sizes: Sizes) -> list[Figure]:
    n = sizes.approval_sessions
    children = sizes.approval_memory_rounds
    runs: dict[str, list[dict[str, Any]]] = {"waiting": [], "idle": []}
    for r in range(children):  # alternating which child runs first
        for kind in ("waiting", "idle") if r % 2 == 0 else ("idle", "waiting"):
            runs[kind].append(_child(kind, n))
    timed = _child("waiting-timeout", n)
    grown = {k: sorted(d["growth"] for d in v) for k, v in runs.items()}
    growth = {k: median(g) for k, g in grown.items()}
    kb = {k: g / n / 1024 for k, g in growth.items()}
    # The idle children's own spread: what two children of one kind differ by.
    spread = grown["idle"][-1] - grown["idle"][0]
    bound = max(RESOLUTION, spread)
    # A growth under a page counts as one page (RSS's resolution), so the ratio is defined.
    ratio = max(growth["waiting"], PAGE) / max(growth["idle"], PAGE)
    left = max(d["session_objects_left"] for v in runs.values() for d in v)
    blocks = {k: median([d["python_blocks_growth"] for d in v]) for k, v in runs.items()}
    sql = {k: [d["sqlite_memory_growth"] for d in v] for k, v in runs.items()}
    sqlite = ""
    if None not in sql["waiting"] + sql["idle"]:  # (where the library's status is read)
        sqlite = (
            f"SQLite's memory +{median(sql['waiting']) / 1024:.0f} / "
            f"+{median(sql['idle']) / 1024:.0f} KB; "
        )

    def span(kind: str) -> str:
        g = grown[kind]
        return f"{g[0] / 1024:.0f}-{g[-1] / 1024:.0f}"

    return [
        Figure(
            key="approval.memory",
            title=f"10. {n:,} waiting turns / {n:,} idle evicted sessions, RSS growth",
            value=ratio,
            unit="x",
            target=f"<= {MEMORY_TARGET:g}",
            passed=growth["waiting"] <= growth["idle"] + bound,
            detail=f"waiting +{growth['waiting'] / 1024:.0f} KB ({span('waiting')}; "
            f"{kb['waiting']:.2f} KB each), idle +{growth['idle'] / 1024:.0f} KB "
            f"({span('idle')}; {kb['idle']:.2f} KB each); {sqlite}"
            f"Python heap {blocks['waiting']:+.0f} / {blocks['idle']:+.0f} blocks; "
            f"{left} evicted Session objects left; median of {children} children each; "
            f"equal within the idle children's spread or 2 pages ({bound // 1024} KB) passes",
            data={"runs": runs, "idle_spread": spread},
        ),
        Figure(
            key="approval.memory_with_timeout",
            title=f"10. {n:,} waiting turns with approval_timeout, RSS growth",
            value=timed["growth"] / n / 1024,
            unit="KB",
            detail=f"the expiry timer watches {timed['expiry_watched']:,} sessions; "
            f"+{timed['growth'] / 1024:.0f} KB in all; one child",
            data=timed,
        ),
    ]


def run(sizes: Sizes) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)  # both timed parts log at info into a file
        try:
            figures = trio.run(_embedded, sizes, directory)
            figures += _workers_figures(sizes)
        finally:
            sink.close()
    return [*figures, *_memory_figures(sizes)]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "memory":
        _memory_child(sys.argv[2], int(sys.argv[3]))
    else:  # pragma: no cover
        sys.exit("usage: python -m benchmarks.bench_approval memory KIND N")
