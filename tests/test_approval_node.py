"""The real `ai` package's AbstractChat (what `useChat` wraps) answers an approval:
the continuation it sends itself streams into the same assistant message."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Tool, tool
from runtime.app.web.signing import ApprovalSigner
from tests.web.harness import NPM_TIMEOUT, WEB, ensure_ai_package, web_server

ran: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return f"deleted {path}"


AI6 = WEB / "ai6"


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


def ai6_entry() -> str:
    """The file URL of ``ai`` 6's ESM entry (npm install in tests/web/ai6 on first use);
    skips the test when the install fails."""
    entry = AI6 / "node_modules" / "ai" / "dist" / "index.mjs"
    if not entry.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm not installed")
        try:
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=AI6,
                capture_output=True,
                timeout=NPM_TIMEOUT,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"npm install of ai@6 failed: {exc}")
        if not entry.exists():
            pytest.skip("npm install of ai@6 failed")
    return entry.as_uri()


@pytest.fixture(scope="module", params=["ai7", "ai6"])
def ai(request: pytest.FixtureRequest, node: str) -> dict[str, str]:
    """Which ``ai`` package drives the chat: the pinned 7, or 6."""
    return {} if request.param == "ai7" else {"ai": ai6_entry()}


pick_color = Tool.client("pick_color", {"type": "object", "properties": {}}, "Pick a color.")


def agent(call: str = "delete_file") -> Agent:
    args = {"path": "/x"} if call == "delete_file" else {}
    steps = [["Deleting. ", *tool_call(call, args, tool_call_id="D")], ["Gone."]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file, pick_color])


async def chat_through_an_approval(
    node: str, tmp_path: Any, app_options: dict[str, Any] | None = None, **answer: Any
) -> tuple[dict, dict]:
    """The chat's outcome and the stored session, for one approval answered ``answer``
    (the app made with ``app_options``)."""
    ran.clear()
    tool_name = "pick_color" if "clientOutput" in answer else "delete_file"
    store = str(tmp_path / "w.db")
    async with web_server(agent(tool_name), store=store, **(app_options or {})) as server:
        config = json.dumps({"url": server.url, "chatId": "s", **answer})
        with trio.fail_after(60):
            proc = await trio.run_process(
                [node, str(WEB / "approve_chat.mjs"), config], capture_stdout=True, cwd=WEB
            )
        async with httpx.AsyncClient(base_url=server.url) as client:
            stored = (await client.get("/api/sessions/s")).json()
    return json.loads(proc.stdout), stored


async def test_the_ai_package_approves_and_the_turn_continues_in_the_same_message(
    node, ai, tmp_path
):
    chat, stored = await chat_through_an_approval(node, tmp_path, approved=True, **ai)
    assert chat["error"] is None and chat["status"] == "ready"
    _, second = chat["bodies"]
    assert second["trigger"] == "submit-message" and second["messages"][-1]["role"] == "assistant"
    assert second["messageId"] == second["messages"][-1]["id"]
    assert ran == ["/x"]
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant"]
    message = chat["messages"][-1]
    tool_part = next(p for p in message["parts"] if p["type"] == "tool-delete_file")
    assert tool_part["state"] == "output-available" and tool_part["output"] == "deleted /x"
    texts = [p["text"] for p in message["parts"] if p["type"] == "text"]
    assert texts == ["Deleting. ", "Gone."]
    # one assistant message, the stored message's UI form (metadata aside)
    saved = stored["ui_messages"][-1]
    assert (message["id"], message["parts"]) == (saved["id"], saved["parts"])


async def test_the_ai_package_denies_and_sees_the_denial(node, ai, tmp_path):
    chat, _ = await chat_through_an_approval(node, tmp_path, approved=False, reason="no", **ai)
    assert chat["error"] is None and ran == []
    message = chat["messages"][-1]
    tool_part = next(p for p in message["parts"] if p["type"] == "tool-delete_file")
    assert tool_part["state"] == "output-denied"
    assert tool_part["approval"]["approved"] is False and tool_part["approval"]["reason"] == "no"


async def test_the_ai_package_supplies_a_client_tools_output(node, ai, tmp_path):
    chat, stored = await chat_through_an_approval(node, tmp_path, clientOutput="red", **ai)
    assert chat["error"] is None and len(chat["bodies"]) == 2
    message = chat["messages"][-1]
    tool_part = next(p for p in message["parts"] if p["type"] == "tool-pick_color")
    assert tool_part["state"] == "output-available" and tool_part["output"] == "red"
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == ["Deleting. ", "Gone."]
    assert message["parts"] == stored["ui_messages"][-1]["parts"]


SECRET = {"approval_secret": "node-secret"}


async def test_the_ai_package_echoes_the_signed_approval_and_the_server_verifies_it(
    node, ai, tmp_path
):
    """ai 6 (6.0.221 on) and 7 keep the request's ``signature`` in the tool part's
    ``approval`` and send it back with the answer (tests/web/package.json and
    ai6/package.json ask for versions that do)."""
    chat, _ = await chat_through_an_approval(
        node, tmp_path, SECRET, approved=True, reason="ok", **ai
    )
    assert chat["error"] is None and chat["status"] == "ready" and ran == ["/x"]
    _, second = chat["bodies"]
    (part,) = [p for p in second["messages"][-1]["parts"] if p.get("toolCallId") == "D"]
    approval = part["approval"]
    expected = ApprovalSigner(secret=b"node-secret").sign(
        "s", approval["id"], "D", "delete_file", {"path": "/x"}
    )
    assert approval["signature"] == expected and approval["approved"] is True


async def test_the_ai_package_with_an_altered_signature_is_refused(node, ai, tmp_path):
    chat, stored = await chat_through_an_approval(
        node, tmp_path, SECRET, approved=True, tamperSignature="AA", **ai
    )
    assert chat["status"] == "error" and "signature" in chat["error"]
    assert ran == [] and stored["waiting"] == 1  # nothing recorded: it still waits
