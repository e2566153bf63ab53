"""The parts manager: where a turn's parts open and close, decided once for both outputs.

A part boundary used to be decided twice, by the turn runner for the stored message and
by the stream controller for the stream, and the two disagreed (text, provider data,
text and a refusal streamed as one text part and were stored as three), so a reloaded
session showed other parts than were streamed. Now the turn runner feeds every content
chunk of a model call, in arrival order, to one :class:`PartsManager`, which decides and
records each decision in both places at once:

* into the list of items forwarded to the stream controller, as :class:`PartBegin` /
  :class:`PartEnd` markers around the chunks (the controller only renders them as
  ``*-start`` / ``*-finish`` chunks and the chunks as deltas of the open part);
* into :attr:`PartsManager.content`, the stored parts of the assistant message.

The rules (the stream shows the text and reasoning parts below exactly as stored):

* text and reasoning are parts; a chunk of the kind that is open extends the open part;
* refusal text is a text part of its own (stored with ``refusal=True``): a change between
  answer text and refusal text closes the part and opens another;
* a reasoning chunk carrying a ``signature`` or ``redacted_data`` ends its block: it
  closes the part (an empty signed block still is a part: its signature must go back);
* a tool call (its input starting, or the complete call), provider data and the end of a
  model call close the open part. A tool call and provider data are parts of their own
  in the message; the stream shows a call by its own chunks and provider data not at
  all (it is opaque, replayed only to its provider);
* an empty text chunk, or an empty reasoning chunk with neither signature nor redacted
  data, opens nothing: a part never holds nothing but empty deltas;
* a :class:`~runtime.chunks.CitationsChunk` (the end of an Anthropic cited text block)
  closes the open text part, stored with its citations (one of no citations: an
  uncited text block that another text block follows); it is not streamed.

Reasoning and provider data tagged with the calling provider's name also record its
model and endpoint (:attr:`PartsManager.origin`, set by the turn runner for each call):
signatures and encrypted reasoning are bound to both, so restoration sends them back
only to the same (:func:`runtime.history.replays_to`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs
import orjson

from runtime.actor_messages import REASONING, TEXT, PartBegin, PartEnd
from runtime.chunks import (
    CitationsChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
)
from runtime.history import Origin
from runtime.ids import new_id, repeated_call_id
from runtime.messages import (
    Part,
    ProviderDataPart,
    ReasoningPart,
    TextPart,
    ToolCallPart,
)
from runtime.provider import TextRun
from runtime.serde import dumps, utf8_text


class PartsManager:
    """Decides the part boundaries of one turn; see the module docstring for the rules.

    Each feeding method takes ``out``, the list of items the turn runner forwards to the
    stream controller, and appends to it the markers and chunks the stream must show, in
    order. Text is accumulated as a list of pieces joined when the part closes, so a
    part of any length costs linear time.
    """

    __slots__ = (
        "_id",
        "_kind",
        "_pieces",
        "_provider",
        "_redacted",
        "_refusal",
        "_signature",
        "call_ids",
        "content",
        "origin",
        "step",
    )

    def __init__(self, content: Sequence[Part] = (), earlier: Iterable[str] = ()) -> None:
        self.content: list[Part] = list(content)
        """The stored parts so far, in stream order (the open part is not among them).
        A turn taken over from another worker starts with the parts of its committed
        steps (see :mod:`actors.turn.takeover`): the new ones follow them. Edited in
        place elsewhere only part for part with the same call id (``mark_held``): parts
        are added and dropped here, so :attr:`call_ids` stays the content's."""
        self.call_ids: set[str] = {p.tool_call_id for p in self.content if type(p) is ToolCallPart}
        """The call ids of :attr:`content`'s calls and ``earlier``'s (those of the turn's
        messages before this one: a message steered in starts another), grown as calls
        are added and shrunk as a failed call's parts are discarded: what
        :class:`CallIds` renames against, so a call id names one call in the turn (its
        results and outcomes are kept by id turn-wide).
        Built from the whole message for each model call, it was a walk of every part
        of the turn per step (500,500 parts in a 1,000-step turn)."""
        self.call_ids.update(earlier)
        self.step = 0
        """The step the parts that open now belong to; the turn runner sets it."""
        self.origin: Origin | None = None
        """The provider of the current call; the turn runner sets it. Parts tagged with
        its name get its model and endpoint; parts of another tag (a scripted provider
        playing another's part) or none stay unrecorded."""
        self._kind: str | None = None
        self._id = ""
        self._pieces: list[str] = []
        self._refusal = False
        self._signature: str | None = None
        self._redacted: str | None = None
        self._provider: str | None = None

    @property
    def open_kind(self) -> str | None:
        """The kind of the open part (``"text"``, ``"reasoning"``), ``None`` if none is."""
        return self._kind

    def text(self, chunk: TextChunk, out: list[Any]) -> None:
        text = chunk.text
        if not text:
            return
        if self._kind is not TEXT or self._refusal != chunk.refusal:
            self._open(TEXT, out)
            self._refusal = chunk.refusal
        self._pieces.append(text)
        out.append(chunk)

    def texts(self, chunks: Sequence[Any], i: int, out: list[Any]) -> int:
        """:meth:`text` for each :class:`TextChunk` of ``chunks`` from index ``i`` on, up
        to the first chunk of another type; returns that chunk's index (``len(chunks)``
        if none). Why: a batch of a model call is mostly a run of text deltas, and one
        call per run instead of one per delta took a fifth of what the turn runner spent
        on a delta (issue 24). The same decisions as :meth:`text`, in the same order."""
        n = len(chunks)
        append = out.append
        pieces = self._pieces
        # The open text part's refusal flag; None: no text part is open.
        open_refusal: bool | None = self._refusal if self._kind is TEXT else None
        while i < n:
            chunk = chunks[i]
            if type(chunk) is not TextChunk:
                return i
            i += 1
            text = chunk.text
            if not text:
                continue
            if chunk.refusal != open_refusal:
                self._open(TEXT, out)
                self._refusal = open_refusal = chunk.refusal
                pieces = self._pieces
            pieces.append(text)
            append(chunk)
        return i

    def cite(self, chunk: CitationsChunk, out: list[Any]) -> None:
        """The citations of the text the open part ends with (sent at the end of a
        provider's cited text block): the part is stored with them and closes, so the
        next text is a part of its own. With no text part open (a cited block of no
        text) there is nothing to cite: they are dropped. The chunk is not forwarded:
        the stream shows the text, not its sources."""
        if self._kind is TEXT:
            self.close(out, chunk.citations or None)  # none: the text block ended uncited

    def text_run(self, run: TextRun, out: list[Any]) -> None:
        """:meth:`text` for each delta of ``run`` (:class:`~runtime.provider.TextRun`: no
        refusal, none empty), in one call: the pieces extended with the run's texts, the
        run forwarded as it is (the stream controller makes each its own delta). The same
        decisions as :meth:`text` per delta: a text part opens unless one that is no
        refusal is open."""
        if self._kind is not TEXT or self._refusal:
            self._open(TEXT, out)
            self._refusal = False
        self._pieces.extend(run.texts)
        out.append(run)

    def reasoning(self, chunk: ReasoningChunk, out: list[Any]) -> None:
        ends = chunk.signature is not None or chunk.redacted_data is not None
        if self._kind is not REASONING:
            if not chunk.text and not ends:
                return  # nothing to show or keep (at most a provider name)
            self._open(REASONING, out)
        if chunk.text:
            self._pieces.append(chunk.text)
            out.append(chunk)
        if chunk.provider is not None:
            self._provider = chunk.provider
        if ends:
            self._signature, self._redacted = chunk.signature, chunk.redacted_data
            self.close(out)

    def tool_input_start(self, chunk: Any, out: list[Any]) -> None:
        """A call's input begins streaming: the open part ends before it."""
        self.close(out)
        out.append(chunk)

    def tool_call(self, chunk: ToolCallChunk, out: list[Any]) -> None:
        """A complete call: a part of its own, shown in the stream by its own chunk."""
        self.close(out)
        self.content.append(
            ToolCallPart(
                tool_call_id=chunk.tool_call_id,
                tool_name=chunk.tool_name,
                input=chunk.input,
                step=self.step,
            )
        )
        self.call_ids.add(chunk.tool_call_id)
        out.append(chunk)

    def provider_data(self, chunk: ProviderDataChunk, out: list[Any]) -> None:
        """An opaque provider block: a stored part of its own, absent from the stream,
        that still ends the open part (the text after it is another block)."""
        self.close(out)
        model, endpoint = self._origin_of(chunk.provider)
        self.content.append(
            ProviderDataPart(
                provider=chunk.provider,
                data=chunk.data,
                step=self.step,
                model=model,
                endpoint=endpoint,
            )
        )

    def _origin_of(self, provider: str | None) -> tuple[str | None, str | None]:
        """The model and endpoint to record on a part tagged ``provider``."""
        origin = self.origin
        if origin is None or provider != origin.provider:
            return None, None
        return origin.model, origin.endpoint

    def close(self, out: list[Any], citations: tuple[dict[str, Any], ...] | None = None) -> None:
        """Close the open part, if any: store it (a text part with ``citations``) and
        tell the stream."""
        kind = self._kind
        if kind is None:
            return
        # Halves of a character a server sent in two deltas joined, a half alone U+FFFD:
        # the session holds what the store writes, so every later request is text a
        # strict JSON reader takes (Gemini's SDK sent the lone half as its escape).
        text = utf8_text("".join(self._pieces))
        if kind is TEXT:
            part: Part = TextPart(
                text=text, step=self.step, refusal=self._refusal, citations=citations
            )
        else:
            model, endpoint = self._origin_of(self._provider)
            part = ReasoningPart(
                text=text,
                step=self.step,
                signature=self._signature,
                redacted_data=self._redacted,
                provider=self._provider,
                model=model,
                endpoint=endpoint,
            )
        self.content.append(part)
        out.append(PartEnd(kind=kind, part_id=self._id))
        self._kind = None
        self._pieces = []
        self._refusal = False
        self._signature = self._redacted = self._provider = None

    def discard(self, mark: int) -> None:
        """Forget what a failed model call made: the open part (no :class:`PartEnd`:
        the stream controller closes it before its ``reset-step``) and every part
        stored after the first ``mark``. The step starts over; its new parts get new
        ids, so no id of a discarded part comes back. (A discarded call's id was new to
        the message, :class:`CallIds`: no earlier call keeps it.)"""
        self.call_ids.difference_update(
            [p.tool_call_id for p in self.content[mark:] if type(p) is ToolCallPart]
        )
        del self.content[mark:]
        self._kind = None
        self._pieces = []
        self._refusal = False
        self._signature = self._redacted = self._provider = None

    def written(self, mark: int) -> int:
        """The UTF-8 bytes of what the model wrote from part ``mark`` on, the open part's
        too: text, reasoning, each call's tool name and input as JSON. A call whose
        server reports no usage is counted by it (:func:`actors.turn.inference.counted`):
        every token of a byte-level tokenizer (BPE, SentencePiece's byte fallback) stands
        for one byte or more, so what a call showed is no more tokens than bytes."""
        n = sum(len(p.encode("utf-8", "surrogatepass")) for p in self._pieces)
        for part in self.content[mark:]:
            if isinstance(part, TextPart | ReasoningPart):
                n += len(part.text.encode("utf-8", "surrogatepass"))
            elif isinstance(part, ToolCallPart):
                n += len(part.tool_name.encode("utf-8", "surrogatepass"))
                try:
                    n += len(orjson.dumps(part.input))
                except TypeError:  # not JSON as orjson takes it (a key not a string)
                    n += len(json.dumps(part.input, default=str, ensure_ascii=False).encode())
        return n

    def _open(self, kind: str, out: list[Any]) -> None:
        self.close(out)
        self._kind = kind
        self._id = new_id("part")
        out.append(PartBegin(kind=kind, part_id=self._id))


