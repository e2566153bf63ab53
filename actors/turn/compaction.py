"""The turn runner's side of context compaction (:mod:`runtime.compaction`).

Before each model call the runner hands the repaired history to :func:`compact`, which
runs the agent's history processors with a :class:`~runtime.compaction.CompactionContext`
whose two services are wired here: the token count asks the session's provider
(:meth:`~runtime.provider.Provider.count_tokens`, the estimate when it has none or its
count fails) and the summary call is one more request to the same provider actor, on an
inbox of its own (not the engine's: a summary is neither streamed nor stored as a part).
A summary call that fails raises the provider's error, which the runner's retry policy
treats like a failure of the step's own call.

A summary call is one of the turn's calls: it is sent the output tokens the turn has left
(``Budget.max_output_tokens``) as its cap, under any smaller cap of its own settings, and
its usage, priced as the step's call is, counts toward the turn's (an estimate when its
server reports none, as for the step's call). One cut at that cap (``length``) is not
used (half a summary would stand for the turns it cut in every later request): the turn
ends ``budget``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.turn.throttle import acquire, limiter_of, release
from runtime.actor import Actor
from runtime.actor_messages import Batch, InferRequest, StreamFailed
from runtime.budget import OutputAccount
from runtime.chunks import FinishChunk, TextChunk, Usage, UsageChunk
from runtime.compaction import (
    CompactionContext,
    HistoryProcessor,
    StoredSummary,
    estimate_text,
    run_processors,
)
from runtime.errors import ActorFailed, AxonError, BudgetExceeded, describe_exception
from runtime.history import repair
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.logging import get_logger
from runtime.messages import Message, UserMessage
from runtime.pricing import priced
from runtime.redact import redact

_log = get_logger("axon.compaction")


@attrs.frozen(kw_only=True, slots=True)
class Compacted:
    """What :func:`compact` made of a model call's history."""

    messages: tuple[Message, ...]
    """The messages to send."""
    stored: tuple[StoredSummary, ...] = ()
    """Summaries to store in the history (before the turn's user message), in order."""
    usage: Usage = attrs.field(factory=Usage)
    """The summary calls' usage, for the turn's."""
    over: str | None = None
    """The budget a summary call ran out of (it was cut at the turn's output tokens
    left), or a processor raised :class:`BudgetExceeded` for: the turn ends with it,
    after counting :attr:`usage`; ``messages`` are then the ones given."""


