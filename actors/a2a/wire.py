"""The A2A (Agent2Agent) protocol's wire shapes, version 1.0: what both ends build and check.

A2A 1.0 defines its objects in protobuf and puts them on HTTP as protobuf's JSON form:
camelCase field names, enum values as their names (``TASK_STATE_COMPLETED``,
``ROLE_USER``), a ``Part`` holding one of ``text``, ``raw`` (base64), ``url`` or ``data``.
Two HTTP bindings carry them: JSON-RPC 2.0 (one endpoint; methods ``SendMessage``,
``SendStreamingMessage``, ``GetTask``, ``CancelTask``, ``SubscribeToTask``) and HTTP+JSON
(``POST /message:send``, ``POST /message:stream``, ``GET /tasks/{id}``,
``POST /tasks/{id}:cancel``, ``GET|POST /tasks/{id}:subscribe``); streams are SSE whose
events each carry one ``StreamResponse`` (``task``, ``message``, ``statusUpdate`` or
``artifactUpdate``), inside a JSON-RPC response envelope on the JSON-RPC binding.

The server (:mod:`runtime.app.web.a2a`) and the client (:class:`actors.a2a.A2AAgent`)
share this module, so the two ends cannot drift apart; the official ``a2a-sdk`` package
checks both in the tests. Nothing here does I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from runtime.messages import File, Image, TextPart, UserContent
from runtime.serde import dumps, utf8_dumps

PROTOCOL_VERSION = "1.0"
VERSION_HEADER = "A2A-Version"
CARD_PATH = "/.well-known/agent-card.json"
JSONRPC = "JSONRPC"
HTTP_JSON = "HTTP+JSON"
MEDIA_TYPES = frozenset({"application/json", "application/a2a+json"})
"""Body media types the bindings take (the SDK sends ``application/json``)."""

# -- task states and roles ---------------------------------------------------------------

SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
COMPLETED = "TASK_STATE_COMPLETED"
FAILED = "TASK_STATE_FAILED"
CANCELED = "TASK_STATE_CANCELED"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
REJECTED = "TASK_STATE_REJECTED"
AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"
STATES = (SUBMITTED, WORKING, COMPLETED, FAILED, CANCELED, INPUT_REQUIRED, REJECTED, AUTH_REQUIRED)
TERMINAL = frozenset({COMPLETED, FAILED, CANCELED, REJECTED})
"""States a task never leaves."""
INTERRUPTED = frozenset({INPUT_REQUIRED, AUTH_REQUIRED})
"""States where a task waits for its client: a stream ends there as at a terminal state."""

ROLE_USER = "ROLE_USER"
ROLE_AGENT = "ROLE_AGENT"
_ENUM_NUMBERS = {
    "role": {1: ROLE_USER, 2: ROLE_AGENT},
    "state": {i: s for i, s in enumerate(STATES, start=1)},
}

ANSWER_ARTIFACT = "answer"
"""The id of the artifact that carries the agent's answer text."""

# -- errors ------------------------------------------------------------------------------

