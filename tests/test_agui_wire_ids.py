"""AG-UI wire call ids (``agui_wire.wire_call_id``) are one-to-one with the calls they
stand for, whatever dots a message id or a call id holds.

Where dotted ids come from: an assistant message's id is ``msg_<runId>`` (the client's
``runId`` when that is a valid id, and ``.`` is allowed), and the calls of a thread the
client starts from its own messages keep the ids it gives them. Spelled plainly
(``<message id>.s<step>.<call id>``), the seeded call ``p.s0.call_0`` of message ``S``
and the model's ``call_0`` of the message a run named ``<S>.s0.p`` were one id: the
snapshot listed two calls under it, and the seeded call's result, sent back with the
history, answered the waiting call. The message id is written with its ``%`` and ``.``
escaped (``%25``, ``%2E``), so the first dot ends it: a wire id parses back to one
(message, step, call) only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from runtime.app.web import agui_wire
from runtime.app.web.agui import AGUIRoutes
from runtime.app.web.agui_wire import stored_call_id, wire_call_id
from tests.test_agui import COLOR_TOOL, post, run, run_input, user
from tests.test_agui_call_ids import Thread, _calls, _clear, _snapshot, _text, agent, requests
from tests.web.harness import web_server

pytest.importorskip("ag_ui.core")

_clear = _clear  # (the fixture: the model's requests cleared)

Run = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]
Post = Callable[[dict[str, Any]], Awaitable[httpx.Response]]

_ids = st.text(alphabet="ab.s0%_", max_size=8)


@given(_ids, st.integers(min_value=0, max_value=12), _ids, _ids, st.integers(0, 12), _ids)
@example("S", 0, "p.s0.call_0", "S.s0.p", 0, "call_0")  # (the plain spelling's collision)
def test_two_calls_never_share_a_wire_id(m1: str, s1: int, c1: str, m2: str, s2: int, c2: str):
    if (m1, s1, c1) != (m2, s2, c2):
        assert wire_call_id(m1, s1, c1) != wire_call_id(m2, s2, c2)


@given(_ids, st.integers(min_value=0, max_value=1_000), _ids)
def test_a_wire_id_reads_back_to_its_call(message_id: str, step: int, call_id: str):
    wire = wire_call_id(message_id, step, call_id)
    assert agui_wire.split_wire_id(wire) == (message_id, step, call_id)
    if message_id and call_id:  # (what a seeded call's id is read back by)
        assert stored_call_id(message_id, wire) == call_id


def test_the_plain_spelling_collided_and_the_escaped_one_does_not():
    seeded, made = ("msg_x_1", 0, "p.s0.call_0"), ("msg_x_1.s0.p", 0, "call_0")
    assert "msg_x_1.s0.p.s0.call_0" == "{}.s{}.{}".format(*seeded) == "{}.s{}.{}".format(*made)
    assert wire_call_id(*seeded) == "msg_x_1.s0.p.s0.call_0"  # (an undotted message id: as was)
    assert wire_call_id(*made) == "msg_x_1%2Es0%2Ep.s0.call_0"


def _seeded_call_message(messages: list[dict[str, Any]]) -> str:
    (found,) = [
        m["id"]
        for m in messages
        if m["role"] == "assistant"
        and any(c["id"].endswith(".s0.p.s0.call_0") for c in m.get("toolCalls", ()))
    ]
    return found  # type: ignore[no-any-return]


async def seeded_call_and_chosen_run_id(run_: Run, *, worker: bool) -> None:
    """Thread ``u`` started from a client's messages holding call ``p.s0.call_0``
    (answered ``old``); then a run named so that its message's id is ``<S>.s0.p``
    (``S``: the seeded message's id) calls ``pick_color`` as ``call_0``. On the worker
    front end the message is ``msg_<runId>``: spelled plainly its call's wire id was the
    seeded call's. The embedded app names messages itself (no dot): a guard there."""
    seed = [
        user("zero", "m0"),
        {
            "id": "a0",
            "role": "assistant",
            "toolCalls": [
                {
                    "id": "p.s0.call_0",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"key": "zero"}'},
                }
            ],
        },
        {"id": "t0", "role": "tool", "toolCallId": "p.s0.call_0", "content": "old"},
    ]
    first = await run_(run_input("u", *seed, user("one", "m1"), runId="r1"))
    assert _text(first) == "Got value of one."
    held = _snapshot(await run_(run_input("u", runId="r2")))
    seeded = _seeded_call_message(held)  # the server's id of the seeded message
    run_id = f"{seeded.removeprefix('msg_')}.s0.p"  # its message: msg_<run_id>
    picked = await run_(run_input("u", *held, user("pick", "m3"), tools=[COLOR_TOOL], runId=run_id))
    (wire,) = picked[-1]["outcome"]["pendingToolCallIds"]
    (parent,) = [e["parentMessageId"] for e in picked if e["type"] == "TOOL_CALL_START"]
    assert (parent == f"{seeded}.s0.p") is worker
    held = _snapshot(await run_(run_input("u", runId="r4")))
    ids = _calls(held)
    assert len(set(ids)) == len(ids) == 3, ids  # plainly: the seeded call's id twice
    assert ids.count(wire) == 1
    # The client answers with its history (the seeded call's result in it) and its
    # answer: the answer is what the model reads for pick_color, the seeded result stays.
    answer = {"id": "a1", "role": "tool", "toolCallId": wire, "content": "blue"}
    last = await run_(run_input("u", *held, answer, tools=[COLOR_TOOL], runId="r5"))
    assert _text(last) == "Got blue."
    sent = [(m.tool_call_id, m.output) for m in requests[-1] if m.role == "tool"]
    assert sent == [("p.s0.call_0", "old"), ("call_0", "value of one"), ("call_0", "blue")]


