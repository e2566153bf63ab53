"""History helpers the providers share: the repair pass and the split into steps.

These operate on :mod:`runtime.messages` values only; turning them into an SDK's request
format is each provider's job (``map_messages``).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import attrs
import trio

from runtime.chunks import _repr
from runtime.errors import InvalidHistory
from runtime.messages import (
    AssistantMessage,
    Message,
    Part,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    is_media_output,
)

ForeignReasoning = Literal["drop", "text"]
"""What a provider does with reasoning it may not replay (:func:`replays_to`): ``"drop"``
it, or send its text as plain answer text (``"text"``, for targets that take it)."""
FOREIGN_REASONING: tuple[str, ...] = ("drop", "text")

OFF_LOOP_MESSAGES = 1000
"""A history longer than this is checked and repaired in a worker thread when a session
opens with it (:func:`checked_off_loop`, :func:`repaired_off_loop`): a client may post one
of 600,000 messages (AG-UI, Chat Completions), whose walks took the event loop 0.5 s."""

INTERRUPTED = "interrupted: the tool call did not complete (the turn was cut short)"
EMPTY_INPUT = "(empty message)"
"""What Anthropic and Gemini are sent for a user message with nothing to send (``""``,
whitespace, blank text parts: the runtime takes them as input), which both refuse with a
400 (empty content, an empty text part); left out, the turns around it would merge, or
the request would end with the model's answer."""
_MESSAGE_TYPES = (SystemMessage, UserMessage, AssistantMessage, ToolMessage)
_same = operator.is_
"""The tail's identity checks (:class:`_TailRepair`), apart from the kept part's."""


def check_history(history: Iterable[Message]) -> tuple[Message, ...]:
    """``history`` as a tuple, if it holds messages only; else
    :class:`~runtime.errors.InvalidHistory` naming the first item that is not one.

    Only the types are checked: the order is the application's (a tool result whose call
    is missing is dropped by :func:`repair` when the history is sent, as for a stored
    one). A string, a common slip for one user message, is refused rather than read as
    a sequence of characters."""
    if isinstance(history, str | bytes | dict):
        raise InvalidHistory(
            f"history must be a list of messages, not {type(history).__name__}: "
            "e.g. [UserMessage(content='Hi'), AssistantMessage(...)]"
        )
    messages = tuple(history)
    for i, message in enumerate(messages):
        if not isinstance(message, _MESSAGE_TYPES):
            raise InvalidHistory(
                f"history[{i}] is a {type(message).__name__}, not a message: use "
                "UserMessage, AssistantMessage, ToolMessage or SystemMessage "
                "(runtime.serde.structure(data, Message) reads them from JSON)"
            )
    return messages


_T = TypeVar("_T")


OFF_LOOP_THREADS = 4
"""Walks of long histories (:func:`run_long_off_loop`) running in threads at once per
process, unless the caller hands its own limiter: more wait their turn."""

_OFF_LOOP_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "axon_off_loop_limiter"
)


def off_loop_limiter() -> trio.CapacityLimiter:
    """The run's limiter of the walks of long histories (:data:`OFF_LOOP_THREADS`
    tokens), made on first use: never trio's default thread limiter, which every other
    ``to_thread.run_sync`` of the process draws from (a submit's encoding, a name's
    resolution...), so that many long histories at once cannot take every one of its
    threads."""
    try:
        return _OFF_LOOP_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(OFF_LOOP_THREADS)
        _OFF_LOOP_LIMITER.set(limiter)
        return limiter


async def run_long_off_loop(
    size: int,
    fn: Callable[..., _T],
    *args: Any,
    limiter: trio.CapacityLimiter | None = None,
) -> _T:
    """``fn(*args)``, in a worker thread when ``size`` (the messages or rows it walks) is
    more than :data:`OFF_LOOP_MESSAGES`, else here, with no schedule point: what the
    history's checks, the stores' encoding and decoding run through. The caller hands
    the thread what nothing else changes meanwhile (a tuple, a copy, rows just read).

    The thread is taken through ``limiter`` (a front end's ``parse_limiter``, for a
    history a client sent), else :func:`off_loop_limiter`: never through trio's
    default limiter, whose threads the rest of the process shares."""
    if size <= OFF_LOOP_MESSAGES:
        return fn(*args)
    return await trio.to_thread.run_sync(
        fn, *args, limiter=limiter if limiter is not None else off_loop_limiter()
    )


