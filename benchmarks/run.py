"""Run the benchmarks of issue #6: ``python3 -m benchmarks`` (or ``benchmarks/run.py``).

Prints the results as a table and writes them to ``benchmarks/results/latest.json``.
``--quick`` runs every benchmark at a tiny size (the smoke test's mode: checks that the
code runs; its numbers mean nothing). See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    FULL,
    QUICK,
    REPO,
    Figure,
    LoopbackServer,
    Sizes,
    bench_server_urls,
    python_env,
)

BENCHMARKS = (
    "startup",
    "pipeline",
    "core",
    "concurrency",
    "long",
    "workers",
    "approval",
    "peers",
    "aio",
)
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "latest.json"


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("trio", "attrs", "cattrs", "structlog", "openai", "anthropic", "httpx2"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


def _ahead_of_peers(figures: list[Figure]) -> list[Figure]:
    """Whether Axon's pipeline ratio beats every measured peer's, per wire format."""
    ours = {f.key.split(".")[1]: f for f in figures if f.key.startswith("pipeline.")}
    out = []
    for fmt, mine in ours.items():
        peers = [
            f
            for f in figures
            if f.key.startswith("peers.") and f.key.endswith("." + fmt) and f.value is not None
        ]
        if not peers or mine.value is None:
            continue
        best = min(peers, key=lambda f: f.value or 0.0)
        assert best.value is not None
        margin = best.value / mine.value
        out.append(
            Figure(
                key=f"peers.ahead.{fmt}",
                title=f"7. Best peer's ratio / Axon's, {fmt}",
                value=margin,
                unit="x",
                target="> 1",
                passed=margin > 1,
                detail=f"best peer {best.title.split('. ', 1)[1].split(' /')[0]} "
                f"{best.value:.2f}, Axon {mine.value:.2f}",
            )
        )
    return out


def run_one(
    name: str,
    sizes: Sizes,
    port: int | None,
    peers_python: str | None,
    sent_log: str | None = None,
) -> list[Figure]:
    """One benchmark, in this process."""
    from benchmarks.common import ServerAddress

    server = ServerAddress(port, sent_log) if port is not None else None
    if name == "startup":
        from benchmarks import bench_startup

        return bench_startup.run(sizes)
    if name == "pipeline":
        from benchmarks import bench_pipeline

        assert server is not None
        return bench_pipeline.run(sizes, server)
    if name == "core":
        from benchmarks import bench_core

        return bench_core.run(sizes)
    if name == "concurrency":
        from benchmarks import bench_concurrency

        return bench_concurrency.run(sizes)
    if name == "long":
        from benchmarks import bench_long

        return bench_long.run(sizes)
    if name == "workers":
        from benchmarks import bench_workers

        return bench_workers.run(sizes)
    if name == "approval":
        from benchmarks import bench_approval

        return bench_approval.run(sizes)
    if name == "peers":
        from benchmarks import bench_peers

        assert server is not None
        return bench_peers.run(sizes, server, bench_peers.peers_python(peers_python))
    if name == "aio":
        from benchmarks import bench_aio

        return bench_aio.run(sizes)
    raise ValueError(name)


def _child(
    name: str,
    quick: bool,
    port: int | None,
    peers_python: str | None,
    sent_log: str | None = None,
) -> list[Figure]:
    """Run one benchmark in a fresh interpreter: no benchmark sees another's heap (whose
    size changes what a garbage collection costs), imports or logging set-up."""
    cmd = [sys.executable, "-m", "benchmarks.run", "--child", name]
    if quick:
        cmd.append("--quick")
    if port is not None:
        cmd += ["--port", str(port)]
    if peers_python:
        cmd += ["--peers-python", peers_python]
    if sent_log:
        cmd += ["--sent-log", sent_log]
    proc = subprocess.run(
        cmd, cwd=REPO, env=python_env(), stdout=subprocess.PIPE, text=True, timeout=1800
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {name} benchmark exited with status {proc.returncode}")
    return [Figure(**item) for item in json.loads(lines[-1])]


def run_all(
    quick: bool, only: tuple[str, ...], peers_python: str | None
) -> tuple[list[Figure], list[dict[str, str]]]:
    sizes = QUICK if quick else FULL
    figures: list[Figure] = []
    errors: list[dict[str, str]] = []
    n = sizes.pipeline_deltas
    server: LoopbackServer | None = None
    if "workers" in only or "approval" in only:
        bench_server_urls()  # throwaway servers shared by the children, never the machine's
    if "pipeline" in only or "peers" in only:
        long_n = sizes.pipeline_long_deltas
        server = LoopbackServer([(fmt, k) for fmt in ("openai", "anthropic") for k in (n, long_n)])
    try:
        for name in BENCHMARKS:
            if name not in only:
                continue
            started = time.perf_counter()
            print(f"[{name}] running...", file=sys.stderr, flush=True)
            try:
                got = _child(
                    name,
                    quick,
                    server.port if server else None,
                    peers_python,
                    server.sent_log if server else None,
                )
            except Exception as exc:
                errors.append({"benchmark": name, "error": f"{type(exc).__name__}: {exc}"})
                figures.append(
                    Figure(
                        key=f"{name}.error",
                        title=name,
                        value=None,
                        unit="",
                        detail=f"ERROR {type(exc).__name__}: {exc}",
                    )
                )
                continue
            seconds = round(time.perf_counter() - started, 1)
            for fig in got:
                fig.data.setdefault("benchmark_seconds", seconds)
            figures.extend(got)
            print(f"[{name}] done in {seconds} s", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.close()
    figures.extend(_ahead_of_peers(figures))
    return figures, errors


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit in ("deltas/s", "turns/s"):
        return f"{value:,.0f} {unit}"
    if unit == "modules":
        return f"{value:.0f} {unit}"
    return f"{value:.2f} {unit}"


def render(figures: list[Figure], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    table.add_column("Benchmark")
    table.add_column("Measured", justify="right")
    table.add_column("Target", justify="right")
    table.add_column("Result", justify="center")
    table.add_column("Detail")
    for f in figures:
        if f.key.endswith(".error"):
            verdict = "[red]ERROR[/]"
        elif f.passed is None:
            verdict = "[dim]info[/]" if f.value is not None else "[yellow]skipped[/]"
        else:
            verdict = "[green]pass[/]" if f.passed else "[red]FAIL[/]"
        table.add_row(f.title, _fmt(f.value, f.unit), f.target, verdict, f.detail)
    Console(width=max(160, Console().width)).print(table)


def _peers_python(
    explicit: str | None, peers: bool, reinstall: bool, only: tuple[str, ...]
) -> str | None:
    """The peers' python: ``--peers`` creates their throwaway virtualenv when it is
    missing (``--setup-peers`` reinstalls it); otherwise an existing one is used, or the
    peers are skipped."""
    if "peers" not in only or explicit:
        return explicit
    from benchmarks import bench_peers

    found = bench_peers.peers_python()
    if reinstall or (peers and found is None):
        return str(bench_peers.setup())
    return str(found) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help=f"comma-separated subset of {','.join(BENCHMARKS)}",
    )
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="JSON results file")
    parser.add_argument("--peers-python", help="python of the peers' virtualenv")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="run the peers (Pydantic AI, OpenAI Agents SDK), creating their throwaway "
        "virtualenv /tmp/peers first if it is missing (needs PyPI)",
    )
    parser.add_argument(
        "--setup-peers",
        action="store_true",
        help="(re)install the peers' virtualenv /tmp/peers, then run them (needs PyPI)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # run one benchmark, print JSON
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sent-log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sizes = QUICK if args.quick else FULL
        got = run_one(args.child, sizes, args.port, args.peers_python, args.sent_log)
        print(json.dumps([f.to_json() for f in got]))
        return 0
    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = set(only) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    if args.no_peers and (args.peers or args.setup_peers):
        parser.error("--no-peers contradicts --peers / --setup-peers")
    if args.no_peers:
        only = tuple(x for x in only if x != "peers")
    elif (args.peers or args.setup_peers) and "peers" not in only:
        only = (*only, "peers")
    peers_python = _peers_python(args.peers_python, args.peers, args.setup_peers, only)
    sizes = QUICK if args.quick else FULL
    started = time.perf_counter()
    load_before = os.getloadavg()
    figures, errors = run_all(args.quick, only, peers_python)
    seconds = time.perf_counter() - started
    report = {
        "command": "python3 -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(seconds, 1),
        "quick": args.quick,
        "sizes": sizes.__dict__,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "versions": _versions(),
        "figures": [f.to_json() for f in figures],
        "errors": errors,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    mode = "quick (sizes too small to mean anything)" if args.quick else "full"
    render(figures, f"Axon benchmarks, {mode}: {seconds:.0f} s; medians of alternated rounds")
    print(f"results: {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
