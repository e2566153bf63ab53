"""The chunks a provider parses from one network read, sent downstream together.

Why: a provider that awaits ``emit`` once per delta pays a coroutine call and a
:class:`~runtime.inbox.Batcher` append per token, on top of the parse; on a
stream of word-sized deltas that was a good part of what the whole turn added to the
floor (bare httpx + orjson, issue 24). The OpenAI and Anthropic providers read their
body a network read at a time (:func:`~actors.providers.sse.sse_batches`), so they
collect a read's chunks here and send them in one call
(:func:`runtime.provider.emit_all`).

Latency stays what it was: the stream's first text delta is sent alone, at once (the
provider's batcher then yields so that it reaches the consumer before parsing goes on),
and a read's chunks go as soon as the read is parsed, or every
:data:`~runtime.actor_messages.MAX_BATCH` chunks of a very large read. A chunk of
another kind than text (a tool call's start, a finish) is added in its place, so the
order is the stream's.

After a full batch (:data:`~runtime.actor_messages.MAX_BATCH` chunks) the provider
yields once before it parses on. Why: each actor after it (engine, turn runner, stream
controller, consumer) takes one batch per scheduler round, while a provider that parsed
a whole read (70-150 deltas) sent two or three; the batches of a fast stream then piled
up before the engine, about 850 chunks in flight at each young collection, which lived
into the collector's oldest generation and died there: full collections of the whole
heap, 15-25 % of a 10,000-delta turn's CPU (issue 24). Yielding per full batch keeps
about one batch per stage in flight: 0.2-0.35 ms of collection in such a turn instead of
5.5-11.6. The first delta still goes alone, at once.

With ``coalesce`` (:attr:`runtime.provider.Provider.coalesce_deltas`), consecutive text
deltas of one read join into one :class:`~runtime.chunks.TextChunk`: the same text, the
same part boundaries (any other chunk, or :meth:`ReadBatch.end_run` where the provider
sees a new part, ends the run), fewer and longer deltas.

With ``runs`` (a request's :attr:`~runtime.provider.InferRequest.text_runs`: the turn
runner's), a run of text deltas read through a slot (:meth:`ReadBatch.texts`) goes as
one :class:`~runtime.provider.TextRun` instead of a ``TextChunk`` each: the same deltas,
each still its own ``text-delta`` chunk in the stream, without an object per delta in the
stages before the stream controller (issue 24 goal 1). A full batch counts the run's
deltas, not the run: a batch with runs is full at :data:`~runtime.inbox.MAX_RUN`
deltas (or :data:`~runtime.actor_messages.MAX_BATCH` items), and the yield after a full
batch is then one per up to 512 deltas, not 128: the deltas in flight are strings until
the stream controller builds their chunks, which it does 128 at a time with a yield
between (issue 24 goal 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from runtime.actor_messages import MAX_BATCH, MAX_RUN
from runtime.chunks import TextChunk
from runtime.fastbuild import slot_builder
from runtime.provider import Emit, TextRun, emit_all

_TEXT = slot_builder(TextChunk, ("text", "refusal"))
"""``TextChunk(text=..., refusal=...)`` built through its slots (:mod:`runtime.fastbuild`):
one per delta of the stream, for half of what ``__init__`` costs."""


class ReadBatch:
    """Chunks of the current read, waiting to be sent; :attr:`urgent` says "flush now"."""

    __slots__ = (
        "_coalesce",
        "_emit",
        "_extra",
        "_first",
        "_most",
        "_run",
        "_runs",
        "out",
        "urgent",
    )

    def __init__(self, emit: Emit, *, coalesce: bool = False, runs: bool = False) -> None:
        self._emit = emit
        self._coalesce = coalesce
        self._runs = runs
        self._most = MAX_RUN if runs else MAX_BATCH
        """The deltas of a full batch (:data:`~runtime.inbox.MAX_RUN` with runs)."""
        self._first = True
        self._run: list[str] = []
        self.out: list[Any] = []
        self._extra = 0
        """The deltas of :attr:`out`'s text runs beyond one a run: ``len(out)`` plus this
        is what a full batch counts."""
        self.urgent = False
        """Set when the chunks should go before parsing goes on: the stream's first text
        delta, or a full batch."""

    def text(self, text: str) -> None:
        """A text delta (not a refusal) of the part the run belongs to."""
        if self._first:
            self._first = False
            self.out.append(TextChunk(text=text))
            self.urgent = True
        elif self._coalesce:
            self._run.append(text)
        else:
            out = self.out
            out.append(_TEXT(text, False))
            if self._full():
                self.urgent = True

    async def text_list(self, texts: Sequence[str]) -> None:
        """:meth:`text` for each of ``texts`` (an empty one skipped), flushing whenever
        the batch becomes :attr:`urgent`. Why: a read's text deltas read through a slot
        (:mod:`~actors.providers.json_slot`) come as a list of their texts, and one call
        for the list instead of one per delta spares a call and its attribute loads per
        delta (issue 24). The same chunks, sent at the same points, as :meth:`text`."""
        i, n = 0, len(texts)
        while i < n:
            i = self.texts(texts, i)
            if self.urgent:
                await self.flush()

    def texts(self, texts: Sequence[str], i: int) -> int:
        """:meth:`text` for each of ``texts`` from index ``i`` on (an empty one skipped),
        up to the one that makes the batch :attr:`urgent`; returns the index after the
        last one read."""
        n = len(texts)
        if self._first or self._coalesce:  # the stream's first delta, or joined runs
            while i < n:
                text = texts[i]
                i += 1
                if text:
                    self.text(text)
                    if self.urgent:
                        break
            return i
        room = self._most - len(self.out) - self._extra
        j = n
        if n - i >= room:
            j = i + room
            self.urgent = True
        if self._runs:
            run = list(filter(None, texts[i:j]))
            if run:
                self.out.append(TextRun(texts=run))
                self._extra += len(run) - 1
                if len(self.out) >= MAX_BATCH:
                    self.urgent = True
        else:
            build = _TEXT
            self.out += [build(text, False) for text in texts[i:j] if text]
        return j

    def add(self, chunk: Any) -> None:
        """Any other chunk: it ends the text run and takes its place in the order."""
        self.end_run()
        self.out.append(chunk)
        if self._full():
            self.urgent = True

    def _full(self) -> bool:
        """Whether :attr:`out` is a full batch: :data:`~runtime.actor_messages.MAX_BATCH`
        items, or as many deltas as a batch takes (:attr:`_most`, its runs' deltas each
        counted)."""
        size = len(self.out)
        return size >= MAX_BATCH or size + self._extra >= self._most

    def end_run(self) -> None:
        """The text run so far becomes one chunk (the next text starts a new one)."""
        run = self._run
        if run:
            self.out.append(TextChunk(text=run[0] if len(run) == 1 else "".join(run)))
            self._run = []

    async def flush(self) -> None:
        """Send what is waiting, in order."""
        self.end_run()
        out = self.out
        self.urgent = False
        if out:
            full, extra = self._full(), self._extra
            self.out, self._extra = [], 0
            send_all = getattr(self._emit, "send_all", None) if extra else None
            if send_all is not None:  # runs: batches of their own (Batcher.send_all)
                await send_all(out, whole=True)
            else:
                await emit_all(self._emit, out)
            if full:
                # A full batch: the actors after the provider get their turn before it
                # parses on (see the module).
                await trio.lowlevel.checkpoint()


__all__ = ["ReadBatch"]
