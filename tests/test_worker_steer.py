"""``serve --on-busy steer`` in a worker deployment (real PostgreSQL and Redis, a front end
and a worker as tests/test_frontend.py runs them): a message for a session whose turn runs
on a worker is queued naming that turn, the worker takes it at its next step boundary,
the model sees it before its next call, and the store holds it where the model saw it.
A turn that ends before a boundary leaves it to run as a turn of its own."""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio

from actors.providers.anthropic import map_messages as anthropic_messages
from actors.providers.openai import map_messages as openai_messages
from actors.providers.openai_responses import map_messages as responses_messages
from runtime.app.web.frontend import FrontEnd
from runtime.app.web.http import ApiError
from runtime.history import repair
from runtime.messages import AssistantMessage, UserMessage
from runtime.turn_queue import TurnOptions
from tests import test_busy
from tests.support.redis import require_redis
from tests.test_busy import Script, agent_with, holding, kinds, looking
from tests.test_frontend import LIMIT, body, data, deployment
from tests.test_relay_web import sse_events


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    test_busy.held["open"], test_busy.held["release"] = trio.Event(), trio.Event()


async def queued(queue: Any, session_id: str, count: int) -> list[Any]:
    while True:
        turns = await queue.turns(session_id)
        if len(turns) >= count:
            return turns
        await trio.sleep(0.02)


@asynccontextmanager
async def steering_in_step_1(d: Any, out: dict[str, Any], text: str) -> AsyncIterator[None]:
    """Post ``first`` (``u1``) to session ``s1`` on front end 0 and, once step 1's tool
    holds, ``text`` (``u2``), their responses into ``out`` by name (``first``,
    ``steered``); the body runs once the steering row is queued, step 1's tool released
    after it; both POSTs answered on leaving."""
    async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
        async with trio.open_nursery() as nursery:

            async def post(name: str, text: str, message_id: str) -> None:
                out[name] = await client.post("/api/chat", json=body("s1", text, message_id))

            nursery.start_soon(post, "first", "first", "u1")
            await test_busy.held["open"].wait()  # step 1 is open: its tool runs
            nursery.start_soon(post, "steered", text, "u2")
            await queued(d.queue, "s1", 2)
            yield
            test_busy.held["release"].set()


async def steer_during_step_1(pg_url: str, redis_url: str) -> dict[str, Any]:
    """Run ``first`` (look, hold, answer) on a worker; post ``also this`` while step 1's
    tool holds; what came back and what was stored."""
    script = Script(looking("call_L"), holding("call_H"), ["answer to both"])
    out: dict[str, Any] = {"script": script}
    async with deployment(pg_url, redis_url, agent_with(script, "steer"), on_busy="steer") as d:
        async with steering_in_step_1(d, out, "also this"):
            assert len(script.requests) == 2  # no model call until the boundary
        out["turns"] = await d.queue.turns("s1")
        out["record"] = await d.store.load("s1")
    return out


async def test_a_message_steered_during_step_1_is_seen_before_step_2s_model_call(
    pg_url: str, redis_url: str
) -> None:
    out = await steer_during_step_1(pg_url, redis_url)
    first, steering = out["turns"]
    assert (first.status, first.finish_reason) == ("done", "stop")
    assert (steering.status, steering.finish_reason) == ("done", "steered")
    assert steering.steer_of == first.turn_id
    assert out["steered"].status_code == 202
    assert out["steered"].json() == {
        "steered": True,
        "turnId": first.turn_id,
        "messageId": "u2",
        "answered": False,
    }
    # step 2's request: the steered message after step 1's tool result
    seen = out["script"].requests[2].messages
    assert kinds(seen) == ["User", "Assistant", "Tool", "Tool", "User", "Assistant"]
    assert seen[4].text == "also this" and seen[4].id == "u2"
    # the first POST streamed the whole turn, answer included, and the steered message
    # live (through the relay), before the step that first saw it
    chunks = data(sse_events(out["first"].text))
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == "answer to both"
    types = [c["type"] for c in chunks]
    at = types.index("data-steered")
    assert types[at + 1] == "start-step" and types[:at].count("start-step") == 2
    assert chunks[at]["data"] == {
        "messageId": "u2",
        "text": "also this",
        "step": 2,
        "answerId": f"{chunks[0]['messageId']}-s2",  # where the answer is stored
    }
    assert chunks[at]["transient"] is True
    record = out["record"]
    assert record is not None and kinds(record.messages) == kinds(seen)
    assert isinstance(record.messages[4], UserMessage) and record.messages[4].id == "u2"
    answer = record.messages[5]
    assert isinstance(answer, AssistantMessage) and answer.text == "answer to both"


