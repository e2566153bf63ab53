"""What watches a turn, attacked as a careless embedder would: observers, hooks and tools
that raise exceptions a report cannot describe, and what the person then sees."""

from __future__ import annotations

import io
from importlib.metadata import EntryPoint
from typing import Any

import attrs
import orjson
import pytest
import trio
from structlog.testing import capture_logs

import runtime.registry
from actors.plugins.approval import ApprovalActor
from actors.plugins.recorder import JsonlRecorder, read_jsonl
from actors.plugins.registry import ENTRY_POINT_GROUP, create_plugin
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Actor, Agent, Host, RestartPolicy, tool
from runtime.agent import Hooks
from runtime.errors import ConfigurationError, describe_exception, exception_text
from runtime.events import TurnStarted
from runtime.logging import configure_logging, get_logger

UNSAYABLE = "<exception str() failed>"
HANG_GUARD = 600  # seconds of the autojump clock: a hang fails instead of stalling


class Unsayable(Exception):
    """An exception whose own ``__str__`` raises (a careless class)."""

    def __str__(self) -> str:
        raise RuntimeError("str broke")


class Recursing(Exception):
    def __str__(self) -> str:
        return str(self)


def test_an_exception_that_cannot_be_said_is_described_by_its_class():
    assert exception_text(Unsayable()) == UNSAYABLE
    assert exception_text(Recursing()) == UNSAYABLE
    assert describe_exception(Unsayable()) == f"Unsayable: {UNSAYABLE}"
    assert describe_exception(ValueError("plain")) == "ValueError: plain"


class UnsayableObserver(Actor):
    subscribes_to = (TurnStarted,)
    overflow = "drop-oldest"

    def __init__(self) -> None:
        super().__init__(name="unsayable")
        self.seen = 0

    async def handle(self, message: object) -> None:
        self.seen += 1
        raise Unsayable()


async def test_an_observer_raising_an_unsayable_exception_is_restarted_and_turns_go_on(
    autojump_clock,
):
    """The supervisor built its log line with ``f"{exc}"``: the observer's crash raised in
    the supervisor itself, the turn running beside it was aborted (its save timed out)
    and the host never closed."""
    with capture_logs() as logs, trio.fail_after(HANG_GUARD):
        async with Host.open() as host:
            observer = await host.start_actor(
                UnsayableObserver(), policy=RestartPolicy(intensity=5, period=60)
            )
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            first = await session.run("hello")
            second = await session.run("again")
    assert (first.finish_reason, first.text) == ("stop", "hi")
    assert (second.finish_reason, second.text) == ("stop", "hi")
    assert observer.seen == 2
    crashed = [
        line
        for line in logs
        if line.get("logger") == "axon.supervisor" and line["event"] == "actor.crashed"
    ]
    assert crashed and all(line["error"] == f"Unsayable: {UNSAYABLE}" for line in crashed)


async def test_a_hook_raising_an_unsayable_exception_fails_the_turn_with_an_error_chunk(
    autojump_clock,
):
    """The runner crashed building the error chunk: the stream ended with no terminal
    chunk at all and no result."""

    async def on_turn_start(event: object) -> None:
        raise Unsayable()

    agent = Agent(provider=ScriptedProvider([["hi"]]), hooks=Hooks(on_turn_start=on_turn_start))
    with trio.fail_after(HANG_GUARD):
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("hello") as out:
                chunks = [chunk async for chunk in out]
    errors = [c for c in chunks if c.type == "error"]
    assert [(e.error.kind, e.error.message) for e in errors] == [("Unsayable", UNSAYABLE)]
    assert out.result is not None and out.result.finish_reason == "error"


@tool
async def careless() -> str:
    """A tool whose error cannot say what it is."""
    raise Unsayable()


