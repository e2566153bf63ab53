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

A model string may name its provider too, ``"provider:model"`` (``"openai:gpt-4o-mini"``,
``"google:gemini-2.5-flash"``): :func:`resolve_model` reads ``--provider`` and
``--model`` together, :func:`provider_for_model` builds what ``Agent(model=...)`` names.
"""

from __future__ import annotations

import attrs

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
    "anthropic-vertex": "actors.providers.anthropic:AnthropicVertexProvider",
    "anthropic-bedrock": "actors.providers.anthropic:AnthropicBedrockProvider",
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


def split_model(spec: str) -> tuple[str, str] | None:
    """``(provider, model)`` when ``spec`` is ``"provider:model"`` with a registered
    provider name before the first ``:`` (``"openai:gpt-4o-mini"``,
    ``"anthropic-bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0"``: the model keeps
    any later ``:``); ``None`` otherwise (a plain model name, or one whose own name has a
    ``:`` such as ``llama3:8b``)."""
    name, colon, model = spec.partition(":")
    if not colon or not name or not model or name not in PROVIDERS.entries():
        return None
    return name, model


def resolve_model(model: str | None, provider: str | None = None) -> tuple[str | None, str | None]:
    """The provider name and model name that ``--provider`` and ``--model`` (or
    ``Agent(model=...)``, with no provider) say together.

    A ``provider:`` prefix in ``model`` chooses the provider; ``provider`` may repeat it
    but not contradict it. Without a registered prefix, ``model`` is the model's name as
    given, for ``provider``; a ``:`` in it with no ``provider`` named is refused (an
    unknown provider, or a model name with a colon that needs ``--provider``). Raises
    :class:`~runtime.errors.ConfigurationError` saying which, and naming the registered
    providers.
    """
    if model is None:
        return provider, None
    found = split_model(model)
    if found is not None:
        named, name = found
        if provider is not None and provider != named:
            raise ConfigurationError(
                f"model {model!r} names provider {named!r}, but the provider is {provider!r}: "
                "give one or make them agree"
            )
        return named, name
    if provider is None and ":" in model:
        prefix = model.partition(":")[0]
        raise ConfigurationError(
            f"unknown provider {prefix!r} in model {model!r}; registered providers: "
            f"{', '.join(provider_names())} (for a model name that has a ':' itself, "
            "name its provider: --provider NAME)"
        )
    return provider, model


def provider_for_model(spec: str, options: ProviderOptions | None = None) -> Provider:
    """The provider ``"provider:model"`` names (``Agent(model=...)``), built like
    ``--provider NAME --model MODEL`` with the rest of ``options``. Raises
    :class:`~runtime.errors.ConfigurationError` for a spec without a registered
    ``provider:`` prefix."""
    found = split_model(spec)
    if found is None:
        prefix, colon, _ = spec.partition(":")
        if colon and prefix:
            raise ConfigurationError(
                f"unknown provider {prefix!r} in model {spec!r}; registered providers: "
                f"{', '.join(provider_names())}"
            )
        raise ConfigurationError(
            f"model {spec!r} does not name its provider: write 'provider:model', e.g. "
            "'openai:gpt-4o-mini' (registered providers: " + ", ".join(provider_names()) + ")"
        )
    name, model = found
    base = options or ProviderOptions()
    return create_provider(name, attrs.evolve(base, model=model))