async def test_the_steered_history_a_worker_stored_replays_to_each_provider(
    pg_url: str, redis_url: str
) -> None:
    out = await steer_during_step_1(pg_url, redis_url)
    history = tuple(repair(out["record"].messages))
    chat = openai_messages(None, history)
    assert [m["role"] for m in chat] == [
        *("user", "assistant", "tool", "assistant", "tool", "user", "assistant"),
    ]
    assert chat[5]["content"] == "also this" or chat[5]["content"][0]["text"] == "also this"
    items = responses_messages(history)
    assert [i.get("type") or i["role"] for i in items][-2:] == ["user", "assistant"]
    _system, messages = anthropic_messages(None, history)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3
    last_user = messages[4]["content"]
    assert [b["type"] for b in last_user] == ["tool_result", "text"]
    assert last_user[1]["text"] == "also this"


async def test_a_steering_message_the_turn_ends_without_taking_runs_as_its_own_turn(
    pg_url: str, redis_url: str
) -> None:
    script = Script(["first done"], ["second done"])
    async with deployment(
        pg_url, redis_url, agent_with(script, "steer"), on_busy="steer", worker=False
    ) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                out: dict[str, Any] = {}

                async def post(name: str, text: str, message_id: str) -> None:
                    out[name] = await client.post("/api/chat", json=body("s1", text, message_id))

                nursery.start_soon(post, "first", "first", "u1")
                # claimed by hand ("nobody" never reaches a boundary), then released:
                # the worker takes it over and ends it in one step, taking nothing
                await queued(d.queue, "s1", 1)
                claim = await d.queue.claim("nobody")
                assert claim is not None
                nursery.start_soon(post, "second", "second", "u2")
                turns = await queued(d.queue, "s1", 2)
                assert turns[1].steer_of == claim.turn.turn_id
                await d.queue.release(claim)  # a worker takes the turn over
                await d.start_worker()
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert [(t.status, t.finish_reason) for t in turns] == [("done", "stop"), ("done", "stop")]
    assert out["second"].status_code == 200
    streamed = data(sse_events(out["second"].text))
    assert "".join(c["delta"] for c in streamed if c["type"] == "text-delta") == "second done"
    assert record is not None
    assert [m.text for m in record.messages if isinstance(m, UserMessage)] == ["first", "second"]
    assert kinds(record.messages) == ["User", "Assistant", "User", "Assistant"]


class CountedSteering:
    """The worker's steering reads, counted: ``Worker._take_steering`` (called at every
    step boundary) and the queue's read of the steering rows (``take_steering``)."""

    def __init__(self, worker: Any) -> None:
        self.boundaries = 0
        self.reads = 0
        self.after_boundary: Any = None
        """Awaited once after the next boundary's look (a steer submitted right then)."""
        boundary, read = worker._take_steering, worker.queue.take_steering

        async def counted_boundary(*args: Any) -> Any:
            self.boundaries += 1
            got = await boundary(*args)
            then, self.after_boundary = self.after_boundary, None
            if then is not None:
                await then()
            return got

        async def counted_read(*args: Any) -> Any:
            self.reads += 1
            return await read(*args)

        worker._take_steering = counted_boundary
        worker.queue.take_steering = counted_read


async def test_a_turn_nobody_steers_reads_no_steering_at_its_boundaries(
    pg_url: str, redis_url: str
) -> None:
    """The steering count rides on each step's fenced save: a turn no message steers
    never reads the steering rows (it used to, at every step boundary)."""
    script = Script(looking("call_L"), looking("call_M"), ["done"])
    async with deployment(
        pg_url, redis_url, agent_with(script, "steer"), on_busy="steer", worker=False
    ) as d:
        counted = CountedSteering(await d.start_worker())
        turn = await d.queue.submit("s1", "first")
        with trio.fail_after(LIMIT):
            done = await d.queue.wait_finished(turn.turn_id, LIMIT)
    assert done is not None and (done.status, done.finish_reason) == ("done", "stop")
    assert counted.boundaries == 2  # before steps 1 and 2
    assert counted.reads == 0


