"""The embedded deployment (``serve`` on SQLite) under seeded random faults
(:mod:`tests.support.embchaos`): ``serve`` SIGKILLed and SIGTERMed and started again on
the same file, kept down while clients retry, a second ``serve`` on the same file, clients
that leave mid-stream, race two decisions or post while their turn runs; then every
invariant is checked over HTTP and in the side effects' ledger.

CI runs a fixed handful of small seeds. By hand, more and bigger ones::

    AXON_EMBCHAOS_SEEDS=0-49 AXON_EMBCHAOS_SIZE=large python -m pytest tests/test_embedded_chaos.py

``AXON_EMBCHAOS_SEEDS`` is a seed, a range ``A-B`` or a comma list of either; a failure's
message names its seed, to replay it alone.
"""

from __future__ import annotations

import os

import pytest

from tests.support.embchaos import LARGE, SMALL, run_embedded_chaos
from tests.support.seeds import seeds_from


@pytest.mark.parametrize("seed", seeds_from("AXON_EMBCHAOS_SEEDS"))
async def test_the_embedded_deployment_keeps_its_invariants_under_seeded_faults(
    seed: int,
) -> None:
    config = LARGE if os.environ.get("AXON_EMBCHAOS_SIZE") == "large" else SMALL
    report = await run_embedded_chaos(seed, config)
    assert report["turns"] == config.sessions * config.turns
    print(f"seed {seed}: {report}")
