"""An agent used as a tool reads its sub-session from the store once per call: the
sub-turn (``resume=True``, named by the call, so that a retry takes it over) starts from
the record its ``open_session`` just read instead of loading it again."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.memory import MemoryStore
from runtime import Agent, Host


class CountingStore(MemoryStore):
    """A memory store that counts its loads, by session."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []

    async def load(self, session_id: str):
        self.loads.append(session_id)
        return await super().load(session_id)


async def test_a_call_of_an_agent_as_tool_loads_its_sub_session_once():
    """Before: two loads of ``s.helper.H`` (the open's, then the resumed turn's)."""
    helper = Agent(name="helper", provider=ScriptedProvider([["sub"]]))
    parent = Agent(
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "x"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper.as_tool()],
    )
    store = CountingStore()
    async with Host.open(store=store, log_tap=False) as host:
        result = await (await host.open_session(parent, session_id="s")).run("go")
    assert result.text == "ok"
    assert store.loads == ["s", "s.helper.H"]
