"""The log tap's plan per event class and its one call of the processor chain (issue 24)
write the very lines the generic path wrote: same keys, same order, same values."""

from __future__ import annotations

import io
import json
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import attrs
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import runtime.logging as runtime_logging
from actors import log_tap
from actors.log_tap import DEBUG_TYPES, LogTap
from runtime import messages
from runtime.chunks import Usage
from runtime.events import (
    ActorCrashed,
    ActorGaveUp,
    Lagged,
    MessageAdded,
    SessionSaved,
    StepFinished,
    StepStarted,
    ToolCallCompleted,
    ToolCallRequested,
    TurnFinished,
    TurnStarted,
)
from runtime.logging import configure_logging, level_enabled
from runtime.media import elide_media
from runtime.output import Error, ErrorInfo, TextDelta, ToolCall
from runtime.redact import redact, register_secret
from runtime.serde import converter, fields_unstructurer
from tests.test_serde import EVENT_CLASSES, PNG, _builds

KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 2


def handle(tap: LogTap, event: Any) -> None:
    """Run the tap's ``handle`` (it never waits) outside an event loop."""
    coro = tap.handle(event)
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("the tap's handle waited")


def generic_line(log: Any, event: Any) -> None:
    """The tap's line as it was made before its plans: the converter's generic
    unstructuring, media elided over the whole dictionary, the tag fields popped, the
    bound logger's public level method."""
    if isinstance(event, DEBUG_TYPES):
        level = "debug"
    elif isinstance(event, (ActorGaveUp, Error)):
        level = "error"
    elif isinstance(event, (ActorCrashed, Lagged)):
        level = "warning"
    else:
        level = "info"
    if not level_enabled(log, level):
        return
    fields = elide_media(converter.unstructure(event))
    if not log_tap._chain_redacts(log):
        fields = redact(fields)
    fields.pop("type", None)
    fields.pop("kind", None)
    if fields.get("causation_id") is None:
        fields["causation_id"] = (
            fields.get("tool_call_id") or fields.get("part_id") or fields.get("turn_id")
        )
    getattr(log, level)(event.kind, **fields)


@contextmanager
def logging_to(level: str = "debug") -> Iterator[io.StringIO]:
    out = io.StringIO()
    saved = runtime_logging.time
    runtime_logging.time = types.SimpleNamespace(time_ns=lambda: 1764786028844091000)  # type: ignore[assignment]
    configure_logging(level, stream=out)
    try:
        yield out
    finally:
        runtime_logging.time = saved
        configure_logging("warning")


def lines_three_ways(events: list[Any]) -> tuple[str, str, str]:
    """The lines of ``events`` through ``configure_logging``: by the tap, by the tap with
    the public path only (no ``_process_event``), and by :func:`generic_line`."""
    got = []
    for way in ("tap", "public", "generic"):
        with logging_to() as out:
            tap = LogTap()
            saved = log_tap._FILTERING
            if way == "public":
                log_tap._FILTERING = {}
            try:
                for event in events:
                    handle(tap, event) if way != "generic" else generic_line(tap.log, event)
            finally:
                log_tap._FILTERING = saved
        got.append(out.getvalue())
    return got[0], got[1], got[2]


def handmade_events() -> list[Any]:
    image = messages.Image(data=PNG + b"pixels" * 40)
    return [
        TurnStarted(session_id="s", turn_id="turn_1", agent="a", input=f"my key is {KEY}, see"),
        TurnStarted(
            session_id="s",
            turn_id="turn_1",
            agent="a",
            input=(messages.TextPart(text="what?", step=0), image),
        ),
        MessageAdded(
            session_id="s",
            turn_id="turn_1",
            index=0,
            message=messages.UserMessage(content=(image,)),
        ),
        ToolCall(
            step=0,
            tool_call_id="c",
            tool_name="t",
            input={"api_key": "plain", "q": f"Bearer {KEY}"},
            seq=3,
            session_id="s",
            turn_id="turn_1",
        ),
        TextDelta(step=0, part_id="p", text="hi", seq=4, session_id="s", turn_id="turn_1"),
        ActorCrashed(
            actor="x", error="boom 2026-12-04T09:55:17Z", error_type="ValueError", restarts=1
        ),
    ]


