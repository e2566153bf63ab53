"""A2AAgent closes the event stream it reads a remote task from when the task ends: the
stream's reader (an async generator) was left to the garbage collector, and Trio warned
of it (a ResourceWarning, seen under ``-W default``: the docs' A2A example printed it).
httpx's generators under it warn the same whenever a response is left before its end,
in any client of httpx under Trio: theirs, not counted here."""

from __future__ import annotations

import gc
import warnings

from actors.a2a import A2AAgent
from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from tests.test_a2a import BOTH, lead_agent
from tests.web.harness import web_server


async def test_a_remote_tasks_event_stream_is_closed_when_the_task_ends():
    researcher = Agent(name="researcher", provider=ScriptedProvider(["Trio is structured."]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        async with web_server(researcher, protocols=BOTH, token="tok") as server:
            remote = A2AAgent(server.url, token="tok").as_tool(name="researcher")
            async with Host.open(log_tap=False) as host:
                session = await host.open_session(lead_agent(remote), session_id="p")
                async with session.stream("explain trio") as out:
                    [_ async for _ in out]
            gc.collect()
    assert out.result.text == "Summary: Trio is structured."
    ours = [str(w.message) for w in caught if "'actors." in str(w.message)]
    assert ours == []  # (httpx's own generators below it are left as httpx leaves them)
