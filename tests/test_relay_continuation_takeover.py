"""A takeover of a turn's continuation whose first part's stream never got its pause
(chaos seed 3, 2026-12-07, ``benchmarks/journal/workers.md``): the stream's shape as the
workers left it, each writer opened as :meth:`runtime.app.worker.Worker._turn_writer`
opens it for its claim, with no sleep and no worker process.

The worker that ran the first part committed the step that waits for approval and was
killed before it streamed that part's end (``finish`` ``awaiting-input``) and the pause.
The continuation's claim (``resumed``) would have written a ``gap`` (branch ``chaos2``,
``tests/test_relay.py::test_a_continuation_whose_stream_has_no_pause_is_a_gap``), but its
worker died before its writer's first flush. The worker that then takes the turn over
holds a takeover's claim (``takeover=True, resumed=False``): its writer does not ask
whether the stream ends with its pause, and goes on after the first part's last entry
(``prev`` naming that writer). Its ``start`` (same message id, no pause read in between)
is dropped by readers as a takeover's repeat: a reader of the first part is shown the
continuation after the wait's ``step-finish`` without the wait's end, and is not told;
the approving client's read (``after_pauses=1``) waits for a pause that never comes and
ends with nothing.

The takeover's writer now knows the turn waited (``writer(pauses=)``, the claimed row's
``resumes``): a takeover whose stream does not end with a pause counts the stream's pauses
(one scan, only then) and writes a ``gap`` when it holds fewer. Not when the dead claimer
streamed the continuation's first entries after the pause (no false gap), nor for a
continuation this process claims while the part before it is still ending here (its
writer reads the tail once that one is closed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from actors.relays import RedisRelay
from runtime import output as o
from runtime.app.worker import Worker
from runtime.chunks import Usage
from runtime.errors import RelayTurnGone
from tests.support.redis import require_redis, unique_prefix

USAGE = Usage(input_tokens=1, output_tokens=1, total_tokens=2)
ASKED = [  # the first part as streamed, up to the wait's step-finish (seqs 1..5)
    o.Start(message_id="m1", turn_id="t", session_id="s"),
    o.StepStart(step=0),
    o.ToolCall(step=0, tool_call_id="c", tool_name="guarded", input={}),
    o.ToolApprovalRequest(step=0, tool_call_id="c", tool_name="guarded", approval_id="a"),
    o.StepFinish(step=0, finish_reason="tool-calls", usage=USAGE),
]
GOES_ON = [  # the continuation as the takeover streams it
    o.Start(message_id="m1", turn_id="t", session_id="s"),
    o.ToolResult(step=0, tool_call_id="c", tool_name="guarded", output="ok"),
    o.StepStart(step=1),
    o.TextStart(step=1, part_id="p1"),
    o.TextDelta(step=1, part_id="p1", text="done"),
    o.TextFinish(step=1, part_id="p1"),
    o.StepFinish(step=1, finish_reason="stop", usage=USAGE),
    o.Finish(finish_reason="stop", usage=USAGE),
]


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def claim(*, takeover: bool, resumed: bool, saved: bool, resumes: int = 0) -> Any:
    """What :meth:`Worker._turn_writer` reads of a claim (``resumes``: the turn row's,
    the waits it went on after)."""
    turn = SimpleNamespace(session_id="s", turn_id="t", saved=saved, resumes=resumes)
    return SimpleNamespace(turn=turn, takeover=takeover, resumed=resumed)


async def first_part_then_taken_over(relay: RedisRelay, *, paused: bool = False) -> None:
    """The first part's writer stops after the wait's ``step-finish`` (killed: no end, no
    pause; ``paused``: it ended its part as it should); the continuation's claimer writes
    nothing (killed before its first flush); the takeover's writer streams the
    continuation."""
    owner = SimpleNamespace(relay=relay)
    first = Worker._turn_writer(owner, claim(takeover=False, resumed=False, saved=False))
    for chunk in ASKED:
        first.append(chunk)
    if paused:
        first.append(o.Finish(finish_reason="awaiting-input", usage=USAGE))
    await first.aclose(final=paused, paused=paused)
    taken = Worker._turn_writer(owner, claim(takeover=True, resumed=False, saved=True, resumes=1))
    for chunk in GOES_ON:
        taken.append(chunk)
    await taken.aclose()


async def _pause_then_finish(
    relay: RedisRelay, first: Any, then: Any
) -> tuple[list[Any], list[Any]]:
    """The first part's writer ends its part with the wait's pause, then the
    continuation's writer (``GOES_ON`` but its finish streamed) its finish: the whole
    turn's stream, and what a reader after the pause is shown."""
    first.append(o.Finish(finish_reason="awaiting-input", usage=USAGE))
    await first.aclose(paused=True)
    then.append(GOES_ON[-1])
    await then.aclose()
    with trio.fail_after(10):
        whole = [c async for c in relay.read("t")]
        shown = [c async for c in relay.read("t", after_pauses=1)]
    return whole, shown