def test_handmade_lines_with_keys_and_media_are_the_generic_paths():
    tap, public, generic = lines_three_ways(handmade_events())
    assert tap == public == generic
    assert len(tap.splitlines()) == 6
    assert KEY not in tap and "[redacted]" in tap and "bytes>" in tap
    first = json.loads(tap.splitlines()[0])
    assert list(first)[:3] == ["logger", "agent", "input"]  # the keys' order too


def test_lines_through_a_chain_that_does_not_redact_are_the_generic_paths():
    """``capture_logs``: the tap redacts the fields itself, and the chain drops the line
    (``DropEvent``) after capturing it."""
    events = handmade_events()
    configure_logging("debug")
    try:
        got = []
        for way in ("tap", "generic"):
            with capture_logs() as logs:
                tap = LogTap()
                for event in events:
                    handle(tap, event) if way == "tap" else generic_line(tap.log, event)
            got.append(logs)
    finally:
        configure_logging("warning")
    assert got[0] == got[1] and len(got[0]) == 6
    assert [list(line) for line in got[0]] == [list(line) for line in got[1]]
    assert KEY not in repr(got[0])


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.kind)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_event_makes_the_line_the_generic_path_made(cls, data):
    event = data.draw(_builds(cls))
    expected = {k: v for k, v in converter.unstructure(event).items() if k not in ("type", "kind")}
    fields = fields_unstructurer(cls, omit=("type", "kind"))(event)
    assert list(fields.items()) == list(expected.items())
    tap, public, generic = lines_three_ways([event])
    assert tap == public == generic
    assert tap.count("\n") == 1


SESSION = "sk-ant-" + "Z9y8X7w6V5u4T3s2R1q0" * 2
"""A session id chosen by the application, that looks like a key: redacted wherever it is."""


def info_events_with_keys() -> list[Any]:
    """A turn's info lines (issue 24 goal 1): its session id a key, a key in an error
    text, in a tool's input and in the assistant's reply."""
    usage = Usage(input_tokens=10, output_tokens=3, total_tokens=13, cost=0.5)
    ids = {"session_id": SESSION, "turn_id": "turn_9f00"}
    reply = messages.AssistantMessage(
        content=(messages.TextPart(text=f"your key {KEY} is wrong", step=0),), usage=usage
    )
    return [
        TurnStarted(**ids, agent="a", input="hello there", provider="openai", model="m"),
        StepStarted(**ids, step=0),
        ToolCallRequested(**ids, step=0, tool_call_id="call_1", tool_name="t", input={"q": KEY}),
        ToolCallCompleted(
            **ids, step=0, tool_call_id="call_1", tool_name="t", error=f"401: key {KEY} refused"
        ),
        StepFinished(**ids, step=0, finish_reason="stop", usage=usage),
        MessageAdded(**ids, index=1, message=reply),
        SessionSaved(**ids, message_count=2, step=0),
        TurnFinished(
            **ids,
            finish_reason="error",
            usage=usage,
            steps=1,
            error=ErrorInfo(kind="provider", message=f"rejected {KEY}"),
        ),
    ]


def test_the_configured_chains_lines_are_the_generic_paths_with_keys_in_ids_and_errors():
    """The lines :func:`configure_logging`'s chain gets from the tap's own steps
    (``_configured_line``) are the bytes the processors make one by one: every key
    redacted, the session id's too."""
    events = info_events_with_keys()
    tap, public, generic = lines_three_ways(events)
    assert tap == public == generic
    assert len(tap.splitlines()) == len(events)
    assert KEY not in tap and SESSION not in tap
    assert tap.count('"session_id":"[redacted]"') == len(events)
    assert '"error":"401: key [redacted] refused"' in tap


def test_a_line_through_configure_loggings_chain_is_made_without_the_processor_loop(
    monkeypatch,
):
    def loop(*args: Any) -> Any:
        raise AssertionError("the processors called one by one")

    monkeypatch.setattr(log_tap, "_json_line", loop)
    monkeypatch.setattr(structlog.contextvars, "merge_contextvars", loop)  # nothing bound
    with logging_to("info") as out:
        tap = LogTap()
        for event in info_events_with_keys():
            handle(tap, event)
    assert len(out.getvalue().splitlines()) == len(info_events_with_keys())


