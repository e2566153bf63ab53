"""Where a worker's turn spends its CPU, piece by piece, against the same turn embedded
(issue 24 goal 3).

``python3 -m benchmarks.worker_profile [--turns K] [--warm W] [--cprofile FILE]
[--no-embedded]`` (another tree's code: ``PYTHONPATH=DIR python3 path/to/worker_profile.py``).

The worker side is :mod:`benchmarks.bench_turn_cpu`'s, in this process: K one-turn
sessions of :mod:`benchmarks.workers_agent` (a ``lookup`` step, then 20 deltas) submitted
up front and held, released after a warm-up batch of W, one in-process
:class:`~runtime.app.worker.Worker` (concurrency 8, a Redis relay, the throwaway servers
of :func:`benchmarks.common.bench_server_urls`, log lines at ``info`` into a file). The
embedded side runs the same K turns in a :class:`~runtime.Host` on SQLite, 8 at once.

Per turn, measured over the batch (until every turn is done and the process idle again):

* the process's CPU (``time.process_time``: every thread) and the event loop's thread's
  (``time.thread_time`` read on it), the difference being the other threads' (the
  store's ``to_thread`` calls, the lease thread, SQLite's none: it runs on the loop);
* the loop's CPU split by task (a :class:`trio.abc.Instrument` reading
  ``time.thread_time`` before and after every task step, labelled as
  :class:`benchmarks.task_steps.StepCounter` labels them: actors by name, other tasks by
  their Trio name), and the rest of the loop's CPU: the scheduler itself, its I/O waits
  and the instrument's own reads (about 1 µs a step);
* the scheduler's rounds: those that could block (nothing runnable: the loop sleeps in
  its I/O wait until a socket, a thread's result or a deadline), task steps a round, and
  the worker's rounds a turn by window of 50 turns (its mode changes within a run); the
  context switches of the loop's thread and of the others (``/proc/self/task``): a
  voluntary one is a thread going to sleep, on a socket or on the GIL;
* with ``--pin CPU``, the process's threads run on that CPU alone (the throwaway servers
  started first, on every CPU): a worker's loop and store threads on one core;
* with ``--cprofile FILE``, a cProfile of the loop's thread over the batch, kept in
  ``FILE`` (the worker's; ``FILE.embedded`` the embedded side's) and its top functions by
  own time printed (cProfile inflates small functions: read it for where, the
  instrument's figures for how much).

The in-process worker shares its process with the driver, which only waits for an event
and, once, releases the batch (one statement in a thread, left out of the task table).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

CONCURRENCY = 8


class CpuByTask(trio.abc.Instrument):
    """CPU of the loop's thread per task label, and task steps, while :attr:`on`."""

    def __init__(self) -> None:
        from benchmarks.task_steps import StepCounter

        self._labels = StepCounter()  # its labelling only
        self.cpu: collections.Counter[str] = collections.Counter()
        self.steps: collections.Counter[str] = collections.Counter()
        self.rounds = 0
        self.blocked = 0
        """Rounds whose I/O wait could block (a timeout above zero: no task was runnable,
        the loop sleeps until a socket, a thread's result or a deadline wakes it)."""
        self.marks: list[int] = []
        """:attr:`rounds` at each turn's end (:meth:`turn_done`): the rounds of every
        window of turns, to see the worker's mode change within a run."""
        self.on = False
        self._start = 0.0

    def before_task_step(self, task: Any) -> None:
        if self.on:
            self._start = time.thread_time()

    def after_task_step(self, task: Any) -> None:
        if self.on:
            label = self._labels._label(task)
            self.cpu[label] += time.thread_time() - self._start
            self.steps[label] += 1

    def task_exited(self, task: Any) -> None:
        self._labels.task_exited(task)

    def before_io_wait(self, timeout: float) -> None:
        if self.on:
            self.rounds += 1
            if timeout > 0:
                self.blocked += 1

    def turn_done(self) -> None:
        if self.on:
            self.marks.append(self.rounds)

    def windows(self, size: int = 50) -> list[float]:
        """Scheduler rounds a turn in each window of ``size`` turns ended, in order."""
        marks = [0, *self.marks]
        return [(marks[i + size] - marks[i]) / size for i in range(0, len(marks) - size, size)]