async def test_a_run_id_chosen_to_collide_with_a_seeded_call_is_harmless_embedded():
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await seeded_call_and_chosen_run_id(partial(run, server), worker=False)


# -- a refusal names the id the client sent ----------------------------------------------


async def _waiting_pick(run_: Run) -> tuple[Thread, str]:
    """Thread ``t`` whose one turn waits for the client's ``pick_color`` (``call_0``),
    held as its snapshot: the thread and the call's wire id."""
    thread = Thread(run_)
    events = await thread.send(user("pick", "m1"))
    (wire,) = events[-1]["outcome"]["pendingToolCallIds"]
    await thread.snapshot()
    return thread, wire


async def a_call_answered_twice_in_one_run(run_: Run, post_: Post) -> None:
    """One run answering the waiting call twice (by its wire id and by its call id, or
    one id twice): 409 ``already_answered`` naming the second id as the client sent it
    (the session names the call ``call_0``, which the client may never have sent), and
    nothing recorded."""
    thread, wire = await _waiting_pick(run_)
    before = thread.held
    asked = len(requests)
    for i, (first, second) in enumerate([("call_0", wire), (wire, wire), (wire, "call_0")]):
        answers = [
            {"id": f"x{i}a", "role": "tool", "toolCallId": first, "content": "blue"},
            {"id": f"x{i}b", "role": "tool", "toolCallId": second, "content": "blue"},
        ]
        r = await post_(run_input("t", *before, *answers, tools=[COLOR_TOOL], runId=f"x{i}"))
        assert (r.status_code, r.json()["code"]) == (409, "already_answered"), r.text
        error = r.json()["error"]
        assert error.startswith(f"tool call {second!r} was answered already"), error
        assert repr(first) in error
    assert await thread.snapshot() == before  # nothing recorded
    assert len(requests) == asked  # and nothing ran
    last = await thread.send({"id": "a1", "role": "tool", "toolCallId": wire, "content": "red"})
    assert _text(last) == "Got red."


async def an_answer_recorded_since_the_run_read_the_thread(
    run_: Run, post_: Post, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs answer the waiting call by its wire id, the second having read the thread
    before the first's answer was recorded (``AGUIRoutes._stored`` held at that read):
    the session refuses the second as decided already, and the 409 names the call by
    the wire id the client sent, not by the stored ``call_0``."""
    thread, wire = await _waiting_pick(run_)
    read: dict[str, Any] = {}
    stored = AGUIRoutes._stored

    async def at_first_read(self: AGUIRoutes, session_id: str) -> Any:
        if "record" not in read:
            read["record"] = await stored(self, session_id)
        return read["record"]

    monkeypatch.setattr(AGUIRoutes, "_stored", at_first_read)
    answer = {"id": "a1", "role": "tool", "toolCallId": wire, "content": "blue"}
    first = await thread.send(answer)
    assert _text(first) == "Got blue."
    late = {**answer, "id": "a2", "content": "red"}
    r = await post_(run_input("t", *thread.held, late, tools=[COLOR_TOOL], runId="late"))
    assert (r.status_code, r.json()["code"]) == (409, "already_answered"), r.text
    assert repr(wire) in r.json()["error"], r.text
    assert "'call_0'" not in r.json()["error"]


async def test_a_call_answered_twice_in_one_run_is_refused_naming_the_id_sent():
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await a_call_answered_twice_in_one_run(partial(run, server), partial(post, server))


async def test_an_answer_come_late_is_refused_naming_the_id_sent(monkeypatch):
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        await an_answer_recorded_since_the_run_read_the_thread(
            partial(run, server), partial(post, server), monkeypatch
        )
