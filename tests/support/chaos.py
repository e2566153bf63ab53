"""A seeded, randomized fault run of the whole worker deployment (a small Jepsen).

Real ``python -m runtime worker`` processes on the worker tests' agent
(:mod:`tests.support.worker_agent`), the test run's own PostgreSQL and Redis, two front
end store handles in this process, many sessions submitting turns at once (``tools``
turns whose tool writes a side effect keyed by its idempotency key, ``approve`` turns
whose tool needs a person's approval, plain ``echo`` turns), a relay reader following
every turn, and faults chosen by ``random.Random(seed)`` at random moments:

* ``kill``: SIGKILL a worker and start a new one;
* ``pause``: SIGSTOP a worker past its lease, then SIGCONT (it must be fenced out);
* ``redis``: kill the run's own Redis and start it again, empty;
* ``postgres``: restart the run's own PostgreSQL (``pg_ctl restart -m fast``);
* decisions for waiting turns from the other front end's store handle, some racing two
  opposite decisions from both handles, some followed at once by a worker's SIGKILL.

:func:`run_chaos` then checks the invariants (:class:`Violations` lists each broken one
with the seed, so a failure can be replayed with ``AXON_CHAOS_SEEDS=<seed>``): every turn
ends (``done``, or ``failed`` with an error) and none is left running past its lease;
each session's stored history is well-formed; every side effect happened once per
idempotency key and every key names the stored call that made it; every relay reader
ends with the stored message's text, unless it was told the stream was lost (only
after a Redis restart, a worker stopped while the turn ran, or a takeover that found no
stream before the reader saw any), never sees a seq twice, and reads a grammatical
stream once its resets are applied; exactly one of two racing decisions wins; no worker
exits by itself (a paused one goes on, fenced out). A broken history's stored rows are
written beside the worker logs, which a failing run keeps.

The plan (sessions, turn kinds, decision modes, the faults and when) depends on the
seed only; the timing of real processes does not, so a seed replays the same plan, not
the same interleaving.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import attrs
import psycopg
import trio

from actors.relays.redis_streams import RedisRelay
from actors.stores.postgres import PostgresStore, parse_url
from actors.stores.turns import TurnQueue
from runtime.approval import AWAITING_INPUT, Decision, pending_calls
from runtime.errors import AlreadyDecided, RelayTurnGone, RelayUnavailable
from runtime.messages import AssistantMessage, TextPart, ToolCallPart, ToolMessage, UserMessage
from runtime.output import Abort, Error, Finish, ResetStep, TextDelta
from runtime.relay import StepRestarted
from tests.support.grammar import check_grammar
from tests.support.services import own_postgres, own_redis
from tests.support.worker_agent import answer_text, guarded, read_ledger

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FINAL = ("done", "failed", "cancelled")
TERMINAL = (Finish, Error, Abort)
WAITS = AWAITING_INPUT
STEP_OF_CALL = {"call_1": 0, "call_2": 1, "call_a": 0}
"""The step the worker agent makes each call in (a re-run makes it in the same step)."""


@attrs.define
class ChaosConfig:
    """How big one seed's run is."""

    workers: int = 3
    sessions: int = 4
    turns: int = 3
    """Turns each session submits."""
    faults: int = 5
    lease: float = 1.5
    max_attempts: int = 4
    concurrency: int = 2
    delay: float = 0.01
    """``AXON_TEST_DELAY``: seconds before each streamed chunk."""
    tool_hold: float = 0.1
    """``AXON_TEST_TOOL_HOLD``: a tool's wait after its side effect, before its commit."""
    limit: float = 90.0
    """Seconds the whole run may take before it fails (it never hangs)."""
    drain: float = 25.0
    """Seconds every turn has to end once the last one was submitted and decided: a
    dead worker's turn waits for its lease, a turn may be taken over several times."""


SMALL = ChaosConfig()
LARGE = ChaosConfig(workers=4, sessions=10, turns=6, faults=14, limit=240.0)


