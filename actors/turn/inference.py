"""How the turn runner makes one model call of a step.

A call goes to the turn's provider through the engine, after the agent's history
processors (:mod:`actors.turn.compaction`) and the provider's rate limit
(:mod:`actors.turn.throttle`); its chunks come back in batches, and the parts manager
decides the parts they make. A call that fails is retried by the agent's policy while it
has produced no output, then made again with the agent's next fallback provider if it
has one (after a ``reset-step`` if the failed call had streamed output). Mixed into
:class:`~actors.turn.runner.TurnRunner`, whose state, providers and inboxes it uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs
import trio

from actors.turn.compaction import compact
from actors.turn.output_caps import asked, expire, learn
from actors.turn.parts import CallIds, storable
from actors.turn.structured import observe, with_feedback
from actors.turn.throttle import acquire, limiter_of, release
from actors.turn.turn_state import Step, Turn, error_info
from runtime import events as ev
from runtime.actor import Actor
from runtime.actor_messages import (
    Batch,
    BeginRequest,
    BudgetWaitNotice,
    InferRequest,
    StepReset,
    StreamFailed,
    ThrottleNotice,
)
from runtime.chunks import (
    CitationsChunk,
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.compaction import estimate_tokens
from runtime.errors import (
    BudgetExceeded,
    OutputCapTooLarge,
    ProviderError,
    RateLimited,
    exception_text,
)
from runtime.ids import new_id
from runtime.messages import Message, UserMessage
from runtime.pricing import priced
from runtime.provider import TextRun
from runtime.ratelimit import Limiter, Verdict
from runtime.redact import redact
from runtime.tools import Tool

if TYPE_CHECKING:
    from runtime.actor_messages import SessionState
    from runtime.agent import Agent
    from runtime.history import RepairedHistory
    from runtime.hosting import TurnHost
    from runtime.inbox import Inbox


class _ForgetsCalls(Protocol):
    """The engine as a call's end reaches it (its class is another actor's, not
    imported: :meth:`actors.engine.Engine.forget_call`)."""

    def forget_call(self, request_id: str) -> None: ...


class Inferring:
    """The turn runner's part that makes a step's model call, with its retries and
    fallbacks (mixed into :class:`~actors.turn.runner.TurnRunner`, which sets these
    attributes)."""

    if TYPE_CHECKING:  # provided by the turn runner
        state: SessionState
        agent: Agent
        provider: Actor
        fallbacks: tuple[Actor, ...]
        engine: Actor
        host: TurnHost
        stream_inbox: Inbox
        _repaired: RepairedHistory
        _log: Any

        async def publish(self, event: Any) -> None: ...

        def _publish_history(self) -> None: ...

        async def _tools(self, turn: Turn) -> tuple[Tool, ...]: ...

        @staticmethod
        async def _ask(actor: Actor, message: Any) -> None: ...

    def _provider_at(self, index: int) -> Actor:
        """Provider ``index`` of the turn's chain: the primary, then the fallbacks."""
        return self.provider if index == 0 else self.fallbacks[index - 1]

    async def _infer(self, turn: Turn) -> Step:
        """One model call for the turn's current step, retried by the agent's policy
        while the call has produced no output; then, if the agent has fallbacks and the
        failure is one they cover, made again with the next provider: after a
        ``reset-step`` (:meth:`_reset_step`) if the failed call had streamed output."""
        policy = self.agent.retry
        attempt = 0
        lowered = False  # a budget cap the model refused was lowered once (output_caps)
        mark = len(turn.parts.content)  # the step's parts start here
        while True:
            attempt += 1
            result = Step()
            try:
                await self._call_once(turn, result)
                result.usage = counted(result, turn.parts.written, mark, self._log)
                _settle(turn, result, result.usage.output_tokens)
                price_key = getattr(self._provider_at(turn.provider), "price_key", None)
                result.usage = await priced(result.usage, price_key() if price_key else None)
                return result
            except ProviderError as exc:
                result.usage = counted(result, turn.parts.written, mark, self._log)
                _settle(turn, result, result.usage.output_tokens)
                if result.usage.total_tokens:  # a failed call billed what it read and wrote
                    price_key = getattr(self._provider_at(turn.provider), "price_key", None)
                    spent = await priced(result.usage, price_key() if price_key else None)
                    turn.usage = turn.usage + spent
                if isinstance(exc, OutputCapTooLarge) and not (result.produced or lowered):
                    provider = self._provider_at(turn.provider)
                    if learn(provider, self.agent.settings, exc, result.sent, self.host.clock):
                        lowered = True
                        attempt -= 1  # not one of the policy's retries
                        self._log.warning(
                            "provider.output_cap_lowered",
                            session_id=self.state.session_id,
                            turn_id=turn.turn_id,
                            step=turn.step,
                            refused=result.sent,
                            limit=exc.limit,
                        )
                        continue
                delay = None if result.produced else policy.delay(attempt, exc)
                if delay is not None:
                    delay = _within_deadline(
                        delay, limiter_of(self._provider_at(turn.provider)), exc
                    )
                if delay is None:
                    if not await self._fall_back(turn, exc, reset=result.produced):
                        raise
                    if result.produced:
                        await self._reset_step(turn, mark, exc)
                    attempt = 0  # the next provider's call gets retries of its own
                    continue
                await self.publish(
                    ev.ProviderRetry(
                        session_id=self.state.session_id,
                        turn_id=turn.turn_id,
                        step=turn.step,
                        attempt=attempt,
                        delay=delay,
                        error=error_info(exc),
                    )
                )
                self._log.warning(
                    "provider.retry",
                    session_id=self.state.session_id,
                    turn_id=turn.turn_id,
                    step=turn.step,
                    attempt=attempt,
                    delay=delay,
                    error=redact(exception_text(exc)),
                )
                await trio.sleep(delay)
            finally:  # cancelled, or failed otherwise: what it wrote, at most its hold
                if result.held:
                    written = result.usage.output_tokens or turn.parts.written(mark)
                    _settle(turn, result, min(written, result.held))

    async def _reset_step(self, turn: Turn, mark: int, exc: ProviderError) -> None:
        """Void what the failed call of the step streamed, before the next provider makes
        the step again: its parts leave the turn's message (they are never stored: the
        step's save comes after its call succeeds), the structured answer's parser forgets
        them, and the stream says ``reset-step`` so every consumer drops them too."""
        turn.parts.discard(mark)
        if turn.output is not None:
            turn.output.discard()
        following = self._provider_at(turn.provider)
        await turn.ctrl.send(
            StepReset(step=turn.step, provider=following.name, error=error_info(exc))
        )

    async def _fall_back(self, turn: Turn, exc: ProviderError, *, reset: bool = False) -> bool:
        """Move the turn on to the next provider, if the agent has one left and its
        :class:`~runtime.provider.FallbackProvider` covers ``exc``; say so (an event and
        a warning; ``reset``: the failed call had streamed output). The turn stays on
        it: its later steps go there too."""
        chain = self.agent.provider
        falls_back_on = getattr(chain, "falls_back_on", None)
        if falls_back_on is None or not falls_back_on(exc):
            return False
        if turn.provider >= len(self.fallbacks):
            return False
        failed = self._provider_at(turn.provider)
        turn.provider += 1
        following = self._provider_at(turn.provider)
        error = error_info(exc)
        self._log.warning(
            "provider.fallback",
            session_id=self.state.session_id,
            turn_id=turn.turn_id,
            step=turn.step,
            from_provider=failed.name,
            to_provider=following.name,
            error=redact(exception_text(exc)),
            reset=reset,
        )
        await self.publish(
            ev.ProviderFallback(
                session_id=self.state.session_id,
                turn_id=turn.turn_id,
                step=turn.step,
                from_provider=failed.name,
                to_provider=following.name,
                error=error,
                provider=getattr(following, "provider_name", None),
                model=getattr(following, "model", None) or None,
                reset=reset,
            )
        )
        return True

    async def _begin(self, request_id: str, scope: trio.CancelScope) -> None:
        """Tell the engine a model call starts.

        A cancelled call can leave the engine blocked on a full stream inbox with what it
        still forwards of it (backpressure from a consumer that stopped reading), and its
        own inbox full: waiting for room there while nobody reads the stream inbox would
        never end. So while the engine has no room, what arrives on the stream inbox is
        dropped: nothing of the new call can be there before the engine hears of it.
        """
        begin = BeginRequest(request_id=request_id, cancel_scope=scope)
        engine = self.engine
        try:
            engine.inbox.put_nowait(begin)
        except trio.WouldBlock:
            pass
        else:
            if engine.resting:  # it rested after a call that seemed the turn's last
                self.host.wake_actor(engine)
            return
        if engine.resting:
            self.host.wake_actor(engine)

        async def drop_stale() -> None:
            while True:
                batch = await self.stream_inbox.get()
                if isinstance(batch, Batch):
                    batch.taken = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drop_stale)
            await self.engine.send(begin)
            nursery.cancel_scope.cancel()

    async def _call_once(self, turn: Turn, result: Step) -> None:
        """Ask the provider once and relay its chunks: the parts manager decides the
        parts, and what the stream shows goes on to the controller batch by batch."""
        state, agent = self.state, self.agent
        tools = await self._tools(turn)  # MCP servers' lists may have changed
        instructions = _joined(agent.instructions, turn.instructions)
        # Repaired once here, so no provider has to remember to: every tool call has a
        # result (``interrupted`` if it never got one), no result lacks its call.
        messages = self._repaired(state.messages)
        provider = self._provider_at(turn.provider)
        if agent.history_processors:  # context compaction (actors/turn/compaction.py)
            messages = await self._compact(turn, provider, messages, instructions, tools)
        cap = result.cap = turn.limits.output_left(turn.usage)
        expire(provider, self.host.clock)  # a model's maximum learnt long ago (output_caps)
        if cap == 0:  # the summary calls wrote what was left: no call may write 0
            raise BudgetExceeded("max_output_tokens")
        if cap is not None:  # what the provider's request will carry (its own cap?)
            result.sent = sent_cap(provider, agent.settings, cap)
            if turn.account is not None:  # shared with the caller's other calls
                await _reserve(turn, result, provider, agent.settings)
        limiter = limiter_of(provider)  # a rate limit (actors/turn/throttle.py)
        grant = await acquire(
            limiter,
            lambda: estimate_tokens(instructions, messages, tools),
            lambda verdict: self._throttled(turn, limiter, verdict),
        )
        request_id = new_id("req")
        scope = trio.CancelScope()
        await self._begin(request_id, scope)
        request = InferRequest(
            request_id=request_id,
            session_id=state.session_id,
            turn_id=turn.turn_id,
            step=turn.step,
            instructions=instructions,
            messages=with_feedback(turn.output, messages),
            tools=tools,
            reply=self.engine.inbox,
            cancel_scope=scope,
            settings=agent.settings,
            output=agent.output_schema,
            # what the turn may still write (at most the model's maximum, once learnt:
            # actors/turn/output_caps.py): the provider's own cap on the call's output
            max_output_tokens=asked(provider, result.cap),
            text_runs=True,  # the engine and this runner take a read's deltas as one item
        )
        await self._ask(provider, request)
        inbox, parts, ctrl = self.stream_inbox, turn.parts, turn.ctrl
        ids = CallIds(parts.call_ids, turn.step)  # a call id the message holds gets another
        parts.origin = getattr(provider, "origin", None)  # recorded on signed parts
        try:
            while True:
                batch = await inbox.get()
                if not isinstance(batch, Batch) or batch.tag != request_id:
                    continue
                batch.taken = True
                failure: StreamFailed | None = None
                finished = False
                forward: list[Any] = []
                runs = False  # ``forward`` holds a TextRun: its batches go whole
                i, n = 0, len(batch)
                while i < n:
                    chunk = batch[i]
                    t = type(chunk)
                    if t is TextChunk:  # a run of text deltas, in one call
                        i = parts.texts(batch, i, forward)
                        continue
                    i += 1
                    if t is TextRun:
                        parts.text_run(chunk, forward)
                        runs = True
                    elif t is ReasoningChunk:
                        parts.reasoning(chunk, forward)
                    elif t is ToolInputDeltaChunk:
                        forward.append(ids.delta(chunk) if ids.renamed else chunk)
                    elif t is ToolInputStartChunk:
                        parts.tool_input_start(ids.start(chunk), forward)
                    elif t is ToolCallChunk:
                        chunk = storable(ids.call(chunk))
                        parts.tool_call(chunk, forward)
                        result.calls.append(chunk)
                    elif t is ProviderDataChunk:
                        parts.provider_data(chunk, forward)
                        result.produced = True  # stored, though the stream shows nothing
                    elif t is UsageChunk:
                        result.usage = chunk.usage
                    elif t is FinishChunk:
                        result.finish = chunk.reason
                        result.resume = chunk.resume
                        finished = True
                    elif t is StreamFailed:
                        failure = chunk
                    elif t is CitationsChunk:  # last: only cited text sends one
                        parts.cite(chunk, forward)
                if forward:
                    result.produced = True
                if finished:
                    parts.close(forward)  # the call's last part ends with it
                if forward:
                    await ctrl.send_all(observe(turn.output, forward), whole=runs)
                if failure is not None:
                    raise failure.error
                if finished:
                    return
        finally:
            scope.cancel()
            # What the engine forwarded of the call that is still unread (a cancelled
            # turn's), out of the inbox: an idle session would keep it until its next
            # call. The engine forwards nothing more of it (BeginRequest.cancel_scope).
            inbox.discard(lambda m: isinstance(m, Batch) and m.tag == request_id)
            cast(_ForgetsCalls, self.engine).forget_call(request_id)
            await release(limiter, grant, result.usage)

    async def _throttled(self, turn: Turn, limiter: Limiter | None, verdict: Verdict) -> None:
        """The call waits for a rate limit: say so in the stream and on the bus. A wait
        that ends past the turn's deadline (``Budget.deadline``) fails the call at once
        instead (:func:`_past_deadline`)."""
        wait, reason = verdict.wait, verdict.reason
        await turn.ctrl.send(ThrottleNotice(step=turn.step, wait=wait, reason=reason))
        await self.publish(
            ev.ProviderThrottled(
                session_id=self.state.session_id,
                turn_id=turn.turn_id,
                step=turn.step,
                wait=wait,
                reason=reason,
                key=limiter.key if limiter is not None else "",
            )
        )
        left = _past_deadline(wait)
        if left is not None:
            raise RateLimited(
                f"the rate limit grants no call for {wait:g} s ({reason}): past the "
                f"turn's deadline, {left:g} s away",
                retryable=False,
                provider=getattr(self._provider_at(turn.provider), "provider_name", None),
            )

    async def _compact(
        self,
        turn: Turn,
        provider: Actor,
        messages: tuple[Message, ...],
        instructions: str | None,
        tools: tuple[Tool, ...],
    ) -> tuple[Message, ...]:
        """The agent's history processors on the call's ``messages``; a summary they
        stored goes into the history right before the turn's user message (saved with
        the turn), and its call's usage into the turn's. Its summary calls may write
        what the turn has left, each reserving its cap in the turn's account (a
        sub-turn's) while it runs (:func:`~actors.turn.compaction.compact`)."""
        done = await compact(
            self.agent.history_processors,
            messages,
            provider=provider,
            session_id=self.state.session_id,
            turn_id=turn.turn_id,
            step=turn.step,
            instructions=instructions,
            tools=tools,
            left=turn.limits.output_left(turn.usage),
            account=turn.account,
            notice=partial(waits_notice, turn),
        )
        turn.usage = turn.usage + done.usage
        if done.over is not None:  # a summary cut by the turn's budget: not used
            raise BudgetExceeded(done.over)
        history = self.state.messages
        for stored in done.stored:
            at = (
                turn.a_index - 1
                if isinstance(history[turn.a_index - 1], UserMessage)
                else turn.a_index
            )
            history.insert(at, stored.message)
            turn.a_index += 1
        if done.stored:
            self._publish_history()
            last = done.stored[-1]
            await self.publish(
                ev.HistoryCompacted(
                    session_id=self.state.session_id,
                    turn_id=turn.turn_id,
                    step=turn.step,
                    tokens_before=done.stored[0].tokens_before,
                    tokens_after=last.tokens_after,
                    covered=last.covered,
                    usage=done.usage,
                )
            )
        return done.messages


