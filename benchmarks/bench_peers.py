"""7. Peers: the pipeline benchmark for Pydantic AI and the OpenAI Agents SDK.

They run on asyncio with their own dependencies, so they live in a separate virtualenv
(``--peers`` creates it when it is missing, ``--setup-peers`` reinstalls it:
``python -m venv /tmp/peers`` and ``pip install pydantic-ai-slim[openai,anthropic]
openai-agents orjson``). :mod:`benchmarks.peers_worker` runs
there against the same loopback server process and bytes as Axon's pipeline benchmark,
and compares each framework with the raw SDK read in its own process, alternating, the
same way; so each peer's figure is a ratio to the raw SDK like Axon's, and to the floor
(bare httpx + orjson, :mod:`benchmarks.floor`) read in the same rounds. Missing: skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from benchmarks.common import REPO, Figure, ServerAddress, Sizes, median, python_env

DEFAULT_VENV = Path("/tmp/peers")
PACKAGES = ("pydantic-ai-slim[openai,anthropic]", "openai-agents", "orjson")
"""The peers, and orjson for the floor the worker reads beside them."""


def peers_python(explicit: str | None = None) -> Path | None:
    for candidate in (explicit, os.environ.get("AXON_BENCH_PEERS_PYTHON")):
        if candidate:
            return Path(candidate)
    default = DEFAULT_VENV / "bin" / "python"
    return default if default.exists() else None


def setup(venv: Path = DEFAULT_VENV) -> Path:
    """Create the peers' virtualenv (idempotent); returns its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    return python


def _spread(ratios: list[float]) -> str:
    return f"ratios min {min(ratios):.2f} / max {max(ratios):.2f} ({len(ratios)} rounds)"


def run(sizes: Sizes, server: ServerAddress, python: Path | None) -> list[Figure]:
    if python is None or not python.exists():
        return [
            Figure(
                key="peers",
                title="7. Peers (Pydantic AI, OpenAI Agents SDK)",
                value=None,
                unit="",
                detail="skipped: no peers virtualenv (run with --peers)",
            )
        ]
    proc = subprocess.run(
        [
            str(python),
            str(REPO / "benchmarks" / "peers_worker.py"),
            str(server.port),
            str(sizes.pipeline_deltas),
            str(sizes.peer_rounds),
            str(sizes.warmup),
        ],
        cwd=REPO,
        env={k: v for k, v in python_env().items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=400,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [
            Figure(
                key="peers",
                title="7. Peers (Pydantic AI, OpenAI Agents SDK)",
                value=None,
                unit="",
                detail=f"skipped: the peers worker failed: {tail[0]}",
            )
        ]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    versions = report.get("versions", {})
    figures = []
    for item in report["results"]:
        ratios = [p / r for p, r in zip(item["peer_s"], item["raw_s"], strict=True)]
        slug = item["framework"].lower().replace(" ", "_")
        figures.append(
            Figure(
                key=f"peers.{slug}.{item['format']}",
                title=f"7. {item['framework']} / raw SDK, {item['format']} (asyncio)",
                value=median(ratios),
                unit="x",
                detail=(
                    f"raw {median(item['raw_s']) * 1e3:.1f} ms, "
                    f"peer {median(item['peer_s']) * 1e3:.1f} ms; {_spread(ratios)}"
                ),
                data={**item, "ratios": ratios, "versions": versions},
            )
        )
        if "floor_s" in item:
            floor_ratios = [p / f for p, f in zip(item["peer_s"], item["floor_s"], strict=True)]
            figures.append(
                Figure(
                    key=f"peers_floor.{slug}.{item['format']}",
                    title=f"7f. {item['framework']} / floor, {item['format']} (asyncio)",
                    value=median(floor_ratios),
                    unit="x",
                    detail=(
                        f"floor {median(item['floor_s']) * 1e3:.1f} ms, "
                        f"peer {median(item['peer_s']) * 1e3:.1f} ms; {_spread(floor_ratios)}"
                    ),
                    data={"ratios": floor_ratios},
                )
            )
    for reason in report.get("skipped", []):
        figures.append(
            Figure(key="peers.skipped", title="7. Peer skipped", value=None, unit="", detail=reason)
        )
    return figures
