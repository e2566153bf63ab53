"""The seeds a seeded fault run parametrizes over (tests/test_chaos.py,
tests/test_embedded_chaos.py)."""

from __future__ import annotations

import os

CI_SEEDS = (1, 2, 3)
"""What CI runs: a fixed handful, each small."""


def seeds_from(variable: str) -> list[int]:
    """The seeds the environment variable ``variable`` names: a seed, a range ``A-B`` or
    a comma list of either; :data:`CI_SEEDS` when it is unset or empty."""
    spec = os.environ.get(variable)
    if not spec:
        return list(CI_SEEDS)
    seeds: list[int] = []
    for item in spec.split(","):
        first, _, last = item.strip().partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds
