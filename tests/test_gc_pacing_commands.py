"""``serve`` and ``worker`` own their processes, so their hosts pace the collector
(``Host.open(gc_pacing=True)``): a body or a stored session of 600,000 messages otherwise
brought CPython's full collections, 0.2-2 s each, several a request (benchmarks/README.md,
branch ``whist``). A :class:`~runtime.app.worker.Worker` inside an application leaves the
application's collector alone unless asked."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from runtime import Host
from runtime.app import worker as worker_module
from runtime.app.cli import build_parser
from runtime.app.web import serve


@asynccontextmanager
async def _stop_here(seen: dict[str, Any], *args: Any, **options: Any) -> AsyncIterator[None]:
    seen.update(options)
    raise RuntimeError("stop here")
    yield


async def test_serve_opens_a_host_that_paces_the_collector(monkeypatch):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(Host, "open", lambda **options: _stop_here(seen, **options))
    args = serve.add_serve_arguments(argparse.ArgumentParser()).parse_args([])
    with pytest.raises(RuntimeError, match="stop here"):
        await serve.serve_command(args)
    assert seen["gc_pacing"] is True


async def test_the_worker_command_starts_a_worker_that_paces_the_collector(monkeypatch):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(
        worker_module, "open_worker", lambda *a, **options: _stop_here(seen, *a, **options)
    )
    args = build_parser().parse_args(["worker", "--store", "postgresql://x/y"])
    with pytest.raises(RuntimeError, match="stop here"):
        await worker_module.worker_command(args)
    assert seen["gc_pacing"] is True


def test_a_worker_made_by_an_application_leaves_its_collector_alone_by_default():
    default = inspect.signature(worker_module.Worker).parameters["gc_pacing"].default
    assert default is False