async def test_a_takeover_of_a_continuation_after_its_pause_shows_the_continuation(
    redis_url: str,
) -> None:
    """The control: the same claims, the first part's pause written; the approving
    client's read gets the continuation, its ``start`` first."""
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        await first_part_then_taken_over(relay, paused=True)
        with trio.fail_after(10):
            shown = [c async for c in relay.read("t", after_pauses=1)]
    assert [c.type for c in shown] == [c.type for c in GOES_ON]


async def test_a_first_part_reader_is_told_of_a_takeover_going_on_without_the_pause(
    redis_url: str,
) -> None:
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        await first_part_then_taken_over(relay)
        with trio.fail_after(10), pytest.raises(RelayTurnGone):
            shown = [c async for c in relay.read("t", after_seq=len(ASKED))]
            # before: 7:tool-result .. 13:finish, the wait's end missing, seq 6 dropped
            print([f"{c.seq}:{c.type}" for c in shown])


async def test_the_approvers_read_is_told_of_a_takeover_going_on_without_the_pause(
    redis_url: str,
) -> None:
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        await first_part_then_taken_over(relay)
        with trio.fail_after(10), pytest.raises(RelayTurnGone):
            shown = [c async for c in relay.read("t", after_pauses=1)]
            # before: nothing, and the read ends: the continuation is never shown
            print([f"{c.seq}:{c.type}" for c in shown])


class Counted:
    """The Redis commands the relay's writers send: the flusher's pipelines (on its own
    connection) and the takeover's pause count (``XRANGE`` through coredis)."""

    def __init__(self, relay: RedisRelay) -> None:
        self.names: list[str] = []
        connection = relay.batcher.connection
        assert connection is not None
        send, xrange = connection.pipeline, relay.client.xrange
        xread, evaluate = relay.client.xread, relay.client.eval

        async def pipeline(commands: list[list[Any]]) -> list[Any]:
            self.names.extend(str(command[0]) for command in commands)
            return await send(commands)

        async def counted_xrange(*args: Any, **kwargs: Any) -> Any:
            self.names.append("XRANGE")
            return await xrange(*args, **kwargs)

        async def counted_xread(*args: Any, **kwargs: Any) -> Any:
            self.names.append("XREAD")
            self.blocked.set()
            return await xread(*args, **kwargs)

        async def counted_eval(*args: Any, **kwargs: Any) -> Any:
            self.names.append("XRANGE")  # (a reader's page: XRANGEs bounded in bytes)
            return await evaluate(*args, **kwargs)

        self.blocked = trio.Event()
        """Set as the writer's first ``XREAD`` (a continuation's wait for its pause) goes."""
        connection.pipeline = pipeline  # type: ignore[method-assign]
        relay.client.xrange = counted_xrange
        relay.client.xread = counted_xread
        relay.client.eval = counted_eval

    def reads(self) -> list[str]:
        return [name for name in self.names if name in ("XREVRANGE", "XRANGE", "XREAD")]


async def test_a_takeover_after_the_dead_claimers_first_entries_goes_on_without_a_gap(
    redis_url: str,
) -> None:
    """The common takeover of a continuation: its claimer streamed its first entries
    after the pause, then died. The stream holds the pause: no gap, one scan."""
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        owner = SimpleNamespace(relay=relay)
        first = Worker._turn_writer(owner, claim(takeover=False, resumed=False, saved=False))
        first.extend([*ASKED, o.Finish(finish_reason="awaiting-input", usage=USAGE)])
        await first.aclose(paused=True)
        claimer = Worker._turn_writer(
            owner, claim(takeover=False, resumed=True, saved=True, resumes=1)
        )
        claimer.extend(GOES_ON[:2])  # start, tool-result
        await claimer.aclose(final=False)  # died
        counted = Counted(relay)
        taken = Worker._turn_writer(
            owner, claim(takeover=True, resumed=False, saved=True, resumes=1)
        )
        taken.extend([GOES_ON[0], *GOES_ON[2:]])
        await taken.aclose()
        assert counted.reads() == ["XREVRANGE", "XRANGE"]
        with trio.fail_after(10):
            whole = [c async for c in relay.read("t")]
            shown = [c async for c in relay.read("t", after_pauses=1)]
    assert [c.type for c in shown] == [c.type for c in GOES_ON]
    assert [c.type for c in whole] == [c.type for c in ASKED] + ["finish"] + [
        c.type for c in GOES_ON
    ]


