"""``ScriptedProvider``: replays scripted model calls offline, with no key and no network.

It is the embedded default (the demo agent runs on it) and the workhorse of the tests.
A script is a list of *steps*; each step is the list of chunks one model call emits.
Which step plays is derived from the request itself (how many model calls the current
turn has made so far), so one provider can serve any number of sessions at once and
each turn replays the script from its first step.

A step may contain:

* :mod:`runtime.chunks` values, emitted as they are;
* a :class:`~runtime.provider.TextRun`: emitted as it is to a request that takes runs
  (the turn runner's), else as a text chunk per delta;
* plain ``str``: shorthand for text (split into pieces of ``chunk_size`` characters);
* an exception instance: raised at that point (a scripted provider error);
* :class:`Sleep`: wait that long (Trio clock; tests use ``autojump_clock``).

A step that does not end with a :class:`~runtime.chunks.FinishChunk` gets one: reason
``tool-calls`` if it made tool calls, else ``stop``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs
import trio

from runtime.actor_messages import InferRequest, RetryPrompt
from runtime.chunks import (
    FinishChunk,
    ReasoningChunk,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.errors import ProviderError
from runtime.messages import AssistantMessage, Message, ToolMessage, UserMessage
from runtime.provider import Emit, Provider, ProviderOptions, TextRun
from runtime.ratelimit import RateLimit


@attrs.frozen
class Sleep:
    """Pause the scripted stream for ``seconds``."""

    seconds: float


Step = Sequence[StreamChunk | str | BaseException | Sleep]
Responder = Callable[[InferRequest], Step]


def tool_call(
    tool_name: str, input: dict[str, Any], *, tool_call_id: str | None = None, pieces: int = 3
) -> list[StreamChunk]:
    """The chunks of one streamed tool call: start, ``pieces`` input deltas, the call."""
    import json

    call_id = tool_call_id or f"call_{tool_name}"
    raw = json.dumps(input)
    size = max(1, -(-len(raw) // pieces))
    out: list[StreamChunk] = [ToolInputStartChunk(tool_call_id=call_id, tool_name=tool_name)]
    out += [
        ToolInputDeltaChunk(tool_call_id=call_id, delta=raw[i : i + size])
        for i in range(0, len(raw), size)
    ]
    out.append(ToolCallChunk(tool_call_id=call_id, tool_name=tool_name, input=input))
    return out


def current_step(messages: Sequence[Message]) -> int:
    """How many model calls the current turn has made: the number of distinct steps in
    the assistant message after the last user message (a structured-output
    :class:`~runtime.actor_messages.RetryPrompt` is not the user's: skipped)."""
    for msg in reversed(messages):
        if isinstance(msg, RetryPrompt):
            continue
        if isinstance(msg, UserMessage):
            return 0
        if isinstance(msg, AssistantMessage):
            return len({p.step for p in msg.content})
    return 0


def turn_index(messages: Sequence[Message]) -> int:
    """Zero-based index of the current turn (user messages so far, minus one)."""
    inputs = sum(1 for m in messages if isinstance(m, UserMessage) and type(m) is not RetryPrompt)
    return max(0, inputs - 1)


class ScriptedProvider(Provider):
    """Replays scripted steps. Give ``steps`` (every turn replays them), ``turns`` (a
    list of step lists, one per turn), or a ``responder`` that builds a step from the
    request."""

    provider_name: ClassVar[str] = "scripted"

    def __init__(
        self,
        steps: Sequence[Step] | None = None,
        *,
        turns: Sequence[Sequence[Step]] | None = None,
        responder: Responder | None = None,
        chunk_size: int | None = None,
        delay: float = 0.0,
        burst: int = 32,
        usage: Usage | None = None,
        model: str = "scripted",
        max_concurrency: int | None = None,
        name: str | None = None,
        keep_requests: int | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        if sum(x is not None for x in (steps, turns, responder)) != 1:
            raise ValueError("give exactly one of steps=, turns= or responder=")
        super().__init__(
            model=model, max_concurrency=max_concurrency, name=name, rate_limit=rate_limit
        )
        self.steps = list(steps) if steps is not None else None
        self.turns = [list(t) for t in turns] if turns is not None else None
        self.responder = responder
        self.chunk_size = chunk_size
        """Split scripted strings into pieces of this many characters (``None``: words)."""
        self.delay = delay
        """Seconds to wait before each chunk (0: none, the stream is as fast as it gets)."""
        self.burst = burst
        """Without a delay, yield to the scheduler after this many chunks: what one network
        read of a fast stream delivers. 1 makes every chunk travel the pipeline alone."""
        self.usage = usage
        """Usage reported per call; by default derived from the text lengths."""
        self.requests: deque[InferRequest] = deque(maxlen=keep_requests)
        """The requests received (the last ``keep_requests`` of them; all when ``None``), for
        tests to inspect what a provider would be sent. A long-lived server keeps none: each
        request holds its session's whole history."""

    @classmethod
    def from_options(cls, options: ProviderOptions) -> ScriptedProvider:
        """``--provider scripted``: the offline demo script (:func:`demo_script`), paced
        by ``--delay``; the other options do not apply."""
        return cls.demo(options.delay)

    @classmethod
    def demo(cls, delay: float = 0.0) -> ScriptedProvider:
        """A provider playing :func:`demo_script`.

        It keeps no requests: the demo serves long-lived ``serve`` processes, where
        recording every request would hold every session's history (and every prompt)
        for ever."""
        return cls(responder=demo_script, delay=delay, keep_requests=0)

    def describe_settings(self) -> dict[str, Any]:
        return {"delay": self.delay, "chunk_size": self.chunk_size}

    def select(self, request: InferRequest) -> Step:
        if self.responder is not None:
            return self.responder(request)
        step = current_step(request.messages)
        script = self.steps
        if self.turns is not None:
            t = turn_index(request.messages)
            if t >= len(self.turns):
                raise ProviderError(f"script has no turn {t}", provider="scripted")
            script = self.turns[t]
        assert script is not None
        if step >= len(script):
            raise ProviderError(f"script has no step {step}", provider="scripted")
        return script[step]

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        self.requests.append(request)
        produced = 0
        emitted = 0
        has_calls = False
        finished = False
        for item in self.select(request):
            if isinstance(item, Sleep):
                await trio.sleep(item.seconds)
                continue
            if isinstance(item, BaseException):
                # The script's one instance, raised by every turn that plays the step:
                # raised as it was, each raise added that turn's frames to its traceback
                # (the turn's runner, inboxes and messages, about a hundred objects a
                # turn, held for as long as the script).
                raise item.with_traceback(None)
            pieces: list[StreamChunk]
            if isinstance(item, str):
                pieces = [TextChunk(text=t) for t in self._split(item)]
            elif type(item) is ReasoningChunk and item.text and item.signature is None:
                texts = self._split(item.text)
                pieces = [ReasoningChunk(text=t, provider=item.provider) for t in texts]
            elif type(item) is TextRun and not request.text_runs:  # a delta a chunk
                pieces = [TextChunk(text=t) for t in item.texts]
            else:
                pieces = [item]
            for chunk in pieces:
                if self.delay:
                    await trio.sleep(self.delay)
                if isinstance(chunk, TextChunk | ReasoningChunk):
                    produced += len(chunk.text)
                elif isinstance(chunk, ToolCallChunk):
                    has_calls = True
                elif isinstance(chunk, FinishChunk):
                    finished = True
                await emit(chunk)
                emitted += 1
                if emitted % self.burst == 0:
                    await trio.lowlevel.checkpoint()  # let downstream run, like a network read
        if not finished:
            usage = self.usage or Usage(
                input_tokens=10,
                output_tokens=max(1, produced // 4),
                total_tokens=10 + max(1, produced // 4),
            )
            await emit(UsageChunk(usage=usage))
            reason = "tool-calls" if has_calls else "stop"
            raw = "tool_calls" if has_calls else "stop"
            await emit(FinishChunk(reason=reason, raw_reason=raw))

    def _split(self, text: str) -> list[str]:
        if self.chunk_size:
            n = self.chunk_size
            return [text[i : i + n] for i in range(0, len(text), n)]
        pieces: list[str] = []
        start = 0
        for i, ch in enumerate(text):
            if ch == " " and i > start:
                pieces.append(text[start:i])
                start = i
        pieces.append(text[start:])
        return [p for p in pieces if p]


DEMO_PROMPT_CHARS = 4096
"""How much of the user's text the demo script reads."""


def demo_script(request: InferRequest) -> list[StreamChunk | str]:
    """The demo's model (:mod:`runtime.app.demo`): a responder that reasons, calls
    ``get_weather`` (or ``get_time`` when asked the time), then answers from the result.

    It plays the model's part only: it names the tools, and the demo agent (application
    code, :mod:`runtime.app.demo`) defines them, as a real model knows tools by name.
    """
    user = next((m for m in reversed(request.messages) if isinstance(m, UserMessage)), None)
    # Its start is enough to pick a reply: matching megabytes of input (a pasted
    # document) would hold the event loop for seconds.
    prompt = user.text[:DEMO_PROMPT_CHARS] if user else ""
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolMessage):  # step 2: answer from the tool's result
        if last.error:
            return [f"Sorry, the {last.tool_name} tool failed: {last.error}"]
        out = last.output
        if last.tool_name == "get_weather" and isinstance(out, dict):
            return [
                ReasoningChunk(
                    text="The tool answered; I will summarize it briefly.", provider="scripted"
                ),
                f"It is {out['temperature_c']}°C and {out['conditions']} "
                f"in {out['city']} right now.",
            ]
        return [f"The current time is {out}."]
    if re.search(r"\b(time|clock|hour)\b", prompt, re.I):
        return [
            ReasoningChunk(
                text="The user wants the time. I will call the clock tool.", provider="scripted"
            ),
            *tool_call("get_time", {"timezone": "UTC"}, tool_call_id="call_time_1"),
        ]
    match = re.search(r"\b(?:in|at|for)\s+([A-Z][\w-]*(?:\s+[A-Z][\w-]*)*)", prompt)
    city = match.group(1) if match else "Paris"
    return [
        ReasoningChunk(
            text=f"The user asks about the weather in {city}. I should call get_weather "
            "rather than guess, then answer in one sentence.",
            provider="scripted",
        ),
        "Let me check the weather. ",
        *tool_call("get_weather", {"city": city}, tool_call_id="call_weather_1"),
    ]