async def test_a_steer_submitted_right_after_a_boundary_is_taken_at_the_next(
    pg_url: str, redis_url: str
) -> None:
    """A steering message committed just after a boundary looked (and found none) is
    counted on the turn's row; the next step's save reads the count, so the next
    boundary reads the row: one read, and the model's next call sees the message."""
    script = Script(looking("call_L"), looking("call_M"), ["answer to both"])
    async with deployment(
        pg_url, redis_url, agent_with(script, "steer"), on_busy="steer", worker=False
    ) as d:
        counted = CountedSteering(await d.start_worker())
        steering: dict[str, Any] = {}

        async def steer() -> None:
            steering["turn"] = await d.queue.submit("s1", "also this", on_busy="steer")

        counted.after_boundary = steer  # at the first boundary, before step 1
        turn = await d.queue.submit("s1", "first")
        with trio.fail_after(LIMIT):
            done = await d.queue.wait_finished(turn.turn_id, LIMIT)
            steered = await d.queue.get(steering["turn"].turn_id)
    assert done is not None and (done.status, done.finish_reason) == ("done", "stop")
    assert steering["turn"].steer_of == turn.turn_id
    assert steered is not None and (steered.status, steered.finish_reason) == ("done", "steered")
    assert counted.boundaries == 2 and counted.reads == 1
    assert len(script.requests) == 3
    assert [m.text for m in script.requests[1].messages if isinstance(m, UserMessage)] == ["first"]
    seen = script.requests[2].messages
    assert kinds(seen) == ["User", "Assistant", "Tool", "Tool", "User", "Assistant"]
    assert seen[4].text == "also this"


def following(session_id: str, answer_id: str) -> dict[str, Any]:
    """What ``useChat`` posts when it sends "also this" while the answer ``answer_id`` to
    "first" streams: the whole conversation, that answer so far right before the new
    message."""
    sent = body(session_id, "also this", "u2")
    answer = {"id": answer_id, "role": "assistant", "parts": [{"type": "step-start"}]}
    first = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "first"}]}
    sent["messages"] = [first, answer, *sent["messages"]]
    return sent


async def steer_from_the_answer(pg_url: str, redis_url: str) -> dict[str, Any]:
    """``first`` streamed from front end 0; ``also this`` posted to front end 1 while
    step 1's tool holds, by the client showing the turn's answer (:func:`following`)."""
    script = Script(looking("call_L"), holding("call_H"), ["answer to both"])
    out: dict[str, Any] = {}
    async with deployment(
        pg_url, redis_url, agent_with(script, "steer"), on_busy="steer", fronts=2
    ) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def post(name: str, url: str, sent: dict[str, Any]) -> None:
                    out[name] = await client.post(f"{url}/api/chat", json=sent)

                nursery.start_soon(post, "first", d.urls[0], body("s1", "first", "u1"))
                await test_busy.held["open"].wait()  # step 1 is open: its tool runs
                (turn,) = await d.queue.turns("s1")
                out["answer"] = f"msg_{turn.turn_id}"
                nursery.start_soon(post, "steered", d.urls[1], following("s1", out["answer"]))
                await queued(d.queue, "s1", 2)
                test_busy.held["release"].set()
            stored = await client.get(f"{d.urls[0]}/api/sessions/s1")
            # the steering POST again, on the other front end, having seen 3 events
            seen = sse_events(out["steered"].text)[2][0]
            out["seen"] = int(seen)
            out["resumed"] = await client.post(
                f"{d.urls[0]}/api/chat",
                json=following("s1", out["answer"]),
                headers={"last-event-id": seen},
            )
        out["ui"] = stored.json()["ui_messages"]
        out["turns"] = await d.queue.turns("s1")
    return out


