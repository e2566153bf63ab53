"""``runtime.serde.utf8_text``: a text's halves of a character checked without writing it
as UTF-8 (issue 24 goal 1), with the same answer as that check."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.serde import utf8_text


def _by_utf8(text: str) -> str:
    """What ``utf8_text`` answered when it checked by encoding to UTF-8."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class _Noted(str):
    """A text that notes the encodings it is written in."""

    encodings: list[str]

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        self.encodings.append(encoding)
        return str(self).encode(encoding, errors)


def test_a_non_ascii_text_is_checked_without_being_written_as_utf8() -> None:
    text = _Noted("21°C, light wind " * 50)
    text.encodings = []
    assert utf8_text(text) is text
    assert text.encodings and "utf-8" not in text.encodings


def test_texts_of_each_width_without_halves_come_back_as_they_are() -> None:
    for text in ("café", "it\u2019s 21°C", "sunny \U0001f600 today", "ÿ" * 300, ""):
        assert utf8_text(text) is text


def test_halves_are_joined_or_replaced_as_the_utf8_check_did() -> None:
    for text in ("a\ud83d", "\ude00b", "a\ud83d\ude00b", "°\udfff", "\U0001f600\udc00x"):
        assert utf8_text(text) == _by_utf8(text)
    assert utf8_text("x\ud83d\ude00") == "x\U0001f600"
    assert utf8_text("x\ud83d") == "x\ufffd"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=40))
def test_every_text_gets_the_utf8_check_s_answer(text: str) -> None:
    assert utf8_text(text) == _by_utf8(text)
