"""Where a worker's approved turn spends its wall time, phase by phase (issue 21).

Not one of the numbered figures: run it as ``python3 -m benchmarks.approval_worker_phases
[ROUNDS]`` (default 31) from the tree to measure (``PYTHONPATH`` at it). It runs
:mod:`benchmarks.bench_approval`'s workers part as it is (one worker in process, the
client looking at the turn's row every millisecond, sides alternating) with the worker's
and the queue's calls wrapped for timestamps, and prints, per round, medians of:

* **plain** (from the submit): the claim's start and length, the claim's end to the
  turn's first chunk (``start``: the turn's set-up), that to the first save, the two
  saves and what lies between them, and the last save's end to the client seeing
  ``done``;
* **suspend** (from the submit): the same up to the save that suspends the row, then to
  the client seeing ``awaiting-input``;
* **resume** (from the decision's return): the continuation's claim (its start: the
  decision's ``NOTIFY`` waking the worker; it may start before the call returns to the
  client), then as the plain turn's.

The same for the sides that read the turn's relay stream instead (``plain (relay)``,
``suspend (relay)``, ``resume (relay)``: the last phase is then the row's end or wait
to the client's read of the stream's end or pause, the relay's delivery of it).

Timestamps are taken around the wrapped calls (``TurnQueue.claim_unread``, the worker's
relay writer's ``append`` of the first ``start`` chunk, ``PostgresStore.save``), so a
phase holds the event loop's other work done meanwhile (the relay, the client's polls).
Medians of phases do not add up to the median total. Also printed: the process's CPU
time per side (the worker's and the client's, not PostgreSQL's nor Redis's; the approved
side's includes the decision's call), steadier than wall time on a loaded machine.
"""

from __future__ import annotations

import collections
import functools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

Event = tuple[str, float, float]


def _wrap(owner: Any, name: str, events: list[Event]) -> None:
    real = getattr(owner, name)
    label = f"{owner.__name__}.{name}"

    @functools.wraps(real)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await real(*args, **kwargs)
        finally:
            events.append((label, start, time.perf_counter()))

    setattr(owner, name, wrapped)


def _first(events: list[Event], label: str, after: float) -> tuple[float, float]:
    for name, start, end in events:
        if name == label and start >= after:
            return start, end
    raise LookupError(f"no {label} after {after}")


def _phases(
    events: list[Event], t0: float, after: float, seen: float, *, saves: int
) -> dict[str, float]:
    start = _first(events, "start", after)[0]
    # the claim that took the turn: the last before its first chunk (a claim sent before
    # the decision was made can take its continuation: it waits for the decision's lock)
    claim = max(
        ((s, e) for name, s, e in events if name == "TurnQueue.claim_unread" and s < start),
        default=None,
    )
    if claim is None:
        raise LookupError("no claim before the turn's first chunk")
    first = _first(events, "PostgresStore.save", after)
    got = {
        "claim starts": claim[0] - t0,
        "claim": claim[1] - claim[0],
        "claim's end -> start chunk": start - claim[1],
        "start chunk -> 1st save": first[0] - start,
        "1st save": first[1] - first[0],
    }
    if saves == 1:
        got["its end -> seen by the client"] = seen - first[1]
    else:
        second = _first(events, "PostgresStore.save", first[1])
        got["1st save's end -> 2nd save"] = second[0] - first[1]
        got["2nd save"] = second[1] - second[0]
        got["its end -> seen by the client"] = seen - second[1]
    got["total"] = seen - t0
    return got


def main() -> None:
    from actors.relays.redis_writer import RedisRelayWriter
    from actors.stores.postgres import PostgresStore
    from actors.stores.turns import TurnQueue
    from benchmarks import bench_approval
    from benchmarks.common import Sizes, count_argument

    rounds = count_argument(31, __doc__)
    events: list[Event] = []
    for name in ("claim_unread", "decide"):
        _wrap(TurnQueue, name, events)
    _wrap(PostgresStore, "save", events)
    append = RedisRelayWriter.append

    def appended(self: Any, chunk: Any) -> None:
        if type(chunk).__name__ == "Start":
            now = time.perf_counter()
            events.append(("start", now, now))
        append(self, chunk)

    RedisRelayWriter.append = appended  # type: ignore[method-assign]
    until = bench_approval._until

    async def seen(queue: Any, turn_id: str, done: Callable[[Any], bool]) -> Any:
        status = await until(queue, turn_id, done)
        now = time.perf_counter()
        events.append(("seen", now, now))
        return status

    bench_approval._until = seen  # type: ignore[assignment]
    read_turn = bench_approval._read_turn

    async def read(relay: Any, turn_id: str, **kwargs: Any) -> Any:
        chunks = await read_turn(relay, turn_id, **kwargs)
        now = time.perf_counter()
        events.append(("seen", now, now))
        return chunks

    bench_approval._read_turn = read  # type: ignore[assignment]
    found: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    cpus: dict[str, list[float]] = collections.defaultdict(list)
    alternate = bench_approval.alternate

    async def phased(rounds: int, warmup: int, sides: dict[str, Any]) -> Any:
        async def timed(name: str, side: Any) -> float:
            events.clear()
            cpu = time.process_time()
            t0 = time.perf_counter()
            took: float = await side()
            cpus[name].append(time.process_time() - cpu)
            got = sorted(events, key=lambda event: event[1])
            looks = [s for label, s, _ in got if label == "seen"]
            try:
                read = " (relay)" if name.endswith(" (relay)") else ""
                if name.startswith("plain"):
                    found[f"plain{read}"].append(_phases(got, t0, t0, looks[0], saves=2))
                elif name.startswith("approved"):
                    called, answered = _first(got, "TurnQueue.decide", t0)
                    found[f"suspend{read}"].append(_phases(got, t0, t0, looks[0], saves=1))
                    resumed = _phases(got, answered, called, looks[1], saves=2)
                    found[f"resume{read}"].append(resumed)
            except LookupError as exc:  # a round whose order was not the usual one
                print(f"{name}: a round left out ({exc})", file=sys.stderr)
            return took

        return await alternate(
            rounds,
            warmup,
            {name: functools.partial(timed, name, side) for name, side in sides.items()},
        )

    bench_approval.alternate = phased  # type: ignore[assignment]
    for figure in bench_approval._workers_figures(Sizes(approval_rounds=rounds)):
        print(f"{figure.title}: {figure.value:.3f} {figure.unit} ({figure.detail})")
    for name in ("plain", "approved", "plain (relay)", "approved (relay)"):
        took = cpus[name][-rounds:]
        cpu_ms = statistics.median(took) * 1e3
        print(f"{name}: this process's CPU (the worker's, the client's) {cpu_ms:.2f} ms")
    for part, runs in found.items():
        runs = runs[-rounds:]
        print(f"{part} (ms, medians of {len(runs)})")
        for key in runs[0]:
            print(f"  {key:34s} {statistics.median(run[key] for run in runs) * 1e3:7.2f}")


if __name__ == "__main__":
    main()
