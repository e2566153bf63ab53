"""``GET /healthz`` and ``GET /readyz``: what an orchestrator or a load balancer asks
``serve`` (docs/deployment.md, "Health checks").

``/healthz`` (liveness)
    ``200 {"status": "ok"}`` whenever the process's event loop answers: no store, relay
    or session touched, nothing logged. A process whose loop is stuck answers nothing,
    and its probe times out.
``/readyz`` (readiness)
    ``200 {"status": "ok", "store": "ok", "relay": "ok"}`` when the store answers a
    trivial read (the version of a session id no session has: one primary-key look-up)
    and, where there is a relay (``--redis``), Redis answers ``PING``, each within
    :data:`READY_BOUND` seconds; else ``503`` with ``"status": "unavailable"`` and what
    failed, its reason redacted (:func:`runtime.errors.describe_exception`: a DSN's
    password never shows). From the first SIGINT/SIGTERM on, ``503`` with
    ``"status": "draining"`` (:attr:`Readiness.draining`), so the load balancer stops
    sending new requests while the running ones end.

Both answer ``GET`` and ``HEAD`` and need no token (``--token`` guards ``/api/`` only).
The request guard's Host check (:mod:`runtime.app.web.guard`) passes a load balancer's
probe by IP when the server is bound to a wildcard address (``--host 0.0.0.0``), as it
must be to be reached from outside; ``/healthz`` is answered whatever the ``Host``
(:data:`HOST_FREE`): it says nothing but that the process runs, and a liveness probe
refused for a ``Host`` it was not configured with would have the orchestrator restart
a healthy server, again and again. ``/readyz`` keeps the Host check: it tells of the
store and the relay.

A probe costs at most one check of each at a time, whatever the number of probes
(:class:`_SingleFlight`): probes that come while one is in flight wait for its answer
(bounded all the same), so a paused database, whose reads hang, holds one thread and one
connection, not one per probe.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.app.web.http import json_response
from runtime.errors import describe_exception
from runtime.logging import get_logger
from runtime.redact import redact_url

READY_BOUND = 2.0
"""Seconds the store's read, and the relay's ``PING``, may take before ``/readyz`` says
``503``: a paused database answers within this, not when its reads time out."""

PROBE_SESSION = "axon-readyz-probe"
"""The session id ``/readyz`` asks the store the version of: no session is made."""

HOST_FREE = frozenset({"/healthz"})
"""Paths answered whatever the ``Host`` header (the request guard's exemption)."""

REASON_LENGTH = 300
"""Characters of a failure's reason ``/readyz`` shows at most."""

OK_BODY = b'{"status":"ok"}'
DRAINING = "draining"


def _log() -> Any:
    return get_logger("axon.web")


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def reason(exc: BaseException) -> str:
    """Why a check failed, fit to answer anyone who may ask ``/readyz``: the exception's
    redacted text (:func:`~runtime.errors.describe_exception`: registered secrets, key
    shapes) with every URL in it redacted too (:func:`~runtime.redact.redact_url`: a DSN
    quoted by a driver that did not register it), cut to :data:`REASON_LENGTH`."""
    text = _URL.sub(lambda match: redact_url(match.group()), describe_exception(exc))
    return text[:REASON_LENGTH]


class _SingleFlight:
    """One check at a time, in ``nursery`` (the app's background nursery): a caller waits
    for the check in flight (or starts one) at most ``bound`` seconds. The check's task
    is not the caller's, so a check that hangs (a read of a paused database: its thread
    cannot be cancelled) costs no caller more than ``bound``, and at most one hangs."""

    def __init__(self, check: Callable[[], Awaitable[object]]) -> None:
        self.check = check
        self.done: trio.Event | None = None
        self.outcome: str | None = None
        self.started = 0.0

    async def result(self, nursery: trio.Nursery | None, bound: float) -> str:
        """``"ok"``, or why not (the check's redacted error, or its silence)."""
        if self.done is None:
            self.done = trio.Event()
            self.started = trio.current_time()
            if nursery is None:  # no lifespan (an app not served): in the request
                await self._run(self.done)
            else:
                nursery.start_soon(self._run, self.done)
        done = self.done
        with trio.move_on_after(bound):
            await done.wait()
        if not done.is_set():
            waited = trio.current_time() - self.started
            return f"no answer within {bound:g} s (waiting for {waited:.0f} s)"
        assert self.outcome is not None
        return self.outcome

    async def _run(self, done: trio.Event) -> None:
        try:
            await self.check()
            self.outcome = "ok"
        except Exception as exc:
            self.outcome = reason(exc)
        finally:
            self.done = None  # the next probe checks again
            done.set()


class Readiness:
    """What ``/readyz`` reports: the store's and the relay's answers, and whether the
    server is draining (:meth:`drain`)."""

    def __init__(self, store: Any, relay: Any = None, *, bound: float = READY_BOUND) -> None:
        self.store = store
        self.relay = relay
        self.bound = bound
        self.draining = False
        """Set at the first SIGINT/SIGTERM (:meth:`drain`): ``/readyz`` says 503 from then."""
        self.ready = True
        """The last answer's verdict: a change is logged, not every probe."""
        self._store = _SingleFlight(self._read_store)
        self._relay = _SingleFlight(self._ping_relay)

    def drain(self) -> None:
        self.draining = True

    async def _read_store(self) -> None:
        check = getattr(self.store, "check_ready", None)  # also: does it take writes
        if check is not None:
            await check(PROBE_SESSION)
        else:
            await self.store.version(PROBE_SESSION)

    async def _ping_relay(self) -> None:
        ping = getattr(self.relay, "ping", None)
        if ping is not None:
            await ping(self.bound)

    async def report(self, nursery: trio.Nursery | None) -> tuple[int, dict[str, str]]:
        """``(status code, body)`` of ``/readyz``."""
        if self.draining:
            return 503, {"status": DRAINING}
        parts = {"store": "ok", "relay": "none"}
        async with trio.open_nursery() as checks:

            async def ask(name: str, flight: _SingleFlight) -> None:
                parts[name] = await flight.result(nursery, self.bound)

            checks.start_soon(ask, "store", self._store)
            if self.relay is not None:
                checks.start_soon(ask, "relay", self._relay)
        ready = all(value in ("ok", "none") for value in parts.values())
        if ready != self.ready:
            self.ready = ready
            if ready:
                _log().info("web.ready")
            else:
                _log().warning("web.not_ready", **{k: v for k, v in parts.items() if v != "ok"})
        status = "ok" if ready else "unavailable"
        return (200 if ready else 503), {"status": status, **parts}


def _state(request: Request) -> Any:
    return request.app.state.axon


async def healthz(request: Request) -> Response:
    """Liveness: the event loop answers."""
    return Response(OK_BODY, media_type="application/json", headers=_NO_STORE)


async def readyz(request: Request) -> Response:
    """Readiness: the store (and relay) answer within the bound, and not draining."""
    state = _state(request)
    code, body = await state.readiness.report(state.background)
    return json_response(body, code, headers=_NO_STORE)


_NO_STORE = {"cache-control": "no-store"}


def health_routes() -> list[Route]:
    """``/healthz`` and ``/readyz``, ``GET`` and ``HEAD`` (Starlette answers ``HEAD``
    for a ``GET`` route)."""
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]


__all__ = ["HOST_FREE", "READY_BOUND", "Readiness", "health_routes"]
