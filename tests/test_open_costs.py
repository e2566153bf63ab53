"""What a fresh session's open and a turn's set-up do, counted (issue 24 goal 1): the
work charged to every turn of a host that opens a session per turn. Pinned as counts
(imports, logger look-ups, pattern compilations), never as timings."""

from __future__ import annotations

import builtins
import re
import sys
from typing import Any

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host


async def test_a_fresh_session_s_open_imports_nothing_after_the_first(tmp_path, monkeypatch):
    """The session's actors' classes are imported on the host's first open and kept:
    a later open runs no ``import`` statement (four ``from`` imports an open before,
    ~2.5 us hot), and asks structlog for no logger (the turn runner's is looked up when
    it writes a line)."""
    import actors.turn.runner as runner_module

    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 3))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        first = await host.open_session(agent, session_id="first")
        await first.run("x")
        await first.close()
        imports: list[str] = []
        loggers: list[str] = []
        real_import, real_get_logger = builtins.__import__, runner_module.get_logger

        def counted_import(name: str, *args: object, **kwargs: object) -> object:
            caller = sys._getframe(1)
            imports.append(f"{name} ({caller.f_code.co_filename}:{caller.f_lineno})")
            return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

        def counted_get_logger(name: str = "axon") -> object:
            loggers.append(name)
            return real_get_logger(name)

        monkeypatch.setattr(runner_module, "get_logger", counted_get_logger)
        monkeypatch.setattr(builtins, "__import__", counted_import)  # (last: it imports)
        session = await host.open_session(agent, session_id="counted")
        monkeypatch.undo()
        assert imports == []  # (actors.engine, actors.mcp, ... before)
        assert loggers == []  # (axon.turn before)
        result = await session.run("y")
        assert result.finish_reason == "stop" and loggers == []  # a turn that goes well
        assert session.runner is not None
        assert session.runner._log is real_get_logger("axon.turn")  # the same logger


async def test_a_session_id_is_checked_without_compiling_its_pattern_again(monkeypatch):
    """``validate_session_id`` (five times a turn) keeps its compiled pattern: no
    ``re.compile`` call, not even a cached one, after the first; a bad id still fails."""
    import pytest

    import runtime.store as store_module
    from runtime.errors import InvalidSessionId

    store_module.validate_session_id("warm")
    compiled: list[str] = []
    real_compile = re.compile

    def counted_compile(pattern: str, flags: int = 0) -> re.Pattern[str]:
        compiled.append(pattern)
        return real_compile(pattern, flags)

    monkeypatch.setattr(store_module.re, "compile", counted_compile)
    assert store_module.validate_session_id("s-1.a:b_c") == "s-1.a:b_c"
    for bad in ("", "a b", "x" * 129, "é", 5):
        with pytest.raises(InvalidSessionId):
            store_module.validate_session_id(bad)  # type: ignore[arg-type]
    assert compiled == []


async def test_a_turn_and_a_close_make_no_stopped_event_nobody_asked_for(tmp_path):
    """A session's three actors each had a ``trio.Event`` made at its close (to be set at
    once) and the controller one at every turn's end (to be asked whether it was set):
    now the event is made when someone waits on it, set already if the actor ended."""
    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        actors = list(session.actors)
        result = await session.run("x")
        assert result.finish_reason == "stop"
        assert [a._stopped for a in actors] == [None, None, None]
        assert not any(a.ended for a in actors)
        await session.close()
        assert [a._stopped for a in actors] == [None, None, None]
        assert all(a.ended for a in actors)
        assert all(a.stopped.is_set() for a in actors)  # made when asked: set already
        await actors[0].stopped.wait()


def _frames_above(frame: object) -> list[str]:
    """The running coroutines' functions above ``frame`` up to the task's root (the
    frame trio's run loop resumed), innermost first."""
    names = []
    frame = frame.f_back  # type: ignore[attr-defined]
    while frame is not None and frame.f_code.co_name != "unrolled_run":
        names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return names


