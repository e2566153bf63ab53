"""The web server frees idle sessions and reloads them from the store on the next request."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from runtime.messages import UserMessage

_ids = itertools.count()


def chat_body(session_id: str, text: str) -> dict[str, Any]:
    """A new message (its own id: the same id again would be a retry or an edit)."""
    message = {"id": f"m{next(_ids)}", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {
        "id": session_id,
        "messages": [message],
        "trigger": "submit-message",
    }


@asynccontextmanager
async def served(
    agent: Agent, **host_options: Any
) -> AsyncIterator[tuple[Host, httpx.AsyncClient]]:
    """A host with ``host_options`` and the app on a loopback port, with a client for it."""
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import serve_app

    async with Host.open(log_tap=False, **host_options) as host:
        app = create_app(host, agent)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve_app, app, host="127.0.0.1", port=0))
            try:
                async with httpx.AsyncClient(base_url=binds[0]) as client:
                    yield host, client
            finally:
                nursery.cancel_scope.cancel()


async def test_chat_and_get_reload_an_evicted_session_with_its_whole_history():
    provider = ScriptedProvider(steps=[["Noted."]])
    async with served(Agent(provider=provider), max_sessions=1) as (host, client):
        await client.post("/api/chat", json=chat_body("s1", "first"))
        await client.post("/api/chat", json=chat_body("s2", "other"))
        assert list(host.sessions) == ["s2"]
        stored = (await client.get("/api/sessions/s1")).json()
        assert [m["role"] for m in stored["messages"]] == ["user", "assistant"]
        r = await client.post("/api/chat", json=chat_body("s1", "second"))
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        stored = (await client.get("/api/sessions/s1")).json()
    sent = provider.requests[-1].messages
    assert [m.content for m in sent if isinstance(m, UserMessage)] == ["first", "second"]
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"] * 2


async def test_reading_a_session_through_the_api_keeps_it_in_memory():
    agent = Agent(provider=ScriptedProvider(steps=[["ok"]]))
    async with served(agent, max_sessions=2) as (host, client):
        await client.post("/api/chat", json=chat_body("a", "hi"))
        await client.post("/api/chat", json=chat_body("b", "hi"))
        assert (await client.get("/api/sessions/a")).status_code == 200  # a: most recent
        await client.post("/api/chat", json=chat_body("c", "hi"))
        assert list(host.sessions) == ["a", "c"]


def serve_args(*argv: str) -> argparse.Namespace:
    from runtime.app.web.serve import add_serve_arguments

    return add_serve_arguments(argparse.ArgumentParser()).parse_args(list(argv))


def test_serve_frees_sessions_idle_15_minutes_or_past_1000_by_default():
    args = serve_args()
    assert (args.session_ttl, args.max_sessions) == (900.0, 1000)
    args = serve_args("--session-ttl", "30", "--max-sessions", "5")
    assert (args.session_ttl, args.max_sessions) == (30.0, 5)


@pytest.mark.parametrize(
    "argv",
    [
        ["--session-ttl", "0"],
        ["--session-ttl", "nan"],
        ["--max-sessions", "-1"],
        ["--max-sessions", "x"],
    ],
)
def test_serve_refuses_eviction_flags_that_are_not_positive(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        serve_args(*argv)
    assert exit_.value.code == 2
    assert "is not a positive" in capsys.readouterr().err


async def test_serve_passes_the_eviction_flags_to_the_host(monkeypatch):
    from runtime.app.web import serve

    seen: dict[str, Any] = {}

    @asynccontextmanager
    async def fake_open(**options: Any) -> AsyncIterator[None]:
        seen.update(options)
        raise RuntimeError("stop here")
        yield

    monkeypatch.setattr(Host, "open", fake_open)
    with pytest.raises(RuntimeError, match="stop here"):
        await serve.serve_command(serve_args("--session-ttl", "30", "--max-sessions", "7"))
    assert (seen["idle_ttl"], seen["max_sessions"]) == (30.0, 7)
