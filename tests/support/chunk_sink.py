"""A parser's sink that keeps what it is sent, for tests that read a provider's parser
directly (without the engine): called with one chunk, or ``send_all`` with several."""

from __future__ import annotations

from typing import Any


class ChunkSink:
    """Every chunk sent, in order, in :attr:`chunks`."""

    def __init__(self, chunks: list[Any] | None = None) -> None:
        self.chunks: list[Any] = [] if chunks is None else chunks

    async def __call__(self, chunk: Any) -> None:
        self.chunks.append(chunk)

    async def send_all(self, chunks: Any, *, whole: bool = False) -> None:
        self.chunks += chunks
