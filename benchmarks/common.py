"""What every benchmark shares: sizes, the loopback server process, timing, results."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
API_KEY = "sk-bench-not-a-real-key"
INSTRUCTIONS = "You are concise."
PROMPT = "Tell me about the weather in Paris."
OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
GEMINI_MODEL = "gemini-2.5-flash"
WARM_TURNS = 10
"""Turns (reads, on the baselines' side) each side of the pipeline, ``cpu_floor`` and
``instr_count`` runs before its measured ones. CPython 3.11 quickens a code object at its
8th call (or loop iteration) and specialises its instructions as they next run, so code
Axon runs once a turn (the request's build, the SDK's and httpx2's request path, the turn's
set-up and save) is counted unspecialised until the 9th turn, while the floor's one loop is
specialised inside its first read: a warm-up shorter than that is biased against Axon
(branch ``anthropic1k``: ~267k instructions, ~3 % of a one-delta turn)."""


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs. ``full`` is the default; ``quick`` is for the smoke
    test (every code path, tiny sizes; its figures mean nothing)."""

    pipeline_deltas: int = 1000
    pipeline_rounds: int = 31
    pipeline_long_deltas: int = 10_000
    pipeline_long_rounds: int = 11
    warmup: int = 2
    pipeline_warmup: int = WARM_TURNS
    ttfd_rounds: int = 21
    core_sizes: tuple[int, int] = (10_000, 100_000)
    core_rounds: int = 7
    conc_levels: tuple[int, ...] = (1, 10_000)
    conc_warmup_levels: tuple[int, ...] = (1, 100)
    conc_deltas: int = 20
    conc_rounds: int = 3
    conc_single_turns: int = 5
    idle_sessions: int = 10_000
    idle_turns: int = 1000
    long_turns: int = 500
    long_save_reps: int = 200
    long_turn_rounds: int = 9
    startup_runs: int = 21
    peer_rounds: int = 15
    workers_turns: int = 800
    workers_cpu_turns: int = 400
    workers_io_turns: int = 240
    workers_rounds: int = 5
    workers_warmup: int = 0
    workers_concurrency: int = 8
    workers_delay: float = 0.02
    relay_turns: int = 200
    relay_warmup: int = 5
    store_rounds: int = 31
    aio_deltas: int = 10_000
    aio_rounds: int = 15
    approval_rounds: int = 31
    approval_sessions: int = 1000
    approval_memory_rounds: int = 5


FULL = Sizes()
QUICK = Sizes(
    pipeline_deltas=40,
    pipeline_rounds=2,
    pipeline_long_deltas=120,
    pipeline_long_rounds=2,
    warmup=1,
    pipeline_warmup=1,
    ttfd_rounds=2,
    core_sizes=(200, 2000),
    core_rounds=1,
    conc_levels=(1, 12),
    conc_warmup_levels=(1, 4),
    conc_deltas=20,
    conc_rounds=1,
    conc_single_turns=2,
    idle_sessions=200,  # at about 5 KB each, fewer may not grow RSS by a page
    idle_turns=10,
    long_turns=8,
    long_save_reps=4,
    long_turn_rounds=1,
    startup_runs=2,
    peer_rounds=1,
    workers_turns=10,
    workers_cpu_turns=10,
    workers_io_turns=8,
    workers_rounds=1,
    relay_turns=3,
    relay_warmup=1,
    store_rounds=2,
    aio_deltas=200,
    aio_rounds=2,
    approval_rounds=2,
    approval_sessions=20,
    approval_memory_rounds=1,
)


@dataclass
class Figure:
    """One row of the results table."""

    key: str
    title: str
    value: float | None
    unit: str
    target: str = ""
    passed: bool | None = None
    """``None``: informational (no target) or not measured."""
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "value": self.value,
            "unit": self.unit,
            "target": self.target,
            "passed": self.passed,
            "detail": self.detail,
            "data": self.data,
        }


