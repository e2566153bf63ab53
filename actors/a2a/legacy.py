"""A2A 0.3's JSON-RPC wire, translated to and from 1.0's (:mod:`actors.a2a.wire`).

Clients built on A2A 0.3 (``a2a-sdk`` before 1.0, and the frameworks on it) call
``message/send``, ``message/stream``, ``tasks/get``, ``tasks/cancel`` and
``tasks/resubscribe``, and write their objects differently: a ``kind`` on every object
and part (``{"kind": "text", "text": ...}``, ``{"kind": "file", "file": {"bytes" |
"uri", "mimeType", "name"}}``, ``{"kind": "data", "data": {...}}``), roles ``user`` /
``agent``, states ``working`` / ``input-required`` / ..., ``configuration.blocking``
where 1.0 has ``returnImmediately``, events that carry their own ``kind`` and a ``final``
flag, and ``message/send`` answering with the ``Task`` itself. The server answers those
methods on the same JSON-RPC endpoint by translating each request to 1.0 on the way in
and each object to 0.3 on the way out, so a task is the same task in either version.
"""

from __future__ import annotations

from typing import Any

from actors.a2a import wire

METHODS = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
}
"""A2A 0.3's method names, and the 1.0 methods they are."""
NOT_SERVED = frozenset(
    {
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/delete",
    }
)
VERSION = "0.3"

_STATES = {s: s.removeprefix("TASK_STATE_").lower().replace("_", "-") for s in wire.STATES}
"""``TASK_STATE_INPUT_REQUIRED`` -> ``input-required``, ..."""
_ROLES = {"user": wire.ROLE_USER, "agent": wire.ROLE_AGENT}


# -- in: 0.3 -> 1.0 ---------------------------------------------------------------------


def _part_in(part: Any) -> Any:
    if not isinstance(part, dict):
        return part  # refused by the 1.0 checks, with their message
    kind = part.get("kind")
    if kind == "text" or (kind is None and "text" in part):
        return {"text": part.get("text")}
    if kind == "data" or (kind is None and "data" in part):
        return {"data": part.get("data")}
    if kind == "file" or (kind is None and "file" in part):
        file = part.get("file")
        if not isinstance(file, dict):
            return {}
        out: dict[str, Any] = {}
        if "bytes" in file:
            out["raw"] = file["bytes"]
        elif "uri" in file:
            out["url"] = file["uri"]
        if file.get("mimeType") is not None:
            out["mediaType"] = file["mimeType"]
        if file.get("name") is not None:
            out["filename"] = file["name"]
        return out
    return {}


def _message_in(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if k not in ("kind", "role", "parts")}
    role = message.get("role")
    out["role"] = _ROLES.get(role, role) if isinstance(role, str) else role
    parts = message.get("parts")
    out["parts"] = [_part_in(p) for p in parts] if isinstance(parts, list) else parts
    return out


def params_in(method: str, params: Any) -> Any:
    """The 1.0 params of 0.3 method ``method``'s ``params``."""
    if not isinstance(params, dict) or METHODS[method] not in (
        "SendMessage",
        "SendStreamingMessage",
    ):
        return params
    out: dict[str, Any] = {"message": _message_in(params.get("message"))}
    config = params.get("configuration")
    if isinstance(config, dict):
        converted: dict[str, Any] = {}
        if config.get("blocking") is False:
            converted["returnImmediately"] = True
        if "historyLength" in config:
            converted["historyLength"] = config["historyLength"]
        if config.get("pushNotificationConfig"):
            converted["taskPushNotificationConfig"] = config["pushNotificationConfig"]
        out["configuration"] = converted
    elif config is not None:
        out["configuration"] = config
    return out


# -- out: 1.0 -> 0.3 --------------------------------------------------------------------


def _part_out(part: dict[str, Any]) -> dict[str, Any]:
    if "text" in part:
        return {"kind": "text", "text": part["text"]}
    if "data" in part:
        data = part["data"]
        return {"kind": "data", "data": data if isinstance(data, dict) else {"value": data}}
    file: dict[str, Any] = {}
    if "raw" in part:
        file["bytes"] = part["raw"]
    else:
        file["uri"] = part.get("url")
    if part.get("mediaType"):
        file["mimeType"] = part["mediaType"]
    if part.get("filename"):
        file["name"] = part["filename"]
    return {"kind": "file", "file": file}


def message_out(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in ("role", "parts")}
    out["kind"] = "message"
    out["role"] = "agent" if message.get("role") == wire.ROLE_AGENT else "user"
    out["parts"] = [_part_out(p) for p in message.get("parts", [])]
    return out


def _status_out(status: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"state": _STATES.get(status["state"], "unknown")}
    if status.get("message") is not None:
        out["message"] = message_out(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def _artifact_out(artifact: dict[str, Any]) -> dict[str, Any]:
    return {**artifact, "parts": [_part_out(p) for p in artifact.get("parts", [])]}


def task_out(task: dict[str, Any]) -> dict[str, Any]:
    """A 1.0 ``Task`` as 0.3 writes it."""
    out: dict[str, Any] = {
        "kind": "task",
        "id": task["id"],
        "contextId": task["contextId"],
        "status": _status_out(task["status"]),
    }
    if task.get("artifacts"):
        out["artifacts"] = [_artifact_out(a) for a in task["artifacts"]]
    if task.get("history"):
        out["history"] = [message_out(m) for m in task["history"]]
    return out


def event_out(event: dict[str, Any]) -> dict[str, Any]:
    """A 1.0 ``StreamResponse`` as the 0.3 event it carries."""
    if "task" in event:
        return task_out(event["task"])
    if "statusUpdate" in event:
        update = event["statusUpdate"]
        state = update["status"]["state"]
        return {
            "kind": "status-update",
            "taskId": update["taskId"],
            "contextId": update["contextId"],
            "status": _status_out(update["status"]),
            "final": state in wire.TERMINAL | wire.INTERRUPTED,
        }
    if "artifactUpdate" in event:
        update = event["artifactUpdate"]
        out = {
            "kind": "artifact-update",
            "taskId": update["taskId"],
            "contextId": update["contextId"],
            "artifact": _artifact_out(update["artifact"]),
        }
        for key in ("append", "lastChunk"):
            if key in update:
                out[key] = update[key]
        return out
    return message_out(event["message"])


__all__ = ["METHODS", "NOT_SERVED", "VERSION", "event_out", "message_out", "params_in", "task_out"]
