"""The log tap: every bus event it is given becomes one structlog JSON line.

It subscribes to the lifecycle events and the output chunks, but not to the supervisor's
(:data:`SUPERVISION_TYPES`): the supervisor logs each crash, restart and give-up itself.

Each line has ``event`` (the kind) and the correlation ids ``session_id``, ``turn_id``,
``step``, ``part_id``, ``seq`` and ``causation_id`` when the event has them. Deltas are
logged at debug level, and so are the output chunks that only frame the stream (start,
step, part and finish chunks: the lifecycle events ``turn.*`` and ``step.*`` say the
same at info, so an info log had every turn twice, twelve lines where six tell it,
issue 24) and a ``tool-approval-request`` chunk (``tool.approval-requested`` says it all
at info, issue 21); when debug is off the tap does not even subscribe to them, so a chunk
that is not logged costs nothing. Its inbox is ``drop-oldest``: a tap that falls
behind drops the oldest events (and says so), never makes an agent wait. Its lines go
through :func:`runtime.configure_logging`'s chain on the event loop (that sink never
waits for its reader: :mod:`runtime.logging`); a line of a chain the application
configured itself (its structlog processors, a stdlib handler) is processed on the loop
and written by a thread of the tap's own (:class:`_OffLoop`): such a sink that blocked
(a handler sending each record over the network, a file on a stalled mount) held every
turn of the host while it wrote.

Every line is redacted exactly once: by the logger's own processors when they redact
(those of :func:`runtime.configure_logging` do, for every line whoever logs it), else by
the tap itself (a logger of the application's, structlog's defaults, ``capture_logs``).
Redacting in both places was a third of each line's cost (issue 24).

What a line takes from its event is worked out once per event class (:class:`_Plan`: its
level, a cattrs function of its fields, which fields may hold media), and a line to one of
structlog's filtering loggers goes through the processor chain in one call
(``_process_event``, :meth:`LogTap._foreign`):
a line cost 16.6 us before, 11.4 after (``benchmarks/log_lines.py``).
"""

from __future__ import annotations

import contextvars
import threading
import types
import typing
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import structlog
import trio

from runtime.actor import Actor
from runtime.events import (
    LIFECYCLE_EVENT_TYPES,
    ActorCrashed,
    ActorGaveUp,
    ActorRestarted,
    Lagged,
)
from runtime.inbox import OverflowPolicy
from runtime.logging import (
    JsonRenderer,
    QuietStream,
    UtcStamper,
    _say_logging_failed,
    format_exc_info,
    get_logger,
    level_enabled,
)
from runtime.logging import chain_redacts as _chain_redacts
from runtime.media import elide_media
from runtime.output import (
    DELTA_TYPES,
    OUTPUT_CHUNK_TYPES,
    Error,
    Finish,
    ReasoningFinish,
    ReasoningStart,
    Start,
    StepFinish,
    StepStart,
    TextFinish,
    TextStart,
    ToolApprovalRequest,
)
from runtime.redact import (
    SHORTEST_MATCH,
    is_secret_key,
    redact,
    redact_log_line,
    redact_processor,
    timestamps_are_clean,
)
from runtime.serde import converter, fields_unstructurer

_WARN = (ActorCrashed, Lagged)
_ERROR = (ActorGaveUp, Error)
_FRAMES = (Start, StepStart, TextStart, TextFinish, ReasoningStart, ReasoningFinish, StepFinish)
_RESTATED = (ToolApprovalRequest,)
"""Output chunks whose every field a lifecycle event logged at info carries too: a
``tool-approval-request`` chunk (step, call id, tool name, approval id) says what the
``tool.approval-requested`` line says (with the approval id as its ``causation_id``, and
the call's input besides). One line per approval asked, not two (issue 21: a suspended
turn's extra lines were a fifth of what it costs over a plain turn)."""
SUPERVISION_TYPES: tuple[type, ...] = (ActorCrashed, ActorRestarted, ActorGaveUp)
"""The supervisor's events, which the tap does not subscribe to: the supervisor writes
each as a line of its own (``axon.supervisor``, with the crash's traceback and the
event's fields), whether or not a tap runs; the tap wrote every crash, restart and
give-up a second time."""
DEBUG_TYPES: tuple[type, ...] = (*DELTA_TYPES, *_FRAMES, Finish, *_RESTATED)
"""Output chunks logged at debug: the deltas, the chunks that frame the stream (what
the ``turn.*`` / ``step.*`` lifecycle events already say at info) and those a lifecycle
event restates (:data:`_RESTATED`)."""


