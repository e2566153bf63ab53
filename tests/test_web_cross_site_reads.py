"""GETs of the API from another site (docs/web.md#threat-model): a page cannot read the
answer, but a ``no-cors`` fetch or an ``<img>`` made the server do the work (a page of
sessions, a session loaded) and let the page time it. Refused by the guard's rules for
state-changing requests; the page, ``--cors-origin`` apps, the address bar and clients
that are not browsers are not. Headers as a browser sends them; no browser needed (the
page itself: tests/test_web_browser*.py)."""

from __future__ import annotations

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, deployment, slow_agent
from tests.test_web_http import body
from tests.web.harness import web_server

READS = ["/api/sessions", "/api/sessions/s", "/api/info", "/api/chat/s/stream"]

CROSS_SITE = [
    {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors", "sec-fetch-dest": "image"},
    {"sec-fetch-site": "same-site", "sec-fetch-mode": "no-cors", "sec-fetch-dest": "empty"},
    {"origin": "http://evil.example", "sec-fetch-site": "cross-site", "sec-fetch-mode": "cors"},
    {"origin": "http://evil.example"},  # a browser that sends no Sec-Fetch-* headers
]


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))


class CountingReads:
    """Counts the store's reads a request makes (``list_sessions``, ``load``)."""

    def __init__(self, store: object, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for name in ("list_sessions", "load"):
            original = getattr(store, name)

            async def counted(*args: object, _original: object = original, **kw: object) -> object:
                self.calls += 1
                return await _original(*args, **kw)  # type: ignore[operator]

            monkeypatch.setattr(store, name, counted)


@pytest.mark.parametrize("headers", CROSS_SITE, ids=["cross-site", "same-site", "cors", "origin"])
async def test_a_get_of_the_api_from_another_site_is_refused_before_any_read(headers, monkeypatch):
    async with web_server(agent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("s"))
            reads = CountingReads(server.host.store, monkeypatch)
            answers = [await client.get(path, headers=headers) for path in READS]
            head = await client.head("/api/sessions", headers=headers)
    assert [r.status_code for r in answers] == [403] * len(READS)
    assert head.status_code == 403
    assert all("(CSRF protection)" in r.json()["error"] for r in answers)
    assert all("access-control-allow-origin" not in r.headers for r in answers)
    assert reads.calls == 0


async def test_a_get_of_the_api_by_the_page_the_address_bar_or_a_script_is_answered():
    page = {"sec-fetch-site": "same-origin", "sec-fetch-mode": "cors", "sec-fetch-dest": "empty"}
    typed = {"sec-fetch-site": "none", "sec-fetch-mode": "navigate", "sec-fetch-dest": "document"}
    async with web_server(agent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("s"))
            own = {**page, "origin": server.url}  # were the page to send its Origin
            answers = {
                name: [(await client.get(path, headers=h)).status_code for path in READS[:3]]
                for name, h in (("page", page), ("own", own), ("typed", typed), ("script", {}))
            }
    assert answers == {name: [200, 200, 200] for name in ("page", "own", "typed", "script")}


async def test_a_get_of_the_api_from_an_allowed_cors_origin_is_answered():
    async with web_server(agent(), cors_origins=["http://app.example"]) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("s"))
            app = {"origin": "http://app.example", "sec-fetch-site": "cross-site"}
            allowed = await client.get("/api/sessions/s", headers=app)
            # the same origin's no-cors request (an <img>) carries no Origin: refused
            image = await client.get(
                "/api/sessions/s",
                headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"},
            )
    assert allowed.status_code == 200 and allowed.json()["session_id"] == "s"
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    assert image.status_code == 403


async def test_a_get_of_the_other_protocols_from_another_site_is_refused_but_the_card_is_not():
    site = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
    async with web_server(agent(), protocols=("ai-sdk", "openai", "a2a")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            models = await client.get("/v1/models", headers=site)
            task = await client.get("/a2a/tasks/x", headers=site)
            card = await client.get("/.well-known/agent-card.json", headers=site)
            page = await client.get("/", headers=site)
            mine = await client.get("/v1/models")
    assert (models.status_code, task.status_code) == (403, 403)
    assert models.json()["error"]["type"] == "invalid_request_error"  # OpenAI's shape
    assert (card.status_code, page.status_code, mine.status_code) == (200, 200, 200)


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_get_of_a_front_ends_api_from_another_site_is_refused(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(3, 0.005)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s"))
            site = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
            refused = [(await client.get(p, headers=site)).status_code for p in READS]
            answered = [(await client.get(p)).status_code for p in READS[:3]]
    assert refused == [403] * len(READS)
    assert answered == [200, 200, 200]
