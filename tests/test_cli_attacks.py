"""The command line attacked as a careless person and a hostile model would: escape
sequences in what a model, a tool or a stored session says, and the rest of
tests/test_cli*.py's ground left alone."""

from __future__ import annotations

import argparse
import io
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import output as o
from runtime.agent import Agent
from runtime.app.cli import describe_call, json_line, show_command
from runtime.app.host import Host
from runtime.app.render import TerminalRenderer, terminal_text
from runtime.approval import PendingCall
from runtime.chunks import Usage
from runtime.output import ErrorInfo
from runtime.tools import tool

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
HANG_GUARD = 60  # seconds: only so a regression fails instead of hanging the suite
CLEAR = "\x1b[2J\x1b[H"  # clears the screen and homes the cursor
TITLE = "\x1b]0;pwned\x07"  # sets the window title
CSI8 = "\x9b31m"  # the one-character (C1) CSI: red from here on, on terminals that obey it
RLO = "\u202e"  # right-to-left override: what follows reads backwards
HOSTILE = f"a{CLEAR}b{TITLE}c{CSI8}d{RLO}e"


def plain_console(buf: io.StringIO) -> Console:
    """A terminal console that writes no styles of its own: any escape in ``buf`` was
    the model's."""
    return Console(file=buf, width=120, force_terminal=True, color_system=None)


def test_terminal_text_escapes_controls_and_overrides_but_keeps_lines_and_tabs():
    assert terminal_text("line\n\tindented") == "line\n\tindented"
    assert terminal_text(HOSTILE) == (
        "a\\x1b[2J\\x1b[Hb\\x1b]0;pwned\x07c\\x9b31md\\u202ee"
    )  # BEL, like CR, rich drops itself
    assert terminal_text("مرحبا héllo ☃") == "مرحبا héllo ☃"  # plain RTL text stays


def test_a_models_escape_sequences_reach_the_terminal_as_visible_text():
    """Rich drops BEL and CR, never ESC: a model that wrote ``\\x1b[2J`` cleared the
    user's screen, and one that wrote an OSC set their window title."""
    buf = io.StringIO()
    renderer = TerminalRenderer(plain_console(buf))
    err = ErrorInfo(kind="ProviderError", message=f"bad {CLEAR}", retryable=False)
    for chunk in [
        o.ReasoningStart(step=0, part_id="r"),
        o.ReasoningDelta(step=0, part_id="r", text=HOSTILE),
        o.ReasoningFinish(step=0, part_id="r"),
        o.TextStart(step=0, part_id="t"),
        o.TextDelta(step=0, part_id="t", text=HOSTILE),
        o.TextFinish(step=0, part_id="t"),
        o.ToolInputStart(step=0, tool_call_id="c", tool_name=f"t{CLEAR}"),
        o.ToolCall(step=0, tool_call_id="c", tool_name=f"t{CLEAR}", input={"a": HOSTILE}),
        o.ToolResult(step=0, tool_call_id="c", tool_name=f"t{CLEAR}", output=HOSTILE),
        o.ToolError(step=0, tool_call_id="d", tool_name="t", error=HOSTILE),
        o.ToolOutputDenied(step=0, tool_call_id="e", tool_name="t", reason=HOSTILE),
        o.Error(error=err),
        o.Abort(reason=HOSTILE),
        o.Finish(finish_reason="stop", usage=Usage()),
    ]:
        renderer.render(chunk)
    text = buf.getvalue()
    assert "\x1b" not in text and "\x9b" not in text and RLO not in text
    assert text.count("\\x1b[2J") >= 8 and "\\x1b]0;pwned" in text and "\\u202e" in text


@tool(needs_approval=True)
async def delete(path: str) -> str:
    """Delete a file (it needs a person's approval)."""
    return "deleted"


