"""The provider registry and what every provider has in common.

A provider is found by name (built-in table or an ``axon.providers`` entry point), the
command line offers and builds whatever is registered, and every provider accepts
``name=`` and describes itself with the same keys, never with its key.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

import runtime.registry
from actors.providers import AnthropicProvider, OpenAIProvider, ScriptedProvider, registry
from runtime.app.cli import build_parser, make_agent
from runtime.errors import ConfigurationError
from runtime.provider import DESCRIBE_KEYS, Provider, ProviderOptions

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-registry-0123456789"


class EchoProvider(Provider):
    """A provider from outside Axon, as a plug-in package would ship it."""

    provider_name = "echo"

    @classmethod
    def from_options(cls, options: ProviderOptions) -> EchoProvider:
        return cls(model=options.model or "echo-1")


class NotConfigurable(Provider):
    provider_name = "fixed"


def plugins(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Pretend installed packages declare these ``axon.providers`` entry points."""
    found = [EntryPoint(n, t, registry.ENTRY_POINT_GROUP) for n, t in targets.items()]
    monkeypatch.setattr(runtime.registry, "entry_points", lambda group: found)


# -- the registry ---------------------------------------------------------------------------


def test_the_builtin_providers_are_registered():
    assert registry.provider_names() == ["scripted", "openai", "anthropic", "openai-responses"]
    assert registry.provider_class("openai") is OpenAIProvider
    assert registry.provider_class("anthropic") is AnthropicProvider
    assert registry.provider_class("scripted") is ScriptedProvider


def test_an_unknown_name_says_which_providers_exist():
    with pytest.raises(ConfigurationError) as info:
        registry.provider_class("opneai")
    assert str(info.value) == (
        "unknown provider 'opneai'; registered providers: "
        "scripted, openai, anthropic, openai-responses"
    )


def test_an_entry_point_adds_a_provider(monkeypatch):
    plugins(monkeypatch, echo=f"{__name__}:EchoProvider")
    assert registry.provider_names() == [
        "scripted",
        "openai",
        "anthropic",
        "openai-responses",
        "echo",
    ]
    provider = registry.create_provider("echo", ProviderOptions(model="echo-2"))
    assert isinstance(provider, EchoProvider) and provider.model == "echo-2"


def test_an_entry_point_cannot_replace_a_builtin(monkeypatch):
    plugins(monkeypatch, openai=f"{__name__}:EchoProvider")
    assert registry.provider_class("openai") is OpenAIProvider


def test_an_entry_point_whose_module_is_missing_is_a_configuration_error(monkeypatch):
    plugins(monkeypatch, gone="no_such_package.provider:Gone")
    with pytest.raises(ConfigurationError, match=r"provider 'gone' .* could not be loaded"):
        registry.provider_class("gone")


def test_an_entry_point_that_is_not_a_provider_is_a_configuration_error(monkeypatch):
    plugins(monkeypatch, wrong="json:dumps")
    with pytest.raises(ConfigurationError, match=r"is not a runtime\.Provider subclass"):
        registry.provider_class("wrong")


def test_a_provider_without_from_options_says_how_to_use_it(monkeypatch):
    plugins(monkeypatch, fixed=f"{__name__}:NotConfigurable")
    with pytest.raises(ConfigurationError, match="construct it in Python"):
        registry.create_provider("fixed")


def test_listing_the_providers_imports_no_provider_module_and_no_sdk():
    code = (
        "import sys\n"
        "from actors.providers.registry import provider_names\n"
        "provider_names()\n"
        "bad = [m for m in ('actors.providers.openai', 'actors.providers.anthropic',"
        " 'actors.providers.openai_responses',"
        " 'openai', 'anthropic', 'httpx2') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_the_package_exports_each_builtin_provider_class_from_the_one_list():
    import actors.providers

    exported = {name: getattr(actors.providers, name) for name in actors.providers.__all__}
    assert {f"{cls.__module__}:{name}" for name, cls in exported.items()} == set(
        registry.BUILTIN.values()
    )


# -- the command line builds what is registered ------------------------------------------------


def agent_for(*argv: str) -> Any:
    return make_agent(build_parser().parse_args(["run", *argv, "hi"]))


def test_the_cli_offers_and_builds_a_plugin_provider(monkeypatch):
    plugins(monkeypatch, echo=f"{__name__}:EchoProvider")
    agent = agent_for("--provider", "echo", "--model", "echo-3")
    assert isinstance(agent.provider, EchoProvider) and agent.provider.model == "echo-3"
    assert agent.name == "echo"


def test_the_cli_rejects_an_unknown_provider_listing_the_choices(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["run", "--provider", "opneai", "hi"])
    assert info.value.code == 2
    choices = "'scripted', 'openai', 'anthropic', 'openai-responses'"
    assert f"invalid choice: 'opneai' (choose from {choices})" in capsys.readouterr().err


def test_the_cli_builds_openai_with_its_defaults_and_options():
    agent = agent_for("--provider", "openai", "--base-url", "http://127.0.0.1:9/v1")
    provider = agent.provider
    assert isinstance(provider, OpenAIProvider)
    assert (provider.model, provider.base_url) == ("gpt-4o-mini", "http://127.0.0.1:9/v1")


def test_the_cli_builds_anthropic_with_its_thinking_budget():
    agent = agent_for("--provider", "anthropic", "--thinking-budget", "2048", "--api-key", KEY)
    provider = agent.provider
    assert isinstance(provider, AnthropicProvider)
    assert (provider.model, provider.thinking_budget) == ("claude-sonnet-4-5", 2048)


def test_the_cli_builds_the_scripted_demo_at_the_given_pace():
    agent = agent_for("--delay", "0.5")
    assert isinstance(agent.provider, ScriptedProvider) and agent.provider.delay == 0.5
    assert [t.name for t in agent.tools] == ["get_weather", "get_time"]


# -- what every provider has in common -------------------------------------------------------


@pytest.mark.parametrize("name", registry.provider_names())
def test_every_provider_describes_itself_with_the_same_keys(name):
    provider = registry.create_provider(name, ProviderOptions(api_key=KEY))
    described = provider.describe()
    assert tuple(described) == DESCRIBE_KEYS
    assert described["provider"] == name and described["name"] == provider.name
    assert KEY not in repr(described)


@pytest.mark.parametrize(
    "make",
    [
        lambda name: OpenAIProvider("m", name=name),
        lambda name: AnthropicProvider("m", name=name),
        lambda name: ScriptedProvider(["hi"], name=name),
    ],
    ids=["openai", "anthropic", "scripted"],
)
def test_every_provider_accepts_a_name(make):
    assert make("primary").name == "primary"


def test_without_a_name_a_provider_is_named_after_itself_and_its_model():
    assert OpenAIProvider("gpt-4o-mini").name == "openai:gpt-4o-mini"
    assert ScriptedProvider(["hi"]).name == "scripted:scripted"


def test_describe_shows_option_names_but_never_their_values():
    provider = AnthropicProvider("m", api_key=KEY, metadata={"user_id": "secret-user"})
    described = provider.describe()
    assert described["options"] == ["metadata"]
    assert "secret-user" not in repr(described) and KEY not in repr(described)
    assert described["settings"] == {
        "thinking_budget": None,
        "max_tokens": 4096,
        "foreign_reasoning": "drop",
    }
