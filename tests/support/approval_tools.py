"""A tool that needs approval and records each run, shared by the approval tests: a
test asserts on :data:`ran` that the tool ran once, or not at all."""

from __future__ import annotations

import pytest

from runtime import tool

ran: list[str] = []
"""The paths :func:`delete_file` ran for, in order (cleared before each test by
:func:`clear_ran`)."""


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return f"deleted {path}"


@pytest.fixture(autouse=True)
def clear_ran() -> None:
    """Import it into a test module to clear :data:`ran` before each of its tests."""
    ran.clear()
