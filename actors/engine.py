"""The engine: normalizes a provider's chunks and splits reasoning written inside text.

Open models often write their reasoning into the answer text between tags
(``<think>…</think>``). :class:`ThinkTagSplitter` turns such text into text and reasoning
chunks, correctly when a tag is cut across chunks at any character: it holds back only
the longest suffix that could still be the start of a tag, and releases it as soon as
it cannot. The :class:`Engine` actor runs one splitter per model call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from runtime.actor import Actor
from runtime.actor_messages import Batch, Batcher, BeginRequest, StreamFailed
from runtime.agent import DEFAULT_THINK_TAGS
from runtime.chunks import FinishChunk, ReasoningChunk, TextChunk
from runtime.errors import ActorFailed, describe_exception
from runtime.inbox import Inbox
from runtime.provider import TextRun


class ThinkTagSplitter:
    """Partition streamed text into ``(is_reasoning, text)`` pieces.

    ``feed`` returns the pieces that are certain; ``flush`` (at the end of the text)
    releases what was held back. An unclosed reasoning block ends at the end of the
    text. Empty pieces are never returned, so ``<think></think>`` yields nothing.
    """

    __slots__ = ("_buf", "_close", "_first", "_first_chars", "_inside", "_tags")

    def __init__(self, tags: Sequence[tuple[str, str]] = DEFAULT_THINK_TAGS) -> None:
        if not tags or any(not o or not c for o, c in tags):
            raise ValueError("think tags need a non-empty open and close string")
        self._tags = tuple(tags)
        self._first_chars = frozenset(o[0] for o, _ in self._tags)
        self._first = next(iter(self._first_chars)) if len(self._first_chars) == 1 else None
        """The one character every open tag begins with (``<``), if they share it."""
        self._inside = False
        self._close = ""
        self._buf = ""

    @property
    def inside(self) -> bool:
        """Whether the text is currently inside a reasoning block."""
        return self._inside

    @property
    def holding(self) -> bool:
        """Whether text is held back or a reasoning block is open."""
        return self._inside or bool(self._buf)

    def feed(self, text: str) -> list[tuple[bool, str]]:
        s = self._buf + text if self._buf else text
        self._buf = ""
        out: list[tuple[bool, str]] = []
        while s:
            if not self._inside:
                # Fast path: no character that can begin a tag -> all of it is text.
                first = self._first
                if first is not None:
                    plain = first not in s
                else:
                    plain = not any(c in s for c in self._first_chars)
                if plain:
                    out.append((False, s))
                    return out
                best = -1
                best_tag: tuple[str, str] | None = None
                for open_, close in self._tags:
                    i = s.find(open_)
                    if i != -1 and (best == -1 or i < best):
                        best, best_tag = i, (open_, close)
                if best_tag is not None:
                    if best:
                        out.append((False, s[:best]))
                    self._inside, self._close = True, best_tag[1]
                    s = s[best + len(best_tag[0]) :]
                    continue
                hold = _held_suffix(s, [o for o, _ in self._tags])
            else:
                i = s.find(self._close)
                if i != -1:
                    if i:
                        out.append((True, s[:i]))
                    self._inside = False
                    s = s[i + len(self._close) :]
                    continue
                hold = _held_suffix(s, [self._close])
            if hold:
                self._buf = s[-hold:]
                s = s[:-hold]
            if s:
                out.append((self._inside, s))
            break
        return out

    def flush(self) -> list[tuple[bool, str]]:
        """Release the held-back text (as what it is inside of) and reset."""
        buf, inside = self._buf, self._inside
        self._buf, self._inside, self._close = "", False, ""
        return [(inside, buf)] if buf else []


def _held_suffix(s: str, tags: list[str]) -> int:
    """Length of the longest suffix of ``s`` that is a proper prefix of some tag."""
    longest = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(s)), longest, -1):
            if s.endswith(tag[:k]):
                longest = k
                break
    return longest


class Engine(Actor):
    """Per-session actor between the provider and the turn runner.

    Receives the provider's chunk batches (and :class:`BeginRequest` markers from the
    turn runner), splits tagged reasoning out of text, and forwards the result to the
    turn runner in batches. Chunks of any request other than the current one (a call
    that was cancelled) are dropped.
    """

    inbox_capacity = 128  # batches of up to MAX_RUN deltas (runtime.inbox)

    def __init__(
        self,
        output: Inbox,
        *,
        tags: Sequence[tuple[str, str]] | None = DEFAULT_THINK_TAGS,
        session_id: str | None = None,
    ) -> None:
        super().__init__(name="engine", session_id=session_id)
        self.output = output
        self.tags = tuple(tags) if tags else ()
        self._splitter: ThinkTagSplitter | None = None
        self._out: Batcher | None = None
        self._current: str | None = None
        self._scope: trio.CancelScope | None = None  # the current call's

    def on_crash(self, exc: BaseException) -> None:
        """The call in flight fails, and its later chunks are dropped: the batch the
        crash took is lost, so the turn runner, waiting for the call's end, would wait
        for ever (the restarted engine has no splitter or batcher for it either)."""
        self._fail_call(exc)

    def on_give_up(self, exc: BaseException) -> None:
        """The call in flight fails, as after a crash, even when :meth:`on_crash` itself
        raised (a bug of ours or of a subclass's: the runner waited for the call's end
        for ever); nothing twice when it had answered. What is queued is dropped: nobody
        reads this inbox any more (the session's next turn gets a fresh engine,
        :meth:`~runtime.app.host.Host._renew_given_up`)."""
        self._fail_call(exc)
        self.inbox.drain_nowait([])

    def _fail_call(self, exc: BaseException) -> None:
        """Fail the call in flight, once (it is forgotten here): a :class:`StreamFailed`
        saying the engine crashed, to the runner."""
        current = self._current
        self._splitter = self._out = self._current = self._scope = None
        if current is None:
            return
        why = describe_exception(exc)
        error = ActorFailed(f"the engine crashed on the model's output: {why}")
        failure = StreamFailed(error=error)
        batch: Batch[Any] = Batch(current)
        batch.append(failure)
        try:
            self.output.put_nowait(batch)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the runner is gone or cannot take it: its own deadline or close ends it

    def forget_call(self, request_id: str) -> None:
        """The runner is done with call ``request_id`` (cancelled, or over): nothing more
        of it is forwarded, and what was forwarded last is let go (the batcher held the
        batch the runner discarded unread, until this session's next call or rest)."""
        if self._current == request_id:
            self._splitter = self._out = self._current = self._scope = None

    def on_rest(self) -> None:
        """The session is idle: its last request is over, a late chunk of it is dropped
        (a full garbage collection walks every idle session's engine)."""
        self._splitter = self._out = self._current = self._scope = None

    async def handle(self, message: Any) -> None:
        if isinstance(message, BeginRequest):
            self._current = message.request_id
            self._scope = message.cancel_scope
            self._splitter = ThinkTagSplitter(self.tags) if self.tags else None
            self._out = Batcher(self.output, message.request_id)
            return
        if not isinstance(message, Batch) or message.tag != self._current:
            return
        message.taken = True
        scope = self._scope
        if scope is not None and scope.cancel_called:
            return  # its requester is done with the call: nobody would read it
        assert self._out is not None
        last = message[-1] if message else None
        if type(last) is FinishChunk and last.reason != "tool-calls":
            # The call ended, and no tool call follows it: most likely the turn's last,
            # so the engine may rest in this step (Actor.rests_after_turn) rather than in
            # one of its own on REST after the turn (issue 24 goal 1). A turn that makes
            # another call after all wakes it first (Inferring._begin, Host.wake_actor).
            self.turn_ended = True
        splitter = self._splitter
        if splitter is None:
            await self._out.send_all(message, whole=any(type(c) is TextRun for c in message))
            return
        out: list[Any] = []
        append = out.append
        first = splitter._first  # the character every open tag begins with, if one
        probe = first or ""  # read only while ``clear``, which needs a ``first``
        # Whether a text without ``first`` goes on as it is: no tag open, none held back.
        # Only feed and flush move the splitter, so it is read again after them only.
        clear = first is not None and not splitter.holding
        runs = False  # ``out`` holds a TextRun: its batches go whole (Batcher.send_all)
        for chunk in message:
            t = type(chunk)
            if t is TextRun:
                # ``first`` is one character: it is in the joined texts iff in one of them
                if clear and probe not in "".join(chunk.texts):
                    append(chunk)  # no tag can begin in it, none is open: as it is
                    runs = True
                    continue
                for text in chunk.texts:  # each delta through the splitter, as a chunk
                    clear = _split(splitter, TextChunk(text=text), append, first)
                continue
            if t is TextChunk and not chunk.refusal:
                if clear and probe not in chunk.text:
                    append(chunk)  # no tag can begin here, none is open: as it is
                    continue
                clear = _split(splitter, chunk, append, first)
                continue
            if isinstance(chunk, FinishChunk | StreamFailed) or splitter.holding:
                # the end, or another kind of chunk, ends the text
                for is_reasoning, text in splitter.flush():
                    append(ReasoningChunk(text=text) if is_reasoning else TextChunk(text=text))
                clear = first is not None
            append(chunk)
        await self._out.send_all(out, whole=runs)


def _split(
    splitter: ThinkTagSplitter, chunk: TextChunk, append: Callable[[Any], None], first: str | None
) -> bool:
    """``chunk`` through the think-tag splitter, its pieces to ``append`` (the chunk as
    it is when nothing was split or held); returns whether the next text without
    ``first`` may go on as it is (no tag open, none held back)."""
    pieces = splitter.feed(chunk.text)
    if len(pieces) == 1 and not pieces[0][0] and pieces[0][1] is chunk.text:
        append(chunk)  # nothing split or held: forward it as it is
    else:
        for is_reasoning, text in pieces:
            append(ReasoningChunk(text=text) if is_reasoning else TextChunk(text=text))
    return first is not None and not splitter.holding