async def test_a_message_steered_from_the_answer_it_shows_gets_the_rest_of_the_turn(
    pg_url: str, redis_url: str
) -> None:
    """The client that shows the turn's answer and sends a message meanwhile (``useChat``)
    gets the rest of the turn as that message's answer, read from the relay on another
    front end; the stream it showed the answer in ends where the message joined. It
    answered 202 and the first stream went on: the client showed the message at the
    bottom, unanswered, the answer growing above it."""
    out = await steer_from_the_answer(pg_url, redis_url)
    first = sse_events(out["first"].text)
    assert first[-1][1] == "[DONE]"
    firsts = data(first)
    assert [c["type"] for c in firsts[-2:]] == ["data-steered", "finish"]
    answer_id = f"{out['answer']}-s2"
    assert firsts[-1]["messageMetadata"] == {
        "finishReason": "steered",
        "steeredBy": "u2",
        "answerId": answer_id,
    }
    assert not any(c["type"] == "text-delta" for c in firsts)
    assert out["steered"].status_code == 200, out["steered"].text
    rest = sse_events(out["steered"].text)
    assert rest[-1][1] == "[DONE]"
    rests = data(rest)
    assert rests[0] == {"type": "start", "messageId": answer_id}
    assert [c["type"] for c in rests[1:3]] == ["start-step", "text-start"]
    assert "".join(c["delta"] for c in rests if c["type"] == "text-delta") == "answer to both"
    assert rests[-1]["type"] == "finish" and "data-steered" not in [c["type"] for c in rests]
    ids = [(m["id"], m["role"]) for m in out["ui"]]
    assert ids == [
        ("u1", "user"),
        (out["answer"], "assistant"),
        ("u2", "user"),
        (answer_id, "assistant"),
    ]
    assert [(t.status, t.finish_reason) for t in out["turns"]] == [
        ("done", "stop"),
        ("done", "steered"),
    ]


async def test_a_steering_post_resumed_with_last_event_id_sends_only_what_followed(
    pg_url: str, redis_url: str
) -> None:
    """Sent again with the ``Last-Event-ID`` of its third event, on the other front end,
    the steering POST sends what came after that event, no ``start`` again."""
    out = await steer_from_the_answer(pg_url, redis_url)
    assert out["resumed"].status_code == 200
    whole = sse_events(out["steered"].text)
    resumed = sse_events(out["resumed"].text)
    assert resumed == whole[3:]
    assert all(int(i) > out["seen"] for i, _ in resumed if i is not None)


async def test_a_second_steer_from_the_steered_answer_hands_over_again(
    pg_url: str, redis_url: str
) -> None:
    """The client steers "also this" from the turn's answer (front end 1), then "and
    this" from the answer the first steer started (front end 0): each stream ends where
    the next message joined, each answer shows once, in the order the session stores."""
    script = Script(looking("call_L"), holding("call_H"), holding("call_I"), ["answer to all"])
    out: dict[str, Any] = {}
    held = test_busy.held
    async with deployment(
        pg_url, redis_url, agent_with(script, "steer"), on_busy="steer", fronts=2
    ) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def post(name: str, url: str, sent: dict[str, Any]) -> None:
                    out[name] = await client.post(f"{url}/api/chat", json=sent)

                nursery.start_soon(post, "first", d.urls[0], body("s1", "first", "u1"))
                await held["open"].wait()  # step 1's tool holds
                (turn,) = await d.queue.turns("s1")
                answer = f"msg_{turn.turn_id}"
                nursery.start_soon(post, "second", d.urls[1], following("s1", answer))
                await queued(d.queue, "s1", 2)
                release = held["release"]
                held["open"], held["release"] = trio.Event(), trio.Event()
                release.set()
                await held["open"].wait()  # step 2's tool holds
                third = following("s1", f"{answer}-s2")
                third["messages"][-1] = {
                    "id": "u3",
                    "role": "user",
                    "parts": [{"type": "text", "text": "and this"}],
                }
                nursery.start_soon(post, "third", d.urls[0], third)
                await queued(d.queue, "s1", 3)
                held["release"].set()
            stored = (await client.get(f"{d.urls[1]}/api/sessions/s1")).json()["ui_messages"]
    streams = [data(sse_events(out[name].text)) for name in ("first", "second", "third")]
    assert [out[n].status_code for n in ("first", "second", "third")] == [200, 200, 200]
    ends = [(s[-1]["type"], s[-1].get("messageMetadata", {}).get("steeredBy")) for s in streams]
    assert ends == [("finish", "u2"), ("finish", "u3"), ("finish", None)]
    starts = [s[0]["messageId"] for s in streams]
    assert starts == [answer, f"{answer}-s2", f"{answer}-s3"]
    calls = [[c["toolCallId"] for c in s if c["type"] == "tool-input-available"] for s in streams]
    assert calls == [["call_L", "call_H"], ["call_I"], []]
    assert "".join(c["delta"] for c in streams[2] if c["type"] == "text-delta") == "answer to all"
    assert [m["id"] for m in stored] == [
        *("u1", answer, "u2", f"{answer}-s2", "u3", f"{answer}-s3"),
    ]


