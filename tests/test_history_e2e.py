"""A session's history kept three ways stays one history: what the store holds (SQLite),
``session.messages`` (the runner's published snapshot) and what the model is sent (the
kept repair), across steering, an approval, a fallback that rolls back a streamed step,
a cancelled turn, a plug-in's edit of the runner's list, and a reload from the store."""

from __future__ import annotations

from typing import Any

import attrs
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Host, RetryPolicy, Summarize
from runtime.compaction import SUMMARY_INSTRUCTIONS, is_summary
from runtime.errors import Overloaded
from runtime.history import INTERRUPTED, RepairedHistory, repair
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from tests.test_busy import Script, delete_file, hold, look
from tests.test_busy import held as gate  # the tools test_busy holds a step open with


def busy() -> Overloaded:
    return Overloaded("overloaded", provider="scripted", status_code=529)


def plain(messages: Any) -> list:
    """Equal but for the ids of the ``interrupted`` results repair makes (new each time)."""
    return [attrs.evolve(m, id="") for m in messages]


def gates() -> None:
    gate["open"], gate["release"] = trio.Event(), trio.Event()


async def agree(host: Any, session: Any, script: Script, asked: int) -> tuple:
    """The store, ``session.messages`` and the model's first request since ``asked`` (if
    any) say the same; the store's messages."""
    record = await host.store.load("s")
    assert record is not None
    stored = record.messages
    assert tuple(session.messages) == tuple(stored)
    assert session.state.saved_upto == len(stored)
    runner = session.runner
    assert tuple(runner.state.messages) == tuple(stored)
    full = plain(repair(stored))
    for request in script.requests[asked:]:
        # Each call was sent the store's history, repaired, up to its turn's last user
        # message (what follows is the turn's own, still growing then).
        sent = request.messages
        k = max(i for i, m in enumerate(sent) if isinstance(m, UserMessage))
        assert plain(sent[:k]) == full[:k]
        assert sent[k] in stored
    return stored


