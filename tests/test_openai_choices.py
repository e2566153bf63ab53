"""OpenAI's ``n`` > 1: several choices interleaved in one stream. Choice 0 is the turn's
answer; every other choice's text, reasoning, tool calls and finish are read past, on
the fast path and the slow path alike (journal ``benchmarks/journal/pipeline.md``,
branch ``leftmix``)."""

from __future__ import annotations

from typing import Any

from tests.support.attacks import attack_rig
from tests.support.faults import oa_chunk, oa_usage
from tests.support.loopback import Reply, sse
from tests.test_held_halves import live
from tests.test_provider_attacks import ONCE, texts, turn


def other(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A chunk of choice 1 alone, shaped as choice 0's are (the same bytes but the index)."""
    chunk = oa_chunk(delta, finish)
    chunk["choices"][0]["index"] = 1
    return chunk


CALL = {"index": 0, "id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}


async def test_a_stream_of_two_choices_answers_with_choice_0_alone(autojump_clock):
    mine = [oa_chunk({"content": f"m{i} "}) for i in range(12)]  # (a slot is learned)
    theirs = [other({"content": f"o{i} "}) for i in range(12)]
    events: list[Any] = [oa_chunk({"role": "assistant", "content": ""})]
    for a, b in zip(mine, theirs, strict=True):
        events += [a, b]
    events += [
        other({"reasoning_content": "theirs"}),
        other({"tool_calls": [CALL]}),
        other({}, "tool_calls"),
        oa_chunk({}, "stop"),
        oa_usage(10, 24),
    ]
    async with attack_rig("openai", retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=sse(*events)))
    assert (result.finish_reason, result.error) == ("stop", None)
    assert result.text == "".join(f"m{i} " for i in range(12))
    assert not [c for c in chunks if c.type.startswith(("tool", "reasoning"))]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (10, 24)  # both billed


async def test_another_choice_between_an_emojis_halves_leaves_choice_0s_emoji_whole(
    autojump_clock,
):
    """Choice 0's ``"a\\ud83d"``, a chunk of choice 1, then choice 0's ``"\\ude00b"``.
    Before: choice 1's chunk flushed the held half as U+FFFD, and the other half came
    alone: ``a\\ufffd\\ufffdb`` live and saved, where one choice gives ``a😀b``."""
    events = [
        oa_chunk({"role": "assistant", "content": ""}),
        oa_chunk({"content": "a\ud83d"}),
        other({"content": "x"}),
        oa_chunk({"content": "\ude00b"}),
        oa_chunk({}, "stop"),
        oa_usage(),
    ]
    async with attack_rig("openai", retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=sse(*events)))
        assert result.error is None
        assert live(chunks) == texts(r.session.messages[1]) == "a😀b"
