"""Typed errors, in layers.

``AxonError`` is the root. :class:`ProviderError` and its subclasses classify what went
wrong with a model call so callers (and the retry policy) can act on it: each class says
whether it is ``retryable`` and, where the provider said so, ``retry_after`` seconds.
The ``error`` output chunk carries the class name as ``kind``. A content filter that stops
a response is not an error here: it is the step's finish reason ``content-filter``.

Messages are redacted when the error is made (:func:`runtime.redact.redact_urls`: what
:func:`~runtime.redact.redact_text` hides, and the credentials of any URL quoted, a
driver's DSN): a provider's 401 that quotes the key must not carry it into a log line, a
traceback or an HTTP response, wherever the exception ends up.
"""

from __future__ import annotations

from typing import NoReturn

from runtime.redact import redact_urls


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in naming its class when the exception's own ``__str__``
    raises (a careless class, one that recurses): reporting an error raised by a tool, a
    hook or an observer must never raise another one where it is being reported (the
    supervisor, the turn's error chunk), which took the whole host down."""
    try:
        return str(exc)
    except Exception:  # RecursionError included
        return "<exception str() failed>"  # what the traceback module writes


_GROUP_SHOWN = 5
"""Sub-exceptions of a group that :func:`describe_exception` names (the group's own text
says how many it holds)."""

_GROUP_DEPTH = 4
"""Levels of nested groups :func:`describe_exception` opens; deeper ones give their text."""


def exception_message(exc: BaseException) -> str:
    """The text of an exception (:func:`exception_text`) as it is reported, never
    raising: a group's followed by its first sub-exceptions, each described by
    :func:`describe_exception` (``boom (2 sub-exceptions): ValueError: a; KeyError:
    'b'``), since a group's own text (``"unhandled errors in a TaskGroup (1
    sub-exception)"``) says nothing of what failed. Redacted
    (:func:`runtime.redact.redact_urls`): a sub-exception's text (a provider's 401 quoting
    the key) reaches every caller, the ones that show it as it is (a crash message, the
    CLI) too."""
    return redact_urls(_message(exc, 0))


def describe_exception(exc: BaseException) -> str:
    """``TypeName: message`` of an exception (:func:`exception_message`: a group's
    sub-exceptions named, redacted), never raising; an exception with no text is its bare
    ``TypeName`` (``GeneratorExit``, not ``"GeneratorExit: "``)."""
    return redact_urls(_described(exc, 0))


def _message(exc: BaseException, depth: int) -> str:
    text = exception_text(exc)
    if isinstance(exc, BaseExceptionGroup) and depth < _GROUP_DEPTH:
        try:
            subs = list(exc.exceptions[:_GROUP_SHOWN])
        except Exception:  # a subclass whose exceptions attribute is not a sequence
            subs = []
        if subs:
            text += ": " + "; ".join(_described(e, depth + 1) for e in subs)
    return text


def _described(exc: BaseException, depth: int) -> str:
    text = _message(exc, depth)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


class AxonError(Exception):
    """Root of every error this runtime raises on purpose."""

    retryable: bool = False

    def __init__(self, message: str = "", *, retryable: bool | None = None) -> None:
        message = redact_urls(message)
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable

    @property
    def kind(self) -> str:
        return type(self).__name__


class ConfigurationError(AxonError):
    """The agent, tool, provider or host was set up wrongly (caught before any request)."""


class ToolDefinitionError(ConfigurationError):
    """A function cannot be made into a tool (missing hints, unsupported signature)."""


# -- providers -------------------------------------------------------------------------


class ProviderError(AxonError):
    """A model call failed. Subclasses classify why."""

    def __init__(
        self,
        message: str = "",
        *,
        retryable: bool | None = None,
        retry_after: float | None = None,
        status_code: int | None = None,
        provider: str | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.retry_after = retry_after
        self.status_code = status_code
        self.provider = provider


class RateLimited(ProviderError):
    """HTTP 429: too many requests; honour ``retry_after``."""

    retryable = True


class Overloaded(ProviderError):
    """The provider is overloaded (HTTP 529, Anthropic ``overloaded_error``)."""

    retryable = True


class ProviderUnavailable(ProviderError):
    """HTTP 5xx: the provider failed on its side."""

    retryable = True


class ProviderTimeout(ProviderError):
    """No response (or no next chunk) within the timeout."""

    retryable = True


class IdleTimeout(ProviderTimeout):
    """The model call streamed nothing for the provider's ``idle_timeout``: the server
    sent only keep-alives (SSE comments, blank lines, ``ping`` events), which reset the
    HTTP read timeout, or nothing it could read as content.

    Retried (while the call has streamed nothing, as every failure): a server that went
    quiet is the read timeout's case, which keep-alives only hid; the next request is a
    new one, perhaps to another machine behind the endpoint."""


class CallTimeout(ProviderTimeout):
    """The model call did not end within the provider's ``call_timeout``, however much it
    streamed and whatever keep-alives came.

    Not retried: the call had all the time one call is given, and another would make the
    turn wait that long again (the idle deadline catches a server that went quiet; a call
    that reaches this one was slow or never ending). A fallback provider
    (:class:`~runtime.provider.FallbackProvider`) still takes the step over, as for any
    :class:`ProviderTimeout`."""

    retryable = False


class ConnectionLost(ProviderError):
    """The connection could not be made or dropped mid-stream."""

    retryable = True


class AuthenticationFailed(ProviderError):
    """HTTP 401/403: the key is missing, wrong or lacks permission."""


class BadRequest(ProviderError):
    """HTTP 400/404/422: the request itself is wrong; retrying cannot help."""


class ContextTooLong(BadRequest):
    """The conversation exceeds the model's context window."""


class OutputCapTooLarge(BadRequest):
    """The request's output token cap (``max_tokens``, ``max_completion_tokens``,
    ``max_output_tokens``) is above what the model may write in one call.

    ``limit``: the model's maximum, when the error names it (OpenAI's "supports at most
    16384 completion tokens", Anthropic's "> 64000, which is the maximum allowed"), else
    ``None``. Why its own class: a turn's output budget sends what the turn has left as a
    call's cap, and a large budget is refused; the turn runner retries that call once
    with the cap lowered (:mod:`actors.turn.output_caps`), and nothing else."""

    def __init__(
        self,
        message: str = "",
        *,
        limit: int | None = None,
        retry_after: float | None = None,
        status_code: int | None = None,
        provider: str | None = None,
    ) -> None:
        super().__init__(
            message, retry_after=retry_after, status_code=status_code, provider=provider
        )
        self.limit = limit


class UnsupportedMedia(BadRequest):
    """A media type (an image or file format) that this provider cannot take.

    Raised while the request is built, before anything is sent, naming the type and the
    provider: a server's 400 would say less, later."""


class MalformedStream(ProviderError):
    """The response stream could not be parsed (garbage bytes, broken JSON, cut events)."""

    retryable = True


# -- media -------------------------------------------------------------------------------


class MediaError(AxonError, ValueError):
    """An image or file in user input that cannot be used. Raised before anything is stored."""


class InvalidMedia(MediaError):
    """Not a usable image or file: no data and no URL (or both), a URL scheme other than
    ``http:``, ``https:`` or ``data:``, a malformed media type, bytes that contradict it."""


class MediaTooLarge(MediaError):
    """An image, a file or one message's media together exceed their size limit
    (:class:`~runtime.media.MediaLimits`). ``size`` and ``limit`` are in bytes."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class TooManyParts(MediaError):
    """A user message has more parts, or more images and files, than the host accepts
    (:class:`~runtime.media.InputLimits`): refused before anything is decoded further,
    stored or queued. ``count`` and ``limit`` are numbers of parts."""

    def __init__(self, message: str, *, count: int, limit: int) -> None:
        super().__init__(message)
        self.count = count
        self.limit = limit


# -- sessions, stores, actors ------------------------------------------------------------


class SessionError(AxonError):
    """Misuse of a session."""


class InvalidSessionId(SessionError, ValueError):
    """A session id must be 1-128 characters of letters, digits, ``-``, ``_``, ``.``, ``:``."""


class InvalidCursor(SessionError, ValueError):
    """A page of sessions was asked with a cursor the store did not write, or a page
    size that is not a positive integer (:meth:`~runtime.store.Store.list_sessions`)."""


class InvalidTurnId(SessionError, ValueError):
    """A turn id, or a turn's message id, given to ``session.stream`` must be 1-128
    characters of letters, digits, ``-``, ``_``, ``.``, ``:``; and a turn to resume must
    name its message."""


class InvalidHistory(SessionError, ValueError):
    """A history given to ``open_session(history=...)`` holds something that is not a
    message, or names a session that is stored or open already (a given history starts
    a new session; it never overwrites one)."""


class InvalidMeta(SessionError, ValueError):
    """Session meta the store could not save: not a dict with str keys and JSON values.
    Refused when given (``open_session(meta=...)``, ``update_meta``), nothing changed."""


class SessionBusy(SessionError):
    """A turn is already running on this session; sessions run one turn at a time."""


class CallerWaits(SessionBusy):
    """A new input to the session of an agent used as a tool whose turn waits for a
    decision its calling session makes (``as_tool(pass_approvals=True)``): refused, as
    it would end that wait; decide it on the calling session (:attr:`caller`)."""

    def __init__(self, message: str, *, caller: str = "") -> None:
        super().__init__(message)
        self.caller = caller


class InputHeld(SessionBusy):
    """A user message sent while its session is busy, under an id the session holds
    already (the running turn's input, a waiting one's, or one in its history): a
    resend, refused instead of stored a second time."""


class RegenerateOutdated(SessionBusy):
    """A ``regenerate`` of a user message that waited while the session was busy, and
    is no longer the session's last user message when its turn would start: the turn
    that ran meanwhile answered a later one. Refused: regenerating would cut that turn
    (the one the client did not ask to run again) and store the message a second time."""


class TurnWithdrawn(SessionError):
    """A message that waited for its session's running turn was taken out of the queue
    before its own turn started (``POST /api/chat/{id}/stop`` naming it): it never ran,
    nothing of it was stored. ``reason`` says who took it out."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class HostClosed(AxonError):
    """The host was closed (its ``async with`` block was left): nothing more can start on it,
    no session opened nor turn run; open a new host (``Host.open()``), whose sessions load
    what the store kept."""


class ClosedWhileWaiting(SessionBusy, HostClosed):
    """A message that waited for its session's running turn (``enqueue``, ``steer``,
    ``interrupt`` while the turn it cut ends) when the host began closing: it never
    started, nothing of it is stored. A :class:`SessionBusy` (what such a wait raised
    before) and a :class:`HostClosed` (what the caller does: send it again to a new
    host; a web endpoint answers the closing host's 503, not a busy session's 409)."""


class DecisionError(SessionError, ValueError):
    """A decision for a turn waiting for input (:mod:`runtime.approval`) that cannot be
    taken; nothing was changed."""


class UnknownApproval(DecisionError, LookupError):
    """No call of the session waits for this approval id or tool call id (it never
    existed, or it belongs to another session)."""


class AlreadyDecided(DecisionError):
    """The call was decided already (perhaps by a concurrent caller, who won)."""


class WaitExpired(AlreadyDecided):
    """The call's wait expired (``Agent(approval_timeout=...)``) before this decision
    arrived, by the clock that decides (PostgreSQL's in a worker deployment, the host's
    otherwise), though nothing had noticed it yet: the decision is refused, as one for a
    call decided already is (409 on the web), and the call is denied ``timed out`` as if
    the timer had fired."""


class CallerDecides(AlreadyDecided):
    """The call waits in the session of an agent used as a tool, and the session that
    called it decides it: its turn waits for the same approval id
    (``as_tool(pass_approvals=True)``, docs/approval.md). A decision addressed to the
    sub-session is refused (409 on the web) and records nothing; decide it on the
    calling session named in the message (:attr:`caller`)."""

    def __init__(self, message: str, *, caller: str = "") -> None:
        super().__init__(message)
        self.caller = caller


class InvalidDecision(DecisionError):
    """The decision does not fit the call: an approval given an output, a client tool's
    output that does not match its schema, or neither given."""


class EditTooLarge(InvalidDecision):
    """An approval's edited input whose JSON is longer than the call takes: the larger of
    the agent's ``max_tool_result_chars`` and the JSON of the model's own input for that
    call (docs/approval.md, "Approving with edits"). Nothing is recorded; the call still
    waits. Unbounded, an edit was limited only by the HTTP body (``--max-body``), kept
    whole in the session and replayed to the model on every later call, where a reason
    or a client tool's output is cut to ``max_tool_result_chars``. ``size``: the edit's
    JSON, in characters; ``limit``: the most it may have."""

    def __init__(self, message: str = "", *, size: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class NothingToResume(SessionError):
    """``session.resume()`` on a session with no waiting turn whose calls are all
    decided."""


class SessionNotLoaded(SessionError):
    """The session was freed from memory while idle (its history is in the store).

    Raised only by the synchronous views of an evicted :class:`~runtime.app.session.Session`
    (``messages``, ``state``), which cannot load from the store; starting a turn or
    ``await session.reopen()`` loads the session again.
    """


class StoreError(AxonError):
    """The session store failed."""


class StoreCorrupt(StoreError):
    """The store file is not an Axon store or is damaged; it is never silently reset."""


class StoreConflict(StoreError):
    """A save was based on a version of the session that another writer has since replaced.

    Raised by :meth:`runtime.store.Store.save` when ``expected_version`` is not the
    session's stored version: another process (or another host on the same store) wrote
    the session after this one loaded it, and writing anyway would overwrite its turns.
    Nothing was written. ``expected`` is the version the caller based its save on,
    ``actual`` the version the store holds now; reload, then save again on top of it.
    """

    def __init__(self, message: str, *, session_id: str, expected: int, actual: int) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


SESSION_DELETED = "session deleted"
"""The abort reason of a turn ended because its session was deleted while it ran
(:class:`SessionDeleted`, ``host.delete_session``)."""


class SessionDeleted(StoreError):
    """A turn's save was refused: the session it was based on has been deleted since
    (``store.delete``, ``host.delete_session``) and the save would have created it again.

    Raised by the persister for a save based on a stored version of the session (or
    following one that stored) that finds the session gone. Nothing was written. The
    turn runner ends such a turn quietly: finish reason ``aborted``, abort reason
    ``session deleted``, no error, and it forgets the turn's messages (a later turn of the
    session starts a new conversation). A deleted session stays deleted."""

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class AnsweredElsewhere(StoreError):
    """A turn's save was refused: the store holds its user message already answered by
    another writer (the same message posted to two processes at once, a balancer's retry
    on the other upstream). Appending the turn would store a second answer and, its
    message's stored copy dropped, an answer first (:func:`runtime.store.rebase`).
    Nothing was written; the other writer's answer is the stored one. ``message_id`` is
    the user message's id."""

    def __init__(self, message: str, *, message_id: str) -> None:
        super().__init__(message)
        self.message_id = message_id


class QueueFull(AxonError):
    """A turn was not queued: its session, or the whole turn queue, already holds as many
    queued turns as it may (:class:`actors.stores.turns.TurnQueue`'s caps). Nothing was
    stored. ``retry_after`` is the seconds to wait before submitting again (a front end
    answers 429 with ``Retry-After``); ``scope`` is ``"session"`` or ``"total"`` and
    ``limit`` the cap that was reached."""

    retryable = True

    def __init__(self, message: str, *, scope: str, limit: int, retry_after: float) -> None:
        super().__init__(message)
        self.scope = scope
        self.limit = limit
        self.retry_after = retry_after


class RelayError(AxonError):
    """The live-output relay (:mod:`runtime.relay`) failed."""


class RelayUnavailable(RelayError):
    """The relay's server (Redis) did not answer within the retry window.

    Nothing committed is lost: the store holds every saved step; what is lost is only the
    live view, which a reader rebuilds from the store."""

    retryable = True


class RelayTurnGone(RelayError, LookupError):
    """The relay no longer has the turn, or lost part of it (expired, Redis restarted,
    or a writer's bounded queue overflowed while Redis was down).

    The relay is a cache: the caller rebuilds the turn from the committed messages in the
    store. A :class:`LookupError`, as :meth:`runtime.relay.Relay.read` promises."""


class RateLimitUnavailable(AxonError):
    """The shared rate limits' server (the workers' Redis) did not answer within the
    limiter's retry window: the model call was not made.

    Shared limits fail closed: a call the limit cannot count is not made, so that no
    minute holds more than the limit promises (docs/providers.md). The turn ends with
    this error (an ``error`` chunk, saved as failed); nothing was sent to the provider.
    Retrying later is safe."""

    retryable = True


class StoreUnavailable(StoreError):
    """The store's server could not be reached (down, restarting, refusing connections)
    for as long as the store retries. Nothing was written by the failed call; it is
    safe to try again later."""

    retryable = True


class TurnConflict(StoreError):
    """A submit to the turn queue that cannot be queued as asked: its idempotency key
    names another session's turn, or it edits a message whose turn has not ended or has
    later turns after it. Nothing was queued; a front end answers 409."""


class TurnIdTaken(TurnConflict):
    """A submit to the turn queue naming a turn id (the client's: an AI SDK ``turnId``,
    an AG-UI ``runId``) that another turn holds: one of another message, another
    session's, or one stored meanwhile by a request sent at the same time. Nothing was
    queued; a front end submits it again under an id of its own (as it does for an id
    it finds used before it submits)."""


class LeaseLost(StoreError):
    """A write fenced by a worker's ``(owner, epoch)`` was refused: another worker holds
    the lease now. Nothing was written."""


class ActorFailed(AxonError):
    """An actor exceeded its restart intensity; the session it served cannot go on."""


class BudgetExceeded(AxonError):
    """A turn budget ran out; ``budget`` names which one.

    Never surfaces as an error: :class:`~runtime.budget.Budget` raises it and the turn
    runner ends the turn with finish reason ``budget`` (``output.result.budget`` is the
    name), saving what was streamed. A hook may raise it for a budget of its own.
    """

    def __init__(self, budget: str, message: str = "") -> None:
        super().__init__(message or f"budget exceeded: {budget}")
        self.budget = budget


# -- MCP tool servers ---------------------------------------------------------------------


class MCPServerError(AxonError):
    """An MCP tool server failed a call (the model sees it as the tool's error)."""


class MCPServerUnavailable(MCPServerError):
    """An MCP server could not be started or reached, or its actor gave up restarting."""


class MCPServerDied(MCPServerError):
    """An MCP server's process exited or its connection closed (during a call)."""


class MCPToolError(MCPServerError):
    """An MCP server answered a call with an error (``isError`` or a JSON-RPC error)."""


class OutputValidationError(AxonError):
    """The model's answer does not match the agent's ``output_type``.

    The turn runner asks the model again with this message (``Agent.output_retries``
    times); after the last retry the turn ends with it (an ``error`` chunk, finish reason
    ``error``), every answer the model gave stays in the stored message. ``text`` is the
    last answer, as the model wrote it.
    """

    def __init__(self, message: str, *, text: str = "") -> None:
        super().__init__(message)
        self.text = text


# -- exception groups -------------------------------------------------------------------


def sole_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside ``group`` and the groups nested in it; ``None`` when it
    holds several.

    A Trio nursery wraps every error in a group (strict exception groups), even when one
    task failed for one reason; the caller of an ``async with`` block that owns a nursery
    expects that reason itself (``except ToolDefinitionError``), not a group of one."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending and len(leaves) < 2:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else None


def reraise(exc: BaseException) -> NoReturn:
    """Raise ``exc`` again as it was: its cause and context kept (raised in an ``except``
    block, it would otherwise get the group it came out of as its context)."""
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context