class LogTap(Actor):
    """Writes bus events through structlog (logger ``axon.events``)."""

    overflow: ClassVar[OverflowPolicy] = "drop-oldest"
    inbox_capacity = 4096

    def __init__(self, *, name: str = "log-tap", logger: Any = None, window: float = 0.0) -> None:
        super().__init__(name=name)
        self.log = logger or get_logger("axon.events")
        self.window = window
        """Seconds the tap rests after it wrote its lines and found its inbox empty, so
        the events of that time are handled together (up to :data:`BATCH` a step) and
        written in one write (``0``: never rests, each event is handled as it comes).
        Only a tap that holds its lines rests (they go to a file through
        :func:`runtime.configure_logging`'s chain); a worker's tap rests :data:`WINDOW`
        (issue 24 goal 3)."""
        self._held: list[str] = []
        """Lines made while more events wait in the inbox (:meth:`handle`)."""
        self._stopping: trio.Event | None = None
        """Set by :meth:`stop`: a rest ends at once, the inbox is drained without one."""
        self._off: _OffLoop | None = None
        """Writes the lines of a chain the application configured, off the event loop
        (made at the first such line)."""

    def attach(self, bus: Any) -> None:
        debug = level_enabled(self.log, "debug")
        kinds = [
            k for k in (*LIFECYCLE_EVENT_TYPES, *OUTPUT_CHUNK_TYPES) if k not in SUPERVISION_TYPES
        ]
        if not debug:
            kinds = [k for k in kinds if k not in DEBUG_TYPES]
        self.subscribes_to = tuple(kinds)  # type: ignore[misc]
        super().attach(bus)

    async def run(self) -> None:
        try:
            await super().run()
        finally:  # cancelled between two events: what was made is still written
            self._write_held()
        off = self._off
        if off is not None and off.pending():  # its last lines, for a bounded while
            await trio.to_thread.run_sync(off.wait_empty, OFF_LOOP_WAIT, abandon_on_cancel=True)

    async def handle(self, event: Any) -> None:
        """The event's line, written at once if the inbox is empty, else with the lines
        of the events waiting behind it (up to :data:`HOLD_LINES`), in one write and one
        flush of the sink (a syscall each line was a sixth of a line's cost, issue 24).
        A line is held only while the tap has more to do without waiting; one event per
        step as before, and every held line is written before the tap waits, ends or
        crashes, and before a line of another path. The events already waiting behind
        it are made in this step too (up to :data:`BATCH`), with or without a window: a
        turn's lifecycle events come two or three in a round, and a step each was two
        task steps more a turn (issue 24 goal 1); what comes later waits for the next
        step as before, so no line is written later than it was."""
        try:
            self._line(event)
            if self._held:
                self._more(BATCH - 1)
        except BaseException:
            self._write_held()
            raise
        held = self._held
        if held and (len(held) >= HOLD_LINES or not len(self.inbox)):
            self._write_held()
            if self.window > 0 and not len(self.inbox):
                await self._pause()

    def _more(self, n: int) -> None:
        """Lines of up to ``n`` more events already waiting, in this step: once the tap
        has rested, what came meanwhile is made together, not one event a step
        (a step each was the tap's cost in a worker, whose loop runs a turn's events one
        scheduler round apart, issue 24 goal 3)."""
        inbox = self.inbox
        while n > 0 and (len(inbox) or inbox.dropped):
            n -= 1
            self._line(inbox.get_nowait())

    async def _pause(self) -> None:
        """Wait :attr:`window` seconds (less if the tap is stopped): the events of that
        time wait in the inbox, and the next step handles them together. An idle tap
        rests once, after its last line, then waits for its inbox as before."""
        stopping = self._stopping
        if stopping is None:
            stopping = self._stopping = trio.Event()
        with trio.move_on_after(self.window):
            await stopping.wait()

    def stop(self) -> None:
        super().stop()
        if self._stopping is None:
            self._stopping = trio.Event()
        self._stopping.set()

    def _write_held(self) -> None:
        held = self._held
        if held:
            self._held = []
            self.log._logger.msg("\n".join(held))

    def _line(self, event: Any) -> None:
        cls = type(event)
        plan = _plans.get(cls) or _make_plan(cls)
        log = self.log
        enabled = _FILTERING.get(type(log))
        fast = enabled is not None
        if not (plan.number in enabled if enabled is not None else level_enabled(log, plan.level)):
            # Nothing is built for a line nobody sees: redacting an event that carries a
            # message of megabytes takes seconds, on the event loop.
            return
        fields = plan.fields(event)
        for name in plan.deep:
            value = fields.get(name)  # absent: a field its converter leaves out by default
            if type(value) not in _SCALARS:
                elided = elide_media(value)
                if elided is not value:
                    fields[name] = elided
        if fast and type(log._logger) is _WRITE_LOGGER:
            chain = log._processors
            if chain == _configured or _configured_chain(chain):
                if fields.get("causation_id") is None:
                    fields["causation_id"] = (
                        fields.get("tool_call_id") or fields.get("part_id") or fields.get("turn_id")
                    )
                self._held.append(_configured_line(log, plan, event.kind, fields))
                return
        if not _chain_redacts(log):
            fields = redact(fields)
        if fields.get("causation_id") is None:  # what made it happen, most specific first
            fields["causation_id"] = (
                fields.get("tool_call_id") or fields.get("part_id") or fields.get("turn_id")
            )
        if fast:
            line = _json_line(log, plan.level, event.kind, fields)
            if line:
                self._held.append(line)
                return
            if line is not None:
                return  # (dropped by the chain)
        self._write_held()
        self._foreign(log, plan.level, event.kind, fields)

    def _foreign(self, log: Any, level: str, kind: str, fields: dict[str, Any]) -> None:
        """A line the tap's fast paths do not make: processed here, on the loop (a
        processor that drops it, ``capture_logs``, drops it at once), then written at
        once to :func:`runtime.configure_logging`'s sink (it never waits), or by
        :class:`_OffLoop` to any other (the application's own). A logger without
        structlog's ``_process_event`` is called whole in that thread."""
        off = self._off
        if off is None:
            off = self._off = _OffLoop()
        elif off.dropped and not off.pending():  # caught up: say how many it lost
            lines, off.dropped = off.dropped, 0
            self._foreign(log, "warning", "log.lines-dropped", {"lines": lines})
        process = getattr(log, "_process_event", None)
        if process is None:  # (its context variables, as the loop has them)
            off.put(contextvars.copy_context().run, (getattr(log, level), kind), fields)
            return
        try:
            args, kw = process(level, kind, fields)
        except structlog.DropEvent:
            return
        except Exception as exc:  # the application's processor: dropped, as _Guarded does
            _say_logging_failed(exc)
            return
        wrapped = log._logger
        if type(wrapped) is _WRITE_LOGGER and type(wrapped._file) is QuietStream:
            getattr(wrapped, level)(*args, **kw)  # configure_logging's sink: never waits
        else:
            off.put(getattr(wrapped, level), args, kw)


