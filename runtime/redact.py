"""Credential redaction for everything that leaves the process as text.

Two kinds of secrets are replaced by ``[redacted]``:

* **registered secrets**: the exact value of every key a provider was configured with
  (``api_key=``, ``--api-key`` or the SDK's environment variable), registered by the
  provider when it resolves the key (:func:`register_secret`). Whatever its shape, any
  occurrence is replaced: a key without a known prefix (a proxy's, a self-hosted
  server's) would slip past any pattern.
* **key-shaped text**: values that look like credentials: known key prefixes (``sk-``,
  ``gsk_``, ``xai-``, ``AIza``, ``hf_``, ``ghp_``...), ``Bearer`` tokens, and the value of
  an ``Authorization:`` / ``x-api-key:`` / ``api_key=`` header or assignment, the
  password of a URL's user info (``postgresql://user:PW@host``), a user info that is a
  token alone (``https://TOKEN@github.com``, :data:`_TOKEN_USER`); and in
  structured data, the value of any key named like a credential (``api_key``,
  ``authorization``, ``password``...).

The patterns are deliberately narrow, so that normal text survives: a prefixed key needs
16 or more key characters with a digit among them (or 32 without), so ids such as
``call_abc123``, ``msg_...``, ``toolu_...`` or words such as ``sk-learn`` are left alone.

Where it is applied: once, where each error text is made (:class:`~runtime.errors.AxonError`
messages, :class:`~runtime.output.ErrorInfo`, tool error texts), so the ``error`` chunk,
``TurnResult.error``, the web ``errorText``, ``run --jsonl`` and the stored message all
carry the redacted text; and to whole records where they leave the process (the log tap,
the JSONL recorder, the structlog configuration of :func:`runtime.configure_logging`).
A URL that may carry credentials (``--store``, ``--redis``) is printed and logged through
:func:`redact_url`.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

REDACTED = "[redacted]"
"""What a secret is replaced with."""

MIN_SECRET_LENGTH = 8
"""Registered values shorter than this are ignored: no real key is that short, and
replacing every ``test`` or ``dummy`` in all text would mangle it. Not more: API keys
are 20 characters and up, but a password (``DB_PASSWORD``, ``REDIS_PASSWORD``, a
base URL's user info) of 8 to 19 is a real one (8 is the usual least a password may
be, NIST SP 800-63B's); the 8-character placeholder words (``changeme``,
``disabled``) are :data:`PLACEHOLDERS`."""

PLACEHOLDERS = frozenset(
    {
        *("none", "null", "nil", "undefined", "empty", "unset", "notset", "blank"),
        *("notneeded", "notrequired", "notused", "unused", "nokey", "noapikey", "nopassword"),
        *("disabled", "disable", "false", "true", "off", "ignored", "ignore", "anything"),
        *("changeme", "changeit", "replaceme", "placeholder", "fixme", "todo", "tbd"),
        *("dummy", "dummykey", "fake", "fakekey", "test", "testing", "testkey", "secretkey"),
        *("example", "examplekey", "sample", "default", "redacted", "secret", "password"),
        *("passwd", "token", "apikey", "yourapikey", "yourapikeyhere", "yourkey", "yourtoken"),
        *("yourkeyhere", "yoursecret", "yourpassword", "mysecret", "mypassword", "insecure"),
        *("ollama", "lmstudio", "vllm", "local", "localkey", "postgres", "postgresql"),
    }
)
"""Values of a credential variable or option that say there is none, lowered and with
``-``, ``_``, ``.`` and spaces taken out (``not-needed``, ``NOT_NEEDED``): the
local servers' conventions (``OPENAI_API_KEY=not-needed``, ``lm-studio``, ``ollama``),
a template's (``changeme``, ``your-api-key-here``), a switch's (``disabled``), a
development database's (``POSTGRES_PASSWORD=postgres``: registered, every later
``postgres-0.postgres.svc`` logged as ``[redacted].[redacted].svc``). As a
registered secret each was replaced wherever it appeared: a user's message saying
"disabled" reached the log and every error text as ``[redacted]``. A real key or
password is none of these words, and one that is, is no secret."""


def is_secret_value(value: str) -> bool:
    """Whether ``value`` (a configured key, a credential variable's value) is worth
    redacting wherever it appears: :data:`MIN_SECRET_LENGTH` characters or more, not a
    word of :data:`PLACEHOLDERS`, not a template (``<your key>``, ``${KEY}``,
    ``{{ key }}``) and not mostly one character (``xxxxxxxxxxxx``, ``sk-xxxxxxxxxxxxxxxx``,
    ``********``: three quarters of it or more; a random key's commonest character is
    a few percent of it)."""
    if len(value) < MIN_SECRET_LENGTH:
        return False
    if (value[0] == "<" and value[-1] == ">") or value.startswith(("${", "{{")):
        return False
    commonest = max(value.count(c) for c in set(value))
    if commonest * 4 >= len(value) * 3:
        return False
    if value[-1] in "-_" and _key_stub(value):
        return False
    return value.lower().translate(_SEPARATORS) not in PLACEHOLDERS


def _key_stub(value: str) -> bool:
    """Whether ``value`` is a key's known prefix with no key after it (``sk-proj-``,
    ``sk-ant-api03-``, ``github_pat_``: a ``.env`` template's value, the key left out):
    a known prefix (:data:`_PREFIXES`) and less after it than a key's body (16).

    Why: registered, such a stub was matched before the key shapes (the registered
    secrets come first in the pattern), so a real key written after it lost its
    prefix only: ``key sk-proj-AbC...`` logged as ``key [redacted]AbC...``, the key's
    whole secret part shown."""
    head = _key_prefix().match(value)
    return head is not None and len(value) - head.end() < 16


@functools.cache
def _key_prefix() -> re.Pattern[str]:
    """The known key prefixes' pattern (:func:`_key_stub`; compiled when first asked, not
    at import)."""
    return re.compile("|".join(_PREFIXES))


_SEPARATORS = str.maketrans("", "", "-_. ")
"""What a placeholder's spellings put between its words (``not-needed``, ``NOT_NEEDED``,
``your api key``), taken out before :data:`PLACEHOLDERS` is looked in. Only these: with
every character but letters and digits taken out, a real password made of such a word
and a symbol (``Password!``, ``Changeme!``, ``Secret#!``: what a careless user sets, and
a password rule takes) was a placeholder, never registered, and left in every log line
and error text that quoted it."""


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


_key_answers: dict[Any, bool] = {}
"""Keys already asked about, to the answer (a log line's keys are the same few, line
after line): a dictionary look-up, not a call, in :func:`_redact_log_dict`."""
_KEY_ANSWERS_MAX = 1024


def _is_secret_key(key: Any) -> bool:
    answer = _key_answers.get(key)
    if answer is None:
        k = str(key).lower()
        answer = k in _SECRET_KEYS or k.endswith(("_api_key", "_secret", "_password"))
        if len(_key_answers) >= _KEY_ANSWERS_MAX:
            _key_answers.clear()
        _key_answers[key] = answer
    return answer


# A key body: key characters, with a digit among them (random keys have one), or long.
_BODY = r"(?:(?=[A-Za-z_\-]*[0-9])[A-Za-z0-9_\-]{16,}|[A-Za-z0-9_\-]{32,})"
_PREFIXES = (
    r"sk-",  # OpenAI (sk-proj-, sk-svcacct-), Anthropic (sk-ant-), OpenRouter, DeepSeek...
    r"sk_(?:live|test)_",  # Stripe-style
    r"gsk_",  # Groq
    r"xai-",  # xAI
    r"AIza",  # Google
    r"hf_",  # Hugging Face
    r"gh[pousr]_",  # GitHub tokens
    r"github_pat_",
    r"pplx-",  # Perplexity
    r"nvapi-",  # NVIDIA
    r"r8_",  # Replicate
)
_TOKEN_USER = _BODY
"""A URL's user info without a ``:`` is a credential when it is a key body by itself
(:data:`_BODY`: 16 or more key characters with a digit among them, or 32 or more):
``https://<40 hex>@github.com``, ``https://glpat-...@gitlab.com``, a PAT or an OAuth token
given as the user name, as Git's hosts take it. Not a user name: ``git@``, ``postgres@``,
``ec2-user@``, ``john.doe@`` (a ``.``), an e-mail (``%40``) stay readable: a log line
naming who connected is worth reading. Why not 8 (the least registered secret): user
names of 8 to 15 with a digit (``deploy01``, ``svc-build-2024``) are common, tokens that
short are not."""
_HEADER_NAMES = (
    r"proxy-authorization|authorization|x-api-key|api[-_]?key|access[-_]token"
    r"|refresh[-_]token|client[-_]secret|password"
)
_PATTERN_SOURCE = (
    # `Authorization: Basic abc`, `x-api-key: abc`, `"api_key": "abc"`, `api_key=abc`
    rf"(?P<head>\b(?i:{_HEADER_NAMES})[\"']?\s*[:=]\s*[\"']?(?>(?i:(?:basic|bearer|token)\s+)?))"
    rf"(?!{re.escape(REDACTED)})[^\s\"',;&}}]+"
    # `Bearer abc.def-ghi` (OAuth / JWT tokens)
    r"|(?P<bearer>\b(?i:bearer)\s+)"
    r"(?:(?=[A-Za-z._~+/\-]*[0-9])[A-Za-z0-9._~+/\-]{8,}|[A-Za-z0-9._~+/\-]{24,})=*"
    # a key with a known prefix
    rf"|(?<![A-Za-z0-9])(?:{'|'.join(_PREFIXES)}){_BODY}"
    # a URL's user info's password: `postgresql://user:PW@host`, `redis://:PW@host`
    r"|(?P<userinfo>(?<=[A-Za-z0-9+.-])://[^\s/?#@:'\"<>]*:)"
    rf"(?!{re.escape(REDACTED)}@)[^\s/?#'\"<>]+(?=@[^\s/?#@'\"<>])"
    # a URL's user info that is a token alone: `https://TOKEN@github.com`
    rf"|(?P<tokenuser>(?<=[A-Za-z0-9+.-])://){_TOKEN_USER}(?=@[^\s/?#@'\"<>])"
)

_lock = threading.Lock()
_secrets: frozenset[str] = frozenset()
_inert_secrets: tuple[str, ...] = ()
"""The registered secrets made only of :data:`_INERT` characters (normally none): the
only ones a timestamp-shaped text could hold."""
_pattern: re.Pattern[str] | None = None
"""The registered secrets and the key shapes; ``None`` until a secret is registered,
when :func:`_shapes` alone is used."""


@functools.cache
def _shapes() -> re.Pattern[str]:
    """The key shapes' pattern, compiled when text first looks like it holds a secret,
    not at import (half a millisecond of ``import runtime``, issue 24)."""
    return re.compile(_PATTERN_SOURCE)


def register_secret(value: str | None) -> None:
    """Redact every future occurrence of ``value`` (a configured API key), whatever its
    shape. Providers call this when they resolve their key; registering is idempotent
    and lasts for the process. ``None``, non-strings, values shorter than
    :data:`MIN_SECRET_LENGTH` and placeholders (:func:`is_secret_value`) are ignored."""
    register_secrets((value,))


def register_secrets(values: Iterable[str | None]) -> None:
    """:func:`register_secret` of each of ``values``, the pattern compiled once for all
    of them: one by one, each compile held every secret so far, so an environment of
    1,000 variables named like credentials took 14 s of CPU in ``Host.open`` (2,000:
    58 s), quadratic, on the event loop."""
    global _secrets, _pattern, _checked, _inert_secrets
    new: set[str] = set()
    for value in values:
        if not isinstance(value, str):
            continue
        value = value.strip()
        if value in _secrets or not is_secret_value(value):
            continue
        if value in REDACTED * (len(value) // len(REDACTED) + 2):
            continue  # made of the marker itself: replacing it could never finish
        new.add(value)
    if not new:
        return
    with _lock:
        secrets = _secrets | new
        literal = "|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True))
        # Registered secrets first: a pattern must not redact half of one and leave the rest.
        _pattern = re.compile(f"(?P<secret>{literal})(?P<rest>{_KEY_CHARS}*)|{_PATTERN_SOURCE}")
        _secrets = secrets
        _inert_secrets = tuple(s for s in secrets if not s.strip(_INERT))
        _checked = {}  # after _secrets: a reader that sees this dict sees the new secrets


_KEY_CHARS = r"[A-Za-z0-9_\-]"
"""What a key body (:data:`_BODY`) is made of: what a registered secret's match takes
after it (``rest``), to see whether a longer key goes on from it (:func:`_replace`)."""


@functools.cache
def _prefixed_key() -> re.Pattern[str]:
    """A key with a known prefix (:data:`_PREFIXES`), alone (compiled when first asked)."""
    return re.compile(rf"(?<![A-Za-z0-9])(?:{'|'.join(_PREFIXES)}){_BODY}")


def _replace(match: re.Match[str]) -> str:
    if match.lastgroup == "rest":  # the registered secrets' alternative (the last group)
        return _replace_secret(match)
    keep = (
        match.group("head")
        or match.group("bearer")
        or match.group("userinfo")
        or match.group("tokenuser")
        or ""
    )
    return keep + REDACTED


def _replace_secret(match: re.Match[str]) -> str:
    """A registered secret's match: the secret, and the key characters after it
    (``rest``) as far as a prefixed key (:func:`_prefixed_key`) that starts where the
    secret does goes on, the rest as it was (scanned again by :func:`redact_text`'s next
    pass). Why: registered secrets come first in the pattern, so a registered key that
    is the start of a different, longer one (``sk-proj-AbC...`` registered,
    ``sk-proj-AbC...XyZ...`` another key in a tool's error) hid only that start, and the
    longer key's own part was shown."""
    end = match.end("secret")
    rest = match.group("rest")
    if rest:
        longer = _prefixed_key().match(match.string, match.start())
        if longer is not None and longer.end() > end:
            end = longer.end()
        elif not _glued_word(rest):
            end = match.end()
    return REDACTED + match.string[end : match.end()]


def _glued_word(rest: str) -> bool:
    """Whether ``rest``, the key characters (:data:`_KEY_CHARS`) right after a registered
    secret, is a word glued to it, shown as it is, rather than the rest of a longer
    credential the secret starts, hidden with it: lower-case letters only. An SDK
    appends its path to a base URL whose query ends with the key
    (``/v1?key=Kchat/completions``: ``chat``); a credential's own characters nearly
    always hold a digit, a capital, ``-`` or ``_`` (a random base-62 tail of 8 holds
    none of them once in 1,000). Why: a registered secret with no known prefix that
    starts a longer one (``abcd1234efgh5678`` registered, ``abcd1234efgh5678XYZ9...`` in
    a 401) hid only itself, and no key shape said where the longer one ended."""
    return rest.isalpha() and rest.islower()


# Lower-case substrings one of which every pattern match contains: a cheap test that lets
# ordinary text (every streamed delta passes through here) skip the regex entirely. (A
# URL's user info contains `://` and `@`: searched for apart, at the end of `_scan`.)
_TRIGGERS = (
    *("sk-", "sk_", "gsk_", "xai-", "aiza", "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    *("github_pat_", "pplx-", "nvapi-", "r8_", "bearer", "authoriz", "apikey", "api_key"),
    *("api-key", "token", "secret", "password"),
)


_FOLDS = (("\u017f", "s"), ("\u0131", "i"), ("\u0130", "i"), ("\u212a", "k"))
"""The letters the patterns' case-insensitive parts match as ASCII ones (``re`` folds
the long s U+017F to ``s``, the dotless i U+0131 and the dotted capital I U+0130 to
``i``, the Kelvin sign U+212A to ``k``) but ``str.lower`` does not make ASCII: without
them, ``password=...`` spelled with two long s matched the patterns but not the
triggers, and was left as it was. Replaced one by one (:func:`_folded`), not by
``str.translate``: with a table, that looks each character up in a dict, 1.8 ms for the
44,000 characters of a 10,000-delta answer (the log line of its finished turn), 0.18 us
a delta; four scans for four letters take microseconds (issue 24 goal 1)."""


def _folded(text: str) -> str:
    """``text`` with each letter of :data:`_FOLDS` as its ASCII one (what
    ``str.translate`` with those pairs gives: none of them becomes another of them)."""
    for letter, ascii_letter in _FOLDS:
        if letter in text:
            text = text.replace(letter, ascii_letter)
    return text


_checked: dict[str, bool] = {}
"""Short strings already tested, to the answer: a log line's ids, kinds and words come
back line after line.
A new dict whenever a secret is registered, so no answer outlives the secrets it saw."""
_CHECKED_LENGTH = 256
_CHECKED_MAX = 8192

SHORTEST_MATCH = 8
"""No text shorter than this can hold a secret: the shortest any pattern matches is 8
characters (``apikey=x``), and so is the shortest registered secret
(:data:`MIN_SECRET_LENGTH`). Such text is neither tested nor remembered."""
_INERT = "0123456789-:.TZ"
"""Characters none of the key shapes (nor :data:`_TRIGGERS`) can be made of: a text of
only these (a timestamp, every log line has a new one; a date, a number) can hold only a
registered secret of only these (:data:`_inert_secrets`), so it is not scanned, nor
remembered (one new entry a line would soon flush the ids and words that do repeat)."""


def _may_hold_secret(text: str) -> bool:
    size = len(text)
    if size > _CHECKED_LENGTH:
        return _scan(text)
    if size < SHORTEST_MATCH:
        return False
    cache = _checked  # before the secrets (see register_secret)
    found = cache.get(text)
    if found is None:
        if not text.strip(_INERT):
            inert = _inert_secrets
            return bool(inert) and any(secret in text for secret in inert)
        found = _scan(text)
        if len(cache) >= _CHECKED_MAX:
            cache.clear()
        cache[text] = found
    return found


_WORD_TRIGGERS = tuple(t for t in _TRIGGERS if "_" not in t and "-" not in t)
_UNDERSCORE_TRIGGERS = tuple(t for t in _TRIGGERS if "_" in t)
_DASH_TRIGGERS = tuple(t for t in _TRIGGERS if "-" in t and "_" not in t)
""":data:`_TRIGGERS` by the separator they hold: a text without ``_`` (or ``-``) can
hold none of those that do, so a long text is searched for 7 to 12 of them, not 23 (a
search each, a pass over the text: prose rarely holds an underscore)."""


def _fold(text: str) -> str:
    """``text`` lowered as far as :data:`_TRIGGERS` (ASCII) are concerned: each of
    them is in the result exactly when it is in ``_folded(text).lower()``.

    Only two letters outside ASCII lower to ASCII (U+0130, U+212A, both folded), and no
    Latin-1 letter lowers to more than one, so a Latin-1 text's ASCII letters lowered
    by ``bytes.lower`` (the others left as they are) give the same trigger matches as
    ``str.lower``, at a tenth of its cost (1.5 against 12-20 us for the benchmark's
    4.4 KB reply: ``str.lower`` looks each non-ASCII character up)."""
    if text.isascii():
        return text.lower()
    for letter, _ in _FOLDS:  # none in a Latin-1 text
        if letter in text:
            return _folded(text).lower()
    try:
        return text.encode("latin-1").lower().decode("latin-1")
    except UnicodeEncodeError:  # beyond Latin-1
        return text.lower()


def _scan(text: str) -> bool:
    for secret in _secrets:
        if secret in text:
            return True
    low = _fold(text)
    for trigger in _WORD_TRIGGERS:
        if trigger in low:
            return True
    if "_" in low:
        for trigger in _UNDERSCORE_TRIGGERS:
            if trigger in low:
                return True
    if "-" in low:
        for trigger in _DASH_TRIGGERS:
            if trigger in low:
                return True
    # a URL's user info (:data:`_PATTERN_SOURCE`): a text without `://` pays this search
    return "://" in text and "@" in text


def redact_text(text: str) -> str:
    """``text`` with every registered secret and key-shaped value replaced."""
    if not isinstance(text, str) or not _may_hold_secret(text):
        return text
    pattern = _pattern or _shapes()
    text, count = pattern.subn(_replace, text)
    # A replacement next to leftover characters can form a new occurrence of a
    # registered secret (a secret that starts with ``d]``): repeat until nothing changes.
    # Every pass that changes something consumes original characters, so this ends.
    while count:
        text, count = pattern.subn(_replace, text)
    return text


def redact(value: Any) -> Any:
    """``value`` with credentials replaced, recursively: the value of any key named like
    a credential (``api_key``, ``authorization``...), and in every string, what
    :func:`redact_text` replaces."""
    kind = type(value)
    if kind is str:
        return redact_text(value)
    if kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, str):  # a subclass
        return redact_text(value)
    if isinstance(value, dict):
        return {k: (REDACTED if _is_secret_key(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def redacted_str(value: Any) -> str:
    """``str(value)`` redacted, for a JSON encoder's ``default`` (an object it cannot
    encode is written as its text): :func:`redact` leaves objects as they are, so the
    text an object makes of itself was written unredacted (a recorded event, a span's
    content). An object whose ``__str__`` raises is written as
    ``<exception str() failed>``-like text naming its class, never raising in turn."""
    try:
        text = str(value)
    except Exception:  # RecursionError included
        return f"<{type(value).__name__}: str() failed>"
    return redact_text(text)


_URL_HEAD = r"[A-Za-z][A-Za-z0-9+.-]*://"
_QUERY_PAIR = r"(?<=[?&;])(?P<key>[^=&;?#/]*)=(?P<value>[^&;]*)"
"""Both compiled on first use (``re.compile`` caches them), not on import: this module is
part of the contract, whose import time is issue 24's start-up figure."""
_AUTHORITY = r"[^/?#]*"
"""A URL's authority as RFC 3986 has it: up to the first ``/``, ``?`` or ``#``."""
_HOST_PORT = r"(?:\[[^\]]*\]|[^:@\[\]]*)(?::[0-9]+)?"
"""An authority without user info: a host (``[::1]`` too) and a port. In a URL quoted in
a text (:func:`redact_urls`), an authority of this shape with an ``@`` later
(``http://h:8080/@scope/pkg``: a path's ``@``) has no user info: the port is no password
(both compiled on first use)."""
_SECRET_WORDS = ("pass", "secret", "token", "auth", "key", "credential")
"""A URL query parameter whose name holds one of these is a credential (libpq's
``password``, ``sslpassword``; Redis's ``password``; any ``*token*``, ``*key*``...)."""


def _credential_spans(url: str, *, quoted: bool = False) -> list[tuple[int, int]]:
    """Where ``url``'s credentials are, as ``(start, end)`` offsets, merged and in order:
    the user info's password (or a token alone), and the value of each query parameter
    named like one. ``quoted``: see :func:`_user_info_end`."""
    head = re.compile(_URL_HEAD).match(url)
    if head is None:
        return []
    start = head.end()
    spans: list[tuple[int, int]] = []
    at = _user_info_end(url, start, quoted=quoted) if "@" in url else -1
    colon = url.find(":", start, max(at, start))
    if colon >= 0:
        spans.append((colon + 1, at))
    elif at > start and re.compile(_TOKEN_USER).fullmatch(url, start, at):
        spans.append((start, at))  # a token alone: `https://TOKEN@host`
    for pair in re.compile(_QUERY_PAIR).finditer(url, start):
        name = urllib.parse.unquote_plus(pair.group("key")).lower()
        if _is_secret_key(name) or any(word in name for word in _SECRET_WORDS):
            spans.append(_registered_head(url, *pair.span("value")))
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((begin, end))
    return merged


def _user_info_end(url: str, start: int, *, quoted: bool) -> int:
    """Where the user info of ``url`` (its authority starting at ``start``) ends, ``-1``
    for none: the last ``@`` of the authority (:data:`_AUTHORITY`); with none there, the
    last ``@`` of the URL (a password holding ``/``, ``?`` or ``#`` unencoded: an ``@``
    later in the URL then hides a little more than the password, better than a little
    less), unless the authority is a host and a port alone (:data:`_HOST_PORT`):
    ``http://h:8080/@x``'s port was redacted as a password. A URL the process was given
    (``--store``, ``--redis``, a ``base_url``: not ``quoted``) first takes the last
    ``@`` before its first ``/``: ``user:12345?@db`` is a password of digits and ``?``
    (libpq reads it so), which the host and port rule would show. Why the rule for
    those too: a provider's ``base_url`` of ``http://proxy:8080/v1/@scope/`` registered
    ``8080/v1/`` (:func:`register_url_secrets`), and every text naming
    ``localhost:8080/v1/`` lost it. Quoted in a text, a configured URL's password is
    registered and hidden anyway."""
    authority = re.compile(_AUTHORITY).match(url, start)
    end = len(url) if authority is None else authority.end()
    at = url.rfind("@", start, end)
    if at >= 0:
        return at
    if not quoted:  # a password holding `?` or `#` (libpq reads the user info up to a `/`)
        slash = url.find("/", start)
        at = url.rfind("@", start, len(url) if slash < 0 else slash)
        if at >= 0:
            return at
    if re.compile(_HOST_PORT).fullmatch(url, start, end):
        return -1
    return url.rfind("@", start)


def redact_user_info(url: str) -> str:
    """``url`` with its whole user info (user name and password) replaced by
    ``[redacted]``: ``https://[redacted]@host/x``. For a URL that a third party sent and
    that goes where it need not log in (the A2A tool's line for a file part, which the
    model reads): who the remote agent logs in as is no more the model's business than
    its password. Anything else (a text that is no ``scheme://`` URL) as it is."""
    head = re.compile(_URL_HEAD).match(url) if isinstance(url, str) else None
    if head is None:
        return url
    at = _user_info_end(url, head.end(), quoted=True)
    return url if at < 0 else f"{url[: head.end()]}{REDACTED}{url[at:]}"


def _registered_head(url: str, begin: int, end: int) -> tuple[int, int]:
    """``(begin, end)``, or as far as the longest registered secret the value begins
    with, when one does and the value goes on with a word (:func:`_glued_word`) or no
    key character: an SDK appends its path to a base URL whose query ends with the key
    (``/v1?key=Kchat/completions``), and the whole rest, path included, was redacted as
    the key's. A value that goes on with other key characters (``?key=KQ7x2``: a longer
    credential the secret starts) is hidden whole."""
    value = url[begin:end]
    if value in _secrets:
        return begin, end
    heads = [len(s) for s in _secrets if value.startswith(s)]
    if not heads:
        return begin, end
    head = begin + max(heads)
    glued = re.compile(_KEY_CHARS + "+").match(url, head, end)
    return (begin, head) if glued is None or _glued_word(glued.group()) else (begin, end)


def redact_url(url: str) -> str:
    """``url`` (a PostgreSQL, Redis or any ``scheme://`` URL) fit to print or log: every
    credential it can carry replaced by ``[redacted]``.

    * the password of the user info (``user:PW@``, ``:PW@``), taken to run from the
      first ``:`` to the authority's last ``@`` (an ``@`` in it unencoded is hidden
      too), or to the last ``@`` before the first ``/`` when the authority has none (a
      password holding ``?`` or ``#``), or to the URL's last ``@`` (one holding ``/``),
      but never past a host and a port alone (``http://h:8080/@x``: :func:`_user_info_end`);
    * a user name that is a token alone (``https://TOKEN@host``: :data:`_TOKEN_USER`);
    * the value of every query parameter named like a credential (libpq's
      ``?password=`` and ``sslpassword=``, Redis's ``?password=``, ``token``, ``*key*``);
    * then whatever :func:`redact_text` hides (registered secrets, ``password=`` in a
      non-URL string such as a libpq ``key=value`` string given where a path goes).

    The user name, hosts, ports, database and the other parameters stay readable.
    """
    if not isinstance(url, str):
        return REDACTED
    return _redact_url(url, quoted=False)


def _redact_url(url: str, *, quoted: bool) -> str:
    out: list[str] = []
    last = 0
    for begin, end in _credential_spans(url, quoted=quoted):
        out += [url[last:begin], REDACTED]
        last = end
    out.append(url[last:])
    return redact_text("".join(out))


def _redact_quoted_url(match: re.Match[str]) -> str:
    return _redact_url(match.group(), quoted=True)


_URL_IN_TEXT = r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+"
"""A ``scheme://`` URL inside a text, up to a space, a quote or an angle bracket
(compiled on first use, as :data:`_URL_HEAD`)."""


def redact_urls(text: str) -> str:
    """``text`` with each ``scheme://`` URL in it redacted as :func:`redact_url` does
    (its user info's password, its query's credential-named values; but a host and a
    port before a path's ``@`` are no user info: :func:`_user_info_end`), then whatever
    :func:`redact_text` hides: a log line of an HTTP client (``HTTP Request: POST
    https://user:PW@host/v1?key=...``), a driver's error that quotes a DSN. The rest
    of the URL (scheme, user, host, port, path, other parameters) stays readable."""
    if not isinstance(text, str):
        return text
    if "://" in text:
        text = re.compile(_URL_IN_TEXT).sub(_redact_quoted_url, text)
    return redact_text(text)


_HEADER_PAIR = (
    r"(?P<name>b?'[A-Za-z0-9_.-]+'|b?\"[A-Za-z0-9_.-]+\")(?P<sep>\s*[,:=]\s*)"
    r"(?P<value>b?'(?:[^'\\]|\\.)*'|b?\"(?:[^\"\\]|\\.)*\")"
)
"""A header as Python writes it in an HTTP client's debug line: a quoted name, then
``,`` (a tuple: httpcore's ``(b'set-cookie', b'sid=...')``), ``:`` (a dictionary:
httpx's ``Headers({'set-cookie': ...})``, an SDK's request options' ``'headers'``) or
``=`` (hpack's ``Adding b'cookie'=b'...'``), then its quoted value (compiled on first
use, as :data:`_URL_HEAD`)."""
_HEADER_WORDS = (
    "pass",
    "secret",
    "token",
    "auth",
    "key",
    "credential",
    "cookie",
    "session",
    "signature",
)
"""A header whose name holds one of these as a word (:func:`_header_words`) carries a
credential: ``authorization``, ``proxy-authorization``, ``x-api-key``,
``x-goog-api-key``, ``cookie``, ``set-cookie``, ``x-auth-token``,
``x-amz-security-token``, ``x-session-id``... (not an SDK's ``idempotency_key``: a
retry's id, kept for reading the log)."""
_PASSWORD_WORDS = ("password", "passwd", "passphrase", "passcode")
"""What a header name's word holds to name a password (``pass`` alone too): not
``passthrough`` or ``bypass``."""
_HEADER_WORD_SPLIT = r"[^a-z0-9]+"
"""What separates a header name's words (``-``, ``_``, ``.``, ``:``...; compiled on first
use)..."""
_CAMEL = r"(?<=[a-z0-9])(?=[A-Z])"
"""...and where a camel-cased name's next word starts (``XApiKey``, ``authToken``)."""


def _header_words(name: str) -> frozenset[str]:
    """The words of :data:`_HEADER_WORDS` that ``name``'s words (split at anything but a
    letter or digit, lowered) are, begin or end with: ``apikey``, ``xapikey``,
    ``accesstoken``, ``sessionid``, ``setcookie``, ``password``, ``oauth``,
    ``authorization``, ``authenticate``. Not ``author``, ``authorship``, ``authority``
    (HTTP/2's ``:authority``, a host) or ``passthrough``: as substrings (``auth`` in
    ``x-author``) their values were redacted and registered (``X-Author: Jane Doe``
    hid ``Jane Doe`` everywhere)."""
    found = set()
    for word in re.split(_HEADER_WORD_SPLIT, re.sub(_CAMEL, " ", name).lower()):
        for base in _HEADER_WORDS:
            if base == "auth":
                head = word.startswith("auth") and (
                    word.startswith("authoriz") or not word.startswith("author")
                )
                if head or word.endswith("auth"):
                    found.add(base)
            elif base == "pass":
                if word == "pass" or any(p in word for p in _PASSWORD_WORDS):
                    found.add(base)
            elif word.startswith(base) or word.endswith((base, base + "s")):
                found.add(base)
    return frozenset(found)


def is_credential_header(name: str) -> bool:
    """Whether an HTTP header named ``name`` carries a credential: one of its words is
    one of :data:`_HEADER_WORDS` (:func:`_header_words`: ``Authorization``,
    ``X-Auth-Token``, ``X-Goog-Api-Key``, ``Ocp-Apim-Subscription-Key``,
    ``Private-Token``, ``Cookie``...; not ``X-Author``), not ``idempotency`` (an SDK's
    retry id). Wider than :func:`is_secret_key` (the names of a JSON field): a client
    given such headers registers their values (:func:`register_secret`)."""
    return "idempotency" not in name.lower() and bool(_header_words(name))


_AUTH_SCHEMES = frozenset(
    {"bearer", "basic", "token", "digest", "negotiate", "ntlm", "dpop", "mac", "apikey"}
    | {"api-key", "key", "sso-key", "aws4-hmac-sha256"}
)
"""The words before a credential in a header's value (``Bearer <token>``,
``sso-key <key>``): the word after them is registered too (:func:`header_secrets`)."""

_TOKEN_SHAPE = r"(?:(?=[^0-9]*[0-9])[A-Za-z0-9._~+/=\-]{16,}|[A-Za-z0-9._~+/=\-]{32,})"
"""A token as a header carries it: 16 or more token characters (base64's ``+/=`` too)
with a digit among them, or 32 or more (:data:`_BODY`, wider)."""

_STRONG_HEADER_WORDS = frozenset(_HEADER_WORDS) - {"session", "signature"}
"""The words of :data:`_HEADER_WORDS` that make any value of the header a credential;
the others (``session``, ``signature``) name headers that often carry none."""


def header_secrets(name: Any, value: Any) -> tuple[str, ...]:
    """What to register (:func:`register_secrets`) for a header ``name: value`` a client
    is given (an A2A agent's ``headers``, a provider's ``extra_headers``): nothing
    unless the header carries a credential (:func:`is_credential_header`); the value,
    and the token after an auth scheme (``Bearer <token>``, :data:`_AUTH_SCHEMES`) or
    after any first word when the rest is one token (:data:`_TOKEN_SHAPE`). A header
    named only by ``session`` or ``signature`` is registered only when its value is a
    token: ``Helicone-Session-Name: Customer Support``, ``Helicone-Session-Path:
    /support/chat``, ``X-Signature-Method: HMAC-SHA256`` are labels, and registered they
    were hidden in every log line and error text that named them (the words after a
    first one too: ``My Chatbot Session`` registered ``Chatbot Session``). ``bytes``
    (httpx takes them) are read as Latin-1."""
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(name, str) or not isinstance(value, str):
        return ()
    if not is_credential_header(name):
        return ()
    value = value.strip()
    token = re.compile(_TOKEN_SHAPE).fullmatch
    if _header_words(name).isdisjoint(_STRONG_HEADER_WORDS):
        return (value,) if token(value) else ()
    scheme, _, rest = value.partition(" ")
    rest = rest.strip()
    if rest and (scheme.lower() in _AUTH_SCHEMES or token(rest)):
        return (value, rest)
    return (value,)


def _header_value(match: re.Match[str]) -> str:
    if not is_credential_header(match.group("name").lstrip("b").strip("'\"")):
        return match.group()
    value = match.group("value")
    opening = value[: value.index(value[-1]) + 1]  # b' or '
    return f"{match.group('name')}{match.group('sep')}{opening}{REDACTED}{value[-1]}"


def redact_header_pairs(text: str) -> str:
    """``text`` (an HTTP client's debug line) with the value of each header named like
    a credential (:data:`_HEADER_WORDS`) replaced, wherever Python's ``repr`` wrote it
    as a quoted name and a quoted value (:data:`_HEADER_PAIR`), then :func:`redact_urls`.
    httpcore's ``receive_response_headers.complete`` lists the response's headers (a
    server's ``set-cookie``, a token it echoes), the Anthropic SDK's ``HTTP Response``
    line too and its ``Request options`` line the request's extra headers: at ``DEBUG``,
    an application's root handler got them as they were."""
    if "'" in text or '"' in text:
        text = re.compile(_HEADER_PAIR).sub(_header_value, text)
    return redact_urls(text)


def register_url_secrets(url: str) -> None:
    """Register the credentials ``url`` carries (:func:`register_secret`, as written and
    percent-decoded), so that they are redacted wherever they turn up later: in a
    driver's error text that quotes part of the URL, in a traceback. Stores and relays
    call this when they open a URL."""
    register_secrets(_url_credentials(url))


def _url_credentials(url: str) -> list[str]:
    """What :func:`register_url_secrets` registers: each credential span as written and
    decoded, but not a password equal to the URL's own user name
    (``postgresql://postgres:postgres@db/x``, ``minioadmin:minioadmin``: a development
    default). The user name is shown wherever the URL is (:func:`redact_url` hides the
    password field by its place, not by this), so registering it hid nothing the URL
    does not show, and every later ``postgres-0.postgres.svc`` logged as
    ``[redacted].[redacted].svc``."""
    if not isinstance(url, str):
        return []
    head = re.compile(_URL_HEAD).match(url)
    colon = -1 if head is None else url.find(":", head.end())
    found = []
    for begin, end in _credential_spans(url):
        value = url[begin:end]
        if head is not None and begin == colon + 1 and _same_user(url[head.end() : colon], value):
            continue
        found += [value, urllib.parse.unquote_plus(value)]
    return found


def _same_user(user: str, password: str) -> bool:
    """Whether a URL's ``password`` is its ``user`` (as written or percent-decoded)."""
    return user == password or urllib.parse.unquote(user) == urllib.parse.unquote(password)


_ENV_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials"}
)
"""A word of an environment variable's name (split at ``_``) that makes its value a secret
(``OPENAI_API_KEY``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``)..."""
_ENV_PLACES = frozenset({"file", "filename", "path", "dir", "home"})
"""...unless its last word says it names a place (``SSL_KEY_FILE``: a path, not a key)...
"""
_ENV_ABOUT = frozenset(
    {
        *("url", "uri", "endpoint", "host", "hostname", "port", "region", "prefix", "suffix"),
        *("name", "type", "header", "algorithm", "alg", "size", "bits", "length", "ttl"),
        *("expiry", "lifetime", "timeout", "mode", "format", "version", "scope", "scopes"),
        *("audience", "issuer", "backend", "provider", "enabled", "disabled"),
    }
)
"""...or a setting about the credential, not the credential: ``OAUTH_TOKEN_URL`` (where
to ask for one), ``CACHE_KEY_PREFIX``, ``API_KEY_HEADER``, ``TOKEN_PROVIDER``. Their
values are ordinary text (a URL without credentials, a word such as ``production``), and
registered they were replaced by ``[redacted]`` in every error text, the model's next
request, the stored result and the log: ``connection to [redacted] refused``."""


def is_secret_env_name(name: str) -> bool:
    """Whether the environment variable ``name`` holds a credential, by its words."""
    words = name.lower().split("_")
    last = words[-1]
    return (
        last not in _ENV_PLACES
        and last not in _ENV_ABOUT
        and not _ENV_SECRET_WORDS.isdisjoint(words)
    )


def register_env_secrets(environ: Mapping[str, str] | None = None) -> None:
    """Register (:func:`register_secret`) the value of each environment variable named
    like a credential (:func:`is_secret_env_name`), and the credentials of each one
    whose value is a URL (``DATABASE_URL``, ``http_proxy``: :func:`register_url_secrets`).
    A tool whose exception quotes its service's token from the environment, or a
    library's error that quotes ``DATABASE_URL``, had that text go to the model, the
    stored result, the stream and the log as it was: no key shape, never registered
    (a provider's own variable only once its client was built). The host does this as
    it opens; short values and placeholders (:func:`is_secret_value`) are ignored:
    ``OPENAI_API_KEY=not-needed`` for a local server is no secret."""
    env = os.environ if environ is None else environ
    found: list[str] = []
    for name, value in list(env.items()):
        if not isinstance(value, str):
            continue
        if is_secret_env_name(name):
            found.append(value)
        if "://" in value:
            found += _url_credentials(value)
    register_secrets(found)


_PLAIN = (str, int, float, bool, type(None), dict, list, tuple)


def _redact_log_value(value: Any) -> Any:
    kind = type(value)  # every log line's every field comes here: the common types first
    if kind is str:
        return redact_text(value)
    if kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, dict):
        return _redact_log_dict(value)
    if isinstance(value, (list, tuple)):
        return [_redact_log_value(v) for v in value]
    if not isinstance(value, _PLAIN):  # an exception or object would be rendered by str()
        return redacted_str(value)  # anyway (one whose str() raises: said so, not raised)
    return redact_text(value) if isinstance(value, str) else value


def _redact_log_dict(value: Mapping[Any, Any]) -> dict[Any, Any]:
    """:func:`_redact_log_value` of a mapping, with the common values (strings, numbers,
    ``None``: nearly all of a line's) handled here rather than in a call each, and a key
    or string already found clean by a look-up, not a call (issue 24)."""
    out: dict[Any, Any] = {}
    keys = _key_answers
    clean = _checked  # before the secrets (see register_secret)
    inert = _inert_secrets
    for k, v in value.items():
        kind = type(v)
        secret = keys.get(k)
        if secret is None:
            secret = _is_secret_key(k)
        if secret:
            out[k] = REDACTED
        elif kind is str:
            if len(v) < SHORTEST_MATCH or clean.get(v) is False:
                out[k] = v  # "info", "stop", a step's name (never remembered); a known id
            elif not inert and not v.strip(_INERT):
                out[k] = v  # the line's timestamp: what _may_hold_secret says, in line
            else:
                out[k] = redact_text(v)
        elif v is None or kind is int or kind is float or kind is bool:
            out[k] = v
        else:
            out[k] = _redact_log_value(v)
    return out


def redact_processor(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> dict[str, Any]:
    """A structlog processor: every log line leaves with its credentials redacted (objects,
    such as an exception passed as a field, are rendered with ``str`` first)."""
    return _redact_log_dict(event_dict)


def _dirty(value: Any) -> bool:
    """Whether :func:`_redact_log_value` could make of ``value`` anything but what renders
    as ``value`` itself (JSON: a tuple is the list it would become): a key named like a
    credential, a text that may hold a secret, a value that is not plain JSON. Only
    looks, never builds: a line's nested values (``usage``, a message) are nearly always
    clean, and a new dictionary for each was most of their redaction (issue 24)."""
    kind = type(value)
    if kind is str:
        return _may_hold_secret(value)
    if value is None or kind is int or kind is float or kind is bool:
        return False
    if kind is dict:
        keys = _key_answers
        clean = _checked  # before the secrets (see register_secret)
        for k, v in value.items():
            secret = keys.get(k)
            if secret is None:
                secret = _is_secret_key(k)
            if secret:
                return True
            kind = type(v)
            if kind is str:
                if len(v) >= SHORTEST_MATCH and clean.get(v) is not False and _may_hold_secret(v):
                    return True
            elif not (v is None or kind is int or kind is float or kind is bool) and _dirty(v):
                return True
        return False
    if kind is list or kind is tuple:
        for v in value:
            if _dirty(v):
                return True
        return False
    return True  # a subclass, an object: the processor's own way


def redact_log_line(line: dict[Any, Any], *, plain_keys: bool = False) -> dict[Any, Any]:
    """:func:`redact_processor`'s answer for ``line``, made in ``line`` itself: the values
    that change are replaced, the others left where they are: the same keys, order and
    values as the processor's new dictionary (a clean nested tuple stays a tuple: the
    same JSON). For a line its caller built and owns (the log tap's, issue 24): no
    second dictionary of a dozen keys a line, and a nested value (``usage``, a message)
    is redacted into a new one only if it needs to be (:func:`_dirty`), never changed
    in place. ``plain_keys``: the caller knows that no key of ``line`` is named like a
    credential (:func:`is_secret_key`; the log tap, of an event class's fields), so
    they are not looked up (nested keys still are)."""
    clean = _checked  # before the secrets (see register_secret)
    inert = _inert_secrets
    if not plain_keys:
        keys = _key_answers
        for k in line:
            secret = keys.get(k)
            if secret is None:
                secret = _is_secret_key(k)
            if secret:
                line[k] = REDACTED  # an existing key: the dictionary's size does not change
    for k, v in line.items():
        kind = type(v)
        if kind is str:
            if len(v) < SHORTEST_MATCH or clean.get(v) is False:
                continue
            if not inert and not v.strip(_INERT):
                continue
            redacted = redact_text(v)
            if redacted is not v:
                line[k] = redacted
        elif v is None or kind is int or kind is float or kind is bool:
            continue
        elif _dirty(v):
            line[k] = _redact_log_value(v)
    return line


def is_secret_key(key: Any) -> bool:
    """Whether a value under ``key`` is redacted whole, whatever it is (``api_key``,
    ``authorization``, ``*_password``...)."""
    return _is_secret_key(key)


def timestamps_are_clean() -> bool:
    """Whether a text of only digits and ``-:.TZ`` (a log line's time stamp) is sure to
    be left as it is by :func:`redact_text`: no registered secret is made of those
    characters only (:data:`_INERT`), as none normally is."""
    return not _inert_secrets
