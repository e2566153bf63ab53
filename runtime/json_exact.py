"""JSON with integers past 64 bits kept exact, orjson on the fast path.

orjson writes no integer outside [-2**63, 2**64) (``TypeError: Integer exceeds 64-bit
range``) and reads one as a float (``123456789012345678901234567890`` is
``1.2345678901234568e+29``); JSON has no such limit, nor has Python, a model's tool call
(read with ``json.loads``) or a tool's return value. The fallbacks here run only when
orjson refused, or when the data may hold such a number. A module of its own, with no
import of the contract's classes, so that a contract module writing JSON exactly
(``runtime.approval``, ``runtime.results``) builds neither the converter of
:mod:`runtime.serde` (which re-exports these names) nor the lifecycle events at import.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

MAX_DEPTH = 1000
"""How deep :func:`without_lone_surrogates` goes: what :func:`orjson.loads` (its limit is
1024) reads back, with room for the levels a message adds around its values."""


BIG_INT_MARK = b"\t"
"""What :func:`dumps` writes before each integer past 64 bits: a tab, JSON whitespace,
which orjson never writes (it writes no whitespace and escapes a control character in a
string). So :func:`loads` knows, with one byte search, that JSON this process's kind wrote
holds such an integer and must be read again exactly."""
_MARK_TEXT = "\t"
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
"""The integers orjson writes and reads exactly."""
_FLOAT_PAST = float(1 << 63)
"""The magnitude from which orjson may have read an integer as a float (-2**63 - 1 reads
as ``-9.223372036854776e18``, which is -2**63)."""


def dumps(
    value: Any, default: Any = None, option: int | None = None, *, marked: bool = True
) -> bytes:
    """``orjson.dumps(value, default=default, option=option)``, but an integer past 64 bits
    written exactly (after :data:`BIG_INT_MARK`, unless not ``marked``: JSON text that
    leaves the process, a call's arguments as a client reads them) where orjson refuses
    it. Only a value orjson refused for that is walked (:func:`with_big_ints`); any other
    refusal is raised."""
    try:
        return orjson.dumps(value, default=default, option=option)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
    try:
        walked = with_big_ints(value, BIG_INT_MARK if marked else b"")
    except (RecursionError, ValueError):  # (orjson's error class: "not JSON" to callers)
        raise TypeError("nested too deeply") from None
    return orjson.dumps(walked, default=default, option=option)


def with_big_ints(value: Any, mark: bytes = BIG_INT_MARK, depth: int = 0) -> Any:
    """``value`` (JSON values) with each integer past 64 bits an ``orjson.Fragment`` of its
    digits after ``mark`` (a dict key past 64 bits: its digits as text, as a JSON key
    is). ``ValueError`` past :data:`MAX_DEPTH` levels."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    kind = type(value)
    if kind is int:
        if INT_MIN <= value <= INT_MAX:
            return value
        return orjson.Fragment(mark + str(value).encode())
    if isinstance(value, dict):
        return {
            (str(k) if type(k) is int and not INT_MIN <= k <= INT_MAX else k): with_big_ints(
                v, mark, depth + 1
            )
            for k, v in value.items()
        }
    if kind is list or kind is tuple:
        return [with_big_ints(v, mark, depth + 1) for v in value]
    return value


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``orjson.loads(data)`` of JSON this process's kind wrote (a store's, a relay's),
    read again exactly by the standard library's reader when :func:`dumps` marked an
    integer past 64 bits in it (:data:`BIG_INT_MARK`, one byte search)."""
    value = orjson.loads(data)
    if isinstance(data, str):
        marked = _MARK_TEXT in data
    elif isinstance(data, memoryview):  # (its ``in`` compares items: never a match)
        marked = BIG_INT_MARK in data.tobytes()
    else:
        marked = BIG_INT_MARK in data
    return _read_exactly(data, value) if marked else value


def exact(value: Any, data: bytes | bytearray | memoryview | str) -> Any:
    """``value``, what ``orjson.loads(data)`` read of JSON from outside (a client's body, a
    model's or a server's JSON text), or ``data`` read again by the standard library's
    reader when ``value`` holds a float from which orjson may have lost an integer past
    64 bits (an integral float of 2**63 or more: ``1e19`` written so reads the same
    again). For a caller that cannot know who wrote ``data``: it walks ``value``, so only
    for values read once a request or a call, not a stream's deltas."""
    return _read_exactly(data, value) if lost_int(value) else value


def exact_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``orjson.loads(data)`` with :func:`exact`: JSON from outside, integers exact."""
    return exact(orjson.loads(data), data)


def lost_int(value: Any) -> bool:
    """Whether ``value`` (what orjson read) holds an integral float of magnitude 2**63 or
    more: what orjson makes of an integer past 64 bits. Nested past Python's stack (or
    :data:`MAX_DEPTH`): not looked at deeper, ``False`` (orjson's value kept)."""
    try:
        return _lost_int(value, 0)
    except RecursionError:
        return False


def _lost_int(value: Any, depth: int) -> bool:
    kind = type(value)
    if kind is float:
        return bool((value >= _FLOAT_PAST or value <= -_FLOAT_PAST) and value.is_integer())
    if depth > MAX_DEPTH:
        return False
    if kind is dict:
        for v in value.values():
            if type(v) in _WALKED and _lost_int(v, depth + 1):
                return True
    elif kind is list:
        for v in value:
            if type(v) in _WALKED and _lost_int(v, depth + 1):
                return True
    return False


_WALKED = (dict, list, float)


def _read_exactly(data: bytes | bytearray | memoryview | str, value: Any) -> Any:
    """``data`` read by the standard library's reader (integers of any size), which orjson
    read as ``value``: the same JSON (no NaN, no lone surrogate: orjson took it). Nested
    past Python's stack: ``value``, as orjson read it."""
    try:
        return json.loads(bytes(data) if isinstance(data, memoryview | bytearray) else data)
    except (ValueError, RecursionError):
        return value