class ThreadProfiles:
    """cProfile of every ``trio.to_thread.run_sync`` call's function while :attr:`on`
    (``--cprofile``: the store's psycopg work runs there), one profile per thread,
    merged when printed."""

    def __init__(self) -> None:
        import threading

        self.on = False
        self.profiles: dict[int, cProfile.Profile] = {}
        run_sync = trio.to_thread.run_sync
        mine = self

        async def profiled(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not mine.on:
                return await run_sync(fn, *args, **kwargs)

            def call(*inner: Any) -> Any:
                profile = mine.profiles.get(threading.get_ident())
                if profile is None:
                    profile = mine.profiles[threading.get_ident()] = cProfile.Profile(
                        time.thread_time
                    )
                profile.enable()
                try:
                    return fn(*inner)
                finally:
                    profile.disable()

            return await run_sync(call, *args, **kwargs)

        trio.to_thread.run_sync = profiled  # type: ignore[assignment]

    def stats(self) -> pstats.Stats | None:
        profiles = list(self.profiles.values())
        if not profiles:
            return None
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        return stats


def thread_times() -> dict[str, tuple[float, float]]:
    """User and system CPU seconds so far of this process's event loop thread (the main
    thread: ``loop``) and of all its other threads together (``threads``: the store's
    ``to_thread`` calls, the lease thread, the pool's), from ``/proc/self/task``, in
    clock ticks (10 ms: read over hundreds of turns)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    out: dict[str, tuple[float, float]] = {}
    for entry in os.scandir("/proc/self/task"):
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = raw[raw.rindex(")") + 2 :].split()
        kind = "loop" if int(entry.name) == me else "threads"
        user, system = out.get(kind, (0.0, 0.0))
        out[kind] = (user + int(fields[11]) / tick, system + int(fields[12]) / tick)
    return out


def switches() -> dict[str, tuple[int, int]]:
    """Voluntary and involuntary context switches so far of the event loop's thread
    (``loop``) and of all the other threads together (``threads``), from
    ``/proc/self/task/*/status``. A voluntary one is a thread going to sleep: the loop
    in a blocking I/O wait, or either side waiting for the GIL the other holds."""
    import os

    me = os.getpid()
    out: dict[str, tuple[int, int]] = {}
    for entry in os.scandir("/proc/self/task"):
        try:
            lines = Path(entry.path, "status").read_text().splitlines()
        except OSError:
            continue
        got = {
            k: int(v)
            for k, _, v in (line.partition(":\t") for line in lines)
            if k.endswith("ctxt_switches")
        }
        kind = "loop" if int(entry.name) == me else "threads"
        vol, invol = out.get(kind, (0, 0))
        out[kind] = (
            vol + got.get("voluntary_ctxt_switches", 0),
            invol + got.get("nonvoluntary_ctxt_switches", 0),
        )
    return out


def pin_threads(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus`` (threads started later inherit it from the
    one that starts them). The loop's thread and the store's threads then hand the GIL to
    each other on one core, not across two (``--pin``; a deployment's ``taskset``)."""
    import os

    for entry in os.scandir("/proc/self/task"):
        with contextlib.suppress(OSError):  # ended meanwhile
            os.sched_setaffinity(int(entry.name), cpus)


@contextlib.contextmanager
def measured(counter: CpuByTask, profile: cProfile.Profile | None) -> Any:
    """Counts on for the block; yields a dict filled with the CPU read around it."""
    got: dict[str, float] = {}
    trio.lowlevel.add_instrument(counter)
    threads = thread_times()
    before = switches()
    main, process = time.thread_time(), time.process_time()
    counter.on = True
    counter._start = main  # the rest of this task's step counts as its own
    if profile is not None:
        profile.enable()
    try:
        yield got
    finally:
        if profile is not None:
            profile.disable()
        counter.on = False
        got["loop"] = time.thread_time() - main
        got["process"] = time.process_time() - process
        for kind, (user, system) in thread_times().items():
            was = threads.get(kind, (0.0, 0.0))
            got[f"{kind} user"], got[f"{kind} sys"] = user - was[0], system - was[1]
        for kind, (vol, invol) in switches().items():
            was_vol, was_invol = before.get(kind, (0, 0))
            got[f"{kind} voluntary"], got[f"{kind} involuntary"] = vol - was_vol, invol - was_invol
        trio.lowlevel.remove_instrument(counter)


async def _settled() -> None:
    import trio.testing

    await trio.testing.wait_all_tasks_blocked(cushion=0.05)


async def worker_side(
    turns: int, warm: int, profile: cProfile.Profile | None, threads: ThreadProfiles | None = None
) -> dict[str, Any]:
    import uuid

    from actors.relays import RedisRelay
    from actors.stores.postgres import PostgresStore
    from benchmarks.bench_turn_cpu import _submit_held
    from benchmarks.bench_workers import _sql
    from benchmarks.common import bench_server_urls
    from benchmarks.workers_agent import agent
    from runtime.app.worker import Worker

    pg_url, redis_url = bench_server_urls()
    schema = f"wprof_{uuid.uuid4().hex[:8]}"
    url = pg_url + ("&" if "?" in pg_url else "?") + f"schema={schema}"
    await _submit_held(url, warm, turns)
    store = await PostgresStore.open(url)
    counter = CpuByTask()

    class Counted(Worker):
        """Sets :attr:`reached` once :attr:`want` turns are done (no polling)."""

        want = 0
        reached = trio.Event()

        async def _run_claim(self, entry: Any, slots: trio.Semaphore) -> None:
            await super()._run_claim(entry, slots)
            counter.turn_done()
            if sum(self.done.values()) >= self.want:
                self.reached.set()

    worker = Counted(store=store, agent=agent, concurrency=CONCURRENCY)

    async def release(prefix: str, n: int) -> None:
        worker.want, worker.reached = n, trio.Event()
        await trio.to_thread.run_sync(
            _sql,
            url,
            f"UPDATE axon_turns SET cancel_requested = false WHERE session_id LIKE '{prefix}%'",
            f"NOTIFY axon_turns, '{schema}:go'",
        )
        await worker.reached.wait()
        await _settled()

    try:
        async with contextlib.AsyncExitStack() as stack:
            relay = RedisRelay.open(redis_url, prefix=f"wprof:{schema}:")
            worker.relay = await stack.enter_async_context(relay)
            nursery = await stack.enter_async_context(trio.open_nursery())
            await nursery.start(worker.run)
            await release("w", warm)
            with measured(counter, profile) as got:
                if threads is not None:
                    threads.on = True
                await release("m", warm + turns)
                if threads is not None:
                    threads.on = False
            worker.stop()
    finally:
        await store.aclose()
        await trio.to_thread.run_sync(_sql, url, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return _summary(counter, got, dict(worker.done))


async def embedded_side(turns: int, warm: int, profile: cProfile.Profile | None) -> dict[str, Any]:
    from benchmarks.common import run_session_batch
    from benchmarks.workers_agent import agent
    from runtime import Host

    counter = CpuByTask()
    with tempfile.TemporaryDirectory(prefix="axon-wprof-") as directory:
        async with Host.open(store=str(Path(directory) / "embedded.db")) as host:

            async def batch(tag: str, n: int) -> None:
                await run_session_batch(host, agent, tag, n, CONCURRENCY)
                await _settled()

            await batch("w", warm)
            driver = trio.lowlevel.current_task().name
            with measured(counter, profile) as got:
                await batch("m", turns)
    summary = _summary(counter, got, {"done": turns})
    summary["driver"] = driver
    return summary


def _summary(counter: CpuByTask, got: dict[str, float], done: dict[str, int]) -> dict[str, Any]:
    return {
        "cpu": counter.cpu,
        "steps": counter.steps,
        "rounds": counter.rounds,
        "blocked": counter.blocked,
        "windows": counter.windows(),
        "switches": {k: v for k, v in got.items() if k.endswith("voluntary")},
        "loop": got["loop"],
        "process": got["process"],
        "threads": {k: v for k, v in got.items() if k.endswith(("user", "sys"))},
        "done": done,
    }


def _print(title: str, got: dict[str, Any], turns: int) -> None:
    us = 1e6 / turns
    tasks = sum(got["cpu"].values())
    print(f"== {title}: per turn ({got['done']}) ==")
    print(f"process CPU            {got['process'] * us:9.1f} us")
    print(f"  other threads        {(got['process'] - got['loop']) * us:9.1f} us")
    print(f"  loop thread          {got['loop'] * us:9.1f} us")
    print(f"    scheduler, I/O     {(got['loop'] - tasks) * us:9.1f} us")
    steps = sum(got["steps"].values()) / turns
    print(f"    task steps         {tasks * us:9.1f} us  ({steps:.1f})")
    print(f"scheduler rounds       {got['rounds'] / turns:9.1f}")
    print(f"  that could block     {got['blocked'] / turns:9.1f}")
    print(f"  task steps a round   {steps * turns / max(got['rounds'], 1):9.2f}")
    if got["windows"]:
        print("rounds a turn by 50 turns: " + " ".join(f"{w:.1f}" for w in got["windows"]))
    print(
        "context switches a turn: "
        + ", ".join(f"{k} {v / turns:.1f}" for k, v in sorted(got["switches"].items()))
    )
    print(
        "user / system, /proc: "
        + ", ".join(f"{k} {v * us:.0f}" for k, v in sorted(got["threads"].items()))
    )
    for label, cpu in got["cpu"].most_common():
        if cpu * us >= 1.0:
            print(f"      {cpu * us:9.1f} us {got['steps'][label] / turns:6.2f}  {label}")


def _top(profile: cProfile.Profile, out: str, n: int) -> None:
    profile.dump_stats(out)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(n)
    print(text.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.worker_profile")
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--warm", type=int, default=40)
    parser.add_argument("--cprofile", default=None, metavar="FILE")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-embedded", action="store_true")
    parser.add_argument("--no-worker", action="store_true")
    parser.add_argument(
        "--pin",
        type=int,
        default=None,
        metavar="CPU",
        help="run this process's threads on that CPU alone (the servers started first, free)",
    )
    args = parser.parse_args()
    if args.pin is not None:
        from benchmarks.common import bench_server_urls

        bench_server_urls()  # the throwaway servers start before the pin: not pinned
        pin_threads({args.pin})
    from benchmarks.common import LogSink

    with tempfile.TemporaryDirectory(prefix="axon-wprof-log-") as logs:
        sink = LogSink(logs)
        try:
            k = args.turns
            if not args.no_worker:
                profile = cProfile.Profile(time.thread_time) if args.cprofile else None
                threads = ThreadProfiles() if args.cprofile else None
                got = trio.run(worker_side, k, args.warm, profile, threads)
                _print(f"worker, {k} turns", got, k)
                if profile is not None:
                    _top(profile, args.cprofile, args.top)
                stats = threads.stats() if threads is not None else None
                if stats is not None:
                    stats.dump_stats(args.cprofile + ".threads")
                    print("== the worker's threads (to_thread calls) ==")
                    stats.sort_stats("tottime").print_stats(args.top)
            if not args.no_embedded:
                profile = cProfile.Profile(time.thread_time) if args.cprofile else None
                got = trio.run(embedded_side, k, args.warm, profile)
                _print(f"embedded (SQLite), {k} turns", got, k)
                if profile is not None:
                    _top(profile, args.cprofile + ".embedded", args.top)
        finally:
            sink.close()


if __name__ == "__main__":
    main()