def counted(step: Step, written: Callable[[int], int], mark: int, log: Any) -> Usage:
    """The usage a call of ``step`` counts toward the turn's: the reported one, or, when
    the call was sent a cap by the turn's output budget (:attr:`Step.cap`) and its
    server reported no output tokens while it wrote some (a compatible server that
    ignores ``stream_options.include_usage``, one that reports zeros, a stream cut
    before its usage), an estimate: the UTF-8 bytes it wrote from part ``mark`` on
    (``written``, :meth:`~actors.turn.parts.PartsManager.written`: no fewer than its
    tokens), at most that cap (what the server was told it may write). Counting
    nothing gave the next call the whole budget again, each call writing up to all of
    it; counting the whole cap ended a turn with tools after its first call."""
    usage, cap = step.usage, step.cap
    if cap is None or usage.output_tokens:
        return usage
    n = written(mark)
    if not n:
        return usage
    guess = min(n, cap if step.sent is None else step.sent)
    log.warning("usage.estimated", output_tokens=guess, bytes=n, cap=cap)
    return attrs.evolve(usage, output_tokens=guess, total_tokens=usage.total_tokens + guess)


CUT_MARGIN = 4
"""A ``length`` call that reports at least ``cap - cap // CUT_MARGIN`` output tokens (3/4
of the budget's cap it was sent) was cut by that cap (:func:`cut_by_budget`)."""


