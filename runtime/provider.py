"""The provider actor base: one actor per provider configuration, shared by sessions.

A provider handles :class:`InferRequest` s, each in a child task of its
own (:class:`~runtime.actor.ServingActor`), so one slow model call never holds up another
session's. A subclass implements :meth:`Provider.stream`: restore the request's messages
into its SDK's format, call the SDK, and ``emit`` :data:`~runtime.chunks.StreamChunk` s
as the SDK's stream arrives. Anything it raises is classified
(:meth:`Provider.classify_error`) and sent to the requester as
:class:`StreamFailed`; the provider actor never crashes because one
call failed, and if it crashes for another reason every call in flight fails with
:class:`~runtime.errors.ActorFailed`.

The messages of a request are already repaired (:func:`runtime.history.repair`, applied
once by the turn runner): every tool call has a result and no result lacks its call.

SDKs are imported lazily inside subclasses so ``import runtime`` stays fast.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import trio

from runtime.actor import ServingActor
from runtime.chunks import FinishChunk, StreamChunk, _eq, _hash, _repr
from runtime.errors import (
    ActorFailed,
    AxonError,
    CallTimeout,
    ConfigurationError,
    ConnectionLost,
    IdleTimeout,
    Overloaded,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    RateLimitUnavailable,
    describe_exception,
)
from runtime.inbox import Batch, Batcher, Inbox
from runtime.logging import get_logger
from runtime.messages import Message

if TYPE_CHECKING:
    # Imported where they are used: a provider's endpoint, price key and rate limit are
    # worked out when a call is made, and a program that imports the contract without
    # running a turn (a tool module, ``--help``) need not build these modules' classes.
    from runtime.history import ForeignReasoning, Origin
    from runtime.pricing import PriceKey
    from runtime.ratelimit import Limiter, RateLimit


@functools.cache
def _history() -> tuple[type[Origin], Callable[[str], str]]:
    """:class:`~runtime.history.Origin` and :func:`~runtime.history.endpoint_of`, imported
    at their first use (see above) and kept. Why kept: a ``from ... import`` in a function
    runs the import system on every call, ~7,600 instructions for a module that is no
    package (its failed ``__path__`` lookup builds an ``AttributeError``), and a turn ran
    seven of them through :attr:`Provider.endpoint`, :attr:`Provider.origin` and
    :meth:`Provider.price_key` (issue 24 goal 1); a cached call is ~100."""
    from runtime.history import Origin, endpoint_of

    return Origin, endpoint_of


@functools.cache
def _pricing() -> tuple[type[PriceKey], Callable[[str], bool]]:
    """:class:`~runtime.pricing.PriceKey` and :func:`~runtime.pricing.is_local`, imported
    at their first use and kept (as :func:`_history`)."""
    from runtime.pricing import PriceKey, is_local

    return PriceKey, is_local


# -- what a provider is sent -----------------------------------------------------------


@attrs.define(kw_only=True, slots=True, eq=False)
class InferRequest:
    """Ask a provider actor for one model call; chunks go to ``reply`` in batches."""

    __repr__ = _repr

    request_id: str
    session_id: str
    turn_id: str
    step: int
    instructions: str | None
    messages: tuple[Message, ...]
    tools: tuple[Any, ...]
    """:class:`runtime.tools.Tool` s offered to the model."""
    reply: Inbox[Batch[Any]]
    """Where the chunks go: batches of stream chunks, a :class:`StreamFailed` last if the
    call failed."""
    cancel_scope: trio.CancelScope
    """Entered by the provider's task; the requester cancels it to stop the call."""
    settings: dict[str, Any] = attrs.field(factory=dict)
    output: Any = None
    """The agent's :class:`~runtime.output_schema.OutputSchema`: the provider asks for an
    answer that is JSON matching it (``None``: free text)."""
    max_output_tokens: int | None = None
    """The output tokens the turn has left (:attr:`Budget.max_output_tokens
    <runtime.budget.Budget.max_output_tokens>` less what its calls wrote so far), at least
    1; ``None``: no output budget. The provider sends it as its API's own cap on the
    call's output (:func:`cap_output`), so a call cannot write past the turn's budget:
    the budget was only checked once a call's usage came back, and a turn allowed 200
    tokens could be billed for a 4,000-token answer."""
    text_runs: bool = False
    """Whether ``reply`` takes :class:`TextRun` s: the turn runner's engine does, and a
    provider that reads a network read at a time may then send a read's text deltas as
    one (the OpenAI and Anthropic providers do); any other requester gets a
    :class:`~runtime.chunks.TextChunk` per delta, as every provider may always send."""


