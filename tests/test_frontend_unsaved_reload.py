"""What a reload shows of a turn that ended ``not_saved`` after some of its steps were
committed, embedded and on a worker deployment: the same. The stored form carries no
error marker on either: the store holds the committed steps; the turn's end (its answer,
its error) is the very write the store refused, and a later write of it would rewrite
the session under whatever was stored since (the message the turn handed back ran as a
turn of its own, tests/test_web_steer_page_unsaved_workers.py). The client was told at
its live end (``not_saved``: reload to see what the store holds). Real PostgreSQL and
Redis for the worker's; the embedded app on a memory store refusing the same saves."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores import MemoryStore
from actors.stores.postgres import PostgresStore
from runtime import Agent, tool
from runtime.actor_messages import InferRequest
from runtime.errors import StoreError
from tests.support.redis import require_redis
from tests.test_frontend import body, deployment
from tests.web.harness import web_server

ANSWER = "a is 1"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@tool
async def lookup(key: str) -> int:
    """Look a key up."""
    return 1


def respond(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return ["Looking. ", *tool_call("lookup", {"key": "a"}, tool_call_id="L")]
    return [ANSWER]


def agent() -> Agent:
    return Agent(name="a", provider=ScriptedProvider(responder=respond), tools=[lookup])


def refusing(real: Any) -> Any:
    """``real`` save, refusing every save that holds the answer (a full disk)."""

    async def save(
        self: Any, session_id: str, start: int, messages: Any, *a: Any, **kw: Any
    ) -> Any:
        if any(ANSWER in getattr(m, "text", "") for m in messages):
            raise StoreError("could not extend file: No space left on device")
        return await real(self, session_id, start, messages, *a, **kw)

    return save


class RefusingStore(MemoryStore):
    save = refusing(MemoryStore.save)


def shape(ui: list[dict[str, Any]]) -> list[Any]:
    """The UI messages without their random ids (each deployment names its own)."""
    return [
        (
            m["role"],
            [(p["type"], p.get("state"), p.get("text"), p.get("output")) for p in m["parts"]],
            {k: v for k, v in (m.get("metadata") or {}).items() if k != "usage"},
        )
        for m in ui
    ]


async def reload(url: str) -> tuple[list[Any], list[Any]]:
    """Post ``go`` to session ``s1``: its stream's last chunks, then the session's UI
    messages as a reload reads them (``?view=ui``)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        text = (await client.post("/api/chat", json=body("s1"))).text
        page = (await client.get("/api/sessions/s1", params={"view": "ui"})).json()
    told = [line for line in text.splitlines() if line.startswith("data: ")][-2:]
    return told, page["ui_messages"]


async def test_a_reload_after_a_not_saved_turn_shows_the_same_embedded_and_on_workers(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with web_server(agent(), store=RefusingStore()) as server:
        told_here, here = await reload(server.url)
    monkeypatch.setattr(PostgresStore, "save", refusing(PostgresStore.save))
    async with deployment(pg_url, redis_url, agent()) as d:
        told_there, there = await reload(d.urls[0])
        (turn,) = await d.queue.turns("s1")
    assert (turn.status, turn.attempts) == ("failed", 3)
    assert told_here == told_there and "not_saved" in told_here[0]  # (told the same)
    committed = [
        ("user", [("text", None, "go", None)], {}),
        (
            "assistant",
            [
                ("step-start", None, None, None),
                ("text", "done", "Looking. ", None),
                ("tool-lookup", "output-available", None, 1),
            ],
            {"interrupted": False},  # no marker: neither failed nor interrupted
        ),
    ]
    assert shape(here) == committed
    assert shape(there) == committed
