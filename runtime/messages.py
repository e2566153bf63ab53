"""Conversation messages and the parts of an assistant message.

One user input produces exactly one :class:`AssistantMessage`, whose ``content`` holds the
parts of every step of the turn in stream order, each tagged with its ``step``. Tool
results are :class:`ToolMessage` s placed right after it, in call order. Providers split
this back into one request message per step ("restoration"); the core never does.

Everything here is a frozen value: persisted data holds no references to live actors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar
from urllib.parse import unquote_to_bytes, urlsplit

import attrs
import orjson

from runtime import json_exact
from runtime.chunks import Usage, _eq, _hash, _repr
from runtime.errors import InvalidMedia
from runtime.ids import new_id
from runtime.output import ErrorInfo


def _new_id() -> str:
    return new_id("msg")


@attrs.frozen(kw_only=True, slots=True)
class TextPart:
    """Answer text produced in one step."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "text"
    text: str
    step: int
    refusal: bool = False
    """The provider marked this text as a refusal."""
    citations: tuple[dict[str, Any], ...] | None = None
    """The sources the provider cited for this text (Anthropic's ``citations`` of a text
    block, each as it came), sent back to that provider with it; ``None``: none."""


@attrs.frozen(kw_only=True, slots=True)
class ReasoningPart:
    """Reasoning produced in one step; signed reasoning round-trips only to its signer."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "reasoning"
    text: str
    step: int
    signature: str | None = None
    """The provider's signature; ``None`` for unsigned or interrupted blocks."""
    redacted_data: str | None = None
    """Opaque encrypted reasoning, sent back verbatim (Anthropic ``redacted_thinking``)."""
    provider: str | None = None
    """The provider that produced the block (``"anthropic"``, ``"openai"``, ...)."""
    model: str | None = None
    """The model that produced the block: a signature is bound to it. ``None`` in parts
    stored before models were recorded (they replay to their provider, whatever model)."""
    endpoint: str | None = None
    """The normalised endpoint the block came from (:func:`runtime.history.endpoint_of`):
    signatures and encrypted reasoning are refused by any other server. ``None`` when not
    recorded, which matches any endpoint of the provider."""


