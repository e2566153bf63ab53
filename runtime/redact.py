"""Credential redaction for everything that leaves the process as text (logs, recordings).

Applied at the source, once: by the log tap and the JSONL recorder to every event, and by
the runtime's own log calls to the error text they carry. Doing it where the text is made,
not in a structlog processor, keeps it in force under any structlog configuration.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_SECRET_KEYS = frozenset(
    {
        "api_key",
        "apikey",
        "authorization",
        "x-api-key",
        "api-key",
        "token",
        "access_token",
        "refresh_token",
        "password",
        "secret",
        "client_secret",
        "proxy-authorization",
        "cookie",
    }
)


@functools.lru_cache(maxsize=1024)
def _is_secret_key(key: Any) -> bool:
    k = str(key).lower()
    return k in _SECRET_KEYS or k.endswith(("_api_key", "_secret", "_password"))


_SECRET_VALUE = re.compile(
    r"(?i)\b(sk-[A-Za-z0-9_\-]{6,}|sk-ant-[A-Za-z0-9_\-]{6,}|bearer\s+[^\s\"']+)"
)


def redact(value: Any) -> Any:
    """Replace credential-like values anywhere in ``value``: values of keys such as
    ``api_key`` or ``authorization``, and strings that look like keys (``sk-…``,
    ``Bearer …``)."""
    if isinstance(value, dict):
        return {k: ("[redacted]" if _is_secret_key(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str) and ("sk-" in value or "earer" in value):
        return _SECRET_VALUE.sub("[redacted]", value)
    return value
