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
