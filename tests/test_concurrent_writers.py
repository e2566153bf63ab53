"""Two writers on one session never lose a turn (issue 11, item 3).

Two processes on one SQLite file (or a ``serve`` holding a session while the CLI adds to
it) used to save from the index each had loaded, so the later save overwrote the
earlier one's turn. Now every save is based on a version, a save that meets a newer one
is rebased (reload, then append), and a turn starts on the stored history. The tests go
from the pure rebase rule, through two hosts in one process, to the issue's own
reproduction with two real ``python -m runtime run`` processes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores import MemoryStore, SQLiteStore
from actors.turn.session_sync import adopt_record, adopt_save
from runtime import Agent, Host, tool
from runtime import events as ev
from runtime.actor_messages import (
    InferRequest,
    SaveRequest,
    SaveResult,
    SessionState,
    SteeredInput,
)
from runtime.errors import AnsweredElsewhere
from runtime.messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.store import SessionRecord, rebase

ROOT = Path(__file__).resolve().parents[1]

# -- a valid history ----------------------------------------------------------------------


def check_history(messages: Sequence[Message]) -> list[str]:
    """Assert ``messages`` is a valid conversation; return its user prompts in order.

    Valid: every user message is followed by one assistant message, and every assistant
    message by exactly the tool messages of its tool calls, in call order; each message
    appears once.
    """
    assert len({m.id for m in messages}) == len(messages), "a message is stored twice"
    prompts: list[str] = []
    i = 0
    while i < len(messages):
        user = messages[i]
        assert isinstance(user, UserMessage), f"message {i} is a {user.role}, not a user's"
        prompts.append(user.content)
        assistant = messages[i + 1]
        assert isinstance(assistant, AssistantMessage), f"message {i + 1} should answer {user}"
        calls = [p.tool_call_id for p in assistant.content if isinstance(p, ToolCallPart)]
        results = messages[i + 2 : i + 2 + len(calls)]
        assert [r.tool_call_id for r in results if isinstance(r, ToolMessage)] == calls
        i += 2 + len(calls)
    return prompts


# -- the rebase rule ----------------------------------------------------------------------


def user(n: str) -> UserMessage:
    return UserMessage(content=n, id=f"u-{n}")


def answer(n: str, text: str = "ok") -> AssistantMessage:
    return AssistantMessage(content=(TextPart(text=text, step=0),), id=f"a-{n}")


def test_rebase_drops_our_earlier_copy_and_keeps_the_other_writers_turn():
    ours_partial = [user("a"), answer("a", "half")]
    theirs = [user("b"), answer("b")]
    stored = [user("0"), answer("0"), *ours_partial, *theirs]
    ours = [user("a"), answer("a", "whole")]
    base, start = rebase(stored, ours)
    assert base == (user("0"), answer("0"), *theirs)
    assert start == 2  # the first stored message that is not kept in place
    assert check_history(base + tuple(ours)) == ["0", "b", "a"]


def test_rebase_refuses_our_message_answered_by_the_other_writer():
    """The same message posted to two processes at once: both ran a turn. Dropping the
    stored copy of ours stored ``[their answer, ours, our answer]`` (branch twinserve)."""
    stored = [user("0"), answer("0"), user("a"), answer("a-theirs")]
    with pytest.raises(AnsweredElsewhere) as caught:
        rebase(stored, [user("a"), answer("a")])
    assert caught.value.message_id == "u-a"
    # Our own step's copy after it, or their next message (a user's), is no answer.
    assert rebase([*stored[:3], user("b")], [user("a"), answer("a")]) == (
        (user("0"), answer("0"), user("b")),
        2,
    )
    assert rebase([*stored[:3], answer("a", "half")], [user("a"), answer("a")])[1] == 2


def test_reloading_drops_our_unsaved_turn_of_a_message_the_other_writer_answered():
    """Its save refused (AnsweredElsewhere), the turn stayed in memory: the next turn's
    reload rebased it, ``[.., their answer, ours, our answer]``. Now it goes."""
    state = SessionState(
        session_id="s", messages=[user("0"), answer("0"), user("a"), answer("a", "mine")]
    )
    state.saved_upto, state.version = 2, 1
    theirs = [user("0"), answer("0"), user("a"), answer("a-theirs", "theirs")]
    store = MemoryStore()

    async def main():
        await store.save("s", 0, theirs)
        return await store.load("s")

    adopt_record(state, trio.run(main))
    assert state.messages == theirs
    assert (state.saved_upto, state.version) == (4, 1)


def test_a_rebased_step_save_does_not_take_in_a_message_the_turn_steered_in_since():
    """Our step's save was rebased after the other writer's turn of a message that was
    also steered into our turn since (the same message posted to both). Adopting it
    held that message twice, and the next save, based on the rebased version, wrote
    both copies in place (the interleavings property, branch rebaseprop). Now the next
    save meets the store's version and its rebase refuses it (the stored answer stands)."""
    state = SessionState(
        session_id="s", messages=[user("0"), answer("0"), user("b"), answer("b", "step 0")]
    )
    state.saved_upto, state.version = 2, 2
    req = SaveRequest(
        request_id="r", session_id="s", turn_id="t", start=2, messages=tuple(state.messages[2:])
    )
    state.messages += [user("x"), answer("b2")]  # "x" steered in after the request
    stored = (user("0"), answer("0"), user("x"), answer("x-theirs"))
    result = SaveResult(request_id="r", session_id="s", version=4, base=stored)
    adopt_save(state, req, result)
    assert len({m.id for m in state.messages}) == len(state.messages)
    assert state.version != result.version  # the next save is not written in place
    with pytest.raises(AnsweredElsewhere):  # it is rebased, and refused
        rebase(stored + tuple(req.messages), state.messages[state.saved_upto :])