async def checked_off_loop(
    history: Iterable[Message], *, limiter: trio.CapacityLimiter | None = None
) -> tuple[Message, ...]:
    """:func:`check_history`, in a worker thread for a list or tuple longer than
    :data:`OFF_LOOP_MESSAGES` (through ``limiter``: :func:`run_long_off_loop`). The
    thread is handed a tuple (copied here when a list), so nothing it reads can change
    meanwhile."""
    if isinstance(history, list | tuple) and len(history) > OFF_LOOP_MESSAGES:
        return await run_long_off_loop(len(history), check_history, tuple(history), limiter=limiter)
    return check_history(history)


async def repaired_off_loop(
    messages: Sequence[Message], *, limiter: trio.CapacityLimiter | None = None
) -> RepairedHistory | None:
    """A :class:`RepairedHistory` primed with ``messages`` in a worker thread, for a
    history longer than :data:`OFF_LOOP_MESSAGES` (through ``limiter``:
    :func:`run_long_off_loop`); else ``None`` (primed where it is used). The thread is
    handed a tuple and a fresh object, both unseen by the loop until it returns."""
    if len(messages) <= OFF_LOOP_MESSAGES:
        return None
    repaired = RepairedHistory()
    await run_long_off_loop(len(messages), repaired, tuple(messages), limiter=limiter)
    repaired.rest()
    return repaired


def repair(messages: Sequence[Message]) -> list[Message]:
    """Make a history valid for any provider.

    * every tool call gets a result: one without gets an ``interrupted`` error result,
      placed with the other results of its assistant message;
    * a tool result whose call is not in the assistant message before it is dropped;
    * a second result for the same call is dropped;
    * empty and whitespace-only text parts are removed.

    A call is its id *and* its step: servers that number calls per response
    (``call_0`` in every step) repeat an id across the steps of one message, and each
    of those calls keeps its own result (the result's ``step``; a result whose step
    matches no call of its id answers the first such call still unanswered).
    """
    out: list[Message] = []
    i = 0
    n = len(messages)
    while i < n:
        msg = messages[i]
        if isinstance(msg, ToolMessage):  # orphan: no assistant message claimed it
            i += 1
            continue
        if not isinstance(msg, AssistantMessage):
            out.append(msg)
            i += 1
            continue
        parts = tuple(
            p for p in msg.content if not (isinstance(p, TextPart) and not p.text.strip())
        )
        assistant = msg if len(parts) == len(msg.content) else attrs.evolve(msg, content=parts)
        out.append(assistant)
        calls = {(p.tool_call_id, p.step): p for p in parts if isinstance(p, ToolCallPart)}
        i += 1
        results: dict[tuple[str, int], ToolMessage] = {}
        while i < n and isinstance(messages[i], ToolMessage):
            tm = messages[i]
            assert isinstance(tm, ToolMessage)
            key = _call_of(tm, calls, results)
            if key is not None:
                results[key] = tm
            i += 1
        for key, call in calls.items():
            out.append(
                results.get(key)
                or ToolMessage(
                    tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name,
                    step=call.step,
                    error=INTERRUPTED,
                )
            )
    return out


def _call_of(
    result: ToolMessage,
    calls: dict[tuple[str, int], ToolCallPart],
    answered: dict[tuple[str, int], Any],
) -> tuple[str, int] | None:
    """The ``(id, step)`` of the call ``result`` answers among ``calls`` and not yet in
    ``answered``: the call of its id and step, else the first of its id; ``None`` when
    there is none (an orphan or a second result)."""
    key = (result.tool_call_id, result.step)
    if key in calls:
        return None if key in answered else key
    for candidate in calls:
        if candidate[0] == result.tool_call_id and candidate not in answered:
            return candidate
    return None


