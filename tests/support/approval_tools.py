"""A tool that needs approval and records each run, shared by the approval tests: a
test asserts on :data:`ran` that the tool ran once, or not at all; and a call of it
waiting for approval (:func:`waiting_delete`), for the tests of the answers' parser."""

from __future__ import annotations

import pytest

from runtime import tool
from runtime.approval import PendingCall

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


def waiting_delete(approval_id: str) -> PendingCall:
    """The call of :func:`delete_file` for ``/x`` (tool call ``D``, step 0 of turn ``t``)
    waiting for approval ``approval_id``: the waiting call the tests of the web
    continuation's parser read an answer against."""
    return PendingCall(
        approval_id=approval_id,
        tool_call_id="D",
        tool_name="delete_file",
        input={"path": "/x"},
        kind="approval",
        step=0,
        message_id="m",
        turn_id="t",
    )