def test_the_approval_prompt_shows_a_calls_overrides_and_escapes_as_text():
    """``approve NAME(ARGS)? [y/N]``: an override in the arguments made them read as other
    arguments, an escape sequence could rewrite the line the person decides on."""
    call = PendingCall(
        approval_id="a1",
        tool_call_id="c1",
        tool_name=f"delete{CLEAR}",
        input={"path": f"{RLO}txt.exe", "note": "\x9b2K"},
        kind="approval",
        step=0,
        message_id="m1",
        turn_id="t1",
    )
    shown = describe_call(call)
    assert "\x1b" not in shown and RLO not in shown and "\x9b" not in shown
    assert shown == 'delete\\x1b[2J\\x1b[H({"path": "\\u202etxt.exe", "note": "\\x9b2K"})'


async def test_show_prints_a_stored_sessions_escape_sequences_as_text(tmp_path, capsys):
    provider = ScriptedProvider(
        [[*tool_call("delete", {"path": HOSTILE}, tool_call_id="c1")], [HOSTILE]]
    )
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        agent = Agent(provider=provider, tools=[delete], name=f"x{CLEAR}")
        session = await host.open_session(agent, "s1")
        await session.run(f"user {TITLE}")
        await session.decide(session.pending[0].approval_id, approved=False, reason=HOSTILE)
        async with session.resume() as out:
            async for _ in out:
                pass
    capsys.readouterr()
    assert await show_command(argparse.Namespace(session_id="s1", store=str(db), json=False)) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x9b" not in text and RLO not in text
    assert "\\x1b[2J" in text and "\\x1b]0;pwned" in text


def axon(*args: str, **options: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=ROOT,
        env=ENV,
        **options,  # type: ignore[call-overload]
    )


def test_a_run_with_its_stdout_closed_runs_saves_and_exits_0_without_a_traceback(tmp_path):
    """``axon run ... >&-``: Python starts with ``sys.stdout`` ``None``, and the first
    look at it (is it a terminal?) raised AttributeError, a traceback, before any turn."""
    db = tmp_path / "s.db"
    proc = axon("run", "--store", str(db), "--session", "s1", "hi", preexec_fn=lambda: os.close(1))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    rows = sqlite3.connect(db).execute("select count(*) from sessions").fetchone()
    assert rows == (1,)


def test_an_agent_factory_that_returns_no_agent_is_one_error_line():
    """It was a traceback ending deep in the host (``'int' object has no attribute
    'provider'``)."""
    proc = axon("run", "--agent", "tests.support.cli_agents:not_an_agent_factory", "hi")
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: --agent 'tests.support.cli_agents:not_an_agent_factory' returned an int, "
        "not an Agent: expected an Agent, or a function of the session id returning one\n"
    )


async def test_the_host_refuses_what_is_not_an_agent_by_name():
    from runtime.errors import ConfigurationError

    async with Host.open(log_tap=False) as host:
        try:
            await host.open_session(42)  # type: ignore[arg-type]
        except ConfigurationError as exc:
            assert str(exc) == "open_session needs an Agent, not int"
        else:
            raise AssertionError("an int opened a session")


def test_a_recording_into_a_missing_folder_or_onto_a_folder_is_one_error_line(tmp_path):
    """Checked by the plug-in's factory: the recorder's first open failed, four times over
    its restart policy, and ``run`` ended in a traceback."""
    missing = tmp_path / "nowhere" / "events.jsonl"
    proc = axon("run", "--record", str(missing), "hi")
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr == f"error: cannot record to {missing}: there is no folder {missing.parent}\n"
    )
    proc = axon("run", "--plugin", f"recorder:{tmp_path}", "hi")
    assert proc.returncode == 2
    assert proc.stderr == f"error: cannot record to {tmp_path}: it is a folder, not a file\n"