def sent_cap(provider: Any, settings: Mapping[str, Any], cap: int) -> int | None:
    """The output cap ``provider``'s request carries for a call the turn's budget lets
    write ``cap`` tokens (:meth:`Provider.sent_cap <runtime.provider.Provider.
    sent_cap>`: ``cap``, at most the model's maximum once learnt (:func:`~actors.turn.
    output_caps.asked`), or a smaller one of the settings, the provider's options or its
    API's default); that for a provider actor that does not say; ``None`` when the
    model refused a budget cap and named no maximum (none is sent)."""
    ask = asked(provider, cap)
    say = getattr(provider, "sent_cap", None)
    sent = ask if say is None else say(settings, ask)
    return ask if sent is None else sent


async def _reserve(turn: Turn, step: Step, provider: Any, settings: Mapping[str, Any]) -> None:
    """Reserve in the turn's account (:attr:`Turn.account`, shared with its calling
    turn's other calls) the cap ``step``'s call will be sent, waiting while another call
    holds what is left (or another reservation waits before it), the wait said in the
    stream (a ``budget-wait`` chunk: :func:`waits_notice`); lower the call's cap to what
    the account has. Nothing left (and nothing held by any call):
    :class:`BudgetExceeded`, before the call, as when the turn's own budget is spent."""
    account, cap = turn.account, step.cap
    assert account is not None and cap is not None
    want = cap if step.sent is None else step.sent  # (none sent: what is left)
    available = await account.reserve(want, waits_notice(turn, want))
    if not available:
        raise BudgetExceeded("max_output_tokens")
    step.held = min(want, available)
    if available < cap:  # the account, not the turn's own budget, bounds it
        step.cap = available
        step.sent = sent_cap(provider, settings, available)