async def test_a_tool_raising_an_unsayable_exception_gives_the_model_a_tool_error(
    autojump_clock,
):
    """The executor crashed formatting the tool's error, and again formatting its crash
    for the calls it cut short."""
    provider = ScriptedProvider([[*tool_call("careless", {}, tool_call_id="c1")], ["sorry"]])
    with trio.fail_after(HANG_GUARD):
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, tools=[careless]))
            async with session.stream("go") as out:
                chunks = [chunk async for chunk in out]
    errors = [c.error for c in chunks if c.type == "tool-error"]
    assert errors == [f"tool careless raised Unsayable: {UNSAYABLE}"]
    assert out.result is not None and out.result.finish_reason == "stop"
    assert out.result.text == "sorry"


def _processor_that_raises(logger: object, method: str, event_dict: dict) -> dict:
    raise RuntimeError("the application's processor broke")


async def test_an_applications_processor_that_raises_drops_lines_never_turns(autojump_clock, capfd):
    """structlog configured by the embedder with a processor that raises: the log tap
    crashed, the supervisor's ``actor.crashed`` line raised in the supervisor, the turn's
    own lines raised in the turn, and the host went down with the first turn aborted."""
    import structlog

    from runtime import logging as axon_logging

    structlog.configure(processors=[_processor_that_raises, structlog.processors.JSONRenderer()])
    axon_logging._logging_failed = False  # said once a process: this test's to say
    with trio.fail_after(HANG_GUARD):
        async with Host.open() as host:
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            first = await session.run("hello")
            second = await session.run("again")
    assert (first.finish_reason, second.finish_reason) == ("stop", "stop")
    err = capfd.readouterr().err
    assert err.count("axon: a log line failed") == 1
    assert "RuntimeError: the application's processor broke" in err


class QuotesAKey:
    def __str__(self) -> str:
        return f"connected with {KEY}"


KEY = "sk-proj-abcdefghijklmnopqrstuvwx1234"


@attrs.frozen
class Audit:
    """An application's own event: any attrs class with a ``kind`` is one."""

    kind: str = "app.audit"
    session_id: str | None = None
    payload: Any = None


async def test_the_recorder_records_an_applications_odd_events_redacted_and_loses_none(
    tmp_path, autojump_clock
):
    """An object quoting a key was recorded as its unredacted text (``default=str`` after
    the redaction); one whose text raises, or a dict with an int key, crashed the
    recorder, and the event was lost."""
    path = tmp_path / "events.jsonl"
    payloads = [QuotesAKey(), Unsayable(), {1: "int key"}, "caf\udce9", "last"]
    with trio.fail_after(HANG_GUARD):
        async with Host.open(log_tap=False) as host:
            await host.start_actor(JsonlRecorder(path))
            for payload in payloads:
                await host.bus.publish(Audit(payload=payload))
                await trio.sleep(0.1)
    text = path.read_text()
    assert KEY not in text
    assert [r["payload"] for r in read_jsonl(path)] == [
        "connected with [redacted]",
        "<Unsayable: str() failed>",
        {"1": "int key"},
        "caf\udce9",
        "last",
    ]


def test_a_log_line_with_an_unsayable_field_is_written_not_raised():
    buf = io.StringIO()
    configure_logging("info", stream=buf)
    get_logger("app").info("odd", field=Unsayable(), quoted=QuotesAKey())
    (line,) = [orjson.loads(x) for x in buf.getvalue().splitlines()]
    assert line["field"] == "<Unsayable: str() failed>"
    assert line["quoted"] == "connected with [redacted]"


async def test_a_hook_that_raises_is_logged_once_with_where_it_failed(autojump_clock):
    """A hook's bug (here: it mutates the frozen event it is given) fails the turn; the
    ``turn.failed`` line said only ``can't set attribute``, not that a hook raised it nor
    where: it now carries the traceback down to the hook."""

    async def on_turn_start(event: Any) -> None:
        event.turn_id = "mine"  # events are frozen

    agent = Agent(provider=ScriptedProvider([["hi"]]), hooks=Hooks(on_turn_start=on_turn_start))
    with capture_logs() as logs, trio.fail_after(HANG_GUARD):
        async with Host.open() as host:
            session = await host.open_session(agent)
            result = await session.run("hello")
    assert result.finish_reason == "error" and result.error.kind == "FrozenInstanceError"
    failed = [line for line in logs if line["event"] == "turn.failed"]
    assert len(failed) == 1
    assert failed[0]["error_kind"] == "FrozenInstanceError"
    assert "in on_turn_start" in failed[0]["exception"]  # (capture_logs does not redact:
    # the traceback goes as a redacted ``exception`` field, runtime.logging.log_exception)


