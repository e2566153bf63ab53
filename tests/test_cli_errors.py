"""Bad ``--session``/``--store`` values print one clear line and exit 2, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BAD_ID = "bad id!"
NO_DIR = "/nonexistent/dir/x.db"
ID_ERROR = "invalid session id 'bad id!'"
OPEN_ERROR = f"session store {NO_DIR}: open failed"
NOT_A_STORE = "is not an Axon store"


def python_m(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("my notes, not a database\n")
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--session", BAD_ID, "hi"], ID_ERROR),
        (["run", "--store", NO_DIR, "hi"], OPEN_ERROR),
        (["run", "--store", "{text}", "hi"], NOT_A_STORE),
        (["show", BAD_ID, "--store", "{text}"], ID_ERROR),
        (["show", "s1", "--store", NO_DIR], f"no session store at {NO_DIR}"),
        (["show", "s1", "--store", "{text}"], NOT_A_STORE),
        (["sessions", "--store", NO_DIR], f"no session store at {NO_DIR}"),
        (["sessions", "--store", "{text}"], NOT_A_STORE),
        (["replay", "{text}", "--session", BAD_ID], ID_ERROR),
        (["replay", "/nonexistent/events.jsonl"], "no event log at /nonexistent/events.jsonl"),
        (["serve", "--port", "0", "--store", NO_DIR], OPEN_ERROR),
        (["serve", "--port", "0", "--store", "{text}"], NOT_A_STORE),
        (["run", "--session", "s1", "hi"], "--session needs --store"),
        (["run", "--mcp", "nosuchcmd --x", "hi"], "MCP server 'nosuchcmd' could not start"),
    ],
)
def test_bad_input_prints_the_message_alone_and_exits_2(argv, message, text_file):
    argv = [arg.replace("{text}", str(text_file)) for arg in argv]
    proc = python_m("runtime", *argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1  # one line: the message alone
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert text_file.read_text() == "my notes, not a database\n"  # refused, untouched


def test_the_standalone_serve_module_reports_a_bad_store_the_same_way(text_file):
    proc = python_m("runtime.app.web.serve", "--port", "0", "--store", str(text_file))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and NOT_A_STORE in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", [["sessions"], ["show", "s1"]])
def test_reading_a_missing_store_does_not_create_it(command, tmp_path):
    missing = tmp_path / "typo.db"
    proc = python_m("runtime", *command, "--store", str(missing))
    assert proc.returncode == 2 and proc.stderr == f"error: no session store at {missing}\n"
    assert not missing.exists()


def test_a_file_that_is_not_an_event_log_is_reported_by_replay(text_file):
    proc = python_m("runtime", "replay", str(text_file))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {text_file} is not a JSONL event log")


def test_a_busy_port_is_one_error_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = python_m("runtime", "serve", "--port", str(port))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: cannot serve on 127.0.0.1:{port}: ")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_a_busy_port_says_how_to_choose_another():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = python_m("runtime", "serve", "--port", str(port))
    assert proc.returncode == 2
    assert proc.stderr.endswith("pass --port N, or --port 0 for a free one)\n"), proc.stderr


@pytest.mark.parametrize(
    ("provider", "variable"),
    [
        ("openai", "OPENAI_API_KEY"),
        ("openai-responses", "OPENAI_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
    ],
)
def test_a_missing_key_is_one_line_naming_the_option_and_the_variable(provider, variable):
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_AUTH_TOKEN"))}
    # a closed loopback port: were a request made, it would fail differently
    argv = ["run", "--provider", provider, "--base-url", "http://127.0.0.1:9", "hi"]
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 1
    assert proc.stderr == ""
    assert proc.stdout == (
        f"error: AuthenticationFailed: no API key for {provider}: set {variable}, or pass "
        "a key (the api_key argument in code, --api-key with --provider or --model)\n"
    )


def test_a_missing_key_under_agent_names_the_variable_and_the_code_argument_first(tmp_path):
    """Under ``--agent module:name`` ``--api-key`` is refused; the line once told the
    user to pass it. It now names the variable first and says where --api-key applies."""
    (tmp_path / "keyless.py").write_text(
        "from actors.providers import OpenAIProvider\n"
        "from runtime.agent import Agent\n"
        "agent = Agent(provider=OpenAIProvider('gpt-4o', base_url='http://127.0.0.1:9'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_AUTH_TOKEN"))}
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "run", "--agent", "keyless:agent", "hi"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == (
        "error: AuthenticationFailed: no API key for openai: set OPENAI_API_KEY, or pass "
        "a key (the api_key argument in code, --api-key with --provider or --model)\n"
    )


def test_a_misspelt_log_level_is_refused():
    proc = python_m("runtime", "run", "--log-level", "verbose", "hi")
    assert proc.returncode == 2 and "invalid choice: 'verbose'" in proc.stderr


@pytest.mark.parametrize("command", [["sessions"], ["show", "s1"]])
def test_reading_sessions_needs_a_store(command, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", *command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # where a default ./sessions.db would have been read
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2
    assert "the following arguments are required: --store" in proc.stderr


BLOCK_AND_RUN = (
    "import sys, runpy\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == {module!r}:\n"
    "            raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)\n"
    "sys.meta_path.insert(0, Block())\n"
    "sys.argv = ['runtime', *{argv!r}]\n"
    "runpy.run_module('runtime', run_name='__main__')\n"
)


@pytest.mark.parametrize(
    ("provider", "module", "env"),
    [
        ("google", "google", {"GEMINI_API_KEY": "dummy"}),
        (
            "anthropic-vertex",
            "google",
            {"CLOUD_ML_REGION": "us-east5", "ANTHROPIC_VERTEX_PROJECT_ID": "p"},
        ),
        (
            "anthropic-bedrock",
            "botocore",
            {"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"},
        ),
    ],
)
def test_a_provider_whose_extra_is_not_installed_names_the_extra_to_install(provider, module, env):
    """The base install lacks these SDKs' modules: the error says which extra to add."""
    argv = ["run", "--provider", provider, "--base-url", "http://127.0.0.1:9", "hi"]
    code = BLOCK_AND_RUN.format(module=module, argv=argv)
    quiet = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**quiet, **env},
    )
    assert proc.returncode == 1, proc.stderr
    extra = provider.removeprefix("anthropic-")
    assert proc.stdout.startswith("error: ConfigurationError: ") and proc.stdout.count("\n") == 1
    assert module in proc.stdout  # what is missing, named
    assert proc.stdout.endswith(f"pip install 'axon-runtime[{extra}]'\n")