def waits_notice(turn: Turn, want: int) -> Callable[[int, int, int], Awaitable[None]]:
    """What a reservation of ``want`` tokens for ``turn``'s current step calls when it
    must wait (:meth:`OutputAccount.reserve <runtime.budget.OutputAccount.reserve>`):
    a ``budget-wait`` chunk in the turn's stream (on the bus too), so a UI or a log
    shows why the sub-turn has stopped streaming."""

    async def notice(available: int, held: int, ahead: int) -> None:
        await turn.ctrl.send(
            BudgetWaitNotice(step=turn.step, want=want, available=available, held=held, ahead=ahead)
        )

    return notice


def _settle(turn: Turn, step: Step, spent: int) -> None:
    """Give back to the turn's account what ``step``'s call reserved and did not write
    (``spent``: the tokens it counts), once."""
    held = step.held
    if held:
        step.held = 0
        account = turn.account
        assert account is not None
        account.settle(held, spent)


def cut_by_budget(step: Step) -> bool:
    """Whether a call of ``step`` that finished ``length`` was cut by the cap the turn's
    output budget sent it (:attr:`Step.cap`), so the turn ends ``budget``, not
    ``length`` (a limit of the model's or server's own).

    Its reported output reaching the cap says so. Below it, a server that stopped at
    our cap of N tokens wrote N of its own, and reports fewer only by counting them
    otherwise (a last or special token left out, a proxy counting with another
    tokenizer): a few, or some tens of percent, so a report within :data:`CUT_MARGIN`
    of the cap is the budget's cut too. Not when the request carried a smaller cap
    (:attr:`Step.sent`, from the provider's request mapping: the agent's ``settings``,
    the provider's options, its API's default such as Anthropic's 4096): that one cut
    it, ``length`` (before, only the settings' were seen, so a cut by Anthropic's
    default within a quarter of a larger budget's cap read ``budget``); nor far below
    the cap: then another limit cut it (the context window's end on a server that does
    not refuse the request for it, the model's own maximum), and ``budget`` would say
    the turn's allowance ran out while most of it is left. Rejected: every ``length``
    of a call whose cap was the budget's remainder: a llama.cpp or Ollama server that
    reaches its context's end after 500 tokens of a 10,000 budget would read
    ``budget``, wrongly, whatever the budget."""
    cap = step.cap
    if step.finish != "length" or cap is None:
        return False
    written = step.usage.output_tokens
    if written >= cap:
        return True
    sent = step.sent
    if sent is not None and sent < cap:
        return False  # (the request carried a smaller cap than the budget's: it cut it)
    return written >= cap - cap // CUT_MARGIN


