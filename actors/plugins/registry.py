"""The plug-in registry: ``--plugin NAME[:OPTIONS]`` to an observer actor, by name.

Providers and stores load by name from entry points; so do plug-ins, the actors a host
starts beside its own to watch the bus (tracing, recording, metrics, an audit log).
The built-in ones are listed in :data:`BUILTIN` (and declared in Axon's own
``pyproject.toml`` the way any package declares one); an installed package adds its own
through the ``axon.plugins`` entry-point group::

    [project.entry-points."axon.plugins"]
    audit = "my_package.audit:audit_plugin"

The entry point names a *factory*: a callable taking the text after the colon (``None``
when there is none) and returning the :class:`~runtime.actor.Actor` to start, e.g.
``audit_plugin("/var/log/axon.jsonl")``. A factory raises
:class:`~runtime.errors.ConfigurationError` for options it cannot use; ``run``,
``serve`` and ``worker`` build every plug-in before they open anything, so a bad name or
option is one ``error:`` line and nothing runs. Modules load only when their name is
asked for: listing the names imports no plug-in (and no OpenTelemetry).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from runtime.actor import Actor
from runtime.errors import ConfigurationError, describe_exception
from runtime.registry import Registry

ENTRY_POINT_GROUP = "axon.plugins"

BUILTIN: dict[str, str] = {
    "otel": "actors.plugins.otel:otel_plugin",
    "recorder": "actors.plugins.recorder:recorder_plugin",
}
"""The plug-ins that ship with Axon, ``name -> "module:factory"``; a package's entry
point with one of these names is ignored (installing it never changes what they mean)."""

PLUGINS = Registry(group=ENTRY_POINT_GROUP, kind="plug-in", builtin=BUILTIN)
"""The plug-in registry (:class:`~runtime.registry.Registry`)."""

PluginFactory = Callable[[str | None], Actor]
"""What an ``axon.plugins`` entry point names: options (or ``None``) to an actor."""


@attrs.frozen(kw_only=True, slots=True)
class PluginSpec:
    """One ``--plugin`` value: a registered name and the options after its colon."""

    name: str
    options: str | None = None

    @classmethod
    def parse(cls, value: str) -> PluginSpec:
        """``NAME`` or ``NAME:OPTIONS`` (options may hold colons of their own: only the
        first one splits); an empty name is a :class:`ConfigurationError`."""
        name, colon, options = value.partition(":")
        name = name.strip()
        if not name:
            raise ConfigurationError(f"--plugin needs NAME[:OPTIONS], not {value!r}")
        return cls(name=name, options=options if colon else None)

    def __str__(self) -> str:
        return self.name if self.options is None else f"{self.name}:{self.options}"


def plugin_names() -> list[str]:
    """Every registered plug-in name: the built-ins first, then the others by name."""
    return PLUGINS.names()


def create_plugin(spec: PluginSpec | str) -> Actor:
    """The actor the plug-in ``spec`` names, built by its factory from its options.

    Raises :class:`~runtime.errors.ConfigurationError` (one line) for an unknown name
    (naming the registered ones), an entry point that does not load or is not a factory
    of actors, and options the factory refuses."""
    if isinstance(spec, str):
        spec = PluginSpec.parse(spec)
    factory = PLUGINS.load(spec.name)
    target = PLUGINS.entries()[spec.name].value
    if not callable(factory):
        raise ConfigurationError(f"plug-in {spec.name!r} ({target}) is not callable")
    try:
        actor = factory(spec.options)
    except ConfigurationError:
        raise
    except Exception as exc:  # a factory's bug, or options it refused the wrong way
        raise ConfigurationError(
            f"plug-in {spec.name!r} ({target}) could not be built from its options: "
            f"{describe_exception(exc)}"
        ) from exc
    if not isinstance(actor, Actor):
        raise ConfigurationError(
            f"plug-in {spec.name!r} ({target}) returned {type(actor).__name__}, not a runtime.Actor"
        )
    return actor


__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "PLUGINS",
    "PluginFactory",
    "PluginSpec",
    "create_plugin",
    "plugin_names",
]
