"""A turn of ``serve``'s in-process host whose final save the store refuses: every
protocol tells its client the answer was not saved, in its own error shape, and never
quotes the store's exception (a path, a key); the server then holds what the store holds,
so a client sending the same request again gets one copy stored, not two
(runtime/app/unsaved.py). Each protocol is driven by its real client where the suite has
one (the ``openai`` SDK, ``a2a-sdk``, ``mcp``), the AI SDK's and AG-UI's streams over
HTTP; the store is a memory store whose saves fail while it is down."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import trio

import actors.turn.saving as saving_module
from actors.providers.scripted import ScriptedProvider
from actors.stores import MemoryStore
from runtime import Agent
from runtime.app.unsaved import NOT_CONFIRMED_MESSAGE, NOT_SAVED, NOT_SAVED_MESSAGE
from runtime.errors import StoreError
from runtime.messages import AssistantMessage, UserMessage
from tests.test_a2a import collect, last_state, sdk
from tests.test_a2a import user as a2a_user
from tests.test_agui import parse_sse
from tests.test_mcp_server import mcp_client
from tests.test_openai_compat import USER, openai_client
from tests.test_web_http import TWO_TOOLS, lookup
from tests.web.harness import (
    WebServer,
    ensure_ai_package,
    run_read_stream,
    wait_idle,
    web_server,
)

pytestmark = pytest.mark.filterwarnings(  # the openai SDK's own generators (test_openai_compat)
    r"ignore:Async generator '(openai\._streaming|httpx2\._models|httpcore2\._async)\.:"
    "ResourceWarning"
)

ALL = ("ai-sdk", "ag-ui", "a2a", "openai", "mcp")
KEY = "sk-proj-" + "a1B2c3D4" * 4
PATH = "/var/lib/axon/private-7f3a.db"
LEAKS = (PATH, "private-7f3a", "a1B2c3D4", "StoreError", "disk full")
"""What the store's exception says: none of it may reach a client."""


class DownStore(MemoryStore):
    """A memory store whose saves raise while ``down`` (a full disk), quoting a path and
    a key as a driver's message may; ``fail_after`` saves succeed first when set (the
    turn's earlier steps stored, its last not); with ``fail_only`` that one save alone
    fails. ``saves`` counts the calls."""

    def __init__(
        self, *, down: bool = True, fail_after: int | None = None, fail_only: int = 0
    ) -> None:
        super().__init__()
        self.down = down
        self.fail_after = fail_after
        self.fail_only = fail_only
        """The one save (counted from 1) that fails, when set."""
        self.saves = 0

    async def save(self, session_id, start, messages, meta=None, **kwargs):  # type: ignore[no-untyped-def]
        self.saves += 1
        failing = self.down if self.fail_after is None else self.saves > self.fail_after
        if self.fail_only:
            failing = self.saves == self.fail_only
        if failing:
            raise StoreError(f"disk full writing {PATH} (token {KEY})")
        return await super().save(session_id, start, messages, meta, **kwargs)


def answer_agent(*texts: str) -> Agent:
    return Agent(
        name="helper",
        provider=ScriptedProvider(responder=lambda request: [texts[0] if texts else "Hello."]),
    )


