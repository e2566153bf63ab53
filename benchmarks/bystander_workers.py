"""Bystanders of a huge session in the worker deployment (branch ``whist``).

:mod:`benchmarks.bystander`'s question for ``serve --store postgresql://... --redis ...``
and ``python -m runtime worker``: while one session with a very long history has its
turn submitted, claimed, run and saved, how long do the event loops of the worker and of
the front end stall, and what do other sessions see of it?

It starts throwaway PostgreSQL and Redis servers (never the machine's own: the tests'
``tests/support/services.py``), one worker (``--concurrency 8``, the agent
:mod:`benchmarks.workers_agent` with a 10 ms gap before each chunk) and one front end
(``serve``, AI SDK and AG-UI), both from the checkout given, each with a Trio instrument
that logs every task step (and every collection) longer than 20 ms. Then:

* bystanders: one client after another sends a short turn to a session of its own
  (``POST /api/chat``, 60 deltas 10 ms apart) and times the gaps between its deltas and
  how long its first delta took; another polls ``GET /api/info`` every 10 ms;
* after a second, the huge session's turn:

  ``agui``   ``POST /ag-ui``, a new thread whose body holds ``--messages`` messages (the
             front end submits it with the history, the worker seeds the session with it,
             runs the turn and saves all of it, the front end's reply ends with the thread);
  ``stored`` ``POST /api/chat`` one message to a session that holds ``--messages`` stored
             messages (saved before the processes start): the worker claims and loads it,
             runs the turn and saves the two new messages;

* it waits until the huge turn's row is done, then one more second, and prints the
  big request's answer, the bystanders' worst figures and the longest loop steps of each
  process (task name; ``gc`` when a collection ran inside)::

    python3 benchmarks/bystander_workers.py agui                 # 600,000 messages
    python3 benchmarks/bystander_workers.py stored --messages 200000
    python3 benchmarks/bystander_workers.py agui /work/tmp/base  # another checkout's code
    BYSTANDER_ARGS=--gc-pacing python3 benchmarks/bystander_workers.py agui  # both processes

The driver (this process) and the servers run from this checkout; only the worker and
the front end run the other checkout's code. Not part of ``python -m benchmarks``: it
measures stalls, which on a shared machine are as much the machine's load as the code's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio

HERE = Path(__file__).resolve().parent.parent
LONG_STEP = 0.02
"""Seconds: a task step (or a collection) longer than this is logged by the processes."""

WATCHED = r"""
import gc, json, runpy, sys, time, trio
out = open(sys.argv[1], "a", buffering=1)
class Watch(trio.abc.Instrument):
    step = gc_at = 0.0
    collected = False
    def before_task_step(self, task):
        self.step, self.collected = time.perf_counter(), False
    def after_task_step(self, task):
        took = time.perf_counter() - self.step
        if took > LONG:
            out.write(json.dumps({"at": time.time(), "ms": took * 1e3, "task": task.name,
                                  "gc": self.collected}) + "\n")
watch = Watch()
def on_gc(phase, info):
    if phase == "start":
        watch.gc_at, watch.collected = time.perf_counter(), True
        return
    took = time.perf_counter() - watch.gc_at
    if took > LONG:
        out.write(json.dumps({"at": time.time(), "ms": took * 1e3,
                              "task": "collection %d" % info["generation"], "gc": True}) + "\n")
gc.callbacks.append(on_gc)
run = trio.run
def watched(*args, **kwargs):
    kwargs["instruments"] = [*kwargs.get("instruments", ()), watch]
    return run(*args, **kwargs)
