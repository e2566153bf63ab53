"""5. Start-up: ``import runtime, actors`` against importing its core dependencies alone.

Each sample is a fresh interpreter (``python -c``) that times its own imports with
``perf_counter`` (interpreter start-up itself is excluded: it is the same for both). The
two sides alternate; the figure is the median of the per-pair ratios. A separate
``-X importtime`` run attributes the time to top-level packages, and one more child
checks that no provider SDK (or its HTTP stack) was imported by ``import runtime,
actors, actors.providers``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

from benchmarks.common import REPO, Figure, Sizes, median, python_env

TARGET = 1.3
AXON = "runtime, actors"
DEPS = "trio, attrs, cattrs, structlog"
SDKS = ("openai", "anthropic", "httpx2", "httpx", "httpcore", "httpcore2", "anyio")
_TIMER = "import time; t = time.perf_counter(); import {mods}; print(time.perf_counter() - t)"


def _child(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        cwd=REPO,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def _import_seconds(mods: str) -> float:
    return float(_child(_TIMER.format(mods=mods)).stdout.strip())


def _by_package(mods: str) -> dict[str, float]:
    """Self time (ms) of each top-level package imported by ``import mods``."""
    out = _child(f"import {mods}", "-X", "importtime").stderr
    totals: dict[str, float] = defaultdict(float)
    for line in out.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, rest = line.split(":", 1)
        self_us, _cum, name = (part.strip() for part in rest.split("|"))
        totals[name.split(".")[0]] += int(self_us) / 1000
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def run(sizes: Sizes) -> list[Figure]:
    _import_seconds(AXON)  # warm the file cache and bytecode for both sides
    _import_seconds(DEPS)
    axon: list[float] = []
    deps: list[float] = []
    for i in range(sizes.startup_runs):
        order = [(axon, AXON), (deps, DEPS)]
        for bucket, mods in order if i % 2 == 0 else order[::-1]:
            bucket.append(_import_seconds(mods))
    ratios = [a / d for a, d in zip(axon, deps, strict=True)]
    value = median(ratios)
    packages, dep_packages = _by_package(AXON), _by_package(DEPS)
    # What importing Axon adds, per top-level package (self time; one run, indicative).
    extra = {k: v - dep_packages.get(k, 0.0) for k, v in packages.items()}
    extra = dict(sorted(((k, v) for k, v in extra.items() if v >= 0.5), key=lambda kv: -kv[1]))
    top = ", ".join(f"{k} +{v:.0f} ms" for k, v in list(extra.items())[:4])
    figures = [
        Figure(
            key="startup.ratio",
            title="5. Start-up: import runtime, actors / trio+attrs+cattrs+structlog",
            value=value,
            unit="x",
            target=f"<= {TARGET:g}",
            passed=value <= TARGET,
            detail=(
                f"{median(axon) * 1e3:.0f} ms vs {median(deps) * 1e3:.0f} ms; beyond those: {top}"
            ),
            data={
                "runs": sizes.startup_runs,
                "axon_s": axon,
                "deps_s": deps,
                "ratios": ratios,
                "added_self_ms_by_package": {k: round(v, 2) for k, v in extra.items()},
            },
        )
    ]
    probe = (
        "import sys, json; import runtime, actors, actors.providers; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {SDKS!r})))"
    )
    loaded = json.loads(_child(probe).stdout)
    figures.append(
        Figure(
            key="startup.no_sdk",
            title="5. No provider SDK after import runtime, actors, actors.providers",
            value=float(len(loaded)),
            unit="modules",
            target="0",
            passed=not loaded,
            detail="none of " + ", ".join(SDKS) if not loaded else "loaded: " + ", ".join(loaded),
            data={"checked": list(SDKS), "loaded": loaded},
        )
    )
    return figures
