"""``serve --gc-pacing`` and ``worker --gc-pacing`` pace the collector
(``Host.open(gc_pacing=True)``): a body or a stored session of 600,000 messages otherwise
brings CPython's full collections, 0.2-2 s each, several a request. Off by default: paced,
a short turn costs 6-7% more CPU (benchmarks/journal/approval.md, branch ``whist``)."""

from __future__ import annotations

import argparse
import collections
import gc
import inspect
import signal
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from runtime import Host
from runtime.app import worker as worker_module
from runtime.app.cli import build_parser
from runtime.app.commands import COMMAND_GC_THRESHOLDS
from runtime.app.web import serve


@asynccontextmanager
async def _stop_here(seen: dict[str, Any], *args: Any, **options: Any) -> AsyncIterator[None]:
    seen.update(options)
    raise RuntimeError("stop here")
    yield


@pytest.mark.parametrize(("argv", "paced"), [([], False), (["--gc-pacing"], True)])
async def test_serve_s_host_paces_the_collector_with_gc_pacing_only(monkeypatch, argv, paced):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(Host, "open", lambda **options: _stop_here(seen, **options))
    args = serve.add_serve_arguments(argparse.ArgumentParser()).parse_args(argv)
    with pytest.raises(RuntimeError, match="stop here"):
        await serve.serve_command(args)
    assert seen["gc_pacing"] is paced


@pytest.mark.parametrize(("argv", "paced"), [([], False), (["--gc-pacing"], True)])
async def test_the_worker_command_paces_the_collector_with_gc_pacing_only(monkeypatch, argv, paced):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(
        worker_module, "open_worker", lambda *a, **options: _stop_here(seen, *a, **options)
    )
    args = build_parser().parse_args(["worker", "--store", "postgresql://x/y", *argv])
    with pytest.raises(RuntimeError, match="stop here"):
        await worker_module.worker_command(args)
    assert seen["gc_pacing"] is paced


def test_a_worker_made_by_an_application_leaves_its_collector_alone_by_default():
    default = inspect.signature(worker_module.Worker).parameters["gc_pacing"].default
    assert default is False


def _full_collections_in_a_churn_of_turns(steps: int = 600) -> int:
    """Full collections while 8 "turns" are in flight at once (500 containers each, one
    ending as the next starts) and each step makes and drops 2,500 containers more: a
    turn's objects outlive a few young collections, then die by reference counting, as a
    worker's do (no cyclic garbage)."""
    fulls = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal fulls
        if phase == "start" and info["generation"] == 2:
            fulls += 1

    turns: collections.deque[list[list[int]]] = collections.deque()
    gc.collect()
    gc.callbacks.append(count)
    try:
        for _ in range(steps):
            turns.append([[] for _ in range(500)])
            scratch = [[] for _ in range(2500)]
            del scratch
            if len(turns) > 8:
                turns.popleft()
    finally:
        gc.callbacks.remove(count)
    return fulls


@asynccontextmanager
async def _churn_here(fulls: list[int], *args: Any, **options: Any) -> AsyncIterator[None]:
    fulls.append(_full_collections_in_a_churn_of_turns())
    raise RuntimeError("stop here")
    yield


async def test_the_worker_command_s_collector_walks_no_whole_heap_for_turns_that_ended(
    monkeypatch,
):
    fulls: list[int] = []
    monkeypatch.setattr(
        worker_module, "open_worker", lambda *a, **options: _churn_here(fulls, *a, **options)
    )
    args = build_parser().parse_args(["worker", "--store", "postgresql://x/y"])
    with pytest.raises(RuntimeError, match="stop here"):
        await worker_module.worker_command(args)
    assert _full_collections_in_a_churn_of_turns() > 0  # CPython's thresholds: several
    assert fulls == [0]


async def test_the_worker_command_gives_its_process_s_collector_back_as_it_found_it(
    monkeypatch,
):
    monkeypatch.setattr(
        worker_module, "open_worker", lambda *a, **options: _stop_here({}, *a, **options)
    )
    args = build_parser().parse_args(["worker", "--store", "postgresql://x/y"])
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="stop here"):
        await worker_module.worker_command(args)
    assert gc.get_threshold() == before


@asynccontextmanager
async def _serve_until_sigterm(
    during: list[tuple[int, ...]], *args: Any, **options: Any
) -> AsyncIterator[Any]:
    """A worker that is up until the command's SIGTERM: sent once the command waits for
    it (its receiver installed), the collector's thresholds noted then."""

    async def terminate() -> None:
        await trio.testing.wait_all_tasks_blocked()
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the command's
        during.append(gc.get_threshold())
        signal.raise_signal(signal.SIGTERM)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(terminate)
        yield types.SimpleNamespace(owner="w", concurrency=1, lease=30.0)


async def test_the_worker_command_drained_by_sigterm_gives_the_collector_back_as_it_found_it(
    monkeypatch,
):
    during: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        worker_module,
        "open_worker",
        lambda *a, **options: _serve_until_sigterm(during, *a, **options),
    )
    args = build_parser().parse_args(["worker", "--store", "postgresql://x/y"])
    before = gc.get_threshold()
    assert await worker_module.worker_command(args) == 0
    assert during == [COMMAND_GC_THRESHOLDS]
    assert gc.get_threshold() == before


async def test_a_worker_an_application_opens_leaves_its_collector_s_thresholds_alone(pg_url):
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent

    agent = Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))
    before = gc.get_threshold()
    async with worker_module.open_worker(pg_url, agent=agent, poll=0.05):
        assert gc.get_threshold() == before


def _serve_args(argv: list[str] | None = None) -> argparse.Namespace:
    return serve.add_serve_arguments(argparse.ArgumentParser()).parse_args(argv or [])


async def test_the_serve_command_s_collector_walks_no_whole_heap_for_turns_that_ended(
    monkeypatch,
):
    fulls: list[int] = []
    monkeypatch.setattr(Host, "open", lambda **options: _churn_here(fulls, **options))
    with pytest.raises(RuntimeError, match="stop here"):
        await serve.serve_command(_serve_args())
    assert _full_collections_in_a_churn_of_turns() > 0  # CPython's thresholds: several
    assert fulls == [0]


async def test_the_serve_command_gives_its_process_s_collector_back_as_it_found_it(
    monkeypatch,
):
    monkeypatch.setattr(Host, "open", lambda **options: _stop_here({}, **options))
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="stop here"):
        await serve.serve_command(_serve_args())
    assert gc.get_threshold() == before


async def test_the_serve_and_worker_commands_share_one_set_of_collector_thresholds(
    monkeypatch,
):
    during: list[tuple[int, ...]] = []

    @asynccontextmanager
    async def note(**options: Any) -> AsyncIterator[None]:
        during.append(gc.get_threshold())
        raise RuntimeError("stop here")
        yield

    monkeypatch.setattr(Host, "open", note)
    with pytest.raises(RuntimeError, match="stop here"):
        await serve.serve_command(_serve_args())
    assert during == [COMMAND_GC_THRESHOLDS]