async def test_store_session_and_requests_agree_across_every_kind_of_edit(tmp_path):
    path = tmp_path / "s.db"
    primary = Script(
        [*tool_call("look", {}, tool_call_id="L")],  # turn 1: a tool result
        [*tool_call("hold", {}, tool_call_id="H")],  # held while a message steers in
        ["answer to both"],
        [*tool_call("delete_file", {"path": "x"}, tool_call_id="D")],  # turn 2: approval
        ["deleted it"],
        ["partial ", busy()],  # turn 3: streams, then fails: the backup's step replaces it
        [*tool_call("hold", {}, tool_call_id="C")],  # turn 4: cancelled while its tool runs
        ["last"],  # turn 6 (turn 5 is the backup's alone: the primary failed over)
    )
    backup = Script(["backup answer"])

    def agent() -> Agent:
        return Agent(
            provider=[
                ScriptedProvider(responder=primary, name="primary"),
                ScriptedProvider(responder=backup, name="backup"),
            ],
            tools=[hold, look, delete_file],
            on_busy="steer",
            retry=RetryPolicy(max_attempts=1),
        )

    gates()
    async with Host.open(store=str(path), log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        results: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                results["first"] = await session.run("first")

            nursery.start_soon(first)
            await gate["open"].wait()

            async def steer() -> None:
                async with session.stream("also this") as out:
                    async for _ in out:
                        pass

            nursery.start_soon(steer)
            await trio.testing.wait_all_tasks_blocked()
            gate["release"].set()
        assert results["first"].text == "answer to both"
        stored = await agree(host, session, primary, 0)
        assert [m.text for m in stored if isinstance(m, UserMessage)] == ["first", "also this"]

        asked = len(primary.requests)
        waiting = await session.run("delete x")
        assert waiting.finish_reason == "awaiting-input"
        await agree(host, session, primary, asked)
        (pending,) = session.pending
        result = await session.respond(pending.approval_id, approved=True)
        assert result is not None and result.text == "deleted it"
        await agree(host, session, primary, asked)

        asked = len(primary.requests)
        fell = await session.run("fall over")
        assert fell.text == "backup answer"
        stored = await agree(host, session, primary, asked)
        assert "partial" not in stored[-1].text

        gates()
        asked = len(primary.requests)
        async with trio.open_nursery() as nursery:

            async def cut() -> None:
                async with session.stream("cut me") as out:
                    results["cut"] = out
                    async for _ in out:
                        pass

            nursery.start_soon(cut)
            await gate["open"].wait()
            results["cut"].cancel("enough")
        stored = await agree(host, session, primary, asked)
        assert stored[-1].error is not None  # the held call's result: interrupted

        # A plug-in's edit of the runner's list, bypassing History's counting: the next
        # turn publishes and saves it, and the model is sent it.
        runner = session.runner
        note = UserMessage(content="a note a plug-in added")
        list.append(runner.state.messages, note)
        asked = len(primary.requests)
        last = await session.run("and now?")
        assert last.text == "last"
        stored = await agree(host, session, primary, asked)
        assert note in stored and note in primary.requests[-1].messages

        # A plug-in's `state.messages = [...]`: a plain list, not counted; still published.
        other = UserMessage(content="another note")
        runner.state.messages = [*runner.state.messages, other]
        primary.steps.append(["plain"])
        asked = len(primary.requests)
        assert (await session.run("and then?")).text == "plain"
        stored = await agree(host, session, primary, asked)
        assert other in stored and other in primary.requests[-1].messages
        kept = tuple(session.messages)

    async with Host.open(store=str(path), log_tap=False) as host:  # a fresh load
        session = await host.open_session(agent(), session_id="s")
        assert tuple(session.messages) == kept
        primary.steps.append(["after the reload"])
        asked = len(primary.requests)
        again = await session.run("after the reload?")
        assert again.text == "after the reload"
        stored = await agree(host, session, primary, asked)
        assert stored[: len(kept)] == kept
        sent = primary.requests[-1].messages
        assert plain(sent[: len(kept)]) == plain(repair(kept))


# -- the kept repair across folds, summaries, superseded calls and a reload ------------------


class Checked:
    """A session runner's kept repair, checked against a full repair at every call."""

    def __init__(self, kept: Any) -> None:
        self.kept, self.calls = kept, 0

    def __call__(self, messages: Any) -> tuple:
        out = self.kept(messages)
        assert plain(out) == plain(repair(list(messages)))
        self.calls += 1
        return out

    def rest(self) -> None:
        self.kept.rest()


BROKEN = [
    UserMessage(content="stored"),
    AssistantMessage(content=(ToolCallPart(tool_call_id="X", tool_name="look", input={}, step=0),)),
    ToolMessage(tool_call_id="Z", tool_name="look", output="orphan", step=0),  # answers no call
]


async def test_the_kept_repair_holds_across_folds_summaries_and_superseded_calls(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(RepairedHistory, "FOLD", 2)  # a fold every turn or two
    path = str(tmp_path / "s.db")
    store = await SQLiteStore.open(path)
    try:
        await store.save("s", 0, BROKEN)  # a stored call without its result
    finally:
        await store.aclose()
    summaries = {"n": 0}

    def respond(request: Any) -> list:
        if request.instructions == SUMMARY_INSTRUCTIONS:
            summaries["n"] += 1
            return [f"summary {summaries['n']}"]
        sent = request.messages
        k = max(i for i, m in enumerate(sent) if isinstance(m, UserMessage))
        text = sent[k].text if not any(isinstance(m, ToolMessage) for m in sent[k:]) else ""
        if "ask" in text:  # waits for approval
            return [*tool_call("delete_file", {"path": "y"}, tool_call_id=f"D{text}")]
        if "look" in text:
            return [*tool_call("look", {}, tool_call_id=f"L{text}")]
        return ["an answer of some length " * 4]

    def agent() -> Agent:
        return Agent(
            provider=ScriptedProvider(responder=respond),
            tools=[look, delete_file],
            history_processors=[Summarize(max_tokens=400, keep_turns=2)],
        )

    inputs = ["look", "ask", "superseding", "look again", "plain", "ask again", "x" * 3]
    checked: list[Checked] = []
    for round_ in range(2):  # the second round starts from a fresh load of the store
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(agent(), session_id="s")
            runner = session.runner
            check = Checked(runner._repaired)
            runner._repaired = check
            checked.append(check)
            for n, text in enumerate(inputs * 2):
                await session.run(f"{text} {round_}.{n}")  # an asking turn waits; the
                record = await host.store.load("s")  # next user message supersedes it
                assert record is not None
                assert tuple(session.messages) == record.messages
                assert tuple(runner.state.messages) == record.messages
            kept = tuple(session.messages)
        async with Host.open(store=path, log_tap=False) as host:
            assert tuple((await host.open_session(agent(), session_id="s")).messages) == kept
    assert summaries["n"] >= 2  # summaries were stored, in the middle of the history
    assert all(c.calls >= 14 for c in checked)
    assert sum(is_summary(m) for m in kept) == summaries["n"]
    assert any(getattr(m, "error", None) == INTERRUPTED for m in repair(kept))  # X answered
    superseded = [m for m in kept if isinstance(m, ToolMessage) and "supersed" in str(m.error)]
    assert len(superseded) == 8  # every asking turn, by the next user message


async def test_an_interrupting_message_and_a_retried_step_leave_one_history(tmp_path):
    """``on_busy="interrupt"`` cuts the running turn (its held call interrupted) for the
    new message; a step that streamed and then failed ends its turn with what it
    streamed and the error; one that failed before any output is retried by the same
    provider (no delay: ``initial_delay=0``)."""
    path = str(tmp_path / "s.db")
    script = Script(
        [*tool_call("hold", {}, tool_call_id="H")],  # cut by the next message
        ["the new message's answer"],
        ["half an answer ", busy()],  # streams, then fails: the turn fails, kept as cut
        [busy()],  # fails before any output: retried
        ["a whole answer"],
        ["last"],
    )
    agent = Agent(
        provider=ScriptedProvider(responder=script),
        tools=[hold],
        on_busy="interrupt",
        retry=RetryPolicy(max_attempts=2, initial_delay=0, jitter=0),
    )
    gates()
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        results: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                results["first"] = await session.run("first")

            nursery.start_soon(first)
            await gate["open"].wait()
            results["second"] = await session.run("instead")
        assert results["second"].text == "the new message's answer"
        stored = await agree(host, session, script, 0)
        assert [m.text for m in stored if isinstance(m, UserMessage)] == ["first", "instead"]
        assert any(isinstance(m, ToolMessage) and m.error is not None for m in stored)

        asked = len(script.requests)
        failed = await session.run("fail")
        assert failed.error is not None and failed.text == "half an answer "
        stored = await agree(host, session, script, asked)
        assert stored[-1].error is not None
        asked = len(script.requests)
        retried = await session.run("retry")
        assert retried.text == "a whole answer" and len(script.requests) == asked + 2
        stored = await agree(host, session, script, asked)
        asked = len(script.requests)
        await session.run("and last")
        stored = await agree(host, session, script, asked)
        kept = tuple(session.messages)
    async with Host.open(store=path, log_tap=False) as host:
        assert tuple((await host.open_session(agent, session_id="s")).messages) == kept


async def test_two_writers_interleaved_keep_each_runners_repair_whole(tmp_path, monkeypatch):
    """Two hosts hold one stored session open and take turns: each runner takes in the
    other's turns before its own (its history's saved part replaced by the store's, an
    edit below its folded head), with calls left unanswered on both sides."""
    monkeypatch.setattr(RepairedHistory, "FOLD", 2)
    path = str(tmp_path / "s.db")

    def respond(request: Any) -> list:
        sent = request.messages
        k = max(i for i, m in enumerate(sent) if isinstance(m, UserMessage))
        if "cut" in sent[k].text and not any(isinstance(m, ToolMessage) for m in sent[k:]):
            return [*tool_call("hold", {}, tool_call_id=f"H{sent[k].text}")]
        return ["ok"]

    def agent() -> Agent:  # one per host: a provider actor belongs to one host
        return Agent(provider=ScriptedProvider(responder=respond), tools=[hold])

    async with (
        Host.open(store=path, log_tap=False) as a,
        Host.open(store=path, log_tap=False) as b,
    ):
        sessions = [await a.open_session(agent(), "s"), await b.open_session(agent(), "s")]
        checks, streams = [], {}
        for session in sessions:
            check = Checked(session.runner._repaired)
            session.runner._repaired = check
            checks.append(check)
        for n in range(12):
            host, session = ((a, sessions[0]), (b, sessions[1]))[(n // 3) % 2]
            text = f"{'cut' if n % 4 == 1 else 'turn'} {n}"
            if text.startswith("cut"):  # cut while its tool runs: its call interrupted
                gates()
                async with trio.open_nursery() as nursery:

                    async def go(session: Any = session, text: str = text) -> None:
                        async with session.stream(text) as out:
                            streams["out"] = out
                            async for _ in out:
                                pass

                    nursery.start_soon(go)
                    await gate["open"].wait()
                    streams["out"].cancel("enough")
            else:
                assert (await session.run(text)).error is None
            record = await host.store.load("s")
            assert record is not None and tuple(session.messages) == record.messages
            users = [m.text for m in record.messages if isinstance(m, UserMessage)]
            assert users == [f"{'cut' if i % 4 == 1 else 'turn'} {i}" for i in range(n + 1)]
    assert all(c.calls >= 6 for c in checks)
