"""One provider call through the SDK split into its pieces, in process CPU (issue 24).

:mod:`benchmarks.provider_call` gives a provider call's whole CPU against the floor's;
this says where it goes inside the SDK (branch ``g1sdk``). Each round reads the floor
(:mod:`benchmarks.floor`), then makes one ``provider.stream`` call of the benchmark's
request, as ``provider_call`` does; the SDK client's ``create``, ``request``,
``_build_request`` and ``_process_response``, and its httpx client's ``build_request``
and ``send``, are wrapped on the instances to take the process CPU at their entry and
exit (the wrappers add ~1 us a piece), and so are the floor's httpx client's (the floor's
own pieces, for the SDK's to be read against). Prints each piece's min, p25 and median.

``python3 -m benchmarks.sdk_pieces [openai|anthropic] [--rounds 1500]``, from the tree
to measure (the private methods it wraps are the SDK's, as of openai 3.60 and anthropic
2.17).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

WARM_UP = 200
PIECES = (
    ("Axon before create", "t0", "c0"),
    ("create -> request", "c0", "r0"),
    ("request -> _build_request", "r0", "b0"),
    ("_build_request -> httpx build_request", "b0", "h0"),
    ("httpx build_request", "h0", "h1"),
    ("create -> send, all", "c0", "s0"),
    ("send", "s0", "s1"),
    ("send -> create returned", "s1", "c1"),
    ("of it: _process_response", "p0", "p1"),
    ("after create (the read, the close)", "c1", "t1"),
    ("the provider's stream, all", "t0", "t1"),
    ("the floor", "f0", "f1"),
    ("floor: before httpx build_request", "f0", "H0"),
    ("floor: httpx build_request", "H0", "H1"),
    ("floor: send", "S0", "S1"),
    ("floor: after send (the read, the close)", "S1", "f1"),
)


def _wrap(marks: dict[str, float], obj: Any, name: str, key: str, *, coro: bool) -> None:
    """Replace ``obj.name`` on the instance by a wrapper that marks ``key`` 0 and 1."""
    real: Callable[..., Any] = getattr(obj, name)
    now = time.process_time

    def sync(*args: Any, **kw: Any) -> Any:
        marks[key + "0"] = now()
        out = real(*args, **kw)
        marks[key + "1"] = now()
        return out

    async def asynchronous(*args: Any, **kw: Any) -> Any:
        marks[key + "0"] = now()
        out = await real(*args, **kw)
        marks[key + "1"] = now()
        return out

    setattr(obj, name, asynchronous if coro else sync)


async def _rounds(fmt: str, rounds: int, server: Any) -> list[dict[str, float]]:

    from benchmarks.bench_pipeline import make_provider
    from benchmarks.floor import floor_side
    from benchmarks.provider_call import bench_request

    url = server.url(fmt, 1)
    provider = make_provider(fmt, url)
    floor, floor_close = floor_side(fmt, url)
    request = bench_request()

    async def emit(chunk: Any) -> None:
        pass

    await provider.stream(request, emit)  # the client built
    client = provider._get_client()
    marks: dict[str, float] = {}
    resource = client.chat.completions if fmt == "openai" else client.messages
    _wrap(marks, resource, "create", "c", coro=True)
    _wrap(marks, client, "request", "r", coro=True)
    _wrap(marks, client, "_build_request", "b", coro=False)
    _wrap(marks, client, "_process_response", "p", coro=True)
    _wrap(marks, client._client, "build_request", "h", coro=False)
    _wrap(marks, client._client, "send", "s", coro=True)
    floor_client = floor_close.__self__  # type: ignore[attr-defined]  # (its aclose)
    _wrap(marks, floor_client, "build_request", "H", coro=False)
    _wrap(marks, floor_client, "send", "S", coro=True)
    out = []
    try:
        for i in range(WARM_UP + rounds):
            marks["f0"] = time.process_time()
            await floor()
            marks["f1"] = marks["t0"] = time.process_time()
            await provider.stream(request, emit)
            marks["t1"] = time.process_time()
            if i >= WARM_UP:
                out.append(dict(marks))
    finally:
        await floor_close()
        await provider.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.sdk_pieces")
    parser.add_argument("format", choices=("openai", "anthropic"))
    parser.add_argument("--rounds", type=int, default=1500)
    args = parser.parse_args()
    import trio

    from benchmarks.common import LoopbackServer

    server = LoopbackServer([(args.format, 1)])
    try:
        rows = trio.run(_rounds, args.format, args.rounds, server)
    finally:
        server.close()
    print(f"{args.format}, one delta, {len(rows)} rounds: us of process CPU, min / p25 / median")
    for label, start, end in PIECES:
        values = sorted((row[end] - row[start]) * 1e6 for row in rows)
        n = len(values)
        print(f"  {label:38} {values[0]:7.1f} {values[n // 4]:7.1f} {values[n // 2]:7.1f}")


if __name__ == "__main__":
    main()