def split_steps(
    assistant: AssistantMessage, results: Sequence[ToolMessage]
) -> list[tuple[list[Part], list[ToolMessage]]]:
    """One ``(parts, tool results)`` pair per step, in step order: exactly what the model
    saw on each call. Results are placed with the step of their call, in call order."""
    steps: dict[int, list[Part]] = {}
    for part in assistant.content:
        steps.setdefault(part.step, []).append(part)
    calls = {(p.tool_call_id, p.step): p for p in assistant.content if isinstance(p, ToolCallPart)}
    by_call: dict[tuple[str, int], ToolMessage] = {}
    for r in results:
        key = _call_of(r, calls, by_call)
        if key is not None:
            by_call[key] = r
    out: list[tuple[list[Part], list[ToolMessage]]] = []
    for step in sorted(steps):
        parts = steps[step]
        step_results = [
            by_call[(p.tool_call_id, p.step)]
            for p in parts
            if isinstance(p, ToolCallPart) and (p.tool_call_id, p.step) in by_call
        ]
        out.append((parts, step_results))
    return out


def iter_turns(messages: Sequence[Message]) -> Iterator[tuple[str, Any, list[ToolMessage]]]:
    """Yield each message, except that an assistant message comes with its tool results:
    ``("message", msg, [])`` or ``("assistant", assistant, [tool results])`` (typed
    ``Any``: which message class it is follows from the first element).

    An assistant message with a call a person approved with edits comes as the model
    sent it (:func:`replay_edits`): every provider maps its request from here."""
    i, n = 0, len(messages)
    while i < n:
        msg = messages[i]
        if isinstance(msg, AssistantMessage):
            j = i + 1
            results: list[ToolMessage] = []
            while j < n and isinstance(messages[j], ToolMessage):
                results.append(messages[j])  # type: ignore[arg-type]
                j += 1
            if results:
                for part in msg.content:
                    if (
                        part.__class__ is ToolCallPart
                        and part.awaiting is not None
                        and part.awaiting.edit_in_result
                    ):
                        msg, results = replay_edits(msg, results)
                        break
            yield ("assistant", msg, results)
            i = j
        else:
            yield ("message", msg, [])
            i += 1


EDIT_NOTE = (
    "[A person reviewing this call approved it with the input changed to {input}; the "
    "call ran with that input instead of the one above, and this is its result.]"
)
"""What the model is told, at the head of an edited call's result (:func:`replay_edits`),
when the tool ran with the edit (its output, or its own error: it raised, timed out), or
when the result does not say (:attr:`~runtime.messages.ToolMessage.ran` ``None``, not
:attr:`~runtime.messages.ToolMessage.ran_unknown`: a result stored before either was
recorded, whose replay must stay what it was)."""

EDIT_MAYBE_NOTE = (
    "[A person reviewing this call approved it with the input changed to {input}; the "
    "call may have run with that input, not the one above; this is its result.]"
)
"""What the model is told instead of :data:`EDIT_NOTE` when whether the edited call ran
is not known (:attr:`~runtime.messages.ToolMessage.ran_unknown`): cut short
(``interrupted``: it may have begun) or failed on the runtime's side (``the tool call
failed: ...``). Never longer than :data:`EDIT_NOTE`, which the token estimate counts."""

EDIT_NOT_RUN_NOTE = (
    "[A person reviewing this call approved it with the input changed to {input}, but the "
    "call did not run, with that input or the one above; this says why.]"
)
"""What the model is told instead of :data:`EDIT_NOTE` when the edited call was not run
(:attr:`~runtime.messages.ToolMessage.ran` ``False``): its tool gone at the
continuation, the edit refused by the tool where it ran (a redeploy changed its
arguments), an agent used as a tool ended before it (``NESTED_WAIT``). Never longer than
:data:`EDIT_NOTE`, which the token estimate counts (``compaction._edit_replay_tokens``)."""