def no_leak(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, leak


async def stored(server: WebServer, session_id: str) -> list[tuple[str, str]]:
    record = await server.host.store.load(session_id)
    if record is None:
        return []
    return [
        (m.role, m.text) for m in record.messages if isinstance(m, UserMessage | AssistantMessage)
    ]


def chat_body(session_id: str, message_id: str, text: str) -> dict[str, Any]:
    return {
        "id": session_id,
        "messages": [{"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}],
    }


def ui_chunks(body: str) -> list[Any]:
    return [
        json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
        for line in body.splitlines()
        if line.startswith("data: ")
    ]


async def post_chat(server: WebServer, body: dict[str, Any]) -> list[Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        r = await c.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    return ui_chunks(r.text)


async def test_an_ai_sdk_stream_ends_with_a_plain_error_and_no_finish_when_the_save_fails():
    async with web_server(answer_agent(), store=DownStore(), protocols=ALL) as server:
        chunks = await post_chat(server, chat_body("s1", "u1", "hi"))
        assert await stored(server, "s1") == []
    types = [c if isinstance(c, str) else c["type"] for c in chunks]
    assert "text-delta" in types and "finish" not in types
    assert types[-2:] == ["error", "[DONE]"]
    assert chunks[-2]["errorText"] == f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"
    no_leak(json.dumps(chunks))


async def test_an_ag_ui_run_ends_with_run_error_not_saved():
    body = {
        "threadId": "t1",
        "runId": "r1",
        "messages": [{"id": "u1", "role": "user", "content": "hi"}],
    }
    async with web_server(answer_agent(), store=DownStore(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            r = await c.post("/ag-ui", json=body)
        assert await stored(server, "t1") == []
    events = parse_sse(r.text)
    assert "RUN_FINISHED" not in [e["type"] for e in events]
    assert events[-1] == {"type": "RUN_ERROR", "message": events[-1]["message"], "code": NOT_SAVED}
    assert NOT_SAVED_MESSAGE in events[-1]["message"]
    no_leak(r.text)


async def test_an_openai_client_gets_a_5xx_and_a_stream_error_not_saved():
    # (a stateless call, without X-Axon-Session, saves nothing and has nothing to fail)
    async with web_server(answer_agent(), store=DownStore(), protocols=ALL) as server:
        async with openai_client(server) as client:
            with pytest.raises(openai.InternalServerError) as whole:
                await client.chat.completions.create(
                    model="helper", messages=USER("hi"), extra_headers={"X-Axon-Session": "w"}
                )
            stream = await client.chat.completions.create(
                model="helper",
                messages=USER("hi"),
                stream=True,
                extra_headers={"X-Axon-Session": "st"},
            )
            got: list[str] = []
            with pytest.raises(openai.APIError) as streamed:
                async for chunk in stream:
                    got.append(chunk.choices[0].delta.content or "")
            await stream.close()
    assert whole.value.code == NOT_SAVED and streamed.value.code == NOT_SAVED
    assert NOT_SAVED_MESSAGE in whole.value.message and NOT_SAVED_MESSAGE in streamed.value.message
    assert "".join(got) == "Hello."  # what streamed stays streamed; its end is the error
    no_leak(f"{whole.value.body} {streamed.value.body}")


async def test_an_a2a_task_fails_with_a_not_saved_message():
    async with web_server(answer_agent(), store=DownStore(), protocols=ALL) as server:
        events = await sdk(server, lambda c: collect(c, a2a_user("hi")))
        context = events[0].task.context_id
        assert await stored(server, context) == []
    from a2a.types import TaskState

    assert last_state(events) == TaskState.TASK_STATE_FAILED
    note = events[-1].status_update.status.message.parts[0].text
    assert note == NOT_SAVED_MESSAGE
    no_leak(str(events))


async def test_an_mcp_call_is_an_is_error_result_not_saved():
    async with web_server(answer_agent(), store=DownStore(), protocols=ALL) as server:
        async with mcp_client(server) as client:
            result = await client.call_tool("helper", {"prompt": "hi", "session_id": "m1"})
        assert await stored(server, "m1") == []
    assert result.is_error
    assert result.content[0].text == f"{NOT_SAVED_MESSAGE} (session m1)"
    no_leak(str(result))


async def test_a_turn_whose_earlier_steps_saved_and_last_did_not_is_told_not_saved():
    # Three steps: the first saves (the user message, the first call) go through, the
    # later ones fail. What the client sees is the error; what is stored is the steps
    # before, never marked as the whole turn.
    agent = Agent(name="finder", provider=ScriptedProvider(TWO_TOOLS), tools=[lookup])
    store = DownStore(fail_after=1)
    async with web_server(agent, store=store, protocols=ALL) as server:
        chunks = await post_chat(server, chat_body("s2", "u1", "Find a and b"))
        kept = await stored(server, "s2")
    assert store.saves > 2  # the later saves were tried, and failed
    assert [c["type"] for c in chunks if isinstance(c, dict)][-1] == "error"
    assert chunks[-2]["errorText"] == f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"
    assert all("Both found." not in text for _, text in kept)
    no_leak(json.dumps(chunks))


async def test_a_saved_turn_still_ends_with_finish():
    async with web_server(answer_agent(), store=DownStore(down=False), protocols=ALL) as server:
        chunks = await post_chat(server, chat_body("s3", "u1", "hi"))
        assert await stored(server, "s3") == [("user", "hi"), ("assistant", "Hello.")]
    assert [c if isinstance(c, str) else c["type"] for c in chunks][-2:] == ["finish", "[DONE]"]


async def test_an_ai_sdk_retry_after_a_failed_save_runs_again_and_stores_one_copy():
    store = DownStore()
    async with web_server(answer_agent(), store=store, protocols=ALL) as server:
        first = await post_chat(server, chat_body("s4", "u1", "hi"))
        store.down = False
        again = await post_chat(server, chat_body("s4", "u1", "hi"))
        kept = await stored(server, "s4")
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            page = (await c.get("/api/sessions/s4")).json()
    assert first[-2]["type"] == "error"
    # run again (not the unsaved answer replayed as if stored), and saved once
    assert [c if isinstance(c, str) else c["type"] for c in again][-2:] == ["finish", "[DONE]"]
    assert kept == [("user", "hi"), ("assistant", "Hello.")]
    assert [m["role"] for m in page["messages"]] == ["user", "assistant"]


async def test_a_reload_after_a_failed_save_shows_what_the_store_holds():
    async with web_server(answer_agent(), store=DownStore(), protocols=ALL) as server:
        await post_chat(server, chat_body("s5", "u1", "hi"))
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            r = await c.get("/api/sessions/s5")
            busy = await c.get("/api/sessions/s5", params={"only": "busy"})
    # the answer the client was told is not saved is not shown as the conversation's,
    # nor is the session said to exist while the store holds none of it
    assert (r.status_code, busy.status_code) == (404, 404)


async def test_an_openai_request_sent_again_after_a_failed_save_stores_one_copy():
    store = DownStore()
    header = {"X-Axon-Session": "o1"}
    async with web_server(answer_agent(), store=store, protocols=ALL) as server:
        async with openai_client(server) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="helper", messages=USER("hi"), extra_headers=header
                )
            store.down = False
            again = await client.chat.completions.create(
                model="helper", messages=USER("hi"), extra_headers=header
            )
        kept = await stored(server, "o1")
    assert again.choices[0].message.content == "Hello."
    assert kept == [("user", "hi"), ("assistant", "Hello.")]


async def test_an_mcp_call_made_again_after_a_failed_save_stores_one_copy():
    store = DownStore()
    async with web_server(answer_agent(), store=store, protocols=ALL) as server:
        async with mcp_client(server) as client:
            first = await client.call_tool("helper", {"prompt": "hi", "session_id": "m2"})
            store.down = False
            again = await client.call_tool("helper", {"prompt": "hi", "session_id": "m2"})
        kept = await stored(server, "m2")
    assert first.is_error and not again.is_error
    assert kept == [("user", "hi"), ("assistant", "Hello.")]


async def test_an_a2a_message_resent_after_a_failed_save_fails_again_and_a_new_one_stores_once():
    store = DownStore()
    async with web_server(answer_agent(), store=store, protocols=ALL) as server:
        first = await sdk(server, lambda c: collect(c, a2a_user("hi", message_id="q1")))
        context = first[0].task.context_id
        store.down = False
        again = await sdk(
            server, lambda c: collect(c, a2a_user("hi", message_id="q1", context_id=context))
        )
        after_resend = await stored(server, context)
        new = await sdk(
            server, lambda c: collect(c, a2a_user("hi", message_id="q2", context_id=context))
        )
        kept = await stored(server, context)
    from a2a.types import TaskState

    # the same message id is the same task (A2A's rule): failed, saying why, run once
    assert last_state(again) == TaskState.TASK_STATE_FAILED
    assert again[-1].task.status.message.parts[0].text == NOT_SAVED_MESSAGE
    assert after_resend == []
    # a new message runs on what the store holds: the unsaved turn is not carried in
    assert last_state(new) == TaskState.TASK_STATE_COMPLETED
    assert kept == [("user", "hi"), ("assistant", "Hello.")]


async def test_a_turn_that_failed_and_was_not_saved_says_both_without_the_store_s_text():
    def fail(request: Any) -> Any:
        raise ValueError("boom")

    agent = Agent(name="broken", provider=ScriptedProvider(responder=fail))
    async with web_server(agent, store=DownStore(), protocols=ALL) as server:
        chunks = await post_chat(server, chat_body("s6", "u1", "hi"))
    text = chunks[-2]["errorText"]
    assert text.startswith(f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}") and "boom" in text
    no_leak(json.dumps(chunks))


class HeldStore(MemoryStore):
    """A memory store whose saves wait for ``gate`` (a store that does not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        await self.gate.wait()
        return await super().save(*args, **kwargs)


async def test_a_save_not_confirmed_in_time_is_told_as_maybe_not_saved_and_lands_later(
    monkeypatch,
):
    monkeypatch.setattr(saving_module, "SAVE_TIMEOUT", 0.3)
    store = HeldStore()
    async with web_server(answer_agent(), store=store, protocols=ALL) as server:
        chunks = await post_chat(server, chat_body("s7", "u1", "hi"))
        store.gate.set()
        await wait_idle(server, "s7")
    record = await store.load("s7")  # (the host's close waited for the save in flight)
    assert record is not None
    kept = [(m.role, m.text) for m in record.messages]
    assert chunks[-2] == {"type": "error", "errorText": f"{NOT_SAVED}: {NOT_CONFIRMED_MESSAGE}"}
    assert kept == [("user", "hi"), ("assistant", "Hello.")]  # still in flight: it landed


async def test_the_ai_package_reads_the_unsaved_turn_as_an_error_and_finds_no_stored_session():
    node = ensure_ai_package()  # (skips without Node.js)
    async with web_server(answer_agent(), store=DownStore(), protocols=ALL) as server:
        (read,) = await run_read_stream(
            node, {"url": server.url, "token": None, "requests": [{"chatId": "n1", "text": "hi"}]}
        )
    assert read["status"] == 200
    assert "finish" not in read["chunks"] and read["chunks"][-1] == "error"
    assert read["error"] == f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"  # useChat's error
    assert "stored" not in read and "storedError" in read  # the page's read: 404, no history
    no_leak(json.dumps(read))


async def test_an_ag_ui_run_posted_again_after_a_failed_save_runs_and_stores_one_copy():
    store = DownStore()
    body = {
        "threadId": "t2",
        "runId": "r1",
        "messages": [{"id": "u1", "role": "user", "content": "hi"}],
    }
    async with web_server(answer_agent(), store=store, protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            first = parse_sse((await c.post("/ag-ui", json=body)).text)
            store.down = False
            again = parse_sse((await c.post("/ag-ui", json=body)).text)
        kept = await stored(server, "t2")
    assert first[-1]["type"] == "RUN_ERROR"
    assert again[-1]["type"] == "RUN_FINISHED"
    assert kept == [("user", "hi"), ("assistant", "Hello.")]


async def test_a_last_step_save_refused_once_is_written_by_the_final_save_and_ends_with_finish():
    # The turn's final save writes again what the last step's refused save held: the
    # client is told the turn ended (finish), and the store holds all of it, once.
    agent = Agent(name="finder", provider=ScriptedProvider(TWO_TOOLS), tools=[lookup])
    counting = DownStore(down=False)
    async with web_server(agent, store=counting, protocols=ALL) as server:
        await post_chat(server, chat_body("c", "u1", "Find a and b"))
        whole = await stored(server, "c")
    agent = Agent(name="finder", provider=ScriptedProvider(TWO_TOOLS), tools=[lookup])
    store = DownStore(fail_only=counting.saves)  # the last save a saved turn makes
    async with web_server(agent, store=store, protocols=ALL) as server:
        chunks = await post_chat(server, chat_body("s8", "u1", "Find a and b"))
        kept = await stored(server, "s8")
    assert store.saves == counting.saves + 1  # the refused one, written again
    assert [c if isinstance(c, str) else c["type"] for c in chunks][-2:] == ["finish", "[DONE]"]
    assert kept == whole and kept[-1][1].endswith("Both found.")


async def test_a_first_step_save_refused_once_is_written_by_the_next_and_ends_with_finish():
    # The first step's commit (the user message, the first call and its result) is
    # refused, the later ones are not: the next step's save writes from where the store
    # stopped, so the turn is stored whole, with no step missing, and ends with finish.
    agent = Agent(name="finder", provider=ScriptedProvider(TWO_TOOLS), tools=[lookup])
    store = DownStore(fail_only=1)
    async with web_server(agent, store=store, protocols=ALL) as server:
        chunks = await post_chat(server, chat_body("s9", "u1", "Find a and b"))
        record = await server.host.store.load("s9")
    assert [c if isinstance(c, str) else c["type"] for c in chunks][-2:] == ["finish", "[DONE]"]
    assert record is not None
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "tool"]
    assert record.messages[1].text == "Looking up a. Now b. Both found."
