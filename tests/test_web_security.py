"""What a web page (or a stray bind) must not be able to do: the guard, over real HTTP."""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.web.guard import HostPolicy, split_host
from runtime.app.web.serve import add_serve_arguments, bind_refusal, serve_command
from tests.test_web_http import body, events
from tests.web.harness import web_server

SECRET = "my secret plans"


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(steps=[["Noted."]]))


async def nothing_ran(server: Any, session_id: str) -> bool:
    """No session opened and nothing stored for ``session_id``: the request ran no turn."""
    return session_id not in server.host.sessions and (
        await server.host.store.load(session_id) is None
    )


# -- DNS rebinding: the Host check ---------------------------------------------------------


async def test_a_foreign_host_cannot_read_the_sessions():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/api/chat", json=body("s", SECRET))
        assert events(r.content)[-1] == "[DONE]"
        port = server.url.rsplit(":", 1)[1]
        for path in ("/api/sessions", "/api/sessions/s", "/api/info", "/"):
            r = await client.get(path, headers={"host": f"attacker.example:{port}"})
            assert r.status_code == 403, path
            assert "attacker.example" in r.json()["error"]
            assert "--allowed-host attacker.example" in r.json()["error"]
            assert SECRET not in r.text


async def test_a_foreign_host_cannot_run_a_turn():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/api/chat", json=body("s"), headers={"host": "attacker.example"})
        assert r.status_code == 403
        assert await nothing_ran(server, "s")


async def test_loopback_host_names_are_answered_with_or_without_the_port():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        port = server.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
            r = await client.get("/api/sessions", headers={"host": host})
            assert r.status_code == 200, host


async def test_allowed_hosts_adds_names_to_the_loopback_ones():
    options = {"allowed_hosts": ["chat.example", "only.example:8443"]}
    async with web_server(agent(), **options) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            statuses = {
                host: (await client.get("/api/sessions", headers={"host": host})).status_code
                for host in (
                    "chat.example",
                    "CHAT.example:8000",
                    "only.example:8443",
                    "only.example:9999",
                    "other.example",
                )
            }
    assert statuses == {
        "chat.example": 200,
        "CHAT.example:8000": 200,
        "only.example:8443": 200,
        "only.example:9999": 403,
        "other.example": 403,
    }


def test_a_wildcard_bind_answers_ip_addresses_but_not_names():
    policy = HostPolicy(["0.0.0.0"])
    assert policy.allows("192.168.1.20:8000") and policy.allows("[fe80::1]:8000")
    assert not policy.allows("attacker.example:8000")


def test_a_star_turns_the_host_check_off():
    assert HostPolicy(["*"]).allows("anything.example")


def test_without_allowed_hosts_only_loopback_is_answered():
    policy = HostPolicy()
    assert policy.allows("127.0.0.5:80") and policy.allows("localhost.")
    for host in ("192.168.1.20", "127.0.0.1.attacker.example", "localhost.attacker.example", ""):
        assert not policy.allows(host), host


names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}", fullmatch=True)
ports = st.integers(min_value=1, max_value=65535)


@given(names, ports)
def test_split_host_reads_a_name_and_its_port(name, port):
    assert split_host(f"{name}:{port}") == (name, port)
    assert split_host(name) == (name, None)


@given(st.ip_addresses(v=6), ports)
def test_split_host_reads_a_bracketed_ipv6_address_and_its_port(address, port):
    assert split_host(f"[{address}]:{port}") == (str(address), port)
    assert split_host(f"[{address}]") == (str(address), None)


# -- CSRF: the Origin and content-type checks ----------------------------------------------


async def test_a_text_plain_chat_body_gets_415_and_runs_no_turn():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        raw = json.dumps(body("csrf")).encode()
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"content-type": content_type} if content_type else {}
            r = await client.post("/api/chat", content=raw, headers=headers)
            assert r.status_code == 415, content_type
            assert "application/json" in r.json()["error"]
        assert await nothing_ran(server, "csrf")


async def test_a_json_chat_body_with_a_charset_is_accepted():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        raw = json.dumps(body("s")).encode()
        headers = {"content-type": "application/json; charset=utf-8"}
        r = await client.post("/api/chat", content=raw, headers=headers)
        assert r.status_code == 200 and events(r.content)[-1] == "[DONE]"


