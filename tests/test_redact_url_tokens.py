"""A URL's user info beyond ``user:PW@`` (benchmarks/journal/pipeline.md, "urlcreds"):
a token given alone as the user name (``https://TOKEN@github.com``) was kept by
:func:`runtime.redact.redact_text` and ``redact_urls``, while ``git@`` and ``postgres@``
must stay readable; ``redact_urls`` took the port of ``http://h:8080/@x`` for a password;
a registered secret that is the start of a longer, different key hid only that start."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from runtime import redact as redaction
from runtime.redact import (
    REDACTED,
    redact_text,
    redact_url,
    redact_urls,
    redact_user_info,
    register_secret,
)
from tests.test_redact import isolated_secrets
from tests.test_redact_url_userinfo import AROUND, SCHEMES

HOSTS = st.from_regex(r"[a-z0-9]{1,12}(\.[a-z]{2,5})?(:[0-9]{1,5})?", fullmatch=True)
TOKENS = st.one_of(
    st.from_regex(r"(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{16,48}", fullmatch=True),
    st.from_regex(r"[A-Za-z_-]{32,48}", fullmatch=True),
)
"""A token as Git hosts take it for a user name: 16+ key characters with a digit, or 32+."""
NAMES = st.one_of(
    st.from_regex(r"[A-Za-z0-9_-]{1,15}", fullmatch=True),
    st.from_regex(r"[a-z]{1,31}", fullmatch=True),
    st.from_regex(r"[a-z]{1,12}\.[a-z0-9]{1,20}", fullmatch=True),
    st.from_regex(r"[a-z]{1,12}%40[a-z]{1,12}\.[a-z]{2,3}", fullmatch=True),
)
"""User names: short ones, letters alone, ``first.last2024``, an e-mail (``%40``)."""
PATHS = st.from_regex(r"[a-z0-9/@._-]{0,30}", fullmatch=True)


@given(AROUND, SCHEMES, TOKENS, HOSTS, AROUND)
def test_a_token_alone_as_a_urls_user_is_redacted(before, scheme, token, host, after):
    text = f"{before} {scheme}://{token}@{host}/org/repo.git {after}"
    assume(text.count(token) == 1)
    assert token not in redact_text(text)
    assert token not in redact_urls(text)


@given(SCHEMES, NAMES, HOSTS, PATHS)
def test_a_user_name_that_is_no_token_is_left_as_it_is(scheme, name, host, path):
    text = f"cloning {scheme}://{name}@{host}/{path} now"
    assert redact_text(text) == text
    assert redact_urls(text) == text


def test_git_over_ssh_and_a_github_token_user_side_by_side():
    text = "ssh://git@github.com/o/r.git or https://0a1b2c3d4e5f60a1b2c3d4e5f60a1b2c3d4e5f6@github.com/o/r"
    assert redact_text(text) == f"ssh://git@github.com/o/r.git or https://{REDACTED}@github.com/o/r"


def test_a_token_user_in_a_url_is_registered_with_it():
    with isolated_secrets():
        redaction.register_url_secrets("https://glpat-Ab12Cd34Ef56Gh78Ij90@gitlab.example/o/r")
        assert "glpat-Ab12Cd34Ef56Gh78Ij90" in redaction._secrets


@given(
    st.from_regex(r"[a-z0-9.]{1,20}|\[[0-9a-f:]{2,12}\]", fullmatch=True),
    st.from_regex(r"[0-9]{1,5}", fullmatch=True),
    st.from_regex(r"[a-z0-9]{0,8}(/[a-z0-9]{0,8})?@[a-z0-9@/]{0,12}", fullmatch=True),
)
def test_a_port_before_a_paths_at_sign_is_no_password(host, port, path):
    text = f"see http://{host}:{port}/{path} now"
    assert redact_urls(text) == text


def test_a_urls_password_ends_at_the_authoritys_at_sign_not_a_paths():
    text = "GET http://reader:pw-of-files-7@h:8080/@team/x failed"
    assert redact_urls(text) == f"GET http://reader:{REDACTED}@h:8080/@team/x failed"


def test_a_password_holding_a_slash_unencoded_is_still_hidden_whole():
    assert redact_urls("postgresql://u:pa/ss@db/x") == f"postgresql://u:{REDACTED}@db/x"


def test_a_registered_key_followed_by_a_path_keeps_the_path():
    with isolated_secrets():
        register_secret("Kq7pLm2nXr8sTv4w")
        text = "POST /v1?key=Kq7pLm2nXr8sTv4wchat/completions"
        assert redact_text(text) == f"POST /v1?key={REDACTED}chat/completions"


def test_the_whole_user_info_of_a_third_partys_url_is_replaced():
    url = "https://reader:pw-of-files-7@files.example:8443/r.pdf?x=1"
    assert redact_user_info(url) == f"https://{REDACTED}@files.example:8443/r.pdf?x=1"


def test_a_url_without_user_info_is_kept_by_redact_user_info():
    for url in ("https://files.example:8443/@team/r.pdf", "not a url", "http://[::1]:80/x"):
        assert redact_user_info(url) == url


@pytest.mark.parametrize(
    ("redact", "secret", "text", "hidden"),
    [
        pytest.param(
            redact_text,
            "sk-proj-AbCdEfGh12345678",
            "401 for sk-proj-AbCdEfGh12345678ZyXw9876VuTs5432 (rotated)",
            f"401 for {REDACTED} (rotated)",
            id="a longer key",
        ),
        pytest.param(
            redact_text,
            "abcd1234efgh5678",
            "401: token abcd1234efgh5678XYZ9qw-e_rt is invalid",
            f"401: token {REDACTED} is invalid",
            id="a longer unprefixed credential",
        ),
        pytest.param(
            redact_urls,
            "abcd1234efgh5678",
            "https://proxy.example/v1?key=abcd1234efgh5678Q7x2&model=m",
            f"https://proxy.example/v1?key={REDACTED}&model=m",
            id="a query value that goes on",
        ),
    ],
)
def test_a_registered_secret_that_starts_a_longer_credential_hides_it_whole(
    redact, secret, text, hidden
):
    """The start of a longer, different key: the rest is not shown either."""
    with isolated_secrets():
        register_secret(secret)
        assert redact(text) == hidden


@pytest.mark.parametrize(
    ("user", "hidden"),
    [
        ("abcdefghijklmn1", False),  # 15 with a digit: a user name (`svc-build-2024`)
        ("abcdefghijklmno1", True),  # 16 with a digit: a token
        ("abcdefghijklmnopqrstuvwxyzabcde", False),  # 31 letters: a user name
        ("abcdefghijklmnopqrstuvwxyzabcdef", True),  # 32: a token
        ("ghp_abc123", False),  # a known prefix, too short for a real token (40)
        ("sk-abc123", False),
        ("git", False),
        ("postgres", False),
        ("ec2-user", False),
        ("deploy01", False),
        ("first.last2024", False),
        ("jo%40example.com", False),
    ],
)
def test_a_token_alone_as_a_urls_user_is_hidden_from_16_key_characters_with_a_digit(user, hidden):
    """The boundary of :data:`runtime.redact._TOKEN_USER`, the same for a URL quoted in
    a text (``redact_text``, ``redact_urls``), a configured one (``redact_url``) and
    what opening it registers: a short fake token (``ghp_abc123``) is kept, as every
    user name of that length is; no real token is that short."""
    url = f"https://{user}@git.example/o/r"
    shown = f"https://{REDACTED}@git.example/o/r" if hidden else url
    assert redact_text(f"clone {url}") == f"clone {shown}"
    assert redact_urls(f"clone {url}") == f"clone {shown}"
    assert redact_url(url) == shown
    assert redaction._url_credentials(url) == ([user, user] if hidden else [])


@pytest.mark.parametrize(
    ("url", "shown", "registered"),
    [
        ("https://user:8080@host/v1", f"https://user:{REDACTED}@host/v1", ["8080", "8080"]),
        ("https://host:8080/v1", "https://host:8080/v1", []),
        ("http://proxy.example:8080/v1/@scope/", "http://proxy.example:8080/v1/@scope/", []),
        ("postgresql://user:00000?@db/x", f"postgresql://user:{REDACTED}@db/x", ["00000?"] * 2),
        ("redis://:pa#ss-1@cache:6379/0", f"redis://:{REDACTED}@cache:6379/0", ["pa#ss-1"] * 2),
    ],
)
def test_a_configured_urls_port_is_no_password_and_its_password_is(url, shown, registered):
    """A configured URL (a provider's ``base_url``, ``--store``): a port is never a
    password, whether or not an ``@`` comes in the path after it, and a password of
    digits is one, as in a text (``redact_text`` agrees on each). The third (an ``@`` in
    its path) registered ``8080/v1/`` as a secret: every text naming
    ``localhost:8080/v1/`` was redacted from then on."""
    assert redact_url(url) == shown
    assert redaction._url_credentials(url) == registered
    if "?" not in url and "#" not in url:
        assert redact_text(url) == shown
