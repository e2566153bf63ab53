"""Hostile or odd text followed end to end: half a character (a lone surrogate, as a
server's ``"\\ud83d"`` escape gives it), NUL, terminal escapes, from a model, a tool or
a stored session, through the providers' readers, the web protocols' streams and the
terminal. Each test says what the user sees and what is saved (journal
``benchmarks/journal/pipeline.md``, ``### textedges``)."""

from __future__ import annotations

import orjson
import pytest

from tests.support.attacks import KINDS, attack_rig
from tests.support.loopback import Reply
from tests.test_provider_attacks import ONCE, texts, turn

HALVES = ("a\ud83d", "\ude00b\u0000c\ud800d")
"""Two deltas as a server escapes them in JSON: an emoji's surrogate pair split between
them, then a NUL and a half with no other half."""


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delta_escaping_half_a_character_is_read_as_the_sdk_reads_it(kind, autojump_clock):
    """Before: OpenAI's and Anthropic's readers (orjson) refused the event that the SDK
    (``json.loads``) reads, and the user got ``MalformedStream`` with nothing saved, on
    every retry. Gemini's next request sent the lone half as its escape, which a strict
    JSON reader refuses. Now the user sees the answer as it came; the session keeps what
    the store writes (the two halves one emoji, the lone half U+FFFD), and the next
    request sends that."""
    async with attack_rig(kind, retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=r.answer(*HALVES)))
        assert (result.finish_reason, result.error) == ("stop", None)
        shown = "".join(c.text for c in chunks if c.type == "text-delta")
        assert shown == "".join(HALVES)
        assert texts(r.session.messages[1]) == "a😀b\u0000c\ufffdd"  # as the store keeps it
        await r.next_turn()
        raw = r.server.requests[-1].body
    sent = orjson.dumps(orjson.loads(raw)).decode()  # orjson refuses a lone half
    assert "a😀b\\u0000c\ufffdd" in sent
