"""The PostgreSQL store's URL: Axon's own query parameters (``schema``, ``pooler``,
``listen_host``, ``listen_port``) taken out of what goes to libpq, and the URL redacted
for messages (:class:`~actors.stores.postgres.PostgresStore` reads it through these)."""

from __future__ import annotations

import re
import urllib.parse
from typing import Final

from runtime.errors import ConfigurationError
from runtime.redact import redact_url as _redact_url

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def parse_url(url: str) -> tuple[str, str]:
    """Split ``postgresql://...?schema=NAME`` into a libpq URL and the schema name.

    ``schema``, ``pooler``, ``listen_host`` and ``listen_port`` are Axon's own query
    parameters (libpq does not know them), so they are taken out here
    (:func:`parse_pooler` and :func:`parse_listen` read the others); everything else
    goes to libpq as written. Raises :class:`~runtime.errors.ConfigurationError` for
    anything that is not a PostgreSQL URL or names an unusable schema.
    """
    libpq, schema, _ = _split_url(url)
    return libpq, schema


def parse_pooler(url: str) -> bool:
    """Whether ``url`` says the server is reached through a transaction-pooling proxy
    (``?pooler=transaction``: PgBouncer's ``pool_mode = transaction``, and the like):
    then no connection keeps anything between transactions (no prepared statement, no
    ``SET``, no ``LISTEN``; :data:`POOLER_HINT`)."""
    return _split_url(url)[2]


POOLER_HINT: Final = "docs/deployment.md#behind-pgbouncer"
"""Where the documentation of ``?pooler=transaction`` is."""


def _split_url(url: str) -> tuple[str, str, bool]:
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        raise ConfigurationError(
            f"not a PostgreSQL URL: {url!r} (expected postgresql://[user@]host[:port]/dbname)"
        )
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    poolers = [value for key, value in query if key == "pooler"]
    schema = schemas[-1] if schemas else "public"
    if _SCHEMA_NAME.fullmatch(schema) is None:
        raise ConfigurationError(
            f"invalid schema {schema!r} in {redact_url(url)}: use lowercase letters, digits "
            "and '_' (at most 63)"
        )
    pooler = poolers[-1] if poolers else "none"
    if pooler not in ("none", "session", "transaction"):
        raise ConfigurationError(
            f"invalid pooler {pooler!r} in {redact_url(url)}: 'transaction' (PgBouncer's "
            f"pool_mode = transaction), or 'none' ({POOLER_HINT})"
        )
    # The other parameters go to libpq as they were written: re-encoded, a space
    # (``options=-c%20TimeZone%3DUTC``) became ``+``, which libpq does not decode
    # (``unrecognized configuration parameter "+TimeZone"``: the store never opened).
    kept = "&".join(
        item
        for item in parts.query.split("&")
        if item and urllib.parse.unquote_plus(item.split("=", 1)[0]) not in _OWN_PARAMETERS
    )
    libpq = urllib.parse.urlunsplit(parts._replace(query=kept))
    return libpq, schema, pooler == "transaction"


_OWN_PARAMETERS = ("schema", "pooler", "listen_host", "listen_port")
"""The URL's query parameters Axon takes for itself: libpq never sees them."""


def parse_listen(url: str) -> str | None:
    """The libpq URL of the worker's ``LISTEN`` connection: the store's own; behind a
    transaction pooler (``?pooler=transaction``) none (workers poll), unless the URL
    names the server itself with ``listen_host`` and/or ``listen_port`` (the pooler's
    host and port replaced by them, the rest as the store's: user, database,
    password)."""
    libpq, _, pooled = _split_url(url)
    query = urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True)
    direct = [
        (key[len("listen_") :], value)
        for key, value in query
        if key in ("listen_host", "listen_port")
    ]
    if not direct:
        return None if pooled else libpq
    return (
        libpq
        + ("&" if "?" in libpq else "?")
        + urllib.parse.urlencode(direct, quote_via=urllib.parse.quote)
    )


def redact_url(url: str) -> str:
    """``url`` without its credentials (the user info's password, ``?password=``,
    ``sslpassword=``...), for error messages and logs: :func:`runtime.redact.redact_url`."""
    return _redact_url(url)
