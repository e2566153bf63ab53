""":func:`runtime.redact.redact_text` (every log line's every text, every error text)
hides a URL's user info password, registered or not: a log line quoting an unregistered
DSN (``postgresql://user:PW@host/db``, ``redis://:PW@host``) kept the password. A text
without ``://`` pays one substring search for it. benchmarks/journal/pipeline.md
("logs3")."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from runtime import redact
from runtime.logging import get_logger
from runtime.redact import REDACTED, redact_text

SCHEMES = st.from_regex(r"[a-z][a-z0-9+.-]{0,10}", fullmatch=True)
USERS = st.from_regex(r"[A-Za-z0-9._~-]{0,10}", fullmatch=True)
PASSWORDS = st.from_regex(r"[A-Za-z0-9!$%&()*+,;=._~:@-]{1,24}", fullmatch=True)
"""Unreserved, sub-delims, ``:``, an ``@`` left unencoded (the last ``@`` ends it)."""
HOSTS = st.from_regex(r"[a-z0-9.]{1,20}(:[0-9]{1,5})?", fullmatch=True)
AROUND = st.text(max_size=60)


@given(AROUND, SCHEMES, USERS, PASSWORDS, HOSTS, AROUND)
def test_a_urls_password_anywhere_in_a_text_is_redacted(before, scheme, user, pw, host, after):
    assume(pw not in REDACTED and pw.strip("@:") == pw)
    text = f"{before} {scheme}://{user}:{pw}@{host}/db {after}"
    assume(text.count(pw) == 1)
    assert pw not in redact_text(text)


@given(SCHEMES, HOSTS, st.from_regex(r"[a-z0-9/@]{0,30}", fullmatch=True))
def test_a_url_without_user_info_is_left_as_it_is(scheme, host, path):
    url = f"see {scheme}://{host}/{path} now"  # `/@name` paths (medium.com/@user) included
    assert redact_text(url) == url


def test_a_log_line_quoting_an_unregistered_dsn_keeps_no_password(logs):
    stream, _ = logs
    get_logger("test").info("db.retry", detail="redis://:pw-of-redis-8818@cache:6379/0 down")
    line = stream.getvalue()
    assert "pw-of-redis-8818" not in line and "redis://:[redacted]@cache:6379/0 down" in line


class Searched(str):
    """A text that records what it is searched for (``x in text``)."""

    def __init__(self, _text: str) -> None:
        self.sought: list[str] = []

    def __contains__(self, part: object) -> bool:
        self.sought.append(str(part))
        return super().__contains__(part)  # type: ignore[operator]


def test_a_text_without_a_scheme_pays_one_search_for_user_info():
    """Past the registered secrets, the only search on the text itself (the key shapes'
    are on its folded copy) is for ``://``: not for ``@``."""
    text = Searched("an answer of plain prose, long enough to skip the cache; " * 6)
    redact_text(text)
    assert text.sought[len(redact._secrets) :] == ["://"]
