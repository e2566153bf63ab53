"""What the SDK's per-call request path costs a whole turn, in process CPU (by hand, issue
24 goal 1; not a figure, not the product).

``python3 -m benchmarks.sdk_request_ab [anthropic|openai] [--deltas 1000] [--rounds 60]
[--warm 10]`` runs, in one process (``cpu_floor``'s set-up: its own loopback server,
SQLite store, log lines at ``info`` into a file, a fresh session a turn, the text and the
stored message checked), round after round and in alternating order, two sides:

- ``sdk``: the turn as shipped: the provider's ``created(client....create, body)``.
- ``once``: the same turn with ``created`` replaced by an ablation that sends the same
  request without the SDK's per-call request path: the headers the SDK's own
  ``_build_headers`` gives for the call's options, built once per client and copied;
  the request built on the SDK's own httpx2 client (``build_request``, the client's
  timeout, the body as the SDK encodes it, ``openapi_dumps``) and sent with
  ``stream=True``; the SDK's own ``AsyncStream`` over the response, which the provider
  reads as before. What it leaves out, per call: ``FinalRequestOptions.construct`` (a
  pydantic ``model_construct``: ~17 field defaults, each resolved through a relative
  import), the header layers folded one by one into an ``httpx2.Headers``, the options'
  copy, the retry loop, the idempotency key, ``_process_response``.

Each side is followed by a floor read (:mod:`benchmarks.floor`) in the same round; each
is timed by the process CPU (``time.process_time``), an Axon turn until every task waits
(``trio.testing.wait_all_tasks_blocked``). Printed: per side the median turn, floor and
turn / floor ratio, and the median of the per-round differences ``sdk - once``.

The ablation is no product: it raises no status error (a 4xx/5xx is read as a stream),
maps no transport error, and is right only for the plain ``AsyncAnthropic`` /
``AsyncOpenAI`` clients the benchmark's providers build (no platform signing, no
per-call headers, no tracing). It measures what a request Axon would build itself on
the SDK's client could save; see ``journal/pipeline.md``, ``perffixed``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

_SDK = {
    "anthropic": ("anthropic", "/v1/messages", "RawMessageStreamEvent"),
    "openai": ("openai", "/chat/completions", "chat.ChatCompletionChunk"),
}


def once_per_client(fmt: str) -> Callable[..., Awaitable[Any]]:
    """The ablation's ``created``: ``create``'s request sent without the SDK's per-call
    request path (see the module's docstring). A client's first call goes through
    ``create`` as shipped, its request's headers recorded (less ``Host`` and
    ``Content-Length``, which the request makes from its URL and body); each later call
    sends those headers, a copy, with its own body: what ``create`` would send for it
    (``extra_body`` merged into the body as the SDK merges it, the arguments it leaves
    out, ``NOT_GIVEN`` / ``omit``, left out): the same bytes, headers and body (checked by
    hand against ``create``'s for both providers' benchmark requests)."""
    package, path, chunk = _SDK[fmt]
    options_class = importlib.import_module(f"{package}._models").FinalRequestOptions
    dumps = importlib.import_module(f"{package}._utils._json").openapi_dumps
    stream_class = importlib.import_module(f"{package}._streaming").AsyncStream
    where, _, name = f"types.{chunk}".rpartition(".")
    cast_to = getattr(importlib.import_module(f"{package}.{where}"), name)
    types = importlib.import_module(f"{package}._types")
    unset = (types.NotGiven, types.Omit)  # what ``create`` leaves out of the body
    made: dict[int, tuple[Any, list[tuple[bytes, bytes]], Any]] = {}

    async def created(create: Callable[..., Awaitable[Any]], body: dict[str, Any]) -> Any:
        client = create.__self__._client  # type: ignore[attr-defined]
        once = made.get(id(client))
        if once is None:  # the first call as shipped, its headers recorded
            http = client._client
            send = http.send
            sent: list[Any] = []

            async def recording(request: Any, **kw: Any) -> Any:
                sent.append(request)
                return await send(request, **kw)

            http.send = recording
            try:
                result = await create(**body)
            finally:
                del http.send
            drop = (b"host", b"content-length")
            headers = [(k, v) for k, v in sent[0].headers.raw if k.lower() not in drop]
            options = options_class.construct(method="post", url=path, json_data={})
            made[id(client)] = (options, headers, client._prepare_url(path))
            return result
        options, headers, url = once
        # the SDK's ``create`` writes its arguments in its own (alphabetical) order,
        # then merges ``extra_body`` over them
        given = (kv for kv in body.items() if kv[0] != "extra_body")
        data = dict(sorted(kv for kv in given if not isinstance(kv[1], unset)))
        extra = body.get("extra_body")
        if extra:
            data.update(extra)
        request = client._client.build_request(
            "POST", url, headers=list(headers), content=dumps(data), timeout=client.timeout
        )
        response = await client._client.send(request, stream=True)
        return stream_class(cast_to=cast_to, response=response, client=client, options=options)

    return created


async def _rounds(fmt: str, n: int, rounds: int, warm: int, server: Any, directory: str):
    from trio.testing import wait_all_tasks_blocked

    from benchmarks.bench_pipeline import axon_side, make_provider
    from benchmarks.common import INSTRUCTIONS
    from benchmarks.floor import floor_side
    from runtime import Agent, Host

    module = importlib.import_module(f"actors.providers.{fmt}")
    sides = {"sdk": module.created, "once": once_per_client(fmt)}
    url = server.url(fmt, n)
    agent = Agent(name="bench", provider=make_provider(fmt, url), instructions=INSTRUCTIONS)
    floor, floor_close = floor_side(fmt, url)
    out: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    try:
        async with Host.open(store=str(Path(directory) / "ab.db")) as host:
            axon = axon_side(host, agent, "ab")
            for side in (*sides, *sides) * max(1, warm // 2):
                module.created = sides[side]
                await axon()
                await wait_all_tasks_blocked()
                await floor()
            for i in range(rounds):
                for side in tuple(sides) if i % 2 else tuple(reversed(sides)):
                    module.created = sides[side]
                    t = time.process_time()
                    await axon()
                    await wait_all_tasks_blocked()
                    a = time.process_time() - t
                    t = time.process_time()
                    await floor()
                    out[side].append((a, time.process_time() - t))
    finally:
        module.created = sides["sdk"]
        await floor_close()
    return out


def main() -> None:
    from benchmarks.common import WARM_TURNS, LogSink, LoopbackServer

    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.sdk_request_ab")
    parser.add_argument("fmt", nargs="?", default="anthropic", choices=tuple(_SDK))
    parser.add_argument("--deltas", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warm", type=int, default=WARM_TURNS)
    args = parser.parse_args()
    server = LoopbackServer([(args.fmt, args.deltas)])
    try:
        with tempfile.TemporaryDirectory(prefix="axon-sdk-ab-") as directory:
            sink = LogSink(directory)
            try:
                out = trio.run(
                    _rounds, args.fmt, args.deltas, args.rounds, args.warm, server, directory
                )
            finally:
                sink.close()
    finally:
        server.close()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"{args.fmt}, {args.deltas} deltas, {args.rounds} rounds, load {load}")
    for side, samples in out.items():
        turn = statistics.median(a for a, _ in samples) * 1e6
        floor = statistics.median(f for _, f in samples) * 1e6
        ratio = statistics.median(a / f for a, f in samples)
        print(f"  {side:5s} turn {turn:7.0f} us, floor {floor:7.0f} us, turn / floor {ratio:.3f}")
    diffs = [s[0] - o[0] for s, o in zip(out["sdk"], out["once"], strict=True)]
    print(f"  sdk - once, a round's turns: median {statistics.median(diffs) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
