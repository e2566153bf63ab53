"""A turn an embedded process left running when it died (SIGKILL after a committed step:
``tests/test_serve_sigkill_step.py`` is the real one) shows interrupted once a host loads
its session (:mod:`runtime.liveness`): the step saves name the turn and its process in
the session's meta, at no statement more; a host that loads a marker naming a dead
process marks the message interrupted, once, and leaves a live process's turn alone.

The liveness decision is tested on a made-up ``/proc`` (every case) and on real
processes (this one, one that exited)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep, current_step, tool_call
from actors.stores.sqlite import SQLiteStore
from actors.turn import saving
from runtime import liveness
from runtime.actor_messages import InferRequest
from runtime.agent import Agent, Hooks
from runtime.app.host import Host
from runtime.liveness import ALIVE, DEAD, RUNNING_META, UNKNOWN, process_state
from runtime.messages import AssistantMessage, TextPart, UserMessage
from runtime.tools import tool

ROOT = Path(__file__).resolve().parent.parent
HOST = os.uname().nodename
BOOT = "11111111-2222-3333-4444-555555555555"
NS = "4026531836"


# -- the liveness decision, on a made-up /proc ---------------------------------------------


def fake_proc(tmp_path: Path, *, pid: int = 4242, start: str = "9000", state: str = "S") -> Path:
    """A ``/proc`` holding a boot id, this process's pid namespace, and process ``pid``
    (its name with a space and a parenthesis, as ``comm`` may be)."""
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (proc / "self/ns").mkdir(parents=True)
    (proc / "self/ns/pid").symlink_to(f"pid:[{NS}]")
    (proc / str(pid)).mkdir()
    fields = [state, *["0"] * 18, start, "0", "0"]  # fields 3.. (22: the start time)
    (proc / str(pid) / "stat").write_text(f"{pid} (a (b) c) {' '.join(fields)}\n")
    return proc


def writer(*, host: str = HOST, boot: str = BOOT, ns: str = NS, pid: int = 4242, start="9000"):
    return f"{host}:{boot}:{ns}:{pid}:{start}"


def test_a_writer_whose_process_is_there_with_its_start_time_is_alive(tmp_path):
    assert process_state(writer(), proc=fake_proc(tmp_path)) == ALIVE


def test_a_pid_another_process_took_since_is_dead(tmp_path):
    assert process_state(writer(start="8999"), proc=fake_proc(tmp_path)) == DEAD


def test_a_pid_that_is_gone_is_dead(tmp_path):
    assert process_state(writer(pid=4343), proc=fake_proc(tmp_path)) == DEAD


def test_a_zombie_is_dead(tmp_path):
    assert process_state(writer(), proc=fake_proc(tmp_path, state="Z")) == DEAD


def test_a_writer_of_this_machine_before_it_restarted_is_dead(tmp_path):
    assert process_state(writer(boot="another-boot"), proc=fake_proc(tmp_path)) == DEAD


def test_a_writer_of_another_machine_is_unknown(tmp_path):
    assert process_state(writer(host="elsewhere"), proc=fake_proc(tmp_path)) == UNKNOWN


def test_a_writer_of_another_pid_namespace_is_unknown(tmp_path):
    assert process_state(writer(ns="4026532000"), proc=fake_proc(tmp_path)) == UNKNOWN


@pytest.mark.parametrize("value", [None, 42, "", "a:b", f"{HOST}:{BOOT}:{NS}:x:1"])
def test_a_writer_that_is_not_one_is_unknown(tmp_path, value):
    assert process_state(value, proc=fake_proc(tmp_path)) == UNKNOWN


def test_without_a_readable_proc_every_writer_is_unknown(tmp_path):
    assert process_state(writer(), proc=tmp_path / "none") == UNKNOWN


# -- the liveness decision, on real processes ----------------------------------------------


def exited_writer() -> str:
    """The writer name of a process that has exited (and been reaped) since."""
    out = subprocess.run(
        [sys.executable, "-c", "from runtime.liveness import this_process as t; print(t())"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip()


def test_this_process_is_alive():
    assert process_state(liveness.this_process()) == ALIVE


def test_a_process_that_exited_is_dead():
    assert process_state(exited_writer()) == DEAD


# -- a host loading a turn a dead process left running -------------------------------------


@tool
async def note(text: str) -> str:
    """Write a note down."""
    return f"noted {text}"


def respond(request: InferRequest) -> list:  # type: ignore[type-arg]
    """``go``: step 0 calls ``note``, step 1 waits an hour; else ``answered <input>``."""
    last = [m for m in request.messages if isinstance(m, UserMessage)][-1]
    if last.content != "go":
        return [f"answered {last.content}"]
    if current_step(request.messages) == 0:
        return ["looking ", *tool_call("note", {"text": "a"}, tool_call_id="call_note")]
    return [Sleep(3600)]


def agent() -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(responder=respond)
    return Agent(name="a", provider=provider, instructions="test", tools=[note]), provider


async def stopped_after_step_0(path: Path) -> None:
    """Run ``go`` in a host on ``path`` and stop it while step 1's model call waits
    (step 0 committed): what a stopped turn stores."""
    the_agent, _ = agent()
    async with Host.open(store=str(path), log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "step-start" and chunk.step == 1:
                    out.cancel("stopped")


async def load(path: Path):  # type: ignore[no-untyped-def]
    store = await SQLiteStore.open(path)
    try:
        return await store.load("s1")
    finally:
        await store.aclose()


async def killed_copy(stopped: Path, path: Path, marker_writer: str) -> None:
    """Store in ``path`` what a process killed where ``stopped`` stopped leaves: the
    same messages, its assistant message not marked, the running marker naming
    ``marker_writer``."""
    record = await load(stopped)
    messages = tuple(
        attrs.evolve(m, interrupted=False) if isinstance(m, AssistantMessage) else m
        for m in record.messages
    )
    (assistant,) = [m for m in messages if isinstance(m, AssistantMessage)]
    marker = {"turn_id": "t-killed", "message_id": assistant.id, "writer": marker_writer}
    store = await SQLiteStore.open(path)
    try:
        meta = {**record.meta, RUNNING_META: marker}
        await store.save("s1", 0, messages, meta, expected_version=0)
    finally:
        await store.aclose()


async def next_request(path: Path) -> InferRequest:
    """The provider request of the session's next turn (``more``) in a new host."""
    the_agent, provider = agent()
    async with Host.open(store=str(path), log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        result = await session.run("more")
    assert result.text == "answered more"
    return provider.requests[-1]


def same_ids(messages):  # type: ignore[no-untyped-def]
    """``messages`` with the new turn's ids (each host makes its own) made one."""
    return [m if i < 3 else attrs.evolve(m, id="new") for i, m in enumerate(messages)]


async def test_a_turn_a_dead_process_left_running_is_stored_and_sent_as_a_stopped_one(
    tmp_path, autojump_clock
):
    stopped, killed = tmp_path / "stopped.db", tmp_path / "killed.db"
    await stopped_after_step_0(stopped)
    stopped_record = await load(stopped)
    assert [m.interrupted for m in stopped_record.messages if m.role == "assistant"] == [True]
    await killed_copy(stopped, killed, exited_writer())
    sent_stopped, sent_killed = await next_request(stopped), await next_request(killed)
    assert same_ids(sent_killed.messages) == same_ids(sent_stopped.messages)
    killed_record = await load(killed)
    assert killed_record.messages[:3] == stopped_record.messages[:3]
    assert killed_record.meta[RUNNING_META] is None


async def test_a_turn_a_live_process_runs_is_left_as_it_is(tmp_path, autojump_clock):
    stopped, running = tmp_path / "stopped.db", tmp_path / "running.db"
    await stopped_after_step_0(stopped)
    await killed_copy(stopped, running, liveness.this_process())  # (this process: alive)
    the_agent, _ = agent()
    async with Host.open(store=str(running), log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        assert [m.interrupted for m in session.messages if m.role == "assistant"] == [False]
    record = await load(running)
    assert [m.interrupted for m in record.messages if m.role == "assistant"] == [False]
    assert record.meta[RUNNING_META]["writer"] == liveness.this_process()


async def test_two_loaders_at_once_mark_the_killed_turn_once(tmp_path, autojump_clock):
    stopped, killed = tmp_path / "stopped.db", tmp_path / "killed.db"
    await stopped_after_step_0(stopped)
    await killed_copy(stopped, killed, exited_writer())
    one, two = await SQLiteStore.open(killed), await SQLiteStore.open(killed)
    try:
        first, second = await one.load("s1"), await two.load("s1")  # both read the marker
        assert first.version == second.version == 1
        settled_one = await liveness.settle(one, first)
        settled_two = await liveness.settle(two, second)  # meets version 2: reads again
    finally:
        await one.aclose()
        await two.aclose()
    assert settled_one.version == settled_two.version == 2  # one save, not two
    assert settled_one == settled_two
    assert [m.interrupted for m in settled_two.messages if m.role == "assistant"] == [True]


# -- what it costs: nothing ----------------------------------------------------------------


def three_steps(request: InferRequest) -> list:  # type: ignore[type-arg]
    step = current_step(request.messages)
    if step < 2:
        return [f"step {step} ", *tool_call("note", {"text": str(step)}, tool_call_id=f"c{step}")]
    return ['{"n": 2}']


ANSWER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


async def statements_of_a_turn(path: Path, output_type: object, responder=three_steps) -> list[str]:
    """The SQLite statements a three-step turn (two tool steps, an answer) runs."""
    provider = ScriptedProvider(responder=responder)
    the_agent = Agent(
        name="a", provider=provider, instructions="test", tools=[note], output_type=output_type
    )
    seen: list[str] = []
    async with Host.open(store=str(path), log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        conn: sqlite3.Connection = host.store._conn  # type: ignore[attr-defined]
        conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())[:24]))
        result = await session.run("go")
        conn.set_trace_callback(None)
    assert result.steps == 3 and result.finish_reason == "stop"
    return seen


