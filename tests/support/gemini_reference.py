"""The Gemini provider's parse path as it was over the SDK's pydantic chunks: the oracle.

Before the provider read ``streamGenerateContent`` from the response bytes
(:mod:`actors.providers.gemini_wire`), :func:`parse_stream` read the SDK's
``GenerateContentResponse`` s from ``client.aio.models.generate_content_stream``. The
property test of the fast path runs this beside it over generated streams: the same
chunks, the same errors. Kept verbatim (apart from imports), not used in production.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterable
from typing import Any

from actors.providers.gemini import GENERATED_ID, PROVIDER, classify_error, map_finish_reason
from runtime import errors
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.ids import new_id
from runtime.provider import Emit


def _signature(part: Any) -> str | None:
    raw = getattr(part, "thought_signature", None)
    return base64.b64encode(raw).decode("ascii") if raw else None


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    prompt = (raw.prompt_token_count or 0) + (raw.tool_use_prompt_token_count or 0)
    thoughts = raw.thoughts_token_count
    output = (raw.candidates_token_count or 0) + (thoughts or 0)
    return Usage(
        input_tokens=prompt,
        output_tokens=output,
        total_tokens=raw.total_token_count or prompt + output,
        cache_read=raw.cached_content_token_count,
        reasoning_tokens=thoughts,
    )


def _enum_value(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


class _Parser:
    """One response stream's state: calls seen, the finish reason, the last usage."""

    def __init__(self, emit: Emit, answer_tool: str | None) -> None:
        self.emit = emit
        self.answer_tool = answer_tool
        self.calls = 0
        self.finish: str | None = None
        self.blocked: str | None = None
        self.usage: Usage | None = None

    async def feed(self, response: Any) -> None:
        self.usage = _usage(response.usage_metadata) or self.usage
        feedback = response.prompt_feedback
        if feedback is not None and feedback.block_reason is not None:
            self.blocked = _enum_value(feedback.block_reason)
        candidates = response.candidates
        if not candidates:
            return
        candidate = candidates[0]  # one candidate is asked for; others are not this turn's
        content = candidate.content
        for part in (content.parts if content is not None else None) or ():
            await self.part(part)
        if candidate.finish_reason is not None:
            self.finish = _enum_value(candidate.finish_reason)

    async def part(self, part: Any) -> None:
        emit = self.emit
        signature = _signature(part)
        if part.thought:
            if part.text:
                await emit(ReasoningChunk(text=part.text, provider=PROVIDER))
            if signature:
                await emit(ReasoningChunk(signature=signature, provider=PROVIDER))
            return
        call = part.function_call
        if call is not None:
            await self.call(call)
            if signature:
                await self.signed(signature, "function_call")
            return
        if part.text is not None:  # a part holds one kind of data; text is text
            if part.text:
                await emit(TextChunk(text=part.text))
            if signature:
                await self.signed(signature, "text" if part.text else "empty")
            return
        # executable_code, code_execution_result, an image the model made...: kept whole
        data = part.model_dump(mode="json", exclude_none=True)
        await emit(ProviderDataChunk(provider=PROVIDER, data=data))

    async def signed(self, signature: str, of: str) -> None:
        data = {"thought_signature": signature, "of": of}
        await self.emit(ProviderDataChunk(provider=PROVIDER, data=data))

    async def call(self, call: Any) -> None:
        name = call.name or ""
        args = call.args if call.args is not None else {}
        if self.answer_tool is not None and name == self.answer_tool:
            await self.emit(TextChunk(text=json.dumps(args, ensure_ascii=False)))
            return
        self.calls += 1
        call_id = call.id or new_id(GENERATED_ID)
        await self.emit(ToolInputStartChunk(tool_call_id=call_id, tool_name=name))
        await self.emit(
            ToolInputDeltaChunk(tool_call_id=call_id, delta=json.dumps(args, ensure_ascii=False))
        )
        await self.emit(ToolCallChunk(tool_call_id=call_id, tool_name=name, input=args))

    async def end(self) -> None:
        raw = self.finish
        if raw is None:
            if self.blocked is None:
                raise errors.MalformedStream(
                    "the response stream ended without a finishReason (cut short)",
                    provider=PROVIDER,
                )
            reason, raw = "content-filter", self.blocked  # the prompt itself was refused
        else:
            reason = map_finish_reason(raw, tool_calls=self.calls > 0)
        usage, self.usage = self.usage, None
        if usage is not None:
            await self.emit(UsageChunk(usage=usage))
        await self.emit(FinishChunk(reason=reason, raw_reason=raw))


async def parse_stream(
    stream: AsyncIterable[Any], emit: Emit, *, answer_tool: str | None = None
) -> None:
    """Read a Gemini response stream (the SDK's ``GenerateContentResponse`` s) and
    ``emit`` :data:`StreamChunk` s.

    Thought, text and call parts go out as they arrive, in part order (see the module
    docstring for how each is kept); only the first candidate is read. After the stream
    come one :class:`UsageChunk` (the last ``usage_metadata``: Gemini's counts are
    running totals; output tokens include the thoughts) and the :class:`FinishChunk`. A
    prompt the API blocked (``prompt_feedback.block_reason``, no candidate) finishes with
    ``content-filter``. A ``function_call`` of ``answer_tool`` (structured output) is the
    answer: its arguments are emitted as text.

    Errors are raised classified (:func:`classify_error`): an error object in the stream
    or an HTTP error, a dropped connection, undecodable data, and a stream that ended
    without a ``finishReason`` (:class:`MalformedStream`). What was emitted before stays
    emitted; no :class:`FinishChunk` follows an error.
    """
    parser = _Parser(emit, answer_tool)
    iterator = aiter(stream)
    try:
        while True:
            try:
                response = await anext(iterator)
            except StopAsyncIteration:
                break
            except Exception as exc:
                raise classify_error(exc, streaming=True) from exc
            await parser.feed(response)
        await parser.end()
    except Exception:
        # billed though the call failed: the usage the chunks gave (branch leftmix)
        usage, parser.usage = parser.usage, None
        if usage is not None:
            await emit(UsageChunk(usage=usage))
        raise
