"""Run the ``python3 -m runtime`` command as a user would, from the repository's root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_runtime(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python3 -m runtime ARGS`` in a child (this interpreter, the checkout's root as
    its directory), its output captured as text; ``timeout`` guards a hung child."""
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
