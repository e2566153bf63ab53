"""One provider call against the loopback server, as the provider tests make it.

Each provider's tests build their provider their own way (model, key, base URL); what
they share is here: the request they send, serving the replies, recording what the call
emitted and how it failed, and what the server received. Two shapes serve the two ways
the tests check a failure: :func:`replay_with` (the error is expected or it is raised)
and :func:`call_with` (the error is kept for the test to look at).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import attrs
import trio

from runtime.actor_messages import InferRequest
from runtime.chunks import FinishChunk, ReasoningChunk, TextChunk, ToolCallChunk, Usage, UsageChunk
from runtime.errors import AxonError, ProviderError
from runtime.inbox import Inbox
from runtime.messages import UserMessage
from tests.support.loopback import Reply, loopback_server


def make_request(
    messages: tuple[Any, ...] = (UserMessage(content="Hi"),),
    *,
    tools: tuple[Any, ...] = (),
    instructions: str | None = "Be brief.",
    settings: dict[str, Any] | None = None,
    output: Any = None,
    turn_id: str = "turn-1",
) -> InferRequest:
    """A one-step request of session ``s1`` with a fresh inbox and cancel scope."""
    return InferRequest(
        request_id="req-1",
        session_id="s1",
        turn_id=turn_id,
        step=0,
        instructions=instructions,
        messages=messages,
        tools=tools,
        reply=Inbox(),
        cancel_scope=trio.CancelScope(),
        settings=settings or {},
        output=output,
    )


class Run:
    """What one replayed call left behind: the chunks, the error, the server."""

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.error: BaseException | None = None
        self.server: Any = None

    async def emit(self, chunk: Any) -> None:
        self.chunks.append(chunk)

    def of(self, cls: type) -> list[Any]:
        return [c for c in self.chunks if isinstance(c, cls)]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.of(TextChunk))

    @property
    def request(self) -> Any:
        """The last request the server received."""
        return self.server.requests[-1]

    @property
    def body(self) -> Any:
        return self.request.json()


async def replay_with(
    make: Callable[[str], Any],
    *replies: Reply,
    request: InferRequest | None = None,
    expect_error: bool = False,
) -> Run:
    """Serve ``replies``, build the provider (an SDK provider: it has ``aclose``) with
    ``make(server_url)`` and make one call: a :class:`ProviderError` fails the test
    unless ``expect_error``, and one must come when it is."""
    run = Run()
    async with loopback_server(*replies) as server:
        run.server = server
        provider = make(server.url)
        try:
            await provider.stream(request or make_request(), run.emit)
        except ProviderError as exc:
            if not expect_error:
                raise
            run.error = exc
        finally:
            await provider.aclose()
    assert (run.error is not None) == expect_error
    return run


@attrs.define
class Call:
    """What one provider call emitted, how it failed, and what the server received."""

    chunks: list[Any]
    error: AxonError | None
    requests: list[Any]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks if isinstance(c, TextChunk))

    @property
    def reasoning(self) -> str:
        return "".join(c.text for c in self.chunks if isinstance(c, ReasoningChunk))

    @property
    def calls(self) -> list[ToolCallChunk]:
        return [c for c in self.chunks if isinstance(c, ToolCallChunk)]

    @property
    def usage(self) -> Usage | None:
        found = [c.usage for c in self.chunks if isinstance(c, UsageChunk)]
        return found[-1] if found else None

    @property
    def finish(self) -> FinishChunk:
        assert isinstance(self.chunks[-1], FinishChunk), self.chunks[-1:]
        return self.chunks[-1]

    def of(self, kind: type) -> list[Any]:
        return [c for c in self.chunks if isinstance(c, kind)]

    def body(self) -> dict[str, Any]:
        return self.requests[-1].json()


async def call_with(make: Callable[[str], Any], *replies: Reply, request: InferRequest) -> Call:
    """Serve ``replies``, build the provider (an SDK provider: it has ``aclose``) with
    ``make(server_url)`` and make one call, keeping any :class:`AxonError` it fails with."""
    async with loopback_server(*replies) as server:
        provider = make(server.url)
        chunks: list[Any] = []

        async def emit(chunk: Any) -> None:
            chunks.append(chunk)

        error = None
        try:
            await provider.stream(request, emit)
        except AxonError as exc:
            error = exc
        finally:
            await provider.aclose()
        return Call(chunks, error, server.requests)


async def cancel_after_first_chunk(
    make: Callable[[str], Any], reply: Reply
) -> tuple[InferRequest, list[Any]]:
    """One call whose requester cancels it as soon as the first chunk comes: the request
    (its cancel scope says whether the cancel was caught) and the chunks emitted."""
    request = make_request()
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)
        request.cancel_scope.cancel()  # the requester gives up after the first chunk

    async with loopback_server(reply) as server:
        provider = make(server.url)
        with trio.fail_after(5):
            with request.cancel_scope:
                await provider.stream(request, emit)
        await provider.aclose()
    return request, chunks


async def served_items(make: Callable[[str], Any], reply: Reply) -> list[Any]:
    """One request through the actor path (``provider.serve``): every item the requester's
    inbox received, in order."""
    async with loopback_server(reply) as server:
        provider = make(server.url)
        request = make_request()
        await provider.serve(request)
        items: list[Any] = []
        batches: list[Any] = []
        request.reply.drain_nowait(batches)
        for batch in batches:
            items.extend(batch)
        await provider.aclose()
    return items


async def cli_turn(reply: Reply, options: Callable[[str], list[str]]) -> tuple[list[dict], list]:
    """``python -m runtime run --jsonl`` with ``options(server_url)`` and a dummy key
    against a loopback server giving ``reply``: it must exit 0; its JSONL chunks and the
    requests the server got."""
    async with loopback_server(reply) as server:
        proc = await trio.run_process(
            [
                sys.executable,
                "-m",
                "runtime",
                "run",
                "--jsonl",
                *options(server.url),
                "--api-key",
                "test",
                "Hi",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads(x) for x in proc.stdout.decode().splitlines()], server.requests
