"""``Agent``: what a session runs — a provider, instructions, tools, budget and hooks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from runtime.budget import Budget
from runtime.retry import RetryPolicy
from runtime.tools import Tool, tool

Hook = Callable[[Any], Awaitable[None]]
DEFAULT_THINK_TAGS: tuple[tuple[str, str], ...] = (("<think>", "</think>"),)


@attrs.frozen(kw_only=True, slots=True)
class Hooks:
    """Async callbacks the turn runner awaits; each receives the matching bus event.

    A hook that raises fails the turn loudly (an ``error`` chunk), it is never swallowed.
    """

    on_turn_start: Hook | None = None
    on_turn_finish: Hook | None = None
    on_step_start: Hook | None = None
    on_step_finish: Hook | None = None
    on_message_added: Hook | None = None
    on_tool_call: Hook | None = None
    on_tool_result: Hook | None = None


def _tools(value: Sequence[Tool | Callable[..., Any]]) -> tuple[Tool, ...]:
    tools = tuple(t if isinstance(t, Tool) else tool(t) for t in value)
    names = [t.name for t in tools]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        from runtime.errors import ConfigurationError

        raise ConfigurationError(f"duplicate tool names: {sorted(dupes)}")
    return tools


@attrs.frozen(kw_only=True, slots=True, eq=False)
class Agent:
    """A configured agent. Immutable and shareable: any number of sessions may run it."""

    name: str = "assistant"
    provider: Any = None
    """A :class:`runtime.provider.Provider`; ``None`` uses the offline scripted demo."""
    instructions: str | None = None
    """The system prompt."""
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tools)
    """Tools offered to the model; plain functions are wrapped with :func:`tool`."""
    budget: Budget = attrs.field(factory=Budget)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    think_tags: tuple[tuple[str, str], ...] | None = DEFAULT_THINK_TAGS
    """Tags whose content in the text is reasoning; ``None`` disables the split."""
    hooks: Hooks = attrs.field(factory=Hooks)
    settings: dict[str, Any] = attrs.field(factory=dict)
    """Extra request options passed to the provider on every call (temperature, ...)."""

    @property
    def tool_map(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}
