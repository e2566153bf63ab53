"""The output cap a turn's budget may send a model: no more than the model may write.

A turn with an output budget (``Budget(max_output_tokens=...)``) sends each call what
the turn has left as the API's cap (:attr:`InferRequest.max_output_tokens
<runtime.provider.InferRequest.max_output_tokens>`). A large budget, a common safety
net (200,000, 1,000,000), is above any model's maximum, and the APIs refuse the request
(OpenAI: 400 "max_tokens is too large: 1000000. This model supports at most 16384
completion tokens"): the turn failed where, without the budget, it would have run.

So when a call whose cap was the budget's alone (the agent and the provider give none
of their own) is refused with :class:`~runtime.errors.OutputCapTooLarge`, the runner
makes it once more (:func:`learn`): with the cap lowered to the maximum the error names
(never above what the turn has left), or, when it names none, with no budget cap at
all (the budget then ends the turn after the call, as for a server that ignores caps).
What it learnt is kept per provider and model for the process (:data:`KNOWN`), so later
calls send it directly. A provider with a cap of its own (Anthropic's ``max_tokens``
default, an agent's ``settings``) is never retried: the budget only ever lowers that
cap, so such a refusal is the configuration's, as it is without a budget.

What it learnt is forgotten :data:`FORGET_AFTER` seconds later on the host's clock
(:func:`expire`, checked as a call begins), and the oldest entry goes once
:data:`MOST` are kept. Why: a model's maximum is a fact of the server, and servers
change (a provider raising a model's output limit, an alias such as ``gpt-4o`` moved
to a newer model, a local server restarted with another model under the same name);
kept for the process, the old maximum capped every call below what the model may now
write until a restart, and a process that met many models (a gateway naming them per
request) kept them all. Forgetting costs one refused request per model per period
(the call is then lowered again, as the first time). A success cannot stand for
forgetting instead: no call is ever sent more than the maximum learnt, so none could
show it rose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from runtime.errors import OutputCapTooLarge

NO_CAP: Final = 0
"""In :data:`KNOWN`: the model refused a budget cap and named no maximum; send none."""

FORGET_AFTER: Final = 3600.0
"""Seconds (the host's clock) an entry of :data:`KNOWN` is kept."""

MOST: Final = 256
"""The entries :data:`KNOWN` keeps at most (the oldest goes first)."""

KNOWN: dict[tuple[Any, ...], int] = {}
"""The output maximum learnt per (provider class, provider name, model, endpoint) in this
process (:data:`NO_CAP`: send the budget's cap not at all), oldest first. Few entries:
one per model that refused a cap."""

LEARNT: dict[tuple[Any, ...], float] = {}
"""When each entry of :data:`KNOWN` was learnt (the host's clock, seconds)."""


def _key(provider: Any) -> tuple[Any, ...]:
    return (
        type(provider).__qualname__,
        getattr(provider, "provider_name", None),
        getattr(provider, "model", None),
        getattr(provider, "endpoint", None),
    )


def expire(provider: Any, clock: Callable[[], float]) -> None:
    """Forget what was learnt for ``provider``'s model once :data:`FORGET_AFTER`
    seconds of ``clock`` (the host's) have passed since: its next call is sent the
    budget's cap again. Called once as a call begins (so :func:`asked` answers the same
    for all of that call), and only reads the clock when something was learnt."""
    if not KNOWN:
        return
    key = _key(provider)
    at = LEARNT.get(key)
    if at is not None and clock() - at >= FORGET_AFTER:
        KNOWN.pop(key, None)
        del LEARNT[key]


def asked(provider: Any, cap: int | None) -> int | None:
    """The cap a call's request carries for a turn with ``cap`` output tokens left
    (``None``: no budget): ``cap``, at most the maximum learnt for ``provider``'s
    model; ``None`` when that model takes no cap we can name."""
    if cap is None or not KNOWN:
        return cap
    known = KNOWN.get(_key(provider))
    if known is None:
        return cap
    return None if known == NO_CAP else min(cap, known)


def learn(
    provider: Any,
    settings: Mapping[str, Any],
    exc: OutputCapTooLarge,
    sent: int | None,
    clock: Callable[[], float],
) -> bool:
    """Whether the call that failed with ``exc`` after sending the budget's cap
    ``sent`` may be made again with a lower one, which :func:`asked` then gives: only
    when the request's cap was the budget's alone (the provider's request mapping sends
    none without a budget) and the maximum the error names, if any, is below it. Kept
    from ``clock``'s now (the host's) for :data:`FORGET_AFTER` seconds."""
    if sent is None:
        return False  # no budget cap was sent: the refusal is not the budget's
    own = getattr(provider, "sent_cap", None)
    if own is None or own(settings, None) is not None:
        return False  # a cap of the agent's or the provider's: theirs, not the budget's
    limit = exc.limit
    if limit is not None and not 0 < limit < sent:
        return False  # (it names a maximum the refused cap was not above)
    key = _key(provider)
    KNOWN.pop(key, None)  # (learnt again: the newest)
    KNOWN[key] = NO_CAP if limit is None else limit
    LEARNT[key] = clock()
    while len(KNOWN) > MOST:
        oldest = next(iter(KNOWN))
        del KNOWN[oldest]
        LEARNT.pop(oldest, None)
    return True
