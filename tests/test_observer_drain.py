"""Leaving the host delivers every event already published to every observer (bounded by
``drain_timeout``), and ``replay`` says when a recording was cut short.

The loss this guards against is timing-dependent (the host used to cancel observers with a
turn's last events still in their inboxes), so the embedded test repeats a turn at delay 0.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
from structlog.testing import capture_logs

from actors.plugins import JsonlRecorder
from actors.plugins.recorder import read_jsonl
from actors.providers import ScriptedProvider
from runtime import Actor, Agent, Host
from runtime.errors import ConfigurationError
from tests.support.commands import run_runtime


def one_step_agent() -> Agent:
    return Agent(provider=ScriptedProvider([["It is sunny in Paris."]], delay=0))


@attrs.frozen(kw_only=True)
class Ping:
    kind = "test.ping"
    session_id: str | None = None


class NeverReads(Actor):
    """An observer stuck on its first event: it never takes the next ones."""

    subscribes_to = (Ping,)
    overflow = "drop-oldest"

    async def handle(self, message: Any) -> None:
        await trio.sleep_forever()


class Collects(Actor):
    subscribes_to = Actor.ALL
    overflow = "drop-oldest"

    def __init__(self) -> None:
        super().__init__(name="collects")
        self.kinds: list[str] = []

    async def handle(self, message: Any) -> None:
        self.kinds.append(message.kind)


async def test_a_recording_ends_with_turn_finished_every_time_the_host_is_left(tmp_path):
    for attempt in range(50):
        path = tmp_path / f"run{attempt}.jsonl"
        async with Host.open() as host:
            await host.start_actor(JsonlRecorder(path))
            session = await host.open_session(one_step_agent())
            await session.run("Weather in Paris?")
        kinds = [event["kind"] for event in read_jsonl(path)]
        assert "turn.finished" in kinds, f"attempt {attempt}: {kinds}"
        assert kinds[-1] == "output.finish", f"attempt {attempt}: {kinds}"


async def test_run_record_writes_turn_finished(tmp_path):
    for attempt in range(3):
        path = tmp_path / f"run{attempt}.jsonl"
        proc = run_runtime("run", "--record", str(path), "What's the weather in Paris?")
        assert proc.returncode == 0, proc.stderr
        kinds = [event["kind"] for event in read_jsonl(path)]
        assert "turn.finished" in kinds, f"attempt {attempt}: {kinds}"


async def test_run_log_level_info_logs_turn_finished():
    proc = run_runtime("run", "--log-level", "info", "What's the weather in Paris?")
    assert proc.returncode == 0, proc.stderr
    assert '"event":"turn.finished"' in proc.stderr


async def test_replay_of_a_recording_without_turn_finished_says_it_is_incomplete(tmp_path):
    whole = tmp_path / "whole.jsonl"
    async with Host.open(log_tap=False) as host:
        await host.start_actor(JsonlRecorder(whole))
        session = await host.open_session(one_step_agent())
        await session.run("Weather in Paris?")
    lines = whole.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b'"turn.finished"' in line)
    cut_short = tmp_path / "cut.jsonl"
    cut_short.write_bytes(b"".join(lines[:cut]))
    proc = run_runtime("replay", str(cut_short))
    assert proc.returncode == 1
    assert "It is sunny in Paris." in proc.stdout  # what was recorded is still shown
    assert proc.stderr.strip().endswith(
        "is incomplete: turn "
        + read_jsonl(whole)[0]["turn_id"]
        + " has no turn.finished event (the recording was cut short)"
    )


async def test_replay_of_a_recording_with_no_turn_at_all_says_it_is_incomplete(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = run_runtime("replay", str(empty))
    assert proc.returncode == 1
    assert "is incomplete: it has no turn.finished event" in proc.stderr


async def test_an_observer_that_never_reads_holds_up_leaving_for_drain_timeout_only(
    autojump_clock,
):
    with capture_logs() as logs:
        with trio.fail_after(7):
            async with Host.open(log_tap=False, drain_timeout=3) as host:
                await host.start_actor(NeverReads(name="stuck"))
                for _ in range(5):
                    host.bus.publish_nowait(Ping())
                leaving = trio.current_time()
    assert trio.current_time() - leaving == pytest.approx(3)
    dropped = [line for line in logs if line["event"] == "host.events-dropped"]
    assert dropped == [  # the event in hand and the 4 queued
        {
            "logger": "axon.host",
            "event": "host.events-dropped",
            "actor": "stuck",
            "dropped": 5,
            "drain_timeout": 3,
            "log_level": "warning",
        }
    ]


async def test_a_host_cancelled_from_outside_still_drains_its_observers_within_the_bound(
    autojump_clock,
):
    collects = Collects()
    with trio.CancelScope() as outside:
        async with Host.open(log_tap=False, drain_timeout=3) as host:
            await host.start_actor(collects)
            await host.start_actor(NeverReads(name="stuck"))
            host.bus.publish_nowait(Ping())
            session = await host.open_session(one_step_agent())
            await session.run("Weather in Paris?")
            host.bus.publish_nowait(Ping())  # no checkpoint between this and the cancel
            left = trio.current_time()
            outside.cancel()
            await trio.sleep_forever()
    assert trio.current_time() - left == pytest.approx(3)
    assert "turn.finished" in collects.kinds and collects.kinds[-1] == "test.ping"


async def test_a_negative_drain_timeout_is_refused():
    with pytest.raises(ConfigurationError, match="drain_timeout must be a number of seconds"):
        async with Host.open(drain_timeout=-1):
            pass
