"""A client tool's large answer over A2A (the official ``a2a-sdk`` client), and a
decision on a session with no view in memory: checked once against the tool's output
schema, in a worker thread, while another session's turn runs to its end (as AG-UI and
the AI SDK's, tests/test_loop_checks.py). Tests count checks and threads, never time."""

from __future__ import annotations

import threading
from typing import Any

import trio
from a2a.types.a2a_pb2 import TaskState
from google.protobuf.json_format import MessageToDict

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, ToolMessage
from runtime.actor_messages import InferRequest
from runtime.messages import ToolCallPart
from runtime.tools import Tool, tool
from tests.test_a2a import BOTH, collect, sdk, user
from tests.test_loop_checks import BIG, _other_session_turn_meanwhile, _text, agent
from tests.test_loop_checks import checks as checks  # the fixture
from tests.web.harness import web_server

FLOAT_ROWS = '{"rows":[{"n":0.0},{"n":1.0}'
"""How the stored answer starts: a protobuf ``Struct`` carries numbers as doubles."""


async def _answer_over_a2a(client: Any, output: Any) -> tuple[Any, Any]:
    """The task's first message (it waits for the client tool), then the message
    answering it with ``output``: the second's events."""
    (asked,) = await collect(client, user("go", message_id="q"))
    pending = MessageToDict(asked.task.status.message.parts[1].data)["pending"]
    assert [p["tool"] for p in pending] == ["table"]
    request = user(message_id="o", task_id=asked.task.id, data={"decisions": [{"output": output}]})
    (answered,) = await collect(client, request)
    return asked, answered


async def test_an_a2a_clients_large_output_is_checked_once_in_a_thread_while_others_stream(
    checks,
):
    checks.hold = True
    async with web_server(agent(), protocols=BOTH) as server:
        got: dict[str, Any] = {}

        async def answering() -> None:
            run = lambda c: _answer_over_a2a(c, BIG)  # noqa: E731
            got["asked"], got["answered"] = await sdk(server, run, streaming=False)

        async def other() -> None:
            got["other"] = await _other_session_turn_meanwhile(server, checks)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answering)
            nursery.start_soon(other)
        record = await server.host.store.load(got["asked"].task.context_id)
    assert checks.released_in_time == [True]  # the other session's turn ended meanwhile
    assert _text(got["other"]) == "hello there"
    assert len(checks.values) == 1 and checks.on_main == [False]  # was 2, on the loop
    assert checks.converted_on_loop == 0  # was 2 (the pre-check's and the recording's)
    assert got["answered"].task.status.state == TaskState.TASK_STATE_COMPLETED
    assert record is not None
    (saved,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert isinstance(saved.output, str) and saved.output.startswith(FLOAT_ROWS)
    assert "characters omitted]" in saved.output and len(saved.output) < 100_200


async def test_an_a2a_clients_small_output_is_checked_once_on_the_loop(checks):
    async with web_server(agent(), protocols=BOTH) as server:
        _, answered = await sdk(
            server, lambda c: _answer_over_a2a(c, {"rows": []}), streaming=False
        )
    assert answered.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert checks.values == [{"rows": []}] and checks.on_main == [True]  # was 2 checks


async def test_a_decision_with_no_view_in_memory_checks_a_large_output_in_a_thread(checks):
    async with Host.open(max_sessions=1, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        await session.run("go")  # waits for the client tool
        other = await host.open_session(agent(), session_id="other")  # evicts "s"
        assert session.held_record() is None  # nothing in memory: decided on a read
        checks.hold = True
        got: dict[str, Any] = {}

        async def deciding() -> None:
            got["recorded"] = await session.decide("c1", output=BIG)

        async def other_turn() -> None:
            await trio.to_thread.run_sync(checks.entered.wait, 20)
            got["other"] = await other.run("other")
            checks.release.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deciding)
            nursery.start_soon(other_turn)
    assert checks.released_in_time == [True]  # the other session's turn ended meanwhile
    assert got["other"].text == "hello there"
    assert got["recorded"].complete
    assert len(checks.values) == 1 and checks.on_main == [False]  # was 1, on the loop


# -- an approval's large edited input: checked once, in a thread -------------------------


@tool(needs_approval=True)
async def keep(rows: list[int]) -> str:
    """Keep the rows (it needs a person's approval)."""
    return f"kept {len(rows)}"


def _two_calls(request: InferRequest) -> list[Any]:
    if current_step(request.messages) == 0:  # two calls wait: one decision leaves one
        first = tool_call("keep", {"rows": [1]}, tool_call_id="k1")
        return [*first, *tool_call("keep", {"rows": [2]}, tool_call_id="k2")]
    return ["done"]


EDIT = {"rows": list(range(2_500))}
"""2,500 values: past the thread's 2,000, within max_tool_result_chars (its JSON 13 KB)."""


async def test_an_a2a_large_edited_input_is_checked_once_in_a_thread(monkeypatch):
    on_main: list[bool] = []
    validate = Tool.validate

    def noting(self: Tool, arguments: Any) -> Any:
        if isinstance(arguments, dict) and len(arguments.get("rows", ())) == len(EDIT["rows"]):
            on_main.append(threading.current_thread() is threading.main_thread())
        return validate(self, arguments)

    monkeypatch.setattr(Tool, "validate", noting)
    edits = Agent(name="edits", provider=ScriptedProvider(responder=_two_calls), tools=[keep])
    async with web_server(edits, protocols=BOTH) as server:

        async def run(client: Any) -> Any:
            (asked,) = await collect(client, user("go", message_id="q"))
            pending = MessageToDict(asked.task.status.message.parts[1].data)["pending"]
            edit = {"id": pending[0]["id"], "approved": True, "editedInput": EDIT}
            request = user(message_id="d", task_id=asked.task.id, data={"decisions": [edit]})
            (answered,) = await collect(client, request)
            return answered

        answered = await sdk(server, run, streaming=False)
        record = await server.host.store.load(answered.task.context_id)
    assert answered.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED  # k2 waits
    assert on_main == [False]  # was [True, True]: the pre-check's and the recording's
    assert record is not None
    (first, _) = [p for p in record.messages[1].content if isinstance(p, ToolCallPart)]
    assert first.input == {"rows": [float(n) for n in range(2_500)]}  # (a Struct's numbers)
