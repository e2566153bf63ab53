"""The type checker passes: strict on the contract layer, as annotated on the rest.

mypy runs as a subprocess with the configuration in pyproject.toml; its cache lives in
the temporary directory, so only the first run on a machine reads every library.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = {
    f"runtime.{name}"
    for name in (
        "chunks events messages output bus inbox actor errors actor_messages provider store relay "
        "tools ids serde redact budget retry history"
    ).split()
}
STRICT_FLAGS = ("disallow_untyped_defs", "disallow_any_generics", "warn_return_any")


def test_mypy_finds_no_errors_in_runtime_and_actors():
    cache = Path(tempfile.gettempdir()) / "axon-mypy-cache"
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout


def test_the_contract_layer_is_checked_strictly():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    strict = [o for o in config["overrides"] if all(o.get(flag) is True for flag in STRICT_FLAGS)]
    covered = {module for o in strict for module in o["module"]}
    assert CONTRACT <= covered, sorted(CONTRACT - covered)
    assert {"runtime", "actors"} <= set(config["files"])