def replay_edits(
    msg: AssistantMessage, results: list[ToolMessage]
) -> tuple[AssistantMessage, list[ToolMessage]]:
    """``msg`` and its ``results`` as the model is replayed them when a person approved a
    call with edits (docs/approval.md, "Approving with edits"): the call with the
    model's own input (:attr:`~runtime.messages.Awaiting.original_input`) and its result
    headed by :data:`EDIT_NOTE`, which gives the input the call ran with (or by
    :data:`EDIT_NOT_RUN_NOTE`, a result recorded as not run: the edit was approved, the
    call never ran with it).

    Why not replay the edited input: the providers that sign reasoning ask for each
    assistant turn back exactly as it was returned and for every change to go at the
    end (Anthropic's preserved thinking: a thinking block is checked against everything
    before it, and the signed turn is to be echoed unchanged; OpenAI's encrypted
    reasoning and Gemini's thought signatures are opaque, their rules silent on an
    edited call after them). The call as the model made it plus a note in its result
    is append-only on every provider, so one rule holds whichever provider (or
    fallback) reads the history, on every request alike: a replay that changed with the
    request would itself change the prefix later thinking was signed over. The stored
    message is not touched: the edit stays the call's input there."""
    edits: dict[tuple[str, int], Any] = {}
    calls: set[tuple[str, int]] = set()
    content: list[Part] = []
    for part in msg.content:
        if isinstance(part, ToolCallPart):
            calls.add((part.tool_call_id, part.step))
            wait = part.awaiting
            if wait is not None and wait.edit_in_result and wait.original_input is not None:
                edits[(part.tool_call_id, part.step)] = part.input
                part = attrs.evolve(part, input=wait.original_input)
        content.append(part)
    by_id = {call_id: edit for (call_id, _), edit in reversed(edits.items())}
    out = []
    for r in results:  # paired as split_steps pairs them: by id and step, else by id
        key = (r.tool_call_id, r.step)
        edit = edits.get(key, _NO_EDIT) if key in calls else by_id.get(key[0], _NO_EDIT)
        out.append(r if edit is _NO_EDIT else _noted(r, edit))
    return attrs.evolve(msg, content=tuple(content)), out


_NO_EDIT = object()


def _noted(result: ToolMessage, edited: Any) -> ToolMessage:
    """``result`` headed by :data:`EDIT_NOTE` (:data:`EDIT_NOT_RUN_NOTE` when it was not
    run, :data:`EDIT_MAYBE_NOTE` when that is not known) for the ``edited`` input: before the
    error, the text, the JSON (as the providers write a structured output), or as a
    first text part of media parts."""
    if result.ran is False:
        told = EDIT_NOT_RUN_NOTE
    else:
        told = EDIT_MAYBE_NOTE if result.ran_unknown else EDIT_NOTE
    note = told.format(input=json.dumps(edited, ensure_ascii=False, default=str))
    if result.error is not None:
        return attrs.evolve(result, error=f"{note}\n\n{result.error}")
    output = result.output
    if is_media_output(output):
        return attrs.evolve(result, output=(TextPart(text=note, step=0), *output))
    if not isinstance(output, str):
        output = json.dumps(output, ensure_ascii=False, default=str)
    return attrs.evolve(result, output=f"{note}\n\n{output}" if output.strip() else note)


