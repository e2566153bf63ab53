"""5. Start-up: ``import runtime, actors`` against importing its core dependencies alone.

Each sample is a fresh interpreter (``python -c``) that times its own imports with
``perf_counter`` (interpreter start-up itself is excluded: it is the same for all). The
sides alternate, the first rotating; each figure is the median of the per-round ratios to
the dependencies' time.

The facade resolves its names on first use (:pep:`562`), so ``import runtime, actors``
(figure 5, as issue 24 words it) builds none of the contract's classes and measures
little. Two more sides, in the same rounds, keep the real costs in view: 5c the whole
contract (``import runtime, actors`` plus every contract module the facade takes names
from: what ``import runtime`` loaded before), with the same target, and 5b what an
application's first line imports (``from runtime import Agent, Host, tool``: the
contract, the actors, the host and its store). A separate ``-X importtime`` run
attributes 5c's extra time to top-level packages, and one more child checks that no
provider SDK (or its HTTP stack) was imported by ``import runtime, actors,
actors.providers``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

from benchmarks.common import REPO, Figure, Sizes, median, python_env

TARGET = 1.15
"""Issue 24 (issue 6 asked for 1.3)."""
AXON = "runtime, actors"
DEPS = "trio, attrs, cattrs, structlog"
APP = "from runtime import Agent, Host, tool"
"""What an application's first line costs (the names resolved, the host imported)."""


def contract() -> str:
    """``import runtime, actors`` and every contract module the facade takes names from:
    what ``import runtime`` loaded before its names were resolved on first use."""
    import runtime

    modules = [m for m in runtime._MODULES if not m.startswith("runtime.app.")]
    return ", ".join([AXON, *modules])


SDKS = ("openai", "anthropic", "httpx2", "httpx", "httpcore", "httpcore2", "anyio")
_TIMER = (
    "import time; t = time.perf_counter(); c = time.process_time(); {stmt}; "
    "print(time.perf_counter() - t, time.process_time() - c)"
)
"""Wall and CPU time of the imports: on a loaded machine the CPU time swings less."""
_CPU: dict[str, list[float]] = {}
"""CPU seconds of each statement's samples, beside the wall seconds :func:`run` keeps."""


PYCACHE = os.path.join(tempfile.gettempdir(), "axon-bench-pycache")
"""Where the children keep their bytecode: both sides import compiled modules, as an
installed package does (pip compiles at install; a source tree writes ``__pycache__`` on
first import). ``PYTHONDONTWRITEBYTECODE`` (set in some sandboxes and CI) would make
every child recompile Axon's modules from source while the dependencies read the
bytecode pip wrote: a third of figure 5c was that. The prefix keeps the repository clean."""


def _env() -> dict[str, str]:
    env = python_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    return env


def _child(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def _import_seconds(mods: str) -> float:
    stmt = mods if mods.startswith("from ") else f"import {mods}"
    wall, cpu = (float(x) for x in _child(_TIMER.format(stmt=stmt)).stdout.split())
    _CPU.setdefault(mods, []).append(cpu)
    return wall


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


def _cpu_ratios(mods: str) -> list[float]:
    """Per-round CPU-time ratios of ``mods`` to the dependencies (same rounds)."""
    return [a / d for a, d in zip(_CPU[mods], _CPU[DEPS], strict=True)]


def _cpu_detail(ratios: list[float]) -> str:
    return f"CPU {median(ratios):.2f}x (min {min(ratios):.2f} / max {max(ratios):.2f})"


def run(sizes: Sizes) -> list[Figure]:
    whole = contract()
    for mods in (AXON, DEPS, APP, whole):  # warm the file cache and write the bytecode
        _import_seconds(mods)
    _CPU.clear()
    axon: list[float] = []
    deps: list[float] = []
    app: list[float] = []
    full: list[float] = []
    sides = [(axon, AXON), (deps, DEPS), (app, APP), (full, whole)]
    for i in range(sizes.startup_runs):
        shift = i % len(sides)
        for bucket, mods in sides[shift:] + sides[:shift]:
            bucket.append(_import_seconds(mods))
    ratios = [a / d for a, d in zip(axon, deps, strict=True)]
    value = median(ratios)
    app_ratios = [a / d for a, d in zip(app, deps, strict=True)]
    full_ratios = [a / d for a, d in zip(full, deps, strict=True)]
    packages, dep_packages = _by_package(whole), _by_package(DEPS)
    # What importing Axon adds, per top-level package (self time; one run, indicative).
    extra = {k: v - dep_packages.get(k, 0.0) for k, v in packages.items()}
    extra = dict(sorted(((k, v) for k, v in extra.items() if v >= 0.5), key=lambda kv: -kv[1]))
    top = ", ".join(f"{k} +{v:.0f} ms" for k, v in list(extra.items())[:4])
    full_cpu, app_cpu = _cpu_ratios(whole), _cpu_ratios(APP)
    figures = [
        Figure(
            key="startup.ratio",
            title="5. Start-up: import runtime, actors / trio+attrs+cattrs+structlog",
            value=value,
            unit="x",
            target=f"<= {TARGET:g}",
            passed=value <= TARGET,
            detail=(
                f"{median(axon) * 1e3:.0f} ms vs {median(deps) * 1e3:.0f} ms (the facade "
                f"resolves names on first use: see 5c); ratios min {min(ratios):.2f} / "
                f"max {max(ratios):.2f}"
            ),
            data={"runs": sizes.startup_runs, "axon_s": axon, "deps_s": deps, "ratios": ratios},
        ),
        Figure(
            key="startup.contract",
            title="5c. Start-up: the whole contract (every facade module) / the same",
            value=median(full_ratios),
            unit="x",
            target=f"<= {TARGET:g}",
            passed=median(full_ratios) <= TARGET,
            detail=(
                f"{median(full) * 1e3:.0f} ms vs {median(deps) * 1e3:.0f} ms; beyond those: "
                f"{top or 'nothing'}; ratios min {min(full_ratios):.2f} / "
                f"max {max(full_ratios):.2f}; {_cpu_detail(full_cpu)}"
            ),
            data={
                "statement": f"import {whole}",
                "contract_s": full,
                "deps_s": deps,
                "ratios": full_ratios,
                "cpu_ratios": full_cpu,
                "added_self_ms_by_package": {k: round(v, 2) for k, v in extra.items()},
            },
        ),
        Figure(
            key="startup.application",
            title="5b. Start-up: from runtime import Agent, Host, tool / the same",
            value=median(app_ratios),
            unit="x",
            detail=(
                f"{median(app) * 1e3:.0f} ms vs {median(deps) * 1e3:.0f} ms; "
                f"ratios min {min(app_ratios):.2f} / max {max(app_ratios):.2f}; "
                f"{_cpu_detail(app_cpu)}"
            ),
            data={"app_s": app, "deps_s": deps, "ratios": app_ratios, "cpu_ratios": app_cpu},
        ),
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
