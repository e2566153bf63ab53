"""The README's embedding example runs as written and does what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_embedding_example_runs_and_prints_the_turn():
    (example,) = [b for b in readme_blocks("python") if "Host.open" in b]
    proc = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "start" and "tool-result" in lines and "finish" in lines
    assert any(line.startswith("stop Usage(") for line in lines)
    assert "It is sunny in Paris." in proc.stdout


def test_run_sync_example_prints_the_answer():
    (example,) = [b for b in readme_blocks("python") if "run_sync(" in b]
    proc = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Hello! How can I help?\n"


DEMO_COMMAND = (
    'python3 -m pip install -e . && python3 -m runtime run "What\'s the weather in Paris?"'
)
TEST_COMMAND = "python3 -m pip install -e '.[test]' && python3 -m pytest"


def test_quick_start_installs_the_core_for_the_demo_and_the_extras_for_the_tests():
    first, second = [b.strip() for b in readme_blocks("sh")[:2]]
    assert (first, second) == (DEMO_COMMAND, TEST_COMMAND)


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in ci_lines


def test_the_demo_imports_no_optional_package():
    """The first command installs the core only: the demo must not need an extra."""
    optional = ["mcp", "opentelemetry", "psycopg", "psycopg_pool", "playwright", "pytest"]
    blocker = (
        "import sys, runpy\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {optional!r}:\n"
        "            raise ImportError(f'{name} is optional')\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.argv = ['runtime', 'run', \"What's the weather in Paris?\"]\n"
        "runpy.run_module('runtime', run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "in Paris right now." in proc.stdout