async def test_a_cross_origin_post_is_refused_with_403_and_runs_no_turn():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
            r = await client.post("/api/chat", json=body("csrf"), headers={"origin": origin})
            assert r.status_code == 403, origin
            assert repr(origin) in r.json()["error"] and "--cors-origin" in r.json()["error"]
        assert await nothing_ran(server, "csrf")


@pytest.mark.parametrize("origin", ["http://[::1", "http://[::1:80", "https://[zz"])
async def test_an_origin_that_is_no_url_is_refused_with_403_not_a_500(origin):
    # urlsplit raised ValueError ("Invalid IPv6 URL") out of the guard: a 500 with no
    # body, for any path, from one header (found by tests/test_body_fuzz_busy.py).
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/api/chat", json=body("csrf"), headers={"origin": origin})
        assert r.status_code == 403, r.text
        assert repr(origin) in r.json()["error"]
        assert await nothing_ran(server, "csrf")


async def test_a_cross_site_post_without_an_origin_is_refused():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        for site in ("cross-site", "same-site"):
            r = await client.post("/api/chat", json=body("csrf"), headers={"sec-fetch-site": site})
            assert r.status_code == 403, site
            assert "cross-site request refused" in r.json()["error"]
        assert await nothing_ran(server, "csrf")


async def test_a_post_from_the_page_s_own_origin_is_accepted():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        headers = {"origin": server.url, "sec-fetch-site": "same-origin"}
        r = await client.post("/api/chat", json=body("s"), headers=headers)
        assert r.status_code == 200 and events(r.content)[-1] == "[DONE]"


async def test_a_post_from_an_allowed_cors_origin_is_accepted():
    async with web_server(agent(), cors_origins=["http://app.example"]) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            headers = {"origin": "http://app.example", "sec-fetch-site": "cross-site"}
            r = await client.post("/api/chat", json=body("s"), headers=headers)
            assert r.status_code == 200 and events(r.content)[-1] == "[DONE]"


# -- the serve command ---------------------------------------------------------------------


def serve_args(*argv: str) -> argparse.Namespace:
    return add_serve_arguments(argparse.ArgumentParser()).parse_args(list(argv))


async def test_serve_refuses_a_public_bind_without_a_token(capsys, monkeypatch):
    monkeypatch.delenv("AXON_WEB_TOKEN", raising=False)
    assert await serve_command(serve_args("--host", "0.0.0.0", "--port", "0")) == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0 without --token" in err and "--insecure" in err


@pytest.mark.parametrize(
    ("host", "token", "insecure"),
    [
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("0.0.0.0", "t", False),
        ("0.0.0.0", None, True),
        ("192.168.1.20", None, True),
    ],
)
def test_bind_refusal_lets_loopback_a_token_or_insecure_through(host, token, insecure):
    assert bind_refusal(host, token, insecure) is None


@pytest.mark.parametrize("host", ["127.0.0.1.", "localhost.", "no-such-host.invalid"])
def test_serve_on_a_host_that_resolves_to_nothing_is_one_error_line(host, capsys):
    from runtime.app.cli import main

    assert main(["serve", "--host", host, "--port", "0", "--token", "t"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot serve on {host}:0: ") and err.count("\n") == 1


def test_serve_on_a_port_in_use_is_one_error_line(capsys):
    import socket

    from runtime.app.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot serve on 127.0.0.1:{port}: ") and err.count("\n") == 1


def test_loopback_is_decided_on_the_address_a_host_resolves_to():
    assert bind_refusal("localhost", None, False) is None
    assert bind_refusal("127.1", None, False) is None  # the kernel's spelling of 127.0.0.1
    assert bind_refusal("127.0.0.1.", None, False) is not None


def test_serve_parser_defaults_for_the_new_guards():
    args = serve_args()
    assert (args.allowed_host, args.insecure, args.body_timeout, args.send_timeout) == (
        [],
        False,
        30.0,
        60.0,
    )
    args = serve_args("--allowed-host", "a.example", "--allowed-host", "b.example")
    assert args.allowed_host == ["a.example", "b.example"]
