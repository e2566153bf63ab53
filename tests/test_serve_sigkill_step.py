"""``serve`` (the embedded deployment, SQLite) SIGKILLed mid-turn after a step was
committed: a real process, killed while the turn's second step runs a tool that never
ends (:mod:`tests.support.killed_step_agent`). Started again on the same file, the turn's
committed step is there, once (its text, its call, the call's result), and nothing of
the step in flight is; the turn shows interrupted (the page's message, the stored one:
its step saves named this process as running it, :mod:`runtime.liveness`, and that
process is dead); the same client's next message is answered after it, and the killed
turn is not run again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import trio

from actors.stores.sqlite import SQLiteStore
from runtime.messages import AssistantMessage, ToolMessage, UserMessage
from runtime.store import SessionRecord

ROOT = Path(__file__).resolve().parent.parent
AGENT = "tests.support.killed_step_agent:agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(db: Path, port: int, hang_file: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "AXON_TEST_HANG_FILE": str(hang_file),
    }
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", "serve", "--port", str(port), "--store", str(db),
             "--agent", AGENT],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert "Axon web UI" in line, log.read_text()
    return proc


def stored(db: Path) -> SessionRecord:
    async def load() -> SessionRecord | None:
        store = await SQLiteStore.open(db)
        try:
            return await store.load("s1")
        finally:
            await store.aclose()

    record = trio.run(load)
    assert record is not None
    return record


def shape(record: SessionRecord) -> list[tuple[str, ...]]:
    """Each message as (role, what it holds) without ids."""
    out: list[tuple[str, ...]] = []
    for m in record.messages:
        if isinstance(m, UserMessage):
            out.append(("user", str(m.content)))
        elif isinstance(m, AssistantMessage):
            kinds = [getattr(p, "text", None) or getattr(p, "tool_name", "") for p in m.content]
            out.append(("assistant", *kinds))
        elif isinstance(m, ToolMessage):
            out.append(("tool", m.tool_name, str(m.output)))
    return out


def chat(text: str, message_id: str) -> dict[str, object]:
    return {
        "id": "s1",
        "messages": [{"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}],
    }


def until(condition, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:  # type: ignore[no-untyped-def]
    """Wait for ``condition()`` (bounded: the process may have died instead)."""
    for _ in range(600):
        if condition():
            return
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    raise AssertionError(f"never {what}: {log.read_text()[-3000:]}")


def test_a_serve_sigkilled_after_a_committed_step_keeps_that_step_once(tmp_path):
    db, hang_file, log = tmp_path / "s.db", tmp_path / "hang", tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(db, port, hang_file, log)
    try:

        def post() -> None:  # the client, left reading the stream the kill cuts
            try:
                with httpx.Client(timeout=60) as client:
                    with client.stream("POST", f"{url}/api/chat", json=chat("go", "u1")) as r:
                        for _ in r.iter_lines():
                            pass
            except httpx.HTTPError:
                pass

        reader = threading.Thread(target=post, daemon=True)
        reader.start()
        until(hang_file.exists, "ran the second step's tool", proc, log)
        step_0 = [("user", "go"), ("assistant", "looking ", "note"), ("tool", "note", "noted a")]
        until(lambda: shape(stored(db)) == step_0, "committed the first step", proc, log)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        reader.join(30)
        assert shape(stored(db)) == step_0  # the step in flight is gone, nothing else

        proc = serve(db, port, hang_file, log)
        with httpx.Client(timeout=60) as client:
            shown = client.get(f"{url}/api/sessions/s1").json()
        assert [m["role"] for m in shown["ui_messages"]] == ["user", "assistant"]
        tool_parts = [p for p in shown["ui_messages"][1]["parts"] if p["type"] == "tool-note"]
        assert [p["output"] for p in tool_parts] == ["noted a"]
        assert shown["ui_messages"][1]["metadata"]["interrupted"] is True
        with httpx.Client(timeout=60) as client:
            listed = client.get(f"{url}/api/sessions").json()["sessions"]
        assert "running_turn" not in shown["meta"]  # (it names this machine's processes)
        assert ["running_turn" in s["meta"] for s in listed] == [False]
        assert [m.interrupted for m in stored(db).messages if isinstance(m, AssistantMessage)] == [
            True
        ]
        with httpx.Client(timeout=60) as client:
            r = client.post(f"{url}/api/chat", json=chat("more", "u2"))
            assert r.status_code == 200, r.text
        after = stored(db)
        assert shape(after) == [*step_0, ("user", "more"), ("assistant", "answered more")]
        assert [m.interrupted for m in after.messages if isinstance(m, AssistantMessage)] == [
            True,
            False,
        ]
        assert after.meta["running_turn"] is None  # the answer's turn ended: no marker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