def test_bound_context_variables_are_merged_into_the_configured_chains_lines():
    structlog.contextvars.bind_contextvars(request_id="r-1", password="hunter2-hunter2")
    try:
        tap, public, generic = lines_three_ways(info_events_with_keys())
    finally:
        structlog.contextvars.clear_contextvars()
    assert tap == public == generic
    assert tap.count('"request_id":"r-1"') == len(info_events_with_keys())
    assert "hunter2" not in tap


def test_a_registered_secret_made_of_digits_is_redacted_in_the_configured_chains_stamps():
    """The stamp is set after the tap's redaction of a line only while no registered
    secret is made of a stamp's characters; with one, the whole line is looked at."""
    from tests.test_redact import isolated_secrets

    events = info_events_with_keys()[:2]
    with isolated_secrets():
        date = json.loads(lines_three_ways(events)[0].splitlines()[0])["timestamp"][:10]
        register_secret(date)
        tap, public, generic = lines_three_ways(events)
    assert tap == public == generic
    # (the hour glued to the date is taken with it: runtime.redact._glued_word)
    assert date not in tap and tap.count('"timestamp":"[redacted]:') == len(events)


@attrs.frozen
class _SignedIn:
    """An application's event with a field named like a credential."""

    kind: ClassVar[str] = "app.signed-in"
    session_id: str
    password: str


def test_a_field_or_a_bound_key_named_like_a_credential_is_redacted_whole():
    """The redaction skips looking up the keys of a class whose fields' names are all
    plain (every bus event's); not those of a class with a ``password`` field, nor the
    context's of a logger bound with an ``api_key``."""
    assert log_tap._make_plan(TurnStarted).plain_keys
    assert not log_tap._make_plan(_SignedIn).plain_keys
    event = _SignedIn(session_id="s-1", password="correct horse battery")
    got = []
    for way in ("tap", "generic"):
        with logging_to("info") as out:
            log = runtime_logging.get_logger("axon.events").bind(api_key="plain words")
            tap = LogTap(logger=log)
            for e in (event, info_events_with_keys()[1]):
                handle(tap, e) if way == "tap" else generic_line(log, e)
        got.append(out.getvalue())
    assert got[0] == got[1]
    assert "correct horse" not in got[0] and "plain words" not in got[0]
    assert got[0].count('"api_key":"[redacted]"') == 2 and '"password":"[redacted]"' in got[0]


def test_a_chain_other_than_configure_loggings_takes_the_processor_loop():
    processors = [*structlog.get_config()["processors"]]
    configure_logging("info")
    try:
        chain = structlog.get_config()["processors"]
        assert log_tap._configured_chain(chain)
        changed = [*chain[:-1], structlog.processors.add_log_level, chain[-1]]
        assert not log_tap._configured_chain(changed)
        assert not log_tap._configured_chain(chain[:-1])
    finally:
        structlog.configure(processors=processors)
        configure_logging("warning")


def test_the_plan_is_made_once_per_class(monkeypatch):
    made = []
    real = log_tap.fields_unstructurer

    def counting(cls: type, **kw: Any) -> Any:
        made.append(cls)
        return real(cls, **kw)

    monkeypatch.setattr(log_tap, "fields_unstructurer", counting)
    monkeypatch.setattr(log_tap, "_plans", {})
    with logging_to() as out:
        tap = LogTap()
        for _ in range(3):
            for event in handmade_events():
                handle(tap, event)
    assert len(out.getvalue().splitlines()) == 18
    assert sorted(c.__name__ for c in made) == sorted({type(e).__name__ for e in handmade_events()})


def test_a_line_below_the_level_builds_nothing(monkeypatch):
    def boom(event: Any) -> Any:
        raise AssertionError("built a line nobody sees")

    plan = log_tap._Plan(level="debug", number=10, fields=boom, deep=())
    monkeypatch.setitem(log_tap._plans, TextDelta, plan)
    with logging_to("info") as out:
        handle(LogTap(), handmade_events()[4])
    assert out.getvalue() == ""


def test_without_process_event_every_line_takes_the_public_path(monkeypatch):
    assert log_tap._FILTERING  # this structlog's filtering loggers have it
    monkeypatch.setattr(structlog.BoundLoggerBase, "_process_event", None)
    assert log_tap._filtering_classes() == {}


