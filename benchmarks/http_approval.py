"""The AI SDK's approval round trip over HTTP in the embedded app, in process: the time
of one continuation ``POST /api/chat`` (the assistant message last, its tool part
``approval-responded``), from the request to the stream's last byte, and the store
calls it makes.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it). Run it as
``python3 benchmarks/http_approval.py --ab TREE_A TREE_B POSTS``: a child process per
tree (``PYTHONPATH`` set to it; this file imports nothing from ``benchmarks``, so one
copy of it measures any tree), each with a host on a fresh SQLite file and the app on it
(no server: the ASGI app is called directly, without its lifespan). After 20 untimed
warm-up sessions, the driver asks the children for one timed POST at a time, in turn
(each first in turn), so both meet the same machine load: a new session's first message
(a scripted tool call that needs approval: the turn suspends; not timed), then, after a
full collection, the approval's POST (timed: wall and the process's CPU time; the
store's ``load``/``version``/``save`` calls counted and timed by wrapping the instance),
then the session closed (memory stays flat). The session stays in memory between the
two, as in a page that approves what it was just asked. Prints per tree min/median/max
in microseconds, the medians of the time in each store method (wall, which includes
other tasks that ran while the call waited for SQLite's thread) and the calls per POST;
then the median of the paired differences.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


def _agent() -> Agent:
    def respond(request: Any) -> list[Any]:
        if any(getattr(m, "role", "") == "tool" for m in request.messages):
            return ["done"]
        return tool_call("delete_file", {"path": "/x"}, tool_call_id="D")

    return Agent(provider=ScriptedProvider(responder=respond), tools=[delete_file])


async def _post(app: Any, payload: dict[str, Any]) -> tuple[int, bytes]:
    """``POST /api/chat`` with ``payload`` straight into the ASGI app: status and body."""
    body = orjson.dumps(payload)
    sent = False
    status = 0
    chunks: list[bytes] = []
    finished = trio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/chat",
        "raw_path": b"/api/chat",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    return status, b"".join(chunks)


def _events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _count(store: Any) -> tuple[Counter[str], Counter[str]]:
    """Wrap the store's ``load``, ``save`` and ``version`` on the instance: their calls,
    and the wall time spent in them (microseconds), by name."""
    calls: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    for name in ("load", "save", "version"):
        original = getattr(store, name)

        async def counted(
            *args: Any, _original: Any = original, _name: str = name, **kw: Any
        ) -> Any:
            calls[_name] += 1
            began = time.perf_counter()
            try:
                return await _original(*args, **kw)
            finally:
                spent[_name] += (time.perf_counter() - began) * 1e6

        setattr(store, name, counted)
    return calls, spent


def _bodies(i: int) -> dict[str, Any]:
    return {
        "id": f"s{i}",
        "messages": [{"id": f"u{i}", "role": "user", "parts": [{"type": "text", "text": "go"}]}],
        "trigger": "submit-message",
    }


def _answer(first: dict[str, Any], message_id: str, approval_id: str) -> dict[str, Any]:
    """The continuation ``useChat`` sends: the conversation, the answered message last."""
    part = {
        "type": "tool-delete_file",
        "toolCallId": "D",
        "state": "approval-responded",
        "input": {"path": "/x"},
        "approval": {"id": approval_id, "approved": True},
    }
    return {
        **first,
        "messageId": message_id,
        "messages": [
            *first["messages"],
            {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]},
        ],
    }


async def _one(app: Any, host: Any, store_calls: Any, i: int) -> dict[str, Any]:
    """One session: its first message (suspends; not timed), then the approval's POST,
    timed after a full collection; the session closed after it (memory stays flat)."""
    calls, spent = store_calls
    first = _bodies(i)
    status, body = await _post(app, first)
    chunks = _events(body)
    asked = next(c for c in chunks if c["type"] == "tool-approval-request")
    answer = _answer(first, chunks[0]["messageId"], asked["approvalId"])
    gc.collect()
    calls.clear()
    spent.clear()
    cpu, wall = time.process_time(), time.perf_counter()
    status, body = await _post(app, answer)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = _events(body)
    assert status == 200 and done[1]["type"] == "tool-output-available", body
    await host.close_session(host.sessions[f"s{i}"])
    return {"wall": wall * 1e6, "cpu": cpu * 1e6, "calls": dict(calls), "spent": dict(spent)}


async def _child(warmup: int) -> None:
    """Serve the driver: one timed POST per line read on stdin, its figures a JSON line."""
    from runtime.app.web.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        async with Host.open(store=Path(tmp) / "b.db", log_tap=False) as host:
            app = create_app(host, _agent())
            store_calls = _count(host.store)
            for i in range(warmup):
                await _one(app, host, store_calls, i)
            i = warmup
            print("ready", flush=True)
            while (await trio.to_thread.run_sync(sys.stdin.readline)).strip():
                print(json.dumps(await _one(app, host, store_calls, i)), flush=True)
                i += 1


def _drive(trees: list[str], posts: int) -> None:
    """A child per tree; POSTs alternate between them one by one (each first in turn),
    so both meet the same machine load. Prints per tree the medians and the calls per
    POST, then the median of the paired differences (each tree less the first)."""
    import os
    import subprocess

    here = str(Path(__file__).resolve())
    children = [
        subprocess.Popen(
            [sys.executable, here, "--child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": tree},
            cwd="/",
        )
        for tree in trees
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    results: list[list[dict[str, Any]]] = [[] for _ in trees]
    for n in range(posts):
        order = list(range(len(trees)))
        if n % 2:
            order.reverse()
        for k in order:
            child = children[k]
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            results[k].append(json.loads(child.stdout.readline()))
    for child in children:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        child.wait()
    for tree, rows in zip(trees, results, strict=True):
        calls: Counter[str] = Counter()
        for row in rows:
            calls.update(row["calls"])
        walls = [r["wall"] for r in rows]
        print(
            json.dumps(
                {
                    "tree": tree,
                    "wall_us": [round(x, 1) for x in _spread(walls)],
                    "cpu_us": [round(x, 1) for x in _spread([r["cpu"] for r in rows])],
                    "in_store_us": {
                        name: round(statistics.median(r["spent"].get(name, 0.0) for r in rows), 1)
                        for name in ("load", "save", "version")
                    },
                    "calls_per_post": {k: v / len(rows) for k, v in sorted(calls.items())},
                }
            )
        )
    for tree, rows in zip(trees[1:], results[1:], strict=True):
        for what in ("wall", "cpu"):
            diffs = [r[what] - b[what] for r, b in zip(rows, results[0], strict=True)]
            print(
                f"{tree} - {trees[0]}: {what} median of paired differences "
                f"{statistics.median(diffs):+.1f} us over {len(diffs)} pairs"
            )


def _spread(values: list[float]) -> tuple[float, float, float]:
    """min, median, max."""
    return min(values), statistics.median(values), max(values)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        trio.run(_child, 20)
        return
    if sys.argv[1:2] == ["--ab"]:
        trees = sys.argv[2:-1]
        _drive(trees, int(sys.argv[-1]))
        return
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
