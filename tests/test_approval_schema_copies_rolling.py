"""A rolling upgrade from a version before ``Awaiting.schema_ref`` (docs/deployment.md,
"Upgrading"): a process of that version deciding one call of a message rewrites it with
its own converter, which drops ``schema_ref`` (a field it does not know), and drops the
decided call's stored schema, handing it on only to an undecided top-level call of the
same tool name. A copy the message shared by digest with a sub-agent's passed-up wait
(or another tool's) went with it: that wait's edit was refused ("not available here")
on a host without the tool, or checked against the host's tool of that name. With
``AXON_SCHEMA_COPIES=per-tool`` this version keeps copies where the one before looks
for them, so each remaining edit is checked against its own schema.

The version before is played here by :func:`_decided_by_a_version_before_refs`, a copy
of its ``_check`` and ``_schema_passed_on`` (main at e2e4e921); the same runs were made
with that version's code in its own process on one SQLite file and one PostgreSQL
schema (benchmarks/journal/approval.md, rollfleet)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import attrs
import pytest

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, messages
from runtime.messages import ToolCallPart
from tests.test_approval_schema_refs import _refused, _reshape, add, bare, calls, model


def _tree(own: int) -> Agent:
    """Two calls of a sub-agent each passing up its ``add`` (a stored schema), after
    ``own`` calls of the calling step's own ``add``: one schema, one digest."""

    def helper_model(request: Any) -> list:
        if current_step(request.messages) == 0:
            return tool_call("add", {"a": 1, "b": 1}, tool_call_id="A")
        return ["sub done"]

    helper = Agent(name="helper", provider=ScriptedProvider(responder=helper_model), tools=[add])
    first = [
        c for i in range(own) for c in tool_call("add", {"a": i, "b": 2}, tool_call_id=f"c{i}")
    ]
    first += [
        c for i in range(2) for c in tool_call("helper", {"input": f"{i}"}, tool_call_id=f"H{i}")
    ]
    return Agent(provider=model(first), tools=[add, helper.as_tool(pass_approvals=True)])


def _shares_by_name(part: Any, name: str) -> bool:
    """The version before's ``shares_schema``."""
    return (
        isinstance(part, ToolCallPart)
        and part.tool_name == name
        and part.awaiting is not None
        and part.awaiting.kind == "approval"
        and not part.awaiting.nested
        and not part.awaiting.decided
    )


def _found_before_refs(parts: list[ToolCallPart], part: ToolCallPart) -> Any:
    """The schema the version before checks ``part``'s edit against (its
    ``shared_schema``): its own copy, else (not nested) an undecided call's of its tool."""
    w = part.awaiting
    assert w is not None
    if w.schema is not None or w.nested:
        return w.schema
    name = part.tool_name
    return next(
        (p.awaiting.schema for p in parts if _shares_by_name(p, name) and p.awaiting.schema), None
    )


def _decided_by_a_version_before_refs(call: str) -> Any:
    """A reshape (:func:`_reshape`): ``call`` approved by the version before, as it
    stores the message (every ``schema_ref`` dropped by its converter)."""

    def shape(parts: list[ToolCallPart]) -> dict[str, ToolCallPart]:
        out = {
            p.tool_call_id: attrs.evolve(p, awaiting=attrs.evolve(p.awaiting, schema_ref=None))
            for p in parts
            if p.awaiting is not None
        }
        part = out[call]
        w = part.awaiting
        assert w is not None
        out[call] = attrs.evolve(
            part, awaiting=attrs.evolve(w, decided=True, approved=True, schema=None)
        )
        if w.schema is None or w.nested:
            return out
        heirs = [p for p in out.values() if _shares_by_name(p, part.tool_name)]
        if heirs and not any(p.awaiting.schema is not None for p in heirs):
            heir = heirs[0]
            out[heir.tool_call_id] = attrs.evolve(
                heir, awaiting=attrs.evolve(heir.awaiting, schema=w.schema)
            )
        return out

    return shape


def _first_holder(record: Any) -> str:
    return next(p.tool_call_id for p in calls(record.messages) if p.awaiting.schema is not None)


@pytest.mark.parametrize("own", [0, 1], ids=["passed up", "own and passed up"])
async def test_a_call_decided_by_a_version_before_refs_leaves_each_other_edit_checked(
    tmp_path, monkeypatch, own
):
    """Under ``per-tool``, the version before approves the call holding the first copy:
    each other waiting call's edit is still checked against the schema (a bad one
    refused, a good one taken) on a host without the tool."""
    monkeypatch.setattr(messages, "SCHEMA_COPIES", "per-tool", raising=False)
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(_tree(own), session_id="s")).run("go")
        record = await host.store.load("s")
    assert record is not None
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    first = _first_holder(record)
    await _reshape(db, _decided_by_a_version_before_refs(first))
    async with Host.open(store=db, log_tap=False) as host:
        deciding = await host.open_session(bare(), session_id="s")
        for call in [k for k in keys if k != first]:
            await _refused(deciding, keys[call], {"a": "x", "b": 1}, "'x' is not of type")
            await deciding.decide(keys[call], approved=True, edited_input={"a": 4, "b": 4})


async def test_under_per_tool_each_waiting_call_holds_a_copy_where_a_version_before_refs_looks(
    tmp_path, monkeypatch
):
    """Under ``per-tool``, as the calls wait and after this version decides the first
    holder (of two calls of its own ``add``), the version before finds each undecided
    wait's schema (its own copy, or a top-level call's of its tool by name), so its own
    edits are checked too; refs are still written."""
    monkeypatch.setattr(messages, "SCHEMA_COPIES", "per-tool", raising=False)
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        waited = await (await host.open_session(_tree(2), session_id="s")).run("go")
    keys = {p.tool_call_id: p.approval_id for p in waited.pending}
    for step in range(2):
        async with Host.open(store=db, log_tap=False) as host:
            record = await host.store.load("s")
            assert record is not None
            parts = calls(record.messages)
            waiting = [p for p in parts if p.awaiting and not p.awaiting.decided]
            assert [_found_before_refs(parts, p) for p in waiting] == [add.parameters] * (4 - step)
            assert all(p.awaiting.schema_ref for p in waiting)
            if step == 0:
                deciding = await host.open_session(bare(), session_id="s")
                await deciding.decide(keys["c0"], approved=True, edited_input={"a": 3, "b": 3})


def test_an_axon_schema_copies_value_of_neither_layout_stops_the_process_as_it_starts() -> None:
    """A typo (``per_tool``) must not pass for the default during a rolling upgrade."""
    env = dict(os.environ, AXON_SCHEMA_COPIES="per_tool", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-c", "import runtime.messages"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "AXON_SCHEMA_COPIES is 'per_tool': 'message' or 'per-tool'" in done.stderr