@attrs.frozen(kw_only=True, slots=True)
class Awaiting:
    """What a tool call that suspended its turn waits for, and, once given, the answer
    (docs/approval.md). Stored on its :class:`ToolCallPart`, so the stored message holds
    the request, the decision and (in its :class:`ToolMessage`) the result."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    kind: str
    """``"approval"`` (a person approves or denies) or ``"client"`` (the caller runs the
    tool and supplies its output)."""
    id: str
    """The approval id (``approvalId`` in the AI SDK stream); a client tool's is its call id."""
    turn_id: str
    """The turn that suspended: its continuation runs under the same id."""
    decided: bool = False
    approved: bool | None = None
    reason: str | None = None
    output: Any = None
    """A client tool's output, as the caller gave it."""
    error: str | None = None
    """A client tool's failure, as the caller reported it."""
    expires_at: float | None = None
    """When the wait expires (``Agent(approval_timeout=...)``): wall-clock seconds since
    the epoch, so it survives a restart. ``None`` (and every record stored before the
    field existed): never. Past it the call is denied with reason ``timed out``."""
    nested: bool = False
    """The call is an agent used as a tool (``as_tool(pass_approvals=True)``) whose
    sub-turn waits for this approval: :attr:`id` is the sub-turn's approval id. Decided
    either way, the call runs again and its sub-turn goes on with the decision (a denial
    is the sub-agent's to answer); its answer is the call's result."""
    caller: str | None = None
    """The wait is in the session of an agent used as a tool, and the session that called
    it (this id) decides it, its call's turn waiting for the same id
    (``as_tool(pass_approvals=True)``) or ending it: a decision addressed to this session
    is refused (:class:`~runtime.errors.CallerDecides`). ``None``: this session's own."""
    sub_tool: str | None = None
    """A nested wait (:attr:`nested`) of kind ``"client"``: the name of the sub-agent's
    client-side tool whose output the caller gives (its sub-turn waits for it). Its
    :attr:`id` is ``<this call's id>.<the sub-session's wait id>``: the caller answers
    it with ``respond(id, output=...)``, and the call passes the output down."""
    sub_input: Any = None
    """With :attr:`sub_tool`: that client tool call's input (what the caller's stream
    shows, ``tool-input-available``)."""
    original_input: Any = None
    """The input the model gave, when a person approved the call with an edited input
    (``respond(id, approved=True, edited_input=...)``): the part's ``input`` is then the
    edited one, the input the tool ran with; this keeps the model's own, which every
    provider is replayed (the edit told in the call's result, so signed reasoning before
    the call goes back with the turn exactly as returned:
    :func:`runtime.history.replay_edits`), and for audit. ``None``
    (and every record stored before the field existed): not edited (a call's input is
    always an object, never ``None``)."""
    edit_in_result: bool = False
    """With :attr:`original_input`: the model is replayed its own input and told the edit
    at the head of the call's result (:func:`runtime.history.replay_edits`). ``False``
    on an edit stored before that rule: replayed with the edit as the call's input, as
    it was then, so a session's history stays what its later reasoning was signed over."""
    schema: Any = None
    """The input schema the model was given for the call, when no code holds it: an MCP
    server's tool (listed by the host's MCP actor at run time, :meth:`~runtime.tools.Tool.
    stored_schema`), or a nested approval's (:attr:`asked_tool`) when its call is one. An
    edit (``respond(id, approved=True, edited_input=...)``) is checked against it, in
    any process, with or without that server's session open. Stored once a message:
    every wait given one names it (:attr:`schema_ref`), and only the first of them
    holds it (:func:`share_schemas`); it is dropped once no call that names it waits
    (:func:`drop_unneeded_schemas`). Read it with :func:`stored_schema`, never from
    here alone. A record stored before :attr:`schema_ref` existed holds a copy on each
    waiting call (the oldest), or one a step and tool on one undecided call of it, the
    others finding it by the tool's name."""
    schema_ref: str | None = None
    """The stored schema's name (:func:`schema_ref`, a digest of its JSON), on each wait
    given one: the wait whose :attr:`schema` holds it is found by it, in the same
    message, whatever its call's tool or depth (100 sub-agent calls passing up the same
    tool's approval keep one copy, not 100). ``None``: no schema stored, or a record
    stored before the field existed."""
    asked_tool: str | None = None
    """A nested wait (:attr:`nested`) of kind ``"approval"``: the name of the sub-agent's
    tool whose call asks (two agents deep, the one the sub-session's own nested wait
    names), and :attr:`asked_input` that call's input as its model gave it: what an edit
    of this approval replaces (:attr:`edited_input`). ``None`` (and every record stored
    before the field existed): the approval cannot be edited."""
    asked_input: Any = None
    """With :attr:`asked_tool`: that call's input, as the sub-agent's model gave it."""
    asked_via: tuple[str, ...] = ()
    """With :attr:`asked_tool`, two and more agents deep: the agent tools between this
    call's sub-agent and the one whose tool asks (``("helper",)``: this call's sub-agent
    called ``helper``, whose :attr:`asked_tool` asks), so an edit is checked against that
    very tool, not one of the same name elsewhere. ``()``: this call's sub-agent's own."""
    edited_input: Any = None
    """A nested approval (:attr:`asked_tool`) approved with edits: the edit, which the
    sub-session's call takes as its input (and its model's in its own
    :attr:`original_input`) when this call runs again. The part's own ``input`` (the
    sub-agent's prompt) and :attr:`original_input` stay unset here: the edit is not of
    this call. ``None``: not edited."""
    counted: Usage | None = None
    """A nested wait (:attr:`nested`): the usage of the call's sub-turn up to its wait,
    which the calling turn counted as its own when it suspended. Decided, the call runs
    again and reports its sub-turn's whole usage (it is one turn, resumed); the calling
    turn adds only what is beyond this. Stored with the wait, so a continuation run in
    another process, or retried after a crash (its sub-turn finished by then), subtracts
    exactly what its suspended turn counted. ``None``: nothing counted (no usage)."""
    sub_answered: tuple[Awaiting, ...] = ()
    """A nested wait whose sub-agent asked for client tool calls in turn: each earlier
    one (a decided ``"client"`` wait, as it was, :attr:`sub_tool` and the caller's
    answer), in order, carried from wait to wait as the call is held again
    (``mark_held``). The stream showed each; :func:`~runtime.app.web.ui_stream.
    ui_messages` shows each too, so a reloaded page has the parts the live one built.
    ``()`` (and every record stored before the field existed): none before this one."""


