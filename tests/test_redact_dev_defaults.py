"""Two false positives of the secret redaction (benchmarks/journal/workers.md,
"attackmerge", Found, left): a development database URL's password equal to its user
name (``postgres:postgres@``) was registered, and every later ``postgres-0.postgres.svc``
logged as ``[redacted].[redacted].svc``; a header named ``X-Author`` counted as a
credential header (its name holds ``auth``)."""

from __future__ import annotations

import pytest

from runtime import redact as redaction
from runtime.redact import (
    REDACTED,
    redact_text,
    redact_url,
    redact_urls,
    register_env_secrets,
    register_url_secrets,
)
from tests.test_redact import isolated_secrets

LINE = "pod postgres-0.postgres.svc ready: postgres_fdw loaded"


@pytest.mark.parametrize(
    ("url", "user"),
    [
        ("postgresql://postgres:postgres@db:5432/app", "postgres"),
        ("postgresql://minioadmin:minioadmin@db/app", "minioadmin"),
        ("postgresql://jo%40x.io:jo%40x.io@db/app", "jo%40x.io"),
    ],
)
def test_a_urls_password_equal_to_its_user_name_is_hidden_in_the_url_not_registered(url, user):
    with isolated_secrets():
        before = redaction._secrets
        register_url_secrets(url)
        assert redaction._secrets == before
        assert redact_text(f"pod {user}-0.{user}.svc ready") == f"pod {user}-0.{user}.svc ready"
        shown = url.replace(f":{user}@", f":{REDACTED}@")
        assert redact_url(url) == shown
        assert redact_urls(f"open {url} failed") == f"open {shown} failed"
        assert redact_text(f"open {url} failed") == f"open {shown} failed"


def test_the_development_database_password_postgres_is_no_secret_from_the_environment():
    with isolated_secrets():
        register_env_secrets({"POSTGRES_PASSWORD": "postgres", "DB_PASSWORD": "postgresql"})
        assert redact_text(LINE) == LINE
        url = "postgresql://app:postgres@db/app"
        register_url_secrets(url)
        assert redact_text(LINE) == LINE
        assert redact_url(url) == f"postgresql://app:{REDACTED}@db/app"


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("postgresql://postgres:Password!@db/app", "Password!"),
        ("postgresql://app:app12345@db/app", "app12345"),
        ("postgresql://postgres:postgres1@db/app", "postgres1"),
    ],
)
def test_a_weak_password_other_than_its_user_name_is_still_registered(url, password):
    with isolated_secrets():
        register_url_secrets(url)
        assert redact_text(f"auth failed with {password} x") == f"auth failed with {REDACTED} x"
