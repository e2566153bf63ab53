"""A stream's text deltas read by decoding their text alone, where each delta's JSON is
the one before it with another string (issue 24).

Why: most events of a model's stream are text deltas, and on one stream they are the
same bytes but for the text: Anthropic's ``{"type":"content_block_delta","index":0,
"delta":{"type":"text_delta","text":"..."}}`` for a whole block, a Chat Completions
server's chunk with the same id, model and fingerprint for a whole answer. Decoding each
into a dict of dicts, to read one string out of it, was the costliest step of a delta
(1.0 of the provider's 2.5 us on the benchmark's OpenAI body). A :class:`StringSlot`
holds the bytes around that string, learned from one event that was decoded in full;
an event made of the same bytes around another JSON string is, value for value, the
same event with that string in its place, so decoding the string alone reads the same
text. Anything else (another shape, a key more, a string that is not one JSON string
token) is not a match, and the event is decoded in full as before.

Why the learning is sound: a slot is learned from an event ``doc`` (decoded from
``data``) whose text ``read(doc)`` is at a known place; the bytes of a JSON string token
just after the last ``key`` (``"text":``, and the whitespace after it, if any) are cut out
and a probe string put there. Only if the probe document decodes to ``doc`` with the
probe at that place (``read`` finds the probe, and writing the text back gives ``doc``
again) is the slot kept: then that token is the text's value and nothing else, and JSON
decoding being compositional, any other string token there gives ``doc`` with that
string as its text.

Two holes (:class:`TwoStringSlot`): api.openai.com sends every chunk with an
``obfuscation`` string of its own (random padding of varying length, after the text), so
no two chunks are the same bytes around the text alone. Such a slot holds the bytes
before the text, between the text and the padding, and after the padding; an event of
those bytes around two JSON string tokens (each validated by orjson) is, value for
value, the learned event with these two strings in their places. It is learned only if a
probe in each hole decodes to the learned doc with the probes in place (``read`` finds
the text probe while the padding probe is in its place; writing both back gives ``doc``
again), so the second hole is the padding's value and the text read does not depend on
it: ``read`` must not look at the padding (OpenAI's ``_text_only`` does not).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, repeat
from operator import getitem, itemgetter
from typing import Any, overload


@functools.cache
def orjson_module() -> Any:
    """``orjson``, imported where a stream is first read (importing a provider does not
    load it) and kept. Why kept: an ``import`` statement in a function runs the import
    system on every call, ~1,300 instructions for a module already loaded; a stream's
    readers and slots ran three to four a turn, and Gemini's chunk decoder one a chunk
    (issue 24 goal 1); a cached call is ~100."""
    import orjson

    return orjson


_PROBE = "\x00axon-probe\u2603"
_PROBE_TOKEN = '"\\u0000axon-probe\u2603"'.encode()  # an escape and a multibyte character
_PAD_PROBE = "\x01axon-pad\u2604"
_PAD_PROBE_TOKEN = '"\\u0001axon-pad\u2604"'.encode()
_QUOTE, _BACKSLASH = 34, 92


class StringSlot:
    """The bytes of one event around its text: :meth:`text` reads another event of the
    same bytes around another string."""

    __slots__ = (
        "_between",
        "_closing",
        "_inside",
        "_joinable",
        "_loads",
        "_opening",
        "_start",
        "_stop",
        "prefix",
        "suffix",
        "window",
    )

    def __init__(self, prefix: bytes, suffix: bytes) -> None:
        if not suffix:
            raise ValueError("a slot needs bytes after the string")
        self._loads = orjson_module().loads
        self.prefix = prefix
        self.suffix = suffix
        self.window = _WINDOW  # the events its next run reads at first (:func:`_run`)
        self._start = len(prefix)
        self._stop = -len(suffix)
        self._opening = prefix + b'"'
        self._closing = b'"' + suffix
        self._between = self._closing + b"\n" + self._opening  # between two events (run)
        self._inside = slice(len(self._opening), -len(self._closing))  # the string's bytes
        self._joinable = b"\n" not in self._opening + self._closing  # (run_lines)

    def text(self, data: bytes) -> str | None:
        """The string of ``data`` when it is :attr:`prefix`, one JSON string token and
        :attr:`suffix`; ``None`` otherwise (then ``data`` must be decoded in full)."""
        if data.startswith(self.prefix) and data.endswith(self.suffix):
            middle = data[self._start : self._stop]  # empty when the two overlap
            if len(middle) > 1 and middle[0] == _QUOTE and middle[-1] == _QUOTE:
                try:
                    return self._loads(middle)  # a str: valid JSON opening with a quote
                except ValueError:
                    return None  # not one token: the full decode says what it is
        return None

    def run(self, events: Sequence[tuple[Any, bytes]], i: int, name: Any) -> tuple[list[str], int]:
        """:meth:`text` of each event of ``events`` (``(name, data)`` pairs) from index
        ``i`` on, while the event is named ``name`` and its text reads: the texts and the
        index of the first event not read. The same texts as :meth:`text`, read a window
        of events at a time (:func:`_run`)."""
        return _run(self, events, i, name)

    def _window(self, part: Sequence[tuple[Any, bytes]], name: Any) -> list[str] | None:
        """The texts of every event of ``part`` if each is named ``name`` and is
        :attr:`prefix`, a quote, bytes without a quote, a quote and :attr:`suffix`, and
        those strings decode; ``None`` otherwise.

        Why it reads what :meth:`text` reads: the events' data joined by newlines equals
        the strings cut out of them, each put back between ``prefix"`` and ``"suffix``
        and joined the same way, only if every event is so (the pieces line up: each
        event's is as long as its data, unless one is too short for both, and then the
        whole is longer); with no quote in them, :func:`_strings` reads their values."""
        k = len(part)
        if list(map(_NAME, part)).count(name) != k:
            return None
        datas = list(map(_DATA, part))
        strings: list[bytes] = list(map(getitem, datas, repeat(self._inside, k)))
        if b"\n".join(datas) != self._opening + self._between.join(strings) + self._closing:
            return None
        if b"".join(strings).find(b'"') >= 0:  # (``find``: see sse.SSEDecoder._holds)
            return None  # a quote in a text (escaped): read alone
        return _strings(self._loads, strings)

    def run_lines(
        self, lines: list[bytes], i: int, k: int, lead: bytes, read: bytes, at: int
    ) -> tuple[list[str], int, int]:
        """:meth:`run` of SSE blocks of lines (``size`` lines a block, the last blank:
        ``lines[size * j : size * (j + 1)]`` the block of event ``j``,
        :meth:`~actors.providers.sse.SSEDecoder.feed_lines`) from event ``i`` on, below
        ``k``, while each block is ``lead`` (an event's lines up to its data's value:
        ``b"event: NAME\\ndata: "``, a block of 3 lines, or ``b"data: "``, of 2), this
        slot's bytes around a string, and a blank line: the texts, the index of the
        first block not read (the caller reads it as an event) and where it starts in
        ``read``. ``read`` holds the lines, each ended by a newline
        (:attr:`~actors.providers.sse.SSEDecoder.read`), block ``i`` from offset ``at``.
        Windows of blocks as :func:`_run` reads windows of events (:func:`_run_lines`);
        the same texts as :meth:`text` of each block's data (a block not read here, such
        as one whose text holds a quote, is the caller's to read as one).

        Why a window's lines are those events when ``read`` holds, from block ``i``'s
        offset, ``lead`` + :attr:`prefix` + ``"`` + string + ``"`` + :attr:`suffix` +
        two newlines for each (the strings cut out of the window's data lines): those
        bytes hold ``size`` newlines a block (``lead`` holds ``size - 2``; the slot's
        bytes none, or no window is read; the strings none, being cut from lines), so
        they are the window's lines, each ended by its newline: ``lead``'s lines, the
        last of them with the data, and a blank line. Compared where they lie in
        ``read``: the lines are not joined again (issue 24 goal 1)."""
        return _run_lines(self, lines, i, k, lead, self._window_lines, read, at)

    def _window_lines(
        self, data_lines: list[Any], head: bytes, line_start: int, read: bytes, at: int
    ) -> tuple[list[str], int] | None:
        """The texts of a window of blocks (:meth:`run_lines`; ``data_lines``: each
        block's data line) and the length of its bytes in ``read`` (from ``at``), or
        ``None``.

        (A quote looked for by counting those of ``middle`` against those of the bytes
        between the strings, instead of one more join of the strings: 500 instructions
        more a delta, ``count`` scanning a byte at a time: ``cachesim``.)"""
        if not self._joinable:
            return None  # the slot's bytes hold a newline: never the blocks' lines
        closing = self._closing
        w = len(data_lines)
        inside = slice(line_start + len(self._opening), -len(closing))
        strings: list[bytes] = list(map(getitem, data_lines, repeat(inside, w)))
        middle = (closing + b"\n\n" + head).join(strings)
        end = at + len(head) + len(middle)
        if not (
            read.startswith(head, at)
            and read.startswith(middle, at + len(head))
            and read.startswith(closing + b"\n\n", end)
        ):
            return None
        if b"".join(strings).find(b'"') >= 0:  # (``find``: see sse.SSEDecoder._holds)
            return None  # a quote in a text (escaped): read alone
        texts = _strings(self._loads, strings)
        return None if texts is None else (texts, end + len(closing) + 2 - at)


_NAME, _DATA = itemgetter(0), itemgetter(1)
_WINDOW, _MAX_WINDOW = 16, 256
"""The events a slot's ``run`` reads at a time: 16 at first, twice as many after each
window read whole, at most 256."""


def _run(
    slot: StringSlot | TwoStringSlot, events: Sequence[tuple[Any, bytes]], i: int, name: Any
) -> tuple[list[str], int]:
    """``slot.text`` of each event from index ``i`` on, while it is named ``name`` and
    its text reads: the texts and the index of the first event not read.

    Why: a read's text deltas come in runs, and reading one a call, with a look at its
    bytes and a decode each, was the costliest step of a delta in the provider (issue 24
    goal 1). So a window of events is read at once (the slot's ``_window``: a handful of
    C calls over all its bytes and one decode); a window that does not read whole is
    halved, down to one event read by ``text``. The window doubles after each window
    read whole, so a run that ends costs about twice its own events. A run that reaches
    the end of ``events`` (a network read's) leaves its window to the slot's next run
    (``slot.window``): the next read, most likely text deltas to its end as well, is read
    in one window, not in windows of 16, 32, 64 and what is left (a window's fixed cost
    of a few C calls was about 0.1 us a delta of OpenAI's reads of 50 chunks); a run
    that ends at an event it cannot read leaves the first window again."""
    texts: list[str] = []
    n = len(events)
    window = slot.window
    while i < n:
        part = events[i : i + window]
        got = slot._window(part, name)
        if got is not None:
            texts += got
            i += len(part)
            window = min(2 * window, _MAX_WINDOW)
        elif len(part) > 1:
            window = len(part) // 2
        else:
            event_name, data = part[0]
            text = slot.text(data) if event_name == name else None
            if text is None:
                slot.window = _WINDOW
                return texts, i
            texts.append(text)
            i += 1
            window = _WINDOW
    slot.window = window
    return texts, i


def _run_lines(
    slot: StringSlot | TwoStringSlot,
    lines: list[bytes],
    i: int,
    k: int,
    lead: bytes,
    window_of: Callable[[list[bytes], bytes, int, bytes, int], tuple[list[str], int] | None],
    read: bytes,
    at: int,
) -> tuple[list[str], int, int]:
    """The slot's ``run_lines``: windows of blocks from ``i`` (at offset ``at`` of
    ``read``) on, below ``k``, read by ``window_of(the blocks' data lines, head,
    line_start, read, offset)`` (``head``: ``lead`` and the slot's opening bytes; ``line_start``:
    where the data's value starts in its line; it gives the texts and the window's
    length in ``read``), halved down to one block when they do not read whole, doubled
    after each that does; the texts, the first block not read (left to the caller) and
    its offset, the window carried as :func:`_run` carries it.

    The blocks at the end of the read that cannot be the slot's (:func:`_tail`) are left
    out first: a read holding a run's last deltas and the events after it (a stream's end:
    a block stop, the finish, the usage) made the run halve its window down to one block,
    a handful of windows of up to 255 blocks each read and dropped, and one more run per
    event after it, once a turn (issue 24 goal 1). The same texts and blocks read: a block
    left out would fail every window holding it."""
    size = lead.count(b"\n") + 2
    head = lead + slot._opening
    line_start = len(lead) - lead.rfind(b"\n") - 1
    end = _tail(lines, i, k, size, lead, head[len(lead) - line_start :])
    texts: list[str] = []
    window = slot.window
    while i < end:
        j = min(i + window, end)
        # only the data lines (every ``size``-th from the block's last but one): a slice
        # of whole blocks took a reference to each of a window's lines, made a whole
        # read before, and dropped it again: a cache miss each (``cachesim``)
        got = window_of(lines[size * i + size - 2 : size * j : size], head, line_start, read, at)
        if got is not None:
            texts += got[0]
            at += got[1]
            i = j
            window = min(2 * window, _MAX_WINDOW)
        elif j - i > 1:
            window = (j - i) // 2
        else:
            slot.window = _WINDOW
            return texts, i, at
    slot.window = window if end == k else _WINDOW  # (as when block ``end`` failed alone)
    return texts, i, at


_TAIL = 8
"""The blocks at most that :func:`_tail` looks at from a read's end: a stream's end is
three (Anthropic's block stop, finish and stop; Chat Completions' finish, usage and
``[DONE]``); a bound, so that a read of many other blocks read one at a time (each
followed by a run) is not looked at whole again before each."""


def _tail(lines: list[bytes], i: int, k: int, size: int, lead: bytes, data_head: bytes) -> int:
    """``k`` less the blocks before it (at most :data:`_TAIL`, none before ``i``) that no
    window can read: their lines are not ``lead`` 's (``size - 2`` of them) and a data line
    starting with ``data_head`` (``lead`` 's last line and the slot's opening bytes), which
    a window compares each of its blocks against (:meth:`StringSlot._window_lines`)."""
    stop = max(i, k - _TAIL)
    if size == 2:
        while k > stop and not lines[2 * k - 2].startswith(data_head):
            k -= 1
        return k
    leads = lead.split(b"\n")[:-1]
    while k > stop and not (
        lines[size * k - 2].startswith(data_head) and lines[size * (k - 1) : size * k - 2] == leads
    ):
        k -= 1
    return k


def _strings(loads: Callable[[bytes], Any], strings: list[bytes]) -> list[str] | None:
    """``strings`` (the bytes between a string token's quotes, none holding a quote)
    decoded in one JSON array, in order; ``None`` if the array is refused. Each
    ``"string"`` is one string token unless its last quote is escaped, and then the
    string it opens runs on into the next one's first quote, after which the array can
    never close: so the array holds exactly the tokens' values, or is refused."""
    try:
        decoded: list[str] = loads(b'["' + b'","'.join(strings) + b'"]')
    except ValueError:
        return None
    return decoded


class TwoStringSlot:
    """The bytes of one event around its text and a padding string after it:
    :meth:`text` reads another event of the same bytes around two other strings."""

    __slots__ = (
        "_between",
        "_closing",
        "_inner",
        "_joinable",
        "_loads",
        "_opening",
        "_pad",
        "_quoted_middle",
        "_separators",
        "_start",
        "_stop",
        "middle",
        "prefix",
        "suffix",
        "window",
    )

    def __init__(self, prefix: bytes, middle: bytes, suffix: bytes) -> None:
        if not middle or not suffix:
            raise ValueError("a slot needs bytes between and after the strings")
        self._loads = orjson_module().loads
        self.prefix = prefix
        self.middle = middle
        self.suffix = suffix
        self.window = _WINDOW  # the events its next run reads at first (:func:`_run`)
        self._start = len(prefix)
        self._stop = -len(suffix)
        self._opening = prefix + b'"'
        self._quoted_middle = b'"' + middle + b'"'
        self._closing = b'"' + suffix
        self._between = self._closing + b"\n" + self._opening  # between two events (run)
        self._separators = (b"", self._quoted_middle, b"", self._between)  # (_window)
        self._inner = slice(len(self._opening), -len(self._closing))  # text, middle, padding
        self._pad = slice(len(middle) + 1, None)  # after a text's closing quote (_pieces)
        self._joinable = b"\n" not in self._opening + self._quoted_middle + self._closing

    def text(self, data: bytes) -> str | None:
        """The first string of ``data`` when it is :attr:`prefix`, one JSON string token,
        :attr:`middle`, one JSON string token and :attr:`suffix`; ``None`` otherwise (then
        ``data`` must be decoded in full)."""
        if not (data.startswith(self.prefix) and data.endswith(self.suffix)):
            return None
        start = self._start
        if data[start] != _QUOTE:  # (the data is longer than the prefix: it ends after it)
            return None
        end = data.find(b'"', start + 1) + 1  # the first quote after the opening one...
        if end == 0:
            return None
        if data[end - 2] == _BACKSLASH:  # ...unless escaped: then the first unescaped one
            end = _string_end(data, start)
        middle = self.middle
        if not data.startswith(middle, end):
            return None
        pad = data[end + len(middle) : self._stop]  # empty when they overlap
        if len(pad) < 2 or pad[0] != _QUOTE or pad[-1] != _QUOTE:
            return None
        loads = self._loads
        try:
            loads(pad)  # one string token, or not a match (its value is not read)
            return loads(data[start:end])  # a str: valid JSON opening with a quote
        except ValueError:
            return None

    def run(self, events: Sequence[tuple[Any, bytes]], i: int, name: Any) -> tuple[list[str], int]:
        """:meth:`text` of each event from index ``i`` on, while it is named ``name`` and
        its text reads: the texts and the index of the first event not read, a window of
        events at a time (:func:`_run`)."""
        return _run(self, events, i, name)

    def _window(self, part: Sequence[tuple[Any, bytes]], name: Any) -> list[str] | None:
        """The texts of every event of ``part`` if each is named ``name`` and is
        :attr:`prefix`, a quote, bytes without a quote, a quote, :attr:`middle`, a
        quote, bytes without a quote, a quote and :attr:`suffix`, and those strings
        decode; ``None`` otherwise.

        How, with three C calls an event (the OpenAI read's costliest step: its chunks
        are three times Anthropic's events; issue 24): the bytes of each event after the
        learned opening and before the closing are cut into a text and a padding
        (:meth:`_pieces`: split at their first quote, the padding past the middle), and
        the pieces, alternately texts and paddings, are put back between the learned
        bytes in one join of the whole window.

        Why it reads what :meth:`text` reads, however the pieces were cut: if that join
        equals the events' data joined by newlines, the window is the learned bytes around
        quote-free pieces, each between the separators it must be between. The learned bytes
        hold no newline (:attr:`_joinable`) and the pieces hold none (a raw newline is no
        JSON string's content: :func:`_strings` refuses it), so the window's only newlines
        are the one each between-bytes holds, one fewer than the events: no event's data
        holds one, and the window's lines are the events, each the learned bytes around its
        text and padding. One :func:`_strings` validates the paddings and reads the texts."""
        k = len(part)
        if not self._joinable or list(map(_NAME, part)).count(name) != k:
            return None
        datas = list(map(_DATA, part))
        pieces = self._pieces(map(getitem, datas, repeat(self._inner, k)), k)
        if pieces is None or b"".join(pieces).find(b'"') >= 0:
            return None  # not this shape, or a quote in a piece (escaped): read alone
        layout = [self._opening, *self._separators * k]  # 4k + 1, the last one the closing
        layout[1::2] = pieces
        layout[-1] = self._closing
        if b"".join(layout) != b"\n".join(datas):
            return None
        decoded = _strings(self._loads, pieces)  # the paddings validated with the texts
        return None if decoded is None else decoded[0::2]

    def _pieces(self, inner: Iterator[bytes], k: int) -> list[bytes] | None:
        """The text and the padding of each of ``k`` events' bytes between the learned
        opening and closing (``inner``), in turn, if each holds a quote: the bytes before
        its first quote, and those past :attr:`middle` and its closing quote after it;
        ``None`` otherwise. For an event of this slot's shape, what a split at the quoted
        :attr:`middle` gives; for another, pieces that its caller's comparison of the
        learned bytes put back around them with the events' bytes refuses.

        Why not that split: a search for the ~70 bytes of OpenAI's middle cost ~1,600
        instructions an event, a split at the first quote and a slice ~1,000 (issue 24
        goal 1: 0.6 M of a 1,000-delta turn's ~25 M)."""
        pieces = list(chain.from_iterable(map(bytes.split, inner, repeat(b'"', k), repeat(1, k))))
        if len(pieces) != 2 * k:
            return None  # an event without a quote there
        tails: list[Any] = pieces[1::2]  # each the middle, its closing quote, the padding
        pieces[1::2] = map(getitem, tails, repeat(self._pad, k))
        return pieces

    def run_lines(
        self, lines: list[bytes], i: int, k: int, lead: bytes, read: bytes, at: int
    ) -> tuple[list[str], int, int]:
        """:meth:`StringSlot.run_lines` for this slot's bytes around two strings."""
        return _run_lines(self, lines, i, k, lead, self._window_lines, read, at)

    def _window_lines(
        self, data_lines: list[Any], head: bytes, line_start: int, read: bytes, at: int
    ) -> tuple[list[str], int] | None:
        """The texts of a window of blocks (:meth:`run_lines`) and its length in
        ``read``, or ``None``: as :meth:`_window`, the pieces of each data line split at
        the quoted middle and put back between the learned bytes, compared with
        ``read`` from ``at`` (the newlines counted as in :meth:`StringSlot.run_lines`:
        the learned bytes hold none, :attr:`_joinable`)."""
        if not self._joinable:
            return None
        w = len(data_lines)
        inner = slice(line_start + len(self._opening), -len(self._closing))
        pieces = self._pieces(map(getitem, data_lines, repeat(inner, w)), w)
        if pieces is None or b"".join(pieces).find(b'"') >= 0:
            return None  # not this shape, or a quote in a piece (escaped): read alone
        between = self._closing + b"\n\n" + head
        layout = [head, *(b"", self._quoted_middle, b"", between) * w]
        layout[1::2] = pieces
        layout[-1] = self._closing + b"\n\n"
        window = b"".join(layout)
        if not read.startswith(window, at):
            return None
        decoded = _strings(self._loads, pieces)  # the paddings validated with the texts
        return None if decoded is None else (decoded[0::2], len(window))


@overload
def learn(
    data: bytes,
    doc: Any,
    key: bytes,
    read: Callable[[Any], Any],
    write: Callable[[Any, str], None],
    *,
    pad: None = None,
) -> StringSlot | None: ...


@overload
def learn(
    data: bytes,
    doc: Any,
    key: bytes,
    read: Callable[[Any], Any],
    write: Callable[[Any, str], None],
    *,
    pad: tuple[bytes, Callable[[Any, str], None]],
) -> StringSlot | TwoStringSlot | None: ...


def learn(
    data: bytes,
    doc: Any,
    key: bytes,
    read: Callable[[Any], Any],
    write: Callable[[Any, str], None],
    *,
    pad: tuple[bytes, Callable[[Any, str], None]] | None = None,
) -> StringSlot | TwoStringSlot | None:
    """The slot of ``data`` (decoded: ``doc``) around its text, the string token after
    one of the last few ``key`` s (such as ``b'"text":'``), if the probe proves it (see
    the module); ``None`` if none does. ``read`` gives an event's text (``None`` for an
    event of another shape), ``write`` puts a text in its place. With ``pad`` (a key such
    as ``b'"obfuscation":'`` and what puts a string in its value's place), an event whose
    padding string follows its text gets a :class:`TwoStringSlot` if both probes prove
    it, else the one-string slot as without."""
    orjson = orjson_module()
    text = read(doc)
    if type(text) is not str:
        return None
    at = len(data)
    for _ in range(3):
        at = data.rfind(key, 0, at)
        if at < 0:
            return None
        start = _after_space(data, at + len(key))
        end = _string_end(data, start)
        if end < 0 or end == len(data):
            continue
        try:
            probe = orjson.loads(data[:start] + _PROBE_TOKEN + data[end:])
        except ValueError:
            continue
        if read(probe) != _PROBE:
            continue
        write(probe, text)
        if probe != doc:
            continue
        if pad is not None:
            two = _learn_two(data, doc, start, end, read, write, pad)
            if two is not None:
                return two
        return StringSlot(data[:start], data[end:])
    return None


def _learn_two(
    data: bytes,
    doc: Any,
    start: int,
    end: int,
    read: Callable[[Any], Any],
    write: Callable[[Any, str], None],
    pad: tuple[bytes, Callable[[Any, str], None]],
) -> TwoStringSlot | None:
    """The two-string slot of ``data`` whose text token is ``data[start:end]`` (proven)
    and whose padding token follows the first ``pad`` key after it, if a probe in each
    hole proves both (see the module); ``None`` otherwise."""
    orjson = orjson_module()
    key, write_pad = pad
    at = data.find(key, end)
    if at < 0:
        return None
    pad_start = _after_space(data, at + len(key))
    pad_end = _string_end(data, pad_start)
    if pad_end < 0 or pad_end == len(data):
        return None
    try:
        original = orjson.loads(data[pad_start:pad_end])
        probe = orjson.loads(
            data[:start] + _PROBE_TOKEN + data[end:pad_start] + _PAD_PROBE_TOKEN + data[pad_end:]
        )
    except ValueError:
        return None
    if type(original) is not str or read(probe) != _PROBE:
        return None
    write(probe, read(doc))
    if probe == doc:
        return None  # the padding probe changed nothing: that token is not proven
    write_pad(probe, original)  # the only difference left was the padding probe's place
    if probe != doc:
        return None
    return TwoStringSlot(data[:start], data[end:pad_start], data[pad_end:])


def _after_space(data: bytes, at: int) -> int:
    """The index of the first byte from ``at`` on that is no JSON whitespace: a key's
    value may follow its colon after some (Python's ``json.dumps`` writes ``": "``); the
    whitespace then belongs to the learned bytes, as the rest of the event's."""
    n = len(data)
    while at < n and data[at] in _JSON_SPACE:
        at += 1
    return at


_JSON_SPACE = b" \t\r\n"


def _string_end(data: bytes, start: int) -> int:
    """The index after the JSON string token opening at ``start``; -1 if none does."""
    if data[start : start + 1] != b'"':
        return -1
    at = start
    while True:
        at = data.find(b'"', at + 1)
        if at < 0:
            return -1
        back = at - 1
        while data[back] == _BACKSLASH:
            back -= 1
        if (at - 1 - back) % 2 == 0:  # an even run of backslashes: not escaped
            return at + 1


__all__ = ["StringSlot", "TwoStringSlot", "learn"]
