"""``--call-timeout`` and ``--idle-timeout``: the provider's two deadlines from the command
line, on every command that builds a provider from its flags (``run``, ``serve``,
``worker``, ``mcp-server``). Before, only Python code could set them: a user of the
command line had 30 minutes a call and 5 minutes of silence, whatever the model."""

from __future__ import annotations

import pytest

from runtime import Host
from runtime.app.cli import build_parser
from runtime.app.commands import agent_options, make_agent
from runtime.provider import CALL_TIMEOUT, IDLE_TIMEOUT
from tests.support.commands import run_runtime

COMMANDS = {
    "run": ["run", "hi"],
    "serve": ["serve", "--port", "0"],
    "worker": ["worker", "--store", "postgresql://x/y"],
    "mcp-server": ["mcp-server"],
}
"""Each command that builds a provider from flags, with what else it needs to parse."""


def agent_of(command: str, *flags: str):  # type: ignore[no-untyped-def]
    """The agent ``command`` builds from ``flags``, as it does when it starts."""
    name, *rest = COMMANDS[command]
    return make_agent(build_parser().parse_args([name, *flags, *rest]))


@pytest.mark.parametrize("command", COMMANDS)
def test_both_flags_reach_the_provider_of_every_command(command):
    agent = agent_of(
        command, "--model", "openai:m", "--call-timeout", "90", "--idle-timeout", "7.5"
    )
    assert (agent.provider.call_timeout, agent.provider.idle_timeout) == (90.0, 7.5)
    assert (
        agent.provider.describe()["call_timeout"],
        agent.provider.describe()["idle_timeout"],
    ) == (
        90.0,
        7.5,
    )


@pytest.mark.parametrize("off", ["0", "none", "off", "None"])
def test_zero_or_none_switches_a_deadline_off(off):
    agent = agent_of("run", "--provider", "anthropic", "--call-timeout", off)
    assert (agent.provider.call_timeout, agent.provider.idle_timeout) == (None, IDLE_TIMEOUT)


def test_a_flag_not_given_leaves_the_providers_own_deadline():
    agent = agent_of("serve", "--provider", "openai", "--idle-timeout", "30")
    assert (agent.provider.call_timeout, agent.provider.idle_timeout) == (CALL_TIMEOUT, 30.0)


async def test_the_idle_timeout_given_ends_a_call_that_streams_nothing_for_longer(autojump_clock):
    """The value is the provider's deadline, not only parsed: the scripted demo paced at
    one chunk every 50 s fails with ``IdleTimeout`` under ``--idle-timeout 10``."""
    args = build_parser().parse_args(["run", "--delay", "50", "--idle-timeout", "10", "hi"])
    agent = make_agent(args)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("hi")
    assert result.finish_reason == "error"
    assert result.error is not None and result.error.kind == "IdleTimeout"
    assert "10 s (idle_timeout" in result.error.message


def test_the_deciding_command_repeats_the_deadlines():
    """``run``'s line for deciding a waiting turn elsewhere builds the same provider."""
    args = build_parser().parse_args(
        ["run", "--provider", "openai", "--call-timeout", "90", "--idle-timeout", "0", "hi"]
    )
    options = agent_options(args)
    assert options[options.index("--call-timeout") + 1] == "90"
    assert options[options.index("--idle-timeout") + 1] == "none"


@pytest.mark.parametrize("bad", ["-5", "abc", "nan"])
def test_a_deadline_that_is_no_positive_number_is_refused_before_anything_runs(bad):
    proc = run_runtime("run", "--idle-timeout", bad, "hi")
    assert proc.returncode == 2
    refusal = f"argument --idle-timeout: {bad!r} is not a positive number of seconds"
    assert proc.stderr.splitlines()[-1].endswith(f"{refusal} (0 or none: no limit)")
    assert proc.stdout == ""


def test_a_deadline_with_agent_is_refused_as_the_other_provider_options_are():
    proc = run_runtime("run", "--agent", "tests.fixtures:agent", "--call-timeout", "60", "hi")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --agent names the whole agent: drop --call-timeout\n",
    )
