"""The benchmarks (``python3 -m benchmarks``) run, at a tiny size, so they never rot.

Only structure and sanity are asserted, never timings: the numbers of a ``--quick`` run
mean nothing, and timing assertions would make the suite flaky on a loaded machine.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import sse
from benchmarks.bench_peers import peers_python
from tests.support.pg import pg_base_url, pg_unavailable
from tests.support.redis import require_redis
from tests.support.services import free_port

REPO = Path(__file__).resolve().parents[1]

EXPECTED_KEYS = {
    "startup.ratio",
    "startup.no_sdk",
    "pipeline.openai",
    "pipeline.anthropic",
    "pipeline_floor.openai",
    "pipeline_floor.anthropic",
    "pipeline_long.openai",
    "pipeline_long.anthropic",
    "pipeline_floor_coalesced.openai",
    "pipeline_floor_coalesced.anthropic",
    "pipeline_long_coalesced.openai",
    "pipeline_long_coalesced.anthropic",
    "pipeline_cost.openai",
    "pipeline_cost.anthropic",
    "raw_floor.openai",
    "raw_floor.anthropic",
    "ttfd.openai",
    "ttfd.anthropic",
    "ttfd_burst.openai",
    "ttfd_burst.anthropic",
    "ttfd_floor.openai",
    "ttfd_floor.anthropic",
    "ttfd_byte.openai",
    "ttfd_byte.anthropic",
    *(f"{k}.gemini" for k in ("pipeline", "pipeline_floor", "pipeline_long", "pipeline_cost")),
    *(f"{k}.gemini" for k in ("raw_floor", "ttfd", "ttfd_burst", "ttfd_floor", "ttfd_byte")),
    "core.linearity",
    "concurrency.scaling",
    "concurrency.worst_stall",
    "concurrency.worst_stall_gc_pacing",
    "concurrency.worst_lateness",
    "concurrency.memory_per_idle_session",
    "long.save",
    "long.turn",
    "workers.scaling.cpu",
    "workers.scaling.io",
    "workers.relay_first_delta",
    "workers.store",
    "approval.embedded.commits",
    "approval.memory",
    "approval.workers.overhead",
    "approval.workers.overhead_read",
    "aio.ratio",
}


def _bench_servers() -> dict[str, str]:
    """The workers benchmark's servers: the test run's own, never the machine's defaults
    (where the run has none, a closed port, so that figure skips)."""
    closed = free_port()
    pg = f"postgresql://postgres@127.0.0.1:{closed}/none"
    if pg_unavailable() is None:
        pg = pg_base_url()
    try:
        redis = require_redis()
    except pytest.skip.Exception:
        redis = f"redis://127.0.0.1:{closed}/0"
    return {"AXON_BENCH_PG": pg, "AXON_BENCH_REDIS": redis}


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--output", str(out), *args],
        cwd=REPO,
        env={**os.environ, **_bench_servers()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Axon benchmarks" in proc.stdout  # the table was printed
    return json.loads(out.read_text())


def test_every_benchmark_runs_at_a_tiny_size(tmp_path: Path) -> None:
    report = _run(tmp_path, "--no-peers")
    assert report["errors"] == []
    assert report["quick"] is True
    figures = {f["key"]: f for f in report["figures"]}
    assert EXPECTED_KEYS <= set(figures)
    for key in ("core.us_per_delta.200", "core.us_per_delta.2000"):
        assert key in figures
    for fig in report["figures"]:
        assert set(fig) >= {"key", "title", "value", "unit", "target", "passed", "detail", "data"}
        if fig["target"]:
            assert isinstance(fig["passed"], bool), fig["key"]
        if fig["value"] is not None and fig["key"] != "startup.no_sdk":
            # differences (first delta, the cost split) may be negative at tiny sizes
            # (first delta, the cost split, extra commits): differences of two sides
            words = ("ttfd", "cost", "commits", "first_delta")
            difference = any(word in fig["key"] for word in words)
            # resident memory moves by whole pages (and the allocator may hand some back):
            # a tiny run may grow by none, or shrink
            pages = "memory" in fig["key"] and fig["unit"] == "KB"
            # CPU read from /proc counts whole clock ticks (10 ms): a tiny run may see none
            ticks = fig["key"].startswith("workers.cpu.") and fig["value"] == 0
            assert math.isfinite(fig["value"]), fig["key"]
            assert fig["value"] > 0 or difference or pages or ticks, fig["key"]
    # sanity of what was measured, not how fast
    assert figures["startup.no_sdk"]["data"]["loaded"] == []
    assert figures["startup.no_sdk"]["passed"] is True
    pipe = figures["pipeline.openai"]["data"]
    assert pipe["log_lines_written"] > 0  # the log tap really wrote JSON lines
    assert len(pipe["raw_s"]) == len(pipe["axon_s"]) == pipe["rounds"]
    floor = figures["pipeline_floor.anthropic"]["data"]  # the floor ran in the same rounds
    assert len(floor["floor_s"]) == len(floor["axon_s"]) == pipe["rounds"]
    memory = figures["concurrency.memory_per_idle_session"]["data"]
    assert memory["sessions"] > 0 and memory["rss_opened"] > 0
    stall = figures["concurrency.worst_stall"]["data"]["rounds"][0]
    scaling = figures["workers.scaling.cpu"]
    if scaling["value"] is not None:  # each measurement says who had the cores
        for measured in scaling["data"]["measurements"]:
            assert set(measured["cores"]) == {
                "workers",
                "postgresql",
                "redis",
                "submitter",
                "others",
            }, measured
            assert measured["cores"]["workers"] >= 0
    assert stall["longest_step_task"]  # a task was watched stepping
    assert report["versions"]["trio"] != "missing"


@pytest.mark.skipif(peers_python() is None, reason="no peers virtualenv (--peers)")
def test_the_peers_benchmark_runs(tmp_path: Path) -> None:
    report = _run(tmp_path, "--only", "peers")
    assert report["errors"] == []
    keys = {f["key"] for f in report["figures"]}
    assert any(k.startswith("peers.") for k in keys)


def test_peers_sets_up_the_peers_only_when_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--peers`` (issue 24): the peers' throwaway virtualenv is created when missing and
    reused when present; ``--setup-peers`` reinstalls it; without either an existing one
    is used and a missing one skips the peers."""
    from benchmarks import bench_peers, run

    made: list[Path] = []
    fresh = tmp_path / "venv" / "bin" / "python"

    def setup(venv: Path = tmp_path / "venv") -> Path:
        made.append(venv)
        return fresh

    monkeypatch.setattr(bench_peers, "setup", setup)
    monkeypatch.setattr(bench_peers, "DEFAULT_VENV", tmp_path / "none")
    monkeypatch.delenv("AXON_BENCH_PEERS_PYTHON", raising=False)
    assert run._peers_python(None, False, False, ("peers",)) is None  # missing: skipped
    assert run._peers_python(None, True, False, ("startup",)) is None  # peers not selected
    assert run._peers_python(None, True, False, ("peers",)) == str(fresh)
    assert len(made) == 1
    monkeypatch.setenv("AXON_BENCH_PEERS_PYTHON", "/existing/python")
    assert run._peers_python(None, True, False, ("peers",)) == "/existing/python"
    assert len(made) == 1  # present: reused, not reinstalled
    assert run._peers_python(None, False, True, ("peers",)) == str(fresh)
    assert len(made) == 2  # --setup-peers reinstalls
    assert run._peers_python("/given", True, True, ("peers",)) == "/given"
    with pytest.raises(SystemExit):
        run.main(["--peers", "--no-peers"])