def lines_handled_with_the_rest_queued(events: list[Any]) -> tuple[str, list[str]]:
    """The tap's output for ``events`` put in its inbox first, then handled one at a time
    as its run loop takes them; and what was written after each."""
    with logging_to() as out:
        tap = LogTap()
        for event in events:
            tap.inbox.put_nowait(event)
        after = []
        while len(tap.inbox):
            handle(tap, tap.inbox.get_nowait())
            after.append(out.getvalue())
    return out.getvalue(), after


def test_lines_of_queued_events_are_written_together_once_the_inbox_is_empty(monkeypatch):
    events = handmade_events()
    together, after = lines_handled_with_the_rest_queued(events)
    one_by_one, _, _ = lines_three_ways(events)
    assert together == one_by_one  # the same bytes, in the same order
    # the events waiting behind the first are made in the same step (issue 24 goal 1)
    assert after == [together]
    monkeypatch.setattr(log_tap, "BATCH", 1)  # one event a step: held until the last
    together, after = lines_handled_with_the_rest_queued(events)
    assert together == one_by_one
    assert after[:-1] == [""] * (len(events) - 1) and after[-1] == together


def test_a_tap_makes_at_most_batch_events_a_step(monkeypatch):
    monkeypatch.setattr(log_tap, "BATCH", 2)
    events = handmade_events()
    together, after = lines_handled_with_the_rest_queued(events)
    assert together == lines_three_ways(events)[0]
    assert len(after) == 3 and after[:2] == ["", ""]  # 2 + 2 + 2 events, one write


def test_a_key_in_a_held_line_is_redacted():
    together, _ = lines_handled_with_the_rest_queued(handmade_events()[:4])
    assert KEY not in together and together.count("[redacted]") >= 2


def test_at_most_hold_lines_are_held(monkeypatch):
    monkeypatch.setattr(log_tap, "HOLD_LINES", 2)
    monkeypatch.setattr(log_tap, "BATCH", 1)  # one event a step, lines held across steps
    _, after = lines_handled_with_the_rest_queued(handmade_events()[:4])
    assert [text.count("\n") for text in after] == [0, 2, 2, 4]


def test_held_lines_are_written_when_the_next_events_line_fails(monkeypatch):
    def boom(event: Any) -> Any:
        raise RuntimeError("a line that cannot be made")

    plan = log_tap._Plan(level="info", number=20, fields=boom, deep=())
    monkeypatch.setitem(log_tap._plans, Lagged, plan)
    with logging_to() as out:
        tap = LogTap()
        tap.inbox.put_nowait(Lagged(subscriber="x", dropped=1))
        with pytest.raises(RuntimeError):  # the waiting event is made in the same step
            handle(tap, handmade_events()[0])
        assert out.getvalue().count("\n") == 1


async def test_held_lines_are_written_when_the_tap_is_cancelled_between_events(monkeypatch):
    import trio

    monkeypatch.setattr(log_tap, "BATCH", 1)  # one event a step: a line held between two

    with logging_to() as out:
        tap = LogTap()
        events = handmade_events()[:2]
        for event in events:
            tap.inbox.put_nowait(event)
        with trio.CancelScope() as scope:
            real = tap._line

            def line_then_cancel(event: Any) -> None:
                real(event)
                scope.cancel()  # the inbox's next get raises Cancelled, the line is held

            tap._line = line_then_cancel  # type: ignore[method-assign]
            await tap.run()
        assert out.getvalue().count("\n") == 1


