"""The two turns docs/streaming.md allows to stream ``start finish`` (no step, no
result), produced for real and checked by the grammar checker: a hook on turn start that
ends the turn by its own budget (``finish`` ``budget``), and a durable turn taken over
(``resume=True``) that had been answered already (``finish`` ``stop``)."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from runtime.agent import Hooks
from runtime.errors import BudgetExceeded
from tests.support.grammar import check_grammar


async def _chunks(session, *args, **kwargs) -> tuple[list, object]:
    async with session.stream(*args, **kwargs) as out:
        chunks = [c async for c in out]
    return chunks, out.result


async def test_a_hook_ending_the_turn_by_its_budget_on_turn_start_streams_start_finish():
    async def over_budget(event) -> None:
        raise BudgetExceeded("credits")

    agent = Agent(provider=ScriptedProvider([["never"]]), hooks=Hooks(on_turn_start=over_budget))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        chunks, result = await _chunks(session, "go")
    assert [c.type for c in chunks] == ["start", "finish"]
    assert (result.finish_reason, result.budget) == ("budget", "credits")
    check_grammar(chunks)


async def test_a_takeover_of_a_turn_answered_already_streams_start_finish():
    agent = Agent(provider=ScriptedProvider([["the answer"]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        ids = {"turn_id": "turn_d", "message_id": "msg_d", "resume": True}
        await _chunks(session, "go", **ids)
        chunks, result = await _chunks(session, "go", **ids)
    assert [c.type for c in chunks] == ["start", "finish"]
    assert (result.finish_reason, result.text) == ("stop", "the answer")
    check_grammar(chunks)


async def test_a_takeover_of_a_turn_still_waiting_streams_its_step_with_the_request_again():
    """A durable turn taken over (``resume=True``) whose committed step waits for an
    approval nobody gave yet: no model call, nothing saved, and its stream is a waiting
    turn's (docs/approval.md): ``start``, the suspended step as stored (its text, the
    call, the same approval request), ``finish`` ``awaiting-input``. Before, it was
    ``start finish`` alone: no step, out of the grammar, and an AI SDK client was given
    ``awaiting-input`` with no request to answer."""
    from actors.providers.scripted import tool_call
    from runtime.tools import tool

    @tool(needs_approval=True)
    async def guarded(n: int) -> str:
        return f"done {n}"

    asks = ["I need your approval. ", *tool_call("guarded", {"n": 1}, tool_call_id="call_a")]
    provider = ScriptedProvider([asks])
    agent = Agent(provider=provider, tools=[guarded])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        ids = {"turn_id": "turn_w", "message_id": "msg_w", "resume": True}
        first, waits = await _chunks(session, "go", **ids)
        before = list(session.messages)
        chunks, result = await _chunks(session, "go", **ids)
        assert list(session.messages) == before  # nothing changed
    assert result.finish_reason == waits.finish_reason == "awaiting-input"
    check_grammar(chunks)
    assert [c.type for c in chunks] == [
        "start", "step-start", "text-start", "text-delta", "text-finish",
        "tool-call", "tool-approval-request", "step-finish", "finish",
    ]  # fmt: skip
    asked = [(c.tool_call_id, c.approval_id) for c in first if c.type == "tool-approval-request"]
    assert [
        (c.tool_call_id, c.approval_id) for c in chunks if c.type == "tool-approval-request"
    ] == asked
    assert "".join(c.text for c in chunks if c.type == "text-delta") == "I need your approval. "
    call = next(c for c in chunks if c.type == "tool-call")
    assert (call.tool_name, call.input) == ("guarded", {"n": 1})
    assert len(provider.requests) == 1  # no model call for the takeover


async def test_the_ai_package_shows_the_request_a_waiting_turns_takeover_streams():
    """The same takeover's stream, as the AI SDK UI message stream, read by the real
    `ai` package (readUIMessageStream): the message it builds holds the step's text and
    the call waiting for approval, with its approval id. From ``start finish`` alone it
    built a message with no parts: nothing for the person to approve."""
    import orjson

    from actors.providers.scripted import tool_call
    from runtime.app.web.ui_stream import UIStreamEncoder
    from runtime.tools import tool
    from tests.web.harness import ensure_ai_package, run_read_stream

    node = ensure_ai_package()

    @tool(needs_approval=True)
    async def guarded(n: int) -> str:
        return f"done {n}"

    asks = ["I need your approval. ", *tool_call("guarded", {"n": 1}, tool_call_id="call_a")]
    agent = Agent(provider=ScriptedProvider([asks]), tools=[guarded])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        ids = {"turn_id": "turn_w", "message_id": "msg_w", "resume": True}
        first, _ = await _chunks(session, "go", **ids)
        chunks, _ = await _chunks(session, "go", **ids)
    encoder = UIStreamEncoder()
    sse = b"".join(encoder.events(c) for c in chunks).decode()
    read = await run_read_stream(node, {"sse": sse, "read": True})
    assert all(p["success"] for p in read["parsed"]) and read["error"] is None, read
    parts = read["message"]["parts"]
    assert [p["text"] for p in parts if p["type"] == "text"] == ["I need your approval. "]
    [call] = [p for p in parts if p["type"] == "tool-guarded"]
    approval_id = next(c.approval_id for c in first if c.type == "tool-approval-request")
    assert (call["toolCallId"], call["state"]) == ("call_a", "approval-requested")
    assert call["approval"]["id"] == approval_id, orjson.dumps(call)


async def test_a_waiting_turns_takeover_bills_nothing_again_in_its_step_or_its_total():
    """The re-streamed step ran no model call: its ``step-finish`` says no usage, and its
    ``finish`` (the turn's total) is the original's, not twice it. A client that adds up
    every ``step-finish`` of a turn's streams (the original, each takeover) gets the
    turn's total once; given the step's stored usage again, it counted the step twice."""
    from actors.providers.scripted import tool_call
    from runtime.chunks import Usage
    from runtime.tools import tool

    @tool(needs_approval=True)
    async def guarded(n: int) -> str:
        return f"done {n}"

    asks = ["I need your approval. ", *tool_call("guarded", {"n": 1}, tool_call_id="call_a")]
    agent = Agent(provider=ScriptedProvider([asks]), tools=[guarded])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        ids = {"turn_id": "turn_w", "message_id": "msg_w", "resume": True}
        first, waits = await _chunks(session, "go", **ids)
        again, took_over = await _chunks(session, "go", **ids)
    steps = [c.usage for c in first + again if c.type == "step-finish"]
    assert waits.usage.total_tokens > 0
    assert sum(steps, Usage()) == took_over.usage == waits.usage
    [finish] = [c for c in again if c.type == "finish"]
    assert finish.usage == waits.usage


async def test_the_ai_package_shows_a_waiting_client_tool_call_a_takeover_streams():
    """A turn waiting for a client tool's output, taken over: the AI SDK builds the call
    in state ``input-available`` with its input (what a page answers with
    ``addToolOutput``), as from the original stream, which also streamed the input's
    deltas first (the takeover streams the stored call whole: ``tool-input-available``)."""
    from actors.providers.scripted import tool_call
    from runtime.app.web.ui_stream import UIStreamEncoder
    from runtime.tools import Tool
    from tests.web.harness import ensure_ai_package, run_read_stream

    node = ensure_ai_package()
    ask = Tool.client("ask", {"type": "object", "properties": {"q": {"type": "string"}}})
    calls = ["One question. ", *tool_call("ask", {"q": "which?"}, tool_call_id="call_c")]
    agent = Agent(provider=ScriptedProvider([calls]), tools=[ask])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        ids = {"turn_id": "turn_c", "message_id": "msg_c", "resume": True}
        shown = []
        for _ in range(2):  # the original stream, then the takeover's
            chunks, result = await _chunks(session, "go", **ids)
            assert result.finish_reason == "awaiting-input"
            check_grammar(chunks)
            encoder = UIStreamEncoder()
            sse = b"".join(encoder.events(c) for c in chunks).decode()
            read = await run_read_stream(node, {"sse": sse, "read": True})
            assert read["error"] is None, read
            shown.append([p for p in read["message"]["parts"] if p["type"] == "tool-ask"])
    [[original], [taken_over]] = shown
    assert (taken_over["toolCallId"], taken_over["state"]) == ("call_c", "input-available")
    assert taken_over["input"] == original["input"] == {"q": "which?"}
    assert taken_over["state"] == original["state"]
