"""Functions that ran the import system on each call (an ``import`` inside the
function), on an error path or once per store: each now finds its module at the top of
its own (branch ``leftmix``, journal ``benchmarks/journal/pipeline.md``). Counted by the
calls of ``builtins.__import__``, which every ``import`` statement makes."""

from __future__ import annotations

import builtins
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from actors.stores.memory import MemoryStore
from runtime import store as store_module


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names each ``import`` statement of Axon's own modules run from here on asked
    for (pytest's and hypothesis' own imports are not the code under test)."""
    asked: list[str] = []
    real = builtins.__import__

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(("runtime", "actors")):
            asked.append(f"{caller}: {name}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", counting)
    return asked


def test_judging_whether_a_failed_anthropic_stream_had_a_whole_answer_imports_nothing(
    imports: list[str],
) -> None:
    """Every failed Anthropic stream asks (``parse_batches``): before, it imported the
    SDK first, answer or no answer. An ``APIStatusError`` exists only once the SDK is
    loaded, so the loaded module is looked up, never imported."""
    from actors.providers.anthropic import _after_a_whole_answer

    imports.clear()  # (the module's own, on its first import)
    cut = SimpleNamespace(stop_reason=None, blocks={0: object()})
    whole = SimpleNamespace(stop_reason="end_turn", blocks={})
    assert not _after_a_whole_answer(cut, ConnectionError("dropped"))  # type: ignore[arg-type]
    assert not _after_a_whole_answer(whole, ValueError("no SDK error"))  # type: ignore[arg-type]
    assert imports == []


def test_asking_what_a_stores_save_and_listing_take_imports_nothing(imports: list[str]) -> None:
    """``checks_absent_mark`` (each persister), ``_takes_kept`` (a save, when the save's
    function cannot be remembered) and ``_takes_paging`` imported ``inspect`` on each
    call; attrs, which this module imports, has loaded it already."""

    class Wrapped(MemoryStore):
        checks_absent_mark = True

    store = Wrapped()
    assert store_module.checks_absent_mark(store)
    store_module._takes_kept(store)
    store_module._PAGING.pop(Wrapped, None)
    store_module._takes_paging(store)
    assert imports == []


def test_classifying_an_anthropic_failure_imports_nothing(imports: list[str]) -> None:
    """``classify_error`` runs once per failed call: before, it imported the SDK each
    time. The SDK's exceptions exist only once it is loaded, so it is looked up."""
    import anthropic
    import httpx

    from actors.providers.anthropic import classify_error
    from runtime import errors

    imports.clear()
    request = httpx.Request("POST", "https://api.anthropic.com/v1/messages")
    timeout = classify_error(anthropic.APITimeoutError(request=request))
    dropped = classify_error(ConnectionResetError("reset"))
    assert isinstance(timeout, errors.ProviderTimeout)
    assert isinstance(dropped, errors.AxonError)
    assert imports == []


def test_a_lagged_notice_after_the_first_imports_nothing(imports: list[str]) -> None:
    """The inbox names its ``Lagged`` notice through ``runtime.lifecycle``, which imports
    the events on first use only (the contract's import builds none of them) and keeps
    the class as a module attribute: no later notice runs the import system."""
    from runtime.events import Lagged
    from runtime.inbox import Inbox

    inbox: Inbox[object] = Inbox(1, "drop-oldest", name="observer")

    def lag() -> object:
        inbox.put_nowait("a")
        inbox.put_nowait("b")  # drops "a"
        notice = inbox.get_nowait()
        assert inbox.get_nowait() == "b"
        return notice

    first = lag()
    imports.clear()  # the first may import (in a process that has not yet)
    assert lag() == first == Lagged(subscriber="observer", dropped=1)
    assert imports == []
