"""What leaves ``async with Host.open()``: the error the block raised, not a group of one;
and an agent that cannot run is refused when its session is opened."""

from __future__ import annotations

import pytest

from runtime import Agent, ConfigurationError, Host, ToolDefinitionError


async def test_an_agent_without_a_provider_is_refused_naming_it():
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ConfigurationError, match="agent 'helper' has no provider"):
            await host.open_session(Agent(name="helper"))
        assert host.sessions == {}


async def test_an_error_raised_in_the_block_leaves_it_unwrapped():
    with pytest.raises(ToolDefinitionError, match="clash") as caught:
        async with Host.open(log_tap=False):
            raise ToolDefinitionError("clash")
    assert caught.type is ToolDefinitionError  # not an ExceptionGroup holding it


async def test_the_unwrapped_error_keeps_its_cause():
    with pytest.raises(ToolDefinitionError) as caught:
        async with Host.open(log_tap=False):
            try:
                raise KeyError("add")
            except KeyError as exc:
                raise ToolDefinitionError("clash") from exc
    assert isinstance(caught.value.__cause__, KeyError)


async def test_two_errors_stay_a_group():
    async def fail(message: str) -> None:
        raise ValueError(message)

    with pytest.RaisesGroup(ValueError, ValueError, flatten_subgroups=True):
        async with Host.open(log_tap=False) as host:
            host.nursery.start_soon(fail, "one")  # runs while the host closes
            raise ValueError("two")
