"""A tool gets its own copy of the call's input (branch ``longturn2``, journal
``benchmarks/journal/pipeline.md``): :func:`runtime.tools.own_input`.

The input is what the model sent; the history's call part holds it and every later
request sends it again. Pydantic hands an ``Any`` parameter, and the values inside a
``dict`` one, the very objects of the part. A tool that kept one and changed it after
its step's save changed the history in memory only: the store had the call as it came
(a step's save encodes each part once, ``serde.message_json``), so the session's next
request from this process differed from the one after a reload."""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

from actors.providers import openai
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool
from runtime.history import repair
from runtime.messages import AssistantMessage, ToolCallPart
from runtime.tools import own_input

kept: list[Any] = []

NESTED = {"items": {"tags": ["a", "b"]}}
WHOLE = {"value": {"tags": ["c"]}}
"""The inputs the model sends (each call is given a copy)."""
# (the model's inputs are copies of these: tool_call below is given a copy of each)


@tool
def keep_dict(items: dict) -> str:
    """Keeps its argument (a ``dict``: pydantic copies its top level only)."""
    kept.append(items["tags"])
    return "kept"


@tool
def keep_any(value: Any) -> str:
    """Keeps its argument (``Any``: pydantic hands the object itself)."""
    kept.append(value)
    return "kept"


@tool
def spoil() -> str:
    """Changes what the earlier calls kept, after their step was saved."""
    for thing in kept:
        if isinstance(thing, list):
            thing.append("spoiled")
        else:
            thing["spoiled"] = True
    return "spoiled"


class Recorder:
    """A model: the turn's steps, then an answer to anything; each request kept."""

    def __init__(self, steps: list[list[Any]]) -> None:
        self.steps, self.requests = steps, []

    def __call__(self, request: Any) -> list[Any]:
        self.requests.append(request)
        return self.steps.pop(0) if self.steps else ["ok"]


def agent(model: Recorder) -> Agent:
    return Agent(provider=ScriptedProvider(responder=model), tools=[keep_dict, keep_any, spoil])


def body(request: Any) -> list[dict[str, Any]]:
    """What an OpenAI-compatible server is sent of the request's history."""
    return openai.map_messages(None, request.messages)


@pytest.fixture(autouse=True)
def _nothing_kept() -> None:
    kept.clear()


async def test_the_next_request_is_the_same_from_this_process_and_after_a_reload(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    steps = [
        [
            *tool_call("keep_dict", deepcopy(NESTED), tool_call_id="k1"),
            *tool_call("keep_any", deepcopy(WHOLE), tool_call_id="k2"),
        ],
        ["done"],
        # the next turn: its tool changes what the first turn's kept, long saved
        [*tool_call("spoil", {}, tool_call_id="s")],
        ["spoiled"],
    ]
    model = Recorder(steps)
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(agent(model), session_id="s")
        assert (await session.run("go")).text == "done"
        assert (await session.run("spoil it")).text == "spoiled"
        assert len(kept) == 2 and all("spoiled" in str(thing) for thing in kept)
        await session.run("again")
    here = model.requests[-1]
    async with Host.open(store=db, log_tap=False) as host:  # another process: the store's
        stored = (await host.store.load("s")).messages
    # the same request made from the reloaded history: up to its "again" (not its answer)
    assert isinstance(stored[-1], AssistantMessage) and stored[-1].text == "ok"
    assert body(here) == openai.map_messages(None, repair(stored[:-1]))
    # ... and both send the calls as the model wrote them
    answer = next(m for m in here.messages if isinstance(m, AssistantMessage))
    inputs = [p.input for p in answer.content if isinstance(p, ToolCallPart)]
    assert inputs == [NESTED, WHOLE]


@pytest.mark.parametrize("rule_changes", ["top", "nested"])
async def test_an_approval_rule_that_changes_its_arguments_leaves_the_call_as_sent(
    tmp_path: Path, rule_changes: str
) -> None:
    def rule(arguments: dict[str, Any], context: Any) -> bool:
        if rule_changes == "top":
            arguments["value"]["by_rule"] = True
        else:
            arguments["items"]["tags"].append("by rule")
        return False

    keep_d = tool(keep_dict.function, name="keep_dict", needs_approval=rule)
    keep_a = tool(keep_any.function, name="keep_any", needs_approval=rule)
    steps = [
        [
            *tool_call(
                "keep_dict" if rule_changes == "nested" else "keep_any",
                deepcopy(NESTED if rule_changes == "nested" else WHOLE),
                tool_call_id="k",
            ),
        ],
        ["done"],
    ]
    model = Recorder(steps)
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(responder=model), tools=[keep_d, keep_a]),
            session_id="s",
        )
        assert (await session.run("go")).text == "done"
    answer = next(m for m in model.requests[1].messages if isinstance(m, AssistantMessage))
    (part,) = answer.content
    assert isinstance(part, ToolCallPart)
    assert part.input == (NESTED if rule_changes == "nested" else WHOLE)


def test_own_input_copies_every_dict_and_list_and_shares_the_rest() -> None:
    text = "x" * 100
    given = {"a": [{"b": (1, [2])}, text], "n": None}
    copied = own_input(given)
    assert copied == given
    assert copied is not given and copied["a"] is not given["a"]
    assert copied["a"][0] is not given["a"][0]
    assert copied["a"][0]["b"][1] is not given["a"][0]["b"][1]
    assert copied["a"][1] is text  # immutable: shared
    assert own_input("not json") == "not json"
