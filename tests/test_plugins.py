"""The shipped plug-in actors: approval gate, metrics, JSONL recorder (and replay)."""

from __future__ import annotations

import sys

import attrs
import trio

from actors.plugins import ApprovalActor, JsonlRecorder, MetricsActor
from actors.plugins.recorder import read_jsonl
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Actor, Agent, Host, ToolMessage, Usage, tool
from runtime.events import ToolApprovalRequested, TurnFinished, TurnStarted
from runtime.tools import ToolContext
from tests.support.approval_tools import delete_file, ran


def deleting_agent() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/etc/passwd"}, tool_call_id="D")], ["ok"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


async def test_denied_tool_never_runs_and_the_model_sees_the_denial():
    ran.clear()
    async with Host.open(log_tap=False) as host:
        await host.start_actor(ApprovalActor(lambda req: (False, "not on my watch")))
        session = await host.open_session(deleting_agent())
        result = await session.run("clean up")
    assert ran == []
    msg = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert msg.error == "the tool call was denied: not on my watch"
    assert result.finish_reason == "stop"


async def test_approved_tool_runs_after_a_person_approves_it():
    ran.clear()
    async with Host.open(log_tap=False) as host:
        approver = await host.start_actor(ApprovalActor())
        session = await host.open_session(deleting_agent())
        async with trio.open_nursery() as nursery:
            done: list = []

            async def run():
                done.append(await session.run("clean up"))

            nursery.start_soon(run)
            while "D" not in approver.pending:  # noqa: ASYNC110 - polling a plain dict
                await trio.sleep(0.01)
            assert ran == []  # waiting for a decision, not running
            assert isinstance(approver.pending["D"], ToolApprovalRequested)
            await approver.approve("D")
    assert ran == ["/etc/passwd"] and done[0].finish_reason == "stop"


async def test_without_a_decision_the_call_is_denied_after_the_approval_timeout(autojump_clock):
    ran.clear()
    async with Host.open(log_tap=False) as host:
        await host.start_actor(ApprovalActor())  # the in-process gate: waits in memory
        host.tool_executor.approval_timeout = 30
        session = await host.open_session(deleting_agent())
        t0 = trio.current_time()
        await session.run("clean up")
        assert trio.current_time() - t0 == 30
    assert ran == []
    msg = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert msg.error == "the tool call was denied: no decision within 30s"


@tool
async def ping() -> str:
    """Ping."""
    return "pong"


async def test_metrics_actor_counts_tokens_steps_tools_and_latency(autojump_clock):
    from actors.providers.scripted import Sleep

    steps = [[*tool_call("ping", {}, tool_call_id="P")], [Sleep(2), "done"]]
    agent = Agent(
        provider=ScriptedProvider(
            steps, usage=Usage(input_tokens=5, output_tokens=3, total_tokens=8)
        ),
        tools=[ping],
    )
    async with Host.open(log_tap=False) as host:
        metrics = await host.start_actor(MetricsActor())
        session = await host.open_session(agent, session_id="m")
        await session.run("a")
        await session.run("b")
        await trio.sleep(0.1)
    m = metrics.sessions["m"]
    assert (m.turns, m.steps, m.tool_calls, m.tool_errors) == (2, 4, 2, 0)
    assert (m.input_tokens, m.output_tokens, m.total_tokens) == (20, 12, 32)
    assert m.turn_latencies == [2.0, 2.0]


async def test_metrics_forget_the_least_recently_active_session_past_their_bound():
    agent = Agent(provider=ScriptedProvider([["a"], ["b"], ["c"], ["d"]]))
    async with Host.open(log_tap=False) as host:
        metrics = await host.start_actor(MetricsActor(max_sessions=2, max_latencies=1))
        for name in ("s1", "s2", "s1", "s3"):  # s2 is the least recently active at s3
            await (await host.open_session(agent, session_id=name)).run("go")
            await trio.sleep(0.1)
    assert list(metrics.sessions) == ["s1", "s3"]
    assert metrics.sessions["s1"].turns == 2
    assert len(metrics.sessions["s1"].turn_latencies) == 1


async def test_metrics_hold_at_most_max_sessions_entries_after_ten_thousand_sessions():
    # A long serve: every session the process ran stayed, and so did each turn start
    # whose finish the drop-oldest inbox lost.
    metrics = MetricsActor(max_sessions=100)
    for n in range(10_000):
        sid = f"s{n}"
        await metrics.handle(TurnStarted(session_id=sid, turn_id=f"t{n}", agent="a", input="x"))
        if n % 2:  # every other finish dropped
            await metrics.handle(
                TurnFinished(
                    session_id=sid, turn_id=f"t{n}", finish_reason="stop", usage=Usage(), steps=1
                )
            )
    assert len(metrics.sessions) == 100 and len(metrics._started) <= 100
    assert list(metrics.sessions)[-1] == "s9999" and metrics.sessions["s9999"].turns == 1


async def test_jsonl_recorder_writes_every_event_and_replay_renders_it(tmp_path):
    path = tmp_path / "events.jsonl"
    steps = [[*tool_call("ping", {}, tool_call_id="P")], ["all done"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[ping])
    async with Host.open(log_tap=False) as host:
        recorder = await host.start_actor(JsonlRecorder(path))
        session = await host.open_session(agent, session_id="rec")
        await session.run("go")
        await trio.sleep(0.1)
        recorder.stop()
        await recorder.stopped.wait()
    events = read_jsonl(path)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "turn.started" and "output.text-delta" in kinds and "turn.finished" in kinds
    seqs = [e["seq"] for e in events if e["kind"].startswith("output.")]
    assert seqs == list(range(1, len(seqs) + 1))  # nothing lost, in order
    proc = await trio.run_process(
        [sys.executable, "-m", "runtime", "replay", str(path)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    stdout = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    assert "tool · ping" in stdout and "all done" in stdout


@attrs.frozen(kw_only=True)
class Handoff:
    """A team's own event type: any frozen class with a ``kind`` and a ``session_id``."""

    kind = "team.handoff"
    session_id: str
    note: str


@tool
async def hand_off(note: str, context: ToolContext) -> str:
    """Hand work to the team."""
    await context.host.bus.publish(Handoff(session_id=context.session_id, note=note))
    return "handed off"


class TeamInbox(Actor):
    subscribes_to = (Handoff,)

    def __init__(self) -> None:
        super().__init__(name="team-inbox")
        self.notes: list[str] = []

    async def handle(self, message) -> None:
        self.notes.append(message.note)


async def test_agents_exchange_typed_events_over_the_bus():
    steps = [[*tool_call("hand_off", {"note": "please review"}, tool_call_id="H")], ["ok"]]
    async with Host.open(log_tap=False) as host:
        listener = await host.start_actor(TeamInbox())
        agent = Agent(provider=ScriptedProvider(steps), tools=[hand_off])
        session = await host.open_session(agent)
        await session.run("go")
        await trio.sleep(0.01)
    assert listener.notes == ["please review"]
    assert "context" not in hand_off.parameters["properties"]
