"""A turn's passes over its session's whole history (issue 24 goal 1), counted.

Every model call repairs the history (:class:`runtime.history.RepairedHistory`) and
every change of it is published as a snapshot (``TurnRunner._publish_history``): each
copy or comparison of the whole session is a cost every step pays per message held
(at 40,000 messages a copy is ~0.13 ms here). The counts are of element visits through
a list that notes every slice, iteration and comparison of more than half of it.
"""

from __future__ import annotations

import collections
import sys
from types import SimpleNamespace

import actors.turn.runner
import runtime.history
from actors.providers import ScriptedProvider
from runtime import Agent, Host
from runtime.actor_messages import History
from runtime.history import RepairedHistory, repair
from runtime.messages import AssistantMessage, TextPart, UserMessage

N = 400


class Noting(History):
    """A session's history that counts its whole-size reads (a slice, an iteration, a
    comparison of more than half of it), by the function that made them."""

    reads: collections.Counter[str] = collections.Counter()

    def _note(self, n: int) -> None:
        if n > len(self) // 2:
            frame = sys._getframe(2)
            Noting.reads[frame.f_code.co_name] += 1

    def __iter__(self):
        self._note(len(self))
        return super().__iter__()

    def __getitem__(self, key):
        got = super().__getitem__(key)
        if isinstance(key, slice):
            self._note(len(got))
        return got

    def __eq__(self, other):
        self._note(len(self))
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


def history(turns: int) -> list:
    out: list = []
    for _ in range(turns):
        out += [UserMessage(content="u"), AssistantMessage(content=(TextPart(text="a", step=0),))]
    return out


def test_a_call_after_a_turn_was_added_reads_the_history_once_and_copies_it_once():
    repaired = RepairedHistory()
    messages = Noting(history(N))
    repaired(messages)
    head = repaired._repaired
    messages += history(1)  # the next turn's user message and answer
    messages.append(UserMessage(content="and now?"))
    Noting.reads.clear()
    out = repaired(messages)
    assert dict(Noting.reads) == {"__call__": 1}  # the kept part's check (two copies before)
    assert list(out) == repair(list(messages))
    # The repaired head was not copied to add the turn to it (the answer is its one copy).
    assert repaired._repaired is head and len(repaired._added) == 4  # (the last turn and this)


def test_a_history_primed_from_a_tuple_is_kept_for_the_list_after():
    repaired = RepairedHistory()
    start = [*history(3), UserMessage(content="go")]
    first = repaired(tuple(start))  # (primed off the loop: a tuple)
    messages = Noting(start)
    messages += history(1)
    Noting.reads.clear()
    again = repaired(messages)
    assert dict(Noting.reads) == {"__call__": 1}
    assert again[:6] == first[:6]
    assert list(again) == repair(list(messages))


async def test_a_turn_reads_its_long_session_whole_three_times():
    """The snapshot after the turn's start (its user message added), the one after its
    step (the answer in place: a copy, compared), and the repair before the model call:
    3 (7 before). The turn's end and its save's answer find the history not edited since
    (``History.edits``) and copy nothing."""
    provider = ScriptedProvider(responder=lambda _request: ["ok"], keep_requests=0)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), "long", history=history(N))
        await session.run("warm")
        runner = session.runner
        runner.state.messages = Noting(runner.state.messages)
        await session.run("again")  # (the runner takes the new list in: one copy more)
        Noting.reads.clear()
        result = await session.run("and again")
        messages = session.messages
    assert result.finish_reason == "stop"
    assert dict(Noting.reads) == {"snapshot": 1, "_publish_history": 1, "__call__": 1}
    assert messages[-1] is result.message and len(messages) == 2 * N + 6


async def test_a_turn_of_a_long_session_compares_no_message_by_identity(monkeypatch):
    """The kept repair and the snapshot compare by identity (a message equal to another
    may hold values of other types) only after an edit below the kept part or a copy
    that compared equal: a turn that adds to the history compares nothing so."""
    compared: collections.Counter[str] = collections.Counter()

    def counted(where: str) -> SimpleNamespace:
        def is_(a: object, b: object) -> bool:
            compared[where] += 1
            return a is b

        return SimpleNamespace(is_=is_)

    monkeypatch.setattr(runtime.history, "operator", counted("repair"))
    monkeypatch.setattr(actors.turn.runner, "operator", counted("snapshot"))
    provider = ScriptedProvider(responder=lambda _request: ["ok"], keep_requests=0)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), "long", history=history(N))
        await session.run("warm")
        compared.clear()
        await session.run("again")
        await session.run("and again")
        assert not compared
        session.runner.state.messages[3] = session.messages[3]  # an edit, in the kept part
        await session.run("once more")
    assert compared["repair"] == 2 * N + 4  # the kept part (its last turn's end), once


