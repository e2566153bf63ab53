"""A message queued (busy strategy ``enqueue``) behind a turn of ``serve``'s host whose
final save the store refused: the first turn's client is told ``not_saved``, and the
queued turn runs on, and saves, what the store holds, never the refused turn
(``Host.forgets_unsaved``, ``actors.turn.saving.Saving._discard_unsaved``). Before, the
queued turn's model saw the refused turn and its save wrote it (the client's reload then
showed the answer it was told was lost), and a turn whose content the store refuses
failed every turn queued behind it the same way."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from runtime import Agent, Host
from runtime.app.unsaved import NOT_SAVED, NOT_SAVED_MESSAGE
from runtime.errors import StoreError
from runtime.messages import AssistantMessage, UserMessage
from tests.test_web_http import lookup
from tests.test_web_unsaved_turns import chat_body, ui_chunks
from tests.web.harness import WebServer, web_server

POISON = "POISON"
TOLD = {"type": "error", "errorText": f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"}


class RefusingStore(MemoryStore):
    """A memory store that refuses every save holding a message that says ``POISON`` (a
    value it cannot write), or with ``down`` every save (a full disk), each save waiting
    first for ``gate``."""

    def __init__(self, *, down: bool = False) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.refusing = True
        self.down = down
        self.unreadable = False
        """Loads fail too (not with a store's error: a plug-in's own exception)."""

    async def load(self, session_id):  # type: ignore[no-untyped-def]
        if self.unreadable:
            raise RuntimeError("cannot read either")
        return await super().load(session_id)

    async def save(self, session_id, start, messages, meta=None, **kwargs):  # type: ignore[no-untyped-def]
        await self.gate.wait()
        if self.down or (self.refusing and any(POISON in getattr(m, "text", "") for m in messages)):
            raise StoreError("cannot write this value")
        return await super().save(session_id, start, messages, meta, **kwargs)


def seen_by_model() -> tuple[list[list[tuple[str, str]]], Any]:
    """The requests' user and assistant texts, and a responder answering ``answer N``."""
    requests: list[list[tuple[str, str]]] = []

    def respond(request: Any) -> list[str]:
        requests.append(
            [
                (m.role, m.text)
                for m in request.messages
                if isinstance(m, UserMessage | AssistantMessage) and m.text
            ]
        )
        return [f"answer {len(requests)} {POISON if len(requests) == 1 else ''}".strip()]

    return requests, respond


async def two_posts(
    server: WebServer, store: RefusingStore, first: str = f"first {POISON}"
) -> dict[str, list[Any]]:
    """Turn 1 (its save held at the gate), then turn 2 queued behind it, then the gate
    opened: each POST's UI chunks."""
    out: dict[str, list[Any]] = {}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        async with trio.open_nursery() as nursery:

            async def post(key: str, message_id: str, text: str) -> None:
                r = await c.post("/api/chat", json=chat_body("s1", message_id, text))
                out[key] = ui_chunks(r.text)

            nursery.start_soon(post, "first", "u1", first)
            with trio.fail_after(10):
                while True:  # turn 1 runs (its first save waits at the gate)
                    s = server.host.sessions.get("s1")
                    if s is not None and s.current is not None:
                        break
                    await trio.sleep(0.01)
                nursery.start_soon(post, "second", "u2", "second")
                while True:  # turn 2 waits behind it
                    if s.queued:
                        break
                    await trio.sleep(0.01)
            store.gate.set()
    return out


def ends(chunks: list[Any]) -> Any:
    return [c for c in chunks if c != "[DONE]"][-1]


async def stored(store: MemoryStore) -> list[tuple[str, str]]:
    record = await store.load("s1")
    assert record is not None
    return [
        (m.role, m.text) for m in record.messages if isinstance(m, UserMessage | AssistantMessage)
    ]


