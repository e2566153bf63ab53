"""``benchmarks.approval_phases``: every side runs, and the split of the approved side's
extra adds up to it (structure only: timings are never asserted)."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import approval_phases


async def test_every_phase_is_measured_and_the_split_adds_up_to_the_extra(tmp_path: Path) -> None:
    samples = await approval_phases.measure(2, str(tmp_path), warmup=1)
    assert {k: len(v) for k, v in samples.items()} == dict.fromkeys(approval_phases.PHASES, 2)
    assert all(v > 0 for values in samples.values() for v in values)
    figures = approval_phases.report(samples)
    parts = figures["suspension"] + figures["decision"] + figures["continuation"]
    assert math.isclose(parts, figures["extra"], abs_tol=1e-6)
    assert math.isclose(
        figures["turn start + end"], figures["tool"] - figures["plain"] + figures["answer"]
    )
