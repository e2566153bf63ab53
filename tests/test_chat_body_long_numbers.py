"""``POST /api/chat``'s body reduction (``chat_body.reduce_chat_body``) walks a
continuation's answer for integers orjson read as floats (past 64 bits) only when the body
holds a run of 19 digits, the fewest such an integer has. The walk was one Python call
per JSON value of the answer, and a body below ``INLINE_BODY`` (256 KiB) is reduced on
the event loop: 130,968 calls for 256 KiB of ``[0,0,...]``. Counted, not timed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from runtime.app.web import chat_body


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per call of the walk (``_lost_int``)."""
    calls: list[int] = []
    original = chat_body._lost_int

    def counting(value: Any, depth: int = 0) -> bool:
        calls.append(depth)
        return original(value, depth)

    monkeypatch.setattr(chat_body, "_lost_int", counting)
    return calls


def _answer(rows: str) -> bytes:
    """A continuation body whose client tool output holds ``rows`` (JSON text)."""
    part = (
        '{"type":"tool-table","toolCallId":"c1","state":"output-available","input":{},'
        f'"output":{{"rows":{rows}}}}}'
    )
    user = '{"id":"u","role":"user","parts":[{"type":"text","text":"go"}]}'
    answer = f'{{"id":"a","role":"assistant","parts":[{part}]}}'
    return f'{{"id":"s","messages":[{user},{answer}]}}'.encode()


def test_an_answer_without_a_long_number_is_not_walked(walked):
    raw = _answer(orjson.dumps(list(range(2_500))).decode())
    reduced = chat_body.reduce_chat_body(raw, 100, 100)
    assert reduced["messages"][0]["parts"][0]["output"]["rows"][-1] == 2_499
    assert walked == []  # was 2,508: one per value of the parts


def test_an_answer_with_an_integer_past_64_bits_is_still_read_exactly(walked):
    raw = _answer(f"[1, 2, {1 << 64}, -9223372036854775809]")
    reduced = chat_body.reduce_chat_body(raw, 100, 100)
    assert reduced["messages"][0]["parts"][0]["output"]["rows"] == [
        1,
        2,
        1 << 64,
        -9223372036854775809,
    ]
    assert walked  # (the body has the digits: walked, found, read again exactly)