@pytest.mark.parametrize("on_busy", ["enqueue", "interrupt"])
async def test_a_turn_queued_behind_an_unsaved_one_does_not_save_it_when_the_store_is_back(
    on_busy: str,
):
    # The store is down for the first turn and back by the time the queued one calls
    # its model: the first turn's client was told not_saved, and it stays so. Under
    # ``interrupt`` the new message cuts the first turn in its save (shielded): the same.
    requests, respond = seen_by_model()
    store = RefusingStore(down=True)
    store.refusing = False  # (whatever it holds, once it is back)

    def back_for_the_second(request: Any) -> list[str]:
        answer = respond(request)
        store.down = len(requests) < 2
        return answer

    agent = Agent(
        name="a", provider=ScriptedProvider(responder=back_for_the_second), on_busy=on_busy
    )
    async with web_server(agent, store=store) as server:
        out = await two_posts(server, store, first="first")
    assert ends(out["first"]) == TOLD
    assert ends(out["second"])["type"] == "finish"
    assert await stored(store) == [("user", "second"), ("assistant", "answer 2")]
    assert requests[1] == [("user", "second")]  # the model never saw the unsaved turn


async def test_a_queued_turn_runs_without_the_unsaved_one_when_the_store_cannot_be_read():
    # The reload after the refused save fails too: the history is cut before the
    # unsaved turn all the same, the queued turn runs and saves from there.
    requests, respond = seen_by_model()
    store = RefusingStore(down=True)
    store.refusing = False

    def unreadable_for_the_first(request: Any) -> list[str]:
        answer = respond(request)
        store.down = store.unreadable = len(requests) < 2
        return answer

    agent = Agent(
        name="a", provider=ScriptedProvider(responder=unreadable_for_the_first), on_busy="enqueue"
    )
    async with web_server(agent, store=store) as server:
        out = await two_posts(server, store, first="first")
    assert ends(out["first"]) == TOLD
    assert ends(out["second"])["type"] == "finish"
    assert await stored(store) == [("user", "second"), ("assistant", "answer 2")]
    assert requests[1] == [("user", "second")]


async def test_a_turn_the_store_refuses_does_not_fail_the_turn_queued_behind_it():
    _, respond = seen_by_model()
    agent = Agent(name="a", provider=ScriptedProvider(responder=respond), on_busy="enqueue")
    store = RefusingStore()
    async with web_server(agent, store=store) as server:
        out = await two_posts(server, store)
    assert ends(out["first"]) == TOLD
    assert ends(out["second"])["type"] == "finish"  # not failed by what the store refused
    assert await stored(store) == [("user", "second"), ("assistant", "answer 2")]


async def test_a_queued_turn_after_an_unsaved_two_step_turn_keeps_the_step_the_store_holds():
    # The refused turn's first step commit goes through (its user message, its call and
    # the call's result); its last save, holding the answer the store cannot write, is
    # refused. The queued turn follows what the store holds of it, as the session
    # loaded again would, and its save keeps that.
    script = iter(
        [
            ["Looking up a. ", *tool_call("lookup", {"key": "a"}, tool_call_id="A")],
            [f"Found {POISON}."],
            ["answer 2"],
        ]
    )
    agent = Agent(
        name="a",
        provider=ScriptedProvider(responder=lambda request: next(script)),
        tools=[lookup],
        on_busy="enqueue",
    )
    store = RefusingStore()
    async with web_server(agent, store=store) as server:
        out = await two_posts(server, store, first="first")
    assert ends(out["first"]) == TOLD
    assert ends(out["second"])["type"] == "finish"
    assert await stored(store) == [
        ("user", "first"),
        ("assistant", "Looking up a. "),
        ("user", "second"),
        ("assistant", "answer 2"),
    ]


async def test_a_python_host_keeps_an_unsaved_turn_for_the_next_save_as_documented():
    # Without ``serve`` (Host.forgets_unsaved false) a refused turn stays in memory and
    # the session's next save writes it: the Python caller was told only
    # ``TurnResult.saved`` false (docs/architecture.md, Persistence).
    store = RefusingStore()
    store.gate.set()
    agent = Agent(name="a", provider=ScriptedProvider(responder=lambda r: ["ok"]))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s1")
        first = await session.run(f"first {POISON}")
        store.refusing = False  # the store takes it now
        second = await session.run("second")
    assert not first.saved and second.saved
    assert await stored(store) == [
        ("user", f"first {POISON}"),
        ("assistant", "ok"),
        ("user", "second"),
        ("assistant", "ok"),
    ]
