"""OutputChunk -> AI SDK UI message stream (v1) mapping, and stored history -> UIMessages."""

from __future__ import annotations

import datetime

import orjson

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import (
    Agent,
    AssistantMessage,
    Host,
    ReasoningChunk,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolMessage,
    Usage,
    UserMessage,
    tool,
)
from runtime import output as o
from runtime.app.web.ui_stream import (
    DONE,
    HEADERS,
    UIStreamEncoder,
    encode_turn,
    sse,
    ui_messages,
)
from runtime.messages import ProviderDataPart, SystemMessage
from runtime.output import ErrorInfo

# Required fields of each chunk type, as the `ai` package's uiMessageChunkSchema has them
# (node_modules/ai/dist/index.mjs, `uiMessageChunkSchema`), plus the optional ones we send.
SCHEMA_FIELDS = {
    "start": {"messageId"},
    "start-step": set(),
    "finish-step": set(),
    "text-start": {"id"},
    "text-delta": {"id", "delta"},
    "text-end": {"id"},
    "data-object": {"id", "data"},
    "data-throttled": {"data", "transient"},
    "data-budget-wait": {"data", "transient"},
    "data-steered": {"id", "data", "transient"},
    "reset-step": set(),
    "data-reset-step": {"data", "transient"},
    "reasoning-start": {"id"},
    "reasoning-delta": {"id", "delta"},
    "reasoning-end": {"id"},
    "tool-input-start": {"toolCallId", "toolName"},
    "tool-input-delta": {"toolCallId", "inputTextDelta"},
    "tool-input-available": {"toolCallId", "toolName", "input"},
    "tool-output-available": {"toolCallId", "output"},
    "tool-output-error": {"toolCallId", "errorText"},
    "tool-approval-request": {"approvalId", "toolCallId"},
    "tool-output-denied": {"toolCallId"},
    "finish": {"finishReason", "messageMetadata"},
    "error": {"errorText"},
    "abort": {"reason"},
}

U = Usage(input_tokens=3, output_tokens=4, total_tokens=7)

