"""A tool that shields itself from cancellation cannot be stopped (Trio cannot kill a
task): closing the host, or Ctrl-C on ``run`` / ``serve``, waited for it for ever. Now a
cancelled call has the executor's ``abandon_after`` seconds to end; then its task is
abandoned, with an error line naming the tool, and the host closes. ``trio.run`` still
waits for the abandoned task at its very end, which is why the CLI ends its process
itself then (:func:`runtime.app.cli._ending_abandoned`).

The stubborn tool here is released at last after ``RELEASE`` seconds of the autojump
clock, so the test's own ``trio.run`` ends; what is asserted is what happened before."""

from __future__ import annotations

import io
from typing import Any

import orjson
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool
from runtime.logging import configure_logging
from runtime.tools import abandoned_calls

RELEASE = 10_000.0


def stubborn_agent(happened: list[str]) -> Agent:
    @tool
    async def stubborn(x: int) -> str:
        """Shields itself from cancellation."""
        with trio.CancelScope(shield=True):
            await trio.sleep(RELEASE)
        happened.append("the tool ended")
        return "late"

    return Agent(
        provider=ScriptedProvider([tool_call("stubborn", {"x": 1}), ["done"]]), tools=[stubborn]
    )


async def close_during_the_call(agent: Agent, happened: list[str]) -> Any:
    """Start a turn, and close the host while its tool call runs; the turn's result."""
    results: list[Any] = []

    async def consume(session: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "tool-call":
                    task_status.started()
        results.append(out.result)

    async with trio.open_nursery() as nursery:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent, session_id="s")
            await nursery.start(consume, session)
        happened.append("the host closed")
    return results[0]


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


async def test_a_host_closes_past_a_tool_that_shields_itself_from_cancellation(autojump_clock):
    happened: list[str] = []
    result = await close_during_the_call(stubborn_agent(happened), happened)
    assert happened == ["the host closed"]  # before: only once the tool ended
    assert (result.finish_reason, result.abort_reason) == ("aborted", "host shutdown")


async def test_the_abandoned_tool_is_named_in_an_error_line(autojump_clock):
    out = io.StringIO()
    configure_logging("info", stream=out)
    happened: list[str] = []
    await close_during_the_call(stubborn_agent(happened), happened)
    assert abandoned_calls() == 1  # until it ends, at the test's end
    (line,) = [line for line in json_lines(out) if line["event"] == "tool.abandoned"]
    assert (line["level"], line["tool"], line["session_id"]) == ("error", "stubborn", "s")


async def test_a_tool_that_ends_when_cancelled_is_not_abandoned(autojump_clock):
    @tool
    async def patient(x: int) -> str:
        """Sleeps, cancellable."""
        await trio.sleep(RELEASE)
        return "late"

    out = io.StringIO()
    configure_logging("info", stream=out)
    agent = Agent(
        provider=ScriptedProvider([tool_call("patient", {"x": 1}), ["done"]]), tools=[patient]
    )
    happened: list[str] = []
    result = await close_during_the_call(agent, happened)
    assert result.finish_reason == "aborted"
    assert [line for line in json_lines(out) if line["event"] == "tool.abandoned"] == []
    assert abandoned_calls() == 0


async def test_the_cli_ends_its_process_once_its_host_abandoned_a_tool(monkeypatch):
    import runtime.app.cli as cli

    exits: list[int] = []
    monkeypatch.setattr(cli, "abandoned_calls", lambda: 1)
    monkeypatch.setattr(cli.os, "_exit", exits.append)

    async def command(args: Any) -> int:
        return 0

    assert await cli._ending_abandoned(command, None) == 0
    assert exits == [0]  # (trio.run would wait for the abandoned task for ever)


async def test_the_cli_returns_as_usual_when_no_tool_was_abandoned(monkeypatch):
    import runtime.app.cli as cli

    exits: list[int] = []
    monkeypatch.setattr(cli.os, "_exit", exits.append)

    async def command(args: Any) -> int:
        return 3

    assert await cli._ending_abandoned(command, None) == 3
    assert exits == []