class CallIds:
    """Makes the tool call ids of one model call unique in the turn (its assistant
    message, and those before it when messages were steered in).

    Some servers and local models number the calls of each response (``call_0`` in every
    step), so a turn could hold two calls with one id: the turn's bookkeeping (results,
    outcomes, held calls), the stored message and the stream (the AI SDK finds a tool
    part by ``toolCallId``) all take a call id to name one call. So a call whose id the
    turn already holds gets another, ``{id}-{step}`` (``-{step}-{k}`` if that one is
    taken too), on every chunk of it: its input's start and deltas and the complete call.
    The history then keeps that id, and every request built from it sends it with both
    the call and its result, so they still pair.

    Derived, not random: a step run again (a turn taken over from another worker, whose
    message holds the parts of the committed steps; a model call made again after a
    failure, whose parts were discarded) gives each call the id it had.

    ``held``: the ids of the message's calls, :attr:`PartsManager.call_ids` (read, never
    changed here: it grows as each call of this model call becomes a part). The ids this
    model call takes go to :attr:`used` too, so a call whose input is still streaming
    holds its id before it is a part, and a failed call's ids go with this object.
    """

    __slots__ = ("_open", "held", "renamed", "step", "used")

    def __init__(self, held: AbstractSet[str], step: int) -> None:
        self.held = held
        self.used: set[str] = set()
        """The ids this model call gave its calls."""
        self.step = step
        self.renamed: dict[str, str] = {}
        """The provider's id of a call whose input is streaming -> the id it has here;
        only calls renamed (the common case keeps this empty)."""
        self._open: dict[str, str] = {}  # a call's input streaming: provider id -> its id

    def _fresh(self, original: str) -> str:
        used, held = self.used, self.held
        new, k = original, 0
        while new in held or new in used:
            k += 1
            new = repeated_call_id(original, self.step, k)
        used.add(new)
        return new

    def start(self, chunk: ToolInputStartChunk) -> ToolInputStartChunk:
        original = chunk.tool_call_id
        new = self._fresh(original)
        self._open[original] = new
        if new == original:
            self.renamed.pop(original, None)
            return chunk
        self.renamed[original] = new
        return attrs.evolve(chunk, tool_call_id=new)

    def delta(self, chunk: ToolInputDeltaChunk) -> ToolInputDeltaChunk:
        new = self.renamed.get(chunk.tool_call_id)
        return chunk if new is None else attrs.evolve(chunk, tool_call_id=new)

    def call(self, chunk: ToolCallChunk) -> ToolCallChunk:
        original = chunk.tool_call_id
        new = self._open.pop(original, None)
        if new is None:  # no input streamed before it (or a second call with that id)
            new = self._fresh(original)
        self.renamed.pop(original, None)
        return chunk if new == original else attrs.evolve(chunk, tool_call_id=new)


def storable(call: ToolCallChunk) -> ToolCallChunk:
    """``call`` as it is when the store can write its input (as JSON); else with its
    input as JSON text and an ``input_error``, so it is refused with that error as its
    result, which the model sees: an input nested past what the store writes.

    The providers read a call's arguments with Python's JSON parser, which takes an
    integer of any size: the store writes it exactly (:func:`runtime.serde.dumps`), and
    the tool gets it. It was refused here (orjson writes none past 64 bits; branch
    ``bigints``)."""
    value = call.input
    if type(value) is str:
        return call  # unparsable input, kept as the text it came as
    try:
        dumps(value)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError; nested too deeply
        return attrs.evolve(
            call,
            input=json.dumps(value, default=repr),
            input_error=f"the tool call was not executed: its input cannot be stored ({exc})",
        )
    return call
