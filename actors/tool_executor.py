"""The tool executor: runs a step's tool calls concurrently, turning failures into results.

Shared by every session of a host. Each :class:`~runtime.protocol.ExecuteTools` request
runs in a child task; within it, every call runs concurrently (sync tools in worker
threads) under its own timeout. Nothing a tool does can crash the executor or the
turn: an unknown tool, invalid arguments, an exception, a timeout or an unserializable
return value each become an error outcome that the model sees as the tool's result.
Outcomes are sent as they complete; the turn runner saves them in call order.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import trio

from runtime.actor import Actor
from runtime.protocol import ExecuteTools, ToolCallSpec, ToolOutcome
from runtime.tools import Tool, ToolInputError, to_jsonable

TRUNCATION_MARKER = "…[truncated: {omitted} of {total} characters omitted]"


def truncate_output(output: Any, limit: int | None) -> Any:
    """``output`` unchanged if its JSON text fits ``limit``; else its text cut to fit,
    ending with a visible marker (so the model knows it did not see everything)."""
    if limit is None:
        return output
    text = output if isinstance(output, str) else orjson.dumps(output).decode()
    if len(text) <= limit:
        return output
    marker = TRUNCATION_MARKER.format(omitted=len(text) - limit, total=len(text))
    return text[:limit] + marker


async def run_tool_call(
    call: ToolCallSpec, tools: dict[str, Tool], default_timeout: float | None, max_chars: int | None
) -> ToolOutcome:
    """Run one call to completion and describe what happened; never raises (but
    cancellation propagates)."""
    start = trio.current_time()

    def done(output: Any = None, error: str | None = None) -> ToolOutcome:
        return ToolOutcome(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            output=output,
            error=error,
            duration=trio.current_time() - start,
        )

    tool = tools.get(call.tool_name)
    if tool is None:
        names = ", ".join(sorted(tools)) or "none"
        return done(error=f"unknown tool {call.tool_name!r}; available tools: {names}")
    try:
        kwargs = tool.validate(call.input)
    except ToolInputError as exc:
        return done(error=str(exc))
    timeout = tool.timeout if tool.timeout is not None else default_timeout
    try:
        with trio.move_on_after(timeout if timeout is not None else math.inf) as scope:
            result = await tool.call(kwargs)
        if scope.cancelled_caught:
            return done(error=f"tool {tool.name} timed out after {timeout:g}s")
    except Exception as exc:
        return done(error=f"tool {tool.name} raised {type(exc).__name__}: {exc}")
    try:
        output = to_jsonable(result)
    except TypeError as exc:
        return done(error=f"tool {tool.name} returned a value that is not JSON: {exc}")
    return done(output=truncate_output(output, max_chars))


class ToolExecutor(Actor):
    """Host-wide actor executing tool calls for every session."""

    inbox_capacity = 1024

    def __init__(self, *, name: str = "tool-executor") -> None:
        super().__init__(name=name)
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await super().run()

    async def handle(self, message: Any) -> None:
        if isinstance(message, ExecuteTools):
            assert self._nursery is not None
            self._nursery.start_soon(self._execute, message)

    async def _execute(self, request: ExecuteTools) -> None:
        async def one(call: ToolCallSpec) -> None:
            outcome = await run_tool_call(
                call, request.tools, request.default_timeout, request.max_result_chars
            )
            try:
                await request.reply.put(outcome)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        with request.cancel_scope:
            async with trio.open_nursery() as nursery:
                for call in request.calls:
                    nursery.start_soon(one, call)
