"""A real browser as the attacker: Debian's Chromium, driven by Playwright for Python.

* CSRF: a page on another origin (a second loopback server) posts to ``/api/chat`` the
  ways a page may without asking: a ``text/plain`` form and a ``no-cors`` fetch. No turn
  may run.
* DNS rebinding: Chromium resolves ``attacker.test`` to 127.0.0.1
  (``--host-resolver-rules``), as a rebinding attacker's DNS does after the first answer;
  a script running in the origin ``http://attacker.test:PORT`` fetches ``/api/sessions``
  (same-origin to the browser): it must not read it.

Skips like tests/test_web_browser.py without playwright or Chromium.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest
import trio
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.web.guard import RequestGuard
from runtime.app.web.serve import serve_app
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS, playwright_sync  # noqa: F401
from tests.test_web_http import body
from tests.web.harness import WebServer, web_server

SECRET = "my secret plans"

CSRF_PAGE = """<!doctype html><title>cat pictures</title>
<form id="form" method="POST" action="{target}/api/chat" enctype="text/plain">
<input type="hidden"
  name='{{"id": "csrf-form", "messages": [{{"role": "user", "content": "run the tools", "x": "'
  value='"}}]}}'>
</form>
<script>
window.noCors = fetch("{target}/api/chat", {{
  method: "POST", mode: "no-cors", headers: {{"content-type": "text/plain"}},
  body: JSON.stringify(
    {{id: "csrf-fetch", messages: [{{role: "user", content: "run the tools"}}]}}),
}}).then((r) => r.type, (e) => "failed: " + e);
</script>"""


def launch(sync_api: Any, p: Any, *extra: str) -> Any:
    try:
        return p.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *extra])
    except Exception as exc:  # an unusable browser build: not this project's failure
        pytest.skip(f"Chromium at {CHROMIUM} did not start under Playwright: {exc}")


def csrf_attack(sync_api: Any, attacker_url: str, target: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"statuses": []}
    with sync_api.sync_playwright() as p:
        browser = launch(sync_api, p)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.on(
                "response",
                lambda r: r.url.startswith(target) and seen["statuses"].append(r.status),
            )
            page.goto(attacker_url + "/")
            seen["no_cors"] = page.evaluate("window.noCors")
            with page.expect_navigation():
                page.evaluate("document.getElementById('form').submit()")
            seen["form_answer"] = page.locator("body").inner_text()
        finally:
            browser.close()
    return seen


async def serve_page(nursery: trio.Nursery, html: str) -> str:
    """Serve ``html`` at ``/`` of a second loopback server (another origin); its URL."""

    async def index(request: Any) -> HTMLResponse:
        return HTMLResponse(html)

    app = Starlette(routes=[Route("/", index)])
    binds = await nursery.start(partial(serve_app, app, host="127.0.0.1", port=0))
    return binds[0]


async def nothing_ran(server: WebServer, *session_ids: str) -> bool:
    for sid in session_ids:
        if sid in server.host.sessions or await server.host.store.load(sid) is not None:
            return False
    return True


async def test_a_cross_origin_page_cannot_run_a_turn(playwright_sync):  # noqa: F811
    agent = Agent(provider=ScriptedProvider(steps=[["Ran."]]))
    async with web_server(agent) as server, trio.open_nursery() as nursery:
        attacker_url = await serve_page(nursery, CSRF_PAGE.format(target=server.url))
        with trio.fail_after(60):
            seen = await trio.to_thread.run_sync(
                csrf_attack, playwright_sync, attacker_url, server.url
            )
        ran_nothing = await nothing_ran(server, "csrf-form", "csrf-fetch")
        nursery.cancel_scope.cancel()

    assert ran_nothing
    assert seen["statuses"] == [403, 403]  # both requests reached the server: refused
    assert seen["no_cors"] == "opaque"
    assert "cross-origin request from" in seen["form_answer"]
    assert "refused" in seen["form_answer"]


def rebinding_attack(sync_api: Any, port: str) -> dict[str, Any]:
    origin = f"http://attacker.test:{port}"
    with sync_api.sync_playwright() as p:
        browser = launch(sync_api, p, "--host-resolver-rules=MAP attacker.test 127.0.0.1")
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            # After the rebinding, the name leads to the Axon server: whatever that answers
            # at "/", the script below runs in the origin http://attacker.test:PORT, as the
            # attacker's page would. (Serving the page from elsewhere first would make it a
            # public page fetching from loopback, which Chromium's Private Network Access
            # blocks on its own; other browsers do not.)
            page.goto(origin + "/")
            return page.evaluate(
                """async () => {
                  const r = await fetch("/api/sessions");
                  return {status: r.status, text: await r.text(), url: r.url};
                }"""
            )
        finally:
            browser.close()


async def test_a_rebinding_page_cannot_read_the_sessions(playwright_sync):  # noqa: F811
    agent = Agent(provider=ScriptedProvider(steps=[["Noted."]]))
    async with web_server(agent) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("mine", SECRET))
            assert r.status_code == 200
            listed = (await client.get("/api/sessions")).text
        assert SECRET in listed  # there is something to steal
        port = server.url.rsplit(":", 1)[1]
        with trio.fail_after(60):
            answer = await trio.to_thread.run_sync(rebinding_attack, playwright_sync, port)

    assert answer["url"] == f"http://attacker.test:{port}/api/sessions"
    assert answer["status"] == 403
    assert SECRET not in answer["text"]
    assert "not allowed (DNS rebinding protection)" in answer["text"]


READ_PAGE = """<!doctype html><title>cat pictures</title>
<img id="img" src="{target}/api/sessions/mine">
<script>
window.reads = Promise.all([
  fetch("{target}/api/sessions", {{mode: "no-cors"}}).then((r) => r.type, (e) => "" + e),
  new Promise((done) => {{
    const img = document.getElementById("img");
    if (img.complete) done("settled"); else img.onerror = img.onload = () => done("settled");
  }}),
]);
</script>"""


def cross_site_reads(sync_api: Any, attacker_url: str) -> Any:
    with sync_api.sync_playwright() as p:
        browser = launch(sync_api, p)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.goto(attacker_url + "/")
            return page.evaluate("window.reads")
        finally:
            browser.close()


async def test_a_page_on_another_site_cannot_make_the_server_read_the_sessions(
    playwright_sync,  # noqa: F811
    monkeypatch,
):
    # A no-cors fetch and an <img> reached GET /api/sessions and GET /api/sessions/{id}:
    # unreadable to the page, but the server paged the store and loaded the session.
    agent = Agent(provider=ScriptedProvider(steps=[["Noted."]]))
    async with web_server(agent) as server, trio.open_nursery() as nursery:
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.post("/api/chat", json=body("mine", SECRET))).status_code == 200
        reads: list[str] = []
        for name in ("list_sessions", "load"):
            original = getattr(server.host.store, name)

            async def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
                reads.append(_name)
                return await _original(*args)

            monkeypatch.setattr(server.host.store, name, counted)
        seen: list[tuple[str, str | None, int | None]] = []
        refusal = RequestGuard.refusal

        def noted(self: RequestGuard, scope: Any) -> Any:
            answer = refusal(self, scope)
            site = dict(scope["headers"]).get(b"sec-fetch-site", b"").decode()
            seen.append((scope["path"], site, answer and answer[0]))
            return answer

        monkeypatch.setattr(RequestGuard, "refusal", noted)
        attacker_url = await serve_page(nursery, READ_PAGE.format(target=server.url))
        # localhost and 127.0.0.1 are different sites: Sec-Fetch-Site: cross-site
        attacker_url = attacker_url.replace("127.0.0.1", "localhost")
        with trio.fail_after(60):
            settled = await trio.to_thread.run_sync(cross_site_reads, playwright_sync, attacker_url)
        nursery.cancel_scope.cancel()

    assert settled == ["opaque", "settled"]
    target = sorted(s for s in seen if s[0].startswith("/api/"))
    assert target == [
        ("/api/sessions", "cross-site", 403),
        ("/api/sessions/mine", "cross-site", 403),
    ]
    assert reads == []
