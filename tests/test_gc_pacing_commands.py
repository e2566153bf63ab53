"""``serve --gc-pacing`` and ``worker --gc-pacing`` pace the collector
(``Host.open(gc_pacing=True)``): a body or a stored session of 600,000 messages otherwise
brings CPython's full collections, 0.2-2 s each, several a request. Off by default: paced,
a short turn costs about 10% more CPU (benchmarks/README.md, branch ``whist``)."""

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
