"""Two front ends answering one waiting call at once, each ordering of their steps driven
by the test (no sleeps, no luck): the loser's read of the session before the winner's
decision commits, between that commit and the continuation's saved result, and after it.
The loser answers the same (a double click through two front ends) or the other way (two
people, one approving, one denying). Real PostgreSQL and Redis (the suite's own).

Whatever the order: the winner's decision is the one recorded, the loser is told 409
(never a 400 "answers no call the turn waits for", which the page shows as its own
mistake), the turn resumes once, the tool runs once, and the loser changes nothing.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from runtime.approval import Decision
from runtime.messages import ToolMessage
from tests.test_frontend import LIMIT, Deployment, deployment
from tests.test_worker_approval import (
    _clear_ran as _clear_ran,  # (the fixture)
)
from tests.test_worker_approval import (
    answer,
    approval_agent,
    asked,
    first_part,
    payloads,
    ran,
)
from tests.test_worker_approval import (
    redis_url as redis_url,  # (the fixture)
)


async def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        return await client.post(f"{url}/api/chat", json=body)


async def _finished(d: Deployment) -> Any:
    turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
    assert turn is not None
    return turn


def _results(record: Any) -> list[ToolMessage]:
    return [m for m in record.messages if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("loser_approves", [True, False], ids=["same", "other"])
async def test_the_loser_reads_between_the_winners_decision_and_its_saved_result(
    pg_url: str, redis_url: str, loser_approves: bool
) -> None:
    """The winner's front end recorded the decision (the turn put back for a worker) and
    no worker has continued it yet: the loser reads the call decided and no result. The
    same answer was a 400 'answers no call the turn waits for' (every answer an echo of
    the recorded one, so none left to record); the other answer is refused as decided."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        await d.stop_workers()  # (the continuation waits until the loser was answered)
        tools = {t.name: t for t in d.agent.tools}
        won = await d.fronts[0].decide(
            d.hosts[0].bus, "s1", approval_id, Decision(approved=True), tools
        )
        decided = await d.store.load("s1")
        lost = await _post(d.urls[1], answer("s1", message_id, approval_id, loser_approves))
        unchanged = await d.store.load("s1")
        await d.start_worker()
        turn = await _finished(d)
        record = await d.store.load("s1")
    assert won.recorded.complete
    assert lost.status_code == 409, lost.text
    assert decided is not None and unchanged is not None
    assert unchanged.version == decided.version
    assert turn.resumes == 1 and ran == ["/x"]
    assert record is not None and [m.output for m in _results(record)] == ["deleted /x"]


@pytest.mark.parametrize("loser_approves", [True, False], ids=["same", "other"])
async def test_the_loser_reads_before_the_winner_commits(
    pg_url: str, redis_url: str, loser_approves: bool
) -> None:
    """The loser's front end reads the session (the call undecided: its answer checks
    out), then the winner's whole request runs (decision, continuation, result saved),
    then the loser records on what it read: its version-checked decision finds the
    session moved, reads it again, and is refused."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        loser = d.fronts[1]
        read = loser._answered_on
        won: list[httpx.Response] = []

        async def read_then_let_the_winner_run(*args: Any, **kwargs: Any) -> Any:
            seen = await read(*args, **kwargs)
            won.append(await _post(d.urls[0], answer("s1", message_id, approval_id, True)))
            await _finished(d)
            return seen

        loser._answered_on = read_then_let_the_winner_run
        before = await d.store.load("s1")
        lost = await _post(d.urls[1], answer("s1", message_id, approval_id, loser_approves))
        turn = await _finished(d)
        record = await d.store.load("s1")
    assert [r.status_code for r in won] == [200], [r.text for r in won]
    assert lost.status_code == 409, lost.text
    assert before is not None and record is not None and record.version > before.version
    assert turn.resumes == 1 and ran == ["/x"]
    assert [m.output for m in _results(record)] == ["deleted /x"]


@pytest.mark.parametrize("loser_approves", [True, False], ids=["same", "other"])
async def test_the_loser_reads_after_the_continuation_saved_the_result(
    pg_url: str, redis_url: str, loser_approves: bool
) -> None:
    """The winner's request over (its continuation saved the result, the turn done)
    before the loser's read: 409, and the session as the winner left it."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        won = await _post(d.urls[0], answer("s1", message_id, approval_id, True))
        await _finished(d)
        before = await d.store.load("s1")
        lost = await _post(d.urls[1], answer("s1", message_id, approval_id, loser_approves))
        turn = await _finished(d)
        record = await d.store.load("s1")
    assert won.status_code == 200, won.text
    assert lost.status_code == 409, lost.text
    assert before is not None and record is not None and record.version == before.version
    assert turn.resumes == 1 and ran == ["/x"]
    assert [m.output for m in _results(record)] == ["deleted /x"]
