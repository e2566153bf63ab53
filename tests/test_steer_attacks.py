"""The busy strategies attacked where a user would hit them (runtime/busy.py,
docs/busy.md): two messages steered at one step boundary, a steered
attachment, a steer on the turn's last step, an ``interrupt`` while a tool runs, a
strategy changed while a turn runs. Each asserts what the user sees and what is stored,
and, for the steered histories, what each provider and the AI SDK UI are given."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import trio
import trio.testing

from actors.providers.anthropic import map_messages as anthropic_messages
from actors.providers.openai import map_messages as openai_messages
from actors.providers.openai_responses import map_messages as responses_messages
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host, Image, tool
from runtime.actor_messages import SteeredInput
from runtime.app.web.ui_stream import UIStreamEncoder, ui_messages
from runtime.busy import INTERRUPTED_BY_NEW
from runtime.errors import InputHeld
from runtime.history import repair
from runtime.messages import UserMessage
from tests.test_busy import Script, agent_with, held, holding, kinds, looking, run_in

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


async def steer_in(nursery: trio.Nursery, session: Any, content: Any, into: dict) -> None:
    """Send ``content`` to a busy session (its strategy ``steer``) in ``nursery``: the
    stream, and the chunks of its own it yielded, into ``into`` by its text."""

    async def go() -> None:
        key = content if isinstance(content, str) else content[0]
        async with session.stream(content) as out:
            into[key] = (out, [c async for c in out])

    nursery.start_soon(go)
    await trio.testing.wait_all_tasks_blocked()


async def two_steered_at_one_boundary() -> tuple[Script, Any, dict, dict]:
    """A turn held in step 1's tool; two messages steered in while it runs."""
    script = Script(looking("call_L"), holding("call_H"), ["answer to both"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        results: dict = {}
        steered: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            await steer_in(nursery, session, "also this", steered)
            await steer_in(nursery, session, "and that", steered)
            held["release"].set()
        record = await host.store.load("s")
    return script, record, results, steered


async def test_two_messages_steered_at_one_boundary_are_stored_in_order_and_share_the_answer():
    script, record, results, steered = await two_steered_at_one_boundary()
    first = results["first"]
    (a, a_chunks), (b, b_chunks) = steered["also this"], steered["and that"]
    assert a.steered and b.steered and a.turn_id == b.turn_id == first.turn_id
    assert a_chunks == b_chunks == [] and a.result is b.result is first
    assert first.text == "answer to both" and len(script.requests) == 3
    # the model saw both, after step 1's results, in one call; stored as it saw them
    seen = script.requests[2].messages
    assert kinds(seen) == ["User", "Assistant", "Tool", "Tool", "User", "User", "Assistant"]
    assert [seen[4].text, seen[5].text] == ["also this", "and that"]
    assert kinds(record.messages) == kinds(seen)
    assert record.messages[6].text == "answer to both"


async def test_two_steered_messages_replay_to_each_provider_as_the_model_saw_them():
    _, record, _, _ = await two_steered_at_one_boundary()
    history = tuple(repair(record.messages))
    chat = openai_messages(None, history)
    assert [m["role"] for m in chat][-4:] == ["tool", "user", "user", "assistant"]
    assert [chat[-3]["content"], chat[-2]["content"]] == ["also this", "and that"]
    items = responses_messages(history)
    shape = [i.get("type") or i["role"] for i in items]
    assert shape[-4:] == ["function_call_output", "user", "user", "assistant"]
    _system, anthropic = anthropic_messages(None, history)
    roles = [m["role"] for m in anthropic]
    assert all(x != y for x, y in pairwise(roles))  # they alternate
    last_user = anthropic[-2]["content"]  # one user turn: the result, then both texts
    assert [b["type"] for b in last_user] == ["tool_result", "text", "text"]
    assert [b["text"] for b in last_user[1:]] == ["also this", "and that"]


async def test_two_steered_messages_show_in_the_ui_as_two_bubbles_and_one_answer():
    _, record, _, _ = await two_steered_at_one_boundary()
    ui = ui_messages(record.messages)
    assert [m["role"] for m in ui] == ["user", "assistant", "user", "user", "assistant"]
    texts = [[p.get("text") for p in m["parts"] if p["type"] == "text"] for m in ui]
    assert texts[2:] == [["also this"], ["and that"], ["answer to both"]]
    tools = [p for p in ui[1]["parts"] if p["type"].startswith("tool-")]
    assert [p["state"] for p in tools] == ["output-available", "output-available"]


async def test_a_steered_attachment_is_stored_with_its_message_and_sent_to_the_model():
    script = Script(holding(), ["a cat"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        results: dict = {}
        steered: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            await steer_in(nursery, session, ["what is this?", Image(data=PNG)], steered)
            held["release"].set()
        record = await host.store.load("s")
    out, _ = steered["what is this?"]
    assert out.steered and results["first"].text == "a cat"
    assert record is not None
    message = record.messages[3]
    assert isinstance(message, UserMessage) and message.text == "what is this?"
    assert [type(p).__name__ for p in message.content] == ["TextPart", "Image"]
    assert message.content[1].data == PNG
    _system, anthropic = anthropic_messages(None, tuple(repair(record.messages)))
    assert [b["type"] for b in anthropic[-2]["content"]] == ["tool_result", "text", "image"]


async def test_a_message_steered_on_the_turns_last_allowed_step_is_answered_by_its_own_turn():
    """``max_steps`` ends the turn at the boundary that would have taken the message:
    it is not taken into a turn that makes no further call (then stored with no
    answer), it starts a turn of its own."""
    script = Script(holding(), ["second answered"])
    agent = agent_with(script, "steer")
    agent = Agent(
        provider=agent.provider,
        tools=agent.tools,
        on_busy="steer",
        budget=Budget(max_steps=1),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        results: dict = {}
        steered: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            await steer_in(nursery, session, "second", steered)
            held["release"].set()
    out, chunks = steered["second"]
    assert results["first"].finish_reason == "budget"
    assert not out.steered and out.turn_id != results["first"].turn_id
    assert out.result.text == "second answered"
    assert any(c.type == "text-delta" for c in chunks)  # its own stream shows its answer
    assert kinds(session.messages) == ["User", "Assistant", "Tool", "User", "Assistant"]


finished: list[str] = []


@tool
async def slow() -> str:
    """A tool that takes a while."""
    held["open"].set()
    await trio.sleep(60)
    finished.append("slow")
    return "slow done"


async def test_interrupt_while_a_tool_runs_cancels_the_tool_and_stores_it_interrupted(
    autojump_clock,
):
    finished.clear()
    agent = Agent(
        provider=ScriptedProvider(turns=[[[*tool_call("slow", {}, tool_call_id="S")]], [["ok"]]]),
        tools=[slow],
        on_busy="interrupt",
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            second = await session.run("second")
        await trio.sleep(120)  # had the tool gone on, it would have finished by now
        record = await host.store.load("s")
    assert finished == []  # cancelled, not left running behind the new turn
    assert results["first"].abort_reason == INTERRUPTED_BY_NEW and second.text == "ok"
    assert record is not None
    assert kinds(record.messages) == ["User", "Assistant", "Tool", "User", "Assistant"]
    assert record.messages[1].interrupted and "interrupted" in record.messages[2].error


async def test_a_strategy_changed_while_a_turn_runs_applies_to_the_messages_after_it():
    script = Script(holding(), ["first done"], ["second done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            session.on_busy = "enqueue"  # changed while the turn runs
            await run_in(nursery, session, "second", results)
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
    first, second = results["first"], results["second"]
    assert (first.text, second.text) == ("first done", "second done")
    assert first.turn_id != second.turn_id  # queued as its own turn, not steered in
    assert kinds(session.messages) == ["User", "Assistant", "Tool", "User", "Assistant"]


@tool(needs_approval=True)
async def guarded_hold() -> str:
    """Wait until the test lets go, once a person approved it."""
    held["open"].set()
    await held["release"].wait()
    return "held"


async def test_a_message_steered_into_an_approved_turns_continuation_is_answered_by_it():
    script = Script([*tool_call("guarded_hold", {}, tool_call_id="G")], ["answer to both"])
    agent = Agent(provider=ScriptedProvider(responder=script), tools=[guarded_hold])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s", on_busy="steer")
        first = await session.run("first")
        steered: dict = {}
        results: dict = {}
        async with trio.open_nursery() as nursery:

            async def respond() -> None:
                results["resumed"] = await session.respond(
                    first.pending[0].approval_id, approved=True
                )

            nursery.start_soon(respond)
            await held["open"].wait()  # the continuation runs the approved tool
            await steer_in(nursery, session, "also this", steered)
            held["release"].set()
        record = await host.store.load("s")
    out, _ = steered["also this"]
    assert out.steered and out.turn_id == first.turn_id
    assert results["resumed"].text == "answer to both"
    assert record is not None
    assert kinds(record.messages) == ["User", "Assistant", "Tool", "User", "Assistant"]
    assert record.messages[2].output == "held" and record.messages[3].text == "also this"
    assert kinds(script.requests[1].messages)[-2:] == ["User", "Assistant"]


async def test_a_regenerate_from_the_client_that_streamed_a_steered_turn_is_refused_intact():
    """A client that streamed the turn but did not send the steered message (another
    client did: the page, a script) holds it only as a transient data part: its last
    user message is the turn's first. Its regenerate (or edit) of the answer is refused
    (409) and nothing is cut: the stored turn, steered message and answer, stays. (A
    ``useChat`` client that sent it holds it where it is stored: test_steer_node.py.)"""
    import httpx

    from tests.test_busy_web import agent_of
    from tests.test_web_http import body, events
    from tests.web.harness import wait_idle, web_server

    script = Script(looking(), holding(), ["answer to both"])
    async with (
        web_server(agent_of(script, "steer")) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        replies: dict = {}

        async def post(key: str, sent: dict) -> None:
            replies[key] = await client.post("/api/chat", json=sent, timeout=30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "first", body("s", "first", message_id="u-first"))
            await held["open"].wait()
            nursery.start_soon(post, "steer", body("s", "also this", message_id="u-steer"))
            await trio.testing.wait_all_tasks_blocked(0.05)
            held["release"].set()
        await wait_idle(server, "s")
        before = (await client.get("/api/sessions/s")).json()["messages"]
        answer_id = events(replies["first"].content)[0]["messageId"]
        again = body("s", "first", trigger="regenerate-message", message_id="u-first")
        again["messageId"] = answer_id
        refused = await client.post("/api/chat", json=again)
        after = (await client.get("/api/sessions/s")).json()["messages"]
    assert replies["steer"].status_code == 202
    assert refused.status_code == 409, refused.text
    assert "last user message" in refused.json()["error"]
    assert after == before and len(script.requests) == 3


async def test_a_followed_steer_yields_the_rest_of_the_turn_and_the_turn_stream_all_of_it():
    """``session.stream(text, follow=True)`` under ``steer``: a ``start`` naming the
    answer's stored message, then the turn's chunks from the steered one on (that one
    left out); the running turn's own stream still yields every chunk, and says it hands
    over at that message."""
    script = Script(holding(), ["answer to both"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        seen: dict = {}

        async def first() -> None:
            async with session.stream("first") as out:
                seen["first"] = [c async for c in out]
                seen["hands_over"] = out.hands_over("u2")

        async def steer() -> None:
            async with session.stream("also this", user_message_id="u2", follow=True) as out:
                seen["steered"] = out.steered
                seen["rest"] = [c async for c in out]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await held["open"].wait()
            nursery.start_soon(steer)
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
        record = await host.store.load("s")
    answer = record.messages[-1]
    types = [c.type for c in seen["first"]]
    at = types.index("steered")
    assert seen["steered"] and seen["hands_over"]
    assert [c.type for c in seen["rest"]] == ["start", *types[at + 1 :]]
    assert seen["rest"][0].message_id == answer.id == seen["first"][at].answer_id
    assert answer.text == "answer to both"


async def test_a_followed_steer_left_before_the_turn_took_it_hands_nothing_over():
    """The steering caller leaves while its message waits for the boundary: it never
    joins, and the running stream has nobody to hand over to (it shows the whole turn)."""
    script = Script(holding(), ["only the first"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        seen: dict = {}

        async def first() -> None:
            async with session.stream("first") as out:
                seen["first"] = [c async for c in out]
                seen["hands_over"] = out.hands_over("u2")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await held["open"].wait()
            leaving = trio.CancelScope()

            async def steer() -> None:
                with leaving:
                    async with session.stream("also this", user_message_id="u2", follow=True):
                        pass

            nursery.start_soon(steer)
            await trio.testing.wait_all_tasks_blocked()
            assert session.waiting_inputs == 1
            leaving.cancel()
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
        record = await host.store.load("s")
    assert seen["hands_over"] is False
    assert "steered" not in [c.type for c in seen["first"]]
    assert kinds(record.messages) == ["User", "Assistant", "Tool"]  # no steered message


async def test_a_steered_message_taken_again_under_its_stored_id_is_stored_once():
    """A worker's turn takes at each step boundary what front ends recorded to steer it
    (``TurnSteering.pull``): a client's retry of a steered message whose first copy the
    turn took already (the retry's row is another) joins as that copy, acknowledged,
    not stored a second time under the same id nor shown to the model twice."""
    script = Script(looking("L1"), looking("L2"), ["answer"])
    retry = SteeredInput(content="also this", user_message_id="u2")
    rows = [[SteeredInput(content="also this", user_message_id="u2")], [retry]]

    async def pull() -> list[SteeredInput]:
        return rows.pop(0) if rows else []

    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        stream = session.stream("first", user_message_id="u1")
        stream.steer_from(pull)
        async with stream as out:
            await out.collect()
        record = await host.store.load("s")
    assert [m.id for m in record.messages if isinstance(m, UserMessage)] == ["u1", "u2"]
    seen = script.requests[2].messages
    assert [m.text for m in seen if isinstance(m, UserMessage)] == ["first", "also this"]
    assert retry.accepted and retry.stored.is_set()
    assert out.result.text == "answer"


async def test_a_steer_retried_after_an_earlier_turn_answered_it_says_so_in_the_stream():
    """A steering message whose id an earlier turn stored and answered (a client's retry
    of it, taken by a worker's turn) is not stored again; the turn's AI SDK stream says
    so as a first steer does, ``data-steered`` naming the message, now ``answered`` and
    with the answer stored after it: a front end following it saw nothing of it before
    (no chunk), only the end of a turn that was not its answer."""
    script = Script(["answer 1"], looking("L1"), ["answer 2"])
    rows = [[SteeredInput(content="first", user_message_id="u1")]]

    async def pull() -> list[SteeredInput]:
        return rows.pop(0) if rows else []

    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        async with session.stream("first", user_message_id="u1") as out:
            await out.collect()
        first_answer = out.answer_ids[0]
        stream = session.stream("second", user_message_id="u2")
        stream.steer_from(pull)
        async with stream as out:
            chunks = await out.collect()
        record = await host.store.load("s")
    encoder = UIStreamEncoder()
    steered = [c for chunk in chunks for c in encoder.encode(chunk) if c["type"] == "data-steered"]
    assert steered == [
        {
            "type": "data-steered",
            "id": "u1",
            "data": {
                "messageId": "u1",
                "text": "first",
                "step": 1,
                "answerId": first_answer,
                "answered": True,
            },
            "transient": True,
        }
    ]
    assert [m.id for m in record.messages if isinstance(m, UserMessage)] == ["u1", "u2"]


async def test_a_message_steered_in_under_the_id_its_answer_takes_is_refused():
    """A steered message's answer goes to ``<first>-s<step>``
    (:func:`actors.turn.takeover.steered_message_id`): a user message sent into the
    running turn under that id would share it with its answer. Refused as a resend is
    (:class:`~runtime.errors.InputHeld`, the web's 409), nothing of it stored."""
    script = Script(looking(), holding(), ["done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()  # step 1's tool runs: a steer joins at step 2
            first = session.current.answer_ids[0]
            with pytest.raises(InputHeld):
                async with session.stream("x", user_message_id=f"{first}-s2") as out:
                    await out.collect()
            held["release"].set()
        record = await host.store.load("s")
    ids = [m.id for m in record.messages]
    assert len(ids) == len(set(ids)) and f"{first}-s2" not in ids
