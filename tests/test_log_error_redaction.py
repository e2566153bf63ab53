"""The runtime's own warning and error lines carry exception texts redacted, whoever
configured the logging.

docs/embedding.md promises credentials are redacted from every log line. The chain of
:func:`runtime.configure_logging` redacts each line, but an application may configure
structlog itself without redaction, and then only what the runtime redacted before the
call stays clean: an exception's text (a driver's, an SDK's, a server's) may quote a
connection URL's password or a key."""

from __future__ import annotations

import ast
from pathlib import Path

from structlog.testing import capture_logs

from actors.mcp import MCPServer, MCPServerActor

ROOT = Path(__file__).resolve().parent.parent
LEVELS = {"debug", "info", "warning", "error", "critical", "exception", "msg"}
KEY = "sk-proj-" + "a1b2c3d4e5f6g7h8i9j0k1l2"


def _unredacted_texts(tree: ast.AST) -> list[int]:
    """Lines of log calls that pass ``str(...)`` or ``repr(...)`` of something as a
    field: an exception's text handed to the logger as it is."""
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LEVELS
        ):
            continue
        for keyword in node.keywords:
            value = keyword.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in {"str", "repr"}
            ):
                found.append(node.lineno)
    return found


def test_no_runtime_log_call_passes_an_exception_text_unredacted() -> None:
    offenders = []
    for folder in ("runtime", "actors"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in _unredacted_texts(tree)]
    assert offenders == []


def test_the_guard_finds_an_unredacted_exception_text() -> None:
    tree = ast.parse('log.warning("x.failed", error=str(exc))\nlog.info("ok", n=len(a))')
    assert _unredacted_texts(tree) == [1]


def test_an_mcp_server_that_died_with_a_key_in_its_error_keeps_no_key() -> None:
    actor = MCPServerActor(MCPServer.stdio("python3", ["-m", "nothing"]))
    with capture_logs() as logs:  # a chain that redacts nothing
        actor.on_crash(RuntimeError(f"401 from upstream: key {KEY} refused"))
    assert actor.last_error is not None and "[redacted]" in actor.last_error
    assert KEY not in actor.last_error
    assert [line["event"] for line in logs] == ["mcp.server-died"]
    assert KEY not in logs[0]["error"]