_ERRORS: dict[str, tuple[int, int, str, str]] = {
    # name: (JSON-RPC code, HTTP status, gRPC status, reason)
    "TaskNotFound": (-32001, 404, "NOT_FOUND", "TASK_NOT_FOUND"),
    "TaskNotCancelable": (-32002, 400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE"),
    "PushNotificationNotSupported": (
        -32003,
        400,
        "FAILED_PRECONDITION",
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
    ),
    "UnsupportedOperation": (-32004, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION"),
    "ContentTypeNotSupported": (-32005, 400, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED"),
    "VersionNotSupported": (-32009, 400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED"),
    "InvalidParams": (-32602, 400, "INVALID_ARGUMENT", "INVALID_PARAMS"),
    "InvalidRequest": (-32600, 400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    "MethodNotFound": (-32601, 404, "NOT_FOUND", "METHOD_NOT_FOUND"),
    "ParseError": (-32700, 400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    "Internal": (-32603, 500, "INTERNAL", "INTERNAL_ERROR"),
}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
DOMAIN = "a2a-protocol.org"


class A2AError(Exception):
    """An error the protocol names (``kind``: ``TaskNotFound``, ``InvalidParams``, ...),
    answered in its binding's shape: a JSON-RPC error object (:meth:`jsonrpc`) or a
    ``google.rpc.Status`` body with the kind's HTTP status (:meth:`rest`). Both carry a
    ``google.rpc.ErrorInfo`` with the A2A ``reason``, which is how the SDK's clients
    raise the matching exception class."""

    def __init__(self, kind: str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        code, http, grpc, reason = _ERRORS[kind]
        self.kind = kind
        self.message = message
        self.code = code
        self.status = status or http
        """The HTTP status of the HTTP+JSON binding (a JSON-RPC error is a 200)."""
        self.grpc = grpc
        self.reason = reason

    def details(self) -> list[dict[str, Any]]:
        return [{"@type": ERROR_INFO, "reason": self.reason, "domain": DOMAIN, "metadata": {}}]

    def jsonrpc(self, request_id: Any) -> dict[str, Any]:
        """The JSON-RPC error response for ``request_id``."""
        error = {"code": self.code, "message": self.message, "data": self.details()}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}

    def rest(self) -> dict[str, Any]:
        """The HTTP+JSON error body (``google.rpc.Status``)."""
        error = {
            "code": self.status,
            "status": self.grpc,
            "message": self.message,
            "details": self.details(),
        }
        return {"error": error}


DATA_DEPTH = 254
"""The deepest value a message may hold (a part's ``data``, its ``metadata``): what
orjson writes; it reads 1,024 levels. Deeper, a part parsed and then its JSON text (the
user's input, a resend's or an answer's fingerprint, the task's history) raised out of
the handler: a 500 and a traceback in the log."""


def _writable(value: Any, what: str) -> bytes:
    """``value``'s JSON; ``InvalidParams`` when it is nested past :data:`DATA_DEPTH`."""
    try:
        return dumps(value, marked=False)  # (an integer past 64 bits exactly)
    except (orjson.JSONEncodeError, ValueError):
        raise invalid_params(f"{what} is nested deeper than {DATA_DEPTH} levels") from None


def invalid_params(message: str) -> A2AError:
    return A2AError("InvalidParams", message)


def task_not_found(task_id: str) -> A2AError:
    return A2AError("TaskNotFound", f"task {task_id!r} not found")


def jsonrpc_result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_from(body: Any) -> A2AError | None:
    """The error a JSON-RPC error response or an HTTP+JSON error body carries (``None``:
    the body is not one). The kind comes from the ``ErrorInfo`` reason, else the
    JSON-RPC code."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or "error")
    details = error.get("details", error.get("data"))
    reasons = {r: k for k, (_, _, _, r) in _ERRORS.items() if k != "ParseError"}
    codes = {c: k for k, (c, _, _, _) in _ERRORS.items()}
    if isinstance(details, list):
        for d in details:
            if isinstance(d, dict) and d.get("@type") == ERROR_INFO and d.get("reason") in reasons:
                return A2AError(reasons[d["reason"]], message)
    code = error.get("code")
    kind = codes.get(code) if isinstance(code, int) else None
    return A2AError(kind or "Internal", message)


# -- reading what a client sends ---------------------------------------------------------


def field(obj: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """``obj[name]`` by its JSON name (camelCase) or its proto name (snake_case): protobuf's
    JSON parsers accept both, so a client may send either."""
    if name in obj:
        return obj[name]
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
    return obj.get(snake, default)


def enum_name(value: Any, kind: str) -> Any:
    """An enum value as its name (protobuf JSON may carry it as its number)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _ENUM_NUMBERS[kind].get(value, value)
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid_params(f"{what} must be an object")
    return value


def _string(value: Any, what: str, *, required: bool = False) -> str | None:
    if value is None or value == "":
        if required:
            raise invalid_params(f"{what} is required")
        return None
    if not isinstance(value, str):
        raise invalid_params(f"{what} must be a string")
    return value


def _history_length(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit():  # a query string
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid_params("historyLength must be a non-negative integer")
    return value


class Incoming:
    """A message a client sent (``SendMessageRequest.message``), checked."""

    __slots__ = ("context_id", "message_id", "metadata", "parts", "raw", "task_id")

    def __init__(self, raw: Mapping[str, Any]) -> None:
        role = enum_name(field(raw, "role"), "role")
        if role != ROLE_USER:
            raise invalid_params(f"message.role must be {ROLE_USER}, not {role!r}")
        self.message_id: str = _string(field(raw, "messageId"), "message.messageId", required=True)  # type: ignore[assignment]
        self.context_id = _string(field(raw, "contextId"), "message.contextId")
        self.task_id = _string(field(raw, "taskId"), "message.taskId")
        parts = field(raw, "parts")
        if not isinstance(parts, list) or not parts:
            raise invalid_params("message.parts must be a non-empty list")
        self.parts = [_object(p, f"message.parts[{i}]") for i, p in enumerate(parts)]
        for i, part in enumerate(self.parts):
            _writable(part, f"message.parts[{i}]")
        self.metadata = field(raw, "metadata")
        _writable(self.metadata, "message.metadata")
        self.raw = dict(raw)


class SendRequest:
    """``SendMessageRequest``: the message, and what the client asked of the answer."""

    __slots__ = ("history_length", "message", "return_immediately")

    def __init__(self, params: Any) -> None:
        params = _object(params, "params")
        self.message = Incoming(_object(field(params, "message"), "message"))
        config = field(params, "configuration") or {}
        config = _object(config, "configuration")
        self.history_length = _history_length(field(config, "historyLength"))
        self.return_immediately = field(config, "returnImmediately") is True
        if field(config, "taskPushNotificationConfig"):
            raise A2AError(
                "PushNotificationNotSupported", "this agent does not send push notifications"
            )


def task_request(params: Any) -> tuple[str, int | None]:
    """``GetTaskRequest`` / ``CancelTaskRequest`` / ``SubscribeToTaskRequest``: the task
    id, and the history length asked for (``GetTask`` only)."""
    params = _object(params, "params")
    task_id = _string(field(params, "id"), "id", required=True)
    assert task_id is not None
    return task_id, _history_length(field(params, "historyLength"))


def _bytes(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise invalid_params(f"{what} must be base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        try:  # protobuf JSON also takes URL-safe base64
            return base64.urlsafe_b64decode(value)
        except (binascii.Error, ValueError):
            raise invalid_params(f"{what} is not base64") from None


def user_input(parts: Sequence[Mapping[str, Any]]) -> list[str | Image | File]:
    """The runtime's user input for a message's parts: ``text`` as text, ``raw`` and
    ``url`` as an :class:`Image` (an ``image/*`` media type) or a :class:`File`, ``data``
    as its JSON text. Raises :class:`A2AError` (``InvalidParams``) for a part of none of
    these kinds; a bad image or file raises :class:`~runtime.errors.InvalidMedia`."""
    out: list[str | Image | File] = []
    for i, part in enumerate(parts):
        where = f"message.parts[{i}]"
        media_type = _string(field(part, "mediaType"), f"{where}.mediaType")
        filename = _string(field(part, "filename"), f"{where}.filename")
        if "text" in part:
            text = _string(part["text"], f"{where}.text")
            out.append(text or "")
        elif "raw" in part or "url" in part:
            data = _bytes(part["raw"], f"{where}.raw") if "raw" in part else None
            url = None if "raw" in part else _string(part["url"], f"{where}.url", required=True)
            if media_type is not None and media_type.startswith("image/"):
                out.append(Image(data=data, url=url, media_type=media_type))
            else:
                out.append(File(data=data, url=url, media_type=media_type, filename=filename))
        elif "data" in part:
            out.append(_writable(part["data"], f"{where}.data").decode())
        else:
            raise invalid_params(f"{where} has none of text, raw, url, data")
    return out


def data_parts(parts: Iterable[Mapping[str, Any]]) -> list[Any]:
    """The values of a message's ``data`` parts."""
    return [p["data"] for p in parts if "data" in p]


_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def stored_message_id(message_id: str) -> str:
    """The id a client's message is stored under: its own when it is in the runtime's id
    alphabet, else a digest of it (so a re-sent message is recognised either way)."""
    if _ID.fullmatch(message_id):
        return message_id
    return "a2a-" + hashlib.sha256(message_id.encode()).hexdigest()[:40]


# -- building what a server sends --------------------------------------------------------


def now() -> str:
    """The current time as protobuf JSON writes a ``Timestamp`` (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def text_part(text: str) -> dict[str, Any]:
    return {"text": text}


def parts_of(content: UserContent) -> list[dict[str, Any]]:
    """A2A parts for stored user content (text, images, files)."""
    if isinstance(content, str):
        return [text_part(content)]
    out: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextPart):
            out.append(text_part(part.text))
            continue
        media: dict[str, Any] = {"mediaType": part.media_type}
        if isinstance(part, File) and part.filename:
            media["filename"] = part.filename
        if part.data is not None:
            media["raw"] = base64.b64encode(part.data).decode("ascii")
        else:
            media["url"] = part.url
        out.append(media)
    return out


HOPS = "axonHops"
"""The key of a message's ``metadata`` that says how many agents deep its sender's
request already runs: 1 for a message an agent (``A2AAgent``) sends on its user's
behalf, 2 for one the remote agent sends on in turn, and so on. Agents calling agents
over A2A (A calling B calling A) ran without end, each hop in another process; the
receiving endpoint runs the task's turn that deep (its own agents-as-tools and
``A2AAgent`` s count on from it), and each ``A2AAgent`` refuses a call past its
``max_depth``."""


def hops(metadata: Any) -> int:
    """The hop count a message's ``metadata`` carries (:data:`HOPS`): 0 when it has none,
    or something that is no count (a client's metadata of its own)."""
    value = metadata.get(HOPS) if isinstance(metadata, Mapping) else None
    return value if type(value) is int and value > 0 else 0


def message(
    role: str,
    parts: list[dict[str, Any]],
    *,
    message_id: str,
    context_id: str | None = None,
    task_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"messageId": message_id, "role": role, "parts": parts}
    if context_id:
        out["contextId"] = context_id
    if task_id:
        out["taskId"] = task_id
    if metadata:
        out["metadata"] = metadata
    return out


def status(
    state: str, message: dict[str, Any] | None = None, timestamp: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"state": state, "timestamp": timestamp or now()}
    if message is not None:
        out["message"] = message
    return out


def answer_artifact(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"artifactId": ANSWER_ARTIFACT, "name": ANSWER_ARTIFACT, "parts": parts}


def task(
    task_id: str,
    context_id: str,
    task_status: dict[str, Any],
    *,
    text: str = "",
    history: Sequence[dict[str, Any]] = (),
    history_length: int | None = None,
) -> dict[str, Any]:
    """A ``Task``: its answer so far as the one artifact, its messages as ``history``
    (the last ``history_length`` of them, when given)."""
    out: dict[str, Any] = {"id": task_id, "contextId": context_id, "status": task_status}
    if text:
        out["artifacts"] = [answer_artifact([text_part(text)])]
    kept = list(history)
    if history_length is not None:
        kept = kept[-history_length:] if history_length else []
    if kept:
        out["history"] = kept
    return out


def status_update(task_id: str, context_id: str, task_status: dict[str, Any]) -> dict[str, Any]:
    """A ``StreamResponse`` carrying a ``TaskStatusUpdateEvent``."""
    return {"statusUpdate": {"taskId": task_id, "contextId": context_id, "status": task_status}}


def artifact_update(
    task_id: str, context_id: str, text: str, *, append: bool, last: bool = False
) -> dict[str, Any]:
    """A ``StreamResponse`` carrying a ``TaskArtifactUpdateEvent`` of the answer artifact:
    ``text`` as one more part (``append``) or as its first."""
    event: dict[str, Any] = {
        "taskId": task_id,
        "contextId": context_id,
        "artifact": answer_artifact([text_part(text)]),
    }
    if append:
        event["append"] = True
    if last:
        event["lastChunk"] = True
    return {"artifactUpdate": event}


def sse(data: Any) -> bytes:
    """One SSE event carrying ``data`` as JSON."""
    return b"data: " + utf8_dumps(data) + b"\n\n"


def agent_card(
    *,
    name: str,
    description: str,
    url: str,
    token: bool,
    version: str,
) -> dict[str, Any]:
    """The Agent Card of an agent served at ``url`` (JSON-RPC at ``url + "/jsonrpc"``,
    HTTP+JSON under ``url``; A2A 0.3's JSON-RPC methods too, on the same endpoint, with
    0.3's top-level fields for its clients), declaring bearer authentication when
    ``token``."""
    card: dict[str, Any] = {
        "name": name,
        "description": description,
        "version": version,
        "supportedInterfaces": [
            {
                "url": url + "/jsonrpc",
                "protocolBinding": JSONRPC,
                "protocolVersion": PROTOCOL_VERSION,
            },
            {"url": url, "protocolBinding": HTTP_JSON, "protocolVersion": PROTOCOL_VERSION},
            {"url": url + "/jsonrpc", "protocolBinding": JSONRPC, "protocolVersion": "0.3"},
        ],
        # A2A 0.3's fields, for its clients (1.0 clients read supportedInterfaces)
        "url": url + "/jsonrpc",
        "preferredTransport": JSONRPC,
        "protocolVersion": "0.3.0",
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["text/plain", "application/json", "image/*", "application/pdf"],
        "defaultOutputModes": ["text/plain"],
        "skills": [
            {
                "id": name,
                "name": name,
                "description": description,
                "tags": ["axon"],
            }
        ],
    }
    if token:
        card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    return card


def card_interface(card: Mapping[str, Any], binding: str) -> str | None:
    """The URL of ``card``'s interface for ``binding`` at protocol version 1.x."""
    interfaces = field(card, "supportedInterfaces")
    if not isinstance(interfaces, list):
        return None
    for i in interfaces:
        if (
            isinstance(i, dict)
            and field(i, "protocolBinding") == binding
            and str(field(i, "protocolVersion") or "").split(".")[0] == "1"
            and isinstance(i.get("url"), str)
        ):
            return str(i["url"])
    return None


__all__ = [
    "CANCELED",
    "CARD_PATH",
    "COMPLETED",
    "FAILED",
    "HTTP_JSON",
    "INPUT_REQUIRED",
    "INTERRUPTED",
    "JSONRPC",
    "PROTOCOL_VERSION",
    "ROLE_AGENT",
    "ROLE_USER",
    "SUBMITTED",
    "TERMINAL",
    "VERSION_HEADER",
    "WORKING",
    "A2AError",
    "Incoming",
    "SendRequest",
    "agent_card",
    "artifact_update",
    "card_interface",
    "error_from",
    "jsonrpc_result",
    "message",
    "parts_of",
    "sse",
    "status",
    "status_update",
    "stored_message_id",
    "task",
    "task_request",
    "text_part",
    "user_input",
]
