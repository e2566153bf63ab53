"""A waiting session whose deadline passed while no host had it open: the first host to
load it denies the wait ``timed out`` and resumes the turn, once, however many hosts open
it at once (the expiry is a version-checked save, like a decision: of two, one is
recorded, and only its host resumes the turn). In one process and in two."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio
import trio.testing

from runtime.app.host import Host
from runtime.events import ToolApprovalExpired, TurnFinished
from runtime.messages import AssistantMessage, ToolMessage
from runtime.store import SessionRecord
from tests.support.approval_tools import clear_ran, ran  # noqa: F401 (fixture)
from tests.test_approval_expiry import EPOCH, agent

ROOT = Path(__file__).resolve().parent.parent


async def waiting_past_its_deadline(path: Path) -> None:
    """Store session ``s`` waiting for an approval whose deadline passed long ago."""
    async with Host.open(store=path, log_tap=False) as host:
        host.clock = lambda: EPOCH  # (2023: any host opened now is past EPOCH + 60)
        await (await host.open_session(agent(60), session_id="s")).run("go")


def turn_of(record: SessionRecord | None) -> tuple[list[str], list[str]]:
    """The stored texts of the assistant messages, and the results of the tool messages."""
    assert record is not None
    texts = [m.text for m in record.messages if isinstance(m, AssistantMessage)]
    tools = [m.error or m.output for m in record.messages if isinstance(m, ToolMessage)]
    return texts, tools


TIMED_OUT = ["the tool call was denied: timed out"]


async def test_two_hosts_opening_an_expired_wait_at_once_deny_it_and_resume_it_once(tmp_path):
    path = tmp_path / "s.db"
    await waiting_past_its_deadline(path)
    the_agent = agent(60)
    expired: list[str] = []
    finished: list[str] = []
    done, go = trio.Event(), trio.Event()

    async def listen(events) -> None:  # type: ignore[no-untyped-def]
        async for event in events.inbox:
            if isinstance(event, ToolApprovalExpired):
                expired.append(event.turn_id)
            else:
                finished.append(event.turn_id)
                done.set()

    async def open_it(task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        async with Host.open(store=path, log_tap=False) as host, trio.open_nursery() as inner:
            inner.start_soon(listen, host.bus.subscribe([ToolApprovalExpired, TurnFinished]))
            task_status.started()
            await go.wait()
            await host.open_session(the_agent, session_id="s")
            await done.wait()  # (either host's resumption)
            await trio.testing.wait_all_tasks_blocked()
            inner.cancel_scope.cancel()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(open_it)
            await nursery.start(open_it)
            go.set()
    async with Host.open(store=path, log_tap=False) as host:
        record = await host.store.load("s")
    assert len(expired) == 1 and len(finished) == 1
    assert turn_of(record) == (["answered"], TIMED_OUT)
    assert ran == []


OPENER = """
import json, sys, trio
from runtime.app.host import Host
from runtime.events import ToolApprovalExpired, TurnFinished
from tests.test_approval_expiry import agent

async def main(path):
    seen = []
    async with Host.open(store=path, log_tap=False) as host:
        events = host.bus.subscribe([ToolApprovalExpired, TurnFinished], name="t")
        print("ready", flush=True)
        sys.stdin.readline()
        await host.open_session(agent(60), session_id="s")
        await trio.testing.wait_all_tasks_blocked()
        while True:
            try:
                seen.append(type(events.inbox.get_nowait()).__name__)
            except trio.WouldBlock:
                if "ToolApprovalExpired" in seen and "TurnFinished" not in seen:
                    seen.append(type(await events.inbox.get()).__name__)
                    continue
                break
    print(json.dumps(seen), flush=True)

import trio.testing
trio.run(main, sys.argv[1])
"""


def test_two_processes_opening_an_expired_wait_at_once_deny_it_and_resume_it_once(tmp_path):
    path = tmp_path / "s.db"
    trio.run(waiting_past_its_deadline, path)
    env = {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        for proc in openers:  # both hold the store open, then both load the session
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in openers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        seen = [json.loads(proc.communicate(timeout=60)[0]) for proc in openers]
    finally:
        for proc in openers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sorted(seen) == [[], ["ToolApprovalExpired", "TurnFinished"]]

    async def stored() -> SessionRecord | None:
        async with Host.open(store=path, log_tap=False) as host:
            return await host.store.load("s")

    assert turn_of(trio.run(stored)) == (["answered"], TIMED_OUT)
