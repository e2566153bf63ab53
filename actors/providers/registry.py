"""The provider registry: a name (``--provider NAME``) to a provider class, with no if/else.

The built-in providers are listed in :data:`BUILTIN`. Any installed package adds its
own through the ``axon.providers`` entry-point group, in its ``pyproject.toml``::

    [project.entry-points."axon.providers"]
    echo = "my_package.echo:EchoProvider"

so a new provider is one new file (a :class:`~runtime.provider.Provider` subclass that
implements ``from_options``) plus that one line. The command line offers every
registered name as a ``--provider`` choice and builds the provider with
:func:`create_provider`. Provider modules are imported only when their class is asked
for, so listing the names imports no provider and no SDK.
"""

from __future__ import annotations

from runtime.errors import ConfigurationError
from runtime.provider import Provider, ProviderOptions
from runtime.registry import Registry

ENTRY_POINT_GROUP = "axon.providers"

BUILTIN: dict[str, str] = {
    "scripted": "actors.providers.scripted:ScriptedProvider",
    "openai": "actors.providers.openai:OpenAIProvider",
    "anthropic": "actors.providers.anthropic:AnthropicProvider",
    "openai-responses": "actors.providers.openai_responses:OpenAIResponsesProvider",
    "google": "actors.providers.gemini:GeminiProvider",
    "anthropic-vertex": "actors.providers.anthropic_cloud:AnthropicVertexProvider",
    "anthropic-bedrock": "actors.providers.anthropic_cloud:AnthropicBedrockProvider",
}
"""The providers that ship with Axon, ``name -> "module:Class"``; a plug-in cannot
replace them (an entry point with a built-in's name is ignored)."""

PROVIDERS = Registry(group=ENTRY_POINT_GROUP, kind="provider", builtin=BUILTIN)
"""The provider registry (:class:`~runtime.registry.Registry`)."""


def provider_names() -> list[str]:
    """Every registered provider name: the built-ins first, then plug-ins by name."""
    return PROVIDERS.names()


def provider_class(name: str) -> type[Provider]:
    """The provider class registered as ``name``.

    Raises :class:`~runtime.errors.ConfigurationError` naming the registered providers
    when ``name`` is unknown, and saying which entry point is broken when its module
    does not import or its target is not a :class:`~runtime.provider.Provider`.
    """
    cls = PROVIDERS.load(name)
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        target = PROVIDERS.entries()[name].value
        raise ConfigurationError(f"provider {name!r} ({target}) is not a runtime.Provider subclass")
    return cls


def create_provider(name: str, options: ProviderOptions | None = None) -> Provider:
    """The provider registered as ``name``, built from command-line style ``options``
    (:meth:`~runtime.provider.Provider.from_options`)."""
    return provider_class(name).from_options(options or ProviderOptions())
