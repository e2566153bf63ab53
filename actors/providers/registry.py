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

from importlib.metadata import EntryPoint, entry_points

from runtime.errors import ConfigurationError
from runtime.provider import Provider, ProviderOptions

ENTRY_POINT_GROUP = "axon.providers"

BUILTIN: dict[str, str] = {
    "scripted": "actors.providers.scripted:ScriptedProvider",
    "openai": "actors.providers.openai:OpenAIProvider",
    "anthropic": "actors.providers.anthropic:AnthropicProvider",
    "openai-responses": "actors.providers.openai_responses:OpenAIResponsesProvider",
}
"""The providers that ship with Axon, ``name -> "module:Class"``; a plug-in cannot
replace them (an entry point with a built-in's name is ignored)."""


def _registered() -> dict[str, EntryPoint]:
    found = {name: EntryPoint(name, target, ENTRY_POINT_GROUP) for name, target in BUILTIN.items()}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry)
    return found


def provider_names() -> list[str]:
    """Every registered provider name: the built-ins first, then plug-ins by name."""
    plugins = sorted(name for name in _registered() if name not in BUILTIN)
    return [*BUILTIN, *plugins]


def provider_class(name: str) -> type[Provider]:
    """The provider class registered as ``name``.

    Raises :class:`~runtime.errors.ConfigurationError` naming the registered providers
    when ``name`` is unknown, and saying which entry point is broken when its module
    does not import or its target is not a :class:`~runtime.provider.Provider`.
    """
    registered = _registered()
    entry = registered.get(name)
    if entry is None:
        known = ", ".join(provider_names())
        raise ConfigurationError(f"unknown provider {name!r}; registered providers: {known}")
    try:
        cls = entry.load()
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"provider {name!r} ({entry.value}) could not be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise ConfigurationError(
            f"provider {name!r} ({entry.value}) is not a runtime.Provider subclass"
        )
    return cls


def create_provider(name: str, options: ProviderOptions | None = None) -> Provider:
    """The provider registered as ``name``, built from command-line style ``options``
    (:meth:`~runtime.provider.Provider.from_options`)."""
    return provider_class(name).from_options(options or ProviderOptions())
