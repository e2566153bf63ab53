"""What a continuation writes to an embedded SQLite store (issue 21: suspending and
resuming should cost about a step commit). The continuation's first save sends its turn
from the user message on; the store holds that message and the waiting assistant
message (as the decision stored it) already, so only the tool's result is written. The
statements are read from SQLite's trace callback."""

from __future__ import annotations

from pathlib import Path

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Host, tool
from runtime.messages import AssistantMessage, ToolMessage, UserMessage
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)


def agent() -> Agent:
    steps = [tool_call("delete_file", {"path": "/x"}, tool_call_id="D"), ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


def transactions(statements: list[str]) -> list[list[str]]:
    """The statements between each ``BEGIN`` and its ``COMMIT``."""
    found: list[list[str]] = []
    for statement in statements:
        if statement.startswith("BEGIN"):
            found.append([])
        elif statement.startswith("COMMIT"):
            continue
        elif found:
            found[-1].append(statement)
    return found


def message_writes(transaction: list[str]) -> list[str]:
    return [s for s in transaction if "messages" in s.split("(")[0] and "SELECT" not in s[:8]]


async def test_a_continuation_writes_only_the_tool_result_of_the_step_it_continues(
    tmp_path: Path,
) -> None:
    statements: list[str] = []
    async with Host.open(store=str(tmp_path / "s.db")) as host:
        session = await host.open_session(agent(), session_id="s")
        waiting = await session.run("go")
        await session.decide(waiting.pending[0].approval_id, approved=True)
        host.store._conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        async with session.resume() as out:
            async for _ in out:
                pass
        host.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
        assert out.result is not None and out.result.text == "done"
        first, last = transactions(statements)
        # the result's save: one row inserted, at the tool message's place; nothing deleted
        assert len(message_writes(first)) == 1
        assert message_writes(first)[0].startswith("INSERT INTO messages")
        assert "'s', 2, 'tool'" in message_writes(first)[0]
        assert len(message_writes(last)) == 1  # the answer's step: the assistant message
        record = await host.store.load("s")
    assert record is not None
    user, answer, result = record.messages
    assert isinstance(user, UserMessage) and user.content == "go"
    assert isinstance(answer, AssistantMessage) and answer.text == "done"
    call = answer.content[0]
    assert call.awaiting is not None and call.awaiting.decided and call.awaiting.approved  # type: ignore[union-attr]
    assert isinstance(result, ToolMessage) and result.output == "deleted /x"
    assert ran == ["/x"]


async def test_a_continuation_whose_session_another_writer_saved_meanwhile_keeps_nothing_stale(
    tmp_path: Path,
) -> None:
    """The record the continuation began from is the store's only at its version: a
    writer that saves while the approved tool runs moves it, and the result's save is
    rebased onto that writer's rows (nothing of either lost, nothing kept that moved; as
    before the continuation kept rows)."""
    path = str(tmp_path / "s.db")

    @tool(needs_approval=True)
    async def meddle() -> str:
        """Another writer saves the session while this runs."""
        other = await SQLiteStore.open(path)
        try:
            record = await other.load("s")
            assert record is not None
            await other.save(
                "s",
                len(record.messages),
                [UserMessage(content="other", id="other")],
                expected_version=record.version,
            )
        finally:
            await other.aclose()
        return "meddled"

    steps = [tool_call("meddle", {}, tool_call_id="M"), ["done"]]
    async with Host.open(store=path) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[meddle]), session_id="s"
        )
        waiting = await session.run("go")
        await session.decide(waiting.pending[0].approval_id, approved=True)
        async with session.resume() as out:
            async for _ in out:
                pass
        assert out.result is not None and out.result.text == "done"
        record = await host.store.load("s")
    assert record is not None
    users = [m.content for m in record.messages if isinstance(m, UserMessage)]
    assert sorted(users) == ["go", "other"]  # (the turn rebased after the other's)
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [r.output for r in results] == ["meddled"]
    answers = [m for m in record.messages if isinstance(m, AssistantMessage)]
    assert len(answers) == 1 and answers[0].text == "done"
