"""The approval HTTP paths attacked as a web attacker would (docs/approval.md, "Signed
approvals"; runtime/app/web/guard.py): an approval POSTed from another site (its
``Origin``, ``Sec-Fetch-Site``, a form's content type), through a forged ``Host`` (DNS
rebinding), with a signature made for an edited input, a near-miss signature (the
compare is :func:`hmac.compare_digest`), a huge one, and the secret looked for in every
refusal and log line. Each refused answer records nothing: the call still waits and
the tool has not run; the same answer sent as the page sends it then goes through, so
each refusal is the attack's, not the answer's."""

from __future__ import annotations

import hmac
import logging
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent
from runtime.app.web.signing import SIGNATURE_MAX, ApprovalSigner
from runtime.approval import pending_calls
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)
from tests.test_agui import post as agui_post
from tests.test_agui import run, run_input, user
from tests.test_approval_web import answer, approval_part, request_of
from tests.test_web_http import body, events
from tests.web.harness import web_server

SECRET = "Marmalade-Gyroscope-Fjord-7"
SIGNER = ApprovalSigner(secret=SECRET.encode())


def agent() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


async def asked(client: httpx.AsyncClient) -> tuple[str, dict[str, Any]]:
    """Start session ``s``'s turn: its message id and its approval request."""
    first = events((await client.post("/api/chat", json=body("s"))).content)
    return first[0]["messageId"], request_of(first)


def signed_answer(message_id: str, request: dict[str, Any], **part: Any) -> dict[str, Any]:
    approval = approval_part(request["approvalId"], True, signature=request["signature"])
    return answer("s", message_id, {**approval, **part})


async def still_waits(client: httpx.AsyncClient) -> bool:
    return (await client.get("/api/sessions/s")).json()["waiting"] == 1 and ran == []


