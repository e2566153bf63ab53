"""The Chat Completions parser's fast path for text chunks changes nothing it emits.

``parse_stream`` reads the common chunk (one choice, a delta of ``content`` only) without
its general path's look-ups (issue 24). On any stream of plausible chunks, what it emits
must equal what the general path alone emits.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers import openai as provider
from runtime import errors

_TEXT = st.one_of(st.none(), st.just(""), st.text(max_size=5), st.integers(0, 3))
_DELTA = st.dictionaries(
    st.sampled_from(["content", "role", "refusal", "reasoning_content", "reasoning"]),
    _TEXT,
    max_size=3,
)
_CHOICE = st.fixed_dictionaries(
    {"delta": st.one_of(_DELTA, st.none())},
    optional={
        "index": st.sampled_from([0, 1, None]),
        "finish_reason": st.sampled_from([None, "stop", "length"]),
        "logprobs": st.none(),
    },
)
_USAGE = st.fixed_dictionaries({"prompt_tokens": st.integers(0, 9)})
_CHUNK = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(_CHOICE, max_size=2),
        "usage": st.one_of(st.none(), _USAGE),
        "x_groq": st.fixed_dictionaries({"usage": _USAGE}),
        "id": st.just("chatcmpl-1"),
    },
)


async def _emitted(chunks: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []

    async def emit(item: Any) -> None:
        out.append(item)

    async def stream() -> Any:
        for chunk in chunks:
            yield chunk

    try:
        async with aclosing(stream()) as served:  # the parser may stop before its end
            await provider.parse_stream(served, emit)
    except errors.MalformedStream as exc:
        out.append(("malformed", str(exc)))
    return out


@given(st.lists(_CHUNK, max_size=6))
def test_the_fast_path_emits_what_the_general_path_emits(chunks: list[dict[str, Any]]) -> None:
    import trio

    fast = trio.run(_emitted, chunks)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(provider, "_text_only", lambda chunk: None)
        general = trio.run(_emitted, chunks)
    assert fast == general


def test_a_text_chunk_takes_the_fast_path() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    assert provider._text_only(chunk) == "hi"
    chunk["usage"] = {"prompt_tokens": 1}
    assert provider._text_only(chunk) is None
