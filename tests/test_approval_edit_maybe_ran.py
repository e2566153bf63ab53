"""What the model is told of a call a person approved with edits when nobody knows whether
its tool ran: cut short (``interrupted``: it may have begun, or not) or failed on the
runtime's side (``the tool call failed: ...``, an executor bug). Before, such a result
kept ``EDIT_NOTE``, which says the call *ran* with the edit; now it stores
``ToolMessage.ran_unknown`` and is told ``EDIT_MAYBE_NOTE``. A result stored before that
was recorded keeps the note it was replayed with (test_approval_edit_not_run.py)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio

import actors.tool_executor
from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from actors.turn.suspension import _result_of
from runtime import Agent, Host, tool
from runtime.compaction import estimate_text
from runtime.history import EDIT_MAYBE_NOTE, EDIT_NOTE, INTERRUPTED, iter_turns
from runtime.messages import Awaiting, Message, ToolCallPart, ToolMessage
from runtime.serde import from_json, to_json

EDIT = {"key": "b"}
MAYBE = EDIT_MAYBE_NOTE.format(input=json.dumps(EDIT))


@tool(needs_approval=True)
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-{key}"


@tool(name="lookup", needs_approval=True)
async def lookup_forever(key: str) -> str:
    """Look a key up (it never ends: the turn is cut while it runs)."""
    await trio.sleep_forever()
    return ""


def told(messages: list[Message]) -> ToolMessage:
    """The one tool result as every provider's request is built from it (iter_turns)."""
    (result,) = [r for kind, _, rs in iter_turns(messages) if kind == "assistant" for r in rs]
    return result


def stored_result(messages: Any) -> ToolMessage:
    (result,) = [m for m in messages if isinstance(m, ToolMessage)]
    return result


async def decided(db: Any) -> None:
    """A turn that waits for ``lookup``, approved with :data:`EDIT` (not resumed)."""
    provider = ScriptedProvider([[*tool_call("lookup", {"key": "a"})], ["done"]])
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, tools=[lookup]), session_id="s")
        waited = await session.run("go")
        await session.decide(waited.pending[0].approval_id, approved=True, edited_input=EDIT)


async def resumed(db: Any, tool_: Any) -> ToolMessage:
    """The decided turn resumed on a new host (cut after 5 s): the stored result."""
    provider = ScriptedProvider([["done"]])
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, tools=[tool_]), session_id="s")
        with trio.move_on_after(5):
            async with session.resume() as out:
                async for _ in out:
                    pass
        record = await host.store.load("s")
    assert record is not None
    return stored_result(record.messages)


async def test_an_edited_call_cut_short_is_told_it_may_have_run(tmp_path, autojump_clock):
    await decided(tmp_path / "s.db")
    stored = await resumed(tmp_path / "s.db", lookup_forever)
    assert stored.error == INTERRUPTED and stored.ran is None and stored.ran_unknown is True
    record = await _load(tmp_path / "s.db")
    assert told(record).error == f"{MAYBE}\n\n{INTERRUPTED}"


async def test_an_edited_call_failed_by_an_executor_bug_is_told_it_may_have_run(
    tmp_path, monkeypatch
):
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug on the call's way")

    await decided(tmp_path / "s.db")
    monkeypatch.setattr(actors.tool_executor, "run_tool_call", broken)
    stored = await resumed(tmp_path / "s.db", lookup)
    assert stored.error.startswith("the tool call failed: RuntimeError")
    assert stored.ran is None and stored.ran_unknown is True
    record = await _load(tmp_path / "s.db")
    assert told(record).error == f"{MAYBE}\n\n{stored.error}"


def _edited_call() -> ToolCallPart:
    wait = Awaiting(
        kind="approval",
        id="approval_1",
        turn_id="turn_1",
        decided=True,
        approved=True,
        original_input={"key": "a"},
        edit_in_result=True,
    )
    return ToolCallPart(tool_call_id="c1", tool_name="lookup", input=EDIT, step=0, awaiting=wait)


def test_an_edited_call_a_superseding_turn_left_unrun_or_cut_is_told_it_may_have_run():
    """``_result_of``: an approved call of a superseded turn with no outcome (cut short,
    or never run: the new turn was cancelled) is placed ``interrupted``."""
    stored = _result_of(_edited_call(), None)
    assert stored.error == INTERRUPTED and stored.ran_unknown is True


def test_the_record_is_stored_only_for_an_edited_call_whose_run_is_not_known():
    unknown = ToolMessage(tool_call_id="c", tool_name="t", step=0, error="x", ran_unknown=True)
    plain = ToolMessage(tool_call_id="c", tool_name="t", step=0, error=INTERRUPTED)
    assert b'"ran_unknown":true' in to_json(unknown) and b"ran" not in to_json(plain)
    assert from_json(to_json(unknown), Message) == unknown
    assert from_json(to_json(plain), Message).ran_unknown is False
    unedited = attrs.evolve(_edited_call(), awaiting=None)
    assert _result_of(unedited, None).ran_unknown is False


def test_the_maybe_note_costs_no_more_than_the_note_the_estimate_counts():
    """``compaction._edit_replay_tokens`` counts :data:`EDIT_NOTE` for every edit."""
    assert len(EDIT_MAYBE_NOTE) <= len(EDIT_NOTE)
    assert estimate_text(EDIT_MAYBE_NOTE.format(input="")) <= estimate_text(
        EDIT_NOTE.format(input="")
    )


async def _load(db: Any) -> list[Message]:
    async with Host.open(store=db, log_tap=False) as host:
        record = await host.store.load("s")
    assert record is not None
    return list(record.messages)


async def test_an_edited_call_of_a_killed_continuation_runs_at_the_next_message_not_repaired(
    tmp_path,
):
    """gaps' "Left": ``history.repair`` gives a call stored without a result an
    ``interrupted`` result under EDIT_NOTE. A host killed while the edited call ran leaves
    it so (the next load marks the message interrupted); the next message's turn runs
    the approved call first, so its result is the tool's (``ran``), never the repair's."""
    db = tmp_path / "s.db"
    await decided(db)
    async with Host.open(store=db, log_tap=False) as host:  # what settle leaves
        record = await host.store.load("s")
        assert record is not None
        marked = [
            attrs.evolve(m, interrupted=True) if m.role == "assistant" else m
            for m in record.messages
        ]
        await host.store.save("s", 0, marked, expected_version=record.version)
    provider = ScriptedProvider([["ok"]])
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, tools=[lookup]), session_id="s")
        await session.run("next")
        record = await host.store.load("s")
    assert record is not None
    stored = stored_result(record.messages)
    assert (stored.output, stored.error, stored.ran, stored.ran_unknown) == (
        "value-b",
        None,
        True,
        False,
    )
    assert (
        told(list(record.messages)).output
        == f"{EDIT_NOTE.format(input=json.dumps(EDIT))}\n\nvalue-b"
    )