class RepairedHistory:
    """:func:`repair` for a history that grows at its end, each message repaired once.

    The turn runner repairs the history before every model call; repairing all of a long
    session each time would cost more than the rest of the turn. :func:`repair` works on
    groups (an assistant message and the tool results after it) that never span a user or
    system message, so the repair of the history up to the last such message is kept and
    reused while those messages are still the same objects (messages are immutable);
    only what follows is repaired again. A history changed anywhere in the kept part is
    repaired whole.

    The same objects, not equal ones: a message replaced by one that compares equal but
    holds values of other types (a tool's output ``1`` made ``True`` or ``1.0``) is sent
    differently. The kept part is compared by identity where an edit of the runner's
    :class:`~runtime.actor_messages.History` may have changed it (its
    :class:`~runtime.actor_messages.Watermark` says so), or for any other list (a tuple,
    a plug-in's plain list); else by value, in C (what list's own methods, which the
    History does not note, may have changed). A history of equal copies (a session
    reloaded from the store) is repaired whole once; the copies are kept from then on.
    """

    __slots__ = ("_added", "_kept", "_repaired", "_tail", "_watched")

    FOLD = 256
    """Repaired messages held apart from the repaired head (what the turns since it was
    last rebuilt added) before they join it: a turn's call copies the head once, for the
    answer, not a second time to extend it (one copy of the head per ~``FOLD`` messages
    added instead)."""

    def __init__(self) -> None:
        self._kept: list[Message] = []
        self._repaired: tuple[Message, ...] = ()
        self._added: list[Message] = []
        """The repair of the kept messages after those :attr:`_repaired` holds."""
        self._watched: tuple[Sequence[Message], Any] | None = None
        """The history last repaired and its watermark, when it keeps one (a
        :class:`~runtime.actor_messages.History`): lowered by an edit of a position."""
        self._tail: _TailRepair | None = None
        """The repair of the history's tail as of the last call."""

    def rest(self) -> None:
        """Drop the repair of the turn in flight (:class:`_TailRepair`): its turn ended,
        or none has begun (a primed history). The next turn's tail starts at its own user
        message and is built then; kept, every open session at rest held one, its lists
        and set (10,000 idle sessions: 4.17 -> 5.05 KB each, issue 24 goal 5)."""
        self._tail = None

    def __call__(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """The repaired ``messages``: always equal to ``tuple(repair(messages))``, and
        holding ``messages``' own objects where :func:`repair` keeps them.

        Called before every model call, so its passes over the whole history are a cost
        every step pays per message of the session: one copy and one comparison of the
        kept part, and the answer itself (the kept part grows by what was added since,
        not by a copy of all of it; seven passes before). After an edit below the kept
        part's end, or for a list that keeps no watermark, a comparison by identity
        takes the place of the copy and the comparison. The part from the last user or
        system message on (the turn in flight) is repaired by :class:`_TailRepair`, in
        what each step added: a turn of many steps walked all of it in Python per call."""
        tail = self._tail
        boundary = tail.boundary(messages) if tail is not None else None
        if boundary is None:
            boundary = len(messages)
            while boundary > 0 and not isinstance(
                messages[boundary - 1], UserMessage | SystemMessage
            ):
                boundary -= 1
            boundary = max(0, boundary - 1)  # the last user/system message starts the tail
            tail = None
        kept = self._kept
        n = len(kept)
        watched = self._watched
        mark = watched[1] if watched is not None and watched[0] is messages else None
        if n <= boundary and (n == 0 or isinstance(messages[n], UserMessage | SystemMessage)):
            if mark is not None and mark.low >= n:  # no edit of a position below n since
                head = messages[:n]
                same = head == kept  # in C (the same object compares equal): what list's
                # own methods called on the History changed (it cannot note those)
            else:  # (in C, one call per message; no copy, and it stops at a difference)
                same = all(map(operator.is_, messages, kept))
        else:
            same = False
        if same:
            if n < boundary:  # a turn was added since: repair just that
                added = messages[n:boundary]
                kept.extend(added)
                self._added += repair(added)
                if len(self._added) > self.FOLD:
                    self._repaired += tuple(self._added)
                    self._added = []
        else:
            self._kept = list(messages[:boundary])
            self._repaired, self._added = tuple(repair(self._kept)), []
        if mark is not None:
            mark.settle()
        elif (watch := getattr(messages, "watch", None)) is not None:
            self._watched = (messages, watch())  # another history: watched from now on
        elif watched is not None:  # the kept part is another list's: if the history
            watched[1].low = 0  # watched comes back, it is compared by identity
        if tail is None:
            tail = self._tail = _TailRepair(messages, boundary)
        return self._repaired + tuple(self._added + tail.repaired())


class _TailRepair:
    """:func:`repair` of a history's tail (from its last user or system message on) as a
    turn grows it: each step replaces the turn's assistant message by one holding the
    same parts and the step's own after them, and appends the step's tool results. What
    a call adds is walked (its parts and messages); what was there is checked to be the
    same objects, in C (``operator.is_``), never walked again in Python. Anything else
    (a part replaced, a message edited, a call whose id an unmatched result carries) and
    the tail is repaired anew, by the same rules.

    The group of the last assistant message (its parts, calls and results so far) is
    kept open; an assistant message after it closes it (its tool results end there)."""

    __slots__ = (
        "_blanks",
        "_calls",
        "_closed",
        "_index",
        "_irregular",
        "_open",
        "_open_at",
        "_parts",
        "_pending",
        "_results",
        "_seen",
        "_slots",
        "start",
        "walked",
    )

    def __init__(self, messages: Sequence[Message], start: int) -> None:
        self.start = start
        """Where the tail starts in the history."""
        self.walked = 0
        """Messages and parts walked in Python, in all (a count for tests and benchmarks)."""
        self._reset()
        self._feed(messages[start:])

    def _reset(self) -> None:
        self._seen: list[Message] = []
        """The tail's messages as of the last call, by position from :attr:`start`."""
        self._closed: list[Message] = []
        """The repair of the messages before the open group's assistant message."""
        self._open: AssistantMessage | None = None
        self._open_at = -1
        self._parts: list[Part] = []
        """The open assistant message's parts, blank text parts left out."""
        self._blanks = 0
        self._calls: dict[tuple[str, int], ToolCallPart] = {}
        self._index: dict[tuple[str, int], int] = {}
        self._results: dict[tuple[str, int], ToolMessage] = {}
        self._slots: list[ToolMessage | None] = []
        """The open group's results in call order; ``None`` for a call unanswered."""
        self._pending: dict[tuple[str, int], int] = {}
        self._irregular: set[str] = set()
        """Ids of results that did not answer the call of their own id and step (dropped,
        or taken by the first unanswered call of their id): a call of such an id added
        later might have changed what they answered, so the group is walked anew."""

    def boundary(self, messages: Sequence[Message]) -> int | None:
        """Where ``messages``' tail starts, and this brought up to date with it, when it
        is this tail grown; else ``None`` (the caller finds the tail and makes a new
        one). Checks the messages it saw by identity, in C; walks only those added."""
        start, seen = self.start, self._seen
        k = len(seen)
        if len(messages) < start + k or k == 0:
            return None
        added = messages[start + k :]
        if any(isinstance(m, UserMessage | SystemMessage) for m in added):
            return None  # a turn began: the tail starts at its message
        now = messages[start : start + k]
        at = self._open_at
        if at < 0:
            if not all(map(_same, now, seen)):
                return None
        else:
            if not (
                all(map(_same, now[:at], seen[:at]))
                and all(map(_same, now[at + 1 :], seen[at + 1 :]))
            ):
                return None
            assistant = now[at]
            if assistant is not seen[at]:
                if not self._extend(assistant):
                    self._rebuild(messages)
                    return self.start
        self._feed(added)
        return start

    def _extend(self, assistant: Any) -> bool:
        """Take the open assistant message replaced by ``assistant``: whether it holds
        the parts the open one held (the same objects) and then its own, taken here."""
        old = self._open
        assert old is not None
        if not isinstance(assistant, AssistantMessage):
            return False
        content, before = assistant.content, old.content
        if len(content) < len(before) or not all(map(_same, content, before)):
            return False
        new = content[len(before) :]
        if any(isinstance(p, ToolCallPart) and p.tool_call_id in self._irregular for p in new):
            return False
        self._seen[self._open_at] = assistant
        self._open = assistant
        self._take_parts(new)
        return True

    def _rebuild(self, messages: Sequence[Message]) -> None:
        tail = messages[self.start :]
        self._reset()
        self._feed(tail)

    def _take_parts(self, parts: Sequence[Part]) -> None:
        self.walked += len(parts)
        for p in parts:
            if isinstance(p, TextPart) and not p.text.strip():
                self._blanks += 1
                continue
            self._parts.append(p)
            if isinstance(p, ToolCallPart):
                key = (p.tool_call_id, p.step)
                if key not in self._calls:
                    self._index[key] = len(self._slots)
                    self._slots.append(None)
                    self._pending[key] = self._index[key]
                self._calls[key] = p  # (a second call of one id and step: the last part,
                # in the first one's place, as repair's dict)

    def _close(self) -> None:
        """End the open group: its repair joins :attr:`_closed`."""
        if self._open is not None:
            self._closed += self._group()
        self._open = None
        self._open_at = -1
        self._parts, self._blanks = [], 0
        self._calls, self._index, self._results = {}, {}, {}
        self._slots, self._pending, self._irregular = [], {}, set()

    def _feed(self, messages: Sequence[Message]) -> None:
        self.walked += len(messages)
        for m in messages:
            self._seen.append(m)
            if isinstance(m, ToolMessage):
                if self._open is None:
                    continue  # an orphan: no assistant message claimed it
                key = _call_of(m, self._calls, self._results)
                if key != (m.tool_call_id, m.step):
                    self._irregular.add(m.tool_call_id)
                if key is not None:
                    self._results[key] = m
                    self._slots[self._index[key]] = m
                    self._pending.pop(key, None)
            elif isinstance(m, AssistantMessage):
                self._close()
                self._open, self._open_at = m, len(self._seen) - 1
                self._take_parts(m.content)
            else:
                if self._open is not None:
                    self._close()
                self._closed.append(m)

    def _group(self) -> list[Message]:
        """The open group's repair: its assistant message and a result for each call."""
        msg = self._open
        assert msg is not None
        out: list[Message] = [
            msg if not self._blanks else attrs.evolve(msg, content=tuple(self._parts))
        ]
        slots: list[Any] = self._slots.copy()
        for key, i in self._pending.items():
            call = self._calls[key]
            slots[i] = ToolMessage(
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                step=call.step,
                error=INTERRUPTED,
            )
        out += slots
        return out

    def repaired(self) -> list[Message]:
        """The repair of the tail as it stands."""
        if self._open is None:
            return self._closed.copy()
        return self._closed + self._group()


class MessageIds:
    """Whether a history holds a message of a given id, for a history that grows at its
    end: the ids are kept, each message's read once, so a question costs a look-up and
    the messages added since the last one, not a pass over the session.

    A turn asks it of the client's id of its user message (a resend that no resend rule
    caught stores none twice) and of each message steered into it; a pass over the
    history per question made a turn's cost grow with its session. The runner's
    :class:`~runtime.actor_messages.History` says, through its
    :class:`~runtime.actor_messages.Watermark`, the lowest position an edit changed: the
    ids from there on are read again (all of them after a reload, or for a list that
    keeps no watermark). An edit by list's own methods, which the History does not note,
    is seen when it changed the length or the kept part's last id (as the runner's
    snapshot sees it)."""

    __slots__ = ("_counts", "_ids", "_watched", "read")

    chunk = 4096
    """The most messages :meth:`read_some` reads in one call: :meth:`caught_up` yields
    between calls, so a first read of a long session (600,000 messages) is many short
    loop steps, not one stall of every session of the process."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        """The ids of the messages read, by position."""
        self._counts: dict[str, int] = {}
        """How many of them hold each id."""
        self._watched: tuple[Sequence[Message], Any] | None = None
        """The history last read and its watermark, when it keeps one."""
        self.read = 0
        """Messages whose id was read, in all (a count for tests and benchmarks)."""

    def holds(self, messages: Sequence[Message], message_id: str) -> bool:
        """Whether a message of ``messages`` has the id ``message_id``."""
        self._catch_up(messages)
        return message_id in self._counts

    def first(self, messages: Sequence[Message], message_id: str) -> int:
        """The position of the first message of ``messages`` with id ``message_id``, -1
        if none (a look-up when none has it; else a search of the kept ids, in C)."""
        self._catch_up(messages)
        return self._ids.index(message_id) if message_id in self._counts else -1

    def read_some(self, messages: Sequence[Message]) -> bool:
        """Read at most :attr:`chunk` more of ``messages``' ids; whether they are all read
        now (:meth:`holds` then reads only what is added or edited after this)."""
        return self._catch_up(messages, self.chunk)

    async def caught_up(self, messages: Callable[[], Sequence[Message]]) -> None:
        """Read the ids of the history ``messages()`` returns (asked again after each
        yield: a reload may replace it), :attr:`chunk` at a time with a schedule point
        between: none when one chunk reads them all (the common case, a few messages
        added since the last turn), so a caught-up reader's caller never yields here."""
        while not self.read_some(messages()):
            await trio.lowlevel.checkpoint()

    def _catch_up(self, messages: Sequence[Message], most: int | None = None) -> bool:
        ids, counts = self._ids, self._counts
        watched = self._watched
        mark = watched[1] if watched is not None and watched[0] is messages else None
        keep = 0 if mark is None else min(mark.low, len(ids), len(messages))
        if keep and messages[keep - 1].id != ids[keep - 1]:
            keep = 0  # (list's own methods changed it: read again)
        for gone in ids[keep:]:
            left = counts[gone] - 1
            if left:
                counts[gone] = left
            else:
                del counts[gone]
        del ids[keep:]
        if mark is None and not hasattr(messages, "watch"):
            most = None  # (nothing says what a partial read of it still holds: all now)
        end = len(messages) if most is None else min(len(messages), keep + most)
        for message in messages[keep:end] if keep or end < len(messages) else messages:
            message_id = message.id
            ids.append(message_id)
            counts[message_id] = counts.get(message_id, 0) + 1
        self.read += len(ids) - keep
        # (the mark is settled at a partial read too: ``keep`` is never past ``ids``,
        # so the part not read yet is read next, and an edit from here on lowers it)
        if mark is not None:
            mark.settle()
        elif (watch := getattr(messages, "watch", None)) is not None:
            self._watched = (messages, watch())
        else:
            self._watched = None
        return end == len(messages)


# -- where reasoning may be replayed ------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True)
class Origin:
    """Who produced a reasoning or provider-data part, and who a request goes to.

    A thinking signature is bound to the model that made it, and signed or encrypted
    reasoning to the endpoint (an OpenAI organization, a compatible server) that issued
    it: sent anywhere else it is a 400 (``invalid_encrypted_content``, "Invalid signature
    in thinking block"). Parts record their origin; a provider sends one back only when it
    :func:`replays_to` the provider's own origin."""

    __repr__ = _repr

    provider: str
    """The provider tag (``"anthropic"``, ``"openai"``, ``"openai-responses"``)."""
    model: str | None = None
    """``None``: any model (a part stored before models were recorded, or a caller of a
    ``map_messages`` that named no model)."""
    endpoint: str | None = None
    """The normalised endpoint (:func:`endpoint_of`); ``None``: any."""


_DEFAULT_PORTS = {"http": 80, "https": 443}


@functools.lru_cache(maxsize=64)  # a provider asks once per model call, for the same few URLs
def endpoint_of(url: str) -> str:
    """``url`` normalised to what identifies a server: scheme, host, port and path.

    Credentials, query and fragment are dropped (an endpoint is stored with every part,
    and a key in a URL must not be); scheme and host are lower-cased, a default port is
    left out and a trailing ``/`` removed, so ``https://API.openai.com:443/v1/`` and
    ``https://api.openai.com/v1`` are the same endpoint."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None or _DEFAULT_PORTS.get(scheme) == port else f"{host}:{port}"
    path = parts.path.rstrip("/")
    return f"{scheme}://{netloc}{path}" if scheme else f"{netloc}{path}"


def replays_to(part: ReasoningPart | ProviderDataPart, origin: Origin) -> bool:
    """Whether ``part`` may be sent back to a provider whose own origin is ``origin``.

    The provider tags must be equal; the model and the endpoint must be equal where both
    are known. A part stored before models and endpoints were recorded (``None``) matches
    its provider alone, as it always did: sessions that never changed model keep their
    reasoning, and only one that changed it across the upgrade can meet the old 400."""
    if part.provider != origin.provider:
        return False
    if part.model is not None and origin.model is not None and part.model != origin.model:
        return False
    return not (
        part.endpoint is not None
        and origin.endpoint is not None
        and part.endpoint != origin.endpoint
    )


def as_text(part: ReasoningPart) -> str | None:
    """Foreign reasoning as plain text (``foreign_reasoning="text"``): its summary in
    ``<think>`` tags, which the engine's default tag split reads back as reasoning if a
    model repeats them; ``None`` when there is no text (redacted or encrypted only)."""
    return f"<think>{part.text}</think>" if part.text.strip() else None