@attrs.frozen(kw_only=True, slots=True)
class ToolCallPart:
    """A complete tool call the model made in one step."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "tool-call"
    tool_call_id: str
    tool_name: str
    input: Any
    step: int
    awaiting: Awaiting | None = None
    """Set when the call suspended its turn, waiting for a decision or a client's output."""


@attrs.frozen(kw_only=True, slots=True)
class ProviderDataPart:
    """An opaque provider block (server-side tool use/result), replayed only to its provider."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "provider-data"
    provider: str
    data: dict[str, Any]
    step: int
    model: str | None = None
    """The model that produced the block (``None``: not recorded; see :class:`ReasoningPart`)."""
    endpoint: str | None = None
    """The normalised endpoint it came from (``None``: not recorded)."""


Part = TextPart | ReasoningPart | ToolCallPart | ProviderDataPart


# -- media: images and files in user input and tool results ------------------------------

_MEDIA_TYPE = r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$"
"""A media type's shape. Compiled on first use (``re.compile`` caches it), not on
import: the contract's import time is issue 24's start-up figure."""
URL_SCHEMES = ("http", "https", "data")
"""The only URL schemes a media part accepts. An ``http(s)`` URL is never fetched here:
the provider fetches it. ``data:`` URLs are decoded into :attr:`Image.data`."""


def _data_url(url: str) -> tuple[bytes, str | None]:
    """The bytes and media type of a ``data:[<type>][;base64],<data>`` URL."""
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise InvalidMedia("a data: URL needs a ',' before its data")
    params = head.split(";")
    is_base64 = params[-1].strip().lower() == "base64"
    media_type = params[0].strip().lower() or None
    if is_base64:
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidMedia("the data: URL is not valid base64") from None
    else:
        data = unquote_to_bytes(payload)
    return data, media_type


def _sniff(data: bytes) -> str | None:
    """The media type the first bytes of ``data`` say (magic numbers), if any."""
    import filetype

    return filetype.guess_mime(data[:8192]) if data else None


def _looks_like_text(data: bytes) -> bool:
    if b"\x00" in data[:8192]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


Guess = Callable[[bytes | None, str | None], str | None]


def _normalize_media(obj: Any, what: str, guess: Guess) -> None:
    """Check an :class:`Image` / :class:`File` and fill in what construction left open.

    Called from ``__attrs_post_init__`` (the classes are frozen, hence ``object.__setattr__``,
    the documented attrs way): a ``data:`` URL becomes ``data``; a missing media type is
    sniffed from the bytes (or taken from the URL's or file name's extension); a declared
    type that the bytes contradict is refused, because providers answer that with a 400.
    """
    data, url = obj.data, obj.url
    if (data is None) == (url is None):
        raise InvalidMedia(f"{what} needs exactly one of data= (bytes) or url=")
    declared = obj.media_type
    if url is not None:
        if not isinstance(url, str):
            raise InvalidMedia(f"{what} url must be a string, not {type(url).__name__}")
        scheme = urlsplit(url.strip()).scheme.lower()
        if scheme not in URL_SCHEMES:
            raise InvalidMedia(
                f"{what} url must be an http:, https: or data: URL, not {scheme or 'a relative'}"
                f"{':' if scheme else ''} URL"
            )
        if scheme == "data":
            data, from_url = _data_url(url.strip())
            declared = declared or from_url
            object.__setattr__(obj, "url", None)
            url = None
    if data is not None:
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        if not isinstance(data, bytes):
            raise InvalidMedia(f"{what} data must be bytes, not {type(data).__name__}")
        object.__setattr__(obj, "data", data)
    if declared is not None:
        if not isinstance(declared, str):
            raise InvalidMedia(f"{what} media_type must be a string")
        declared = declared.split(";")[0].strip().lower()
        if not re.compile(_MEDIA_TYPE).match(declared):
            raise InvalidMedia(f"{what} media_type {obj.media_type!r} is not a media type")
    sniffed = _sniff(data) if data is not None else None
    if (
        declared is not None
        and sniffed is not None
        and sniffed != declared
        # Text may begin with anything: some signatures are two letters ("BM" is a
        # bitmap's), so a text file starting "BMW ..." is text, as declared.
        and not (declared.startswith("text/") and data is not None and _looks_like_text(data))
    ):
        raise InvalidMedia(f"{what} is declared {declared} but its bytes are {sniffed}")
    media_type = declared or sniffed or guess(data, url)
    if media_type is None:
        raise InvalidMedia(f"could not tell the media type of this {what}: pass media_type=")
    object.__setattr__(obj, "media_type", media_type)


def _guess_from_name(name: str | None) -> str | None:
    if not name:
        return None
    import mimetypes  # here, not at the top: ~1 ms of ``import runtime`` for a rare path

    guessed, _ = mimetypes.guess_type(urlsplit(name).path if "://" in name else name)
    return guessed


def _size_repr(data: bytes | None) -> str:
    return "None" if data is None else f"<{len(data)} bytes>"


@attrs.frozen(kw_only=True, slots=True)
class Image:
    """An image in user input or a tool result: its bytes (``data``) or a URL.

    Give exactly one of ``data`` and ``url``. ``url`` is an ``http(s)`` URL, which the
    provider fetches (never this process), or a ``data:`` URL, which is decoded into
    ``data``. ``media_type`` (``image/png``, ``image/jpeg``, ``image/gif``,
    ``image/webp``...) is sniffed from the bytes when left out, and bytes that contradict
    it are refused (:class:`~runtime.errors.InvalidMedia`). In JSON, ``data`` is base64.
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "image"
    data: bytes | None = attrs.field(default=None, repr=_size_repr)
    url: str | None = None
    media_type: str | None = None
    """Always set once constructed (declared, sniffed or from the URL's extension)."""

    def __attrs_post_init__(self) -> None:
        _normalize_media(self, "image", lambda _data, url: _guess_from_name(url))
        if not self.media_type.startswith("image/"):  # type: ignore[union-attr]
            raise InvalidMedia(f"an image must have an image/* media type, not {self.media_type}")

    @property
    def size(self) -> int:
        """Bytes this part carries (``0`` for an http(s) URL: the provider fetches it)."""
        return len(self.data) if self.data is not None else 0

    def data_url(self) -> str:
        """``data:<type>;base64,...`` for inline data, else the URL itself."""
        return _as_data_url(self)


