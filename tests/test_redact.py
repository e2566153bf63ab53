"""Redaction: registered keys of any shape and key-shaped text never survive; ids do."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import structlog
from hypothesis import example, given
from hypothesis import strategies as st

from runtime import redact as redaction
from runtime.errors import AuthenticationFailed
from runtime.logging import configure_logging
from runtime.output import ErrorInfo
from runtime.protocol import ToolOutcome
from runtime.redact import REDACTED, redact, redact_text, register_secret


@contextmanager
def isolated_secrets() -> Iterator[None]:
    """Registrations made inside are forgotten after: the registry is process-wide."""
    saved = redaction._secrets, redaction._pattern
    try:
        yield
    finally:
        redaction._secrets, redaction._pattern = saved


# -- registered secrets ------------------------------------------------------------------


@given(
    secret=st.text(min_size=redaction.MIN_SECRET_LENGTH, max_size=40).filter(
        lambda s: s == s.strip()
    ),
    before=st.text(max_size=40),
    after=st.text(max_size=40),
)
@example(secret="d]xxxxxx", before="[redacte", after="xxxxxx")  # re-forms after a replacement
@example(secret="acted][r", before="[red", after="edacted]")  # made of the marker itself
def test_a_registered_secret_embedded_anywhere_never_survives(secret, before, after):
    with isolated_secrets():
        register_secret(secret)
        clean = redact_text(before + secret + after + secret)
    assert secret not in clean or secret in REDACTED * (len(secret) // len(REDACTED) + 2)


def test_a_registered_secret_without_any_known_prefix_is_replaced():
    with isolated_secrets():
        register_secret("letmein.proxy.credential")
        assert redact_text("401: bad key letmein.proxy.credential!") == "401: bad key [redacted]!"


def test_short_registered_values_are_ignored_so_common_words_survive():
    with isolated_secrets():
        register_secret("test")
        register_secret(None)
        assert redact_text("a test of the dummy") == "a test of the dummy"


# -- key-shaped text ---------------------------------------------------------------------

_KEY_CHARS = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


@given(
    prefix=st.sampled_from(["sk-", "sk-ant-api03-", "sk-proj-", "gsk_", "xai-", "AIza", "hf_"]),
    body=_KEY_CHARS.filter(lambda s: len(s) >= 15),
    digit=st.sampled_from("0123456789"),
    before=st.text(max_size=30),
    sep=st.sampled_from([" ", ": ", "'", '"', "=", "(", "\n"]),
)
def test_keys_with_a_known_prefix_are_replaced_wherever_they_stand(
    prefix, body, digit, before, sep
):
    key = prefix + digit + body
    assert key not in redact_text(f"{before}{sep}{key}{sep[::-1]} more text")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc123def456ghi", "Authorization: Bearer [redacted]"),
        ("authorization: Basic dXNlcjpwYXNzd29yZA==", "authorization: Basic [redacted]"),
        ("x-api-key: plainvalue", "x-api-key: [redacted]"),
        ('{"api_key": "plainvalue", "n": 1}', '{"api_key": "[redacted]", "n": 1}'),
        ("url?api_key=plainvalue&x=1", "url?api_key=[redacted]&x=1"),
        ("token Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "token Bearer [redacted]"),
    ],
)
def test_header_and_assignment_values_are_replaced_and_their_names_kept(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "call_abc123 msg_3f2a9c1e_17 part_3f2a9c1e_18 turn_3f2a9c1e_0 req_3f2a9c1e_9",
        "toolu_01A09q90qw90lq917835lq9 chatcmpl-AbC123dEf456GhI789 resp_68af0a1b2c3d4e5f",
        "pip install sk-learn; the risk-0123456789abcdefghij path; a task-1234567890abcdefg",
        "the bearer of bad news; max_tokens=4096; the password is wrong",
        "",
    ],
)
def test_ordinary_ids_and_words_are_left_alone(text):
    assert redact_text(text) == text


def test_values_of_credential_named_keys_are_replaced_in_structured_data():
    clean = redact({"headers": {"X-Api-Key": "k", "Accept": "json"}, "items": [("sk-x", 1)]})
    assert clean == {"headers": {"X-Api-Key": REDACTED, "Accept": "json"}, "items": [["sk-x", 1]]}


# -- where it is applied -----------------------------------------------------------------

KEY = "gsk_8xV2mQ7rL0pZ4nW9tY1cB6dF"


def test_an_error_info_message_is_redacted_whoever_builds_it():
    info = ErrorInfo(kind="AuthenticationFailed", message=f"Invalid API Key: {KEY}")
    assert info.message == "Invalid API Key: [redacted]"


def test_an_axon_error_carries_its_message_redacted():
    exc = AuthenticationFailed(f"bad key {KEY}", status_code=401)
    assert KEY not in str(exc) and KEY not in exc.message and exc.status_code == 401


def test_a_tool_error_text_is_redacted_before_the_model_or_the_store_sees_it():
    outcome = ToolOutcome(tool_call_id="c", tool_name="t", error=f"upstream rejected {KEY}")
    assert outcome.error == "upstream rejected [redacted]"
    assert ToolOutcome(tool_call_id="c", tool_name="t").error is None


def test_configure_logging_redacts_every_line_even_an_exception_passed_as_a_field():
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    try:
        structlog.get_logger("anyone").error("call.failed", error=RuntimeError(f"key {KEY}"))
    finally:
        configure_logging("warning")
    line = json.loads(stream.getvalue())
    assert line["event"] == "call.failed" and line["error"] == "key [redacted]"


def test_a_logged_traceback_is_redacted_down_to_the_sdk_exception_it_was_raised_from():
    """A ProviderError's ``__cause__`` is the SDK's exception, whose text may quote the key
    unredacted; logging with ``exc_info`` renders the whole chain, redacted."""
    from runtime.errors import AuthenticationFailed

    stream = io.StringIO()
    configure_logging("info", stream=stream)
    try:
        try:
            try:
                raise ValueError(f"401: Incorrect API key provided: {KEY}")
            except ValueError as sdk_error:
                raise AuthenticationFailed("the provider refused the key") from sdk_error
        except AuthenticationFailed:
            structlog.get_logger("anyone").exception("call.failed")
    finally:
        configure_logging("warning")
    line = json.loads(stream.getvalue())
    assert "Incorrect API key provided: [redacted]" in line["exception"]
    assert KEY not in stream.getvalue()