def test_reloading_drops_two_unsaved_turns_the_other_writers_answered_in_reverse_order():
    """Two unsaved turns of ours (a store that failed both saves), each message also
    posted to another process, whose answers the store holds in the other order: the
    reload raised the second ``AnsweredElsewhere`` out of the turn's start (branch
    rebaseprop; the interleavings property's layout). Both turns go."""
    state = SessionState(session_id="s", messages=[user("1"), answer("1"), user("2"), answer("2")])
    theirs = [user("2"), answer("2-theirs"), user("1"), answer("1-theirs")]
    adopt_record(state, SessionRecord(session_id="s", messages=tuple(theirs), version=2))
    assert state.messages == theirs
    assert (state.saved_upto, state.version) == (4, 2)


@given(
    layout=st.lists(st.sampled_from(["theirs", "ours-copy"]), max_size=12),
    ours_count=st.integers(min_value=0, max_value=4),
)
def test_rebase_keeps_every_message_once_and_the_stored_order(layout, ours_count):
    ours = [UserMessage(content=f"o{i}", id=f"o{i}") for i in range(ours_count)]
    stored: list[Message] = []
    copies = iter(ours)
    for n, kind in enumerate(layout):
        copy = next(copies, None) if kind == "ours-copy" else None
        stored.append(copy or UserMessage(content=f"t{n}", id=f"t{n}"))
    base, start = rebase(stored, ours)
    merged = base + tuple(ours)
    assert len({m.id for m in merged}) == len(merged)  # nothing twice
    assert {m.id for m in stored} <= {m.id for m in merged}  # nothing stored is lost
    theirs = [m for m in stored if m.id.startswith("t")]
    assert list(base) == theirs  # the other writer's messages, in their order
    assert base[:start] == tuple(stored[:start])  # a save from ``start`` writes the rest


def test_adopting_a_rebased_save_takes_the_stores_layout_and_keeps_ours_after_it():
    state = SessionState(session_id="s", messages=[user("0"), answer("0"), user("a")])
    state.saved_upto, state.version = 2, 1
    req = SaveRequest(request_id="r", session_id="s", turn_id="t", start=2, messages=(user("a"),))
    result = SaveResult(
        request_id="r",
        session_id="s",
        version=3,
        base=(user("0"), answer("0"), user("b"), answer("b")),
    )
    state.messages.append(answer("a"))  # the turn went on while the save was written
    adopted = adopt_save(state, req, result)
    stored_now = [user("0"), answer("0"), user("b"), answer("b")]
    assert state.messages == [*stored_now, user("a"), answer("a")]
    assert (state.saved_upto, state.version) == (5, 3)
    assert (adopted.shift, adopted.added, adopted.dropped) == (2, 2, 0)


