"""``DELETE /api/sessions/{id}`` in the embedded app (``serve`` on SQLite), over real HTTP,
and the attacks on it: a cross-site page, a forged ``Host``, a missing token, a CORS
preflight from a page the app does not allow.

Outcomes only: the status, what ``GET /api/sessions`` and the store hold afterwards, how
a running turn's stream ends.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent
from runtime.errors import SESSION_DELETED
from tests.test_web_http import JSON, body, events
from tests.web.harness import web_server

LIMIT = 30


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(steps=[["Noted."]] * 4))


def slow_agent() -> Agent:
    """A turn that streams a word, then waits until it is cancelled."""
    return Agent(provider=ScriptedProvider(steps=[["first ", Sleep(600), "never"]]))


async def listed(client: httpx.AsyncClient) -> list[str]:
    return [s["session_id"] for s in (await client.get("/api/sessions")).json()["sessions"]]


async def chatted(server: Any, client: httpx.AsyncClient, session_id: str) -> None:
    r = await client.post("/api/chat", json=body(session_id, "keep me"))
    assert events(r.content)[-1] == "[DONE]"
    assert await server.host.store.load(session_id) is not None


async def test_delete_answers_204_and_the_session_is_gone_from_the_api(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await chatted(server, client, "gone")
            await chatted(server, client, "kept")
            r = await client.delete("/api/sessions/gone", headers=JSON)
            one = await client.get("/api/sessions/gone")
            names = await listed(client)
        stored = await server.host.store.load("gone")
    assert r.status_code == 204 and r.content == b""
    assert one.status_code == 404
    assert names == ["kept"]
    assert stored is None


async def test_deleting_an_unknown_session_is_a_204(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            r = await client.delete("/api/sessions/never-was", headers=JSON)
    assert r.status_code == 204


async def test_deleting_with_a_bad_session_id_is_a_400(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            r = await client.delete("/api/sessions/" + "x" * 400, headers=JSON)
    assert r.status_code == 400


async def test_a_session_chatted_in_again_after_its_delete_starts_empty(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await chatted(server, client, "s")
            await client.delete("/api/sessions/s", headers=JSON)
            await chatted(server, client, "s")
            again = (await client.get("/api/sessions/s")).json()
    assert [m["role"] for m in again["messages"]] == ["user", "assistant"]


async def test_the_stream_of_the_deleted_sessions_running_turn_ends_with_abort(tmp_path):
    async with web_server(slow_agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            with trio.fail_after(LIMIT):
                async with client.stream("POST", "/api/chat", json=body("s", "go")) as r:
                    lines = r.aiter_lines()
                    async for line in lines:
                        if '"text-delta"' in line:
                            break
                    deleted = await client.delete("/api/sessions/s", headers=JSON)
                    rest = [line async for line in lines]
            names = await listed(client)
        stored = await server.host.store.load("s")
    chunks = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert deleted.status_code == 204
    assert {"type": "abort", "reason": SESSION_DELETED} in chunks
    assert "data: [DONE]" in rest
    assert names == [] and stored is None


# -- attacks: the DELETE is guarded as POST /api/chat is ------------------------------------


async def test_a_cross_origin_delete_is_refused_and_deletes_nothing(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await chatted(server, client, "s")
            statuses = [
                (await client.delete("/api/sessions/s", headers={**JSON, "origin": o})).status_code
                for o in ("http://evil.example", "null", "http://127.0.0.1:1")
            ]
            names = await listed(client)
    assert statuses == [403, 403, 403]
    assert names == ["s"]


async def test_a_cross_site_delete_without_an_origin_is_refused(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await chatted(server, client, "s")
            statuses = [
                (
                    await client.delete("/api/sessions/s", headers={**JSON, "sec-fetch-site": s})
                ).status_code
                for s in ("cross-site", "same-site")
            ]
            names = await listed(client)
    assert statuses == [403, 403]
    assert names == ["s"]


async def test_a_delete_with_a_forged_host_is_refused(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await chatted(server, client, "s")
            port = server.url.rsplit(":", 1)[1]
            r = await client.delete(
                "/api/sessions/s", headers={**JSON, "host": f"attacker.example:{port}"}
            )
            names = await listed(client)
    assert r.status_code == 403 and "attacker.example" in r.json()["error"]
    assert names == ["s"]


async def test_a_delete_without_a_json_content_type_is_a_415(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await chatted(server, client, "s")
            plain = await client.delete("/api/sessions/s", headers={"content-type": "text/plain"})
            bare = await client.delete("/api/sessions/s")
            names = await listed(client)
    assert (plain.status_code, bare.status_code) == (415, 415)
    assert names == ["s"]


async def test_a_delete_without_the_token_is_a_401(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db"), token="t0ken") as server:
        auth = {"authorization": "Bearer t0ken"}
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            r = await client.post("/api/chat", json=body("s", "keep me"), headers=auth)
            assert events(r.content)[-1] == "[DONE]"
            refused = await client.delete("/api/sessions/s", headers=JSON)
            wrong = await client.delete(
                "/api/sessions/s", headers={**JSON, "authorization": "Bearer nope"}
            )
            kept = await server.host.store.load("s")
            accepted = await client.delete("/api/sessions/s", headers={**JSON, **auth})
    assert (refused.status_code, wrong.status_code) == (401, 401)
    assert kept is not None
    assert accepted.status_code == 204


PREFLIGHT = {
    "access-control-request-method": "DELETE",
    "access-control-request-headers": "content-type",
}


async def test_a_delete_preflight_from_another_origin_gets_no_cors_grant(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            r = await client.options(
                "/api/sessions/s", headers={**PREFLIGHT, "origin": "http://evil.example"}
            )
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-methods" not in r.headers


async def test_a_delete_preflight_is_granted_only_to_an_allowed_cors_origin(tmp_path):
    options = {"store": str(tmp_path / "s.db"), "cors_origins": ["http://app.example"]}
    async with web_server(agent(), **options) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            allowed = await client.options(
                "/api/sessions/s", headers={**PREFLIGHT, "origin": "http://app.example"}
            )
            other = await client.options(
                "/api/sessions/s", headers={**PREFLIGHT, "origin": "http://evil.example"}
            )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    assert "DELETE" in allowed.headers["access-control-allow-methods"]
    assert "access-control-allow-origin" not in other.headers


async def test_a_delete_of_the_whole_list_is_not_an_endpoint(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            await chatted(server, client, "s")
            statuses = [
                (await client.delete(path, headers=JSON)).status_code
                for path in ("/api/sessions", "/api/sessions/", "/api/sessions/s/x")
            ]
            names = await listed(client)
    assert all(status in (404, 405, 307) for status in statuses), statuses  # (307: to the list)
    assert names == ["s"]
