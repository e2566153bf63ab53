"""Turn budgets: limits that end a turn cleanly with finish reason ``budget``."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True, slots=True)
class Budget:
    """Limits for one turn. ``None`` means unlimited."""

    max_steps: int = 10
    """Model calls per turn. When the model still wants tools after the last allowed
    step, the turn ends with finish reason ``budget``."""
    max_tool_calls: int | None = None
    """Tool calls per turn, over all steps; calls past it are not run."""
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    deadline: float | None = None
    """Wall-clock seconds for the whole turn."""
    tool_timeout: float | None = 60.0
    """Default per-tool timeout in seconds (a tool may set its own)."""
    max_tool_result_chars: int | None = 100_000
    """A tool result longer than this (as JSON text) is truncated with a visible marker."""