def test_reloading_keeps_what_this_session_had_not_saved_yet():
    state = SessionState(session_id="s", messages=[user("0"), answer("0"), user("a"), answer("a")])
    state.saved_upto, state.version = 2, 1  # the save of turn "a" failed (disk full, say)
    store = MemoryStore()

    async def main():
        await store.save("s", 0, [user("0"), answer("0"), user("b"), answer("b")])
        return await store.load("s")

    adopted = adopt_record(state, trio.run(main))
    assert check_history(state.messages) == ["0", "b", "a"]
    assert (state.saved_upto, state.version, adopted.added) == (4, 1, 2)


def test_reloading_over_a_stored_copy_of_ours_is_rebased_not_written_over_the_other_turn():
    """Turn "a" had a step stored, its last save failed, and another writer's turn "b"
    was stored after that step. The reload keeps "a" after "b", and the next save never
    writes "a" over "b": once it started after the rebased prefix on the version read,
    as if the store held that prefix (the chaos run found it, a lost turn's copy over the
    session's later turns; tests/test_worker_lost_history.py)."""
    state = SessionState(session_id="s", messages=[user("0"), answer("0"), user("a"), answer("a")])
    state.saved_upto, state.version = 2, 2  # "a"'s step is stored, its last save failed
    stored = [user("0"), answer("0"), user("a"), answer("a", "half"), user("b"), answer("b")]
    store = MemoryStore()

    async def main():
        await store.save("s", 0, stored)
        return await store.load("s")

    record = trio.run(main)
    adopt_record(state, record)
    assert check_history(state.messages) == ["0", "b", "a"]
    # The next save holds "a" alone, on a version that is not the store's (branch
    # rebaseprop; it saved from the store's copy of "a" before, "b" sent as ours): it
    # meets the store's, and its rebase drops the stored copy of "a", "b" kept.
    assert state.messages[state.saved_upto :] == [user("a"), answer("a")]
    assert state.version != record.version
    ours = state.messages[state.saved_upto :]
    base, start = rebase(stored, ours)
    assert check_history(stored[:start] + list(base[start:]) + ours) == ["0", "b", "a"]


def test_a_reload_over_a_stored_copy_of_ours_does_not_save_the_other_writers_turn_as_ours():
    """Our turn "a" had step 0 stored, its last save failed; the other writer's turn
    "b" has step 0 stored after it, and goes on. The reload put "b" before "a" and the
    next save sent ``[b's user, b's step 0, a...]`` as ours: "b" saved its step 1 (a
    call and its result) first, so that save met a conflict, and its rebase took our copy
    of "b" for ours: "b"'s step 1 gone, its result left first in the session (the
    interleavings property, branch rebaseprop). Now our next save holds ours alone."""
    state = SessionState(session_id="s", messages=[user("a"), answer("a", "whole")])
    state.saved_upto, state.version = 0, 1  # "a"'s step 0 is stored (v1), its last save failed
    b_step_0 = answer("b", "step 0")
    stored = (user("a"), answer("a", "step 0"), user("b"), b_step_0)
    adopt_record(state, SessionRecord(session_id="s", messages=stored, version=2))
    call = ToolCallPart(tool_call_id="c", tool_name="t", input={}, step=1)
    b_step_1 = AssistantMessage(content=(*b_step_0.content, call), id="a-b")
    result = ToolMessage(tool_call_id="c", tool_name="t", step=1, id="t-c")
    stored_now = (*stored[:3], b_step_1, result)  # "b"'s next save, version 3
    assert state.version != 3  # our next save meets it and is rebased
    ours = state.messages[state.saved_upto :]
    base, start = rebase(stored_now, ours)
    written = stored_now[:start] + base[start:] + tuple(ours)
    assert check_history(written) == ["b", "a"]
    assert written[1] == b_step_1


# -- two hosts on one session -------------------------------------------------------------


