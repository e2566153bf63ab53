"""How the Redis Streams relay meets a Redis that fails: which errors are transient
(retried, with capped exponential backoff and full jitter), which one is Redis refusing a
duplicate ``XADD`` (a retried flush it had applied), what a connection closed under a
subscription raises, the wait for Redis when the relay opens, and the one error inside
the exception groups its nurseries wrap around what the caller's block raised.

Shared by the writer (:mod:`actors.relays.redis_writer`) and the reader
(:mod:`actors.relays.redis_streams`); apart so that neither imports the other for them.
coredis's exceptions are imported on first use: importing the relay does not load coredis.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
import trio

from runtime.errors import RelayUnavailable
from runtime.redact import redact

log = structlog.get_logger("axon.relay")

T = TypeVar("T")


def _transient() -> tuple[type[BaseException], ...]:
    from coredis.exceptions import ConnectionError as RedisConnectionError

    return (RedisConnectionError, TimeoutError, OSError)


def _retryable() -> tuple[type[BaseException], ...]:
    """What a Redis call is retried on: a transient error, or its own deadline passing."""
    return (*_transient(), trio.TooSlowError)


def _unconnected(error: BaseException) -> bool:
    """Whether ``error`` says no connection to Redis could be made at all: refused (no
    server on its port), unreachable, at once; not a connection that timed out, nor one
    made that went silent. coredis says so as its ``ConnectionError`` raised from the
    socket's ``OSError`` (a connect timeout: from ``TimeoutError``, which is not this)."""
    cause = error.__cause__
    return (
        isinstance(error, _transient()[0])
        and isinstance(cause, OSError)
        and not isinstance(cause, TimeoutError)
        and str(error).startswith("Unable to establish a connection")
    ) or isinstance(error, ConnectionRefusedError)


def _described(error: BaseException, within: float | None = None) -> str:
    """``error`` for a log line or a message, redacted: its type and its text. A deadline
    that passed (:class:`trio.TooSlowError`, whose text is empty) says how long was
    waited: ``"TooSlowError: no reply within 5 s"``, never ``''``."""
    text = str(error)
    if not text and isinstance(error, trio.TooSlowError):
        text = "no reply within " + (f"{within:g} s" if within is not None else "its deadline")
    return redact(f"{type(error).__name__}: {text}" if text else type(error).__name__)


def keep_pool_places(client: Any) -> Any:
    """``client`` (a coredis client), its pool giving back the place of each connection
    that comes back unusable.

    coredis drops the connection a cancelled blocking command (the reader's ``XREAD
    BLOCK``) was sent on, and its pool (``max_connections``, 64) gives the place of a
    connection back only when that connection is usable: a front end whose viewers left
    64 live reads mid-turn had no place left, and every command of its relay waited for
    one until its deadline, for ever after (benchmarks/journal/workers.md,
    "leakworker"). A connection that comes back unusable now gives back an empty place
    (the next command connects anew), as coredis does for one that dies in the pool."""
    pool = client.connection_pool
    places = getattr(pool, "_available_connections", None)
    if places is None:  # (another coredis: nothing to mend)
        return client
    release = pool.release

    def release_keeping_place(connection: Any) -> None:
        release(connection)
        if not connection.usable and not places.full():
            places.append_nowait(None)

    pool.release = release_keeping_place
    return client


def _backoff(attempt: int, base: float, cap: float) -> float:
    """Capped exponential backoff with full jitter (many writers must not retry in step)."""
    return random.uniform(0, min(cap, base * 2**attempt))


async def _retried(
    fn: Callable[[], Awaitable[T]],
    *,
    within: float,
    retry_for: float,
    base: float,
    cap: float,
    stalled: Callable[[], None] | None,
    failed: Callable[[str], BaseException],
    logger: Any,
    event: str,
    what: str,
    refused: Callable[[str], BaseException] | None = None,
) -> T:
    """``await fn()`` within ``within`` seconds, retried with backoff while Redis does not
    answer (:func:`_retryable`), for ``retry_for`` seconds; then ``failed`` of the last
    error's description is raised. A try past its deadline calls ``stalled`` first (the
    reply may never come: coredis would queue the retry behind it, so the pool starts
    over). Each retry is logged as ``event`` with ``what``, the delay and the error.
    The relay's reads and the shared rate limits' scripts both go through here.
    ``refused``: when given, a try to which no connection could be made at all
    (:func:`_unconnected`: no Redis listening) raises ``refused`` of its description at
    once, not retried (only a reader shown nothing yet passes it:
    :meth:`~actors.relays.RedisRelay.read`'s ``unseen``)."""
    deadline = trio.current_time() + retry_for
    attempt = 0
    while True:
        try:
            with trio.fail_after(within):
                return await fn()
        except _retryable() as exc:
            if stalled is not None and isinstance(exc, trio.TooSlowError):
                stalled()
            error = _described(exc, within)
            if refused is not None and _unconnected(exc):
                raise refused(error) from None
            if trio.current_time() >= deadline:
                raise failed(error) from None
            delay = _backoff(attempt, base, cap)
            attempt += 1
            logger.warning(event, what=what, retry_in=round(delay, 3), error=error)
            await trio.sleep(delay)


