"""A credential variable or option holding a placeholder (``OPENAI_API_KEY=not-needed``
for a local server, ``changeme``, ``disabled``, ``xxxxxxxxxxxx``) is no secret: it is not
registered (:func:`runtime.redact.is_secret_value`), so the word stays readable wherever
it appears. Registered, a user's message saying "disabled" reached every error text and
log line as ``[redacted]``. Real-looking keys and passwords still are registered.
Registrations last for the process: each value here is its own, or a placeholder.
benchmarks/journal/pipeline.md ("logs3")."""

from __future__ import annotations

import secrets
import uuid

import pytest

from runtime import Agent, Host, tool
from runtime.redact import (
    REDACTED,
    is_secret_value,
    redact_text,
    register_env_secrets,
    register_secret,
)
from tests.test_mcp_attacks import calling

PLACEHOLDERS = [
    "not-needed",
    "NOT_NEEDED",
    "changeme",
    "disabled",
    "xxxxxxxxxxxx",
    "sk-xxxxxxxxxxxxxxxx",
    "********",
    "your-api-key-here",
    "<your-api-key>",
    "${OPENAI_API_KEY}",
    "lm-studio",
    "placeholder",
]
REAL = [
    "plain-api-key-of-no-shape-logs3-5566",  # a proxy's key, no known prefix
    "hunter2hunter2-logs3",  # a 20-character password
    "Tr0ub4d&3lg3",  # 12
    "p4ss-lg3",  # 8: the least a password may be
    "kKd83nq0ZmW1xYpL7rT2vB9c",  # random, 24
]


@pytest.mark.parametrize("value", ["Password!", "Changeme!", "Secret#!"])
def test_a_placeholder_word_with_a_symbol_is_a_password_and_registered(value):
    """A weak real password (a placeholder word and a symbol: what a password rule
    takes) is no placeholder: only ``-``, ``_``, ``.`` and spaces join a placeholder's
    words (before: every symbol was taken out, and ``Password!`` was ``password``)."""
    register_env_secrets({"ATTACK2_DB_PASSWORD": value})
    assert redact_text(f"login {value} refused") == f"login {REDACTED} refused"


@pytest.mark.parametrize("stub", ["sk-proj-", "sk-ant-api03-", "github_pat_"])
def test_a_keys_prefix_left_as_a_template_value_leaves_a_real_key_redacted_whole(stub):
    """``OPENAI_API_KEY=sk-proj-`` (a ``.env`` template, the key left out) is no secret:
    registered, it was matched before the key shapes and a real key in a text lost its
    prefix only (``[redacted]AbCd...``, the rest shown)."""
    register_env_secrets({"ATTACK2_API_KEY": stub})
    key = f"{stub}AbCdEf1234567890XyZ12345"
    assert redact_text(f"key {key} end") == f"key {REDACTED} end"


@pytest.mark.parametrize("value", PLACEHOLDERS)
def test_a_placeholder_in_a_credential_variable_is_not_registered(value):
    register_env_secrets({"LOGS3_API_KEY": value})
    register_secret(value)  # as a provider's option, too
    assert redact_text(f"the feature is {value} for now") == f"the feature is {value} for now"


@pytest.mark.parametrize("value", REAL)
def test_a_real_looking_key_in_a_credential_variable_is_registered(value):
    register_env_secrets({"LOGS3_SERVICE_TOKEN": value})
    assert redact_text(f"refused {value} at login") == f"refused {REDACTED} at login"


def test_random_keys_of_every_usual_form_are_secret_values():
    """What a service generates (its commonest character a few percent of it: the
    odds of one being three quarters of a 16-character key are below 1e-20)."""
    for _ in range(200):
        for key in (
            f"sk-proj-{secrets.token_urlsafe(48)}",
            f"sk-ant-api03-{secrets.token_urlsafe(64)}",
            secrets.token_urlsafe(12),  # 16 characters
            secrets.token_hex(8),  # 16
            uuid.uuid4().hex,
            str(uuid.uuid4()),
            secrets.token_urlsafe(30),  # an AWS secret access key's 40
        ):
            assert is_secret_value(key), key


@tool
def toggle(feature: str) -> str:
    """Toggle ``feature``."""
    raise RuntimeError(f"cannot toggle {feature}: it is disabled by the admin")


async def test_a_users_word_equal_to_a_placeholder_key_survives_error_texts(monkeypatch):
    monkeypatch.setenv("LOGS3_SEARCH_API_KEY", "disabled")
    provider = calling(("toggle", {"feature": "search"}))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, tools=[toggle]))
        await session.run("the search is disabled, why?")
    [error] = [m.error for m in session.messages if m.role == "tool"]
    assert (
        error
        == "tool toggle raised RuntimeError: cannot toggle search: it is disabled by the admin"
    )
    assert "the search is disabled, why?" in repr(provider.requests)