class Gates:
    """Tool calls named ``wait`` block until the test opens the gate for their prompt."""

    def __init__(self) -> None:
        self.events: dict[str, trio.Event] = {}
        self.entered: dict[str, trio.Event] = {}

    def gate(self, prompt: str) -> trio.Event:
        return self.events.setdefault(prompt, trio.Event())

    def reached(self, prompt: str) -> trio.Event:
        return self.entered.setdefault(prompt, trio.Event())


def gated_agent(gates: Gates) -> Agent:
    """Every turn: a ``note`` call (step 0), a ``wait`` call (step 1), then an answer."""

    @tool
    async def note(prompt: str) -> str:
        """Write a note."""
        return f"noted {prompt}"

    @tool
    async def wait(prompt: str) -> str:
        """Wait for the test."""
        gates.reached(prompt).set()
        await gates.gate(prompt).wait()
        return f"waited {prompt}"

    def respond(request: InferRequest) -> list:
        prompt = next(m for m in reversed(request.messages) if isinstance(m, UserMessage)).content
        step = current_step(request.messages)
        if step == 0:
            return tool_call("note", {"prompt": prompt}, tool_call_id=f"{prompt}-note")
        if step == 1:
            return tool_call("wait", {"prompt": prompt}, tool_call_id=f"{prompt}-wait")
        return [f"done {prompt}"]

    return Agent(name="gated", provider=ScriptedProvider(responder=respond), tools=[note, wait])


def drain(sub) -> list:
    out = []
    while True:
        try:
            out.append(sub.inbox.get_nowait())
        except trio.WouldBlock:
            return out


@pytest.fixture(params=["sqlite", "memory"])
def store_spec(request, tmp_path):
    """Both hosts' store: the same SQLite file (two connections), or one MemoryStore."""
    if request.param == "sqlite":
        return lambda: str(tmp_path / "shared.db")
    shared = MemoryStore()
    return lambda: shared


async def test_two_hosts_interleaving_turns_on_one_session_keep_every_turn(store_spec):
    gates = Gates()
    for prompt in ("b1", "b2"):
        gates.gate(prompt).set()  # B's turns run straight through
    async with (
        Host.open(store=store_spec(), log_tap=False) as host_a,
        Host.open(store=store_spec(), log_tap=False) as host_b,
    ):
        seen_a = host_a.bus.subscribe([ev.ConcurrentWrite])
        seen_b = host_b.bus.subscribe([ev.ConcurrentWrite])
        saved_a = host_a.bus.subscribe([ev.SessionSaved])
        a = await host_a.open_session(gated_agent(gates), session_id="s")
        b = await host_b.open_session(gated_agent(gates), session_id="s")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.run, "a1")
                await saved_a.inbox.get()  # a1's step 0 is in the store...
                await gates.reached("a1").wait()  # ...and a1 waits in step 1
                await b.run("b1")  # B starts on the stored history, a1's first step included
                gates.gate("a1").set()  # a1's next save meets b1: rebased after it
            await b.run("b2")  # B takes a1's whole turn in before b2
        stored = (await host_a.store.load("s")).messages
        assert check_history(stored) == ["b1", "a1", "b2"]
        assert b.messages == stored
        assert a.messages == stored[:-4]  # A has not run a turn since b2
        assert stored[5].text == "done a1"  # a1's whole turn, not its first step only
        (rebased,) = drain(seen_a)  # b1's 4 messages came in ahead of a1's
        assert (rebased.resolution, rebased.added, rebased.dropped) == ("rebased", 4, 0)
        assert [e.resolution for e in drain(seen_b)] == ["reloaded", "reloaded"]


async def test_two_hosts_starting_a_new_session_at_once_keep_both_turns(store_spec):
    gates = Gates()
    async with (
        Host.open(store=store_spec(), log_tap=False) as host_a,
        Host.open(store=store_spec(), log_tap=False) as host_b,
    ):
        a = await host_a.open_session(gated_agent(gates), session_id="new")
        b = await host_b.open_session(gated_agent(gates), session_id="new")
        results = {}

        async def run(session, prompt):
            results[prompt] = await session.run(prompt)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, a, "a1")
                nursery.start_soon(run, b, "b1")
                await gates.reached("a1").wait()
                await gates.reached("b1").wait()  # both turns have saved step 0 at index 0
                gates.gate("a1").set()
                gates.gate("b1").set()
        assert all(r.error is None for r in results.values())
        stored = (await host_a.store.load("new")).messages
        assert sorted(check_history(stored)) == ["a1", "b1"]
        assert all(m.text.startswith("done") for m in stored if isinstance(m, AssistantMessage))