def test_google_without_its_extra_or_a_key_names_the_extra_first():
    """The key was checked first: a newcomer on the core install was told to set
    GEMINI_API_KEY, and only then that google-genai is missing."""
    code = BLOCK_AND_RUN.format(module="google", argv=["run", "--provider", "google", "hi"])
    quiet = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=quiet,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == (
        "error: ConfigurationError: google cannot run without google-genai: "
        "pip install 'axon-runtime[google]'\n"
    )


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["serve", "--protocols", "ai-sdk,mcp", "--port", "0"], "--protocols mcp"),
        (["mcp-server"], "mcp-server"),
    ],
)
def test_serving_mcp_without_the_mcp_extra_names_the_extra_to_install(argv, what):
    code = BLOCK_AND_RUN.format(module="mcp", argv=argv)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: {what} needs the mcp package, which is not installed: "
        "pip install 'axon-runtime[mcp]'\n"
    )


def test_an_mcp_tool_server_without_the_mcp_extra_says_what_serving_mcp_says():
    """The client side (actors/mcp.py) checked for the package with a message of its own
    ("MCP servers need the mcp package: ..."); both layers share runtime.extras now."""
    argv = ["run", "--mcp", "python3 notes.py", "hi"]
    code = BLOCK_AND_RUN.format(module="mcp", argv=argv)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "error: MCP server 'notes' could not start: ConfigurationError: an MCP tool server "
        "needs the mcp package, which is not installed: pip install 'axon-runtime[mcp]'\n"
    )


@pytest.mark.parametrize("command", ["run", "serve", "worker", "mcp-server"])
def test_a_negative_delay_is_refused_before_anything_runs(command):
    extra = {"run": ["hi"], "serve": ["--port", "0"], "worker": ["--store", "postgresql://x/y"]}
    proc = python_m("runtime", command, "--delay", "-1", *extra.get(command, []))
    assert proc.returncode == 2
    assert "argument --delay: '-1' is not a float of 0 or more" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("flag", ["--max-body", "--body-timeout", "--send-timeout"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_serve_limit_of_zero_or_less_is_refused(flag, value):
    """It would refuse every request (413, or a body that 'took too long') once serving."""
    proc = python_m("runtime", "serve", "--port", "0", flag, value)
    assert proc.returncode == 2
    assert f"argument {flag}: '{value}' is not a positive" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_worker_poll_of_zero_or_less_is_refused(value):
    """0 would claim in a busy loop against PostgreSQL; -1 fail the loop's sleep."""
    proc = python_m("runtime", "worker", "--store", "postgresql://x/y", "--poll", value)
    assert proc.returncode == 2
    assert f"argument --poll: '{value}' is not a positive float" in proc.stderr