def test_every_edit_of_a_history_is_counted():
    h = History([UserMessage(content="a")])
    edits = [
        lambda: h.append(UserMessage(content="b")),
        lambda: h.extend([UserMessage(content="c")]),
        lambda: h.insert(0, UserMessage(content="d")),
        lambda: h.remove(h[0]),
        lambda: h.pop(),
        lambda: h.__setitem__(0, UserMessage(content="e")),
        lambda: h.__setitem__(slice(0, 1), [UserMessage(content="f")]),
        lambda: h.__delitem__(slice(1, None)),
        lambda: h.__iadd__([UserMessage(content="g")]),
        lambda: h.__imul__(2),
        lambda: h.reverse(),
        lambda: h.sort(key=id),
        lambda: h.clear(),
    ]
    for n, edit in enumerate(edits, 1):
        edit()
        assert h.edits == n
    h += [UserMessage(content="h")]
    assert type(h) is History and h.edits == len(edits) + 1


async def test_a_plain_list_a_plugin_assigned_is_taken_in_once(monkeypatch):
    """``runner.state.messages = [...]`` (a plug-in's plain list, uncounted) is made the
    runner's counted History at its next publication: the kept repair compares the
    session by identity once, for the new list, and no more on the steps and turns
    after (each step paid a pass over the whole session while it stayed a plain list)."""
    from tests.test_busy import Script, look, looking

    compared: collections.Counter[str] = collections.Counter()

    def is_(a: object, b: object) -> bool:
        compared["repair"] += 1
        return a is b

    monkeypatch.setattr(runtime.history, "operator", SimpleNamespace(is_=is_))
    script = Script(["ok"], looking("L1"), looking("L2"), ["done"], looking("L3"), ["again"])
    provider = ScriptedProvider(responder=script, keep_requests=0)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=provider, tools=[look]), "long", history=history(N)
        )
        await session.run("warm")
        runner = session.runner
        runner.state.messages = list(runner.state.messages)  # a plug-in's plain list
        compared.clear()
        await session.run("three steps")
        assert compared["repair"] == 2 * N  # the kept part, once: not at each step
        assert type(runner.state.messages) is History
        compared.clear()
        await session.run("two steps")
        assert not compared
        assert len(script.requests) == 6
        assert session.messages == tuple(runner.state.messages)


async def test_a_turn_with_a_client_message_id_reads_no_more_of_its_long_session():
    """A turn whose user message carries the client's id (every chat POST's) asks whether
    the session holds that id already: a look-up in the runner's kept ids, not a pass
    over the history (``_user_id``'s was one per turn, a cost growing with the session)."""
    provider = ScriptedProvider(responder=lambda _request: ["ok"], keep_requests=0)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), "long", history=history(N))
        await session.run("warm")
        runner = session.runner
        runner.state.messages = Noting(runner.state.messages)
        async with session.stream("again", user_message_id="c1") as out:
            await out.collect()  # (the runner takes the new list in: its ids read once)
        Noting.reads.clear()
        async with session.stream("and again", user_message_id="c2") as out:
            await out.collect()
        messages = session.messages
    assert dict(Noting.reads) == {"snapshot": 1, "_publish_history": 1, "__call__": 1}
    assert [m.id for m in messages[-4::2]] == ["c1", "c2"]


def test_kept_message_ids_answer_as_a_scan_after_every_kind_of_edit():
    from runtime.history import MessageIds

    def msg(i: int) -> UserMessage:
        return UserMessage(content="u", id=f"m{i}")

    h = History([msg(i) for i in range(6)])
    ids = MessageIds()
    edits = [
        lambda: h.append(msg(6)),
        lambda: h.extend([msg(7), msg(0)]),  # (an id twice)
        lambda: h.pop(),
        lambda: h.__delitem__(slice(5, None)),  # (a regenerate's cut)
        lambda: h.__setitem__(slice(0, 2), [msg(8)]),  # (a reload's new prefix)
        lambda: h.insert(1, msg(9)),
        lambda: h.remove(h[0]),
        lambda: list.append(h, msg(10)),  # (list's own: not noted by the History)
        lambda: list.__setitem__(h, len(h) - 1, msg(11)),
        lambda: list.__delitem__(h, slice(2, None)),
        lambda: h.clear(),
    ]
    for edit in [lambda: None, *edits]:
        edit()
        for i in range(12):
            assert ids.holds(h, f"m{i}") == any(m.id == f"m{i}" for m in h), (i, list(h))
    h += [msg(1), msg(2)]
    ids.holds(h, "m1")
    ids.read = 0
    h += [msg(3), msg(4)]
    assert ids.holds(h, "m4") and not ids.holds(h, "m5")
    assert ids.read == 2  # the messages added since, not the history