class _Writes(io.StringIO):
    """A sink that counts its writes (one a :meth:`LogTap._write_held`)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@contextmanager
def resting_tap(window: float = 0.02) -> Iterator[tuple[LogTap, _Writes]]:
    out = _Writes()
    saved = runtime_logging.time
    runtime_logging.time = types.SimpleNamespace(time_ns=lambda: 1764786028844091000)  # type: ignore[assignment]
    configure_logging("debug", stream=out)
    try:
        yield LogTap(window=window), out
    finally:
        runtime_logging.time = saved
        configure_logging("warning")


async def test_a_resting_tap_makes_the_events_of_its_rest_in_one_step_and_one_write(mock_clock):
    """A worker's tap (``window``) writes a line that comes alone at once, then rests:
    the events of the rest wait, then go in one step and one write (issue 24 goal 3: one
    step and one write nearly every line was the tap's cost in a worker)."""
    import trio
    import trio.testing

    from tests.support.steps import counted

    events = handmade_events()
    with resting_tap() as (tap, out):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tap.run)
            tap.inbox.put_nowait(events[0])
            await trio.testing.wait_all_tasks_blocked()
            assert (out.getvalue().count("\n"), out.writes) == (1, 1)  # at once
            for event in events[1:]:
                tap.inbox.put_nowait(event)
            await trio.testing.wait_all_tasks_blocked()
            assert out.getvalue().count("\n") == 1  # resting
            with counted() as steps:
                mock_clock.jump(0.02)
                await trio.testing.wait_all_tasks_blocked()
            assert out.getvalue().count("\n") == len(events)
            assert out.writes == 2
            # the rest's end, then the inbox's next event with the four behind it
            assert steps.named("LogTap.run") == 2
            tap.stop()
    one_by_one, _, _ = lines_three_ways(events)
    assert out.getvalue() == one_by_one  # the same lines


async def test_a_resting_tap_makes_at_most_batch_events_a_step(mock_clock, monkeypatch):
    import trio
    import trio.testing

    from tests.support.steps import counted

    monkeypatch.setattr(log_tap, "BATCH", 3)
    events = handmade_events()
    with resting_tap() as (tap, out):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tap.run)
            tap.inbox.put_nowait(events[0])
            await trio.testing.wait_all_tasks_blocked()
            for event in [*events, events[0]]:  # 7 during the rest
                tap.inbox.put_nowait(event)
            with counted() as steps:
                mock_clock.jump(0.02)
                await trio.testing.wait_all_tasks_blocked()
            assert out.getvalue().count("\n") == 8
            assert steps.named("LogTap.run") == 1 + 3  # 3 + 3 + 1 events
            assert out.writes == 2
            tap.stop()


async def test_a_stopped_tap_ends_its_rest_and_writes_what_is_queued(mock_clock):
    """Stopping (the host's drain) does not wait out a rest: what is queued is written
    and the tap ends, the clock never moving."""
    import trio
    import trio.testing

    events = handmade_events()
    ended: list[bool] = []

    async def run(tap: LogTap) -> None:
        await tap.run()
        ended.append(True)

    with resting_tap(window=60.0) as (tap, out):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, tap)
            tap.inbox.put_nowait(events[0])
            await trio.testing.wait_all_tasks_blocked()
            for event in events[1:]:
                tap.inbox.put_nowait(event)
            tap.stop()
            await trio.testing.wait_all_tasks_blocked()
            assert ended == [True]  # the mock clock never moved
    assert out.getvalue().count("\n") == len(events)


async def test_a_tap_without_a_window_writes_each_event_as_it_comes(mock_clock):
    import trio
    import trio.testing

    events = handmade_events()[:3]
    with resting_tap(window=0.0) as (tap, out):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tap.run)
            for n, event in enumerate(events, start=1):
                tap.inbox.put_nowait(event)
                await trio.testing.wait_all_tasks_blocked()
                assert (out.getvalue().count("\n"), out.writes) == (n, n)
            tap.stop()


def test_lines_past_the_off_loop_bound_are_dropped_and_counted(monkeypatch):
    # An application's sink that stopped: the lines waiting for it are bounded.
    monkeypatch.setattr(log_tap, "OFF_LOOP_LINES", 2)
    stalled, writing, written = threading.Event(), threading.Event(), []

    def write(line: str) -> None:
        writing.set()
        stalled.wait(10)
        written.append(line)

    off = log_tap._OffLoop()
    off.put(write, ("line 0",), {})
    assert writing.wait(10)  # its thread writes the first, and stalls
    for n in range(1, 6):
        off.put(write, (f"line {n}",), {})
    dropped = off.dropped
    stalled.set()
    assert off.wait_empty(10)
    assert (dropped, off.dropped) == (3, 3)  # one written meanwhile, two waiting
    assert written == ["line 0", "line 1", "line 2"]