@pytest.mark.parametrize(
    ("how", "reads"),
    [
        ("first claim", []),
        ("takeover of a turn that never waited", ["XREVRANGE"]),
        ("takeover of a continuation after its pause", ["XREVRANGE"]),
        ("continuation after its pause", ["XREVRANGE"]),
    ],
)
async def test_a_writer_counts_no_pauses_unless_a_continuations_tail_is_no_pause(
    redis_url: str, how: str, reads: list[str]
) -> None:
    """The common paths read no more of the stream than before: a first claim nothing, a
    takeover the tail only (its pause, for a continuation's)."""
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        owner = SimpleNamespace(relay=relay)
        if how == "first claim":
            made = claim(takeover=False, resumed=False, saved=False)
        else:
            dead = Worker._turn_writer(owner, claim(takeover=False, resumed=False, saved=False))
            dead.extend(ASKED)
            waited = how.endswith("pause")
            if waited:
                dead.append(o.Finish(finish_reason="awaiting-input", usage=USAGE))
            await dead.aclose(final=waited, paused=waited)
            continued = how.startswith("continuation")
            made = claim(takeover=not continued, resumed=continued, saved=True, resumes=int(waited))
        counted = Counted(relay)
        writer = Worker._turn_writer(owner, made)
        writer.extend(GOES_ON)
        await writer.aclose()
        assert counted.reads() == reads
        assert counted.names.count("XADD") == 1


async def test_a_continuation_claimed_here_while_its_first_part_ends_writes_no_gap(
    redis_url: str,
) -> None:
    """This worker claims the continuation while the first part's writer (the same
    worker's) has not streamed its end and pause yet: the continuation's writer reads
    the tail once that writer is closed. Before, its tail read went first in the
    flusher's pipeline, found the wait's ``step-finish`` and wrote a false ``gap`` (and
    numbered on at the pause's own seqs)."""
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        owner = SimpleNamespace(relay=relay)
        first = Worker._turn_writer(owner, claim(takeover=False, resumed=False, saved=False))
        first.extend(ASKED)
        await first.flushed()
        then = Worker._turn_writer(
            owner, claim(takeover=False, resumed=True, saved=True, resumes=1)
        )
        then.extend(GOES_ON[:-1])  # (not its finish yet: that would hold it for the close)
        whole, shown = await _pause_then_finish(relay, first, then)
    assert [c.type for c in shown] == [c.type for c in GOES_ON]
    assert len(whole) == len(ASKED) + 1 + len(GOES_ON)


async def test_a_takeover_of_a_continuation_that_finds_no_stream_is_a_gap(
    redis_url: str,
) -> None:
    """Redis lost the stream of a turn that waited: a takeover re-running step 0 is not
    the whole turn (its first part and pause are gone), so it is a ``gap``, not
    ``relay.from-start`` (which the approver's read, shown nothing, would take as whole,
    pass over waiting for the pause, and end empty)."""
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        owner = SimpleNamespace(relay=relay)
        taken = Worker._turn_writer(
            owner, claim(takeover=True, resumed=False, saved=True, resumes=1)
        )
        taken.extend([GOES_ON[0], o.StepStart(step=0), *GOES_ON[1:]])
        await taken.aclose()
        with trio.fail_after(10), pytest.raises(RelayTurnGone):
            shown = [c async for c in relay.read("t", after_pauses=1)]
            print([f"{c.seq}:{c.type}" for c in shown])


async def test_a_pause_count_redis_refuses_is_a_gap_and_the_relay_writes_on(
    redis_url: str,
) -> None:
    """The count's read refused (an ACL without ``XRANGE``, say): the takeover cannot
    tell, so readers rebuild from the store; the refusal does not end the relay's
    task (every other turn's writer goes on)."""
    from coredis.exceptions import ResponseError

    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise ResponseError("NOPERM this user has no permissions to run the 'xrange' command")

        owner = SimpleNamespace(relay=relay)
        first = Worker._turn_writer(owner, claim(takeover=False, resumed=False, saved=False))
        first.extend(ASKED)
        await first.aclose(final=False)
        relay.client.xrange = refused
        taken = Worker._turn_writer(
            owner, claim(takeover=True, resumed=False, saved=True, resumes=1)
        )
        taken.extend(GOES_ON)
        await taken.aclose()
        other = relay.writer(session_id="s2", turn_id="u", fresh=True)
        other.extend(GOES_ON)
        await other.aclose()
        del relay.client.xrange
        with trio.fail_after(10):
            with pytest.raises(RelayTurnGone):
                [c async for c in relay.read("t", after_pauses=1)]
            shown = [c async for c in relay.read("u")]
    assert [c.type for c in shown] == [c.type for c in GOES_ON]