async def stop_a_taken_steer(pg_url: str, redis_url: str, *, marked: bool) -> dict[str, Any]:
    """``first`` holds in step 1's tool; ``also this`` is steered in at the boundary,
    and the turn then holds again (in step 2's tool, the steering row still ``queued``
    till that step's save; with ``marked``, in step 3's, that row ``done``,
    ``steered``): the stop naming ``u2`` sent then, and what the turn did."""
    script = Script(holding("H1"), *([looking("L")] if marked else []), holding("H2"), ["never"])
    held = test_busy.held
    out: dict[str, Any] = {"script": script}
    async with deployment(pg_url, redis_url, agent_with(script, "steer"), on_busy="steer") as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def post(name: str, text: str, message_id: str) -> None:
                    out[name] = await client.post("/api/chat", json=body("s1", text, message_id))

                nursery.start_soon(post, "first", "first", "u1")
                await held["open"].wait()  # step 1's tool holds
                nursery.start_soon(post, "steered", "also this", "u2")
                await queued(d.queue, "s1", 2)
                first = held["release"]
                held["open"], held["release"] = trio.Event(), trio.Event()
                first.set()  # the boundary takes "also this"; a later tool holds
                await held["open"].wait()
                out["row"] = (await d.queue.turns("s1"))[1].status
                out["stop"] = await client.post("/api/chat/s1/stop", json={"messageId": "u2"})
                with trio.move_on_after(LIMIT):  # (before: it ran until released)
                    while "first" not in out:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                held["release"].set()
        out["turns"] = await d.queue.turns("s1")
        out["record"] = await d.store.load("s1")
    return out


@pytest.mark.parametrize("marked", [False, True], ids=["row-queued", "row-steered"])
async def test_a_stop_naming_a_message_the_running_turn_took_stops_that_turn(
    pg_url: str, redis_url: str, marked: bool
) -> None:
    """Stop pressed for ``also this`` after the worker's turn took it in: the rest of the
    turn is its answer, so the stop stops the turn, as a stop naming the turn's own
    message does (the embedded app's ``TurnStream.named_by``). Before, the row marked
    ``steered`` was found by no key (204), and the row still queued was cancelled
    (202) while the turn that had taken it ran on, to its end, either way."""
    out = await stop_a_taken_steer(pg_url, redis_url, marked=marked)
    turns, record = out["turns"], out["record"]
    assert out["row"] == ("done" if marked else "queued")
    assert out["stop"].status_code == 202, out["stop"].text
    if marked:
        assert out["stop"].json()["turn_id"] == turns[0].turn_id
    assert turns[0].status == "cancelled"
    assert record is not None and "never" not in str(record.messages)
    users = [m.text for m in record.messages if isinstance(m, UserMessage)]
    assert users == ["first", "also this"]
    assert '"type":"abort"' in out["first"].text


async def test_a_followed_steer_an_earlier_turn_answered_ends_at_its_answered_chunk() -> None:
    """The stream of a client following its steer (another front end's relay read) whose
    message an earlier turn stored and answered ends at the turn's ``steered`` chunk for
    it (``answered``): ``data-steered``, then ``finish`` (``steered``, naming that
    answer), as the stream a first steer hands over from ends; before, no chunk came and
    it showed the end of a turn that was not its answer."""
    from runtime import output as o
    from runtime.app.web.frontend import SteeredTurnResponse
    from runtime.app.web.resume import RelayEncoder

    chunks = [
        o.Start(message_id="msg_t2", seq=1),
        o.Steered(step=1, message_id="u1", text="first", answer_id="msg_t1", answered=True, seq=2),
        o.StepStart(step=1, seq=3),
        o.TextStart(step=1, part_id="p", seq=4),
        o.TextDelta(step=1, part_id="p", text="answer 2", seq=5),
    ]

    async def read() -> Any:
        for chunk in chunks:
            yield chunk

    response = SteeredTurnResponse(
        None, None, "s1", "t2", after_seq=None, keepalive=0, send_timeout=None,
        background=None, queue=None, watch=object(), steered_by="u1", resume_after=None,
    )  # fmt: skip
    response._read = read  # type: ignore[method-assign]
    sent: list[bytes] = []

    async def write(data: bytes) -> None:
        sent.append(data)

    await response._relay_events(write, RelayEncoder())
    events = data(sse_events(b"".join(sent).decode()))
    assert [e["type"] for e in events] == ["data-steered", "finish"]
    assert events[0]["data"]["answered"] is True
    assert events[1]["messageMetadata"] == {
        "finishReason": "steered",
        "steeredBy": "u1",
        "answerId": "msg_t1",
        "answered": True,
    }


