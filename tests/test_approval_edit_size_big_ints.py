"""An edit's size counted as the model reads its JSON (docs/approval.md, "Approving with
edits"): the JSON stored for an edit holds a mark (a tab) before each integer past 64
bits, and ``_check_size`` counted it as a character on both sides of its comparison: an
edit with such an integer was refused one character early per integer, and a model input
with one let an edit one character longer past."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, EditTooLarge, Host, tool

BIG = 123456789012345678901234567890
AT_BIG = len('{"amount":%d}' % BIG)  # noqa: UP031  (42: the JSON the model reads)


@tool(needs_approval=True)
async def pay(amount: int, memo: str = "") -> str:
    """Pays an amount."""
    return f"paid {amount}"


def payer(model_input: dict[str, Any], max_chars: int) -> Agent:
    """An agent whose model calls ``pay`` with ``model_input``, its edits bounded by
    ``max_chars``."""
    return Agent(
        provider=ScriptedProvider([[*tool_call("pay", model_input)], ["done"]]),
        tools=[pay],
        budget=Budget(max_tool_result_chars=max_chars),
    )


async def test_an_edit_holding_an_integer_past_64_bits_at_the_limit_is_taken(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(payer({"amount": 1}, AT_BIG), session_id="s")
        (pending,) = (await session.run("hi")).pending
        result = await session.respond(
            pending.approval_id, approved=True, edited_input={"amount": BIG}
        )
    assert result is not None and result.text == "done"


async def test_a_model_input_holding_an_integer_past_64_bits_bounds_an_edit_at_its_length(
    tmp_path,
):
    """The model wrote ``{"amount": BIG}`` (42 characters); the limit is 20: an edit of
    43 characters without a big integer is refused (it was taken: the model's input
    counted 43 with its mark)."""
    edit = {"amount": 1, "memo": "x" * (AT_BIG + 1 - len(orjson.dumps({"amount": 1, "memo": ""})))}
    assert len(orjson.dumps(edit)) == AT_BIG + 1
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(payer({"amount": BIG}, 20), session_id="s")
        (pending,) = (await session.run("hi")).pending
        with pytest.raises(EditTooLarge) as caught:
            await session.respond(pending.approval_id, approved=True, edited_input=edit)
    assert (caught.value.size, caught.value.limit) == (AT_BIG + 1, AT_BIG)
