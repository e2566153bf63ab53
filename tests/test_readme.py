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


def test_quick_start_names_the_install_and_test_commands():
    shell = "\n".join(readme_blocks("sh"))
    assert "pip install -e '.[test]' && python3 -m runtime run" in shell
    assert "python3 -m pytest" in shell
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pytest" in ci