def _an_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cap_output(
    options: dict[str, Any], key: str, left: int | None, default: Any = None
) -> int | None:
    """Set ``options[key]``, a provider's output token cap (its API's field name), to the
    smaller of the cap the options already give (the agent's ``settings`` over the
    provider's own options; else ``default``, the provider's own, if any) and ``left``
    (:attr:`InferRequest.max_output_tokens`): an explicit cap below what the turn has left
    stays, the turn's budget wins when it is smaller. Nothing changes when ``left`` is
    ``None``. Returns the cap the request then carries in that field, if it is an int
    (``None``: none, or a value the API will refuse): what :meth:`Provider.sent_cap`
    tells the turn runner."""
    given = options.get(key, default)
    if left is None:
        return given if _an_int(given) else None
    small = _an_int(given) and given < left
    options[key] = given if small else left
    return options[key]  # type: ignore[no-any-return]


CAP_SETTINGS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""The request fields that cap a call's output, one API's or another's (Chat
Completions, Anthropic; Chat Completions; Responses, Gemini): what
:meth:`Provider.sent_cap` looks for by default."""


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class StreamFailed:
    """The model call failed; always the last item a provider sends for a request."""

    __repr__ = _repr

    error: BaseException


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class TextRun:
    """Consecutive text deltas of one part, each one delta of the stream, in one item:
    provider -> engine -> turn runner -> stream controller, which makes each its own
    ``text-delta`` chunk, in order. Only to a request with :attr:`InferRequest.text_runs`.

    Why: a :class:`~runtime.chunks.TextChunk` per delta was built by the provider and
    looked at one by one by the engine, the turn runner and its parts manager before the
    controller built the delta the consumer sees: a Python object and a loop turn per
    delta in each stage, where the floor (bare httpx + orjson) has one loop (issue 24
    goal 1). A run crosses those stages as one item (the engine checks its text for a
    think tag's first character in one look, the parts manager extends its pieces with
    it), and the stream shows exactly what the same deltas as text chunks show: the same
    deltas, the same part boundaries, the same stored text.

    ``texts`` are not empty and are no refusal (a provider sends those as text chunks),
    at most :data:`~runtime.inbox.MAX_RUN` of them; a run never spans two parts (the
    provider ends it where it sees a new block). The list is the run's own: nobody
    changes it once sent."""

    __repr__ = _repr

    texts: list[str]


Emit = Callable[[StreamChunk], Awaitable[None]]


async def emit_all(emit: Emit, chunks: Sequence[StreamChunk]) -> None:
    """``emit`` each of ``chunks`` in order; in one go when ``emit`` takes a list
    (``send_all``: the :class:`~runtime.inbox.Batcher` a provider actor is
    given), so that a provider that parses a network read at a time pays one call per
    read, not one per delta."""
    send_all = getattr(emit, "send_all", None)
    if send_all is not None:
        await send_all(chunks)
        return
    for chunk in chunks:
        await emit(chunk)


DESCRIBE_KEYS = (
    "provider",
    "name",
    "model",
    "base_url",
    "timeout",
    "call_timeout",
    "idle_timeout",
    "max_concurrency",
    "options",
    "settings",
)
"""The keys of every provider's :meth:`Provider.describe`, in this order."""


@attrs.frozen(kw_only=True, slots=True)
class ProviderOptions:
    """A provider configuration as the command line gives it (``--model``,
    ``--base-url``, ...). Every provider reads the fields that apply to it and ignores
    the rest, so one set of options serves every provider in the registry."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    model: str | None = None
    """``None``: the provider's default model."""
    base_url: str | None = None
    api_key: str | None = None
    """``None``: the SDK reads its usual environment variable, at the first call."""
    thinking_budget: int | None = None
    delay: float = 0.0
    """Scripted demo: seconds between chunks."""