async def test_an_actor_s_task_runs_it_two_frames_below_its_root():
    """An actor started by the host (a session's, at every turn) runs in a task whose
    root is the supervisor's loop: ``Supervisor._supervise``, then ``Actor.run``, then
    the handling (four frames before: ``Host._supervise`` and ``Supervisor.supervise``
    above them, each a coroutine made per task and resumed at every step). An actor
    with an ``on_start`` of its own still has it awaited at its start and after a
    crash; the default one, which does nothing, is not awaited."""
    import trio
    import trio.testing

    from runtime.actor import Actor, RestartPolicy

    seen: list[list[str]] = []
    starts: list[int] = []

    class Probe(Actor):
        async def on_start(self) -> None:
            starts.append(len(seen))

        async def handle(self, message: str) -> None:
            seen.append(_frames_above(sys._getframe()))
            if message == "crash":
                raise RuntimeError("boom")

    async with Host.open(log_tap=False) as host:
        probe = await host.start_actor(Probe(name="probe"), policy=RestartPolicy(intensity=5))
        await probe.send("a")
        await probe.send("crash")
        await probe.send("b")
        await trio.sleep(0.2)  # (the restart's backoff)
    assert seen[0] == ["Actor.run", "Supervisor._supervise"], seen
    assert len(seen) == 3 and starts == [0, 2]  # at its start; after the crash


async def test_opens_of_one_id_at_once_load_it_once_and_share_its_object(tmp_path):
    """Opens of one id at once: the first loads it, the others wait for that load (the
    event they wait on is made by the first of them to wait, not by every open) and
    get the same object; the store is read once."""
    import trio
    import trio.testing

    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]]))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        loads: list[str] = []
        real_load = host.store.load

        async def slow_load(session_id: str) -> object:
            loads.append(session_id)
            await trio.sleep(0.01)  # the others arrive meanwhile
            return await real_load(session_id)

        host.store.load = slow_load  # type: ignore[method-assign]
        got: list[object] = []

        async def open_one() -> None:
            got.append(await host.open_session(agent, session_id="same"))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(open_one)
        assert loads == ["same"] and len(got) == 3 and got[0] is got[1] is got[2]
        assert host._opening == {}
        alone = await host.open_session(agent, session_id="alone")  # nobody waits
        assert loads == ["same", "alone"] and host._opening == {}
        assert (await alone.run("x")).finish_reason == "stop"


async def test_a_turn_s_done_event_is_made_only_when_asked_for(tmp_path):
    """``TurnStream.done`` keeps its meaning (set with the result; waited on by the web
    front ends and the worker), made when first asked for: set already when the turn is
    over, set at its end when asked before. A turn read to its end makes none."""
    import trio
    import trio.testing

    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 3))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream("x") as out:
            texts = [c.text async for c in out if c.type == "text-delta"]
        assert texts == ["hi"] and out._done is None and out.result is not None
        assert out.done.is_set()  # asked after: made set
        await out.done.wait()
        waited: list[bool] = []
        stream = session.stream("y")

        async def wait_done() -> None:
            await stream.done.wait()
            waited.append(stream.result is not None)

        async with trio.open_nursery() as nursery:
            async with stream as out2:
                nursery.start_soon(wait_done)
                await trio.testing.wait_all_tasks_blocked()
                assert not stream.done.is_set() and waited == []
                async for _ in out2:
                    pass
        assert waited == [True]


async def test_a_turn_s_end_keeps_the_message_its_last_step_made(tmp_path, monkeypatch):
    """A turn that ends as its last step did keeps the assistant message that step made
    (its very parts, id, flags and usage) and the history's snapshot with it: two
    assistant messages made a one-delta turn (its empty start, its step's), three before;
    four snapshots, five before. The stored message and the result are the same."""
    from runtime.actor_messages import SessionSnapshot
    from runtime.messages import AssistantMessage

    made = {"messages": 0, "snapshots": 0}
    init, snapshot = AssistantMessage.__init__, SessionSnapshot.__init__

    def counted_init(self: AssistantMessage, *args: object, **kwargs: object) -> None:
        made["messages"] += 1
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    def counted_snapshot(self: SessionSnapshot, *args: object, **kwargs: object) -> None:
        made["snapshots"] += 1  # (made by SessionState.snapshot or by the runner itself)
        snapshot(self, *args, **kwargs)  # type: ignore[arg-type]

    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        warm = await host.open_session(agent, session_id="warm")
        await warm.run("x")
        monkeypatch.setattr(AssistantMessage, "__init__", counted_init)
        monkeypatch.setattr(SessionSnapshot, "__init__", counted_snapshot)
        session = await host.open_session(agent, session_id="s")
        result = await session.run("y")
        counted = dict(made)
        monkeypatch.undo()
        assert counted == {"messages": 2, "snapshots": 4}  # (3 and 5 before)
        assert result.finish_reason == "stop" and result.message.text == "hi"
        assert session.messages[-1] is result.message
        record = await host.store.load("s")
        assert record is not None and record.messages == session.messages


