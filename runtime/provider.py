"""The provider actor base: one actor per provider configuration, shared by sessions.

A provider handles :class:`~runtime.protocol.InferRequest` s, each in a child task of its
own, so one slow model call never holds up another session's. A subclass implements
:meth:`Provider.stream`: restore the request's messages into its SDK's format, call the
SDK, and ``emit`` :data:`~runtime.chunks.StreamChunk` s as the SDK's stream arrives.
Anything it raises is classified (:meth:`Provider.classify_error`) and sent to the
requester as :class:`~runtime.protocol.StreamFailed`; the provider actor never crashes
because one call failed.

SDKs are imported lazily inside subclasses so ``import runtime`` stays fast.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import trio

from runtime.actor import Actor
from runtime.chunks import StreamChunk
from runtime.errors import AxonError, ProviderError
from runtime.protocol import Batch, Batcher, InferRequest, StreamFailed

Emit = Callable[[StreamChunk], Awaitable[None]]


class Provider(Actor):
    """Base class of provider actors. Subclasses set ``provider_name`` and ``stream``."""

    provider_name: ClassVar[str] = "provider"
    inbox_capacity: ClassVar[int] = 1024
    max_hold: ClassVar[float | None] = 0.002
    """Seconds a parsed chunk may wait for the engine before the provider's task yields
    (see :class:`~runtime.protocol.Batcher`): bounds the first-delta latency of a burst."""

    def __init__(
        self, *, model: str = "", max_concurrency: int | None = None, name: str | None = None
    ) -> None:
        super().__init__(name=name or f"{self.provider_name}:{model}" if model else name)
        self.model = model
        self.max_concurrency = max_concurrency
        """At most this many calls in flight at once (to respect a rate limit)."""
        self._limiter = trio.CapacityLimiter(max_concurrency) if max_concurrency else None
        self._nursery: trio.Nursery | None = None
        self._in_flight: dict[int, InferRequest] = {}

    def on_crash(self, exc: BaseException) -> None:
        """Fail every call the crash cut short, so no turn waits forever."""
        from runtime.errors import ActorFailed

        current = self.current_message
        requests = list(self._in_flight.values())
        if isinstance(current, InferRequest) and id(current) not in self._in_flight:
            requests.append(current)
        for request in requests:
            failure = StreamFailed(
                error=ActorFailed(f"provider {self.name} crashed: {type(exc).__name__}: {exc}")
            )
            batch = Batch(request.request_id)
            batch.append(failure)
            try:
                request.reply.put_nowait(batch)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self._in_flight.clear()
        self.current_message = None

    def on_give_up(self, exc: BaseException) -> None:
        self.on_crash(exc)

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        """Make the model call for ``request`` and ``emit`` its chunks, ending with a
        :class:`~runtime.chunks.FinishChunk`. Raise to fail the call."""
        raise NotImplementedError

    def classify_error(self, exc: BaseException) -> AxonError:
        """Map an exception raised by :meth:`stream` onto the error classes."""
        if isinstance(exc, AxonError):
            return exc
        return ProviderError(f"{type(exc).__name__}: {exc}", provider=self.provider_name)

    def describe(self) -> dict[str, Any]:
        """Configuration for logs; never includes credentials."""
        return {"provider": self.provider_name, "model": self.model}

    # -- actor plumbing ----------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await super().run()
            finally:
                self._nursery = None

    async def handle(self, message: Any) -> None:
        if isinstance(message, InferRequest):
            assert self._nursery is not None
            self._nursery.start_soon(self._serve, message)

    async def _serve(self, request: InferRequest) -> None:
        self._in_flight[id(request)] = request
        try:
            await self._serve_one(request)
        finally:
            self._in_flight.pop(id(request), None)

    async def _serve_one(self, request: InferRequest) -> None:
        out = Batcher(request.reply, request.request_id, max_hold=self.max_hold)
        try:
            with request.cancel_scope:
                if self._limiter is not None:
                    async with self._limiter:
                        await self.stream(request, out.send)
                else:
                    await self.stream(request, out.send)
        except Exception as exc:  # the call failed: tell the requester, stay alive
            err = self.classify_error(exc)
            try:
                await out.send(StreamFailed(error=err))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
