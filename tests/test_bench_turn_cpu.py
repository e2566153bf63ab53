"""The embedded side of ``benchmarks.bench_turn_cpu`` (issue 24 goal 3): what it counts."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from benchmarks import bench_turn_cpu
from runtime import configure_logging


async def test_the_embedded_cpu_is_read_once_the_log_tap_wrote_every_line_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU read that ends the measured batch comes after the log tap's last line of
    it: 8 turns at once put the tap hundreds of lines behind them, and a figure read at
    the last turn's end left that work out (the worker's figure has it)."""
    log_file = tmp_path / "axon.log.jsonl"
    lines_at_reads: list[int] = []

    def process_time() -> float:
        lines_at_reads.append(sum(1 for _ in log_file.open(encoding="utf-8")))
        return 0.0

    monkeypatch.setattr(bench_turn_cpu, "time", types.SimpleNamespace(process_time=process_time))
    with log_file.open("w", encoding="utf-8", buffering=1) as log:
        configure_logging("info", stream=log)
        try:
            await bench_turn_cpu._embedded_turns(str(tmp_path), 2, 48)
        finally:
            configure_logging("warning")
    written = sum(1 for _ in log_file.open(encoding="utf-8"))
    assert len(lines_at_reads) == 2
    assert lines_at_reads[1] == written


def test_postgresql_cpu_apart_by_process():
    """The server's CPU split by process: the worker's pooled backends, its LISTEN one,
    the WAL writer, autovacuum, the other background processes, and what exited (the
    postmaster's reaped time, less what an exited child had spent before the first
    snapshot); a process born meanwhile counts from zero; the parts add up to the whole."""
    before = {
        1: ("postmaster", 1.0),
        2: ("postgres: walwriter ", 0.5),
        3: ("postgres: postgres test 127.0.0.1(4000) idle", 2.0),
        4: ("postgres: postgres test 127.0.0.1(4001) idle", 1.0),
        5: ("postgres: checkpointer ", 0.1),
        6: ("postgres: autovacuum worker ", 0.2),
    }
    after = {
        # its own 0.05 more, 6 reaped (0.25 in all, 0.05 of it meanwhile), and a connection
        # born and reaped meanwhile (0.25)
        1: ("postmaster", 1.0 + 0.05 + 0.25 + 0.25),
        2: ("postgres: walwriter ", 0.6),
        3: ("postgres: postgres test 127.0.0.1(4000) idle", 2.5),
        4: ("postgres: postgres test 127.0.0.1(4001) idle", 1.05),
        5: ("postgres: checkpointer ", 0.1),
        7: ("postgres: autovacuum worker ", 0.04),
        8: ("postgres: postgres test 127.0.0.1(4002) idle", 0.3),
    }
    parts = bench_turn_cpu.pg_parts(before, after, listening={4})
    assert parts == pytest.approx(
        {
            "pool": 0.5 + 0.3,
            "listen": 0.05,
            "walwriter": 0.1,
            "autovacuum": 0.04,
            "background": 0.0,
            "exited": 0.55 - 0.2,
        }
    )
    whole = sum(c for _, c in after.values()) - sum(c for _, c in before.values())
    assert sum(parts.values()) == pytest.approx(whole)