@attrs.define
class Plan:
    """What one seed does (from the seed alone)."""

    sessions: dict[str, list[tuple[str, str]]]
    """Per session, its turns: ``(input, what follows)``; what follows is ``queue``
    (submit the next at once), ``wait`` (wait for the turn to end), ``sleep``; for an
    ``approve`` turn the decision: ``approve``, ``deny``, ``race`` (both handles at once,
    opposite decisions), ``twice`` (both handles at once, both approving), ``kill``
    (approve, then SIGKILL a worker at once), ``supersede`` (submit the next turn first,
    then decide)."""
    faults: list[tuple[float, str]]
    """``(seconds after the previous fault, kind)``."""


def make_plan(seed: int, config: ChaosConfig) -> Plan:
    rng = random.Random(seed)
    sessions: dict[str, list[tuple[str, str]]] = {}
    for s in range(config.sessions):
        turns = []
        for t in range(config.turns):
            kind = rng.choice(("tools", "tools", "approve", "approve", "echo"))
            text = f"{kind} s{s} t{t}" if kind != "echo" else f"hello s{s} t{t}"
            if kind == "approve":
                then = rng.choice(("approve", "deny", "race", "twice", "kill", "supersede"))
            else:
                then = rng.choice(("queue", "wait", "sleep"))
            turns.append((text, then))
        sessions[f"c{seed}s{s}"] = turns
    kinds = ("kill", "kill", "pause", "pause", "redis", "postgres")
    faults = [(rng.uniform(0.2, 1.2), rng.choice(kinds)) for _ in range(config.faults)]
    return Plan(sessions=sessions, faults=faults)


class Violations(AssertionError):
    """The invariants a seed broke, one a line, the seed first."""


@attrs.define
class Reading:
    """What the relay reader of one turn saw."""

    seqs: list[int] = attrs.Factory(list)
    deltas: list[TextDelta] = attrs.Factory(list)
    resets: int = 0
    kinds: list[str] = attrs.Factory(list)
    chunks: list[Any] = attrs.Factory(list)
    """Every chunk read, in order."""
    terminal: str | None = None
    """The type of the last ``finish``, ``error`` or ``abort`` read."""
    terminal_end: bool = False
    """That chunk ends the turn (not a ``finish`` of a part that waits for a person)."""
    lost: str | None = None
    ended_at: float = 0.0

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)


@attrs.define
class Submitted:
    turn_id: str
    session_id: str
    text: str
    then: str
    at: float
    decisions: list[tuple[str, bool | None, str]] = attrs.Factory(list)
    """``(handle, approved, outcome)``: outcome ``recorded`` or the refusal's class."""


