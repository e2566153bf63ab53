"""``A2AAgent``: a remote agent that speaks A2A, usable as a tool like ``agent.as_tool()``.

An Axon agent delegates to another agent wherever it runs and whatever it is built with,
as long as it serves A2A 1.0 (an Axon ``serve --protocols a2a``, or any agent built on an
A2A SDK): ``A2AAgent(url).as_tool()`` is a tool whose every call sends the remote agent
one task (the call's ``input`` as a text message, in a context of its own) and streams
it: the remote answer arrives inside the parent's output as ``tool-stream`` chunks nested
under the call, a well-formed turn of their own (``start``, a step, the text, ``finish``),
as a local sub-agent's do; the task's answer is the tool's result (its text parts, a
data part as its JSON text and a file as a line naming it: :func:`_texts`).

The client speaks the wire itself (:mod:`actors.a2a.wire`, over ``httpx``, which runs
under Trio), so it needs no A2A SDK. It reads the Agent Card at
``<url>/.well-known/agent-card.json`` and uses its JSON-RPC interface (its HTTP+JSON one
when the card has no JSON-RPC). A stream that breaks off before the task is over is
picked up again with ``SubscribeToTask``; a parent turn that is cancelled cancels the
remote task. A remote task that fails, is canceled, or stops to ask for input (which a
tool call cannot give it: the task is canceled) is a tool error the parent model sees.
A remote Axon task whose model call waits (a ``WORKING`` status update with a
``throttled`` or ``budgetWait`` data part) is passed on in the nested stream as the
``throttled`` / ``budget-wait`` chunk it was, as a local sub-agent's wait is.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

import orjson
import trio

from actors.a2a import wire
from actors.providers.failures import EventTooLarge
from actors.providers.sse import SSEDecoder
from runtime.budget import OutputAccount
from runtime.chunks import Usage
from runtime.errors import ToolDefinitionError
from runtime.ids import new_id
from runtime.json_exact import dumps as exact_dumps
from runtime.json_exact import exact, exact_loads
from runtime.output import (
    Abort,
    BudgetWait,
    Error,
    ErrorInfo,
    Finish,
    ResetStep,
    Start,
    StepFinish,
    StepStart,
    TextDelta,
    TextFinish,
    TextStart,
    Throttled,
)
from runtime.redact import (
    header_secrets,
    redact_text,
    redact_url,
    redact_user_info,
    register_secret,
    register_secrets,
    register_url_secrets,
)
from runtime.tools import Tool, ToolContext, tool

CANCEL_WAIT = 5.0
"""Seconds a cancelled call waits (shielded) for the remote agent to take its cancel."""
RESUBSCRIBES = 3
"""Times a broken stream is picked up again (``SubscribeToTask``) before the call fails."""
MAX_ANSWER_CHARS = 1_000_000
"""The longest answer a remote task may stream (its ``max_answer_chars`` by default): past
it the task is canceled and the call fails. A tool result is cut to
``Budget.max_tool_result_chars`` (100,000) anyway; this bounds the memory a remote agent
that streams without end takes before then."""
MAX_DESCRIPTION = 1000
"""The most of a card's description :meth:`A2AAgent.discover` makes the tool's: the model
reads it in every request, and providers refuse longer ones (OpenAI: 1,024)."""
MAX_IN_FLIGHT = 32
"""The most calls one ``as_tool`` of a remote agent runs at once in a process (its
``max_in_flight`` by default): what bounds a loop of agents calling each other through
one that does not pass the hop count on (:data:`~actors.a2a.wire.HOPS`, the caller's
word), one call more each round."""
MAX_PIECE_BYTES = 16 << 20
"""The largest response body or SSE event a remote agent may send (the card, an answer,
one event): a bigger one (or a line that never ends) fails the call, unread past it."""


class RemoteAgentError(RuntimeError):
    """A remote A2A agent refused a request, or its task did not complete. Its message is
    redacted (a remote agent's error text may quote the token it was sent)."""

    def __init__(self, message: str) -> None:
        super().__init__(redact_text(message))


OUTPUT_SPENT = "max_output_tokens"
"""The budget a remote answer cut at its caller's output tokens left names."""


class _OutputSpent(Exception):
    """The remote answer passed the output tokens its call may write (:attr:`_Nested.cap`):
    its text is cut there, and the remote task is canceled."""


class _Nested:
    """The remote task as one turn of output chunks (``start``, a step, its text,
    ``finish``; or cut short by ``error`` / ``abort``), emitted under the tool call as a
    local sub-agent's turn is; ``emit`` ``None`` keeps only the text.

    ``cap``: the output tokens the call may write (what its calling turn has left,
    :attr:`ToolContext.output_left`, at most what the batch's account had; ``None``: no
    output budget). A2A carries no usage, so the answer is counted as a server that
    reports none is (:func:`actors.turn.inference.counted`): its UTF-8 bytes
    (:attr:`bytes`, every byte received, a replaced answer's too), which no byte-level
    token count exceeds; past ``cap`` the text is cut there and :class:`_OutputSpent`
    raised (:attr:`cut`). ``account``: the batch's :class:`~runtime.budget.OutputAccount`,
    which each piece of text draws its bytes from as it arrives (:meth:`_draw`): the text
    is cut where the account has no more. Why drawn, not reserved for the whole call: a
    remote turn runs many steps and may wait (in a tool, for another agent); a
    reservation held all that time stalled the model calls of the sub-agents beside it,
    and deadlocked them when the remote turn waited for one of them. A2A sends the
    remote agent no cap, so nothing needs reserving before the call."""

    def __init__(
        self,
        emit: Any,
        max_chars: int = MAX_ANSWER_CHARS,
        cap: int | None = None,
        account: OutputAccount | None = None,
    ) -> None:
        self.emit = emit
        self.seq = 0
        self.started = False
        self.part_id: str | None = None
        self.text: list[str] = []
        self.max_chars = max_chars
        self.chars = 0
        self.cap = cap
        self.bytes = 0
        """The answer's UTF-8 bytes counted so far, at most :attr:`cap`."""
        self.cut = False
        """Whether the answer passed :attr:`cap` (cut there, its task canceled)."""
        self.account = account

    def usage(self) -> Usage:
        """What the answer counts toward the calling turn: its bytes as output tokens
        when it has a cap; nothing without (no output budget: no count, as before)."""
        if self.cap is None:
            return Usage()
        return Usage(output_tokens=self.bytes, total_tokens=self.bytes)

    async def _out(self, chunk_type: Any, **fields: Any) -> None:
        self.seq += 1
        if self.emit is not None:
            await self.emit(chunk_type(seq=self.seq, **fields))

    async def start(self, message_id: str) -> None:
        if not self.started:
            self.started = True
            await self._out(Start, message_id=message_id or new_id("task"))
            await self._out(StepStart, step=0)

    async def text_delta(self, text: str) -> None:
        if not text:
            return
        self.chars += len(text)
        if self.chars > self.max_chars:
            raise RemoteAgentError(
                f"the remote agent's answer passed {self.max_chars} characters "
                "(A2AAgent's max_answer_chars); its task was canceled"
            )
        cap = self.cap
        if cap is not None:
            raw = text.encode("utf-8", "surrogatepass")
            room = await self._draw(min(len(raw), cap - self.bytes))
            if room < len(raw):  # cut where it may write no more, a character split dropped
                text = raw[:room].decode("utf-8", "ignore")
                self.bytes, self.cut = self.bytes + room, True
                if text:
                    await self._text(text)
                raise _OutputSpent
            self.bytes += len(raw)
        await self._text(text)

    async def _draw(self, want: int) -> int:
        """Take up to ``want`` bytes' tokens from :attr:`account` (all of them without
        one): what the account has, once no call beside this one holds what it needs
        (:meth:`OutputAccount.reserve <runtime.budget.OutputAccount.reserve>` waits
        for a model call's reservation to settle, a call that ends on its own), the wait
        said in the nested stream (a ``budget-wait`` chunk, as a sub-turn's)."""
        account = self.account
        if account is None or want <= 0:
            return max(want, 0)

        async def notice(available: int, held: int, ahead: int) -> None:
            if self.started:
                await self._out(
                    BudgetWait, step=0, want=want, available=available, held=held, ahead=ahead
                )

        take = min(want, await account.reserve(want, notice))
        if take:
            account.settle(take, take)  # written at once: held by nothing
        return take

    async def _text(self, text: str) -> None:
        if self.part_id is None:
            self.part_id = new_id("part")
            await self._out(TextStart, step=0, part_id=self.part_id)
        self.text.append(text)
        await self._out(TextDelta, step=0, part_id=self.part_id, text=text)

    async def replace(self, text: str) -> None:
        """The remote agent replaced its answer artifact (an update without ``append``,
        as Axon's A2A endpoint sends after a ``reset-step``): the text so far is void."""
        await self._close_part()
        error = ErrorInfo(kind="ArtifactReplaced", message="the remote agent replaced its answer")
        await self._out(ResetStep, step=0, provider="remote", error=error)
        self.text = []  # what it received all told still counts toward max_chars
        await self.text_delta(text)

    async def _close_part(self) -> None:
        await self.start("")
        if self.part_id is not None:
            await self._out(TextFinish, step=0, part_id=self.part_id)
            self.part_id = None

    async def finish(self) -> None:
        await self._close_part()
        usage = self.usage()
        await self._out(StepFinish, step=0, finish_reason="stop", usage=usage)
        await self._out(Finish, finish_reason="stop", usage=usage)

    async def spent(self) -> None:
        """The answer was cut at :attr:`cap`: as a sub-turn cut by its budget ends."""
        await self._close_part()
        usage = self.usage()
        await self._out(StepFinish, step=0, finish_reason="length", usage=usage)
        await self._out(Finish, finish_reason="budget", usage=usage, budget=OUTPUT_SPENT)

    async def fail(self, message: str) -> None:
        await self._close_part()
        await self._out(Error, error=ErrorInfo(kind="RemoteAgentError", message=message))

    async def abort(self, reason: str) -> None:
        await self._close_part()
        await self._out(Abort, reason=reason)


class _Tracker:
    """What the events of a remote task said so far: its id, its state and status; the
    answer's text goes to :class:`_Nested` as it comes."""

    def __init__(self, nested: _Nested) -> None:
        self.nested = nested
        self.id = ""
        self.state: str | None = None
        self.status: Any = None
        self.line_last = False
        """Whether the answer so far ends with a non-text part's line (:func:`_joined`)."""

    @property
    def over(self) -> bool:
        return self.state in wire.TERMINAL | wire.INTERRUPTED

    async def consume(self, events: AsyncGenerator[dict[str, Any], None]) -> None:
        """Take ``events`` until the task is over or waits (the stream is closed then)."""
        async with aclosing(events) as stream:
            async for event in stream:
                await self.take(event)
                if self.over:
                    return

    async def take(self, event: Any) -> None:
        nested = self.nested
        if not isinstance(event, dict):
            raise RemoteAgentError(
                f"the remote agent sent a malformed event ({_json_kind(event)}, not a "
                "StreamResponse object)"
            )
        if isinstance(event.get("message"), dict):  # answered with a message, no task
            await nested.start(str(event["message"].get("messageId", "")))
            await nested.text_delta(_texts(event["message"].get("parts")))
            self.state = wire.COMPLETED
            return
        task = event.get("task")
        if isinstance(task, dict):
            task_id = task.get("id")
            if not isinstance(task_id, str):
                raise RemoteAgentError("the remote agent sent a task without a string id")
            self.id = task_id
            await nested.start(self.id)
            sent, (now, line_last) = "".join(nested.text), _artifact_text(task)
            if now.startswith(sent):  # a (re)subscription's snapshot: what is new in it
                await nested.text_delta(now[len(sent) :])
                self.line_last = line_last
            self.status = task.get("status")
        update = event.get("artifactUpdate")
        if isinstance(update, dict):
            await nested.start(self.id)
            artifact = update.get("artifact")
            append = bool(update.get("append"))
            parts = artifact.get("parts") if isinstance(artifact, dict) else None
            after = append and bool(nested.text)
            text, self.line_last = _joined(parts, after, line=after and self.line_last)
            if nested.text and not append:
                await nested.replace(text)  # the artifact is sent whole again
            else:
                await nested.text_delta(text)
        change = event.get("statusUpdate")
        if isinstance(change, dict):
            self.status = change.get("status")
        if isinstance(self.status, dict):
            self.state = wire.enum_name(self.status.get("state"), "state")
            if isinstance(change, dict) and self.state == wire.WORKING and nested.started:
                await _pass_notice(nested, self.status.get("message"))


_NOTICE_REASON_MAX = 64
"""The longest rate limit ``reason`` passed on from a remote notice (Axon's are words)."""


async def _pass_notice(nested: _Nested, message: Any) -> None:
    """A remote task's status message that says its model call waits (Axon's A2A
    endpoint: ``runtime.app.web.a2a_tasks.notice_message``), passed on in the nested
    stream as the chunk it was. Anything else in a status message (another agent's
    progress, a malformed notice) is no notice: nothing is passed on, nothing fails."""
    parts = message.get("parts") if isinstance(message, dict) else None
    if not isinstance(parts, list):
        return
    for data in wire.data_parts(p for p in parts if isinstance(p, dict)):
        if not isinstance(data, dict):
            continue
        throttled, waits = data.get("throttled"), data.get("budgetWait")
        if isinstance(throttled, dict):
            wait, reason = _number(throttled.get("wait")), throttled.get("reason")
            if wait is not None and isinstance(reason, str) and len(reason) <= _NOTICE_REASON_MAX:
                await nested._out(Throttled, step=0, wait=wait, reason=reason)
                return
        elif isinstance(waits, dict):
            counts = {k: _number(waits.get(k)) for k in ("want", "available", "held", "ahead")}
            if all(v is not None and v == int(v) for v in counts.values()):
                await nested._out(BudgetWait, step=0, **{k: int(v or 0) for k, v in counts.items()})
                return


def _number(value: Any) -> float | None:
    """A notice's count or seconds: a number from 0 to 2**53 (a protobuf ``Struct``
    carries every number as a double), else ``None``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 2**53:
        return value  # (NaN compares false: refused)
    return None


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a boolean" if isinstance(value, bool) else "a number"


def _texts(parts: Any, after: bool = False) -> str:
    """What the model reads of an answer's parts: ``text`` parts as they are, one after
    another (a stream's pieces join up); a ``data`` part as its JSON text (integers past
    64 bits exact, as the remote agent wrote them), and a file (``url`` or ``raw``) as a
    line naming it (its name, media type, and URL or size: its bytes are not the
    model's, nor is a URL's user info: :func:`redact_user_info`), each on a line of its
    own (``after``: text came before these parts, in an earlier event). Why: a remote
    agent that answered with data or a file alone gave the model an empty result, as
    if it had said nothing."""
    return _joined(parts, after)[0]


def _joined(parts: Any, after: bool = False, *, line: bool = False) -> tuple[str, bool]:
    """:func:`_texts`, and whether what it read ends with a non-text part's line
    (``line``, as it was, when the parts add nothing). ``line``: what came before these
    parts (in an earlier event, an earlier artifact) ended with one, so their first
    text starts a new line. Why: a text part that came after a data part in a later
    event was joined to its JSON (``{"n":1}done``), and the model could not tell where
    the remote agent's data ended and its words began."""
    if not isinstance(parts, list):
        return "", line
    out: list[str] = []
    alone = line  # whether the last piece was a non-text part's line
    for part in parts:
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        if isinstance(text, str):
            if text:  # (an empty one ends no line)
                out.append("\n" + text if alone else text)
                alone = False
            continue
        piece = _part_line(part)
        if piece is not None:
            out.append(("\n" if out or after else "") + piece)
            alone = True
    return "".join(out), alone


def _part_line(part: Mapping[str, Any]) -> str | None:
    """A non-text part as one line of text (see :func:`_texts`), ``None`` for a part of
    no kind A2A names (skipped, as junk is)."""
    if "data" in part:
        try:
            return exact_dumps(part["data"], marked=False).decode()
        except TypeError:  # (nested past orjson's levels: a hostile agent's)
            return "[data the remote agent sent that is not JSON text]"
    name, media = part.get("filename"), part.get("mediaType")
    label = "[file" + (f" {name}" if isinstance(name, str) and name else "")
    label += f" ({media})" if isinstance(media, str) and media else ""
    url, raw = part.get("url"), part.get("raw")
    if isinstance(url, str):  # who the remote agent logs in as, and how: not the model's
        return f"{label}: {redact_user_info(url)}]"
    if isinstance(raw, str):  # base64: its decoded size, not its bytes
        return f"{label}, {len(raw) * 3 // 4 - raw[-2:].count('=')} bytes, not shown]"
    return None


def _artifact_text(task: Mapping[str, Any]) -> tuple[str, bool]:
    """A task's artifacts' text (:func:`_joined`, one after another), and whether it
    ends with a non-text part's line."""
    artifacts = wire.field(task, "artifacts") or []
    text, line = "", False
    for artifact in artifacts:
        if isinstance(artifact, dict):
            more, line = _joined(artifact.get("parts"), bool(text), line=line)
            text += more
    return text, line


def _status_text(status: Any) -> str:
    if not isinstance(status, dict):
        return ""
    message = status.get("message")
    return _texts(message.get("parts")) if isinstance(message, dict) else ""


def _too_big(what: str) -> RemoteAgentError:
    return RemoteAgentError(f"the remote agent sent {what} over {MAX_PIECE_BYTES} bytes")


async def _read(response: Any) -> bytes:
    """A response's whole body, at most :data:`MAX_PIECE_BYTES` of it."""
    pieces: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_PIECE_BYTES:
            raise _too_big("an answer")
        pieces.append(chunk)
    return b"".join(pieces)


async def _sse(response: Any) -> AsyncGenerator[Any, None]:
    """The JSON values of an SSE response's events (comments and events with no data
    skipped; a last event with no blank line after it read too), read by the providers'
    decoder (:class:`~actors.providers.sse.SSEDecoder`) with :data:`MAX_PIECE_BYTES` as
    its limit: a line that never ends or an event that never does is not buffered
    without end."""
    decoder = SSEDecoder(limit=MAX_PIECE_BYTES)
    chunks = response.aiter_bytes()
    while True:
        chunk = await anext(chunks, None)
        try:
            events = decoder.feed(chunk) if chunk is not None else decoder.finish(flush=True)
        except EventTooLarge:
            raise _too_big("an event") from None
        for _, data in events:
            if not data:
                continue
            if len(data) > MAX_PIECE_BYTES:  # (one read may hold a whole event)
                raise _too_big("an event")
            try:
                value = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise RemoteAgentError("the remote agent sent an event that is not JSON") from None
            yield exact(value, data) if b'"data"' in data else value
        if chunk is None:
            return


def _tool_name(name: str) -> str:
    """A card's name as a tool name a model takes (1-64 letters, digits, ``_``, ``-``):
    cards name agents for people (``"Currency Agent"``), which no provider takes."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")[:64] or "remote_agent"


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` of an http(s) URL (the default port filled in); ``None``
    for any other URL."""
    try:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:  # a port that is no number
        return None
    if scheme not in ("http", "https") or not host:
        return None
    return scheme, host, port if port is not None else (443 if scheme == "https" else 80)


class A2AAgent:
    """A remote agent at ``url`` (its base URL: the Agent Card is at
    ``<url>/.well-known/agent-card.json``; the card's own URL works too).

    ``token`` is sent as ``Authorization: Bearer <token>`` (an Axon server's ``--token``),
    ``headers`` on every request; ``timeout`` bounds the wait for each piece of a
    response (seconds; a task may stream for longer). ``name`` and ``description`` are
    the tool's (:meth:`as_tool`); without them the tool is named ``remote_agent``, or
    use :meth:`discover`, which takes both from the Agent Card."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        description: str | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 300.0,
        max_answer_chars: int = MAX_ANSWER_CHARS,
    ) -> None:
        self.url = url.removesuffix(wire.CARD_PATH).rstrip("/")
        # the credentials this agent is given are redacted wherever they turn up (a
        # remote agent's error text that quotes them, which the parent model reads)
        register_secret(token)
        register_url_secrets(self.url)
        # (X-Auth-Token too: not a JSON field's name; "Bearer <token>"'s token)
        register_secrets([s for k, v in (headers or {}).items() for s in header_secrets(k, v)])
        self.max_answer_chars = max_answer_chars
        self.name = name
        self.description = description
        self.headers = {wire.VERSION_HEADER: wire.PROTOCOL_VERSION, **(headers or {})}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout
        self._card: dict[str, Any] | None = None

    @classmethod
    async def discover(cls, url: str, **options: Any) -> A2AAgent:
        """An :class:`A2AAgent` named and described by its Agent Card (fetched now)."""
        agent = cls(url, **options)
        card = await agent.card()
        if agent.name is None and isinstance(card.get("name"), str):
            agent.name = _tool_name(card["name"])
        if agent.description is None and isinstance(card.get("description"), str):
            text = card["description"]
            cut = len(text) > MAX_DESCRIPTION
            agent.description = text[: MAX_DESCRIPTION - 1] + "…" if cut else text
        return agent

    def _client(self) -> Any:
        import httpx  # a dependency of its own (pyproject): the SDKs now use httpx2

        return httpx.AsyncClient(headers=self.headers, timeout=httpx.Timeout(self.timeout))

    async def card(self) -> dict[str, Any]:
        """The remote agent's Agent Card (fetched once)."""
        if self._card is None:
            where = redact_url(self.url + wire.CARD_PATH)
            async with self._client() as client:
                response = await client.send(
                    client.build_request("GET", self.url + wire.CARD_PATH), stream=True
                )
                try:
                    if response.status_code != 200:
                        raise RemoteAgentError(
                            f"no Agent Card at {where} (HTTP {response.status_code})"
                        )
                    content = await _read(response)
                finally:
                    await response.aclose()
            try:
                card = orjson.loads(content)
            except orjson.JSONDecodeError:
                raise RemoteAgentError(f"the Agent Card at {where} is not JSON") from None
            if not isinstance(card, dict):
                raise RemoteAgentError("the Agent Card is not a JSON object")
            self._card = card
        return self._card

    async def _endpoint(self) -> tuple[str, str]:
        card = await self.card()
        for binding in (wire.JSONRPC, wire.HTTP_JSON):
            url = wire.card_interface(card, binding)
            if url is not None:
                if _origin(url) != _origin(self.url):
                    # the token and headers go only where the agent was pointed: a card
                    # (a proxy's echo of a Host, a hostile or stale one) may name any URL
                    raise RemoteAgentError(
                        f"the Agent Card at {redact_url(self.url)} puts its {binding} "
                        f"interface at {redact_url(url)}, another origin: refused (the "
                        "token and headers go only to the agent's own URL; give A2AAgent "
                        "that origin's URL if it is the agent's)"
                    )
                return binding, url
        raise RemoteAgentError("the Agent Card offers no A2A 1.0 JSON-RPC or HTTP+JSON interface")

    async def _call(
        self, client: Any, binding: str, url: str, method: str, params: dict[str, Any]
    ) -> Any:
        """One JSON-RPC call (or its HTTP+JSON form) answered whole."""
        if binding == wire.JSONRPC:
            body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}
            request = client.build_request("POST", url, json=body)
        elif method == "CancelTask":
            request = client.build_request("POST", f"{url}/tasks/{params['id']}:cancel", json={})
        elif method == "GetTask":
            request = client.build_request("GET", f"{url}/tasks/{params['id']}")
        else:
            request = client.build_request("POST", url + "/message:send", json=params)
        response = await client.send(request, stream=True)
        try:
            return self._result(await _read(response), response.status_code, binding)
        finally:
            await response.aclose()

    @staticmethod
    def _result(content: bytes, status: int, binding: str) -> Any:
        try:
            body = exact_loads(content)
        except orjson.JSONDecodeError:
            raise RemoteAgentError(
                f"the remote agent answered HTTP {status} with no JSON"
            ) from None
        return A2AAgent._unwrapped(body, binding)

    @staticmethod
    def _unwrapped(body: Any, binding: str) -> Any:
        """A JSON-RPC answer's ``result`` (an HTTP+JSON answer as it is), or its error
        raised."""
        error = wire.error_from(body)
        if error is not None:
            raise RemoteAgentError(f"the remote agent refused: {error.message} ({error.kind})")
        if binding == wire.JSONRPC:
            if not isinstance(body, dict) or "result" not in body:
                raise RemoteAgentError("the remote agent's answer is not a JSON-RPC result")
            return body["result"]
        return body

    async def _stream(
        self, client: Any, binding: str, url: str, method: str, params: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The ``StreamResponse`` s of a streaming call."""
        headers = {"accept": "text/event-stream"}
        if binding == wire.JSONRPC:
            body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}
            request = client.build_request("POST", url, json=body, headers=headers)
        elif method == "SubscribeToTask":
            request = client.build_request(
                "GET", f"{url}/tasks/{params['id']}:subscribe", headers=headers
            )
        else:
            request = client.build_request(
                "POST", url + "/message:stream", json=params, headers=headers
            )
        response = await client.send(request, stream=True)
        try:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                yield self._result(await _read(response), response.status_code, binding)
                return
            async with aclosing(_sse(response)) as events:
                async for event in events:
                    yield self._unwrapped(event, binding) if binding == wire.JSONRPC else event
        finally:
            await response.aclose()

    async def run(
        self,
        text: str,
        *,
        emit: Any = None,
        depth: int = 0,
        max_output_tokens: int | None = None,
    ) -> str:
        """Send the remote agent ``text`` as a new task and return its answer, streaming
        it as output chunks through ``emit`` (``await emit(chunk)``) when given. Raises
        :class:`RemoteAgentError` when the task does not complete.

        ``depth`` is how many agents deep the caller runs (:attr:`ToolContext.depth`);
        the message says ``depth + 1`` (:data:`~actors.a2a.wire.HOPS`), which an Axon
        endpoint runs the task's turn at. ``max_output_tokens``: the answer is cut at
        that many UTF-8 bytes (A2A reports no tokens; no token is less than a byte) and
        its task canceled there."""
        nested = _Nested(emit, self.max_answer_chars, max_output_tokens)
        await self._answer(text, nested, depth)
        return "".join(nested.text)

    async def _answer(self, text: str, nested: _Nested, depth: int) -> None:
        """:meth:`run`, the answer into ``nested`` (its text; its bytes and whether it
        was cut at its cap, which the tool counts)."""
        import httpx

        binding, url = await self._endpoint()
        capabilities = wire.field(self._card or {}, "capabilities") or {}
        message = wire.message(
            wire.ROLE_USER,
            [wire.text_part(text)],
            message_id=str(uuid.uuid4()),
            metadata={wire.HOPS: depth + 1},
        )
        params = {"message": message}
        task = _Tracker(nested)
        async with self._client() as client:
            try:
                if capabilities.get("streaming"):
                    source = self._stream(client, binding, url, "SendStreamingMessage", params)
                else:
                    source = _one(await self._call(client, binding, url, "SendMessage", params))
                attempts = 0
                while True:
                    try:
                        await task.consume(source)
                    except httpx.TransportError:
                        if not task.id or attempts >= RESUBSCRIBES:
                            raise
                    if task.over or not task.id or attempts >= RESUBSCRIBES:
                        break
                    attempts += 1  # the stream broke off: pick the task up again
                    source = self._stream(client, binding, url, "SubscribeToTask", {"id": task.id})
            except trio.Cancelled:
                if task.id and task.state not in wire.TERMINAL:
                    await self._cancel_quietly(client, binding, url, task.id)
                raise
            except _OutputSpent:  # its caller's output tokens: no more of it is read
                if task.id and not task.over:
                    await self._cancel_quietly(client, binding, url, task.id)
                await nested.spent()
                return
            except Exception as exc:
                why = (
                    str(exc)
                    if isinstance(exc, RemoteAgentError)
                    else f"the remote agent could not be reached: {type(exc).__name__}: {exc}"
                )
                if task.id and not task.over:  # the call gave up on a task still going
                    await self._cancel_quietly(client, binding, url, task.id)
                await task.nested.fail(why)
                raise RemoteAgentError(why) from None
            if task.state == wire.COMPLETED:
                await task.nested.finish()
                return
            detail = _status_text(task.status)
            if task.state in wire.INTERRUPTED:
                await self._cancel_quietly(client, binding, url, task.id)
                why = (
                    f"the remote agent asked for input, which a tool call cannot give "
                    f"({detail}); its task was canceled"
                )
            elif task.state == wire.CANCELED:
                why = f"the remote agent's task was canceled{': ' + detail if detail else ''}"
            elif task.state in wire.TERMINAL:
                why = f"the remote agent's task failed{': ' + detail if detail else ''}"
            else:
                why = "the remote agent's stream ended before its task did"
            await (task.nested.abort(why) if task.state == wire.CANCELED else task.nested.fail(why))
            raise RemoteAgentError(why)

    async def _cancel_quietly(self, client: Any, binding: str, url: str, task_id: str) -> None:
        """Cancel the remote task, shielded and bounded: the call that ran it is over
        either way, so a cancel that fails only leaves the remote task to its agent."""
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_WAIT):
            try:
                await self._call(client, binding, url, "CancelTask", {"id": task_id})
            except Exception:  # best effort, as said
                pass

    def as_tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        needs_approval: Any = False,
        max_depth: int = 8,
        max_in_flight: int | None = MAX_IN_FLIGHT,
    ) -> Tool:
        """This remote agent as a tool another agent can call with a task (``input``):
        each call is one A2A task, streamed under the call as ``tool-stream`` chunks, its
        answer the tool's result (see the module docstring).

        ``max_depth`` bounds agents calling agents across processes, as
        :meth:`~runtime.agent.Agent.as_tool`'s does in one: a call from a session that
        runs ``max_depth`` agents deep already (:attr:`ToolContext.depth`: an A2A task's
        turn runs as deep as its message's hop count says, :data:`~actors.a2a.wire.HOPS`)
        sends nothing; the model sees the tool error ``agent nesting deeper than
        <max_depth>``. Without it, A calling B calling A over A2A ran until a server's
        running tasks were all taken, every hop holding a turn and a connection.

        The hop count is the caller's word: an agent that does not pass it on (another
        A2A SDK's, or a hostile one that sends ``0``) starts every call it makes anew.
        ``max_in_flight`` bounds such a loop in this process: the tool's calls running at
        once (from every session of the process); one more sends nothing, and the model
        sees the tool error ``<name> has <n> calls in flight, its max_in_flight``. A loop
        through this remote agent holds one call more each round, so it stops there. An
        application that delegates more tasks than that at once raises it (``None``: no
        bound)."""
        if type(max_depth) is not int or max_depth < 1:
            raise ToolDefinitionError(f"as_tool: max_depth must be an int >= 1, not {max_depth!r}")
        if max_in_flight is not None and (type(max_in_flight) is not int or max_in_flight < 1):
            raise ToolDefinitionError(
                f"as_tool: max_in_flight must be an int >= 1 or None, not {max_in_flight!r}"
            )
        remote = self
        tool_name = name or self.name or "remote_agent"
        in_flight = [0]  # this tool's calls running now, every session's

        async def run_remote(input: str, context: ToolContext) -> str:
            if context.depth + 1 > max_depth:
                raise RuntimeError(
                    f"agent nesting deeper than {max_depth}: {tool_name} was not called "
                    f"(agents calling agents, over A2A too, {max_depth} deep already)"
                )
            if max_in_flight is not None and in_flight[0] >= max_in_flight:
                raise RuntimeError(
                    f"{tool_name} has {in_flight[0]} calls in flight, its max_in_flight: it "
                    "was not called (agents calling agents in a loop that drops the hop "
                    "count hold one call more each round)"
                )
            in_flight[0] += 1
            try:
                return await _remote_call(remote, input, context)
            finally:
                in_flight[0] -= 1

        run_remote.__annotations__ = {"input": str, "context": ToolContext, "return": str}
        run_remote.__doc__ = description or (
            (self.description or f"Delegate a task to the remote agent at {redact_url(self.url)}.")
            + "\n\nArgs:\n    input: The task or question for the agent, in plain words."
        )
        return tool(
            run_remote, name=tool_name, description=description, needs_approval=needs_approval
        )


SPENT_NOTE = "[the remote agent stopped before it finished: max_output_tokens reached]"
"""Ends the result of a remote call cut at its caller's output tokens left."""
NOT_CALLED = "[the remote agent was not called: max_output_tokens reached]"
"""The result of a remote call left no output tokens by the calls beside it."""


async def _remote_call(remote: A2AAgent, input: str, context: ToolContext) -> str:
    """One call of ``remote`` as a tool, under its calling turn's output budget: the
    answer is counted (:class:`_Nested`: its UTF-8 bytes) toward the calling turn's
    usage, at most what that turn has left (:attr:`ToolContext.output_left`), drawn
    from the batch's account as it arrives (:attr:`ToolContext.output_account`, shared
    with the calls beside it; nothing is held while the remote turn runs or waits: a
    call that held all that was left deadlocked a sub-agent beside it that the remote
    turn waited for); an answer past it is cut there, its task
    canceled, and the result says so, as a sub-agent's cut by its budget does (the
    calling turn, nothing left, then ends ``budget``). Why: A2A carries no usage, so a
    remote agent's answer was neither bounded nor counted. No output budget: neither,
    as before."""
    cap, account = context.output_left, context.output_account
    if cap is not None and account is not None and not await account.reserve(0):
        return NOT_CALLED  # the calls beside it spent what was left (nothing reserved)
    if cap == 0:
        return NOT_CALLED
    nested = _Nested(context.emit, remote.max_answer_chars, cap, account)
    try:
        await remote._answer(input, nested, context.depth)
    finally:
        if cap is not None:
            context.add_usage(nested.usage(), drawn=True)  # (drawn as its bytes came)
    text = "".join(nested.text)
    if not nested.cut:
        return text
    return f"{text}\n{SPENT_NOTE}" if text else SPENT_NOTE


async def _one(result: Any) -> AsyncGenerator[dict[str, Any], None]:
    """A ``SendMessageResponse`` as the one event of a stream."""
    if isinstance(result, dict):
        yield result


__all__ = ["A2AAgent", "RemoteAgentError"]
