"""Signed tool approvals for the AI SDK's ``POST /api/chat`` (docs/approval.md).

The ``ai`` package (6.0.221 and 7.0.16 on) copies a ``tool-approval-request`` chunk's
``signature`` into the tool part's ``approval`` object and sends it back with the
person's answer; the AI SDK's own server (``experimental_toolApprovalSecret``) signs
the request with an HMAC and verifies it on the replay, because it keeps nothing
between requests and must not run a call a client made up.

Axon keeps the waiting call in the store, and every answer is checked against it
(:mod:`runtime.app.web.answers`), so a signature is not what makes an approval
genuine here. What it adds, with a secret configured (``serve --approval-secret-file``,
``$AXON_APPROVAL_SECRET_FILE``, ``--approval-secret`` or ``$AXON_APPROVAL_SECRET``, the
same on every front end of a worker deployment): a
signature names the session, the approval, the call, its tool and a digest of the
input exactly as the store held them when the request was streamed, under a key no
client has. An answer that carries one is recorded only if it verifies against the
stored call now: an answer made for another session's or another deployment's call,
or for an input the store no longer holds (an answer whose part sends no input is
otherwise checked on its ids alone), is refused (403) and nothing is recorded.
An answer without one (an older client, a client that keeps no approval metadata) is
checked against the store as before, unless the server requires signatures
(``--require-approval-signature``: refused, 403). With no secret nothing is signed and a signature
a client sends is not checked (there is no key to check it with).

The signature is derived, never stored: the stream, a resumed stream and the session's
``ui_messages`` (a reloaded page) all give the same one, so a rotated secret only
refuses the answers of pages that hold a signature made with the old one (a reload
gets a new one). No per-process random default: a signature one front end made would
not verify on another, nor after a restart, and a refusal could not tell that from a
forgery.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import attrs
import orjson

from runtime.serde import utf8_dumps

DOMAIN = "axon-tool-approval-v1"
"""The first field of every signed payload: a signature is good for nothing else."""

SECRET_ENV = "AXON_APPROVAL_SECRET"
"""The environment variable ``serve`` reads the secret from (``--approval-secret``)."""

SECRET_FILE_ENV = "AXON_APPROVAL_SECRET_FILE"
"""The environment variable naming the file ``serve`` reads the secret from
(``--approval-secret-file``)."""

SECRET_SOURCES = f"--approval-secret-file, --approval-secret, ${SECRET_FILE_ENV} or ${SECRET_ENV}"
"""Where ``serve`` takes the secret from, as messages name them."""

REQUIRE_ENV = "AXON_REQUIRE_APPROVAL_SIGNATURE"
"""The environment variable that turns ``serve --require-approval-signature`` on."""

SIGNING_CLIENTS = "ai 6.0.221 or later, ai 7.0.16 or later"
"""The ``ai`` packages that send a request's ``signature`` back with their answer."""


SIGNATURE_MAX = 256
"""The longest ``signature`` looked at: every signature made is 43 characters (base64url
of 32 bytes); a longer one, up to the body's limit, is refused unread."""


def canonical(value: Any) -> Any:
    """``value`` as the digest sees it: numbers as the doubles a JavaScript client and a
    JSON store hold them in (``1`` and ``1.0`` are one number; PostgreSQL's ``jsonb``
    gives either back), so the input the store returns digests as the one it was given.
    An integer past 2**53 is the double it rounds to, as the client holds it too."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        try:
            f = float(value)
        except OverflowError:  # (an integer past any double)
            return str(value)
        return int(f) if f.is_integer() and abs(f) <= 2**53 else f
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return str(value)


def input_digest(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON (keys sorted), base64url without padding."""
    data = utf8_dumps(canonical(value), option=orjson.OPT_SORT_KEYS)
    return _b64(hashlib.sha256(data).digest())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@attrs.frozen(slots=True, kw_only=True)
class ApprovalSigner:
    """Signs approval requests and checks signatures sent back, with one secret."""

    secret: bytes = attrs.field(repr=False)
    required: bool = False
    """Whether an answer to an approval must carry a signature (``serve
    --require-approval-signature``): one without is refused (403) instead of being
    checked against the store alone."""

    @classmethod
    def of(cls, secret: str | bytes | None, *, required: bool = False) -> ApprovalSigner | None:
        """The signer of ``secret`` (text as UTF-8); ``None`` for none or an empty one.
        ``required`` without a secret is a ``ValueError``: nothing would be signed, so
        every answer would be refused."""
        if not secret:
            if required:
                raise ValueError(
                    "requiring signed approvals needs a secret to sign them with "
                    f"({SECRET_SOURCES})"
                )
            return None
        secret = secret.encode() if isinstance(secret, str) else secret
        return cls(secret=secret, required=required)

    def sign(
        self, session_id: str, approval_id: str, tool_call_id: str, tool_name: str, input: Any
    ) -> str:
        """The signature of the request for call ``tool_call_id`` (``tool_name`` with
        ``input``) that waits for ``approval_id`` in session ``session_id``."""
        payload = utf8_dumps(
            [DOMAIN, session_id, approval_id, tool_call_id, tool_name, input_digest(input)]
        )
        return _b64(hmac.new(self.secret, payload, hashlib.sha256).digest())

    def verify(
        self,
        signature: str,
        session_id: str,
        approval_id: str,
        tool_call_id: str,
        tool_name: str,
        input: Any,
    ) -> bool:
        """Whether ``signature`` is the one :meth:`sign` gives these (constant time:
        :func:`hmac.compare_digest`). One longer than :data:`SIGNATURE_MAX` is none,
        refused before any digest or copy of it is made."""
        if len(signature) > SIGNATURE_MAX:
            return False
        expected = self.sign(session_id, approval_id, tool_call_id, tool_name, input)
        return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace"))


@attrs.frozen(slots=True, kw_only=True)
class SessionSigner:
    """An :class:`ApprovalSigner` for one session: what an encoder and a continuation's
    checks are given (the session is part of every signature)."""

    signer: ApprovalSigner
    session_id: str

    @property
    def required(self) -> bool:
        """Whether an answer without a signature is refused (:attr:`ApprovalSigner.required`)."""
        return self.signer.required

    def sign(self, approval_id: str, tool_call_id: str, tool_name: str, input: Any) -> str:
        return self.signer.sign(self.session_id, approval_id, tool_call_id, tool_name, input)

    def verify(
        self, signature: str, approval_id: str, tool_call_id: str, tool_name: str, input: Any
    ) -> bool:
        return self.signer.verify(
            signature, self.session_id, approval_id, tool_call_id, tool_name, input
        )


def for_session(signer: ApprovalSigner | None, session_id: str) -> SessionSigner | None:
    """``signer`` bound to ``session_id`` (``None`` without a signer)."""
    return None if signer is None else SessionSigner(signer=signer, session_id=session_id)


__all__ = [
    "REQUIRE_ENV",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "SECRET_SOURCES",
    "SIGNING_CLIENTS",
    "ApprovalSigner",
    "SessionSigner",
    "canonical",
    "for_session",
    "input_digest",
]
