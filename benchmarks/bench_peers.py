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
from typing import Any

from benchmarks.common import REPO, Figure, ServerAddress, Sizes, median, python_env

DEFAULT_VENV = Path("/tmp/peers")
PACKAGES = ("pydantic-ai-slim[openai,anthropic]", "openai-agents", "orjson")
"""The peers, and orjson for the floor the worker reads beside them."""
WORKER_TIMEOUT = 1500
"""Seconds: the raw OpenAI SDK alone takes about a second a round on a loaded 2-core
machine, and the worker reads it (beside each peer and the floor) for every round."""


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
        return [_skipped("skipped: no peers virtualenv (run with --peers)")]
    try:
        proc = _run_worker(sizes, server, python)
    except subprocess.TimeoutExpired:
        return [_skipped(f"skipped: the peers worker took over {WORKER_TIMEOUT} s")]
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [_skipped(f"skipped: the peers worker failed: {tail[0]}")]
    return _figures(json.loads(proc.stdout.strip().splitlines()[-1]))


def _skipped(detail: str) -> Figure:
    return Figure(
        key="peers",
        title="7. Peers (Pydantic AI, OpenAI Agents SDK)",
        value=None,
        unit="",
        detail=detail,
    )


def _run_worker(
    sizes: Sizes, server: ServerAddress, python: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
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
        timeout=WORKER_TIMEOUT,
    )


def _figures(report: dict[str, Any]) -> list[Figure]:
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