async def test_a_session_held_open_sees_turns_another_writer_added(tmp_path):
    """What ``serve`` needs: its open session takes in the CLI's turn before its next."""
    path = str(tmp_path / "s.db")
    seen: list[list[str]] = []

    def respond(request: InferRequest) -> list:
        seen.append([m.content for m in request.messages if isinstance(m, UserMessage)])
        return ["ok"]

    def agent() -> Agent:  # one per host: a provider actor belongs to one host
        return Agent(provider=ScriptedProvider(responder=respond))

    async with Host.open(store=path, log_tap=False) as server:
        held = await server.open_session(agent(), session_id="s")
        await held.run("from serve 1")
        async with Host.open(store=path, log_tap=False) as cli:
            await (await cli.open_session(agent(), session_id="s")).run("from the cli")
        await held.run("from serve 2")
    assert seen[-1] == ["from serve 1", "from the cli", "from serve 2"]
    store = await SQLiteStore.open(path)
    try:
        stored = (await store.load("s")).messages
    finally:
        await store.aclose()
    assert check_history(stored) == ["from serve 1", "from the cli", "from serve 2"]


# -- the reproduction: two real processes ------------------------------------------


def start_cli(store: Path, prompt: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime",
            "run",
            "--jsonl",
            "--store",
            str(store),
            "--session",
            "s",
            "--delay",
            "0.01",  # a turn takes a while, so the two processes overlap
            prompt,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_two_cli_processes_on_one_store_lose_no_turn(tmp_path):
    store = tmp_path / "x.db"
    prompts = []
    for round_ in range(3):
        pair = {f"Weather in City{p}{round_}?": None for p in "AB"}
        for proc in [start_cli(store, prompt) for prompt in pair]:
            _, err = proc.communicate(timeout=120)
            # exit 0, or a clear conflict message: never a silent loss
            assert proc.returncode == 0 or "StoreConflict" in err, err
        prompts += pair
    check = subprocess.run(
        [sys.executable, "-m", "runtime", "show", "s", "--store", str(store), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert check.returncode == 0, check.stderr
    from runtime import serde

    stored = serde.from_json(check.stdout, list[Message])
    assert sorted(check_history(stored)) == sorted(prompts)


# -- a writer that keeps winning ----------------------------------------------------------


class Contested(MemoryStore):
    """A memory store where another writer appends a turn just before each of our
    version-checked saves, while ``rivals`` is set: every such save meets a conflict."""

    def __init__(self) -> None:
        super().__init__()
        self.rivals = True
        self.rival_turns = 0

    async def save(self, session_id, start, messages, meta=None, *, expected_version=None):
        if self.rivals and expected_version is not None:
            record = await self.load(session_id)
            n = 0 if record is None else len(record.messages)
            self.rival_turns += 1
            rival = f"rival {self.rival_turns}"
            await super().save(session_id, n, [user(rival), answer(rival)])
        return await super().save(
            session_id, start, messages, meta, expected_version=expected_version
        )


async def test_a_save_overtaken_every_time_fails_clearly_and_loses_nothing():
    store = Contested()
    agent = Agent(provider=ScriptedProvider([["hello"]]))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        with trio.fail_after(10):
            result = await session.run("mine")
        # what the user sees: the answer, and an error saying the save lost the race
        assert result.text == "hello"
        assert result.error is not None and result.error.kind == "StoreConflict"
        assert "another writer saved it" in result.error.message
        # what is saved: every rival turn, untouched; ours is still in the session
        stored = (await store.load("s")).messages
        assert check_history(stored) == [f"rival {n}" for n in range(1, store.rival_turns + 1)]
        assert [m.content for m in session.messages if isinstance(m, UserMessage)] == ["mine"]
        store.rivals = False  # the other writer stops: the next turn saves both turns
        await session.run("again")
        stored = (await store.load("s")).messages
        assert check_history(stored)[-2:] == ["mine", "again"]
        assert session.messages == stored


# -- the log line: a warning, except where other writers are normal ------------------------


async def concurrent_writer_logs(*, expects_other_writers: bool) -> list[dict]:
    """The ``session.concurrent-writer`` lines of a host whose session takes in a turn
    another host saved (as a worker's does when the session's previous turn ran on
    another worker)."""
    from structlog.testing import capture_logs

    from runtime import configure_logging

    shared = MemoryStore()

    def agent() -> Agent:
        return Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))

    configure_logging("debug")
    try:
        with capture_logs() as logs:
            async with (
                Host.open(store=shared, log_tap=False) as here,
                Host.open(store=shared, log_tap=False) as elsewhere,
            ):
                here.expects_other_writers = expects_other_writers
                session = await here.open_session(agent(), session_id="s")
                await session.run("first")
                await (await elsewhere.open_session(agent(), session_id="s")).run("second")
                await session.run("third")
    finally:
        configure_logging("warning")
    return [line for line in logs if line["event"] == "session.concurrent-writer"]


async def test_a_concurrent_writer_is_a_warning_on_a_host_that_does_not_expect_one():
    (line,) = await concurrent_writer_logs(expects_other_writers=False)
    assert (line["log_level"], line["resolution"], line["added"]) == ("warning", "reloaded", 2)


async def test_a_concurrent_writer_is_a_debug_line_on_a_host_that_expects_other_writers():
    (line,) = await concurrent_writer_logs(expects_other_writers=True)
    assert (line["log_level"], line["resolution"], line["added"]) == ("debug", "reloaded", 2)


async def test_a_worker_host_expects_other_writers(pg_url):
    from runtime.app.worker import open_worker

    agent = Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))
    async with open_worker(pg_url, agent=agent, poll=0.05) as worker:
        assert worker.host is not None and worker.host.expects_other_writers


