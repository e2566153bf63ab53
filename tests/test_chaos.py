"""The worker deployment under seeded random faults (:mod:`tests.support.chaos`): workers
SIGKILLed and paused past their lease, Redis and PostgreSQL restarted, approvals decided
from another store handle and raced, while sessions submit turns at once; then every
invariant of docs/deployment.md's guarantees is checked.

CI runs a fixed handful of small seeds. By hand, more and bigger ones::

    AXON_CHAOS_SEEDS=0-49 AXON_CHAOS_SIZE=large python -m pytest tests/test_chaos.py

``AXON_CHAOS_SEEDS`` is a seed, a range ``A-B`` or a comma list of either; a failure's
message names its seed, to replay it alone.
"""

from __future__ import annotations

import os

import pytest

from tests.support.chaos import LARGE, SMALL, run_chaos
from tests.support.redis import require_redis, unique_prefix
from tests.support.seeds import seeds_from


@pytest.mark.parametrize("seed", seeds_from("AXON_CHAOS_SEEDS"))
async def test_the_deployment_keeps_its_invariants_under_seeded_faults(
    pg_url: str, seed: int
) -> None:
    redis_url = require_redis()
    config = LARGE if os.environ.get("AXON_CHAOS_SIZE") == "large" else SMALL
    report = await run_chaos(seed, pg_url, redis_url, unique_prefix(), config)
    assert report["turns"] == config.sessions * config.turns
    print(f"seed {seed}: {report}")
