"""``JsonlRecorder``: every bus event it sees, one JSON object a line, credentials redacted.

Lines are buffered and written from a worker thread whenever the inbox runs dry, so the
recorder never blocks the Trio loop on disk; its ``drop-oldest`` inbox means a slow disk
never stalls an agent (a ``bus.lagged`` line records any loss).
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

import orjson
import trio

from runtime.actor import Actor
from runtime.errors import ConfigurationError
from runtime.inbox import OverflowPolicy
from runtime.redact import redact, redacted_str
from runtime.serde import event_to_dict, exact_loads


class JsonlRecorder(Actor):
    subscribes_to: ClassVar[Any] = Actor.ALL
    overflow: ClassVar[OverflowPolicy] = "drop-oldest"
    inbox_capacity = 65536

    def __init__(
        self, path: str | os.PathLike[str], *, name: str = "recorder", session_id: str | None = None
    ) -> None:
        super().__init__(name=name, session_id=session_id)
        self.path = os.fspath(path)
        self._buffer: list[bytes] = []
        self._file: Any = None

    async def on_start(self) -> None:
        if self._file is None:
            self._file = await trio.to_thread.run_sync(open, self.path, "ab")

    async def handle(self, event: Any) -> None:
        self._buffer.append(_line(event))
        if not len(self.inbox):
            await self.flush()

    async def flush(self) -> None:
        if self._buffer and self._file is not None:
            data, self._buffer = b"".join(self._buffer), []
            f = self._file

            def write() -> None:
                f.write(data)
                f.flush()

            await trio.to_thread.run_sync(write)

    def stop(self) -> None:
        super().stop()

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            with trio.CancelScope(shield=True):
                await self.flush()
                if self._file is not None:
                    await trio.to_thread.run_sync(self._file.close)
                    self._file = None


def _line(event: Any) -> bytes:
    """``event`` as one JSON line, redacted: an object JSON has no type for is written as
    its text, redacted too (:func:`~runtime.redact.redacted_str`), and a mapping's keys
    that are no strings as their text. An application's own event (any attrs class with a
    ``kind``) may hold anything: one with an object whose text quoted a key recorded the
    key, and one JSON could not encode crashed the recorder, losing the event."""
    data = redact(event_to_dict(event))
    try:
        return orjson.dumps(data, default=redacted_str) + b"\n"
    except TypeError:  # a key that is no string, or a lone surrogate in a text
        pass
    try:
        return orjson.dumps(data, default=redacted_str, option=orjson.OPT_NON_STR_KEYS) + b"\n"
    except TypeError:  # a lone surrogate (half an emoji, a surrogateescape'd file name)
        text = json.dumps(data, default=redacted_str, ensure_ascii=True, separators=(",", ":"))
        return text.encode() + b"\n"


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The recorded events of a JSONL file, as dicts."""
    with open(path, "rb") as f:
        return [_loads(line) for line in f if line.strip()]


def _loads(line: bytes) -> Any:
    """One recorded line: orjson's, else Python's ``json`` for a line holding an escaped
    lone surrogate (which orjson refuses, and :func:`_line` writes); a line neither
    reads raises orjson's error."""
    try:
        return exact_loads(line)  # (an integer past 64 bits, which _line writes, exactly)
    except orjson.JSONDecodeError:
        try:
            return json.loads(line)
        except ValueError:
            pass
        raise


def recorder_plugin(options: str | None = None) -> JsonlRecorder:
    """The ``recorder`` plug-in (``--plugin recorder:PATH``, ``run --record PATH``): every
    bus event appended to the JSONL file ``PATH``."""
    if not options:
        raise ConfigurationError("plug-in 'recorder' needs a file: --plugin recorder:PATH")
    # Checked here, where a bad option is one error line before anything runs: the
    # actor's first open failed later, four times over its restart policy, a traceback.
    if os.path.isdir(options):
        raise ConfigurationError(f"cannot record to {options}: it is a folder, not a file")
    folder = os.path.dirname(os.path.abspath(options))
    if not os.path.isdir(folder):
        raise ConfigurationError(f"cannot record to {options}: there is no folder {folder}")
    return JsonlRecorder(options)
