"""What the model reads of a tool's result: at most the agent's ``max_tool_result_chars``.

The tool executor cuts a server tool's result to the limit (:func:`truncate_output`); a
decision stores a client-side tool's output or error and a denial's reason cut the same
way, and the turn that resumes cuts what the model reads of them again (docs/approval.md),
so that no result reaches the model, or the store, longer than the limit whichever side
produced it. Cutting a text already cut gives what cutting the text it came from gives
(the marker counts what went), so the model reads the same of a stored cut value as of
the value the client sent.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from runtime.json_exact import BIG_INT_MARK, dumps, loads
from runtime.messages import TextPart, is_media_output

TRUNCATION_MARKER = "…[truncated: {omitted} of {total} characters omitted]"
_MARKED = re.compile(r"…\[truncated: (\d{1,19}) of \d{1,19} characters omitted\]\Z")
"""A text that ends with :data:`TRUNCATION_MARKER` (digits bounded: a marker a client wrote
itself adds at most its ~80 characters to what is kept)."""


def truncate_output(output: Any, limit: int | None) -> Any:
    """``output`` as the store gives it back, if its JSON text fits ``limit``; else its
    text cut to fit, ending with a visible marker (so the model knows it did not see
    everything).

    As the store gives it back: a non-finite float (NaN, an infinity) is ``null``, which
    is how the store writes it (JSON has neither). Kept as it was, the call's result was
    NaN in the stream and in the next request (``"NaN"`` in OpenAI's tool message, text
    no JSON parser takes) and ``null`` in the history a later turn sends.

    An integer past 64 bits is kept exactly (:func:`runtime.serde.dumps`); it was a
    ``TypeError`` (orjson's), and the call's result an error."""
    if is_media_output(output):
        return _cut_text_parts(output, limit)  # images and files: bounded by their size
    if isinstance(output, str):
        if limit is None or len(output) <= limit:
            return output
        text = output
    else:
        data = dumps(output)
        # Fewer bytes than the limit: fewer characters too, nothing to decode. The text
        # the model reads holds no mark before an integer past 64 bits (a tab it would
        # read, and count: branch exactints2).
        text = (
            ""
            if limit is None or len(data) <= limit
            else dumps(output, marked=False).decode()
            if BIG_INT_MARK in data
            else data.decode()
        )
        if limit is None or len(text) <= limit:
            # Read back only when it may have changed: a null in the text (most outputs
            # hold none; a float is written exactly as it was, the rest as it was given).
            return loads(data) if b"null" in data else output
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    """``text`` (longer than ``limit``) cut to ``limit`` characters and the marker. A text
    that ends with the marker already (a client's output stored cut, a denial's text made
    of a reason stored cut) stands for the text it was cut from: kept as it is when what
    precedes its marker fits, else cut as that text would be, counting what its marker
    says went. So the model reads the same of a value stored cut as of the value whole."""
    found = _MARKED.search(text)
    body, gone = (text, 0) if found is None else (text[: found.start()], int(found[1]))
    if found is not None and len(body) <= limit:
        return text
    total = len(body) + gone
    return body[:limit] + TRUNCATION_MARKER.format(omitted=total - limit, total=total)


def _cut_text_parts(parts: tuple[Any, ...], limit: int | None) -> tuple[Any, ...]:
    """Media parts with their text parts cut to ``limit`` characters in all (the first
    one cut ends with the marker; text parts past it go). A single image beside the
    text let a tool's 5 MB of text past ``max_tool_result_chars``, to the model and the
    store."""
    texts = [p for p in parts if isinstance(p, TextPart)]
    total = sum(len(p.text) for p in texts)
    if limit is None or total <= limit:
        return parts
    last = _MARKED.search(texts[-1].text)
    if last is not None and total - len(last[0]) <= limit:
        return parts  # cut already (stored so): its marker ends its last text part
    out: list[Any] = []
    left, marked = limit, False
    for p in parts:
        if not isinstance(p, TextPart):
            out.append(p)
        elif len(p.text) <= left:
            out.append(p)
            left -= len(p.text)
        elif not marked:  # the part where the limit falls: cut, with the marker
            marker = TRUNCATION_MARKER.format(omitted=total - limit, total=total)
            out.append(attrs.evolve(p, text=p.text[:left] + marker))
            left, marked = 0, True
    return tuple(out)


__all__ = ["TRUNCATION_MARKER", "truncate_output"]