@functools.cache
def _response_error() -> type[BaseException]:
    from coredis.exceptions import ResponseError

    return ResponseError


def _duplicate(error: BaseException) -> bool:
    """Whether ``error`` is Redis refusing an ``XADD`` id at or below the stream's top."""
    return isinstance(error, _response_error()) and "equal or smaller" in str(error)


BULK_FLOOR = 1024 * 1024
"""The smallest ``proto-max-bulk-len`` Redis accepts (1 MB): an entry below it is never
too large, so a connection lost under one is an outage, not asked about."""
BULK_UNSAID = 0
"""What :func:`_bulk_limit` returns when Redis answers but will not say its
``proto-max-bulk-len`` (``CONFIG`` refused or renamed, as managed services do). Its
default (512 MB) was assumed before; such a service may set it lower, and an entry
between the two was retried as an outage until the writer gave up
(:meth:`~actors.relays.redis_flush._Flusher._name_too_large` decides instead)."""


class EntryTooLarge(Exception):
    """A relay entry larger than the Redis takes (its ``proto-max-bulk-len``), found by
    its size, not by the transport's error: over TLS (``rediss://``) Redis's ``Protocol
    error`` reply is lost with the connection it closes (coredis raises
    ``ConnectionError: Connection lost while receiving response``, or ``while sending
    request`` for a larger one), which looked like Redis down and was retried as such.
    Its text starts as Redis's own does, so one description serves both."""

    def __init__(self, size: int, limit: int, error: BaseException) -> None:
        past = (
            f"past the {limit} bytes of Redis's proto-max-bulk-len"
            if limit != BULK_UNSAID
            else "twice lost with its connection, by a Redis that answered meanwhile "
            "and would not say its proto-max-bulk-len (CONFIG refused)"
        )
        super().__init__(
            f"Protocol error: invalid bulk length (an entry of {size} bytes, {past}; "
            f"the connection said {_described(error)[:100]})"
        )
        self.size = size
        self.limit = limit


async def _bulk_limit(client: Any, within: float) -> int | None:
    """Redis's ``proto-max-bulk-len`` (``CONFIG GET``), asked only when a connection was
    lost under an entry of at least :data:`BULK_FLOOR`; :data:`BULK_UNSAID` when Redis
    answers without saying it; ``None`` when it does not answer within ``within`` (down:
    the entry's size tells nothing then, the flush is retried as an outage)."""
    try:
        with trio.fail_after(within):
            reply = await client.config_get(["proto-max-bulk-len"])
    except _response_error():
        return BULK_UNSAID
    except _retryable() as exc:
        if isinstance(exc, trio.TooSlowError):  # coredis would queue behind the lost reply
            client.connection_pool.disconnect()
        return None
    values = list(reply.values()) if isinstance(reply, dict) else []
    try:
        return int(values[0]) if values else BULK_UNSAID
    except (TypeError, ValueError):
        return BULK_UNSAID


def _closed_stream() -> tuple[type[BaseException], ...]:
    """What coredis raises writing to a connection already closed (anyio's streams)."""
    import anyio

    return (anyio.ClosedResourceError, anyio.BrokenResourceError)


async def _wait_for_redis(client: Any, shown: str, retry_for: float, ping_for: float = 5.0) -> None:
    """PING until Redis answers (each PING given ``ping_for`` seconds);
    :class:`RelayUnavailable` after ``retry_for`` seconds."""
    deadline = trio.current_time() + retry_for
    attempt = 0
    while True:
        try:
            with trio.fail_after(ping_for):
                await client.ping()
            return
        except _retryable() as exc:
            if isinstance(exc, trio.TooSlowError):
                # coredis would send the next PING on the connection whose reply never
                # came, behind it (``RedisRelay._gave_up``): it starts over
                client.connection_pool.disconnect()
            if trio.current_time() >= deadline:
                raise RelayUnavailable(
                    f"Redis at {shown} did not answer for {retry_for:g} s: "
                    f"{_described(exc, ping_for)}"
                ) from None
            log.warning("relay.connect_failed", url=shown, error=_described(exc, ping_for))
            await trio.sleep(_backoff(attempt, 0.1, 2.0))
            attempt += 1


def _single_leaf(group: BaseExceptionGroup) -> BaseException | None:
    """The only exception inside nested groups, or ``None`` when there are several."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else None
