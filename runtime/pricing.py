"""What a model call cost: its usage priced from the ``genai-prices`` table.

The table (pydantic's ``genai-prices`` package, maintained with both vendors' price
lists) knows a model by provider and name, or a provider by its API's URL. A call is
priced by the provider that made it (:meth:`Provider.price_key
<runtime.provider.Provider.price_key>`): the vendor's own id when it calls the vendor's
endpoint, the URL otherwise (so a call to Groq or OpenRouter through the OpenAI provider
is priced as theirs), and never when neither is known: a local server, a gateway not in
the table (unless the provider says which vendor to price it as, ``price_as``), a model
the table does not list. Then :attr:`Usage.cost <runtime.chunks.Usage.cost>` is
``None``: unknown, never a guess.

Cache reads and writes and reasoning tokens are passed on when the provider reported them,
and priced as the table prices them (cache reads cheaper, writes dearer; reasoning as
output unless the model has a price of its own for it).

Loading the table takes most of a second (pydantic models over a 1.5 MB table), so it is
loaded on the first call that needs it, in a worker thread: the event loop never stalls,
and ``import runtime`` never loads it.
"""

from __future__ import annotations

import functools
import ipaddress
import threading
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

from runtime.chunks import Usage, _repr
from runtime.logging import get_logger

PRICE_TABLE = "genai-prices"
"""The package that holds the price table."""


@attrs.frozen(kw_only=True, slots=True)
class PriceKey:
    """How the table finds the price of a provider's calls: by ``provider_id`` or by the
    ``api_url`` the calls went to (exactly one is set), and the ``model``."""

    __repr__ = _repr

    model: str
    provider_id: str | None = None
    """The table's provider id (``"openai"``, ``"anthropic"``, ``"groq"``, ...)."""
    api_url: str | None = None
    """The endpoint, for the table to recognise its provider by."""
    input_includes_cache: bool = True
    """Whether the provider's ``input_tokens`` count the cached tokens (OpenAI's do;
    Anthropic's count neither cache reads nor writes). The table's do."""


_calc: Any = None
"""``genai_prices.calc_price`` once loaded; ``False`` when the package is missing."""
_lock = threading.Lock()
_log = get_logger("axon.pricing")


def load_prices() -> bool:
    """Load the price table now, in this thread (blocking: most of a second the first
    time). Whether it is there: without ``genai-prices`` installed every cost is unknown.

    :func:`ensure_prices` does this in a worker thread; call this one where blocking is
    fine (a test's setup, a program's start)."""
    global _calc
    with _lock:
        if _calc is None:
            try:
                import genai_prices
                from genai_prices import data_snapshot
            except ImportError:
                _log.warning(
                    "pricing.unavailable",
                    reason=f"{PRICE_TABLE} is not installed: every cost is unknown",
                )
                _calc = False
            else:
                data_snapshot.get_snapshot()  # builds the table's indexes, once
                _calc = genai_prices.calc_price
    return _calc is not False


async def ensure_prices() -> bool:
    """:func:`load_prices` in a worker thread, the first time; then at once."""
    if _calc is None:
        await trio.to_thread.run_sync(load_prices)
    return _calc is not False


@functools.lru_cache(maxsize=64)  # asked once per model call, for the same few URLs
def is_local(url: str) -> bool:
    """Whether ``url`` names this machine or a private network: a server there is never
    in the price table, so its calls are not priced (nor is the table loaded for them).
    A function of the URL alone, remembered (its address parse was 5-10 us of every
    model call to such a server, issue 24 goal 1)."""
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "") or host.endswith(".localhost") or host.endswith(".local"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def cost_of(usage: Usage, key: PriceKey) -> float | None:
    """The price of ``usage`` in US dollars, or ``None`` when the table does not know
    the model (or the provider, or the URL), or the counts contradict each other. The
    table must be loaded (:func:`ensure_prices`); if it is not, ``None``."""
    if not _calc:
        return None
    from genai_prices import Usage as TableUsage

    cache_read, cache_write = usage.cache_read or 0, usage.cache_write or 0
    inp = usage.input_tokens
    if not key.input_includes_cache:
        inp += cache_read + cache_write
    counts: dict[str, int] = {"input_tokens": inp, "output_tokens": usage.output_tokens}
    if cache_read:
        counts["cache_read_tokens"] = cache_read
    if cache_write:
        counts["cache_write_tokens"] = cache_write
    if usage.reasoning_tokens:
        counts["output_reasoning_tokens"] = usage.reasoning_tokens
    try:
        if key.api_url is not None:
            found = _calc(TableUsage(**counts), key.model, provider_api_url=key.api_url)
        else:
            found = _calc(TableUsage(**counts), key.model, provider_id=key.provider_id)
    except (LookupError, ValueError):  # not in the table; counts it refuses
        return None
    return float(found.total_price)


async def priced(usage: Usage, key: PriceKey | None) -> Usage:
    """``usage`` with its :attr:`~runtime.chunks.Usage.cost`, if ``key`` finds a price
    (a cost already set, by a provider that prices its own calls, is kept)."""
    if usage.cost is not None or key is None or not await ensure_prices():
        return usage
    cost = cost_of(usage, key)
    return usage if cost is None else attrs.evolve(usage, cost=cost)