async def compact(
    processors: Sequence[HistoryProcessor],
    messages: tuple[Message, ...],
    *,
    provider: Actor,
    session_id: str,
    turn_id: str,
    step: int,
    instructions: str | None,
    tools: tuple[Any, ...],
    left: int | None = None,
    account: OutputAccount | None = None,
    notice: Callable[[int], Callable[[int, int, int], Awaitable[None]]] | None = None,
) -> Compacted:
    """``messages`` (repaired) through ``processors``; repaired again after them, so a
    processor of the application's that cuts between a call and its result still sends
    a valid history (the call gets an ``interrupted`` result, an orphan result goes).
    ``left``: the turn's output tokens left (``None``: no output budget), which the
    summary calls share. ``account``: the turn's :class:`~runtime.budget.OutputAccount`
    (a sub-turn's, shared with the calls beside it), in which each summary call reserves
    its cap while it runs, as a model call does; nothing is held otherwise (reserving
    all that was left for all the processors held it while an application's processor
    waited, a deadlock when it waited for a sub-agent beside it). ``notice``: given a
    summary call's cap, what its reservation calls when it must wait (the turn's
    ``budget-wait`` chunk: :func:`actors.turn.inference.waits_notice`)."""
    spent: list[Usage] = []

    async def count(sent: Sequence[Message]) -> int:
        counter = getattr(provider, "count_tokens", None)
        if counter is not None:
            try:
                counted = await counter(instructions, sent, tools)
            except (AxonError, Exception) as exc:  # a count is advice: estimate instead
                _log.warning(
                    "compaction.count-failed",
                    session_id=session_id,
                    turn_id=turn_id,
                    error=redact(describe_exception(exc)),
                )
            else:
                if counted is not None:
                    return int(counted)
        return context.estimate(sent)

    async def summarize(how: str, text: str, settings: Mapping[str, Any]) -> str:
        cap = None if left is None else max(left - sum(u.output_tokens for u in spent), 0)
        held = 0
        if cap is not None and account is not None:
            waits = None if notice is None else notice(cap)
            held = cap = min(cap, await account.reserve(cap, waits))
        if cap == 0:  # no call may write nothing
            raise BudgetExceeded("max_output_tokens")
        wrote = held  # (cancelled or failed: all it held counts)
        try:
            answer, usage, finish = await ask(
                provider,
                session_id=session_id,
                turn_id=turn_id,
                step=step,
                instructions=how,
                text=text,
                settings=dict(settings),
                cap=cap,
            )
            wrote = usage.output_tokens
        finally:
            if held:
                assert account is not None
                account.settle(held, wrote)
        spent.append(usage)
        if finish == "length" and cap is not None and usage.output_tokens >= cap:
            raise BudgetExceeded("max_output_tokens")  # cut by the budget: half a summary
        return answer

    context = CompactionContext(
        session_id=session_id,
        turn_id=turn_id,
        step=step,
        instructions=instructions,
        tools=tools,
        counter=count,
        summarizer=summarize,
    )
    usage = Usage()
    try:
        out = await run_processors(processors, messages, context)
    except BudgetExceeded as exc:
        for u in spent:
            usage = usage + u
        return Compacted(messages=messages, usage=usage, over=exc.budget)
    for u in spent:
        usage = usage + u
    return Compacted(messages=tuple(repair(out)), stored=tuple(context.stored), usage=usage)


async def ask(
    provider: Actor,
    *,
    session_id: str,
    turn_id: str,
    step: int,
    instructions: str,
    text: str,
    settings: dict[str, Any],
    cap: int | None = None,
) -> tuple[str, Usage, str]:
    """One model call on ``provider`` with ``text`` as the user message and no tools,
    sent ``cap`` as its output cap: its answer text, usage (priced; with ``cap``, the
    answer's UTF-8 bytes, at most ``cap``, when the server reported no output tokens)
    and finish reason. Reasoning the provider streams is not kept."""
    reply: Inbox[Batch[Any]] = Inbox(32, "block", name="summary")
    request = InferRequest(
        request_id=new_id("req"),
        session_id=session_id,
        turn_id=turn_id,
        step=step,
        instructions=instructions,
        messages=(UserMessage(content=text),),
        tools=(),
        reply=reply,
        cancel_scope=trio.CancelScope(),
        settings=settings,
        max_output_tokens=cap,
    )
    limiter = limiter_of(provider)  # a summary call counts toward the rate limit too
    grant = await acquire(limiter, lambda: estimate_text(instructions) + estimate_text(text))
    pieces: list[str] = []
    usage = Usage()
    try:
        await provider.send(request)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        await release(limiter, grant, None)
        raise ActorFailed(f"{provider.name} is not running; no summary can be made") from None
    try:
        while True:
            batch = await reply.get()
            batch.taken = True
            for chunk in batch:
                if type(chunk) is TextChunk:
                    pieces.append(chunk.text)
                elif type(chunk) is UsageChunk:
                    usage = chunk.usage
                elif type(chunk) is StreamFailed:
                    raise chunk.error
                elif type(chunk) is FinishChunk:
                    answer = "".join(pieces)
                    if cap is not None and not usage.output_tokens and answer:
                        guess = min(len(answer.encode("utf-8", "surrogatepass")), cap)
                        usage = attrs.evolve(
                            usage, output_tokens=guess, total_tokens=usage.total_tokens + guess
                        )
                    price_key = getattr(provider, "price_key", None)
                    usage = await priced(usage, price_key() if price_key else None)
                    return answer, usage, chunk.reason
    finally:
        request.cancel_scope.cancel()
        await release(limiter, grant, usage)