OFF_LOOP_LINES = 10_000
"""The most lines of an application's own chain :class:`_OffLoop` holds while its sink
is behind; past that, lines are dropped, and a ``log.lines-dropped`` line (``lines``: how
many) follows once it caught up."""
OFF_LOOP_WAIT = 2.0
"""Seconds a stopping tap waits for :class:`_OffLoop` to write the lines it holds."""
OFF_LOOP_IDLE = 1.0
"""Seconds :class:`_OffLoop`'s thread waits for another line before it ends (the next
line starts another): an idle host holds no thread for it."""


class _OffLoop:
    """Writes the lines of an application's own logging chain in a thread, in order: the
    sink's call (a stdlib handler's ``emit``, a ``WriteLogger``'s ``write``) may block,
    and on the event loop it held every turn of the host. At most
    :data:`OFF_LOOP_LINES` wait; past that a line is dropped and counted
    (:attr:`dropped`). A write that raises is dropped and said once on stderr, as
    :func:`runtime.get_logger`'s lines are."""

    __slots__ = ("_cond", "_queue", "_thread", "_writing", "dropped")

    def __init__(self) -> None:
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._writing = False
        self.dropped = 0
        """Lines dropped since the tap last said so (the tap reads and resets it)."""

    def put(self, write: Callable[..., Any], args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        with self._cond:
            if len(self._queue) >= OFF_LOOP_LINES:
                self.dropped += 1
                return
            self._queue.append((write, args, kw))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="axon-log-tap", daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def pending(self) -> bool:
        """Whether lines wait, or one is being written."""
        return bool(self._queue) or self._writing

    def wait_empty(self, timeout: float) -> bool:
        """Wait (a thread: blocks) at most ``timeout`` s for every line to be written."""
        with self._cond:
            return self._cond.wait_for(lambda: not self.pending(), timeout)

    def _work(self) -> None:
        cond, queue = self._cond, self._queue
        while True:
            with cond:
                self._writing = False
                if not queue:
                    cond.notify_all()  # (wait_empty)
                    cond.wait(OFF_LOOP_IDLE)
                    if not queue:
                        self._thread = None
                        return
                write, args, kw = queue.popleft()
                self._writing = True
            try:
                write(*args, **kw)
            except Exception as exc:
                _say_logging_failed(exc)


HOLD_LINES = 64
"""The most lines :meth:`LogTap.handle` holds for one write."""
BATCH = 32
"""The most events a tap handles in one step (those already waiting behind the one it
woke for): at ~15 µs a line, half a millisecond at most before the other tasks run again."""
WINDOW = 0.02
"""Seconds a worker's log tap rests between writes (:attr:`LogTap.window`): its lines
reach the file up to this much later, a few writes a second instead of one or more a
turn."""
_SCALARS = frozenset({str, int, float, bool, type(None)})
_LEVEL_NUMBERS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
assert all(len(level) < SHORTEST_MATCH for level in _LEVEL_NUMBERS)  # never redacted


@attrs.frozen(kw_only=True, slots=True)
class _Plan:
    """How the tap makes one event class's line, worked out once per class (issue 24)."""

    level: str
    """The line's level, by the event's class (:data:`DEBUG_TYPES` ...)."""
    number: int
    """:attr:`level` as a number, for a filtering logger's ``is_enabled_for``."""
    fields: Callable[[Any], dict[str, Any]]
    """The event's fields as the converter unstructures them, without ``type`` / ``kind``
    (:func:`runtime.serde.fields_unstructurer`)."""
    deep: tuple[str, ...]
    """The fields whose values may hold an image's or file's data, elided
    (:func:`runtime.media.elide_media`); the others are scalars, or values made only of
    scalars (``usage``), by their declared types."""
    plain_keys: bool = False
    """No key a line of the class can have (its fields' names, ``causation_id``,
    ``event``) is named like a credential (:func:`runtime.redact.is_secret_key`): the
    redaction of its lines need not look them up (:func:`_configured_line`)."""


_plans: dict[type, _Plan] = {}
"""One plan per event class, made on the class's first line."""


def _level_of(cls: type) -> str:
    if issubclass(cls, DEBUG_TYPES):
        return "debug"
    if issubclass(cls, _ERROR):
        return "error"
    if issubclass(cls, _WARN):
        return "warning"
    return "info"


def _make_plan(cls: type) -> _Plan:
    level = _level_of(cls)
    if getattr(cls, "type", None) in ("image", "file") or not attrs.has(cls):
        # Not a bus event as they are (its own JSON would be elided as media): the steps
        # of a line one by one, as the converter and elide_media make it.
        def generic(event: Any) -> dict[str, Any]:
            fields = elide_media(converter.unstructure(event))
            fields.pop("type", None)
            fields.pop("kind", None)
            return fields  # type: ignore[no-any-return]

        plan = _Plan(level=level, number=_LEVEL_NUMBERS[level], fields=generic, deep=())
    else:
        fields = fields_unstructurer(cls, omit=("type", "kind"))
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # a type that does not resolve: every field is looked into
            hints = {}
        deep = tuple(
            a.name
            for a in attrs.fields(cls)
            if a.name not in ("type", "kind") and not _scalar_only(hints.get(a.name, Any))
        )
        names = (*(a.name for a in attrs.fields(cls)), "causation_id", "event")
        plan = _Plan(
            level=level,
            number=_LEVEL_NUMBERS[level],
            fields=fields,
            deep=deep,
            plain_keys=not any(is_secret_key(name) for name in names),
        )
    _plans[cls] = plan
    return plan


def _scalar_only(t: Any, depth: int = 0) -> bool:
    """Whether every value of type ``t`` unstructures to scalars only, or to a dict of
    them with no ``type`` key (elide_media looks for ``type: image`` / ``file``)."""
    if t is None or (isinstance(t, type) and t in _SCALARS):
        return True
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        return all(type(v) in _SCALARS for v in typing.get_args(t))
    if origin is typing.Union or origin is types.UnionType:
        return all(_scalar_only(a, depth + 1) for a in typing.get_args(t))
    if isinstance(t, type) and attrs.has(t) and depth < 4 and not hasattr(t, "type"):
        try:
            hints = typing.get_type_hints(t)
        except Exception:
            return False
        return all(
            a.name != "type" and _scalar_only(hints.get(a.name, Any), depth + 1)
            for a in attrs.fields(t)
        )
    return False


def _filtering_classes() -> dict[type, frozenset[int]]:
    """The bound logger classes of ``structlog.make_filtering_bound_logger`` (structlog's
    default and :func:`runtime.configure_logging`'s), each to the tap's levels it is
    enabled for (its ``is_enabled_for``, asked once here: a class's level is fixed, and a
    look-up is cheaper than the call a line): their level methods are only a level check
    around ``_process_event``, which :meth:`LogTap._foreign` calls itself. Empty (every line the
    public way) if this structlog's have no ``_process_event``."""
    classes = {structlog.make_filtering_bound_logger(n) for n in (0, 10, 20, 30, 40, 50)}
    needed = ("_process_event", "is_enabled_for")
    if not all(callable(getattr(c, name, None)) for c in classes for name in needed):
        return {}
    return {
        c: frozenset(n for n in _LEVEL_NUMBERS.values() if c.is_enabled_for(None, n))  # type: ignore[arg-type]
        for c in classes
    }


_FILTERING = _filtering_classes()


def _json_line(log: Any, level: str, kind: str, fields: dict[str, Any]) -> str | None:
    """The line :meth:`LogTap._foreign` would write, when ``log``'s chain ends in
    :class:`runtime.logging.JsonRenderer` and it writes to a ``structlog.WriteLogger``
    (:func:`runtime.configure_logging`'s), for the tap to write (``""``: dropped);
    ``None`` for any other logger. What ``_process_event`` does, without the fields
    spread into keyword arguments, nor the checks of what the last processor returned
    (a ``str`` here)."""
    processors = log._processors
    wrapped = log._logger
    if type(wrapped) is not _WRITE_LOGGER or not processors:
        return None
    if type(processors[-1]) is not JsonRenderer:
        return None
    line = log._context.copy()
    line.update(fields)
    line["event"] = kind
    try:
        for proc in processors:
            line = proc(wrapped, level, line)
    except structlog.DropEvent:
        return ""
    return line  # type: ignore[no-any-return]


_WRITE_LOGGER = structlog.WriteLogger

_BOUND_VARS: dict[str, Any] | None = getattr(structlog.contextvars, "_CONTEXT_VARS", None)
"""structlog's context variables, one per name ever bound (``bind_contextvars``): while
there are none, ``merge_contextvars`` has nothing to merge and is not called (it copies
the whole context and looks at every variable in it, a trio task's too: 3 % of the
tap's CPU). ``None`` if this structlog keeps them elsewhere: called for every line."""

_PLAIN_CONTEXT = frozenset({"logger"})
"""The key of the tap's own logger's context (:func:`runtime.get_logger` binds it)."""

_configured: list[Any] = []
"""The processors of the last chain found to be :func:`runtime.configure_logging`'s
(:func:`_configured_chain`): a line whose bound logger holds a list equal to it (the
same objects, in the same order) is made by :func:`_configured_line`."""


def _configured_chain(chain: Any) -> bool:
    """Whether ``chain`` is :func:`runtime.configure_logging`'s processors, as it makes
    them (remembered in :data:`_configured` if so): merge the context variables, the
    level, :class:`~runtime.logging.UtcStamper`, ``format_exc_info``, the redaction,
    :class:`~runtime.logging.JsonRenderer`."""
    global _configured
    if (
        type(chain) is list
        and len(chain) == 6
        and chain[0] is structlog.contextvars.merge_contextvars
        and chain[1] is structlog.processors.add_log_level
        and type(chain[2]) is UtcStamper
        and chain[3] is format_exc_info
        and chain[4] is redact_processor
        and type(chain[5]) is JsonRenderer
    ):
        _configured = chain[:]
        return True
    return False


def _configured_line(log: Any, plan: _Plan, kind: str, fields: dict[str, Any]) -> str:
    """The line :func:`_json_line` makes through :func:`runtime.configure_logging`'s chain
    (:func:`_configured_chain`) for an event of ``plan``'s class, its steps in line: the
    context variables merged only
    if any was ever bound (:data:`_BOUND_VARS`), the level set as ``add_log_level``
    sets one of the tap's levels (``debug`` ... ``error``, each its own name), the
    traceback's step only for a line with ``exc_info`` (never a bus event's), and the
    redaction made in the line the tap built (:func:`runtime.redact.redact_log_line`,
    the processor's answer without a second dictionary).

    The redaction looks at the context, the fields and the kind, before the level and the
    time stamp are set: a level is shorter than any secret (:data:`_LEVEL_NUMBERS`), and
    a stamp is only digits and ``-:.TZ``, which only a registered secret made of those
    could match (then, and with variables to merge, the whole line is looked at after
    its last step, as the chain does). Its keys are not looked up when the plan says no
    field's name is a credential's (:attr:`_Plan.plain_keys`) and neither is the bound
    logger's context's. ``tests/test_log_tap.py`` checks the lines are
    the same bytes."""
    chain = log._processors
    wrapped = log._logger
    level = plan.level
    context = log._context
    line = context.copy()
    line.update(fields)
    line["event"] = kind
    if (_BOUND_VARS is None or _BOUND_VARS) or "exc_info" in line or not timestamps_are_clean():
        if _BOUND_VARS is None or _BOUND_VARS:
            line = chain[0](wrapped, level, line)
        line["level"] = level
        line = chain[2](wrapped, level, line)
        if "exc_info" in line:
            line = format_exc_info(wrapped, level, line)
        return chain[5](wrapped, level, redact_log_line(line))  # type: ignore[no-any-return]
    plain = plan.plain_keys
    if plain and not context.keys() <= _PLAIN_CONTEXT:
        for key in context:  # a bound logger's own keys, looked up here
            if is_secret_key(key):
                plain = False
    redact_log_line(line, plain_keys=plain)
    line["level"] = level
    return chain[5](wrapped, level, chain[2](wrapped, level, line))  # type: ignore[no-any-return]
