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
BUILTIN_NAMES = [
    "scripted",
    "openai",
    "anthropic",
    "openai-responses",
    "google",
    "anthropic-vertex",
    "anthropic-bedrock",
]


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
    assert registry.provider_names() == BUILTIN_NAMES
    assert registry.provider_class("openai") is OpenAIProvider
    assert registry.provider_class("anthropic") is AnthropicProvider
    assert registry.provider_class("scripted") is ScriptedProvider


def test_an_unknown_name_says_which_providers_exist():
    with pytest.raises(ConfigurationError) as info:
        registry.provider_class("opneai")
    assert str(info.value) == (
        "unknown provider 'opneai'; registered providers: " + ", ".join(BUILTIN_NAMES)
    )


def test_an_entry_point_adds_a_provider(monkeypatch):
    plugins(monkeypatch, echo=f"{__name__}:EchoProvider")
    assert registry.provider_names() == [*BUILTIN_NAMES, "echo"]
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
        " 'actors.providers.openai_responses', 'actors.providers.gemini',"
        " 'actors.providers.anthropic_platforms',"
        " 'openai', 'anthropic', 'google.genai', 'httpx2') if m in sys.modules]\n"
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
    choices = ", ".join(repr(name) for name in BUILTIN_NAMES)
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
        "interleaved_thinking": False,
        "adaptive_thinking": False,
        "foreign_reasoning": "drop",
    }


# -- "provider:model" strings -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "found"),
    [
        ("openai:gpt-4o-mini", ("openai", "gpt-4o-mini")),
        ("anthropic:claude-sonnet-4-5", ("anthropic", "claude-sonnet-4-5")),
        ("google:gemini-2.5-flash", ("google", "gemini-2.5-flash")),
        (
            "anthropic-bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0",
            ("anthropic-bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
        ),
        ("gpt-4o-mini", None),
        ("llama3:8b", None),
        ("openai:", None),
        (":gpt", None),
    ],
)
def test_a_model_string_names_its_provider_only_with_a_registered_prefix(spec, found):
    assert registry.split_model(spec) == found


def test_provider_for_model_builds_that_provider_with_that_model():
    provider = registry.provider_for_model("google:gemini-2.5-pro")
    assert type(provider).__name__ == "GeminiProvider" and provider.model == "gemini-2.5-pro"
    provider = registry.provider_for_model("anthropic:claude-x", ProviderOptions(api_key=KEY))
    assert isinstance(provider, AnthropicProvider) and provider.model == "claude-x"


def test_an_unknown_prefix_is_refused_naming_the_registered_providers():
    with pytest.raises(ConfigurationError) as info:
        registry.provider_for_model("gogle:gemini-2.5-flash")
    assert str(info.value).startswith("unknown provider 'gogle' in model 'gogle:gemini-2.5-flash'")
    assert ", ".join(BUILTIN_NAMES) in str(info.value)


def test_a_model_string_without_a_provider_is_refused_with_an_example():
    with pytest.raises(ConfigurationError, match="write 'provider:model'"):
        registry.provider_for_model("gpt-4o-mini")


def test_a_plugin_provider_is_named_by_its_prefix_too(monkeypatch):
    plugins(monkeypatch, echo=f"{__name__}:EchoProvider")
    provider = registry.provider_for_model("echo:echo-9")
    assert isinstance(provider, EchoProvider) and provider.model == "echo-9"


@pytest.mark.parametrize(
    ("model", "provider", "resolved"),
    [
        ("openai:gpt-4o-mini", None, ("openai", "gpt-4o-mini")),
        ("openai:gpt-4o-mini", "openai", ("openai", "gpt-4o-mini")),
        ("llama3:8b", "openai", ("openai", "llama3:8b")),
        ("gpt-4o-mini", "openai", ("openai", "gpt-4o-mini")),
        ("gpt-4o-mini", None, (None, "gpt-4o-mini")),
        (None, "anthropic", ("anthropic", None)),
    ],
)
def test_provider_and_model_are_read_together(model, provider, resolved):
    assert registry.resolve_model(model, provider) == resolved


def test_a_prefix_contradicting_the_provider_is_refused():
    with pytest.raises(ConfigurationError, match="names provider 'google', but the provider is"):
        registry.resolve_model("google:gemini-2.5-flash", "openai")


def test_the_cli_model_prefix_chooses_the_provider():
    agent = agent_for("--model", "google:gemini-2.5-pro", "--api-key", KEY)
    assert type(agent.provider).__name__ == "GeminiProvider"
    assert (agent.provider.model, agent.name) == ("gemini-2.5-pro", "google")
    assert agent.tools == ()  # a real provider: not the demo's tools


def test_the_cli_model_prefix_may_repeat_the_provider():
    agent = agent_for("--provider", "anthropic", "--model", "anthropic:claude-x")
    assert isinstance(agent.provider, AnthropicProvider) and agent.provider.model == "claude-x"


def test_the_cli_keeps_a_model_name_with_a_colon_for_the_named_provider():
    agent = agent_for("--provider", "openai", "--model", "llama3:8b", "--base-url", "http://x/v1")
    assert isinstance(agent.provider, OpenAIProvider) and agent.provider.model == "llama3:8b"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "llama3:8b"], "unknown provider 'llama3'"),
        (["--provider", "openai", "--model", "google:x"], "names provider 'google'"),
    ],
)
def test_the_cli_refuses_a_model_it_cannot_place_in_one_line(argv, message):
    run = subprocess.run(
        [sys.executable, "-m", "runtime", "run", *argv, "hi"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("error: --model: ") and message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_an_agent_takes_a_model_string_or_a_provider_not_both():
    from runtime.agent import Agent

    assert Agent(model="openai:gpt-4o-mini").provider is None
    with pytest.raises(ConfigurationError, match="provider= or model=, not both"):
        Agent(model="openai:gpt-4o-mini", provider=ScriptedProvider(["hi"]))
    with pytest.raises(ConfigurationError, match="model must be 'provider:model'"):
        Agent(model="gpt-4o-mini")


async def test_the_host_builds_an_agents_model_once_and_shares_it():
    from runtime.agent import Agent
    from runtime.app.host import Host

    plain = Agent(name="a", model="google:gemini-2.5-flash")
    other = Agent(name="b", model="google:gemini-2.5-flash")
    async with Host.open(log_tap=False) as host:
        first = host.provider_of(plain)
        assert host.provider_of(other) is first and first.model == "gemini-2.5-flash"
        assert first.name == "google:gemini-2.5-flash"


async def test_opening_a_session_with_an_unknown_provider_says_which_exist():
    from runtime.agent import Agent
    from runtime.app.host import Host

    async with Host.open(log_tap=False) as host:
        with pytest.raises(ConfigurationError, match="unknown provider 'gogle'"):
            await host.open_session(Agent(model="gogle:gemini"))
        assert host.sessions == {}