async def test_a_turn_s_actors_wait_on_their_empty_inboxes_without_an_exception(
    tmp_path, monkeypatch
):
    """An actor that waits on its empty inbox (``get``, ``take``: ~18 times a turn) waits
    without a ``WouldBlock`` raised and caught (~2,500 instructions each before); the
    turn's answer is the same. (The saver's one poll a turn: see the next test.)"""
    made: list[object] = []
    real_init = trio.WouldBlock.__init__

    def counted_init(self: trio.WouldBlock, *args: object) -> None:
        taker = sys._getframe(2).f_code  # (1: the inbox's _take)
        if taker.co_name in ("get", "take") and taker.co_filename.endswith("inbox.py"):
            made.append(self)
        real_init(self, *args)

    agent = Agent(provider=ScriptedProvider(turns=[[["hi", " there"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db")) as host:
        session = await host.open_session(agent, session_id="waits")
        monkeypatch.setattr(trio.WouldBlock, "__init__", counted_init)
        result = await session.run("x")
        await trio.testing.wait_all_tasks_blocked()
        monkeypatch.undo()
        assert result.finish_reason == "stop" and result.message.text == "hi there"
        assert made == []


async def test_a_turn_s_save_polls_its_answer_without_an_exception(tmp_path, monkeypatch):
    """The saver looks for the persister's answer without waiting (once a turn, before
    it waits for it): it looks without a ``WouldBlock`` raised and caught (~2,500
    instructions each); the turn's answer and the saved session are the same."""
    made: list[object] = []
    real_init = trio.WouldBlock.__init__

    def counted_init(self: trio.WouldBlock, *args: object) -> None:
        made.append(self)
        real_init(self, *args)

    agent = Agent(provider=ScriptedProvider(turns=[[["hi", " there"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db")) as host:
        session = await host.open_session(agent, session_id="polls")
        monkeypatch.setattr(trio.WouldBlock, "__init__", counted_init)
        result = await session.run("x")
        await trio.testing.wait_all_tasks_blocked()
        monkeypatch.undo()
        assert result.finish_reason == "stop" and result.message.text == "hi there"
        record = await host.store.load("polls")
        assert record is not None and record.messages[-1] == result.message
        assert made == []


async def test_a_turn_s_own_getattr_calls_find_what_they_look_for(tmp_path, monkeypatch):
    """A ``getattr`` with a default that misses builds and drops an AttributeError (its
    message formatted: ~2,500 instructions): a turn's own code (``runtime``, ``actors``)
    makes none, on a fresh session's turn and on the next one (the history a runner
    makes, the persister's look at its store for ``ends_turns``); the same answers."""
    missed: list[str] = []
    real_getattr = builtins.getattr
    nothing = object()

    def counted_getattr(obj: object, name: str, *default: object) -> object:
        found = real_getattr(obj, name, nothing)
        if found is nothing:
            caller = sys._getframe(1).f_code.co_filename
            if re.search(r"[/\\](runtime|actors)[/\\]", caller):
                missed.append(f"{type(obj).__name__}.{name} ({caller})")
            return real_getattr(obj, name, *default)
        return found

    agent = Agent(provider=ScriptedProvider(turns=[[["hi"]]] * 3))
    async with Host.open(store=str(tmp_path / "s.db")) as host:
        first = await host.open_session(agent, session_id="warm")
        await first.run("x")
        await first.close()
        monkeypatch.setattr(builtins, "getattr", counted_getattr)
        session = await host.open_session(agent, session_id="looked")
        one = await session.run("y")
        two = await session.run("z")
        await trio.testing.wait_all_tasks_blocked()
        monkeypatch.undo()
        assert one.message.text == "hi" and two.message.text == "hi"
        record = await host.store.load("looked")
        assert record is not None and record.messages[-1] == two.message
        assert missed == []


async def test_a_turn_s_own_code_raises_no_exception_it_catches_again(tmp_path):
    """A plain turn (a fresh session, a streamed answer, the save) builds no exception in
    ``runtime`` or ``actors`` code, but a coroutine's or an iterator's end: each built,
    raised and caught costs ~2,500 instructions (issue 24 goal 1). Two were: the
    saver's poll's ``WouldBlock`` and the ``GeneratorExit`` closing a generator of the
    running turns that a stream made for every turn and never read (and the tagged
    classes' look-up's, made when a class is first unstructured)."""
    seen: list[str] = []
    ours = re.compile(r"[/\\](runtime|actors)[/\\]")

    def traced(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            return traced if ours.search(frame.f_code.co_filename) else None
        if event == "exception" and arg[0] not in (StopIteration, StopAsyncIteration):
            seen.append(f"{arg[0].__name__} ({frame.f_code.co_filename}:{frame.f_lineno})")
        return traced

    agent = Agent(provider=ScriptedProvider(turns=[[["hi", " there"]]] * 2))
    async with Host.open(store=str(tmp_path / "s.db")) as host:
        first = await host.open_session(agent, session_id="warm")
        await first.run("x")
        texts: list[str] = []
        sys.settrace(traced)
        try:
            session = await host.open_session(agent, session_id="traced")
            async with session.stream("y") as out:
                async for chunk in out:
                    if chunk.type == "text-delta":
                        texts.append(chunk.text)
            await trio.testing.wait_all_tasks_blocked()
        finally:
            sys.settrace(None)
        assert "".join(texts) == "hi there" and out.result is not None
        record = await host.store.load("traced")
        assert record is not None and record.messages[-1] == out.result.message
        assert seen == []


def test_a_history_is_made_with_both_counts_set(monkeypatch):
    """A :class:`History` is made with its edit count and readers set before its
    ``__init__`` runs (which then reads them plainly, no ``getattr`` of an unset slot);
    a fresh one has counted one edit, an ``__init__`` again counts another and lowers its
    readers' watermarks as before; a copy keeps the count and adds its own edit."""
    import copy

    from runtime.actor_messages import History

    bare = History.__new__(History)
    assert bare.edits == -1 and bare._marks == []
    history = History(["a", "b"])
    assert history == ["a", "b"] and history.edits == 0
    mark = history.watch()
    history.__init__(["c"])
    assert history == ["c"] and history.edits == 1 and mark.low == 0
    copied = copy.copy(history)
    assert copied == ["c"] and type(copied) is History and copied.edits >= 1


def test_a_provider_s_endpoint_origin_and_price_key_import_nothing_after_the_first(
    monkeypatch,
):
    """A provider's :attr:`endpoint` (three times a turn), :attr:`origin` (twice) and
    :meth:`price_key` keep what they import at their first use: no ``import`` statement
    after it (seven a turn before, ~7,600 instructions each); the same answers."""
    from actors.providers.anthropic import AnthropicProvider, span_can_start

    provider = AnthropicProvider("claude-x", base_url="https://api.anthropic.com", api_key="k")
    client = provider._get_client()
    first = (provider.endpoint, provider.origin, provider.price_key(), span_can_start(client))
    imports: list[str] = []
    real_import = builtins.__import__

    def counted_import(name: str, *args: object, **kwargs: object) -> object:
        imports.append(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", counted_import)
    again = (provider.endpoint, provider.origin, provider.price_key(), span_can_start(client))
    monkeypatch.undo()
    assert imports == []
    assert again == first and first[0] == "https://api.anthropic.com"


def test_a_stream_s_readers_slots_and_gemini_s_chunks_import_nothing_after_the_first(
    monkeypatch,
):
    """What reads a stream (the Anthropic and OpenAI readers, a learned slot, Gemini's
    chunk decoder) keeps ``orjson`` once imported: no ``import`` statement after the first
    stream (three to four a turn before, and one per Gemini chunk, ~1,300 instructions
    each); the same answers."""
    import json
    from types import SimpleNamespace

    from actors.providers import anthropic, gemini_wire, openai

    event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}
    event["delta"]["text"] = "hi"
    data = json.dumps(event).encode()
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}], "obfuscation": "abc"}
    chunk_data = json.dumps(chunk).encode()

    def read_all() -> tuple[Any, ...]:
        stream = SimpleNamespace(response=None)
        readers = (anthropic._EventReader(stream, True), openai._ChunkReader(None, True))
        slot = anthropic.learn(
            data, event, b'"text":', anthropic._delta_text, anthropic._put_delta_text
        )
        two = openai.learn(
            chunk_data,
            chunk,
            b'"content":',
            openai._text_or_none,
            openai._put_text,
            pad=openai._OBFUSCATION,
        )
        assert slot is not None and two is not None
        return (
            [r.loads(data) for r in readers],
            slot.text(data),
            type(two).__name__,
            two.text(chunk_data),
            gemini_wire._decode(b'{"a": 1}'),
        )

    first = read_all()
    imports: list[str] = []
    real_import = builtins.__import__

    def counted_import(name: str, *args: object, **kwargs: object) -> object:
        imports.append(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", counted_import)
    again = read_all()
    monkeypatch.undo()
    assert imports == []
    assert again == first
    assert first == ([event, event], "hi", "TwoStringSlot", "hi", {"a": 1})