async def test_a_message_steered_in_that_another_host_answered_is_not_stored_twice(tmp_path):
    """The same message ``x`` sent to host B as a new turn and steered into host A's
    running turn (a client's retry on another server). B stores ``[x, its answer]`` while
    A's step 0 runs; A's step 0 save meets it and is rebased after it, ``x`` is steered
    into A's turn at the boundary (A's history does not hold it yet). A's final save
    was based on the rebased version and stored ``x`` a second time, answered twice (the
    interleavings property, branch rebaseprop). Now it is rebased whole and refused."""
    gate, entered = trio.Event(), trio.Event()

    @tool
    async def hold() -> str:
        """Hold step 0 until the test lets go."""
        entered.set()
        await gate.wait()
        return "held"

    def respond_a(request: InferRequest) -> list:
        if current_step(request.messages) == 0:
            return tool_call("hold", {}, tool_call_id="call-hold")
        return ["A's answer"]

    agent_a = Agent(name="a", provider=ScriptedProvider(responder=respond_a), tools=[hold])
    agent_b = Agent(name="b", provider=ScriptedProvider(responder=lambda _: ["B's answer"]))
    steers = [[SteeredInput(content="x", user_message_id="u-x")]]

    async def pull() -> list[SteeredInput]:
        return steers.pop() if steers else []

    path = str(tmp_path / "shared.db")
    results: dict = {}
    async with (
        Host.open(store=path, log_tap=False) as host_a,
        Host.open(store=path, log_tap=False) as host_b,
    ):
        a = await host_a.open_session(agent_a, session_id="s")
        b = await host_b.open_session(agent_b, session_id="s")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                stream = a.stream("a", user_message_id="u-a")
                stream.steer_from(pull)

                async def run_a() -> None:
                    async with stream as out:
                        await out.collect()
                    results["a"] = out.result

                nursery.start_soon(run_a)
                await entered.wait()  # A's step 0 runs, nothing of its turn stored
                async with b.stream("x", user_message_id="u-x") as out_b:
                    await out_b.collect()
                gate.set()
        stored = (await host_a.store.load("s")).messages
    ids = [m.id for m in stored]
    assert ids.count("u-x") == 1, ids
    assert [m.text for m in stored[:2]] == ["x", "B's answer"]  # B's answer stands
    assert out_b.result.saved
    assert not results["a"].saved and results["a"].error is not None  # A is told so
