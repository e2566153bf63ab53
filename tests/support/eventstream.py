"""AWS event-stream frames, as Bedrock's ``invoke-with-response-stream`` sends them.

Written from the format AWS documents (and ``botocore.eventstream`` decodes): each
message is a prelude (total length and headers length, big-endian ``uint32`` each, then
the CRC32 of those 8 bytes), the headers (name length ``uint8``, name, value type ``uint8``
(7: string), value length ``uint16``, value), the payload, and the CRC32 of everything
before it. Bedrock's ``chunk`` events carry ``{"bytes": base64(one Messages API event)}``
plus a random-length ``"p"`` padding field; its errors are ``exception`` messages naming
the exception (``:exception-type``) with ``{"message": ...}``.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

STRING = 7


def _headers(headers: dict[str, str]) -> bytes:
    out = bytearray()
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        out += struct.pack(">B", len(raw_name)) + raw_name
        out += struct.pack(">BH", STRING, len(raw_value)) + raw_value
    return bytes(out)


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message, prelude and both CRCs included."""
    head = _headers(headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def chunk(event: dict[str, Any]) -> bytes:
    """A Bedrock ``chunk`` event carrying one Messages API streaming event."""
    data = base64.b64encode(json.dumps(event).encode()).decode()
    payload = json.dumps({"bytes": data, "p": "abcdefghij"}).encode()
    return message(
        {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
        payload,
    )


def exception(name: str, text: str) -> bytes:
    """A Bedrock error frame (``throttlingException``, ``internalServerException``...)."""
    payload = json.dumps({"message": text}).encode()
    return message(
        {
            ":exception-type": name,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        payload,
    )


def bedrock_stream(*events: dict[str, Any]) -> bytes:
    """The body of a Bedrock stream of these Messages API events."""
    return b"".join(chunk(e) for e in events)