async def test_a_steer_an_earlier_turn_answered_says_so_in_its_202(
    pg_url: str, redis_url: str
) -> None:
    """A steering message whose id an earlier turn stored and answered (its first copy
    queued under another key: a client's retry) is taken as held; the 202 says
    ``answered`` as the turn's ``steered`` chunk does (and the embedded app's 202)."""
    again, record = await steer_an_answered_message(pg_url, redis_url)
    assert again.status_code == 202, again.text
    assert again.json()["answered"] is True
    assert record is not None
    assert [m.id for m in record.messages if isinstance(m, UserMessage)] == ["u1", "u2"]


def relay_that_lost(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The front end's reads of a turn's relay stream (``follow_turn``) as a relay that
    lost the ``steered`` chunks: ``lost``, left out of the stream (a trimmed stream, a
    Redis restart), ``gap``, the read refused as not whole, or ``silent``, a read that
    shows nothing and never ends (as a live read of a turn that runs on would, were
    the turn not to end)."""
    from runtime.app.web import frontend
    from runtime.errors import RelayTurnGone
    from runtime.output import Steered

    real, answering = frontend.follow_turn, frontend.FrontEnd._steer_answered
    steer_read = contextvars.ContextVar("steer_read", default=False)

    async def steer_answered(self: Any, turn: Any) -> bool:
        steer_read.set(True)  # (this task's: the 202's read of the relay)
        return await answering(self, turn)

    async def lossy(relay: Any, queue: Any, turn_id: str, **kw: Any) -> Any:
        if how == "gap":
            raise RelayTurnGone(f"turn {turn_id!r}: a gap in its stream")
        if how == "silent" and steer_read.get():  # (the turn's own POST reads it whole)
            await trio.sleep_forever()
        async for chunk in real(relay, queue, turn_id, **kw):
            if type(chunk) is not Steered:
                yield chunk

    monkeypatch.setattr(frontend, "follow_turn", lossy)
    monkeypatch.setattr(frontend.FrontEnd, "_steer_answered", steer_answered)


async def steer_an_answered_message(pg_url: str, redis_url: str) -> tuple[Any, Any]:
    """``u1`` stored and answered by an earlier turn (queued under another key), then
    steered into the running turn of ``u2`` by a client's retry: its 202, and the
    session as stored once the turns ended."""
    from runtime.turn_queue import TurnOptions

    script = Script(["answer 1"], looking("call_L"), holding("call_H"), ["answer 2"])
    out: dict[str, Any] = {}
    async with deployment(pg_url, redis_url, agent_with(script, "steer"), on_busy="steer") as d:
        options = TurnOptions(user_message_id="u1")
        earlier = await d.queue.submit("s1", "first", idempotency_key="other", options=options)
        while True:
            status = await d.queue.get_status(earlier.turn_id)
            if status is not None and status.status == "done":
                break
            await trio.sleep(0.02)
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def post(name: str, text: str, message_id: str) -> None:
                    out[name] = await client.post("/api/chat", json=body("s1", text, message_id))

                nursery.start_soon(post, "second", "second", "u2")
                await test_busy.held["open"].wait()
                nursery.start_soon(post, "again", "first", "u1")
                await queued(d.queue, "s1", 3)
                test_busy.held["release"].set()
        record = await d.store.load("s1")
    return out["again"], record


@pytest.mark.parametrize("how", ["lost", "gap", "silent"])
async def test_a_steers_202_says_answered_from_the_store_when_the_relay_lost_its_chunk(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    relay_that_lost(monkeypatch, how)
    again, _ = await steer_an_answered_message(pg_url, redis_url)
    assert again.status_code == 202, again.text
    assert again.json()["answered"] is True


async def test_a_first_steers_202_says_not_answered_from_the_store_when_the_relay_lost_it(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay_that_lost(monkeypatch, "gap")
    out = await steer_during_step_1(pg_url, redis_url)
    assert out["steered"].status_code == 202
    assert out["steered"].json()["answered"] is False


async def test_a_message_steered_in_under_the_id_its_answer_takes_is_refused(
    pg_url: str, redis_url: str
) -> None:
    """``msg_<turn id>-s<step>`` is where the running turn's answer goes after a steered
    message (:func:`actors.turn.takeover.steered_message_id`): a steering message under
    it would share one id with that answer. 409, as the embedded app's ``InputHeld``;
    nothing of it queued or stored."""
    steer, turns, record = await _sent_under_the_running_answers_id(
        pg_url, redis_url, "steer", suffix="-s2"
    )
    assert steer.status_code == 409, steer.text
    assert len(turns) == 1
    named = f"msg_{turns[0].turn_id}-s2"
    ids = [m.id for m in record.messages]
    assert len(ids) == len(set(ids)) and named not in ids


async def _sent_under_the_running_answers_id(
    pg_url: str, redis_url: str, on_busy: str, suffix: str = ""
) -> tuple[httpx.Response, list[Any], Any]:
    """A second message posted while the first's turn runs (step 1's tool held), under
    ``msg_<turn id>`` (the running turn's first answer's id; ``suffix`` ``-s2``: the
    answer's after a message steered in at step 2): its answer, the session's turns,
    the stored history."""
    script = Script(looking("call_L"), holding("call_H"), ["done"], ["done2"])
    out: dict[str, Any] = {}
    busy = {"on_busy": on_busy} if on_busy != "enqueue" else {}
    async with deployment(pg_url, redis_url, agent_with(script, on_busy), **busy) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def post(name: str, text: str, message_id: str) -> None:
                    out[name] = await client.post("/api/chat", json=body("s1", text, message_id))

                nursery.start_soon(post, "first", "first", "u1")
                await test_busy.held["open"].wait()
                (turn,) = await d.queue.turns("s1")
                nursery.start_soon(post, "second", "x", f"msg_{turn.turn_id}{suffix}")
                while True:  # answered, or queued
                    if "second" in out or len(await d.queue.turns("s1")) >= 2:
                        break
                    await trio.sleep(0.02)
                test_busy.held["release"].set()
        turns = await d.queue.turns("s1")
        for queued in turns:
            await d.queue.wait_finished(queued.turn_id, LIMIT)
        record = await d.store.load("s1")
    return out["second"], turns, record


@pytest.mark.parametrize("on_busy", ["steer", "enqueue"])
async def test_a_message_sent_under_the_running_turns_first_answer_id_is_refused(
    pg_url: str, redis_url: str, on_busy: str
) -> None:
    """Steered in, the runner took it for a message the history holds and dropped it
    (a 202, ``x`` never stored); queued, it was stored under an id of the worker's.
    409 under either, as the embedded app's ``InputHeld`` while busy."""
    second, turns, record = await _sent_under_the_running_answers_id(pg_url, redis_url, on_busy)
    assert second.status_code == 409, second.text
    assert "gives its answer" in second.json()["error"]
    assert len(turns) == 1
    ids = [m.id for m in record.messages]
    assert len(ids) == len(set(ids))
    assert [m.text for m in record.messages if isinstance(m, UserMessage)] == ["first"]


async def test_any_protocols_submit_under_an_unended_turns_answer_id_is_refused() -> None:
    """The check is the front end's submit's (AG-UI, A2A and the AI SDK all queue
    through it with the client's message id), not the AI SDK endpoint's alone: an A2A
    ``messageId`` of ``msg_<turn>`` was queued and stored under the worker's id."""

    class Queue:
        async def get_status(self, turn_id: str) -> Any:
            return SimpleNamespace(
                turn_id=turn_id, session_id="s1", finished=False, message_id=f"msg_{turn_id}"
            )

        async def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("queued")

    queue = Queue()
    front = FrontEnd(store=queue, queue=queue, relay=None)
    for named in ("msg_T", "msg_T-s2"):
        with pytest.raises(ApiError) as refused:
            await front.submit(
                "s1", "x", "k", False, options=TurnOptions(user_message_id=named), titled=False
            )
        assert refused.value.status == 409 and "gives its answer" in refused.value.message
