"""Provider actors, one module each; an SDK is imported only when its provider calls it.

The package exports each built-in provider class by its name (``from actors.providers
import OpenAIProvider``), read from the one list of built-ins,
:data:`actors.providers.registry.BUILTIN`; a class's module is imported when it is first
asked for, so importing the package imports no provider module and no SDK.
"""

from __future__ import annotations

import importlib
from typing import Any

from actors.providers.registry import BUILTIN

_TARGETS: dict[str, str] = {target.partition(":")[2]: target for target in BUILTIN.values()}
"""Each built-in provider's class name -> ``"module:Class"``."""

__all__ = sorted(_TARGETS)


def __getattr__(name: str) -> Any:  # lazy: importing the package never imports an SDK
    target = _TARGETS.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # asked for once: the next lookup is an ordinary attribute
    return value