def _registered(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Pretend installed packages declare these ``axon.plugins`` entry points."""
    found = [EntryPoint(n, t, ENTRY_POINT_GROUP) for n, t in targets.items()]
    monkeypatch.setattr(
        runtime.registry, "entry_points", lambda group: found if group == ENTRY_POINT_GROUP else []
    )


def test_a_plugin_whose_factory_raises_is_a_configuration_error_naming_it(monkeypatch):
    """``int`` as a factory: ``int("lots")`` raises ValueError, which went past
    ``run``'s one error line as a traceback."""
    _registered(monkeypatch, counted="builtins:int")
    with pytest.raises(ConfigurationError) as raised:
        create_plugin("counted:lots")
    assert str(raised.value) == (
        "plug-in 'counted' (builtins:int) could not be built from its options: "
        "ValueError: invalid literal for int() with base 10: 'lots'"
    )


def test_a_plugin_whose_module_raises_on_import_is_a_configuration_error(monkeypatch, tmp_path):
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('not today')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _registered(monkeypatch, moody="raises_on_import:plugin")
    with pytest.raises(ConfigurationError) as raised:
        create_plugin("moody")
    assert str(raised.value) == (
        "plug-in 'moody' (raises_on_import:plugin) could not be loaded: RuntimeError: not today"
    )


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file (it needs approval)."""
    deleted.append(path)
    return f"deleted {path}"


deleted: list[str] = []


def _deleting_agent() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/etc/passwd"}, tool_call_id="D")], ["ok"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


async def _decided_by(policy: Any) -> str | None:
    """The tool error the model saw when ``policy`` decided the call (``None``: it ran)."""
    deleted.clear()
    with trio.fail_after(HANG_GUARD):
        async with Host.open(log_tap=False) as host:
            await host.start_actor(ApprovalActor(policy))
            session = await host.open_session(_deleting_agent())
            await session.run("delete it")
            waited = trio.current_time()
    (msg,) = [m for m in session.messages if m.role == "tool"]
    assert waited < 60  # decided at once, not at the executor's approval timeout
    assert (msg.error is None) == (deleted == ["/etc/passwd"])
    return msg.error


async def test_an_approval_policy_that_answers_no_bool_denies_the_call(autojump_clock):
    """``bool(verdict)`` approved a policy's ``"no"`` and ``("deny", reason)``."""
    answered = "the tool call was denied: the approval policy answered str, not True or False"
    assert await _decided_by(lambda request: "no") == answered
    assert await _decided_by(lambda request: ("deny", "not on my watch")) == answered
    assert await _decided_by(lambda request: (False, "nope")) == "the tool call was denied: nope"
    assert await _decided_by(lambda request: True) is None


async def test_an_approval_policy_that_raises_denies_the_call_at_once(autojump_clock):
    """It crashed the actor, the request died with it, and the call waited out the
    executor's approval timeout (five minutes)."""

    def policy(request: Any) -> bool:
        raise LookupError(f"no rule for {request.tool_name}")

    assert await _decided_by(policy) == (
        "the tool call was denied: the approval policy raised LookupError: no rule for delete_file"
    )


def test_a_log_line_holding_a_lone_surrogate_is_written_escaped_not_raised(capfd):
    """A tool's error quoting a file name ``os.listdir`` decoded with ``surrogateescape``:
    orjson refuses the text, and the line raised (the log tap's crashed the tap)."""
    configure_logging("info")
    get_logger("app").warning("tool.failed", error="no file caf\udce9.txt")
    (line,) = capfd.readouterr().err.splitlines()
    assert '"error":"no file caf\\udce9.txt"' in line
    assert orjson.loads(line.replace("\\udce9", "?"))["event"] == "tool.failed"
