"""Named plug-ins: built-ins plus the ``importlib.metadata`` entry points of one group.

A registry maps a name to ``"module:attribute"`` and imports the module only when that
name is asked for, so listing what is registered imports no implementation (and no SDK
or driver behind it). Installed packages add names through their ``pyproject.toml``::

    [project.entry-points."axon.stores"]
    redis = "my_package.store:RedisStore"

Adding an implementation is therefore one new file plus, for a plug-in, that one line:
no if/else anywhere chooses between implementations. A built-in's name cannot be taken
over by a plug-in (its entry point is ignored), so installing a package never silently
changes what a built-in name means.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import attrs

from runtime.errors import ConfigurationError, describe_exception


@attrs.frozen(kw_only=True)
class Registry:
    """The implementations of one kind (``kind`` names it in error messages)."""

    group: str
    """The entry-point group plug-ins register in, e.g. ``"axon.stores"``."""
    kind: str
    """What is registered, for messages: ``"provider"``, ``"store"``."""
    builtin: Mapping[str, str]
    """The implementations that ship with Axon, ``name -> "module:attribute"``."""

    def entries(self) -> dict[str, EntryPoint]:
        """Every registered name and its entry point, the built-ins first."""
        found = {
            name: EntryPoint(name, target, self.group) for name, target in self.builtin.items()
        }
        for entry in entry_points(group=self.group):
            found.setdefault(entry.name, entry)
        return found

    def names(self) -> list[str]:
        """Every registered name: the built-ins in their order, then plug-ins sorted."""
        plugins = sorted(name for name in self.entries() if name not in self.builtin)
        return [*self.builtin, *plugins]

    def load(self, name: str) -> Any:
        """The object registered as ``name``, its module imported now.

        Raises :class:`~runtime.errors.ConfigurationError` naming what is registered when
        ``name`` is unknown, and naming the broken entry point when its module does not
        import or lacks the attribute."""
        entry = self.entries().get(name)
        if entry is None:
            known = ", ".join(self.names()) or "none"
            raise ConfigurationError(
                f"unknown {self.kind} {name!r}; registered {self.kind}s: {known}"
            )
        try:
            return entry.load()
        except Exception as exc:  # not only ImportError: a module may raise anything
            raise ConfigurationError(
                f"{self.kind} {name!r} ({entry.value}) could not be loaded: "
                f"{describe_exception(exc)}"
            ) from exc
