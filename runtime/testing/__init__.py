"""Kits for plug-in authors: the conformance suites Axon runs its own implementations
through, shipped so that a store or provider from another package can run them too (as
``trio.testing`` ships Trio's test helpers).

* :mod:`runtime.testing.stores` -- :class:`~runtime.testing.stores.StoreConformance`, for
  a :class:`~runtime.store.Store` (``axon.stores`` entry points).
* :mod:`runtime.testing.providers` --
  :class:`~runtime.testing.providers.ProviderConformance`, for a
  :class:`~runtime.provider.Provider` (``axon.providers`` entry points).

Each is a class of pytest tests to subclass in a test module, with a fixture giving the
implementation under test; docs/providers.md shows both. The kits need pytest and
pytest-trio (Axon's ``test`` extra). They depend on the contract alone, and nothing in
Axon imports them (import-linter keeps them the top layer), so ``import runtime`` never
imports pytest.
"""

from __future__ import annotations

import pytest

# The kits' plain ``assert`` s report their operands like a test module's own.
pytest.register_assert_rewrite("runtime.testing.stores", "runtime.testing.providers")
