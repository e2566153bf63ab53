"""A call approved with edits, replayed (docs/approval.md, "What the model sees"), attacked:
the session's provider switched (each provider's request from the same stored history),
a result that never came, an old result cut by compaction, an edit two agents deep, and
what the request is estimated to cost. The model sees its own input once and the edit
once, wherever the history goes."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from actors.providers import anthropic as an
from actors.providers import gemini as gm
from actors.providers import openai as oa
from actors.providers import openai_responses as rs
from runtime import Host
from runtime.compaction import DropToolResults, estimate_tokens
from runtime.events import ToolApprovalDecided
from runtime.history import EDIT_NOTE, INTERRUPTED, iter_turns, repair
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Image,
    Message,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from tests.test_approval_nested_pass import _grand_parent, parent, ran

MODEL = {"key": "MODELS-OWN"}
EDIT = {"key": "PERSONS-EDIT"}


def edited_turn(result: dict[str, Any] | None, model: Any = MODEL) -> list[Message]:
    """A turn whose one call a person approved with ``EDIT`` (as approval.py stores it),
    its result ``result`` (``None``: none stored), then a next user message."""
    wait = Awaiting(
        kind="approval",
        id="approval_1",
        turn_id="turn_1",
        decided=True,
        approved=True,
        original_input=model,
        edit_in_result=True,
    )
    call = ToolCallPart(tool_call_id="c1", tool_name="look", input=EDIT, step=0, awaiting=wait)
    out: list[Message] = [
        UserMessage(content="go"),
        AssistantMessage(id="m1", content=(TextPart(text="looking", step=0), call)),
    ]
    if result is not None:
        out.append(ToolMessage(tool_call_id="c1", tool_name="look", step=0, **result))
    out.append(UserMessage(content="and now?"))
    return repair(out)


REQUESTS = {
    "openai-chat": lambda m: oa.map_messages(None, m),
    "openai-responses": lambda m: rs.map_messages(m),
    "anthropic": lambda m: an.map_messages(None, m),
    "gemini": lambda m: gm.map_messages(None, m),
}

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 24


@pytest.mark.parametrize("provider", sorted(REQUESTS))
@pytest.mark.parametrize(
    "result",
    [
        {"output": "value"},
        {"output": ""},
        {"output": {"n": 1}},
        {"error": "boom"},
        {"output": (Image(data=PNG, media_type="image/png"),)},
        None,  # never stored: repaired to `interrupted`, still headed by the note
    ],
    ids=["text", "empty", "json", "error", "media", "missing"],
)
def test_every_provider_sends_the_models_input_once_and_the_edit_once(provider, result):
    # One stored history, read by whichever provider the session is switched to.
    request = json.dumps(REQUESTS[provider](edited_turn(result)), default=str)
    assert request.count("MODELS-OWN") == 1 and request.count("PERSONS-EDIT") == 1


def test_a_result_that_never_came_is_told_as_interrupted_after_the_note():
    (_, (_, _, results), _) = list(iter_turns(edited_turn(None)))
    (result,) = results
    note = EDIT_NOTE.format(input=json.dumps(EDIT))
    assert result.error == f"{note}\n\n{INTERRUPTED}"


def test_an_old_edited_result_cut_by_compaction_still_tells_the_edit():
    """DropToolResults replaces a long old result with its placeholder; the note is put
    before what is sent, so the model still reads which input ran."""
    history = edited_turn({"output": "x" * 5_000})
    history += [AssistantMessage(id="m2", content=(TextPart(text="ok", step=0),))]
    history += [UserMessage(content="third"), AssistantMessage(id="m3", content=())]
    history += [UserMessage(content="fourth")]
    context: Any = None  # (DropToolResults reads none)
    cut = DropToolResults(max_chars=100, keep_turns=2)(tuple(history), context)
    request = json.dumps(an.map_messages(None, list(cut)), default=str)
    assert "x" * 200 not in request  # cut
    assert request.count("PERSONS-EDIT") == 1 and request.count("MODELS-OWN") == 1
    assert "was removed to save context" in request


def _sent(messages: list[Message]) -> list[Message]:
    """The messages as a request carries them (iter_turns: the model's input, the note),
    their waits dropped: what an estimate of the request itself is made of."""
    out: list[Message] = []
    for kind, msg, results in iter_turns(messages):
        if kind == "assistant":
            content = tuple(
                attrs.evolve(p, awaiting=None) if isinstance(p, ToolCallPart) else p
                for p in msg.content
            )
            out += [attrs.evolve(msg, content=content), *results]
        else:
            out.append(msg)
    return out


@pytest.mark.parametrize("model_chars", [0, 200_000])
def test_an_edited_calls_estimate_counts_the_models_input_and_the_note_it_is_sent_with(
    model_chars,
):
    # The model wrote a long input, a person cut it to a short edit: the request carries
    # the model's input and the note, not the edit alone.
    model = {"key": "MODELS-OWN", "body": "y" * model_chars}
    history = edited_turn({"output": "value"}, model=model)
    stored = estimate_tokens(None, history)
    sent = estimate_tokens(None, _sent(history))
    assert sent <= stored <= sent + 2


async def test_an_edit_two_agents_deep_is_told_to_the_innermost_model_only(tmp_path):
    """top -> middle -> helper: the innermost call is replayed as its model made it and
    told the edit; the calling sessions' calls (the agent tools' prompts) are not."""
    ran.clear()
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_grand_parent(), session_id="s")
        asked = await session.run("go")
        (pending,) = asked.pending
        result = await session.respond(
            pending.approval_id, approved=True, edited_input={"to": "deep"}
        )
        stored = {
            sid: await host.store.load(sid) for sid in ("s", "s.middle.T", "s.middle.T.helper.M")
        }
    assert result is not None and ran == ["deep"]
    requests = {
        sid: json.dumps(an.map_messages(None, list(record.messages)), default=str)
        for sid, record in stored.items()
        if record is not None
    }
    note = EDIT_NOTE.format(input=json.dumps({"to": "deep"}))
    assert [sid for sid, request in requests.items() if json.dumps(note)[1:-1] in request] == [
        "s.middle.T.helper.M"
    ]
    inner = requests["s.middle.T.helper.M"]
    assert inner.count('"to": "x"') == 1 and inner.count('\\"to\\": \\"deep\\"') == 1


@pytest.mark.parametrize(("edit", "edited"), [({"to": "y"}, True), (None, False)])
async def test_a_passed_up_approvals_decision_on_the_bus_says_whether_it_was_edited(
    tmp_path, edit, edited
):
    """A sub-agent's approval decided on the calling session: the edit is the sub
    call's (``Awaiting.edited_input``), not the agent tool's own input, and the event
    the calling session publishes says it was edited all the same."""
    ran.clear()
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        events = host.bus.subscribe([ToolApprovalDecided], name="t")
        session = await host.open_session(parent(), session_id="s")
        waited = await session.run("go")
        await session.decide(waited.pending[0].approval_id, approved=True, edited_input=edit)
        decided = events.inbox.get_nowait()
    assert (decided.session_id, decided.approved, decided.edited) == ("s", True, edited)
