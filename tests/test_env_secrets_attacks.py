"""``Host.open`` registers the values of environment variables named like credentials
(``runtime.redact.register_env_secrets``), attacked as a careless deployment would: a
variable whose name holds KEY or TOKEN but whose value is a setting about a credential
(where to ask for one, a cache key's prefix, a header's name) is ordinary text, and
registered it was replaced by ``[redacted]`` in every error text the model, the store, the
stream and the log got. Registrations last for the process: each value here is its own."""

from __future__ import annotations

import re
from typing import Any

import pytest

from runtime import Agent, Host, tool
from runtime.redact import REDACTED, is_secret_env_name, redact_text, register_env_secrets
from tests.test_mcp_attacks import calling

TOKEN_URL = "https://login.example-attackmerge.test/oauth2/v2.0/token"
PREFIX = "blueberry"  # a common word, 9 characters


@tool
def fetch(what: str) -> str:
    """Fetch ``what``."""
    raise ConnectionError(f"POST {TOKEN_URL} refused for {PREFIX}:{what}")


async def test_settings_about_credentials_stay_readable_in_error_texts(monkeypatch):
    monkeypatch.setenv("OAUTH_TOKEN_URL", TOKEN_URL)
    monkeypatch.setenv("CACHE_KEY_PREFIX", PREFIX)
    monkeypatch.setenv("API_KEY_HEADER", "X-Attackmerge-Key")
    provider = calling(("fetch", {"what": "x"}))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, tools=[fetch]))
        await session.run("go")
    [error] = [m.error for m in session.messages if m.role == "tool"]
    assert error == (f"tool fetch raised ConnectionError: POST {TOKEN_URL} refused for {PREFIX}:x")
    assert TOKEN_URL in repr(provider.requests)  # the model is told where it failed
    assert redact_text("X-Attackmerge-Key: abc") == "X-Attackmerge-Key: abc"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OAUTH_TOKEN_URL", False),
        ("ACTIONS_ID_TOKEN_REQUEST_URL", False),
        ("AZURE_KEY_VAULT_URI", False),
        ("CACHE_KEY_PREFIX", False),
        ("API_KEY_HEADER", False),
        ("TOKEN_PROVIDER", False),
        ("JWT_SECRET_ALGORITHM", False),
        ("SSL_KEY_FILENAME", False),
        ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", True),
        ("SECRET_KEY_BASE", True),
        ("AWS_ACCESS_KEY_ID", True),
        ("GITHUB_TOKEN", True),
    ],
)
def test_a_setting_about_a_credential_is_not_one(name, secret):
    assert is_secret_env_name(name) is secret


def test_a_secret_of_regex_characters_is_redacted_as_written():
    value = "a.b*c(d)[e]+?|^$\\1"
    register_env_secrets({"ATTACKMERGE_PASSWORD": value, "OTHER": "a.b*c(d)"})
    assert redact_text(f"login {value} refused") == f"login {REDACTED} refused"
    assert redact_text("aXb*c(d)[e]+?|^$\\1 abbbc") == "aXb*c(d)[e]+?|^$\\1 abbbc"


def test_a_url_setting_keeps_all_but_its_credentials():
    register_env_secrets({"OIDC_TOKEN_URL": "https://app:pw-attackmerge-55@idp.test/token"})
    said = redact_text("POST https://app:pw-attackmerge-55@idp.test/token failed")
    assert said == f"POST https://app:{REDACTED}@idp.test/token failed"


def test_many_secret_variables_compile_the_pattern_once(monkeypatch):
    """A pod with hundreds of injected credentials: one compile for all (each compile
    holds every secret so far: one a variable was quadratic, 14 s of CPU for 1,000)."""
    env = {f"SVC{i}_API_KEY": f"attackmerge-service-key-{i:05d}" for i in range(300)}
    env["SVC_DSN"] = "postgresql://app:attackmerge-dsn-pw-77@db/app"
    compiled: list[str] = []
    compile_ = re.compile

    def counting(pattern: Any, flags: int = 0) -> Any:
        if isinstance(pattern, str) and pattern.startswith("(?P<secret>"):
            compiled.append(pattern)
        return compile_(pattern, flags)

    monkeypatch.setattr(re, "compile", counting)
    register_env_secrets(env)
    assert len(compiled) == 1
    said = redact_text("attackmerge-service-key-00000 attackmerge-service-key-00299 x")
    assert said == f"{REDACTED} {REDACTED} x"
    assert redact_text("pw attackmerge-dsn-pw-77") == f"pw {REDACTED}"
    register_env_secrets(env)  # the host opened again: nothing new, nothing compiled
    assert len(compiled) == 1
