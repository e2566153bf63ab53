"""The turn runner's side of context compaction (:mod:`runtime.compaction`).

Before each model call the runner hands the repaired history to :func:`compact`, which
runs the agent's history processors with a :class:`~runtime.compaction.CompactionContext`
whose two services are wired here: the token count asks the session's provider
(:meth:`~runtime.provider.Provider.count_tokens`, the estimate when it has none or its
count fails) and the summary call is one more request to the same provider actor, on an
inbox of its own (not the engine's: a summary is neither streamed nor stored as a part).
A summary call that fails raises the provider's error, which the runner's retry policy
treats like a failure of the step's own call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.turn.throttle import acquire, limiter_of, release
from runtime.actor import Actor
from runtime.actor_messages import Batch, InferRequest, StreamFailed
from runtime.chunks import FinishChunk, TextChunk, Usage, UsageChunk
from runtime.compaction import (
    CompactionContext,
    HistoryProcessor,
    StoredSummary,
    estimate_text,
    run_processors,
)
from runtime.errors import ActorFailed, AxonError, describe_exception
from runtime.history import repair
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.logging import get_logger
from runtime.messages import Message, UserMessage
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
) -> Compacted:
    """``messages`` (repaired) through ``processors``; repaired again after them, so a
    processor of the application's that cuts between a call and its result still sends
    a valid history (the call gets an ``interrupted`` result, an orphan result goes)."""
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
        answer, usage = await ask(
            provider,
            session_id=session_id,
            turn_id=turn_id,
            step=step,
            instructions=how,
            text=text,
            settings=dict(settings),
        )
        spent.append(usage)
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
    out = await run_processors(processors, messages, context)
    usage = Usage()
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
) -> tuple[str, Usage]:
    """One model call on ``provider`` with ``text`` as the user message and no tools:
    its answer text and usage. Reasoning the provider streams is not kept."""
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
                    return "".join(pieces), usage
    finally:
        request.cancel_scope.cancel()
        await release(limiter, grant, usage)