# -- cross-site ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "https://evil.example"},
        {"origin": "null"},  # a sandboxed frame, a data: page
        {"origin": "http://127.0.0.1.evil.example"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},  # a sibling subdomain is another origin
    ],
    ids=["origin", "null-origin", "lookalike-origin", "cross-site", "same-site"],
)
async def test_an_approval_posted_from_another_site_is_refused_and_records_nothing(
    tmp_path, headers
):
    async with web_server(agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            message_id, request = await asked(client)
            sent = signed_answer(message_id, request)
            refused = await client.post("/api/chat", json=sent, headers=headers)
            assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
            assert await still_waits(client)
            own = {"origin": srv.url, "sec-fetch-site": "same-origin"}  # the page itself
            done = await client.post("/api/chat", json=sent, headers=own)
    assert done.status_code == 200 and ran == ["/x"]


async def test_an_approval_sent_as_a_form_or_text_body_is_refused(tmp_path):
    """A page can send ``text/plain`` or a form to any site without a preflight; the
    continuation must be JSON, which needs one (415, nothing recorded)."""
    import orjson

    async with web_server(agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            message_id, request = await asked(client)
            raw = orjson.dumps(signed_answer(message_id, request))
            for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
                refused = await client.post(
                    "/api/chat", content=raw, headers={"content-type": kind}
                )
                assert refused.status_code == 415, (kind, refused.status_code)
            assert await still_waits(client)


async def test_an_agui_resume_from_another_site_is_refused_and_decides_nothing():
    async with web_server(agent(), protocols=("ag-ui",), approval_secret=SECRET) as srv:
        first = await run(srv, run_input("t", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        resume = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
        ]
        sent = run_input("t", user("go", "m1"), resume=resume, runId="r2")
        refused = await agui_post(srv, sent, origin="https://evil.example")
        record = await srv.host.store.load("t")
        assert refused.status_code == 403 and ran == []
        assert record is not None and len(pending_calls(record.messages)) == 1
        await run(srv, sent)  # (as a client of its own sends it)
    assert ran == ["/x"]


# -- a forged Host (DNS rebinding) --------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "localhost.evil.example"]
)
async def test_an_approval_through_a_forged_host_is_refused_and_records_nothing(tmp_path, host):
    async with web_server(agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            message_id, request = await asked(client)
            sent = signed_answer(message_id, request)
            # a rebound page is same-origin with itself: Origin names the forged host too
            for headers in ({"host": host}, {"host": host, "origin": f"http://{host}"}):
                refused = await client.post("/api/chat", json=sent, headers=headers)
                assert refused.status_code == 403 and "DNS rebinding" in refused.json()["error"]
            assert await still_waits(client)
            done = await client.post("/api/chat", json=sent)
    assert done.status_code == 200 and ran == ["/x"]


# -- the signature ------------------------------------------------------------------------


async def test_a_signature_made_for_an_edited_input_is_refused(tmp_path):
    """A signature is bound to the input the store holds: one made (with the right key)
    over another input does not approve the stored call, whether the part carries the
    edited input (400: not the call) or no input at all (403: the signature)."""
    async with web_server(agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            message_id, request = await asked(client)
            edited = {"path": "/etc"}
            forged = SIGNER.sign("s", request["approvalId"], "D", "delete_file", edited)
            with_input = signed_answer(message_id, request, input=edited)
            with_input["messages"][-1]["parts"][1]["approval"]["signature"] = forged
            without = signed_answer(message_id, request)
            del without["messages"][-1]["parts"][1]["input"]
            without["messages"][-1]["parts"][1]["approval"]["signature"] = forged
            codes = [
                (await client.post("/api/chat", json=x)).status_code for x in (with_input, without)
            ]
            assert codes == [400, 403]
            assert await still_waits(client)


async def test_signatures_are_compared_in_constant_time(tmp_path, monkeypatch):
    """Every check goes through :func:`hmac.compare_digest` (not ``==``, whose time
    tells how much of a guess was right): a signature one character off is refused,
    and the compare was the constant-time one."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counted(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    async with web_server(agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            message_id, request = await asked(client)
            good = request["signature"]
            near = good[:-1] + ("A" if good[-1] != "A" else "B")
            sent = signed_answer(message_id, request)
            sent["messages"][-1]["parts"][1]["approval"]["signature"] = near
            monkeypatch.setattr(hmac, "compare_digest", counted)
            refused = await client.post("/api/chat", json=sent)
            assert refused.status_code == 403 and await still_waits(client)
    assert compared and all(b == near.encode() for _, b in compared)


@pytest.mark.parametrize("size", [SIGNATURE_MAX + 1, 4_000_000])
async def test_a_huge_signature_is_refused_unread(tmp_path, monkeypatch, size):
    """A signature past :data:`SIGNATURE_MAX` (every real one is 43 characters) is
    refused before any digest is made or the string copied, and is echoed nowhere."""
    digests: list[Any] = []
    real = hmac.new

    def counted(*args: Any, **kwargs: Any) -> Any:
        digests.append(args)
        return real(*args, **kwargs)

    async with web_server(
        agent(), store=str(tmp_path / "w.db"), approval_secret=SECRET, max_body=16 * 2**20
    ) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            message_id, request = await asked(client)
            sent = signed_answer(message_id, request)
            sent["messages"][-1]["parts"][1]["approval"]["signature"] = "A" * size
            monkeypatch.setattr(hmac, "new", counted)
            refused = await client.post("/api/chat", json=sent)
            monkeypatch.undo()
            assert refused.status_code == 403 and len(refused.text) < 1_000
            assert await still_waits(client)
    assert digests == []


async def test_no_refusal_or_log_line_of_the_approval_paths_holds_the_secret(tmp_path, caplog):
    """The requirement's refusal, a forged and a huge signature, a cross-site and a
    forged-Host POST: the secret in none of their answers or log records (DEBUG)."""
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with web_server(
        agent(),
        store=str(tmp_path / "w.db"),
        approval_secret=SECRET,
        require_approval_signature=True,
    ) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            message_id, request = await asked(client)
            unsigned = signed_answer(message_id, request)
            del unsigned["messages"][-1]["parts"][1]["approval"]["signature"]
            forged = signed_answer(message_id, request)
            forged["messages"][-1]["parts"][1]["approval"]["signature"] = "B" * 43
            huge = signed_answer(message_id, request)
            huge["messages"][-1]["parts"][1]["approval"]["signature"] = "C" * 100_000
            good = signed_answer(message_id, request)
            for sent, headers in (
                (unsigned, {}),
                (forged, {}),
                (huge, {}),
                (good, {"origin": "https://evil.example"}),
                (good, {"host": "evil.example"}),
            ):
                response = await client.post("/api/chat", json=sent, headers=headers)
                assert response.status_code == 403
                seen.append(response.text)
            assert await still_waits(client)
    seen += [r.getMessage() for r in caplog.records] + [str(r.args) for r in caplog.records]
    leaked = [s[:200] for s in seen if SECRET in s or SECRET.encode().hex() in s]
    assert leaked == [] and len(seen) > 5