async def test_a_continuation_another_worker_claims_before_the_pause_is_in_waits_for_it(
    redis_url: str,
) -> None:
    """Another worker claims the continuation while the suspending worker (alive) has
    not flushed its part's end and pause yet: the continuation's writer waits for the
    pause (``XREAD BLOCK`` on the stream) and numbers on after it. Before, its tail read
    found the wait's ``step-finish`` and wrote a false ``gap``: live readers lost the
    live stream (they rebuilt from the store)."""
    prefix = unique_prefix()
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as here,
        RedisRelay.open(redis_url, prefix=prefix) as there,
    ):
        first = Worker._turn_writer(
            SimpleNamespace(relay=here), claim(takeover=False, resumed=False, saved=False)
        )
        first.extend(ASKED)
        await first.flushed()
        counted = Counted(there)
        then = Worker._turn_writer(
            SimpleNamespace(relay=there),
            claim(takeover=False, resumed=True, saved=True, resumes=1),
        )
        then.extend(GOES_ON[:-1])
        with trio.fail_after(10):
            await counted.blocked.wait()  # its tail read found no pause: it waits
        whole, shown = await _pause_then_finish(here, first, then)
    assert [c.type for c in shown] == [c.type for c in GOES_ON]
    assert [c.type for c in whole] == [c.type for c in ASKED] + ["finish"] + [
        c.type for c in GOES_ON
    ]
    assert counted.reads()[0] == "XREVRANGE" and then.lost == 0


async def test_a_takeovers_pause_count_reads_pages_of_the_relays_page_bytes() -> None:
    """The pause count reads the stream from its start in a reader's pages: each reply
    at most the relay's ``page_bytes`` past its first entry. It asked ``XRANGE ...
    COUNT 256``, no byte bound: 256 entries of up to ``entry_bytes`` (64 MB at the
    defaults) in one reply, held and decoded at once. The count is still whole."""
    url = require_redis()
    async with RedisRelay.open(url, prefix=unique_prefix(), page_bytes=4096) as relay:
        owner = SimpleNamespace(relay=relay)
        first = Worker._turn_writer(owner, claim(takeover=False, resumed=False, saved=False))
        first.extend([ASKED[0], o.StepStart(step=0), o.TextStart(step=0, part_id="p0")])
        for n in range(60):
            first.append(o.TextDelta(step=0, part_id="p0", text=f"{n:03} " + "w" * 80))
            await first.flushed()  # an entry each
        first.extend([o.TextFinish(step=0, part_id="p0"), *ASKED[2:]])
        first.append(o.Finish(finish_reason="awaiting-input", usage=USAGE))
        await first.aclose(paused=True)
        claimer = Worker._turn_writer(
            owner, claim(takeover=False, resumed=True, saved=True, resumes=1)
        )
        claimer.extend(GOES_ON[:2])
        await claimer.aclose(final=False)  # died
        replies: list[list[int]] = []
        client = relay.client
        xrange, evaluate = client.xrange, client.eval

        def sizes(entries: Any) -> list[int]:
            return [sum(len(v) for v in entry[1]) for entry in entries]

        async def counted_xrange(*args: Any, **kwargs: Any) -> Any:
            page = await xrange(*args, **kwargs)
            replies.append([sum(map(len, e.field_values.values())) for e in page])
            return page

        async def counted_eval(*args: Any, **kwargs: Any) -> Any:
            more, page = await evaluate(*args, **kwargs)
            replies.append(sizes(page))
            return more, page

        client.xrange, client.eval = counted_xrange, counted_eval
        taken = Worker._turn_writer(
            owner, claim(takeover=True, resumed=False, saved=True, resumes=1)
        )
        taken.extend([GOES_ON[0], *GOES_ON[2:]])
        await taken.aclose()
        with trio.fail_after(10):
            shown = [c async for c in relay.read("t", after_pauses=1)]
    assert len(replies) > 1
    assert all(sum(reply[1:]) <= 4096 for reply in replies)
    assert [c.type for c in shown] == [c.type for c in GOES_ON]
