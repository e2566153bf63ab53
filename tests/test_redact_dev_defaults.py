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
    header_secrets,
    is_credential_header,
    redact_header_pairs,
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


@pytest.mark.parametrize(
    "name",
    ["X-Author", "Authorship", "X-Author-Id", ":authority", "X-Passthrough-Mode", "X-Cache-Bypass"],
)
def test_a_header_naming_an_author_or_authority_is_no_credential_header(name):
    assert not is_credential_header(name)
    assert header_secrets(name, "Jane Doe 0123456789abcdef") == ()
    line = f"headers: {{'{name.lower()}': 'Jane Doe'}}"
    assert redact_header_pairs(line) == line


@pytest.mark.parametrize(
    "name",
    [
        *("Authorization", "Proxy-Authorization", "cf-aig-authorization", "X-Auth-Token"),
        *("Helicone-Auth", "WWW-Authenticate", "X-OAuth", "apikey", "X-Api-Key", "api_key"),
        *("X-Goog-Api-Key", "X-Portkey-Api-Key", "Ocp-Apim-Subscription-Key", "XApiKey"),
        *("Private-Token", "X-Amz-Security-Token", "X-Csrf-Token", "X-Client-Secret"),
        *("Cookie", "Set-Cookie", "X-Session-Id", "X-Signature", "X-Password", "Passwd"),
        *(
            "X-Credentials",
            "X-Access-Token",
            "AccessToken",
            "sessionid",
            "X-Authtoken",
            "authToken",
        ),
    ],
)
def test_a_header_named_by_a_credential_word_is_still_a_credential_header(name):
    assert is_credential_header(name)
    line = f"headers: {{'{name.lower()}': 'v-0123456789abcdef'}}"
    assert redact_header_pairs(line) == f"headers: {{'{name.lower()}': '{REDACTED}'}}"


def test_an_idempotency_key_is_still_no_credential_header():
    assert not is_credential_header("Idempotency-Key")
