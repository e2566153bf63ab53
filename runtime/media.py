"""User input with images and files: turning what a caller passes into stored parts, and
the size limits that guard it.

``session.stream(...)`` accepts plain text (stored as it always was) or a list of text,
:class:`~runtime.messages.Image` and :class:`~runtime.messages.File` values;
:func:`user_content` turns that into a :class:`~runtime.messages.UserMessage`'s content
and :func:`check_limits` refuses it, before anything is stored or sent, when an item or
the whole message is bigger than the agent's :class:`MediaLimits`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from runtime.chunks import _eq, _hash, _repr
from runtime.errors import ConfigurationError, InvalidMedia, MediaTooLarge, TooManyParts
from runtime.messages import File, Image, TextPart, UserContent, UserPart

MIB = 1024 * 1024

UserInput = str | Image | File | Iterable[str | TextPart | Image | File]
"""What ``session.stream`` takes: text, one image or file, or a list of them in order."""


@attrs.frozen(kw_only=True, slots=True)
class MediaLimits:
    """Largest media a user message may carry, in bytes (inline data only: an http(s) URL
    is fetched by the provider and counts as nothing here), and whether it may carry
    media by URL at all.

    The defaults follow the providers' own limits: 20 MiB per image (OpenAI's), 32 MiB per
    file and per message (Anthropic's whole-request limit).
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    image_bytes: int = 20 * MIB
    file_bytes: int = 32 * MIB
    message_bytes: int = 32 * MIB
    allow_urls: bool = True
    """Whether an image or file may be an ``http(s)`` URL. Such a URL goes to the model
    server, which fetches it: a hosted provider from the internet, but a self-hosted
    ``base_url`` server from inside your network (``169.254.169.254``, internal hosts),
    on behalf of whoever sent the message. ``False`` refuses URL parts
    (:class:`~runtime.errors.InvalidMedia`, a 400 over HTTP) before anything is stored;
    inline data (``data:`` URLs included) is unaffected. ``--media-urls off``."""


DEFAULT_MAX_PARTS = 1000
DEFAULT_MAX_FILES = 100


def _at_least_one(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{attribute.name} must be an int >= 1, not {value!r}")


@attrs.frozen(kw_only=True, slots=True)
class InputLimits:
    """How many parts one user message (one turn's input) may carry: ``max_parts`` in all
    (text, images and files), ``max_files`` of them images or files.

    Every part costs work however small it is (decoding, checking, storing, sending), so
    a message of 400,000 one-byte ``data:`` files, far under any byte limit, could keep a
    server busy for minutes. The defaults are far above what a person attaches by hand.
    Set on the host (``Host.open(input_limits=...)``; ``--max-parts``/``--max-files`` on
    ``serve`` and ``worker``), unlike :class:`MediaLimits`, which is the agent's."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    max_parts: int = attrs.field(default=DEFAULT_MAX_PARTS, validator=_at_least_one)
    max_files: int = attrs.field(default=DEFAULT_MAX_FILES, validator=_at_least_one)

    def check(self, parts: int, files: int) -> None:
        """Raise :class:`~runtime.errors.TooManyParts` when ``parts`` (all of a message's
        parts) or ``files`` (its images and files) is over the limit."""
        if files > self.max_files:
            raise TooManyParts(
                f"the message has {files} images and files; the limit is {self.max_files} "
                "per message",
                count=files,
                limit=self.max_files,
            )
        if parts > self.max_parts:
            raise TooManyParts(
                f"the message has {parts} parts; the limit is {self.max_parts} per message",
                count=parts,
                limit=self.max_parts,
            )


def check_counts(content: UserContent, limits: InputLimits) -> None:
    """Raise :class:`~runtime.errors.TooManyParts` when ``content`` has more parts, or
    more images and files, than ``limits`` allow (plain text is one part)."""
    if isinstance(content, str):
        return
    files = sum(1 for part in content if isinstance(part, Image | File))
    limits.check(len(content), files)


def _human(n: int) -> str:
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} bytes"


def _label(part: Image | File) -> str:
    name = getattr(part, "filename", None)
    kind = "image" if isinstance(part, Image) else "file"
    return f"{kind} {name!r}" if name else f"{kind} ({part.media_type})"


def _unicode(text: str) -> str:
    """``text``, or :class:`~runtime.errors.InvalidMedia` when it holds a lone surrogate:
    bytes that were not UTF-8 decoded with ``surrogateescape`` (a command-line argument
    typed in a Latin-1 terminal), which no store writes. Taken, the turn ran (a model
    call paid for), then its save and every later save of the session failed."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidMedia(
            f"the user input is not valid text: {text[exc.start : exc.end]!r} at character "
            f"{exc.start} is a lone surrogate (bytes that were not UTF-8?)"
        ) from None
    return text


def user_content(value: Any) -> UserContent:
    """The stored content for ``value``: a ``str`` stays a ``str``; a part, or a list of
    text/parts, becomes a tuple of parts (strings become ``TextPart(step=0)``, empty ones
    are dropped). Anything else is an :class:`~runtime.errors.InvalidMedia`."""
    if isinstance(value, str):
        return _unicode(value)
    if isinstance(value, TextPart):
        _unicode(value.text)
    if isinstance(value, Image | File | TextPart):
        return (value,)
    if isinstance(value, bytes | bytearray | dict) or not isinstance(value, Iterable):
        raise InvalidMedia(
            "user input must be text, an Image, a File or a list of them, "
            f"not {type(value).__name__}"
        )
    parts: list[UserPart] = []
    for item in value:
        if isinstance(item, str):
            if item:
                parts.append(TextPart(text=_unicode(item), step=0))
        elif isinstance(item, Image | File):
            parts.append(item)
        elif isinstance(item, TextPart):
            _unicode(item.text)
            parts.append(item if item.step == 0 else attrs.evolve(item, step=0))
        else:
            raise InvalidMedia(
                f"a user input list holds text, Image and File values, not {type(item).__name__}"
            )
    if not parts:
        raise InvalidMedia("the user input list is empty")
    return tuple(parts)


def check_limits(content: UserContent, limits: MediaLimits) -> None:
    """Raise :class:`~runtime.errors.MediaTooLarge` when an image, a file, or the media of
    the whole message together exceed ``limits``; the message names the item, its size and
    the limit. An image or file by URL when ``limits`` do not allow URLs is an
    :class:`~runtime.errors.InvalidMedia` naming it."""
    if isinstance(content, str):
        return
    total = 0
    for part in content:
        if not isinstance(part, Image | File):
            continue
        if part.url is not None and not limits.allow_urls:
            raise InvalidMedia(
                f"{_label(part)} is given by URL ({part.url[:100]}), and media URLs are off "
                "here (the model server would fetch it): send the bytes (a data: URL) instead"
            )
        limit = limits.image_bytes if isinstance(part, Image) else limits.file_bytes
        if part.size > limit:
            raise MediaTooLarge(
                f"{_label(part)} is {_human(part.size)}; the limit is {_human(limit)} "
                f"per {'image' if isinstance(part, Image) else 'file'}",
                size=part.size,
                limit=limit,
            )
        total += part.size
    if total > limits.message_bytes:
        raise MediaTooLarge(
            f"the images and files of this message are {_human(total)} together; the limit "
            f"is {_human(limits.message_bytes)} per message",
            size=total,
            limit=limits.message_bytes,
        )


def tool_output(value: Any) -> Any:
    """A tool's return value with media kept as parts: an :class:`Image`/:class:`File`
    becomes a one-part tuple, a list holding any becomes a tuple of parts (strings become
    text parts). ``None`` for anything else (the caller makes it JSON as usual)."""
    if isinstance(value, Image | File):
        return (value,)
    if isinstance(value, list | tuple) and any(isinstance(v, Image | File) for v in value):
        try:
            return user_content(value)
        except InvalidMedia as exc:
            raise TypeError(str(exc)) from None
    return None


def elide_media(value: Any) -> Any:
    """``value`` (unstructured JSON data) with the base64 ``data`` of every image and file
    part replaced by ``"<N bytes>"``: for log lines, which must not carry megabytes of an
    image per event. Containers without media are returned as they are (not copied).

    Every log line passes through here, so scalars are skipped without a call and a
    container is copied only once something in it changed."""
    if isinstance(value, dict):
        if value.get("type") in ("image", "file") and isinstance(value.get("data"), str):
            data = value["data"]
            size = len(data) * 3 // 4 - (len(data) - len(data.rstrip("=")))
            return {**value, "data": f"<{size} bytes>"}
        copy: Any = None
        for k, v in value.items():
            if type(v) in _SCALARS:
                continue
            e = elide_media(v)
            if e is not v:
                if copy is None:
                    copy = dict(value)
                copy[k] = e
        return value if copy is None else copy
    if isinstance(value, (list, tuple)):
        copy = None
        for i, v in enumerate(value):
            if type(v) in _SCALARS:
                continue
            e = elide_media(v)
            if e is not v:
                if copy is None:
                    copy = list(value)
                copy[i] = e
        return value if copy is None else copy
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Exact types :func:`elide_media` need not look into."""
