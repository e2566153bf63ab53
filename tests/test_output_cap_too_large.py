"""A turn's output budget sends no cap above what the model may write.

An agent with ``Budget(max_output_tokens=...)`` and no per-call cap of its own sent each
call everything the turn had left as its cap. With a large budget (1,000,000, a common
safety net) the real APIs refuse the request: OpenAI 400 "max_tokens is too large:
1000000. This model supports at most 16384 completion tokens, whereas you provided
1000000." (code ``invalid_value``), and the turn failed where, without the budget, it
ran. Now the call is made once more with the cap lowered to the maximum the error names
(none sent when it names none), and later calls send that directly
(actors/turn/output_caps.py). Nothing else is retried that way. Real SDKs against the
loopback server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.providers import AnthropicProvider, OpenAIProvider
from actors.turn import output_caps
from runtime import Agent, Budget, Host
from tests.support.faults import a_body, a_end, a_start, a_text
from tests.support.loopback import Reply, loopback_server
from tests.test_output_cap_unreported import chat

KEY = "sk-test-not-a-real-key-4244"
BIG = 1_000_000
TOO_LARGE = (
    f"max_tokens is too large: {BIG}. This model supports at most 16384 completion "
    f"tokens, whereas you provided {BIG}."
)


@pytest.fixture(autouse=True)
def _fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing learnt (the memory is the process's)."""
    monkeypatch.setattr(output_caps, "KNOWN", {})
    monkeypatch.setattr(output_caps, "LEARNT", {})


def openai_400(message: str, param: str | None = "max_tokens") -> Reply:
    error = {"message": message, "type": "invalid_request_error", "param": param}
    error["code"] = "invalid_value"
    body = json.dumps({"error": error}).encode()
    return Reply(status=400, body=body, content_type="application/json")


def answer(text: str = "Hello.", finish: str = "stop", usage: int = 3) -> Reply:
    return Reply(body=chat(texts=(text,), finish=finish, usage=usage))


async def openai_turns(
    *replies: Reply, prompts: int = 1, settings: dict[str, Any] | None = None
) -> tuple[list[Any], list[dict[str, Any]]]:
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            provider = OpenAIProvider("gpt-4o", base_url=server.url + "/v1", api_key=KEY)
            agent = Agent(
                provider=provider, budget=Budget(max_output_tokens=BIG), settings=settings or {}
            )
            session = await host.open_session(agent)
            results = [await session.run(f"Question {i}.") for i in range(prompts)]
        return results, [r.json() for r in server.requests]


async def test_a_refused_budget_cap_is_lowered_to_the_models_maximum_and_remembered():
    """The first call is refused for its 1,000,000 cap, made again with 16,384 (the
    maximum the error names); the turn answers. The next turn sends 16,384 at once."""
    results, bodies = await openai_turns(
        openai_400(TOO_LARGE), answer("First."), answer("Second."), prompts=2
    )
    assert [r.error for r in results] == [None, None], results[0].error
    assert [r.text for r in results] == ["First.", "Second."]
    assert [b["max_tokens"] for b in bodies] == [BIG, 16384, 16384]


async def test_a_cut_at_the_lowered_cap_is_the_models_not_the_budgets():
    """``Step.sent`` is the cap the retry carried: a call cut there ends ``length`` (the
    model's maximum stopped it), not ``budget`` (983,616 tokens of it are left)."""
    results, bodies = await openai_turns(
        openai_400(TOO_LARGE), answer("Once upon", finish="length", usage=16384)
    )
    assert [b["max_tokens"] for b in bodies] == [BIG, 16384]
    (result,) = results
    assert result.error is None, result.error
    assert (result.finish_reason, result.budget) == ("length", None)


async def test_a_refusal_naming_no_maximum_sends_no_budget_cap():
    results, bodies = await openai_turns(
        openai_400("max_tokens is too large for this model."),
        answer("First."),
        answer("Second."),
        prompts=2,
    )
    assert [r.error for r in results] == [None, None]
    assert bodies[0]["max_tokens"] == BIG
    assert "max_tokens" not in bodies[1] and "max_completion_tokens" not in bodies[1]
    assert "max_tokens" not in bodies[2]


async def test_an_unrelated_bad_request_is_not_retried():
    bad = "Invalid value for 'temperature': must be at most 2."
    results, bodies = await openai_turns(openai_400(bad, param="temperature"), answer())
    (result,) = results
    assert result.error is not None
    assert (result.error.kind, len(bodies)) == ("BadRequest", 1)


async def test_the_lowered_call_is_made_once_only():
    """Refused again at the lowered cap (a server that lies): the turn's error, after
    two requests, not a loop."""
    again = "max_tokens is too large: 16384. This model supports at most 8192 completion tokens."
    results, bodies = await openai_turns(openai_400(TOO_LARGE), openai_400(again), answer())
    (result,) = results
    assert result.error is not None
    assert (result.error.kind, len(bodies)) == ("OutputCapTooLarge", 2)
    assert [b["max_tokens"] for b in bodies] == [BIG, 16384]


async def test_an_agents_own_cap_refused_is_its_error_not_retried():
    """``settings={"max_tokens": 2_000_000}``: the cap the request carried is the agent's
    (the budget only lowers it), refused without a budget as well."""
    mine = TOO_LARGE.replace(str(BIG), "2000000")
    results, bodies = await openai_turns(
        openai_400(mine), answer(), settings={"max_tokens": 2_000_000}
    )
    (result,) = results
    assert result.error is not None
    assert (result.error.kind, len(bodies)) == ("OutputCapTooLarge", 1)