CASES = [
    (o.Start(message_id="m1"), [{"type": "start", "messageId": "m1"}]),
    (o.StepStart(step=0), [{"type": "start-step"}]),
    (o.TextStart(step=0, part_id="p1"), [{"type": "text-start", "id": "p1"}]),
    (
        o.TextDelta(step=0, part_id="p1", text="Hi"),
        [{"type": "text-delta", "id": "p1", "delta": "Hi"}],
    ),
    (o.TextFinish(step=0, part_id="p1"), [{"type": "text-end", "id": "p1"}]),
    (
        o.ObjectDelta(step=0, part_id="p1", value={"city": "Par"}),
        [{"type": "data-object", "id": "p1", "data": {"city": "Par"}}],
    ),
    # the id: the message's (m1, from the start above), the step, the part's place in it
    (o.ReasoningStart(step=0, part_id="r1"), [{"type": "reasoning-start", "id": "m1.s0.r0"}]),
    (
        o.ReasoningDelta(step=0, part_id="r1", text="hmm"),
        [{"type": "reasoning-delta", "id": "m1.s0.r0", "delta": "hmm"}],
    ),
    (o.ReasoningFinish(step=0, part_id="r1"), [{"type": "reasoning-end", "id": "m1.s0.r0"}]),
    (
        o.ToolInputStart(step=0, tool_call_id="c1", tool_name="lookup"),
        [{"type": "tool-input-start", "toolCallId": "c1", "toolName": "lookup"}],
    ),
    (
        o.ToolInputDelta(step=0, tool_call_id="c1", delta='{"k'),
        [{"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"k'}],
    ),
    (
        o.ToolCall(step=0, tool_call_id="c1", tool_name="lookup", input={"k": 1}),
        [
            {
                "type": "tool-input-available",
                "toolCallId": "c1",
                "toolName": "lookup",
                "input": {"k": 1},
            }
        ],
    ),
    (
        o.ToolResult(step=0, tool_call_id="c1", tool_name="lookup", output={"v": 2}),
        [{"type": "tool-output-available", "toolCallId": "c1", "output": {"v": 2}}],
    ),
    (
        o.ToolError(step=0, tool_call_id="c1", tool_name="lookup", error="boom"),
        [{"type": "tool-output-error", "toolCallId": "c1", "errorText": "boom"}],
    ),
    (
        o.ToolApprovalRequest(step=0, tool_call_id="c1", tool_name="rm", approval_id="a1"),
        [{"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "c1"}],
    ),
    (
        o.ToolOutputDenied(step=0, tool_call_id="c1", tool_name="rm", reason="no"),
        [{"type": "tool-output-denied", "toolCallId": "c1"}],
    ),
    (
        o.ToolStream(
            step=0,
            tool_call_id="c1",
            tool_name="helper",
            chunk=o.TextDelta(step=0, part_id="sub1", text="partial"),
        ),
        [
            {
                "type": "tool-output-available",
                "toolCallId": "c1",
                "output": "partial",
                "preliminary": True,
            }
        ],
    ),
    (
        o.BudgetWait(step=1, want=90, available=50, held=40, ahead=0),
        [
            {
                "type": "data-budget-wait",
                "data": {"step": 1, "want": 90, "available": 50, "held": 40, "ahead": 0},
                "transient": True,
            }
        ],
    ),
    (
        o.Throttled(step=0, wait=2.5, reason="requests"),
        [
            {
                "type": "data-throttled",
                "data": {"wait": 2.5, "reason": "requests"},
                "transient": True,
            }
        ],
    ),
    (
        o.Steered(step=2, message_id="u2", text="also this"),
        [
            {
                "type": "data-steered",
                "id": "u2",
                "data": {"messageId": "u2", "text": "also this", "step": 2},
                "transient": True,
            }
        ],
    ),
    (
        o.ResetStep(step=0, provider="backup", error=ErrorInfo(kind="Overloaded", message="busy")),
        [
            {"type": "reset-step"},
            {
                "type": "data-reset-step",
                "data": {"step": 0, "provider": "backup", "errorText": "Overloaded: busy"},
                "transient": True,
            },
        ],
    ),
    (o.StepFinish(step=0, finish_reason="stop", usage=U), [{"type": "finish-step"}]),
    (
        o.Finish(finish_reason="stop", usage=U),
        [
            {
                "type": "finish",
                "finishReason": "stop",
                "messageMetadata": {
                    "finishReason": "stop",
                    "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
                },
            }
        ],
    ),
    (
        o.Error(error=ErrorInfo(kind="RateLimited", message="slow down", retryable=True)),
        [{"type": "error", "errorText": "RateLimited: slow down"}],
    ),
    (o.Abort(reason="client disconnected"), [{"type": "abort", "reason": "client disconnected"}]),
]


def test_every_output_chunk_type_maps_to_its_ui_chunk():
    encoder = UIStreamEncoder()
    encoder.encode(o.ToolCall(step=0, tool_call_id="c1", tool_name="lookup", input={}))
    for chunk, expected in CASES:
        assert encoder.encode(chunk) == expected, chunk.type
    assert {type(c) for c, _ in CASES} == set(o.OUTPUT_CHUNK_TYPES)


def test_ui_chunks_carry_exactly_the_schema_fields():
    encoder = UIStreamEncoder()
    for chunk, _ in CASES:
        for ui in encoder.encode(chunk):
            assert set(ui) - {"type", "preliminary"} == SCHEMA_FIELDS[ui["type"]], ui


def test_a_streaming_tool_sends_its_text_so_far_as_preliminary_output():
    encoder = UIStreamEncoder()
    encoder.encode(o.ToolCall(step=0, tool_call_id="c", tool_name="helper", input={}))

    def nested(inner):
        return o.ToolStream(step=0, tool_call_id="c", tool_name="helper", chunk=inner)

    sent = [
        ui
        for inner in [
            o.Start(message_id="sub"),
            o.StepStart(step=0),
            o.TextStart(step=0, part_id="t"),
            o.TextDelta(step=0, part_id="t", text="Hel"),
            o.TextDelta(step=0, part_id="t", text="lo"),
            o.TextFinish(step=0, part_id="t"),
            o.Finish(finish_reason="stop", usage=U),
        ]
        for ui in encoder.encode(nested(inner))
    ]
    assert [(ui["output"], ui["preliminary"]) for ui in sent] == [("Hel", True), ("Hello", True)]
    (final,) = encoder.encode(
        o.ToolResult(step=0, tool_call_id="c", tool_name="helper", output="Hello")
    )
    assert "preliminary" not in final


def test_a_sub_agents_budget_wait_is_shown_under_its_call_at_any_depth():
    """A sub-agent waiting for output tokens its siblings hold said nothing: its nested
    chunks other than text were dropped, so the call's preliminary output just stopped.
    Its ``budget-wait`` now comes as ``data-budget-wait`` naming the top call."""
    encoder = UIStreamEncoder()
    wait = o.BudgetWait(step=0, want=90, available=10, held=80, ahead=1)
    inner = o.ToolStream(step=0, tool_call_id="deep", tool_name="inner", chunk=wait)
    for chunk in (wait, inner):
        (ui,) = encoder.encode(
            o.ToolStream(step=0, tool_call_id="c", tool_name="helper", chunk=chunk)
        )
        assert ui == {
            "type": "data-budget-wait",
            "data": {
                "step": 0,
                "want": 90,
                "available": 10,
                "held": 80,
                "ahead": 1,
                "toolCallId": "c",
            },
            "transient": True,
        }


def test_a_sub_agents_throttled_is_shown_under_its_call_at_any_depth():
    """A sub-agent waiting for a rate limit said nothing (its ``throttled`` was dropped,
    only ``budget-wait`` was lifted): it now comes as ``data-throttled`` naming the top
    call, as its ``budget-wait`` does."""
    encoder = UIStreamEncoder()
    wait = o.Throttled(step=0, wait=2.5, reason="tokens")
    inner = o.ToolStream(step=0, tool_call_id="deep", tool_name="inner", chunk=wait)
    for chunk in (wait, inner):
        (ui,) = encoder.encode(
            o.ToolStream(step=0, tool_call_id="c", tool_name="helper", chunk=chunk)
        )
        assert ui == {
            "type": "data-throttled",
            "data": {"wait": 2.5, "reason": "tokens", "toolCallId": "c"},
            "transient": True,
        }


def test_finish_reasons_outside_the_protocol_go_as_other_with_the_real_one_in_metadata():
    for reason, sent in [
        ("stop", "stop"),
        ("tool-calls", "tool-calls"),
        ("length", "length"),
        ("content-filter", "content-filter"),
        ("error", "error"),
        ("budget", "other"),
        ("aborted", "other"),
    ]:
        (ui,) = UIStreamEncoder().encode(o.Finish(finish_reason=reason, usage=Usage()))
        assert ui["finishReason"] == sent
        assert ui["messageMetadata"]["finishReason"] == reason


def test_a_result_for_an_unannounced_call_is_preceded_by_its_input():
    encoder = UIStreamEncoder()
    out = encoder.encode(o.ToolError(step=1, tool_call_id="x", tool_name="nope", error="unknown"))
    assert out == [
        {"type": "tool-input-available", "toolCallId": "x", "toolName": "nope", "input": None},
        {"type": "tool-output-error", "toolCallId": "x", "errorText": "unknown"},
    ]
    # announced once only
    assert len(encoder.encode(o.ToolResult(step=1, tool_call_id="x", tool_name="n", output=1))) == 1


def test_an_error_without_a_message_is_its_kind():
    (ui,) = UIStreamEncoder().encode(o.Error(error=ErrorInfo(kind="Overloaded", message="")))
    assert ui == {"type": "error", "errorText": "Overloaded"}


def test_sse_framing_and_headers():
    assert sse({"type": "start-step"}) == b'data: {"type":"start-step"}\n\n'
    assert DONE == b"data: [DONE]\n\n"
    assert HEADERS["x-vercel-ai-ui-message-stream"] == "v1"
    assert HEADERS["content-type"] == "text/event-stream"
    # tool outputs that are not JSON still serialize (as strings), non-str keys too
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    encoder = UIStreamEncoder()
    encoder.encode(o.ToolCall(step=0, tool_call_id="c", tool_name="t", input={}))
    event = encoder.events(o.ToolResult(step=0, tool_call_id="c", tool_name="t", output={1: when}))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[6:])["output"] == {"1": "2026-01-02T03:04:05"}


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
async def broken(key: str) -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


async def test_a_whole_turn_encodes_to_a_well_formed_ui_stream():
    script = [
        [
            ReasoningChunk(text="I need a and b."),
            "Looking up a. ",
            *tool_call("lookup", {"key": "a"}, tool_call_id="A"),
        ],
        ["Now b. ", *tool_call("broken", {"key": "b"}, tool_call_id="B")],
        ["a is known, b failed."],
    ]
    agent = Agent(provider=ScriptedProvider(script), tools=[lookup, broken])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="p")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
    ui = encode_turn(chunks)
    types = [c["type"] for c in ui]
    assert types[0] == "start" and types[-1] == "finish"
    assert ui[0]["messageId"] == out.result.message.id
    assert types.count("start-step") == types.count("finish-step") == 3
    # every delta/end belongs to a started part; tool chunks name their call
    open_ids: set[str] = set()
    for c in ui:
        if c["type"] in ("text-start", "reasoning-start"):
            open_ids.add(c["id"])
        elif c["type"] in ("text-delta", "reasoning-delta"):
            assert c["id"] in open_ids
        elif c["type"] in ("text-end", "reasoning-end"):
            open_ids.remove(c["id"])
        assert set(c) - {"type"} == SCHEMA_FIELDS[c["type"]]
    assert not open_ids
    tools = [
        (c["type"], c["toolCallId"])
        for c in ui
        if c["type"].startswith("tool-") and c["type"] != "tool-input-delta"
    ]
    assert tools == [
        ("tool-input-start", "A"),
        ("tool-input-available", "A"),
        ("tool-output-available", "A"),
        ("tool-input-start", "B"),
        ("tool-input-available", "B"),
        ("tool-output-error", "B"),
    ]
    streamed_input = "".join(
        c["inputTextDelta"]
        for c in ui
        if c["type"] == "tool-input-delta" and c["toolCallId"] == "A"
    )
    assert orjson.loads(streamed_input) == {"key": "a"}
    outputs = {c["toolCallId"]: c for c in ui if c["type"].startswith("tool-output")}
    assert outputs["A"]["output"] == "value of a"
    assert "disk on fire" in outputs["B"]["errorText"]
    text = "".join(c["delta"] for c in ui if c["type"] == "text-delta")
    assert text == "Looking up a. Now b. a is known, b failed."


def test_ui_messages_fold_tool_results_into_their_calls_by_step():
    history = [
        SystemMessage(content="be brief", id="s0"),
        UserMessage(content="go", id="u1"),
        AssistantMessage(
            id="a1",
            content=(
                ReasoningPart(text="plan", step=0, signature="sig", provider="anthropic"),
                TextPart(text="first ", step=0),
                ToolCallPart(tool_call_id="A", tool_name="lookup", input={"key": "a"}, step=0),
                ReasoningPart(text="", step=1, redacted_data="opaque"),
                ProviderDataPart(provider="anthropic", data={"x": 1}, step=1),
                ToolCallPart(tool_call_id="B", tool_name="broken", input={"key": "b"}, step=1),
                TextPart(text="done", step=2),
            ),
        ),
        ToolMessage(tool_call_id="A", tool_name="lookup", output="value of a", step=0),
        ToolMessage(tool_call_id="B", tool_name="broken", error="boom", step=1),
        UserMessage(content="again", id="u2"),
        AssistantMessage(
            id="a2",
            interrupted=True,
            content=(
                ToolCallPart(tool_call_id="C", tool_name="lookup", input={"key": "c"}, step=0),
            ),
        ),
    ]
    assert ui_messages(history) == [
        {"id": "s0", "role": "system", "parts": [{"type": "text", "text": "be brief"}]},
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "go"}]},
        {
            "id": "a1",
            "role": "assistant",
            "metadata": {"interrupted": False},
            "parts": [
                {"type": "step-start"},
                {"type": "reasoning", "id": "a1.s0.r0", "text": "plan", "state": "done"},
                {"type": "text", "text": "first ", "state": "done"},
                {
                    "type": "tool-lookup",
                    "toolCallId": "A",
                    "input": {"key": "a"},
                    "state": "output-available",
                    "output": "value of a",
                },
                {"type": "step-start"},
                # redacted: streamed as a start and an end, so a part with no text
                {"type": "reasoning", "id": "a1.s1.r0", "text": "", "state": "done"},
                {
                    "type": "tool-broken",
                    "toolCallId": "B",
                    "input": {"key": "b"},
                    "state": "output-error",
                    "errorText": "boom",
                },
                {"type": "step-start"},
                {"type": "text", "text": "done", "state": "done"},
            ],
        },
        {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "again"}]},
        {
            "id": "a2",
            "role": "assistant",
            "metadata": {"interrupted": True},
            "parts": [
                {"type": "step-start"},
                {
                    "type": "tool-lookup",
                    "toolCallId": "C",
                    "input": {"key": "c"},
                    "state": "input-available",
                },
            ],
        },
    ]


