"""A provider's absolute resets (``anthropic-ratelimit-*-reset``, an HTTP-date
``retry-after``) are read against the response's own ``Date``, the provider's clock that
wrote them: a worker whose clock is an hour behind would otherwise pause every worker's
calls of the configuration for an hour (the pause is shared, actors/relays/limits.py)."""

from __future__ import annotations

import pytest

from runtime.ratelimit import parse_rate_headers

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
DATE = "Thu, 01 Jan 2026 00:00:00 GMT"  # the same instant, as the provider's Date says


@pytest.mark.parametrize("skew", [-3600.0, 3600.0])
def test_an_absolute_reset_is_read_against_the_providers_date(skew):
    headers = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:30Z",
        "date": DATE,
    }
    assert parse_rate_headers(headers, now_epoch=NOW + skew) == 30.0


def test_an_http_date_retry_after_is_read_against_the_providers_date():
    headers = {"retry-after": "Thu, 01 Jan 2026 00:00:12 GMT", "date": DATE}
    assert parse_rate_headers(headers, now_epoch=NOW - 3600) == 12.0


def test_a_malformed_date_leaves_this_clock_to_read_them():
    headers = {"retry-after": "Thu, 01 Jan 2026 00:00:12 GMT", "date": "yesterday"}
    assert parse_rate_headers(headers, now_epoch=NOW) == 12.0