def count_argument(default: int, doc: str | None, name: str = "rounds") -> int:
    """The one optional count a by-hand benchmark takes (``python3 -m benchmarks.X [N]``),
    read with argparse so that ``--help`` prints the script's docstring (``doc``) instead
    of failing to read ``--help`` as a number."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(name, nargs="?", type=int, default=default, help=f"default {default}")
    return int(getattr(parser.parse_args(), name))


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def at_most(value: float, limit: float) -> bool:
    return value <= limit


# -- timing ------------------------------------------------------------------------------


async def alternate(
    rounds: int,
    warmup: int,
    sides: dict[str, Callable[[], Awaitable[float]]],
    *,
    collect: bool = True,
) -> dict[str, list[float]]:
    """Run each side once per round, rotating which goes first, after ``warmup`` rounds
    that are thrown away; each side returns the seconds it measured. A full collection
    runs before each measurement (unless ``collect`` is false, for sub-millisecond sides)
    so one side's garbage is not collected on the other's time; both still pay for their
    own garbage: collection stays enabled."""
    names = list(sides)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if collect:
                gc.collect()
            seconds = await sides[name]()
            if r >= warmup:
                times[name].append(seconds)
    return times


def paired_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (Linux) or getrusage's peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench_server_urls() -> tuple[str, str]:
    """The PostgreSQL and Redis the worker benchmarks use: ``AXON_BENCH_PG`` /
    ``AXON_BENCH_REDIS`` when the user names servers on purpose, otherwise throwaway
    servers this run starts (own data directory, free port, deleted at exit, as the tests'
    ``tests/support/services.py``). Never the machine's own servers: the benchmark writes
    schemas and keys, and a user's database is not ours to write into.

    The URLs go into this process's environment, so the benchmark children (started with
    :func:`python_env`) use the same servers instead of starting their own. A server that
    cannot start here gives a closed port, so its figures are skipped, saying why.
    """
    pg = os.environ.get("AXON_BENCH_PG")
    redis = os.environ.get("AXON_BENCH_REDIS")
    if pg is None or redis is None:
        from tests.support.services import ServiceUnavailable, free_port, own_postgres, own_redis

        closed = free_port()
        if pg is None:
            try:
                pg = own_postgres().url
            except ServiceUnavailable:
                pg = f"postgresql://postgres@127.0.0.1:{closed}/none"
        if redis is None:
            try:
                redis = own_redis().url
            except ServiceUnavailable:
                redis = f"redis://127.0.0.1:{closed}/0"
        os.environ["AXON_BENCH_PG"], os.environ["AXON_BENCH_REDIS"] = pg, redis
    return pg, redis


def python_env() -> dict[str, str]:
    """The environment for child Python processes: the repo importable, no SDK config."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    for var in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        env.pop(var, None)
    return env


# -- the loopback server -----------------------------------------------------------------


class ServerAddress:
    """Where the replay server listens (a benchmark child gets the port and the file
    where the server notes when it sends each paced response)."""

    def __init__(self, port: int, sent_log: str | None = None) -> None:
        self.port = port
        self.sent_log = sent_log

    def sent_times(self) -> list[float]:
        """When each paced response's first events were sent (``perf_counter``), in
        order; ``[]`` without a log."""
        if not self.sent_log:
            return []
        try:
            with open(self.sent_log, encoding="ascii") as f:
                return [float(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def url(self, fmt: str, n: int, mode: str = "burst") -> str:
        """The SDK ``base_url`` serving ``n`` deltas in ``fmt`` (openai: with ``/v1``)."""
        root = f"http://127.0.0.1:{self.port}/{fmt}/{n}/{mode}"
        return root + "/v1" if fmt == "openai" else root


class LoopbackServer(ServerAddress):
    """The replay server (``benchmarks.server``) in a child process."""

    def __init__(self, specs: Sequence[tuple[str, int]]) -> None:
        args = [f"{fmt}:{n}" for fmt, n in specs]
        fd, sent_log = tempfile.mkstemp(prefix="axon-bench-sent-", suffix=".log")
        os.close(fd)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.server", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            env={**python_env(), "AXON_BENCH_SENT_LOG": sent_log},
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError(f"the loopback server did not start: {line!r}")
        super().__init__(int(line.split()[1]), sent_log)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self._proc.kill()
                self._proc.wait()
        if self.sent_log:
            with contextlib.suppress(OSError):
                os.unlink(self.sent_log)

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- logging -------------------------------------------------------------------------------


class LogSink:
    """structlog configured at ``info`` into a real file, as an application would."""

    def __init__(self, directory: str) -> None:
        from runtime import configure_logging

        self.path = Path(directory) / "axon.log.jsonl"
        self._file = self.path.open("w", encoding="utf-8")
        configure_logging("info", stream=self._file)

    def lines(self) -> int:
        self._file.flush()
        with self.path.open("rb") as f:
            return sum(1 for _ in f)

    def close(self) -> None:
        self._file.close()


def now() -> float:
    return time.perf_counter()


def run_tree_child(script: str, tree: str, *args: str) -> Any:
    """Run ``script`` (the calling benchmark's own file) as a child process in ``tree``,
    a checkout, with ``--child`` and ``args``; the JSON its ``RESULT`` line printed.

    The script is this tree's file, run with ``-P`` (its folder not on ``sys.path``) and
    the other tree as ``PYTHONPATH``: a tree without the benchmark (an older checkout, the
    base of an A/B) is measured by the same harness as the tree that has it."""
    env = {**os.environ, "PYTHONPATH": tree}
    argv = [sys.executable, "-P", script, "--child", *args]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"the child in {tree} failed:\n{done.stderr[-3000:]}")


async def run_session_batch(
    host: Any,
    agent: Any,
    tag: str,
    n: int,
    concurrency: int,
    *,
    close: bool = True,
    check: bool = False,
) -> None:
    """``n`` turns of ``PROMPT``, each in a fresh session ``{tag}{i}`` of ``host``, at
    most ``concurrency`` at once, every chunk read (the embedded side of the worker
    benchmarks). ``close`` closes each session after its turn; ``check`` raises unless
    each turn ended ``stop``."""
    import trio

    limit = trio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limit:
            session = await host.open_session(agent, session_id=f"{tag}{i}")
            async with session.stream(PROMPT) as out:
                async for _ in out:
                    pass
            if check and (out.result is None or out.result.finish_reason != "stop"):
                raise RuntimeError(f"embedded: the turn ended {out.result}")
            if close:
                await session.close()

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