def test_the_bodies_carry_exactly_the_deltas() -> None:
    for fmt, marker in (("openai", b'"delta":{"content":'), ("anthropic", b'"text_delta"')):
        body = sse.body(fmt, 7)
        events = sse.split_events(body)
        assert b"".join(events) == body
        assert sum(marker in e for e in events) == 7
    assert "".join(sse.delta_texts(3)) == " the quick brown"
    body = sse.body("gemini", 7)
    events = sse.split_events(body)
    assert b"".join(events) == body and all(e.endswith(b"\r\n\r\n") for e in events)
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events]
    texts = [c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks]
    assert [t for t in texts if t] == sse.delta_texts(7)
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"


def test_the_script_entry_point_works() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--quick" in proc.stdout


def test_the_worker_benchmarks_start_their_own_servers_not_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``AXON_BENCH_PG`` / ``AXON_BENCH_REDIS`` the benchmarks write into servers
    they started (free ports, throwaway directories), never the ones on 5432 / 6379."""
    from benchmarks.common import bench_server_urls
    from tests.support.services import ServiceUnavailable, own_postgres, own_redis

    for var in ("AXON_BENCH_PG", "AXON_BENCH_REDIS"):
        monkeypatch.setenv(var, "")  # recorded, so the URLs set below are undone after
        monkeypatch.delenv(var)
    pg, redis = bench_server_urls()
    assert ":5432/" not in pg and ":6379/" not in redis
    try:
        assert pg == own_postgres().url
        assert redis == own_redis().url
    except ServiceUnavailable:  # no server binaries here: a closed port, so figures skip
        pass
    assert os.environ["AXON_BENCH_PG"] == pg  # the children inherit the same servers


def test_actor_shares_gives_a_sample_to_its_innermost_stage() -> None:
    from benchmarks.actor_shares import shares

    run = "unrolled_run (/x/trio/_core/_run.py:1)"
    lines = [
        f"{run};handle (/r/actors/engine.py:1);put (/r/runtime/inbox.py:2) 3\n",
        f"{run};handle (/r/actors/stream_controller.py:9) 5\n",
        f"{run};stream (/r/actors/providers/anthropic.py:7);read (/s/httpx/_x.py:1) 2\n",
        f"{run};helper (/r/runtime/ids.py:1) 1\n",
        "<module> (/r/runtime/__init__.py:1) 7\n",  # start-up: outside trio.run
        f"{run};_find_and_load (<frozen importlib._bootstrap>:1) 4\n",  # an import
    ]
    counts, total = shares(lines)
    assert total == 11
    assert counts == {"scheduler/inboxes": 3, "controller": 5, "provider": 2, "other": 1}


def test_the_workers_scaling_detail_says_its_ceiling(monkeypatch):
    """One worker's run taking 1.25 of 2 cores caps two workers at 1.6x: the detail says so
    (other programs' cores meanwhile are not the run's), and says nothing of a ceiling
    without a one-worker measurement."""
    from benchmarks import bench_workers

    monkeypatch.setattr(bench_workers.os, "cpu_count", lambda: 2)
    one = {
        "workers": 1,
        "cores": {
            "workers": 0.9,
            "postgresql": 0.3,
            "redis": 0.04,
            "submitter": 0.01,
            "others": 0.4,
        },
    }
    two = {"workers": 2, "cores": {"workers": 1.4, "postgresql": 0.5, "others": 0.1}}
    detail = bench_workers._others([one, two])
    assert "ceiling 1.60x (2 cores / 1.25 by one worker's run)" in detail
    assert "ceiling" not in bench_workers._others([two])


def test_the_workers_scaling_detail_takes_its_ratio_apart(monkeypatch):
    """2 / 1 is the cores the two-worker run had over one's, times one's CPU a turn over
    two's: the detail gives the share outside the workers that sets the ceiling, the cores
    the two workers' run had and how much dearer its turns were."""
    from benchmarks import bench_workers

    monkeypatch.setattr(bench_workers.os, "cpu_count", lambda: 2)
    one = {
        "workers": 1,
        "turns": 800,
        "local_seconds": 2.0,
        "cores": {"workers": 1.0, "postgresql": 0.35, "redis": 0.05, "submitter": 0.0},
    }
    two = {
        "workers": 2,
        "turns": 800,
        "local_seconds": 1.6,
        "cores": {"workers": 1.4, "postgresql": 0.5, "redis": 0.05, "submitter": 0.05},
    }
    for measured in (one, two):
        measured["cores"]["others"] = 0.0
    detail = bench_workers._others([one, two])
    assert "CPU outside the workers / the workers' 0.40: 1.43x at a full core a worker" in detail
    # 2.0 cores x 1.6 s against 1.4 cores x 2.0 s for the same 800 turns
    assert "two workers' run 2.00 cores, its CPU a turn 1.14x one worker's" in detail