class Provider(ServingActor[InferRequest]):
    """Base class of provider actors. Subclasses set ``provider_name`` and ``stream``."""

    provider_name: ClassVar[str] = "provider"
    request_types: ClassVar[tuple[type, ...]] = (InferRequest,)
    inbox_capacity: ClassVar[int] = 1024
    max_hold: ClassVar[float | None] = 0.002
    """Seconds a parsed chunk may wait for the engine before the provider's task yields
    (see :class:`~runtime.inbox.Batcher`): bounds the first-delta latency of a burst."""
    default_endpoint: ClassVar[str | None] = None
    """The endpoint the SDK calls when no ``base_url`` is given (``None``: none)."""
    endpoint_env: ClassVar[str | None] = None
    """The environment variable the SDK reads a base URL from when none is given."""
    price_vendor: ClassVar[str | None] = None
    """The vendor's id in the price table (:mod:`runtime.pricing`) when calls go to its
    own endpoint; ``None``: this provider's calls are not priced unless ``price_as``
    says how."""
    usage_input_includes_cache: ClassVar[bool] = True
    """Whether the ``input_tokens`` this provider reports count the cached tokens."""
    coalesce_deltas: bool = False
    """Join the consecutive text deltas of one part that arrive in one network read into
    one :class:`~runtime.chunks.TextChunk` (providers that read their stream a read at a
    time: OpenAI Chat Completions and Anthropic). The text and the part boundaries are
    the same, nothing waits for more (only what already arrived together is joined), and
    a stream's first delta always goes alone; a consumer gets fewer, longer deltas, which
    makes a long answer's stream cost about one pass per read instead of one per token
    (see benchmarks/README.md, figure 1). Off by default: set it on the instance
    (``provider.coalesce_deltas = True``)."""
    hold_rounds: ClassVar[int] = 5
    """Scheduler rounds the provider's task yields each time: one per stage a chunk
    passes after it (engine, turn runner, stream controller, consumer) and one more,
    since the consumer and the provider run in the same last round in either order; so
    a held delta reaches the consumer before parsing resumes."""

    def __init__(
        self,
        *,
        model: str = "",
        max_concurrency: int | None = None,
        name: str | None = None,
        rate_limit: RateLimit | None = None,
        call_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        default = f"{self.provider_name}:{model}" if model else None
        super().__init__(name=name or default)
        self.model = model
        self.max_concurrency = max_concurrency
        """At most this many calls in flight at once in this process."""
        self.rate_limit = rate_limit
        """Limits of this configuration for all processes together (requests and tokens
        per minute, concurrency): kept by :attr:`limiter` (see :mod:`runtime.ratelimit`)."""
        self.limiter: Limiter | None = None
        """What keeps :attr:`rate_limit`: set by the host that starts this provider
        (in-process, or in Redis on a worker); ``None`` without a rate limit."""
        self._limiter = trio.CapacityLimiter(max_concurrency) if max_concurrency else None
        self._idle_watches: set[_IdleWatch] = set()  # the calls with an idle deadline now
        self._idle_watchdog = False  # whether the task looking at them runs
        self.base_url: str | None = None
        """The endpoint, for providers that call one (``None``: the SDK's default)."""
        self.timeout: float | None = None
        """Seconds to connect and between two reads, for providers that call an endpoint.
        Any bytes reset it, keep-alives too: :attr:`idle_timeout` and
        :attr:`call_timeout` bound what it cannot."""
        self.call_timeout = check_deadline("call_timeout", call_timeout)
        """Seconds one model call may take from its start (after a ``max_concurrency``
        slot) to its end, whatever it streams; then it fails with
        :class:`~runtime.errors.CallTimeout`. ``None``: no limit (the SDK providers'
        default is :data:`CALL_TIMEOUT`)."""
        self.idle_timeout = check_deadline("idle_timeout", idle_timeout)
        """Seconds a model call may go without streaming anything (text, reasoning, a
        tool call's input, usage: a chunk), keep-alives not counted; then it fails with
        :class:`~runtime.errors.IdleTimeout`. Time the requester takes to read what was
        streamed is not idle. ``None``: no limit (the SDK providers' default is
        :data:`IDLE_TIMEOUT`)."""
        self.request_options: dict[str, Any] = {}
        """Extra request fields sent with every call (only their names are described)."""
        self.foreign_reasoning: ForeignReasoning = "drop"
        """Reasoning another provider, model or endpoint produced cannot be replayed here:
        ``"drop"`` it (the default) or send its text as plain text (``"text"``), where
        this provider's API takes text in its place (see docs/providers.md)."""
        self.price_as: str | None = None
        """Price this provider's calls as this vendor's in the price table (its id:
        ``"openai"``, ``"anthropic"``, ...), wherever they go: a gateway that forwards to
        the vendor. ``None``: priced as the vendor's own at its endpoint, as whatever the
        table knows another endpoint to be, and not at all elsewhere."""

    @staticmethod
    def check_foreign_reasoning(value: str) -> ForeignReasoning:
        """``value`` if it is a :data:`~runtime.history.ForeignReasoning` mode, else a
        :class:`~runtime.errors.ConfigurationError` naming the modes."""
        from runtime.history import FOREIGN_REASONING

        if value not in FOREIGN_REASONING:
            raise ConfigurationError(
                f"foreign_reasoning must be one of {', '.join(FOREIGN_REASONING)}, not {value!r}"
            )
        return value  # type: ignore[return-value]

    @property
    def endpoint(self) -> str | None:
        """The normalised endpoint calls go to (:func:`~runtime.history.endpoint_of`):
        ``base_url``, else the SDK's environment variable, else its default."""
        url = self.base_url
        if url is None and self.endpoint_env is not None:
            url = os.environ.get(self.endpoint_env) or None
        url = url or self.default_endpoint
        if not url:
            return None
        return _history()[1](url)

    @property
    def origin(self) -> Origin:
        """This provider's own :class:`~runtime.history.Origin`: the tag, model and
        endpoint recorded on the reasoning and provider data it produces, and the only
        origin whose parts it sends back."""
        origin = _history()[0]
        return origin(provider=self.provider_name, model=self.model or None, endpoint=self.endpoint)

    def price_key(self) -> PriceKey | None:
        """How the price table finds this provider's calls (:mod:`runtime.pricing`), or
        ``None`` when they cannot be priced: no model, an endpoint on this machine or a
        private network, or a provider that names no vendor."""
        model = self.model
        if not model:
            return None
        endpoint_of = _history()[1]
        PriceKey, is_local = _pricing()

        cache = self.usage_input_includes_cache
        if self.price_as is not None:
            return PriceKey(model=model, provider_id=self.price_as, input_includes_cache=cache)
        if self.price_vendor is None:
            return None
        endpoint, default = self.endpoint, self.default_endpoint
        if endpoint is None or (default is not None and endpoint == endpoint_of(default)):
            return PriceKey(model=model, provider_id=self.price_vendor, input_includes_cache=cache)
        if is_local(endpoint):
            return None
        return PriceKey(model=model, api_url=endpoint, input_includes_cache=cache)

    @classmethod
    def from_options(cls, options: ProviderOptions) -> Provider:
        """Build this provider from command-line options (what ``--provider NAME``
        constructs). Providers that cannot be configured that way keep this default."""
        raise ConfigurationError(
            f"the {cls.provider_name!r} provider cannot be configured from the command line; "
            "construct it in Python"
        )

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        """Make the model call for ``request`` and ``emit`` its chunks, ending with a
        :class:`~runtime.chunks.FinishChunk`. Raise to fail the call."""
        raise NotImplementedError

    def sent_cap(self, settings: Mapping[str, Any], left: int | None) -> int | None:
        """The output cap this provider's request for a call carries, given the agent's
        ``settings`` and the turn's ``left`` (:attr:`InferRequest.max_output_tokens`):
        what its request mapping puts in its API's max-tokens field (:func:`cap_output`),
        ``left`` or a smaller cap of the settings, of the provider's options or of its
        own default; ``None``: none. The turn runner asks it for each call it caps: a
        call cut (``length``) by a cap below the budget's was not cut by the budget
        (:func:`actors.turn.inference.cut_by_budget`), and a sub-agent's call reserves
        in its caller's account what it may write (:class:`~runtime.budget.
        OutputAccount`). Why: Anthropic's default of 4,096 was invisible to the runner,
        so a call it cut within a quarter of a larger budget's cap read ``budget``.

        This default: the smallest of ``left`` and the int caps the settings over the
        provider's options give (:data:`CAP_SETTINGS`). A provider whose request
        mapping caps its calls otherwise (another field, a default of its own) says so
        here, from the same code as its request."""
        options = {**self.request_options, **settings}
        given = (options.get(k) for k in CAP_SETTINGS)
        caps = [v for v in given if isinstance(v, int) and not isinstance(v, bool)]
        if left is not None:
            caps.append(left)
        return min(caps) if caps else None

    @property
    def limit_key(self) -> str:
        """The key :attr:`rate_limit` is counted under: provider, model and endpoint."""
        from runtime.ratelimit import limit_key

        return limit_key(self.provider_name, self.model, self.endpoint)

    async def observe_headers(self, response: Any) -> None:
        """Feed the limiter what a response's headers say (``x-ratelimit-*``,
        ``anthropic-ratelimit-*``, ``retry-after``): a limit the provider reports spent
        pauses every caller of this configuration until its reset. ``response`` is the
        HTTP response (anything with ``headers``) or ``None``."""
        limiter = self.limiter
        headers = getattr(response, "headers", None)
        if limiter is not None and headers is not None:
            from runtime.ratelimit import parse_rate_headers

            await _pause_shared(limiter, parse_rate_headers(headers))

    async def count_tokens(
        self, instructions: str | None, messages: Sequence[Message], tools: Sequence[Any]
    ) -> int | None:
        """The input tokens of a request with ``instructions``, ``messages`` and
        ``tools``, as this provider's API counts them: what context compaction measures
        a request by (:mod:`runtime.compaction`). ``None`` (this default): the provider
        has no count of its own, and :func:`~runtime.compaction.estimate_tokens` is used.
        Raise as :meth:`stream` does; a failed count falls back to the estimate too."""
        return None

    def classify_error(self, exc: BaseException) -> AxonError:
        """Map an exception raised by :meth:`stream` onto the error classes."""
        if isinstance(exc, AxonError):
            return exc
        return ProviderError(describe_exception(exc), provider=self.provider_name)

    def describe(self) -> dict[str, Any]:
        """The configuration, for logs and status pages; never includes credentials.

        The same keys for every provider (:data:`DESCRIBE_KEYS`): ``provider`` (the
        registry name), ``name`` (the actor's), ``model``, ``base_url``, ``timeout``,
        ``call_timeout``, ``idle_timeout``, ``max_concurrency``, ``options`` (the sorted
        *names* of the extra request options: their values may hold headers with
        credentials) and ``settings`` (what is particular to this provider, from
        :meth:`describe_settings`).
        """
        return {
            "provider": self.provider_name,
            "name": self.name,
            "model": self.model,
            "base_url": self.base_url,
            "timeout": self.timeout,
            "call_timeout": self.call_timeout,
            "idle_timeout": self.idle_timeout,
            "max_concurrency": self.max_concurrency,
            "options": sorted(self.request_options),
            "settings": self.describe_settings(),
        }

    def describe_settings(self) -> dict[str, Any]:
        """The provider's own settings for :meth:`describe` (no credentials)."""
        return {}

    # -- actor plumbing ----------------------------------------------------------------

    def fail(self, request: InferRequest, exc: BaseException) -> None:
        failure = StreamFailed(
            error=ActorFailed(f"provider {self.name} crashed: {describe_exception(exc)}")
        )
        batch: Batch[Any] = Batch(request.request_id)
        batch.append(failure)
        try:
            request.reply.put_nowait(batch)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def serve(self, request: InferRequest) -> None:
        out = Batcher(
            request.reply, request.request_id, max_hold=self.max_hold, hold_rounds=self.hold_rounds
        )
        scope = request.cancel_scope
        try:
            with scope:
                if self._limiter is not None:
                    async with self._limiter:
                        await self._timed(request, out)
                else:
                    await self._timed(request, out)
            if scope.cancel_called:
                # The requester is done with the call. A batch put after its cancel
                # (the task was already scheduled, and a put with room does not yield)
                # would sit in a resting engine's inbox until the session's next turn.
                out.recall(request.reply)
        except Exception as exc:  # the call failed: tell the requester, stay alive
            err = self.classify_error(exc)
            await self._paused_by(err)
            try:
                await out.send(StreamFailed(error=err))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _timed(self, request: InferRequest, out: Batcher[Any]) -> None:
        """:meth:`stream` within :attr:`call_timeout` and :attr:`idle_timeout`.

        Why here, around the stream, and not in it: a server that sends headers and then
        keep-alives (SSE comments, blank lines, Anthropic's ``ping`` events) for ever
        resets the HTTP read timeout with every one, and the call held its turn for ever
        (branch ``provdeadline``). The overall deadline is a cancel scope's; the idle one
        the provider's watchdog task, which compares what each call has sent
        (:meth:`Batcher.mark`) a few times per ``idle_timeout``: no provider's parsing
        does any work per chunk for either. What the call streamed before either stays
        streamed, and it fails as any mid-stream failure does (the turn keeps it, marked
        failed)."""
        call, idle = self.call_timeout, self.idle_timeout
        if call is None and idle is None:
            await self.stream(request, out)
            return
        failure: Exception | None = None
        watch: _IdleWatch | None = None
        # The deadline given to the scope as it is made, not set on it once entered: a
        # deadline set on an entered scope is taken out of and put back in Trio's deadline
        # heap (~11k instructions a call, issue 24 goal 1).
        deadline = math.inf if call is None else trio.current_time() + call
        with trio.CancelScope(deadline=deadline) as scope:
            if call is not None:
                out.inbox = _CallClock(request.reply, scope)  # a slow reader stops it
            period = 0.0  # seconds between two looks at the call
            if idle is not None:
                watch, period = _IdleWatch(out, request.reply, scope), idle / IDLE_CHECKS
            nursery = self._nursery
            if watch is not None and nursery is None:
                # ``serve`` called outside the actor's run(): a watchdog of its own
                async with trio.open_nursery() as own:
                    own.start_soon(_look_alone, watch, period)
                    try:
                        await self.stream(request, out)
                    except Exception as exc:  # raised as it is below, not in a group
                        failure = exc
                    own.cancel_scope.cancel()
            else:
                if watch is not None and nursery is not None:
                    self._idle_watches.add(watch)
                    if not self._idle_watchdog:
                        self._idle_watchdog = True
                        nursery.start_soon(self._look_at_idle_calls, period)
                try:
                    await self.stream(request, out)
                except Exception as exc:  # (what a cut call raised: see below)
                    failure = exc
                finally:
                    if watch is not None:
                        self._idle_watches.discard(watch)
        if scope.cancelled_caught or (failure is not None and scope.cancel_called):
            batch, n = out.mark()
            if batch is not None and n and type(batch[n - 1]) is FinishChunk:
                return  # the answer was whole: only what followed it was cut
            if watch is not None and watch.fired:
                raise IdleTimeout(
                    f"the model call streamed nothing for {idle:g} s "
                    "(idle_timeout; keep-alives do not count)",
                    provider=self.provider_name,
                ) from failure
            raise CallTimeout(
                f"the model call did not end within {call:g} s (call_timeout)",
                provider=self.provider_name,
            ) from failure
        if failure is not None:
            raise failure

    async def _look_at_idle_calls(self, period: float) -> None:
        """The provider's one idle watchdog: every ``period`` s (``idle_timeout /
        IDLE_CHECKS``) a look at each call that has an idle deadline (:class:`_IdleWatch`),
        until none is left. One task for all calls, started by the first that needs it,
        not one a call: a task, its nursery and its cancellation at each call's end cost
        an Anthropic 1,000-delta turn ~2.8 % more instructions (``benchmarks.instr_count``)."""
        watches = self._idle_watches
        try:
            while watches:
                await trio.sleep(period)
                for watch in list(watches):
                    watch.look()
        finally:  # (no checkpoint between the last look at ``watches`` and this)
            self._idle_watchdog = False

    async def _paused_by(self, err: AxonError) -> None:
        """A 429 whose ``retry-after`` says how long: every caller of this configuration
        (every worker, through a shared limiter) waits that long, not just this turn."""
        limiter, wait = self.limiter, getattr(err, "retry_after", None)
        if limiter is not None and isinstance(err, RateLimited) and wait:
            await _pause_shared(limiter, float(wait))


def check_deadline(name: str, value: float | None) -> float | None:
    """``value`` as a provider's :attr:`~Provider.call_timeout` or
    :attr:`~Provider.idle_timeout`: ``None``, or a number of seconds above zero (else a
    :class:`~runtime.errors.ConfigurationError` naming ``name``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(
            f"{name} must be a number of seconds above 0 or None, not {value!r}"
        )
    return float(value)


CALL_TIMEOUT = 1800.0
"""The SDK providers' default :attr:`Provider.call_timeout`: 30 minutes, the longest
answer the APIs allow (64k-128k output tokens) at their usual speed, with time to spare,
and no longer: a call that never ends fails then."""

IDLE_TIMEOUT = 300.0
"""The SDK providers' default :attr:`Provider.idle_timeout`: 5 minutes without a chunk.
A model that thinks before it answers streams its reasoning (Anthropic, Gemini,
Responses, DeepSeek) or sends nothing at all, which the read timeout (``timeout``, 60 s)
catches first; only a server that hides a long wait behind keep-alives (a gateway before
a model that does not stream its thinking) comes near it."""

IDLE_CHECKS = 4
"""Times per ``idle_timeout`` the idle watchdog looks at what the call sent: it fires
between ``idle_timeout`` and ``1 + 1/IDLE_CHECKS`` times it after the last chunk."""


class _IdleWatch:
    """The idle deadline of one call, looked at by its provider's watchdog
    (:meth:`Provider._look_at_idle_calls`): :meth:`look` cancels the call's scope once
    nothing was sent for :data:`IDLE_CHECKS` looks in a row while the requester had read
    all that was. Its first look only notes where the call is (the watchdog's looks fall
    at any time of a new call's first period), so it fires between ``idle_timeout`` and
    ``1 + 1/IDLE_CHECKS`` times it after the last chunk."""

    __slots__ = ("batch", "fired", "n", "out", "quiet", "reply", "scope")

    def __init__(self, out: Batcher[Any], reply: Inbox[Any], scope: trio.CancelScope) -> None:
        self.out = out
        self.reply = reply
        self.scope = scope
        self.batch, self.n = out.mark()
        self.quiet = -1  # looks in a row that found nothing sent (the first only notes)
        self.fired = False

    def look(self) -> None:
        seen, k = self.out.mark()
        if seen is not self.batch or k != self.n or len(self.reply):
            # Sent something, or the requester has not read it all yet (a slow
            # consumer's backpressure is not the server's silence).
            self.batch, self.n, self.quiet = seen, k, 0
            return
        self.quiet += 1
        if self.quiet >= IDLE_CHECKS and not self.fired:
            self.fired = True
            self.scope.cancel()


class _CallClock:
    """The requester's inbox as a call with a :attr:`~Provider.call_timeout` sends to it:
    while a put waits for room (the requester has not read what was sent: a UI reading
    slowly, whose backpressure reaches the provider through every stage's bounded
    inbox), the call's deadline is stopped, and it runs on with what was left once the
    put is through. The call deadline measures the server, not our own consumer: the
    server is not read while the provider waits, so that time says nothing of it, and a
    UI that read a long healthy answer for 31 minutes failed it with ``CallTimeout`` at
    30 (branch ``deadlinecli``). A put that does not wait costs one call more than the
    inbox's own (``put_nowait`` first; neither yields when there is room)."""

    __slots__ = ("inbox", "scope")

    def __init__(self, inbox: Inbox[Any], scope: trio.CancelScope) -> None:
        self.inbox = inbox
        self.scope = scope

    async def put(self, message: Batch[Any]) -> None:
        inbox = self.inbox
        try:
            inbox.put_nowait(message)
            return
        except trio.WouldBlock:
            pass
        scope = self.scope
        left = scope.deadline - trio.current_time()
        scope.deadline = math.inf
        try:
            await inbox.put(message)
        finally:
            scope.deadline = trio.current_time() + left

    def put_nowait(self, message: Batch[Any]) -> None:
        self.inbox.put_nowait(message)

    def put_over(self, message: Batch[Any]) -> None:
        self.inbox.put_over(message)


async def _look_alone(watch: _IdleWatch, period: float) -> None:
    """One call's own idle watchdog (a call served outside its provider's actor)."""
    while True:
        await trio.sleep(period)
        watch.look()


PAUSE_TIMEOUT = 2.0
"""Seconds recording a pause the provider asked for may take (a shared limit's Redis)."""


async def _pause_shared(limiter: Limiter, seconds: float) -> None:
    """``limiter.pause_for(seconds)``, best effort: a shared limit whose Redis does not
    answer within :data:`PAUSE_TIMEOUT` neither holds up the response nor fails the call
    (the next grant fails closed if it stays down)."""
    if seconds <= 0:
        return
    with trio.move_on_after(PAUSE_TIMEOUT):
        try:
            await limiter.pause_for(seconds)
        except RateLimitUnavailable as exc:
            get_logger("axon.limits").warning("limits.pause_failed", error=describe_exception(exc))


FALLBACK_ON: tuple[type[BaseException], ...] = (
    RateLimited,
    Overloaded,
    ProviderUnavailable,
    ProviderTimeout,
    ConnectionLost,
)
"""The failures a :class:`FallbackProvider` falls back on by default: the provider is
busy, down or unreachable. Not a bad request, a refused key or a context too long: the
next provider would be sent the same thing (and a key problem is to be fixed, not hidden)."""


def _providers(value: Iterable[Provider]) -> tuple[Provider, ...]:
    providers = tuple(value)
    if not providers:
        raise ConfigurationError("FallbackProvider needs at least one provider")
    for p in providers:
        if not isinstance(p, Provider):
            raise ConfigurationError(
                f"FallbackProvider takes providers (OpenAIProvider(...), ...), not {p!r}"
            )
    return providers


def _failure_classes(value: Iterable[type[BaseException]]) -> tuple[type[BaseException], ...]:
    classes = tuple(value)
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise ConfigurationError(f"FallbackProvider(on=...) takes error classes, not {c!r}")
    return classes


@attrs.frozen(slots=True)
class FallbackProvider:
    """Providers a turn tries in order: when a model call fails after its retries with
    one of the ``on`` errors, the same turn goes on with the next provider, from the step
    that failed (the committed steps stay as they are). The rest of the turn stays on
    that provider; the next turn starts with the first again.

    ``Agent(provider=[primary, fallback])`` makes one. The stored message then holds
    parts of several providers, each reasoning part bound to the one that made it
    (:func:`runtime.history.replays_to`), so the history replays to any of them.
    A call that fails after it streamed output (it is not retried then) is handed on
    too, after a ``reset-step`` chunk (:class:`~runtime.output.ResetStep`) that tells
    every consumer to drop what the step streamed; none of it is stored.
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    providers: tuple[Provider, ...] = attrs.field(converter=_providers)
    on: tuple[type[BaseException], ...] = attrs.field(
        default=FALLBACK_ON, converter=_failure_classes, kw_only=True
    )
    """The failures (after retries) that hand the call on; :data:`FALLBACK_ON` by default."""

    @property
    def primary(self) -> Provider:
        """The provider every turn starts with."""
        return self.providers[0]

    def falls_back_on(self, error: BaseException) -> bool:
        """Whether ``error`` (a call's failure after its retries) hands the call on."""
        return isinstance(error, self.on)
