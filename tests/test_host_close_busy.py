"""What a message waiting for its session's running turn gets when the host closes
(docs/embedding.md, "Many sessions on one host"): ``ClosedWhileWaiting``, both a
``SessionBusy`` (what it raised before: a caller's ``except SessionBusy`` still
catches it) and a ``HostClosed`` (what to do: send it again to a new host), saying the
host is shutting down, with ``host.shutting_down`` set; nothing of it stored; sent
again to a new host on the same store, it runs."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from runtime import ClosedWhileWaiting, Host, HostClosed, SessionBusy
from runtime.messages import UserMessage
from tests.test_busy import Script, agent_with, held, holding


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


# (``interrupt`` waits too, but only while the turn it cut ends: here at once)
@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])
async def test_a_message_waiting_for_the_running_turn_gets_session_busy_as_the_host_closes(
    tmp_path: Any, on_busy: str
) -> None:
    path = str(tmp_path / "s.db")
    refused: list[tuple[BaseException, bool]] = []

    async def send(host: Host, session: Any) -> None:
        try:
            await session.run("waiting")
        except SessionBusy as exc:
            refused.append((exc, host.shutting_down))

    async with trio.open_nursery() as nursery:
        async with Host.open(store=path, log_tap=False) as host:
            script = Script(holding(), ["sent again"])
            session = await host.open_session(agent_with(script, on_busy), session_id="s")
            nursery.start_soon(session.run, "first")
            await held["open"].wait()
            nursery.start_soon(send, host, session)
            await trio.testing.wait_all_tasks_blocked()
    [(exc, closing)] = refused
    assert isinstance(exc, ClosedWhileWaiting) and isinstance(exc, HostClosed)
    assert "the host is shutting down" in str(exc) and closing
    # What the caller does: send it again once a new host is open.
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(
            agent_with(Script(["sent again"]), on_busy), session_id="s"
        )
        result = await session.run("waiting")
        users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert result.finish_reason == "stop"
    assert users == ["first", "waiting"]  # the refused one stored once, by the new host
