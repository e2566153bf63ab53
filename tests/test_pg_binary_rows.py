"""A lane answer's row in PostgreSQL's binary format, read (``postgres_rows.read_row``):
each column as psycopg reads it, a claim's and a last save's answers (~15 columns, two a
worker's turn) without a Python call a column (issue 24 goal 3)."""

from __future__ import annotations

import struct
import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.stores.postgres_rows import read_row

KINDS = ("TEXT", "BIGINT", "INTEGER", "BOOLEAN", "DOUBLE PRECISION", "BYTEA", "TEXT")


class _Result:
    """A binary-format result of one row (``None``: SQL NULL)."""

    def __init__(self, values: list[bytes | None]) -> None:
        self.values = values

    def get_value(self, row: int, col: int) -> bytes | None:
        return self.values[col]


def _binary(text: str, big: int, small: int, flag: bool, real: float, raw: bytes) -> list[Any]:
    return [
        text.encode(),
        struct.pack("!q", big),
        struct.pack("!i", small),
        b"\x01" if flag else b"\x00",
        struct.pack("!d", real),
        raw,
        None,
    ]


@given(
    st.text(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(),
)
def test_each_column_reads_as_psycopg_reads_it(
    text: str, big: int, small: int, flag: bool, real: float, raw: bytes
) -> None:
    got = read_row(_Result(_binary(text, big, small, flag, real, raw)), 0, KINDS)
    assert got == (text, big, small, flag, real, raw, None)
    assert type(got[5]) is bytes


def test_text_integer_and_bytea_columns_are_read_without_a_python_call_each() -> None:
    result = _Result([*_binary("é", -5, 7, True, 1.5, b"\x00")[:3], b"x", b"y"])
    calls: list[str] = []

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.endswith("postgres_rows.py"):
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        got = read_row(result, 0, ("TEXT", "BIGINT", "INTEGER", "BYTEA", "TEXT"))
    finally:
        sys.setprofile(None)
    assert got == ("é", -5, 7, b"x", "y")
    assert calls == ["read_row"]
