"""A claiming host (twinearly) refuses a turn as answered elsewhere only when another
user message holds its id (branch ``attack2``).

A new turn's user message gets a new id when the session holds a message of the
client's id already (``runner._user_id``). twinearly's claim read any such change as
"its twin was stored by another process" and refused the turn. But the id may be an
answer's or a tool result's (a client naming its message as an assistant message it
was shown): no twin, the message never answered; a host that does not claim runs it."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_sqlite_twin_claims import _meet, _text
from tests.test_web_http import body
from tests.web.harness import two_web_servers


async def test_a_message_named_as_an_earlier_answer_is_answered_on_a_claiming_host(tmp_path):
    db = str(tmp_path / "one.db")
    async with two_web_servers(
        Agent(provider=ScriptedProvider(steps=[["From A."]])),
        Agent(provider=ScriptedProvider(steps=[["From B."]])),
        store=db,
    ) as (a, _b, to_a, to_b):
        await _meet(to_a, to_b)
        assert a.host.claims_turns
        stored = await a.host.store.load("s")
        answer_id = stored.messages[-1].id  # an assistant message's
        reply = await to_a.post("/api/chat", json=body("s", "new one", message_id=answer_id))
        record = await a.host.store.load("s")
    assert _text(reply.content) == "From A."
    assert [m.text for m in record.messages[-2:]] == ["new one", "From A."]