class NotingTuple(tuple):
    """A snapshot's messages that count the passes over them."""

    passes = 0

    def __iter__(self):
        NotingTuple.passes += 1
        return super().__iter__()


async def test_a_busy_sessions_check_of_a_new_messages_id_reads_no_history():
    """``Session.holds_input`` (a message arriving while a turn runs) asks the runner's
    kept ids whether the history stores the id: it scanned the snapshot, a pass over
    the session per message that found it busy."""
    import attrs

    provider = ScriptedProvider(responder=lambda _request: ["ok"], keep_requests=0)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), "long", history=history(N))
        async with session.stream("warm", user_message_id="c1") as out:
            await out.collect()  # (the runner's ids read)
        runner = session.runner
        runner.snapshot = attrs.evolve(
            runner.snapshot, messages=NotingTuple(runner.snapshot.messages)
        )
        NotingTuple.passes = 0
        read = runner._ids.read
        held = [await session.holds_input(i) for i in ("c1", "c2", "c3")]
        # (the ids of the warm turn's own two messages, added after its start: read once)
        assert (NotingTuple.passes, runner._ids.read - read) == (0, 2)
    assert held == ["stored", None, None]


async def test_a_long_sessions_message_ids_are_read_a_chunk_per_loop_step(monkeypatch):
    """The runner's kept ids of a session are read at its first turn with a client id:
    at most ``MessageIds.chunk`` messages per loop step, not the whole session in one
    (600,000 messages stalled every session of the process)."""
    import trio

    monkeypatch.setattr(runtime.history.MessageIds, "chunk", 16)
    provider = ScriptedProvider(responder=lambda _request: ["ok"], keep_requests=0)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), "long", history=history(N))
        ids = session.runner._ids
        most = []

        class Steps(trio.abc.Instrument):
            read = 0

            def before_task_step(self, task):
                self.read = ids.read

            def after_task_step(self, task):
                most.append(ids.read - self.read)

        steps = Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            async with session.stream("again", user_message_id="c1") as out:
                await out.collect()
        finally:
            trio.lowlevel.remove_instrument(steps)
    assert ids.read == 2 * N and max(most) == 16


async def test_a_message_arriving_at_a_busy_long_session_reads_its_ids_a_chunk_per_step(
    monkeypatch,
):
    """A message with a client id arriving while a turn with none runs (so the runner
    read no ids yet) is checked against the session's ids (``holds_input``): read at
    most ``MessageIds.chunk`` per loop step before the check, not in one."""
    import trio
    import trio.testing

    from tests import test_busy

    monkeypatch.setattr(runtime.history.MessageIds, "chunk", 16)
    test_busy.held["open"], test_busy.held["release"] = trio.Event(), trio.Event()
    script = test_busy.Script(test_busy.holding(), ["one"], ["two"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(
            test_busy.agent_with(script, "enqueue"), "long", history=history(N)
        )
        ids = session.runner._ids
        most = []

        class Steps(trio.abc.Instrument):
            read = 0

            def before_task_step(self, task):
                self.read = ids.read

            def after_task_step(self, task):
                most.append(ids.read - self.read)

        async def first() -> None:
            async with session.stream("first") as out:
                await out.collect()

        async def second() -> None:
            async with session.stream("second", user_message_id="c2") as out:
                await out.collect()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await test_busy.held["open"].wait()
            steps = Steps()
            trio.lowlevel.add_instrument(steps)
            try:
                nursery.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()  # (it waits in the queue)
                test_busy.held["release"].set()
            finally:
                trio.lowlevel.remove_instrument(steps)
            read = ids.read  # (all of it, for the check: the first turn read none)
    assert read >= 2 * N and max(most) <= 16


async def test_a_direct_question_of_a_long_sessions_ids_reads_them_a_chunk_per_step(
    monkeypatch,
):
    """``Session.holds_input`` asked directly (not through a stream, which reads the ids
    before it) of a session whose runner read no ids yet: read at most
    ``MessageIds.chunk`` per loop step, not the whole session in one."""
    import trio

    monkeypatch.setattr(runtime.history.MessageIds, "chunk", 16)
    provider = ScriptedProvider(responder=lambda _request: ["ok"], keep_requests=0)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), "long", history=history(N))
        ids = session.runner._ids
        most = []

        class Steps(trio.abc.Instrument):
            read = 0

            def before_task_step(self, task):
                self.read = ids.read

            def after_task_step(self, task):
                most.append(ids.read - self.read)

        steps = Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            held = await session.holds_input("c9")
        finally:
            trio.lowlevel.remove_instrument(steps)
    assert held is None and ids.read == 2 * N and max(most) == 16