async def test_anthropics_budget_cap_never_exceeds_its_own_max_tokens():
    """Anthropic's request always carries ``max_tokens`` (the provider's 4,096 unless
    given): a 1,000,000 budget sends that, never more, so it is never refused for it."""
    reply = Reply(body=a_body(a_start(10), a_text(0, "Hi."), a_end("end_turn", 3)))
    async with loopback_server(reply) as server:
        async with Host.open(log_tap=False) as host:
            provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key=KEY)
            agent = Agent(provider=provider, budget=Budget(max_output_tokens=BIG))
            result = await (await host.open_session(agent)).run("Hi")
        bodies = [r.json() for r in server.requests]
    assert result.error is None, result.error
    assert [b["max_tokens"] for b in bodies] == [4096]


async def test_anthropics_refusal_of_its_own_max_tokens_is_not_retried():
    message = "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens"
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    refused = Reply(status=400, body=json.dumps(body).encode(), content_type="application/json")
    async with loopback_server(refused) as server:
        async with Host.open(log_tap=False) as host:
            provider = AnthropicProvider(
                "claude-sonnet-4-5", base_url=server.url, api_key=KEY, max_tokens=100_000
            )
            agent = Agent(provider=provider, budget=Budget(max_output_tokens=BIG))
            result = await (await host.open_session(agent)).run("Hi")
        bodies = [r.json() for r in server.requests]
    assert result.error is not None
    assert (result.error.kind, [b["max_tokens"] for b in bodies]) == (
        "OutputCapTooLarge",
        [100_000],
    )


@pytest.mark.parametrize(
    ("message", "limit"),
    [
        (TOO_LARGE, 16384),
        (TOO_LARGE.replace("max_tokens", "max_completion_tokens"), 16384),
        (
            f"max_tokens: {BIG} > 64000, which is the maximum allowed number of output "
            "tokens for claude-sonnet-4-20250514",
            64000,
        ),
        (
            "The parameter `max_completion_tokens` specified in the request are not valid: "
            "integer above maximum value, expected a value <= 12288, but got 32000 instead.",
            12288,
        ),
        ("Invalid max_tokens value, the valid range of max_tokens is [1, 8192]", 8192),
        ("max_output_tokens is too large", None),
    ],
)
def test_the_refusals_wordings_are_read(message: str, limit: int | None) -> None:
    from actors.providers.failures import classify_status
    from runtime import OutputCapTooLarge

    error = classify_status(message, provider="p", status=400)
    assert isinstance(error, OutputCapTooLarge)
    assert (error.limit, error.retryable) == (limit, False)


@pytest.mark.parametrize(
    "message",
    [
        "messages: text content blocks must be non-empty",
        "'max_tokens' or 'max_completion_tokens' is too large: 64000. This model's maximum "
        "context length is 64001 tokens and your request has 24235 input tokens",
    ],
)
def test_other_refusals_are_not_read_as_a_cap_too_large(message: str) -> None:
    from actors.providers.failures import classify_status
    from runtime import OutputCapTooLarge

    assert not isinstance(classify_status(message, provider="p", status=400), OutputCapTooLarge)


async def test_the_responses_apis_refused_max_output_tokens_is_lowered_too():
    """The same path on the Responses API (``max_output_tokens``, its only cap field),
    with the "integer above maximum value" wording of OpenAI's parameter checks."""
    from actors.providers import OpenAIResponsesProvider
    from tests.test_provider_openai_responses import body, completed, created, message

    error = {
        "message": f"Invalid 'max_output_tokens': integer above maximum value. Expected a "
        f"value <= 128000, but got {BIG} instead.",
        "type": "invalid_request_error",
        "param": "max_output_tokens",
        "code": "integer_above_max_value",
    }
    refused = Reply(
        status=400, body=json.dumps({"error": error}).encode(), content_type="application/json"
    )
    ok = Reply(body=body(created(), *message(0, "msg_1", "Hello."), completed()))
    async with loopback_server(refused, ok) as server:
        async with Host.open(log_tap=False) as host:
            provider = OpenAIResponsesProvider(
                "gpt-5-mini", base_url=server.url + "/v1", api_key=KEY
            )
            agent = Agent(provider=provider, budget=Budget(max_output_tokens=BIG))
            result = await (await host.open_session(agent)).run("Hi")
        bodies = [r.json() for r in server.requests]
    assert result.error is None, result.error
    assert result.text == "Hello."
    assert [b["max_output_tokens"] for b in bodies] == [BIG, 128000]


@pytest.mark.parametrize("named", [True, False])
async def test_a_shared_accounts_reservation_is_what_the_retry_sends(
    named: bool, monkeypatch: pytest.MonkeyPatch
):
    """A sub-turn's call reserves its cap in the account it shares (``output_account``):
    the retry reserves the lowered cap (or, none sent, what is left), and all it held
    comes back but the 3 tokens written."""
    from runtime.budget import OutputAccount

    message = TOO_LARGE if named else "max_tokens is too large for this model."
    account = OutputAccount(BIG)
    wants: list[int] = []
    reserve = OutputAccount.reserve

    async def recorded(self: OutputAccount, want: int, waits: Any = None) -> int:
        wants.append(want)
        return await reserve(self, want, waits)

    monkeypatch.setattr(OutputAccount, "reserve", recorded)
    async with loopback_server(openai_400(message), answer("Hi.")) as server:
        async with Host.open(log_tap=False) as host:
            provider = OpenAIProvider("gpt-4o", base_url=server.url + "/v1", api_key=KEY)
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("Hi", max_output_tokens=BIG, output_account=account) as out:
                [c async for c in out]
        bodies = [r.json() for r in server.requests]
    assert out.result.error is None, out.result.error
    assert [b.get("max_tokens") for b in bodies] == [BIG, 16384 if named else None]
    assert wants == [BIG, 16384 if named else BIG]
    assert (account.left, account.held) == (BIG - 3, 0)