@attrs.frozen(kw_only=True, slots=True)
class File:
    """A file (a PDF, a text file...) in user input or a tool result.

    Like :class:`Image`: exactly one of ``data`` / ``url``, ``media_type`` sniffed when left
    out (magic bytes, then the ``filename``'s or URL's extension, then ``text/plain`` for
    UTF-8 text). ``filename`` is shown to the model where the provider has a field for it.
    Which types a provider takes is the provider's business (see docs/media.md).
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    type: ClassVar[str] = "file"
    data: bytes | None = attrs.field(default=None, repr=_size_repr)
    url: str | None = None
    media_type: str | None = None
    """Always set once constructed."""
    filename: str | None = None

    def __attrs_post_init__(self) -> None:
        def guess(data: bytes | None, url: str | None) -> str | None:
            found = _guess_from_name(self.filename) or _guess_from_name(url)
            if found is None and data is not None and _looks_like_text(data):
                return "text/plain"
            return found

        if self.filename is not None and not isinstance(self.filename, str):
            raise InvalidMedia("file filename must be a string")
        _normalize_media(self, "file", guess)

    @property
    def size(self) -> int:
        """Bytes this part carries (``0`` for an http(s) URL: the provider fetches it)."""
        return len(self.data) if self.data is not None else 0

    def data_url(self) -> str:
        """``data:<type>;base64,...`` for inline data, else the URL itself."""
        return _as_data_url(self)


def _as_data_url(part: Image | File) -> str:
    if part.data is None:
        return part.url  # type: ignore[return-value]
    return f"data:{part.media_type};base64,{base64.b64encode(part.data).decode('ascii')}"


Media = Image | File
UserPart = TextPart | Image | File
"""A part of user content (or of a tool's result): text (``step`` is ``0``), an image, a file."""

UserContent = str | tuple[UserPart, ...]
"""What a :class:`UserMessage` holds: plain text, or parts (text, images, files)."""


def is_media_output(value: Any) -> bool:
    """Whether a tool's output is media parts (a tuple holding an :class:`Image`/:class:`File`)."""
    return isinstance(value, tuple) and any(isinstance(p, Image | File) for p in value)


_PART_KEYS: dict[Any, set[str]] = {
    cls.type: {a.name for a in attrs.fields(cls) if a.name != "citations"} | {"type"}
    for cls in (TextPart, Image, File)
}
"""The keys of each media part as the store writes it (its fields and ``type``; a text
part's ``citations`` are written only when it has some, which a tool's never has)."""


def reads_back_as_media(value: Any) -> bool:
    """Whether a tool output's JSON ``value`` is what a store reads back as media parts
    (:mod:`runtime.serde`): a list of dicts each with exactly a part's keys, one an image
    or a file. A media output is stored that way; an ordinary JSON output that merely has
    a ``"type"`` key stays what it was."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(p, dict) and _PART_KEYS.get(p.get("type")) == p.keys() for p in value)
        and any(p["type"] in ("image", "file") for p in value)
    )


@attrs.frozen(kw_only=True, slots=True)
class SystemMessage:
    """A system message where it stands in the history; or, with
    :attr:`summarizes_before`, a stored summary made by context compaction."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    role: ClassVar[str] = "system"
    content: str
    id: str = attrs.field(factory=_new_id)
    summarizes_before: str | None = None
    """Set on a summary that context compaction stored (:mod:`runtime.compaction`): the id
    of the first message it does *not* stand for. Every request then sends this message
    in place of all the messages before that one (the store keeps them all); ``None``: an
    ordinary system message."""


@attrs.frozen(kw_only=True, slots=True)
class UserMessage:
    """User input: plain text, or a tuple of parts (:class:`TextPart` with ``step=0``,
    :class:`Image`, :class:`File`) when the input carried images or files."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    role: ClassVar[str] = "user"
    content: UserContent
    id: str = attrs.field(factory=_new_id)

    @property
    def text(self) -> str:
        """The text of the input (its text parts joined with ``""``)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def media(self) -> tuple[Image | File, ...]:
        """The images and files of the input, in order."""
        if isinstance(self.content, str):
            return ()
        return tuple(p for p in self.content if isinstance(p, Image | File))


@attrs.frozen(kw_only=True, slots=True)
class AssistantMessage:
    """Everything the model produced for one user input, across all its steps."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    role: ClassVar[str] = "assistant"
    content: tuple[Part, ...] = ()
    id: str = attrs.field(factory=_new_id)
    interrupted: bool = False
    """The turn was cut short from outside (cancelled, aborted, out of time) after this
    content was streamed. A turn that failed is not interrupted: see :attr:`error`."""
    error: ErrorInfo | None = None
    """Why the turn failed (authentication, a bad request, a provider failure after its
    retries...), its message redacted; ``None`` unless it failed. Stored with the message,
    so a restored conversation still says the answer is missing because of an error."""
    usage: Usage | None = None
    """What the turn's model calls used and cost (:class:`~runtime.chunks.Usage`), as of
    its last save: every step's calls, sub-agents' included, over every process that
    ran a step of it (a worker that took the turn over, a continuation after an
    approval). ``None`` in messages stored before it was recorded, and in those an
    application built."""

    @property
    def failed(self) -> bool:
        """The turn ended because of an error (:attr:`error`)."""
        return self.error is not None

    @property
    def status(self) -> str:
        """``"failed"``, ``"interrupted"`` or ``"complete"``."""
        if self.error is not None:
            return "failed"
        return "interrupted" if self.interrupted else "complete"

    def steps(self) -> list[list[Part]]:
        """The parts grouped by step, in step order (empty steps omitted)."""
        groups: dict[int, list[Part]] = {}
        for part in self.content:
            groups.setdefault(part.step, []).append(part)
        return [groups[s] for s in sorted(groups)]

    @property
    def text(self) -> str:
        """All answer text of the message, joined."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


@attrs.frozen(kw_only=True, slots=True)
class ToolMessage:
    """The result of one tool call; exactly one of ``output`` / ``error`` is meaningful."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    role: ClassVar[str] = "tool"
    tool_call_id: str
    tool_name: str
    step: int
    output: Any = None
    """The tool's JSON-ready result; a tool that returned an :class:`Image`/:class:`File`
    (or a list with some) has a tuple of :data:`UserPart` s here."""
    error: str | None = None
    """A message the model sees instead of an output (exception, bad input, interrupted)."""
    id: str = attrs.field(factory=_new_id)
    ran: bool | None = None
    """Recorded for the result of a call a person approved with edits
    (:attr:`Awaiting.edit_in_result`): ``True`` when the tool was called with the edit
    (the result is its output or its own error), ``False`` when it never was (its tool
    gone, the edit refused where it ran, the turn ended before it: the error says why),
    which decides what the model is told of the edit (:func:`runtime.history.replay_edits`).
    ``None``: any other result, one stored before this was recorded, or one whose run
    is not known (:attr:`ran_unknown`). Omitted from the stored JSON when ``None``."""
    ran_unknown: bool = False
    """``True`` for the result of a call a person approved with edits when whether its
    tool was called is not known: cut short (``interrupted``: it may have begun, or
    not) or failed on the runtime's side (``the tool call failed: ...``, an executor
    bug). The model is told the call *may* have run with the edit
    (:data:`runtime.history.EDIT_MAYBE_NOTE`). ``False`` for every other result, and for
    such a result stored before this was recorded (its replay stays what it was).
    Omitted from the stored JSON when ``False``."""

    @property
    def is_error(self) -> bool:
        return self.error is not None


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage


def schema_ref(schema: Any) -> str:
    """The name a stored schema goes by (:attr:`Awaiting.schema_ref`): a digest of its
    JSON, keys sorted, so equal schemas share one copy however they were listed (a bound
    past 64 bits written exactly: orjson refused it, and the wait was not stored)."""
    data = json_exact.dumps(schema, option=orjson.OPT_SORT_KEYS, marked=False)
    return hashlib.sha256(data).hexdigest()[:16]


def _waits(part: Any) -> bool:
    """Whether ``part`` is a call that waits, undecided."""
    return (
        isinstance(part, ToolCallPart) and part.awaiting is not None and not part.awaiting.decided
    )


def stored_schema(content: Sequence[Any], part: ToolCallPart) -> Any:
    """The schema an edit of ``part`` (a waiting call of ``content``, an assistant
    message's) is checked against (:attr:`Awaiting.schema`): its wait's own, else the
    one a part of the message holds under its :attr:`~Awaiting.schema_ref`. A message
    stores each schema once (:func:`share_schemas`): a copy a call, 100 calls of a tool
    with a 31 KB schema stored 3.1 MB, and deciding them one by one wrote 155 MB (each
    decision saves the message), against 60 KB and 5.9 MB; 100 sub-agent calls each
    passing up its call of that tool, the same (80 KB and 8 MB). A wait stored before refs existed
    without a copy of its own (one a step and tool) finds an undecided call of its
    tool's, not nested, that holds one."""
    waiting = part.awaiting
    if waiting is None or waiting.schema is not None:
        return None if waiting is None else waiting.schema
    ref = waiting.schema_ref
    if ref is not None:
        return next(
            (
                p.awaiting.schema
                for p in content
                if isinstance(p, ToolCallPart)
                and p.awaiting is not None
                and p.awaiting.schema_ref == ref
                and p.awaiting.schema is not None
            ),
            None,
        )
    if waiting.nested or waiting.kind != "approval":
        return None
    return next(
        (p.awaiting.schema for p in content if _legacy_carrier(p, part.tool_name)),
        None,
    )


def _legacy_carrier(part: Any, name: str) -> bool:
    """Whether ``part`` holds the one schema of tool ``name`` for its step's other
    calls, as a record stored before :attr:`Awaiting.schema_ref` existed did."""
    return (
        _waits(part)
        and part.tool_name == name
        and part.awaiting.kind == "approval"
        and not part.awaiting.nested
        and part.awaiting.schema is not None
        and part.awaiting.schema_ref is None
    )


SCHEMA_COPIES = os.environ.get("AXON_SCHEMA_COPIES", "message")
"""Where a message's waits keep their stored schemas (:func:`share_schemas`), read once
as the process starts: ``"message"`` (the default), one copy a message for each schema,
whatever tool or depth names it; ``"per-tool"``, the layout of the versions before
:attr:`Awaiting.schema_ref` (one copy a step and tool name on its first undecided call
of it, a copy on each nested wait), refs written too. A process of such a version,
deciding a call, drops every ref it reads and hands a decided call's copy on only to
its tool's next call, by name, not nested: the copy of the other waits sharing it went
with it, and their edits could not be checked. Set ``per-tool`` on every process of
this version while one of before runs (docs/deployment.md, "Upgrading")."""

_PER_TOOL = "per-tool"
if SCHEMA_COPIES not in ("message", _PER_TOOL):  # (a typo must not pass for the default)
    raise ValueError(f"AXON_SCHEMA_COPIES is {SCHEMA_COPIES!r}: 'message' or 'per-tool'")


def share_schemas(parts: list[Any]) -> None:
    """Name each stored schema of the waiting calls of ``parts`` (in place, an assistant
    message's content): every wait given one gets its :attr:`~Awaiting.schema_ref`, and
    only the first wait of each keeps the schema itself. A record stored before refs
    existed, whose calls of one tool shared their step's copy by the tool's name, is
    given refs the same way (its calls without a copy name the one they shared), so
    whichever is decided first, the others still find it.

    Under :data:`SCHEMA_COPIES` ``"per-tool"``, a copy is shared only where a version
    before refs looked for it: among the undecided top-level approvals of one tool name
    (the first keeps it), each nested wait keeping its own; a wait whose group has no
    undecided holder takes the copy its ref finds (a decided call's, dropped after:
    :func:`drop_unneeded_schemas`)."""
    per_tool = SCHEMA_COPIES == _PER_TOOL
    refs: dict[int, str] = {}  # (by the schema's identity: one tool's calls share it)
    kept: set[Any] = set()
    before = tuple(parts)  # (what a record stored before refs shared, found by name)
    for i, p in enumerate(before):
        if not _waits(p):
            continue
        w = p.awaiting
        schema = w.schema if w.schema is not None else _legacy_schema(before, p)
        if schema is None and per_tool and w.schema_ref is not None:
            schema = stored_schema(before, p)
        if schema is None:
            continue
        ref = w.schema_ref or refs.get(id(schema))
        if ref is None:
            ref = refs[id(schema)] = schema_ref(schema)
        group: Any = ref
        if per_tool:
            top = not w.nested and w.kind == "approval"
            group = (p.tool_name, ref) if top else i
        keep = schema if group not in kept else None
        kept.add(group)
        if (w.schema, w.schema_ref) != (keep, ref):
            parts[i] = attrs.evolve(p, awaiting=attrs.evolve(w, schema=keep, schema_ref=ref))


def _legacy_schema(parts: Sequence[Any], part: ToolCallPart) -> Any:
    """The schema ``part``'s wait shared by its tool's name (a record stored before
    refs), if it has no ref of its own."""
    w = part.awaiting
    if w is None or w.schema_ref is not None or w.nested or w.kind != "approval":
        return None
    return next((p.awaiting.schema for p in parts if _legacy_carrier(p, part.tool_name)), None)


def drop_unneeded_schemas(parts: list[Any]) -> None:
    """Drop (in place) each stored schema that no undecided wait of ``parts`` names: a
    decided call's check is made, and a decided call that holds a schema keeps it only
    while another waits that names it."""
    needed = {p.awaiting.schema_ref for p in parts if _waits(p)}
    if SCHEMA_COPIES == _PER_TOOL:  # (each wait holds its own, share_schemas saw to it)
        needed = set()
    for i, p in enumerate(parts):
        if not isinstance(p, ToolCallPart) or p.awaiting is None:
            continue
        w = p.awaiting
        if (
            w.schema is not None
            and w.decided
            and (w.schema_ref is None or w.schema_ref not in needed)
        ):
            parts[i] = attrs.evolve(p, awaiting=attrs.evolve(w, schema=None))
