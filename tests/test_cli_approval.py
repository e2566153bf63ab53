"""``run`` decides a turn that waits for approval (docs/approval.md, "The command line"):
``--approve-all``, ``--deny-all``, a ``[y/N]`` prompt on a terminal, and otherwise one
line and exit status 3, never a wait on a stdin nobody types into."""

from __future__ import annotations

import argparse
import os
import pty
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs

from runtime.app.cli import build_parser, show_command, waiting_line
from runtime.app.commands import choose_provider
from runtime.app.host import Host
from runtime.approval import PendingCall
from tests.support import approval_agents

ROOT = Path(__file__).resolve().parents[1]
AGENTS = "tests.support.approval_agents"
PROGRAM = f"{os.path.basename(sys.executable)} -m runtime"  # what these tests type
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
HANG_GUARD = 60  # seconds: only so a regression fails instead of hanging the suite


def axon(*args: str, stdin: int = subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=ROOT,
        env=ENV,
    )


def run(agent: str, *args: str) -> subprocess.CompletedProcess:
    return axon("run", "--agent", f"{AGENTS}:{agent}", *args)


def run_in_a_terminal(
    answer: str, *options: str, agent: str = "agent", typed_after: float = 0.0
) -> subprocess.CompletedProcess:
    """``run`` (with ``options``) with its stdin on a pseudo-terminal, where ``answer``
    is typed (``typed_after`` seconds after the first prompt showed: a person slow to)."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime",
                "run",
                "--agent",
                f"{AGENTS}:{agent}",
                *options,
                "hi",
            ],
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=ENV,
        )
        os.close(follower)
        shown = ""
        if typed_after:
            assert proc.stdout is not None
            while not shown.endswith("[y/N] "):  # (what it wrote before, up to the prompt)
                char = proc.stdout.read(1)
                if not char:
                    break
                shown += char
            time.sleep(typed_after)
        os.write(leader, answer.encode() + b"\n")  # the terminal holds it until read
        out, err = proc.communicate(timeout=HANG_GUARD)
        out = shown + out
    finally:
        os.close(leader)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_approve_all_runs_the_tool_once_and_prints_the_answer():
    proc = run("agent", "--approve-all", "hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("result sunny in Oslo") == 1
    assert "It is sunny in Oslo." in proc.stdout


def test_deny_all_shows_the_denial_and_the_models_answer_to_it():
    proc = run("agent", "--deny-all", "hi")
    assert proc.returncode == 0, proc.stderr
    assert "get_weather denied: denied by --deny-all" in proc.stdout
    assert "I could not check: the tool call was denied: denied by --deny-all." in proc.stdout
    assert "sunny" not in proc.stdout


def test_y_at_the_terminal_prompt_approves():
    proc = run_in_a_terminal("y")
    assert proc.returncode == 0, proc.stderr
    assert 'approve get_weather({"city": "Oslo"})? [y/N] ' in proc.stdout
    assert "It is sunny in Oslo." in proc.stdout


def test_e_at_the_terminal_prompt_approves_with_the_input_typed():
    proc = run_in_a_terminal('e\n{"city": "Bergen"}')
    assert proc.returncode == 0, proc.stderr
    assert "input for get_weather (a JSON object): " in proc.stdout
    assert proc.stdout.count("result sunny in Bergen") == 1
    assert "It is sunny in Bergen." in proc.stdout and "sunny in Oslo" not in proc.stdout


def test_an_edit_that_is_not_json_or_not_the_tools_input_is_asked_again():
    proc = run_in_a_terminal('e\n{city\ne\n{"city": 3}\ne\n{"city": "Bergen"}')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("[y/N] ") == 3
    err = proc.stderr.splitlines()
    assert [line for line in err if line.endswith("asked again")] == [
        line for line in err if "not JSON" in line or "invalid arguments for get_weather" in line
    ]
    assert len([line for line in err if line.endswith("asked again")]) == 2
    assert "It is sunny in Bergen." in proc.stdout


def test_an_answer_typed_after_the_wait_expired_says_so_and_shows_the_turn_it_went_on_to(
    tmp_path,
):
    """Before: ``error: 'approval_...' was decided already``, exit 2, while the host had
    denied the call ``timed out`` and run the turn on in the background: the person
    never saw why, nor the answer (without ``--store`` the host's close cut it)."""
    for store in ([], ["--store", str(tmp_path / "s.db")]):
        proc = run_in_a_terminal("y", *store, agent="expiring", typed_after=1.0)
        assert proc.returncode == 0, proc.stderr
        said = proc.stderr.splitlines()
        assert said[0] == (
            "get_weather: its wait expired before the answer, so it was denied (timed out) "
            "and the turn went on without it"
        )
        assert len(said) == (2 if store else 1), said  # the stored session's id line
        assert proc.stdout.count("I could not check: the tool call was denied: timed out.") == 1
        assert "sunny" not in proc.stdout


def test_enter_at_the_terminal_prompt_denies():
    proc = run_in_a_terminal("")
    assert proc.returncode == 0, proc.stderr
    assert "get_weather denied: denied at the prompt" in proc.stdout


def test_ctrl_c_at_the_prompt_leaves_the_call_waiting(tmp_path):
    db = str(tmp_path / "s.db")
    leader, follower = pty.openpty()
    argv = ["run", "--agent", f"{AGENTS}:agent", "--store", db, "--session", "s1", "hi"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", *argv],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=ENV,
    )
    os.close(follower)
    guard = threading.Timer(HANG_GUARD, proc.kill)
    guard.start()
    try:
        shown = b""
        while b"[y/N] " not in shown and (chunk := os.read(proc.stdout.fileno(), 4096)):
            shown += chunk
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        guard.cancel()
        os.close(leader)
    assert proc.returncode == 130
    # ...and says how to decide it later, as a run that cannot ask does
    assert f"decide with `{PROGRAM} run --agent {AGENTS}:agent --store" in err.decode()
    assert run("agent", "--store", db, "--session", "s1").returncode == 3  # still waiting


def test_without_a_terminal_or_a_flag_it_says_so_on_one_line_and_exits_3():
    proc = run("agent", "hi")
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [
        'the turn waits for approval: get_weather({"city": "Oslo"}); nothing is stored without '
        "--store: run again with --approve-all or --deny-all, or from a terminal to be asked"
    ]


def test_a_stored_waiting_turn_names_its_session_and_how_to_decide_it(tmp_path):
    db = str(tmp_path / "s.db")
    proc = run("agent", "--store", db, "--session", "s1", "hi")
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [
        f'the turn waits for approval: get_weather({{"city": "Oslo"}}); session s1 is stored '
        f"in {db}: decide with `{PROGRAM} run --agent {AGENTS}:agent --store {db} "
        "--session s1 --approve-all` (or --deny-all)"
    ]


def test_the_command_the_waiting_line_gives_decides_the_turn_with_the_same_agent(tmp_path):
    """Copied as it is: it used to leave the agent out ("and the same agent options"),
    so it resumed the turn on the demo agent, which has no such tool."""
    db = str(tmp_path / "s.db")
    line = run("agent", "--store", db, "--session", "s1", "hi").stderr
    program, _, command = line.split("`")[1].partition(" run ")
    assert program == PROGRAM
    proc = axon("run", *shlex.split(command))
    assert proc.returncode == 0, proc.stderr
    assert "It is sunny in Oslo." in proc.stdout


def test_the_deciding_command_repeats_a_providers_options_but_never_its_key():
    argv = ["run", "--model", "openai:gpt-4o", "--instructions", "Be brief.", "--base-url"]
    argv += ["http://me:pw@127.0.0.1:9/v1", "--api-key", "sk-s3cret", "--store", "s.db", "hi"]
    args = build_parser().parse_args(argv)
    choose_provider(args)  # as making the agent does: the provider from the model's prefix
    call = PendingCall(
        approval_id="a1",
        tool_call_id="c1",
        tool_name="get_weather",
        input={},
        kind="approval",
        step=0,
        message_id="m1",
        turn_id="t1",
    )
    line = waiting_line([call], "s1", args)
    assert "sk-s3cret" not in line and ":pw@" not in line
    assert line.endswith(
        f"decide with `{PROGRAM} run --provider openai --model gpt-4o --base-url "
        "'http://me:[redacted]@127.0.0.1:9/v1' --instructions 'Be brief.' --store s.db "
        "--session s1 --approve-all` (or --deny-all) (and your --api-key)"
    )


def test_both_flags_are_one_error_line():
    proc = run("agent", "--approve-all", "--deny-all", "hi")
    assert proc.returncode == 2
    assert proc.stderr == "error: --approve-all and --deny-all cannot be used together\n"


def test_a_second_run_without_a_prompt_resumes_the_stored_waiting_turn(tmp_path):
    db = str(tmp_path / "s.db")
    assert run("agent", "--store", db, "--session", "s1", "hi").returncode == 3
    proc = run("agent", "--store", db, "--session", "s1", "--approve-all")
    assert proc.returncode == 0, proc.stderr
    assert 'input  {"city": "Oslo"}' in proc.stdout  # the call was asked by the first run
    assert "It is sunny in Oslo." in proc.stdout
    shown = axon("show", "s1", "--store", db).stdout
    assert shown.count('tool get_weather result (step 0): "sunny in Oslo"') == 1


def test_show_says_how_each_call_that_waited_was_decided(tmp_path):
    db = str(tmp_path / "s.db")
    assert run("agent", "--store", db, "--session", "yes", "--approve-all", "hi").returncode == 0
    assert run("agent", "--store", db, "--session", "no", "--deny-all", "hi").returncode == 0
    # one space for every run of blanks: the lines are wrapped at the console's width
    approved, denied = (
        " ".join(axon("show", s, "--store", db).stdout.split()) for s in ("yes", "no")
    )
    call = 'tool-call get_weather({"city":"Oslo"}) id=call_get_weather'
    assert f"{call}, approved [step 1]" in approved
    assert f"{call}, denied: denied by --deny-all [step 1]" in denied


def test_show_says_a_call_was_approved_with_edits_and_what_the_model_asked(tmp_path):
    db = str(tmp_path / "s.db")
    done = run_in_a_terminal('e\n{"city": "Bergen"}', "--store", db, "--session", "s1")
    assert done.returncode == 0, done.stderr
    shown = " ".join(axon("show", "s1", "--store", db).stdout.split())
    assert (
        'tool-call get_weather({"city":"Bergen"}) id=call_get_weather, approved with edits '
        '(the model\'s input {"city":"Oslo"}) [step 1]'
    ) in shown


def test_e_for_a_sub_agents_approval_edits_the_sub_agents_call_and_show_says_so(tmp_path):
    """The prompt names the sub call that asks (``as_tool(pass_approvals=True)``), ``e``
    takes that tool's input (the agent tool's own ``input`` is refused and asked again),
    the sub-agent's tool runs the edit, and ``show`` says what ran."""
    db = str(tmp_path / "s.db")
    done = run_in_a_terminal(
        'e\n{"input": "Bergen?"}\ne\n{"city": "Bergen"}',
        "--store",
        db,
        "--session",
        "s1",
        agent="delegates",
    )
    assert done.returncode == 0, done.stderr
    asked = 'approve weather_agent({"input": "Oslo?"}) asking get_weather({"city": "Oslo"})?'
    assert asked in done.stdout
    assert done.stdout.count("input for get_weather (a JSON object): ") == 2
    assert "names 'input', which get_weather does not take" in done.stderr
    assert "It is It is sunny in Bergen.." in done.stdout
    shown = " ".join(axon("show", "s1", "--store", db).stdout.split())
    assert 'approved with edits (get_weather runs with {"city":"Bergen"})' in shown


def test_no_prompt_and_no_waiting_turn_is_an_error(tmp_path):
    db = str(tmp_path / "s.db")
    assert run("agent", "--store", db, "--session", "s1", "--approve-all", "hi").returncode == 0
    proc = run("agent", "--store", db, "--session", "s1", "--approve-all")
    assert proc.returncode == 2
    assert proc.stderr == "error: session s1 has no turn waiting for a decision: give a prompt\n"


def test_no_prompt_and_no_session_keeps_the_prompt_required():
    proc = run("agent", "--approve-all")
    assert proc.returncode == 2
    assert "error: the following arguments are required: prompt" in proc.stderr


def test_a_turn_that_asks_again_is_decided_again():
    proc = run("twice", "--approve-all", "hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("waits for approval") == 2
    assert "result sunny in Paris" in proc.stdout
    assert "It is sunny in Paris." in proc.stdout


def test_a_client_side_tool_gets_an_error_result_for_want_of_a_client():
    proc = run("client", "--approve-all", "hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "the command line has no client to run the client-side tool locate: "
        "it gets an error as its result\n"
    )
    assert "I could not check: the command line has no client" in proc.stdout


async def test_show_prints_the_calls_a_stored_turn_waits_for_with_their_deadline(tmp_path, capsys):
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        host.clock = lambda: 1_700_000_000.0
        timed = attrs.evolve(approval_agents.agent, approval_timeout=60)
        session = await host.open_session(timed, "s1")
        result = await session.run("weather?")
    capsys.readouterr()
    args = argparse.Namespace(session_id="s1", store=str(db), json=False)
    assert await show_command(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        'waiting for approval: get_weather({"city":"Oslo"}) approval id '
        f"{result.pending[0].approval_id}, expires 2023-11-14T22:14:20+00:00"
    )