def test_a_plug_in_that_cannot_start_is_one_error_line():
    """A file the factory's checks let through that still does not open (``/proc`` takes
    no new file): the actor gives up, and ``run`` says so on one line."""
    proc = axon("run", "--plugin", "recorder:/proc/axon-events.jsonl", "hi")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: actor 'recorder' could not start: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_terminal_one_column_wide_still_shows_each_cards_input_and_result():
    """At four columns or fewer the card's box left its content no room: the call's input
    and result vanished (only its corners were printed)."""
    buf = io.StringIO()
    renderer = TerminalRenderer(Console(file=buf, width=1, force_terminal=True, color_system=None))
    for chunk in [
        o.ToolCall(step=0, tool_call_id="c", tool_name="get_weather", input={"city": "Oslo"}),
        o.ToolResult(step=0, tool_call_id="c", tool_name="get_weather", output="sunny"),
        o.Finish(finish_reason="stop", usage=Usage()),
    ]:
        renderer.render(chunk)
    lines = buf.getvalue().splitlines()
    assert lines == [
        "tool · get_weather",
        'input  {"city": "Oslo"}',
        "result sunny",
        "[stop · 0 in / 0 out tokens]",
    ]


def test_replay_says_which_line_of_a_foreign_event_log_it_cannot_read(tmp_path):
    """Valid JSON that is no event (an array, a chunk missing its fields) was a traceback;
    a kind a later version records is passed over, as the renderer passes over a chunk
    type it does not show."""
    log = tmp_path / "events.jsonl"
    log.write_text('{"kind":"output.text-delta","text":"hi"}\n')
    proc = axon("replay", str(log))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {log} line 1 is no valid output.text-delta event: ")
    log.write_text('{"kind":"turn.started"}\n[1, 2]\n')
    proc = axon("replay", str(log))
    assert (proc.returncode, proc.stderr) == (
        2,
        f"error: {log} is not a JSONL event log: line 2 is no object\n",
    )
    log.write_text(
        '{"kind":"output.from-the-future","turn_id":"t"}\n{"kind":"turn.finished","turn_id":"t"}\n'
    )
    proc = axon("replay", str(log))
    assert (proc.returncode, proc.stderr) == (0, "")


def test_half_an_emoji_in_a_delta_is_printed_escaped_not_raised():
    """A provider that splits a surrogate pair across two deltas (or a tool's file name
    decoded with ``surrogateescape``) gave the renderer a lone surrogate, which no
    encoding writes: ``run`` ended in UnicodeEncodeError. ``--jsonl`` ended in orjson's
    refusal; JSON's own escape joins the halves again in a UTF-16 reader (JavaScript)."""
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    renderer = TerminalRenderer(Console(file=stdout, width=80, color_system=None))
    for text in ["half \ud83d", "\ude00 smile"]:
        renderer.render(o.TextDelta(step=0, part_id="t", text=text))
    stdout.flush()
    assert raw.getvalue().decode() == "half \\ud83d\\ude00 smile"
    line = json_line({"text": " \ud83d"})
    assert line == b'{"text":" \\ud83d"}\n'
    assert json_line({"text": "plain"}) == b'{"text":"plain"}\n'


SEPARATORS = "a\u2028b\u2029c\u200ed\u200fe\u061cf"
"""Unicode's line and paragraph separators and the bidi marks that are no override (LRM,
RLM, ALM): they start a new line or reorder what follows on some terminals."""


async def test_show_prints_a_stored_texts_line_separators_and_bidi_marks_as_escapes(
    tmp_path, capsys
):
    """Before: ``show`` printed U+2028/U+2029 and LRM/RLM/ALM raw, where every other
    control character and override of a stored text is printed as a visible escape."""
    provider = ScriptedProvider([[SEPARATORS]])
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), "s1")
        await session.run(f"user {SEPARATORS}")
    capsys.readouterr()
    assert await show_command(argparse.Namespace(session_id="s1", store=str(db), json=False)) == 0
    text = capsys.readouterr().out
    assert not set("\u2028\u2029\u200e\u200f\u061c") & set(text)
    assert text.count("a\\u2028b\\u2029c\\u200ed\\u200fe\\u061cf") == 2  # the user's, the model's