trio.run = watched
sys.argv = ["runtime", *sys.argv[2:]]
runpy.run_module("runtime", run_name="__main__", alter_sys=True)
"""


def _processes(root: str, pg: str, redis: str, logs: Path) -> tuple[list[Any], str]:
    """The worker and the front end, started and ready; the front end's URL."""
    env = {
        **os.environ,
        "PYTHONPATH": root,
        "AXON_BENCH_DELAY": "0.01",
        "AXON_BENCH_WORDS": "60",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    code = WATCHED.replace("LONG", repr(LONG_STEP))
    agent = ("--agent", "benchmarks.workers_agent:agent")
    extra = os.environ.get("BYSTANDER_ARGS", "").split()  # e.g. --gc-pacing, to both
    common = ("--store", pg, "--redis", redis, *agent, "--log-level", "warning", *extra)
    worker_log = (logs / "worker.out").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-c", code, str(logs / "worker.steps"), "worker", *common,
         "--concurrency", "8"],
        cwd=root, env=env, stdout=worker_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    front = subprocess.Popen(
        [sys.executable, "-c", code, str(logs / "front.steps"), "serve", *common,
         "--port", "0", "--protocols", "ai-sdk,ag-ui", "--max-body", "1000000000"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=(logs / "front.err").open("wb"),
        text=True,
    )  # fmt: skip
    assert front.stdout is not None
    line = front.stdout.readline()
    if not line:
        raise SystemExit("the front end did not start: " + (logs / "front.err").read_text())
    url = line.split()[4].rstrip("/")
    deadline = time.monotonic() + 60
    while b"Axon worker " not in (logs / "worker.out").read_bytes():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the worker did not start: " + (logs / "worker.out").read_text())
        time.sleep(0.05)
    return [worker, front], url


ROLES = ("user", "assistant")


def agui_body(messages: int) -> bytes:
    history = [{"id": f"m{i}", "role": ROLES[i % 2], "content": "x"} for i in range(messages)]
    last = {"id": "last", "role": "user", "content": "hi"}
    return orjson.dumps({"threadId": "huge", "runId": "r", "messages": [*history, last]})


def chat_body(session_id: str, message_id: str) -> bytes:
    message = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    return orjson.dumps({"id": session_id, "messages": [message]})


async def seed(pg: str, messages: int) -> None:
    """The ``stored`` case's session: ``messages`` stored messages, saved from here."""
    from actors.stores.postgres import PostgresStore
    from runtime.messages import AssistantMessage, TextPart, UserMessage

    history = [
        UserMessage(content="x", id=f"m{i}")
        if i % 2 == 0
        else AssistantMessage(content=(TextPart(text="x", step=0),), id=f"m{i}")
        for i in range(messages)
    ]
    store = await PostgresStore.open(pg)
    try:
        await store.save("huge", 0, history)
    finally:
        await store.aclose()


async def turn_done(pg: str) -> bool:
    import psycopg

    from actors.stores.postgres import parse_url

    libpq, schema = parse_url(pg)

    def query() -> bool:
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            rows = conn.execute("SELECT status FROM axon_turns WHERE session_id = 'huge'")
            got = [r[0] for r in rows.fetchall()]
            return bool(got) and all(s in ("done", "failed", "cancelled") for s in got)

    return await trio.to_thread.run_sync(query)


async def measure(kind: str, url: str, pg: str, messages: int) -> dict[str, Any]:
    gaps: list[float] = []
    firsts: list[float] = []
    late: list[tuple[float, float]] = []
    infos: list[float] = []
    done = trio.Event()
    json_headers = {"content-type": "application/json"}

    async def chatting() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            i = 0
            while not done.is_set():
                i += 1
                last = time.perf_counter()
                first = True
                body = chat_body(f"by-{uuid.uuid4().hex[:8]}", f"u{i}")
                async with client.stream(
                    "POST", "/api/chat", content=body, headers=json_headers
                ) as r:
                    async for line in r.aiter_lines():
                        if '"text-delta"' not in line:
                            continue
                        now = time.perf_counter()
                        (firsts if first else gaps).append(now - last)
                        if not first and now - last > 0.5:
                            late.append((time.time() - (now - last), now - last))
                        first, last = False, now

    async def polling() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            while not done.is_set():
                start = time.perf_counter()
                await client.get("/api/info")
                infos.append(time.perf_counter() - start)
                await trio.sleep(0.01)

    body = agui_body(messages) if kind == "agui" else chat_body("huge", "big")
    path = "/ag-ui" if kind == "agui" else "/api/chat"
    await trio.sleep(2.0)  # the processes' start-up collections
    async with trio.open_nursery() as nursery:
        nursery.start_soon(chatting)
        nursery.start_soon(chatting)
        nursery.start_soon(polling)
        await trio.sleep(1.0)
        began = time.time()
        start = time.perf_counter()
        async with httpx.AsyncClient(base_url=url, timeout=600) as big:
            answer = await big.post(path, content=body, headers=json_headers)
        took = time.perf_counter() - start
        while not await turn_done(pg):  # noqa: ASYNC110 (a row's status, polled)
            await trio.sleep(0.1)
        finished = time.perf_counter() - start
        await trio.sleep(1.0)
        ended = time.time()
        done.set()
    return {
        "answer": f"{answer.status_code}, {len(answer.content) / 2**20:.1f} MiB in {took:.1f} s",
        "turn_done_s": finished,
        "window": (began, ended),
        "gaps": gaps,
        "firsts": firsts,
        "late": late,
        "infos": infos,
    }


def _steps(path: Path, window: tuple[float, float]) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    steps = [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(
        (s for s in steps if window[0] <= s["at"] <= window[1] + 1), key=lambda s: -s["ms"]
    )


def _ms(xs: list[float]) -> str:
    if not xs:
        return "none"
    xs = sorted(xs)
    return f"max {xs[-1] * 1e3:.0f} ms, median {xs[len(xs) // 2] * 1e3:.1f} ms ({len(xs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("agui", "stored"))
    parser.add_argument("root", nargs="?", default=str(HERE))
    parser.add_argument("--messages", type=int, default=600_000)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from tests.support.services import own_postgres, own_redis

    logs = Path(tempfile.mkdtemp(prefix="bystander-workers-"))
    pg = own_postgres().url
    pg += ("&" if "?" in pg else "?") + f"schema=bys_{uuid.uuid4().hex[:8]}"
    redis = own_redis().url
    print(f"{args.kind}: {args.messages:,} messages, worker and front end from {args.root}")
    print(f"the processes' long steps: {logs}/worker.steps, {logs}/front.steps")
    if args.kind == "stored":
        start = time.perf_counter()
        trio.run(seed, pg, args.messages)
        print(f"seeded in {time.perf_counter() - start:.1f} s")
    procs, url = _processes(args.root, pg, redis, logs)
    try:
        got = trio.run(measure, args.kind, url, pg, args.messages)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    print(f"big request: {got['answer']}; its turn done after {got['turn_done_s']:.1f} s")
    print(f"bystander deltas, gap: {_ms(got['gaps'])}")
    print(f"bystander turns, first delta: {_ms(got['firsts'])}")
    began = got["window"][0]
    for at, gap in sorted(got["late"]):
        print(f"  a gap of {gap * 1e3:.0f} ms from {at - began:.1f} s after the big request")
    print(f"bystander GET /api/info: {_ms(got['infos'])}")
    for name in ("worker", "front"):
        print(f"{name}: " + longest_steps(logs / f"{name}.steps", got["window"]))


def longest_steps(path: Path, window: tuple[float, float]) -> str:
    """What a process's :data:`WATCHED` instrument logged in ``path`` within ``window``
    (wall clock): how many long steps and collections, their sum, the four longest."""
    steps = _steps(path, window)
    total = sum(s["ms"] for s in steps)
    top = ", ".join(
        f"{s['ms']:.0f} ms {s['task'].rsplit('.', 1)[-1]}{' (gc)' if s['gc'] else ''}"
        for s in steps[:4]
    )
    collections = [s["ms"] for s in steps if s["task"].startswith("collection")]
    return (
        f"{len(steps)} steps > {LONG_STEP * 1e3:.0f} ms, {total:.0f} ms in all; "
        f"{len(collections)} collections, {sum(collections):.0f} ms; {top}"
    )


if __name__ == "__main__":
    main()