def test_a_restored_failed_message_says_failed_with_its_error_text_not_interrupted():
    key = "sk-ant-x0123456789abcdef"
    error = ErrorInfo(kind="AuthenticationFailed", message=f"invalid x-api-key: {key}")
    history = [UserMessage(id="u", content="hi"), AssistantMessage(id="a", error=error)]
    assert ui_messages(history)[1]["metadata"] == {
        "interrupted": False,
        "failed": True,
        "errorText": "AuthenticationFailed: invalid x-api-key: [redacted]",
    }


def test_importing_runtime_does_not_load_the_web_stack():
    import subprocess
    import sys

    code = (
        "import sys, runtime, runtime.app.cli; runtime.app.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('starlette', 'hypercorn')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ui_messages_give_each_turn_its_own_results_when_call_ids_repeat():
    """A call id is unique within a turn only: a provider (the scripted one, local
    servers) may call its tools ``call_1`` in every turn. Found by the embedded fault run
    (tests/test_embedded_chaos.py): one map of results for the whole history gave every
    earlier ``call_1`` the last turn's result in ``GET /api/sessions/{id}``."""
    history = [
        UserMessage(content="one", id="u1"),
        AssistantMessage(
            id="a1",
            content=(ToolCallPart(tool_call_id="call_1", tool_name="lookup", input={}, step=0),),
        ),
        ToolMessage(tool_call_id="call_1", tool_name="lookup", output="first", step=0),
        UserMessage(content="two", id="u2"),
        AssistantMessage(
            id="a2",
            content=(ToolCallPart(tool_call_id="call_1", tool_name="lookup", input={}, step=0),),
        ),
        ToolMessage(tool_call_id="call_1", tool_name="lookup", error="second failed", step=0),
        UserMessage(content="three", id="u3"),
        AssistantMessage(
            id="a3",
            interrupted=True,
            content=(ToolCallPart(tool_call_id="call_1", tool_name="lookup", input={}, step=0),),
        ),
    ]
    tools = [
        next(p for p in m["parts"] if p["type"] == "tool-lookup")
        for m in ui_messages(history)
        if m["role"] == "assistant"
    ]
    assert [(t["state"], t.get("output"), t.get("errorText")) for t in tools] == [
        ("output-available", "first", None),
        ("output-error", None, "second failed"),
        ("input-available", None, None),
    ]


def test_a_reasoning_part_of_a_step_started_over_has_the_id_of_its_stored_part():
    busy = ErrorInfo(kind="Overloaded", message="busy")
    chunks = [o.Start(message_id="msg_1"), o.StepStart(step=0)]
    for part_id in ("p1", "p2"):  # p1 streamed, then discarded by the reset
        chunks += [
            o.ReasoningStart(step=0, part_id=part_id),
            o.ReasoningDelta(step=0, part_id=part_id, text="think"),
            o.ReasoningFinish(step=0, part_id=part_id),
        ]
        if part_id == "p1":
            chunks.append(o.ResetStep(step=0, provider="backup", error=busy))
    sent = [ui["id"] for ui in encode_turn(chunks) if ui["type"].startswith("reasoning-")]
    stored = AssistantMessage(id="msg_1", content=(ReasoningPart(text="think", step=0),))
    (ui,) = [p for p in ui_messages([stored])[0]["parts"] if p["type"] == "reasoning"]
    assert sent[3:] == [ui["id"]] * 3