class Pool:
    """The worker processes of one run; logs kept in ``logs`` (removed unless it failed)."""

    def __init__(self, pg_url: str, redis_url: str, prefix: str, config: ChaosConfig) -> None:
        self.pg_url, self.redis_url, self.prefix, self.config = pg_url, redis_url, prefix, config
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()
        self.paused: dict[str, float] = {}
        self.logs = tempfile.mkdtemp(prefix="axon-chaos-")
        self.started = 0

    def start(self) -> str:
        self.started += 1
        name = f"w{self.started}"
        env = {
            **os.environ,
            "PYTHONPATH": REPO,
            "AXON_TEST_LEDGER": self.pg_url,
            "AXON_TEST_DELAY": str(self.config.delay),
            "AXON_TEST_TOOL_HOLD": str(self.config.tool_hold),
        }
        c = self.config
        with open(os.path.join(self.logs, f"{name}.log"), "wb") as out:
            self.procs[name] = subprocess.Popen(
                [
                    sys.executable, "-m", "runtime", "worker",
                    "--store", self.pg_url, "--redis", self.redis_url,
                    "--redis-prefix", self.prefix,
                    "--agent", "tests.support.worker_agent:agent",
                    "--owner", name, "--lease", str(c.lease), "--poll", "0.1",
                    "--max-attempts", str(c.max_attempts), "--grace", "1",
                    "--concurrency", str(c.concurrency), "--log-level", "info",
                ],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return name

    def live(self) -> list[str]:
        return [n for n, p in self.procs.items() if n not in self.killed and p.poll() is None]

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        self.killed.add(name)
        proc.kill()
        proc.wait(10)

    def log(self, name: str) -> str:
        with open(os.path.join(self.logs, f"{name}.log"), encoding="utf-8", errors="replace") as f:
            return f.read()

    def close(self, keep_logs: bool) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                proc.wait(10)
        if not keep_logs:
            shutil.rmtree(self.logs, ignore_errors=True)


def _sql(pg_url: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    libpq, schema = parse_url(pg_url)
    with psycopg.connect(libpq, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"SET search_path TO {schema}")
        return conn.execute(query, params).fetchall()


class Run:
    """One seed's run: see the module docstring."""

    def __init__(
        self, seed: int, pg_url: str, redis_url: str, prefix: str, config: ChaosConfig
    ) -> None:
        self.seed = seed
        self.config = config
        self.plan = make_plan(seed, config)
        self.rng = random.Random(seed * 7919 + 1)  # the fault targets, apart from the plan
        self.pg_url = pg_url
        self.redis_url = redis_url
        self.prefix = prefix
        self.pool = Pool(pg_url, redis_url, prefix, config)
        self.turns: dict[str, Submitted] = {}
        self.readings: dict[str, Reading] = {}
        self.events: list[tuple[float, str]] = []
        self.redis_restarts: list[tuple[float, float]] = []
        self.stops: list[tuple[float, float]] = []
        """When workers were SIGKILLed (a moment) or SIGSTOPped (until SIGCONT)."""
        self.fault_lock = trio.Lock()
        self.t0 = time.monotonic()
        self.sessions_done = trio.Event()
        self._stored_text: dict[str, str] = {}
        """Each turn's stored assistant text, as the history check found it."""

    def note(self, what: str) -> None:
        self.events.append((round(time.monotonic() - self.t0, 2), what))

    # -- faults ---------------------------------------------------------------------------

    async def kill_one(self, why: str) -> None:
        live = [n for n in self.pool.live() if n not in self.pool.paused]
        if not live:
            return
        name = self.rng.choice(sorted(live))
        await trio.to_thread.run_sync(self.pool.kill, name)
        self.stops.append((time.monotonic(), time.monotonic()))
        started = self.pool.start()
        self.note(f"{why}: SIGKILL {name}, started {started}")

    async def fault(self, kind: str) -> None:
        if kind == "kill":
            await self.kill_one("kill")
        elif kind == "pause":
            live = [n for n in self.pool.live() if n not in self.pool.paused]
            if not live:
                return
            name = self.rng.choice(sorted(live))
            hold = self.config.lease * self.rng.uniform(1.4, 2.2)
            self.pool.procs[name].send_signal(signal.SIGSTOP)
            self.pool.paused[name] = hold
            self.note(f"pause: SIGSTOP {name} for {hold:.2f} s")
            began = time.monotonic()
            try:
                await trio.sleep(hold)
            finally:
                self.stops.append((began, time.monotonic()))
                self.pool.procs[name].send_signal(signal.SIGCONT)
                del self.pool.paused[name]
                self.note(f"pause: SIGCONT {name}")
        elif kind == "redis":
            began = time.monotonic()
            await trio.to_thread.run_sync(own_redis().stop)
            await trio.sleep(self.rng.uniform(0.05, 0.4))
            await trio.to_thread.run_sync(own_redis().start)
            self.redis_restarts.append((began, time.monotonic()))
            self.note("redis: restarted empty")
        elif kind == "postgres":
            await trio.to_thread.run_sync(own_postgres().restart)
            self.note("postgres: restarted")

    async def faults(self) -> None:
        for pause, kind in self.plan.faults:
            with trio.move_on_after(pause):
                await self.sessions_done.wait()
            if self.sessions_done.is_set():
                return
            async with self.fault_lock:
                await self.fault(kind)

    # -- front ends -----------------------------------------------------------------------

    async def wait_status(
        self, queue: TurnQueue, turn_id: str, done: Callable[[Any], bool], what: str
    ) -> Any:
        with trio.move_on_after(self.config.limit):
            while True:
                got = await queue.get_status(turn_id)
                if got is not None and done(got):
                    return got
                await trio.sleep(0.05)
        raise Violations(f"seed {self.seed}: turn {turn_id} never {what}")

    async def decide(
        self, queue: TurnQueue, store: PostgresStore, turn: Submitted, handle: str, approved: bool
    ) -> None:
        record = await store.load(turn.session_id)
        pending = [
            call
            for call in ([] if record is None else pending_calls(record.messages))
            if call.turn_id == turn.turn_id  # not the call of a later turn (supersede)
        ]
        if not pending:
            turn.decisions.append((handle, approved, "nothing-pending"))
            return
        (call,) = pending
        try:
            await queue.decide(
                turn.session_id,
                call.approval_id,
                Decision(approved=approved, reason=None if approved else "chaos says no"),
                {"guarded": guarded},
            )
        except AlreadyDecided:
            turn.decisions.append((handle, approved, "AlreadyDecided"))
        else:
            turn.decisions.append((handle, approved, "recorded"))

    async def session(
        self, session_id: str, script: list[tuple[str, str]], fronts: list[tuple[Any, Any]]
    ) -> None:
        queue_a, queue_b = fronts[0][0], fronts[1][0]
        rng = random.Random(f"{self.seed}:{session_id}")
        for text, then in script:
            queued = await queue_a.submit(session_id, text)
            turn = Submitted(queued.turn_id, session_id, text, then, time.monotonic())
            self.turns[turn.turn_id] = turn
            self.nursery.start_soon(self.follow, turn)
            if text.startswith("approve"):
                await self.wait_status(
                    queue_b, turn.turn_id, lambda s: s.waiting or s.finished, "waited"
                )
                if then == "supersede":
                    continue  # the next turn is submitted first; the decision comes after
                await self.approval(turn, fronts)
            elif then == "wait":
                await self.wait_status(queue_b, turn.turn_id, lambda s: s.finished, "ended")
            elif then == "sleep":
                await trio.sleep(rng.uniform(0.0, 0.6))
        for turn in [t for t in self.turns.values() if t.session_id == session_id]:
            if turn.then == "supersede" and not turn.decisions:
                await self.approval(turn, fronts)

    async def approval(self, turn: Submitted, fronts: list[tuple[Any, Any]]) -> None:
        (queue_a, store_a), (queue_b, store_b) = fronts
        if turn.then in ("race", "twice"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.decide, queue_a, store_a, turn, "a", True)
                nursery.start_soon(self.decide, queue_b, store_b, turn, "b", turn.then == "twice")
            return
        approved = turn.then != "deny"
        await self.decide(queue_b, store_b, turn, "b", approved)
        if turn.then == "kill":
            async with self.fault_lock:
                await self.kill_one(f"decided {turn.turn_id}")

    # -- the relay reader -----------------------------------------------------------------

    async def follow(self, turn: Submitted) -> None:
        """Follow the turn's relay stream as a front end's client does: from its start,
        again after each pause, and after Redis restarts resuming after the last seq
        seen (``Last-Event-ID``), until the turn ended and its stream did, or the relay
        says the stream was lost."""
        seen = Reading()
        self.readings[turn.turn_id] = seen
        unkept: float | None = None
        raced = False
        ended = False
        quiet = False
        async with RedisRelay.open(self.redis_url, prefix=self.prefix) as relay:
            key = relay.turn_key(turn.turn_id)
            while True:
                try:
                    after = seen.seqs[-1] if seen.seqs else None
                    reading = cast(
                        AsyncGenerator[Any, None], relay.read(turn.turn_id, after_seq=after)
                    )
                    try:
                        while True:
                            with trio.move_on_after(2.0) as idle:
                                chunk = await reading.__anext__()
                            if idle.cancelled_caught:
                                quiet = True
                                break
                            quiet = False
                            self.take(seen, chunk)
                    except StopAsyncIteration:
                        pass
                    finally:
                        await reading.aclose()
                except RelayTurnGone as gone:
                    if not seen.seqs:
                        # Nothing read yet: the stream may not be written yet. The status
                        # read first: a turn that had ended and still has no stream 2 s
                        # later never had one the relay kept.
                        status = await self.queue.get_status(turn.turn_id)
                        if not await self._exists(relay, key):
                            if status is None or not status.finished:
                                await trio.sleep(0.05)  # not started yet
                                continue
                            if unkept is None:
                                unkept = time.monotonic()
                            if time.monotonic() - unkept < 2.0:
                                await trio.sleep(0.05)
                                continue
                            seen.lost = f"{gone} (no key; turn {status.status})"
                            break
                        if not raced:  # written between the read and the look
                            raced = True
                            continue
                    exists = await self._exists(relay, key)
                    status = await self.queue.get_status(turn.turn_id)
                    seen.lost = (
                        f"{gone} (after {len(seen.seqs)} chunks; key exists {exists}; "
                        f"turn {status.status if status else None})"
                    )
                    break
                except RelayUnavailable:
                    await trio.sleep(0.1)
                    continue
                if ended:
                    if quiet and not seen.terminal_end:
                        # The turn ended and its stream did not (its worker stopped
                        # between its last commit and the stream's end): the front end
                        # gives such a stream up and tells its viewers to reload.
                        seen.lost = "the turn ended and its relay stream did not"
                    # This read began after the turn had ended: it replayed the stream
                    # up to its end (or the pause a superseded wait leaves, or nothing
                    # for a while: a failed turn's stream left open), or was told the
                    # stream was lost. That is all there is.
                    break
                status = await self.queue.get_status(turn.turn_id)
                ended = status is not None and status.finished
                if not ended:
                    await trio.sleep(0.05)
        seen.ended_at = time.monotonic()

    async def _exists(self, relay: RedisRelay, key: str) -> bool:
        try:
            return bool(await relay.client.exists([key]))
        except Exception:  # Redis restarting: not known to exist
            return False

    def take(self, seen: Reading, chunk: Any) -> None:
        seq = chunk.seq
        if seen.seqs and seq <= seen.seqs[-1]:
            seen.seqs.append(seq)  # a repeat: reported by the check
            return
        seen.seqs.append(seq)
        seen.kinds.append(f"{seq}:{chunk.type}")
        seen.chunks.append(chunk)
        if isinstance(chunk, (ResetStep, StepRestarted)):
            seen.resets += 1
            seen.deltas = [d for d in seen.deltas if d.step != chunk.step]
        elif type(chunk) is TextDelta:
            seen.deltas.append(chunk)
        elif isinstance(chunk, TERMINAL):
            seen.terminal = chunk.type
            seen.terminal_end = not (type(chunk) is Finish and chunk.finish_reason == WAITS)

    # -- the run --------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        failed = True
        stores = [await PostgresStore.open(self.pg_url) for _ in range(3)]
        queues = [TurnQueue(s, lease=self.config.lease) for s in stores]
        self.queue = queues[2]  # the readers' and the checks' handle
        fronts = [(queues[0], stores[0]), (queues[1], stores[1])]
        try:
            # The ledger's tables made once, before workers race to make them.
            await trio.to_thread.run_sync(read_ledger, self.pg_url)
            for _ in range(self.config.workers):
                self.pool.start()
            with trio.fail_after(self.config.limit):
                async with trio.open_nursery() as nursery:
                    self.nursery = nursery
                    nursery.start_soon(self.faults)
                    async with trio.open_nursery() as sessions:
                        for session_id, script in self.plan.sessions.items():
                            sessions.start_soon(self.session, session_id, script, fronts)
                    self.sessions_done.set()
                    self.note("every turn submitted and decided")
                    with trio.move_on_after(self.config.drain) as draining:
                        for turn_id in list(self.turns):
                            await self.wait_status(
                                self.queue, turn_id, lambda s: s.finished, "ended"
                            )
                    if draining.cancelled_caught:
                        await self.stuck()
                    self.note("every turn ended")
            report = await self.check()
            failed = False
            return report
        except Violations:
            raise
        except BaseException as exc:
            raise Violations(
                f"seed {self.seed}: the run broke ({type(exc).__name__}: {exc}); "
                f"worker logs in {self.pool.logs}; events {self.events}"
            ) from exc
        finally:
            self.pool.close(keep_logs=failed)
            for q in queues:
                await q.aclose()
            for s in stores:
                await s.aclose()

    # -- the invariants -------------------------------------------------------------------

    async def stuck(self) -> None:
        """Every turn should have ended by now: say which did not, and how they stand."""
        rows = await trio.to_thread.run_sync(
            _sql,
            self.pg_url,
            "SELECT turn_id, session_id, status, owner, epoch, attempts, "
            "lease_until < now() FROM axon_turns WHERE status NOT IN "
            "('done', 'failed', 'cancelled') ORDER BY seq",
        )
        raise Violations(
            f"seed {self.seed}: {len(rows)} turn(s) not ended {self.config.drain:g} s after "
            f"the last decision (replay: AXON_CHAOS_SEEDS={self.seed}); worker logs in "
            f"{self.pool.logs}:\n  "
            + "\n  ".join(
                f"{r[0]} ({r[1]}): {r[2]}, owner {r[3]}, epoch {r[4]}, attempts {r[5]}, "
                f"lease lapsed {r[6]}"
                for r in rows
            )
            + f"\nevents: {self.events}"
        )

    async def check(self) -> dict[str, Any]:
        bad: list[str] = []
        rows = await trio.to_thread.run_sync(
            _sql,
            self.pg_url,
            "SELECT turn_id, session_id, status, finish_reason, error, attempts, owner, "
            "lease_until < now(), epoch FROM axon_turns ORDER BY seq",
        )
        by_turn = {r[0]: r for r in rows}
        assert set(by_turn) == set(self.turns), "the queue holds turns nobody submitted"
        for turn_id, session_id, status, _reason, error, _att, owner, lapsed, _epoch in rows:
            if status not in ("done", "failed"):
                bad.append(
                    f"turn {turn_id} ({session_id}) did not end: {status}, owner {owner}, "
                    f"lease lapsed {lapsed}"
                )
            elif status == "failed" and not error:
                bad.append(f"turn {turn_id} failed with no error")
        effects, attempts = await trio.to_thread.run_sync(read_ledger, self.pg_url)
        expected_keys: set[str] = set()
        for session_id in self.plan.sessions:
            record = await self.queue.store.load(session_id)
            messages = [] if record is None else list(record.messages)
            session_turns = [t for t in rows if t[1] == session_id]
            found = self.check_history(session_id, messages, session_turns, expected_keys)
            if found:
                await trio.to_thread.run_sync(self.dump_session, session_id)
            bad += found
        for key in expected_keys:
            if effects.get(key) != 1:
                bad.append(f"the stored result of {key} has no side effect in the ledger")
        for key in effects:
            if key not in expected_keys:
                turn_id, step, call = key.rsplit(":", 2)
                status = by_turn.get(turn_id, (None,) * 3)[2]
                legal = STEP_OF_CALL.get(call) == int(step) and status == "failed"
                if not legal:
                    bad.append(
                        f"side effect {key} (turn {status}) is no stored call's: a re-run "
                        "carried another key, or a denied call ran"
                    )
        bad += self.check_readers(by_turn)
        bad += self.check_decisions(by_turn)
        for name, proc in self.pool.procs.items():
            if name not in self.pool.killed and proc.poll() is not None:
                bad.append(f"worker {name} exited by itself ({proc.returncode})")
        if bad:
            raise Violations(
                f"seed {self.seed} broke {len(bad)} invariant(s) (replay: AXON_CHAOS_SEEDS="
                f"{self.seed}); worker logs in {self.pool.logs}:\n  "
                + "\n  ".join(bad)
                + f"\nevents: {self.events}"
            )
        return {
            "turns": len(rows),
            "failed": sum(r[2] == "failed" for r in rows),
            "takeovers": sum(r[5] > 1 for r in rows),
            "repeated_effects": sum(n > 1 for n in attempts.values()),
            "lost_streams": sum(r.lost is not None for r in self.readings.values()),
            "resets_seen": sum(r.resets for r in self.readings.values()),
            "faults": [e for _, e in self.events],
        }

    def dump_session(self, session_id: str) -> None:
        """The session's stored rows into the logs folder (a broken history's evidence)."""
        rows = _sql(
            self.pg_url,
            "SELECT idx, role, body FROM axon_messages WHERE session_id = %s ORDER BY idx",
            session_id,
        )
        with open(os.path.join(self.pool.logs, f"history-{session_id}.txt"), "w") as out:
            for idx, role, body in rows:
                out.write(f"{idx} {role} {bytes(body)[:300]!r}\n")

    def check_history(
        self,
        session_id: str,
        messages: list[Any],
        turns: list[tuple[Any, ...]],
        expected_keys: set[str],
    ) -> list[str]:
        bad: list[str] = []
        groups: list[list[Any]] = []
        for m in messages:
            if isinstance(m, UserMessage):
                groups.append([m])
            elif not groups:
                bad.append(f"{session_id}: a {m.role} message before any user message")
            else:
                groups[-1].append(m)
        by_text = {self.turns[t[0]].text: t for t in turns}
        stored = [g[0].content for g in groups]
        ran = [self.turns[t[0]].text for t in turns if t[2] == "done"]
        if [s for s in stored if s in ran] != ran or len(set(stored)) != len(stored):
            bad.append(
                f"{session_id}: stored inputs {stored} are not the done turns {ran} in order"
            )
        for group in groups:
            text = group[0].content
            turn = by_text.get(text)
            if turn is None:
                bad.append(f"{session_id}: stored input {text!r} was never submitted")
                continue
            turn_id, _, status, reason = turn[:4]
            where = f"{session_id} turn {turn_id} ({text!r}, {status}/{reason})"
            assistants = [m for m in group if isinstance(m, AssistantMessage)]
            tools = [m for m in group if isinstance(m, ToolMessage)]
            if len(assistants) != 1 or (
                status == "done" and not isinstance(group[1], AssistantMessage)
            ):
                bad.append(f"{where}: {len(assistants)} assistant messages")
                continue
            (assistant,) = assistants
            if assistant.id != f"msg_{turn_id}":
                bad.append(f"{where}: assistant message {assistant.id}")
            calls = [p for p in assistant.content if isinstance(p, ToolCallPart)]
            call_ids = [p.tool_call_id for p in calls]
            if [t.tool_call_id for t in tools] != call_ids or len(set(call_ids)) != len(call_ids):
                bad.append(
                    f"{where}: calls {call_ids} but results {[t.tool_call_id for t in tools]}"
                )
                continue
            words = "".join(p.text for p in assistant.content if isinstance(p, TextPart))
            for call, result in zip(calls, tools, strict=True):
                key = f"{turn_id}:{call.step}:{call.tool_call_id}"
                if STEP_OF_CALL.get(call.tool_call_id) != call.step or result.step != call.step:
                    bad.append(
                        f"{where}: call {call.tool_call_id} at step {call.step}/{result.step}"
                    )
                if call.tool_name in ("record", "guarded") and result.error is None:
                    if result.output != f"recorded {call.input.get('n')}":
                        bad.append(f"{where}: {call.tool_call_id} returned {result.output!r}")
                    expected_keys.add(key)
                if call.tool_name == "guarded":
                    waited = call.awaiting
                    if waited is None or (not waited.decided and reason != "superseded"):
                        bad.append(f"{where}: the approval holds no request+decision: {waited}")
                    elif waited.decided and bool(waited.approved) != (result.error is None):
                        bad.append(f"{where}: approved={waited.approved} but result {result}")
            if status != "done":
                continue
            if reason == "superseded":
                if words != "I need your approval. ":
                    bad.append(f"{where}: superseded with text {words!r}")
                continue
            if text.startswith("tools"):
                if call_ids != ["call_1", "call_2"] or words != answer_text(text):
                    bad.append(f"{where}: calls {call_ids}, text {words!r}")
            elif text.startswith("approve"):
                denied = tools[0].error if tools else None
                want = "I need your approval. " + (
                    answer_text(text) if denied is None else f"not done: {denied}"
                )
                if call_ids != ["call_a"] or words != want:
                    bad.append(f"{where}: calls {call_ids}, text {words!r}")
            elif words != f"echo: {text}":
                bad.append(f"{where}: text {words!r}")
            if assistant.interrupted:
                bad.append(f"{where}: stored interrupted")
        for turn in turns:
            if turn[2] == "done" and self.turns[turn[0]].text not in stored:
                bad.append(f"{session_id}: done turn {turn[0]} has no stored input")
        for group in groups:
            turn = by_text.get(group[0].content)
            assistants = [m for m in group if isinstance(m, AssistantMessage)]
            if turn is not None and len(assistants) == 1:
                self._stored_text[turn[0]] = "".join(
                    p.text for p in assistants[0].content if isinstance(p, TextPart)
                )
        return bad

    def check_readers(self, by_turn: dict[str, tuple[Any, ...]]) -> list[str]:
        bad = []
        stored = self._stored_text
        for turn_id, seen in self.readings.items():
            turn = self.turns[turn_id]
            status, reason = by_turn[turn_id][2:4]
            where = f"reader of {turn_id} ({turn.text!r}, {status}/{reason})"
            if any(b <= a for a, b in zip(seen.seqs, seen.seqs[1:], strict=False)):
                bad.append(f"{where}: a seq seen twice or out of order: {seen.seqs}")
            if seen.lost is not None:
                restarted = any(
                    began <= seen.ended_at and turn.at <= ended
                    for began, ended in self.redis_restarts
                )
                # A takeover that finds no stream cannot tell a dead worker that streamed
                # nothing from a Redis that lost what it streamed: it writes a gap
                # (docs/deployment.md), and its readers that saw nothing are told.
                unproven = by_turn[turn_id][8] > 1 and not seen.seqs
                # A worker stopped (killed, or paused past its lease) while the turn ran:
                # between a commit and its stream's end (the stream never ends, the
                # front end gives it up), or before it streamed a committed step's end
                # or a pause (the next worker writes a gap).
                unended = any(
                    began <= seen.ended_at and turn.at <= ended for began, ended in self.stops
                )
                if not restarted and not unproven and not unended:
                    bad.append(
                        f"{where}: told the stream was lost with no Redis restart: {seen.lost}"
                    )
                continue
            if status != "done":
                continue
            if reason != "superseded" and not (seen.terminal == "finish" and seen.terminal_end):
                bad.append(f"{where}: ended on {seen.terminal} without a lost marker")
            for segment in _segments(_applied(seen.chunks)):
                try:
                    check_grammar(segment, ending="finish")
                except AssertionError as exc:
                    bad.append(f"{where}: the stream breaks the grammar ({exc}): {seen.kinds}")
            if seen.text != stored.get(turn_id):
                bad.append(
                    f"{where}: read {seen.text!r}, stored {stored.get(turn_id)!r}; "
                    f"chunks {seen.kinds}"
                )
        return bad

    def check_decisions(self, by_turn: dict[str, tuple[Any, ...]]) -> list[str]:
        bad = []
        for turn in self.turns.values():
            if not turn.text.startswith("approve"):
                continue
            reason = by_turn[turn.turn_id][3]
            won = [d for d in turn.decisions if d[2] == "recorded"]
            want = 0 if reason == "superseded" else 1
            if by_turn[turn.turn_id][2] == "failed":
                want = len(won) if len(won) <= 1 else 1
            if len(won) != want:
                bad.append(
                    f"turn {turn.turn_id} ({turn.then}, {reason}): {len(won)} decisions "
                    f"recorded, not {want}: {turn.decisions}"
                )
        return bad


def _applied(chunks: list[Any]) -> list[Any]:
    """The chunks as a client keeps them: each ``reset-step`` takes back what came
    before it of its step but the step's ``step-start`` (a takeover may come after the
    dead worker streamed the step's ``step-finish``), and goes itself."""
    kept: list[Any] = []
    for chunk in chunks:
        if isinstance(chunk, (ResetStep, StepRestarted)):
            starts = [c for c in kept if c.type == "step-start" and c.step == chunk.step]
            first = starts[0] if starts else None
            kept = [c for c in kept if c is first or getattr(c, "step", None) != chunk.step]
            continue
        kept.append(chunk)
    return kept


def _segments(chunks: list[Any]) -> list[list[Any]]:
    """A turn's chunks cut at each ``start``: its first run, then each continuation."""
    out: list[list[Any]] = []
    for chunk in chunks:
        if chunk.type == "start" or not out:
            out.append([])
        out[-1].append(chunk)
    return out


async def run_chaos(
    seed: int, pg_url: str, redis_url: str, prefix: str, config: ChaosConfig = SMALL
) -> dict[str, Any]:
    """One seed's run; raises :class:`Violations` (the seed in its message) when an
    invariant is broken. Leaves the run's own Redis and PostgreSQL running."""
    try:
        return await Run(seed, pg_url, redis_url, prefix, config).run()
    finally:
        await trio.to_thread.run_sync(own_redis().start)
