"""An MCP server's listing checked off the event loop: each listed schema's check against
its meta-schema (~0.1-0.5 ms a JSON value) ran on the loop every session streams on. A
listing past ``LISTING_OFF_LOOP_VALUES`` has its tools built in a worker thread, one at a
time, with the same results. Counted by the thread each build ran on, never timed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actors import mcp
from runtime import Agent
from tests.test_mcp_attacks import hostile, offered_tools, run_turn


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Each tool built: its remote name, whether on the event loop's thread."""
    noted: list[tuple[str, bool]] = []
    original = mcp.build_tool

    def noting(config: Any, listed: Any, *args: Any) -> Any:
        noted.append((listed.name, threading.current_thread() is threading.main_thread()))
        return original(config, listed, *args)

    monkeypatch.setattr(mcp, "build_tool", noting)
    return noted


async def test_a_large_listing_is_built_in_a_worker_thread_with_the_same_tools(builds):
    offered: list[list[str]] = []
    agent = Agent(
        provider=offered_tools(offered), tools=[hostile("many-tools", MCP_TEST_TOOLS="300")]
    )
    _, _, actor = await run_turn(agent)
    assert len(builds) == 302 and not any(on_loop for _, on_loop in builds)  # was 302 on it
    assert offered == [["echo", "loop", *(f"t{n}" for n in range(300))]]
    [t7] = [t for t in actor.tools if t.name == "t7"]
    assert t7.validate({"a": 1}) == {"a": 1}
    assert actor.refused == {}


async def test_a_small_listing_is_built_on_the_loop(builds):
    offered: list[list[str]] = []
    agent = Agent(provider=offered_tools(offered), tools=[hostile()])
    await run_turn(agent)
    assert builds == [("echo", True), ("loop", True)]
    assert offered == [["echo", "loop"]]