@pytest.mark.parametrize("output_type", [None, ANSWER], ids=["text", "structured"])
async def test_the_running_marker_costs_a_turn_no_statement(tmp_path, monkeypatch, output_type):
    marked = await statements_of_a_turn(tmp_path / "marked.db", output_type)
    record = await load(tmp_path / "marked.db")
    assert record.meta[RUNNING_META] is None  # set by its steps, cleared by its last
    monkeypatch.setattr(saving, "running_marker", lambda turn_id, message_id, host=None: None)
    unmarked = await statements_of_a_turn(tmp_path / "unmarked.db", output_type)
    assert RUNNING_META not in (await load(tmp_path / "unmarked.db")).meta
    assert marked == unmarked
    assert marked.count("BEGIN IMMEDIATE") == 3  # a save a step, the last one the final


# -- the same on an embedded host's PostgreSQL store ----------------------------------------


async def step_0_saved(store):  # type: ignore[no-untyped-def]
    """The running marker, once step 0's save (not waited for by the turn) landed."""
    for _ in range(1000):  # (bounded: at most 10 s)
        record = await store.load("s1")
        if record is not None:
            return record.meta[RUNNING_META]
        await trio.sleep(0.01)
    raise AssertionError("step 0 was never saved")


async def test_on_postgresql_a_step_names_its_process_and_a_dead_ones_turn_loads_interrupted(
    pg_url,
):
    from actors.stores import open_store
    from runtime.store import save_keeping

    the_agent, _ = agent()
    async with Host.open(store=pg_url, log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "step-start" and chunk.step == 1:
                    running = await step_0_saved(host.store)
                    assert running["writer"] == liveness.this_process()
                    out.cancel("stopped")
    store = await open_store(pg_url)
    try:
        record = await store.load("s1")
        assert record.meta[RUNNING_META] is None  # the stopped turn's last save cleared it
        (a,) = [i for i, m in enumerate(record.messages) if m.role == "assistant"]
        killed = {**running, "writer": exited_writer()}  # as if its process had died
        await save_keeping(
            store,
            "s1",
            a,
            (attrs.evolve(record.messages[a], interrupted=False), *record.messages[a + 1 :]),
            {RUNNING_META: killed},
            kept=range(1, len(record.messages) - a),
            expected_version=record.version,
        )
        first, second = await store.load("s1"), await store.load("s1")
        assert not first.messages[a].interrupted
        one, two = await liveness.settle(store, first), await liveness.settle(store, second)
        assert one.version == two.version == first.version + 1  # marked once
        assert one == two == await store.load("s1")
        assert one.messages == record.messages and one.meta[RUNNING_META] is None
    finally:
        await store.aclose()


async def test_a_store_that_fails_the_marking_save_still_loads_the_session(tmp_path):
    from runtime.errors import StoreError

    class Failing(SQLiteStore):
        async def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise StoreError("disk full")

    answer = AssistantMessage(id="a1")
    marker = {"turn_id": "t", "message_id": "a1", "writer": exited_writer()}
    store = await SQLiteStore.open(tmp_path / "s.db")
    await store.save("s1", 0, (UserMessage(content="go"), answer), {RUNNING_META: marker})
    await store.aclose()
    store = await Failing.open(tmp_path / "s.db")
    try:
        record = await store.load("s1")
        assert await liveness.settle(store, record) is record
    finally:
        await store.aclose()


async def test_a_host_holding_the_session_marks_another_dead_processs_turn_before_its_next(
    tmp_path, autojump_clock
):
    """Host A holds the session loaded; another process stored a turn in it and died
    mid-way: A's next turn takes that history marked interrupted, as a fresh load does."""
    path = tmp_path / "s.db"
    the_agent, provider = agent()
    async with Host.open(store=str(path), log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        await session.run("hi")
        other = await SQLiteStore.open(path)
        try:
            stored = await other.load("s1")
            killed = (UserMessage(content="go"), AssistantMessage(id="a-killed"))
            marker = {"turn_id": "t", "message_id": "a-killed", "writer": exited_writer()}
            await other.save(
                "s1", 2, killed, {RUNNING_META: marker}, expected_version=stored.version
            )
        finally:
            await other.aclose()
        await session.run("more")
    sent = provider.requests[-1].messages
    assert [m.interrupted for m in sent if isinstance(m, AssistantMessage)] == [False, True, False]
    record = await load(path)
    assert [m.interrupted for m in record.messages if m.role == "assistant"] == [False, True, False]
    assert record.meta[RUNNING_META] is None


def test_show_prints_a_dead_processs_turn_as_interrupted(tmp_path):
    path = tmp_path / "s.db"
    marker = {"turn_id": "t", "message_id": "a1", "writer": exited_writer()}

    async def stored() -> None:
        store = await SQLiteStore.open(path)
        answer = AssistantMessage(id="a1", content=(TextPart(text="half", step=0),))
        await store.save("s1", 0, (UserMessage(content="go"), answer), {RUNNING_META: marker})
        await store.aclose()

    trio.run(stored)
    shown = subprocess.run(
        [sys.executable, "-m", "runtime", "show", "s1", "--store", str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        check=True,
    ).stdout.decode()
    assert "assistant (interrupted)" in shown


# -- a structured answer rejected: the turn goes on, marked as running ---------------------


def rejected_then_waits(request: InferRequest) -> list:  # type: ignore[type-arg]
    """Step 0 answers no JSON (rejected: the turn asks again); step 1 waits an hour."""
    return ["not json"] if current_step(request.messages) == 0 else [Sleep(3600)]


async def test_a_structured_turn_retrying_a_rejected_answer_is_stored_as_running(tmp_path):
    """The rejected answer's step save names the turn running (a kill during the retry
    leaves a marker a later load settles); before, that save cleared it."""
    provider = ScriptedProvider(responder=rejected_then_waits)
    the_agent = Agent(name="a", provider=provider, instructions="test", output_type=ANSWER)
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "step-start" and chunk.step == 1:
                    for _ in range(1000):  # (bounded: step 0's save is not waited for)
                        record = await host.store.load("s1")
                        if record is not None:
                            break
                        await trio.sleep(0.01)
                    running = record.meta.get(RUNNING_META)
                    out.cancel("stopped")
    assert running is not None and running["writer"] == liveness.this_process()
    assert (await load(tmp_path / "s.db")).meta[RUNNING_META] is None  # its end cleared it


def tool_rejected_answer(request: InferRequest) -> list:  # type: ignore[type-arg]
    """A tool step, an answer rejected, the answer."""
    step = current_step(request.messages)
    if step == 0:
        return ["step 0 ", *tool_call("note", {"text": "0"}, tool_call_id="c0")]
    return ["not json"] if step == 1 else ['{"n": 2}']


async def test_marking_a_rejected_structured_answer_as_running_costs_no_statement(
    tmp_path, monkeypatch
):
    marked = await statements_of_a_turn(tmp_path / "m.db", ANSWER, tool_rejected_answer)
    assert (await load(tmp_path / "m.db")).meta[RUNNING_META] is None
    monkeypatch.setattr(saving, "running_marker", lambda turn_id, message_id, host=None: None)
    unmarked = await statements_of_a_turn(tmp_path / "u.db", ANSWER, tool_rejected_answer)
    assert marked == unmarked
    assert marked.count("BEGIN IMMEDIATE") == 3  # a save a step, the last one the final


# -- two processes running turns of one session ---------------------------------------------


async def test_a_turns_final_save_leaves_the_marker_of_another_processs_running_turn(
    tmp_path, autojump_clock
):
    """Process A's turn set its marker at its tool step; process B's turn of the same
    session saved its own marker since (B runs on). A's final save, rebased on B's,
    wrote ``None`` there: B's marker was gone, and B killed then was never marked.
    Now a clearing save that finds another turn's marker leaves it."""
    path = tmp_path / "s.db"
    other = {"turn_id": "t-b", "message_id": "m-b", "writer": exited_writer()}

    async def b_saves_between(event: object) -> None:
        if getattr(event, "step", None) != 1:
            return
        store = await SQLiteStore.open(path)  # process B's step save, as it writes it
        try:
            record = await store.load("s1")
            assert record is not None and record.meta[RUNNING_META]["turn_id"] != "t-b"
            await store.save(
                "s1",
                len(record.messages),
                (),
                {RUNNING_META: other},
                expected_version=record.version,
            )
        finally:
            await store.aclose()

    def answers(request: InferRequest) -> list:  # type: ignore[type-arg]
        if current_step(request.messages) == 0:
            return [*tool_call("note", {"text": "a"}, tool_call_id="call_note")]
        return ["done"]

    provider = ScriptedProvider(responder=answers)
    hooks = Hooks(on_step_start=b_saves_between)
    the_agent = Agent(name="a", provider=provider, tools=[note], hooks=hooks)
    async with Host.open(store=str(path), log_tap=False) as host:
        session = await host.open_session(the_agent, session_id="s1")
        result = await session.run("go")
    assert result.text == "done"
    stored = await load(path)
    assert stored.meta[RUNNING_META] == other
