"""An AG-UI client's answer is read and checked in a worker thread from about the size
the other front ends check theirs in one (2,000 JSON values, ``LARGE_OUTPUT_NODES``):
the AG-UI threshold was 16,384 characters of tool message text, so an answer of 1,589
rows (3,180 values) was parsed and checked against its schema on the event loop.
Counted (the check's thread), not timed."""

from __future__ import annotations

import orjson

from tests.test_agui import run, run_input, user
from tests.test_loop_checks import agent
from tests.test_loop_checks import checks as checks  # the fixture
from tests.web.harness import web_server

ROWS = {"rows": [{"n": i} for i in range(1_100)]}
"""2,202 values (past 2,000), 11,000 characters of JSON (under the old 16,384)."""


async def test_an_agui_answer_of_2_202_values_is_checked_in_a_thread(checks):
    async with web_server(agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
        content = orjson.dumps(ROWS).decode()
        answer = {"id": "a1", "role": "tool", "toolCallId": wire, "content": content}
        await run(server, run_input("s", user("go", "m1"), answer, runId="r2"))
    assert checks.on_main == [False]  # was [True]: read and checked on the loop