def _past_deadline(wait: float) -> float | None:
    """The seconds left to the current task's deadline (the turn's ``Budget.deadline``)
    when a wait of ``wait`` seconds ends past it, else ``None``."""
    left = trio.current_effective_deadline() - trio.current_time()
    return left if wait > left else None


def _within_deadline(delay: float, limiter: Limiter | None, exc: ProviderError) -> float | None:
    """A retry's ``delay``, or ``None`` (no retry: a fallback, or ``exc`` is the turn's
    error) when the retry cannot begin before the turn's deadline: its own delay, or the
    pause the failed call's ``retry-after`` put on the provider's rate limit (capped at
    the limit's ``max_pause``), ends past it. ``exc`` then says so and is not retryable.

    Why: a 120 s deadline facing a 600 s pause waited its 120 s and ended the turn
    ``budget``, empty, the provider's 429 said nowhere (branch ``leftmix``)."""
    wait = delay
    if limiter is not None and isinstance(exc, RateLimited) and exc.retry_after:
        wait = max(wait, min(float(exc.retry_after), limiter.limit.max_pause))
    left = _past_deadline(wait)
    if left is None:
        return delay
    exc.message = (
        f"{exc.message} (its {wait:g} s wait ends past the turn's deadline, {left:g} s away)"
    )
    exc.args = (exc.message,)
    exc.retryable = False
    return None


def _joined(instructions: str | None, more: str | None) -> str | None:
    """The agent's instructions with a turn's own added after them."""
    if not more:
        return instructions
    return f"{instructions}\n\n{more}" if instructions else more
