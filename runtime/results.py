"""What the model reads of a tool's result: at most the agent's ``max_tool_result_chars``.

The tool executor cuts a server tool's result to the limit (:func:`truncate_output`); a
turn that resumes cuts a client-side tool's output and a denial's reason the same way
(docs/approval.md), so that no result reaches the model, or the store, longer than the
limit whichever side produced it.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from runtime.messages import TextPart, is_media_output

TRUNCATION_MARKER = "…[truncated: {omitted} of {total} characters omitted]"


def truncate_output(output: Any, limit: int | None) -> Any:
    """``output`` as the store gives it back, if its JSON text fits ``limit``; else its
    text cut to fit, ending with a visible marker (so the model knows it did not see
    everything).

    As the store gives it back: a non-finite float (NaN, an infinity) is ``null``, which
    is how the store writes it (JSON has neither). Kept as it was, the call's result was
    NaN in the stream and in the next request (``"NaN"`` in OpenAI's tool message, text
    no JSON parser takes) and ``null`` in the history a later turn sends.

    Raises ``TypeError`` (``orjson.JSONEncodeError``) for a value the store could not
    write as JSON either, whatever ``limit`` is: an integer past 64 bits."""
    if is_media_output(output):
        return _cut_text_parts(output, limit)  # images and files: bounded by their size
    if isinstance(output, str):
        if limit is None or len(output) <= limit:
            return output
        text = output
    else:
        data = orjson.dumps(output)
        # Fewer bytes than the limit: fewer characters too, nothing to decode.
        text = "" if limit is None or len(data) <= limit else data.decode()
        if limit is None or len(text) <= limit:
            # Read back only when it may have changed: a null in the text (most outputs
            # hold none; a float is written exactly as it was, the rest as it was given).
            return orjson.loads(data) if b"null" in data else output
    marker = TRUNCATION_MARKER.format(omitted=len(text) - limit, total=len(text))
    return text[:limit] + marker


def _cut_text_parts(parts: tuple[Any, ...], limit: int | None) -> tuple[Any, ...]:
    """Media parts with their text parts cut to ``limit`` characters in all (the first
    one cut ends with the marker; text parts past it go). A single image beside the
    text let a tool's 5 MB of text past ``max_tool_result_chars``, to the model and the
    store."""
    texts = [p for p in parts if isinstance(p, TextPart)]
    total = sum(len(p.text) for p in texts)
    if limit is None or total <= limit:
        return parts
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
