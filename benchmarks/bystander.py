"""A bystander's latency while one large ``POST /api/chat`` is handled (issue 18, item 2).

Starts ``python -m runtime serve`` (the demo agent, memory store) from the checkout given,
polls ``GET /api/info`` every 10 ms on one connection, sends one ~40 MiB body on another,
and prints the big request's answer, the bystander's slowest and median latency, and the
server's longest loop steps (and collections) over 20 ms while it ran
(:data:`benchmarks.bystander_workers.WATCHED`)::

    python3 benchmarks/bystander.py text      # one 40 MiB text part: accepted, its turn runs
    python3 benchmarks/bystander.py parts     # 700,000 one-byte data: files (38 MiB): 413
    python3 benchmarks/bystander.py nested    # 13 million empty arrays beside a message: 400
    python3 benchmarks/bystander.py text /path/to/other/checkout   # e.g. an older main
    python3 benchmarks/bystander.py agui      # POST /ag-ui, a new thread of 600,000 messages
    python3 benchmarks/bystander.py chat      # POST /v1/chat/completions, 600,000 messages
    python3 benchmarks/bystander.py agui-again  # the agui body posted again (measured):
                                                # the thread's snapshot, nothing new to run
    python3 benchmarks/bystander.py turns     # no big body: 400 short turns one after
                                              # another, their time and serve's CPU
    BYSTANDER_ARGS=--gc-pacing python3 benchmarks/bystander.py agui  # serve's options

Not part of ``python -m benchmarks``: it measures a stall, not a ratio, and on a shared
machine its maximum is as much the machine's load as the server's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script
from benchmarks.bystander_workers import LONG_STEP, WATCHED, longest_steps

MIB = 1 << 20


def body_of(kind: str) -> bytes:
    def chat(parts: list[dict[str, str]], **extra: str) -> bytes:
        message = {"id": "u", "role": "user", "parts": parts}
        return orjson.dumps({"id": "big", "messages": [message], **extra})

    if kind == "text":
        return chat([{"type": "text", "text": "word " * (8 * MIB)}])
    if kind == "parts":
        return chat([{"type": "file", "mediaType": "text/plain", "url": "data:,x"}] * 700_000)
    if kind == "nested":
        head = chat([{"type": "text", "text": "hi"}], trigger="none")[:-1]
        return head + b',"junk":[' + b",".join([b"[]"] * (13 * MIB)) + b"]}"
    if kind == "agui":
        history = [{"id": f"m{i}", "role": ROLES[i % 2], "content": "x"} for i in range(HISTORY)]
        last = {"id": "last", "role": "user", "content": "hi"}
        return orjson.dumps({"threadId": "big", "runId": "r", "messages": [*history, last]})
    if kind == "chat":
        history = [{"role": ROLES[i % 2], "content": "x"} for i in range(HISTORY)]
        last = {"role": "user", "content": "hi"}
        return orjson.dumps({"model": "assistant", "messages": [*history, last]})
    raise SystemExit(f"unknown kind {kind!r}: text, parts, nested, agui or chat")


ROLES = ("user", "assistant")
HISTORY = 600_000
"""Messages of history in an ``agui`` or ``chat`` body (kept, so not reduced in a child)."""
PATHS = {"agui": "/ag-ui", "chat": "/v1/chat/completions"}
PROTOCOLS = ("--protocols", "ai-sdk,ag-ui,openai")


async def measure(url: str, body: bytes, path: str = "/api/chat", again: bool = False) -> None:
    latencies: list[float] = []
    done = trio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await client.get("/api/info")
        if again:  # the first post, not measured: it stores the thread
            headers = {"content-type": "application/json"}
            (await client.post(path, content=body, headers=headers)).raise_for_status()
        if path == PATHS["chat"]:  # the model the server serves: the demo agent's name
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            body = body.replace(b'"model":"assistant"', orjson.dumps({"model": model})[1:-1], 1)

        async def bystander() -> None:
            while not done.is_set():
                start = time.perf_counter()
                await client.get("/api/info")
                latencies.append(time.perf_counter() - start)
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(bystander)
            await trio.sleep(0.2)
            start = time.perf_counter()
            async with httpx.AsyncClient(base_url=url, timeout=600) as big:
                answer = await big.post(
                    path, content=body, headers={"content-type": "application/json"}
                )
            took = time.perf_counter() - start
            await trio.sleep(0.2)
            done.set()
    latencies.sort()
    print(f"big request: {answer.status_code} in {took:.2f} s: {answer.text[:80]!r}")
    print(
        f"bystander GET /api/info: {len(latencies)} answers, slowest "
        f"{latencies[-1] * 1000:.0f} ms, median {latencies[len(latencies) // 2] * 1000:.1f} ms"
    )


EXTRA = os.environ.get("BYSTANDER_ARGS", "").split()
"""More of ``serve``'s options, from ``BYSTANDER_ARGS`` (e.g. ``--gc-pacing``)."""
TURNS = 400
"""Short turns of ``turns``: the normal path, what pacing the collector must not cost."""


async def turns(url: str, pid: int) -> None:
    """:data:`TURNS` short turns one after another (each its own session, ``POST
    /api/chat``): the wall time and the server's CPU seconds (``/proc``) they took."""

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for i in range(20):  # warm-up
            await client.post("/api/chat", content=chat_turn(f"w{i}"), headers=JSON)
        start, used = time.perf_counter(), cpu()
        for i in range(TURNS):
            r = await client.post("/api/chat", content=chat_turn(f"s{i}"), headers=JSON)
            r.raise_for_status()
        took, used = time.perf_counter() - start, cpu() - used
    each = used / TURNS * 1e3
    print(f"{TURNS} turns in {took:.2f} s, server CPU {used:.2f} s ({each:.2f} ms a turn)")


JSON = {"content-type": "application/json"}


def chat_turn(session_id: str) -> bytes:
    message = {"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    return orjson.dumps({"id": session_id, "messages": [message]})


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "text"
    root = sys.argv[2] if len(sys.argv) > 2 else str(Path(__file__).resolve().parent.parent)
    again = kind.endswith("-again")
    kind = kind.removesuffix("-again")
    body = b"" if kind == "turns" else body_of(kind)
    print(f"{kind}: a body of {len(body) / MIB:.1f} MiB, server from {root}")
    steps = Path(tempfile.mkdtemp(prefix="bystander-")) / "serve.steps"
    watched = ["-c", WATCHED.replace("LONG", repr(LONG_STEP)), str(steps)]
    if kind == "turns":  # the normal path's cost: no instrument of ours in the server
        watched = ["-m", "runtime"]
    server = subprocess.Popen(
        [sys.executable, *watched, "serve", "--port", "0", "--delay", "0", *PROTOCOLS, *EXTRA],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[4].rstrip("/")
        began = time.time()
        if kind == "turns":
            trio.run(turns, url, server.pid)
        else:
            trio.run(measure, url, body, PATHS.get(kind, "/api/chat"), again)
    finally:
        server.terminate()
        server.wait()
    if kind != "turns":
        print("serve: " + longest_steps(steps, (began, time.time())))


if __name__ == "__main__":
    main()
