"""Credential redaction for everything that leaves the process as text (logs, recordings).

Applied by the log tap and the JSONL recorder to every event, and by
:func:`runtime.logging.configure_logging` as a structlog processor to every log line.
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


def redact_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor form of :func:`redact`."""
    return redact(event_dict)
