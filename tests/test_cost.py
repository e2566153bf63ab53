"""Cost: every model call priced from the ``genai-prices`` table into the usage of its
step and turn (sub-agents included), ``Budget(max_cost=...)``, and where the cost shows
(the ``finish`` chunk, OpenTelemetry, the AI SDK stream, ``show``).

Prices are checked against the table itself (``genai_prices.calc_price``), never against
numbers written here: the table is maintained and its prices change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from genai_prices import Usage as TableUsage
from genai_prices import calc_price

from actors.providers import AnthropicProvider, OpenAIProvider
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host, Usage, tool
from runtime.messages import AssistantMessage, TextPart, UserMessage
from runtime.pricing import PriceKey, cost_of, load_prices
from tests.support.faults import a_body, a_start, a_text, oa_text, rig
from tests.support.loopback import Reply

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def prices_loaded() -> None:
    """Load the table up front: the runtime loads it in a worker thread on the first
    priced call, which an autojump clock would take for idle time."""
    assert load_prices()


def table(model: str, provider: str, **counts: int) -> float:
    return float(calc_price(TableUsage(**counts), model, provider_id=provider).total_price)


# -- sums ----------------------------------------------------------------------------------


def test_a_sum_holding_a_call_of_unknown_cost_has_an_unknown_cost():
    priced = Usage(input_tokens=10, output_tokens=5, total_tokens=15, cost=0.25)
    unknown = Usage(input_tokens=10, output_tokens=5, total_tokens=15)
    assert (priced + priced).cost == 0.5
    assert (priced + unknown).cost is None and (unknown + priced).cost is None


def test_usage_without_tokens_adds_nothing_to_a_cost():
    priced = Usage(input_tokens=10, output_tokens=5, total_tokens=15, cost=0.25)
    assert (Usage() + priced).cost == 0.25 and (priced + Usage()).cost == 0.25
    assert (Usage() + Usage()).cost is None


# -- the table -----------------------------------------------------------------------------


def test_a_listed_model_is_priced_as_the_table_prices_it():
    usage = Usage(input_tokens=1000, output_tokens=500, total_tokens=1500)
    cost = cost_of(usage, PriceKey(model="gpt-4o-mini", provider_id="openai"))
    assert cost == table("gpt-4o-mini", "openai", input_tokens=1000, output_tokens=500) > 0


def test_an_unlisted_model_has_no_cost_not_a_guess():
    usage = Usage(input_tokens=1000, output_tokens=500, total_tokens=1500)
    assert cost_of(usage, PriceKey(model="my-finetune-7b", provider_id="openai")) is None


def test_openai_cached_input_is_priced_at_the_cache_read_rate():
    # OpenAI's input count includes the cached tokens
    cached = Usage(input_tokens=1000, output_tokens=0, cache_read=800)
    cost = cost_of(cached, PriceKey(model="gpt-4o-mini", provider_id="openai"))
    expected = table("gpt-4o-mini", "openai", input_tokens=1000, cache_read_tokens=800)
    uncached = table("gpt-4o-mini", "openai", input_tokens=1000)
    assert cost == expected < uncached


def test_anthropic_cache_reads_and_writes_are_priced_on_top_of_its_input_count():
    # Anthropic's input count leaves cache reads and writes out; the table's includes them
    usage = Usage(input_tokens=100, output_tokens=10, cache_read=1000, cache_write=200)
    key = PriceKey(model="claude-sonnet-4-5", provider_id="anthropic", input_includes_cache=False)
    expected = table(
        "claude-sonnet-4-5",
        "anthropic",
        input_tokens=1300,
        output_tokens=10,
        cache_read_tokens=1000,
        cache_write_tokens=200,
    )
    assert cost_of(usage, key) == expected
    assert expected != table("claude-sonnet-4-5", "anthropic", input_tokens=1300, output_tokens=10)


def test_reasoning_tokens_are_priced_at_their_own_rate_where_the_table_has_one():
    key = PriceKey(model="sonar-deep-research", provider_id="perplexity")
    plain = Usage(input_tokens=1000, output_tokens=1000)
    reasoning = Usage(input_tokens=1000, output_tokens=1000, reasoning_tokens=500)
    assert cost_of(reasoning, key) == table(
        "sonar-deep-research",
        "perplexity",
        input_tokens=1000,
        output_tokens=1000,
        output_reasoning_tokens=500,
    )
    assert cost_of(reasoning, key) != cost_of(plain, key)


def test_counts_the_table_refuses_give_no_cost():
    usage = Usage(input_tokens=10, output_tokens=5, cache_read=50)  # more than the input
    assert cost_of(usage, PriceKey(model="gpt-4o-mini", provider_id="openai")) is None


# -- which calls a provider prices ---------------------------------------------------------


def test_the_vendors_own_endpoint_is_priced_as_the_vendor():
    assert OpenAIProvider("gpt-4o").price_key() == PriceKey(model="gpt-4o", provider_id="openai")
    key = AnthropicProvider("claude-sonnet-4-5").price_key()
    assert key == PriceKey(
        model="claude-sonnet-4-5", provider_id="anthropic", input_includes_cache=False
    )


def test_another_known_endpoint_is_priced_as_the_table_knows_it():
    provider = OpenAIProvider("llama-3.3-70b-versatile", base_url="https://api.groq.com/openai/v1")
    key = provider.price_key()
    assert key is not None and key.api_url == "https://api.groq.com/openai/v1"
    usage = Usage(input_tokens=1000, output_tokens=100)
    assert cost_of(usage, key) == table(
        "llama-3.3-70b-versatile", "groq", input_tokens=1000, output_tokens=100
    )


def test_an_unknown_endpoint_is_not_priced():
    provider = OpenAIProvider("gpt-4o", base_url="https://llm.example.internal/v1")
    key = provider.price_key()
    assert key is not None
    assert cost_of(Usage(input_tokens=10, output_tokens=5), key) is None


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/v1", "http://localhost:11434/v1"])
def test_a_server_on_this_machine_is_never_priced(url):
    assert OpenAIProvider("gpt-4o", base_url=url).price_key() is None


def test_price_as_prices_a_gateway_as_the_vendor_it_forwards_to():
    provider = AnthropicProvider(
        "claude-sonnet-4-5", base_url="http://127.0.0.1:9/gw", price_as="anthropic"
    )
    assert provider.price_key() == PriceKey(
        model="claude-sonnet-4-5", provider_id="anthropic", input_includes_cache=False
    )


def test_the_scripted_provider_is_not_priced():
    assert ScriptedProvider(["hi"]).price_key() is None


# -- into the step, the turn and the stream ------------------------------------------------


async def test_a_call_through_the_sdk_carries_its_cost_into_step_finish_and_finish():
    body = a_body(a_start(1000), a_text(0, "Hello"), _a_end_with_cache(50, read=400, write=100))
    async with rig("anthropic", Reply(body=body), provider={"price_as": "anthropic"}) as r:
        async with r.session.stream("hi") as out:
            chunks = [c async for c in out]
    expected = table(
        "claude-sonnet-4-5",
        "anthropic",
        input_tokens=1500,
        output_tokens=50,
        cache_read_tokens=400,
        cache_write_tokens=100,
    )
    (step,) = [c for c in chunks if c.type == "step-finish"]
    assert step.usage.cost == expected
    assert chunks[-1].type == "finish" and chunks[-1].usage.cost == expected
    assert out.result.usage.cost == expected


def _a_end_with_cache(output: int, *, read: int, write: int) -> list[dict]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {
                "output_tokens": output,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": write,
            },
        },
        {"type": "message_stop"},
    ]


async def test_a_loopback_server_call_has_an_unknown_cost():
    async with rig("openai", Reply(body=oa_text("Hello"))) as r:
        result = await r.session.run("hi")
    assert result.usage.input_tokens == 10 and result.usage.cost is None


async def test_the_turn_cost_is_the_sum_of_its_calls_and_is_stored_with_the_message():
    steps = [[*tool_call("echo", {"text": "a"}, tool_call_id="c1")], ["done"]]
    call = Usage(input_tokens=1000, output_tokens=100, total_tokens=1100)
    provider = ScriptedProvider(steps, usage=call, model="gpt-4o-mini")
    provider.price_as = "openai"
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, tools=[echo]))
        result = await session.run("go")
    one = table("gpt-4o-mini", "openai", input_tokens=1000, output_tokens=100)
    assert result.usage.cost == pytest.approx(2 * one)
    assert session.messages[1].usage == result.usage


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


async def test_a_sub_agents_calls_count_toward_the_parent_turns_cost():
    inner = ScriptedProvider(
        ["facts"], usage=Usage(input_tokens=100, output_tokens=10, total_tokens=110)
    )
    inner.model, inner.price_as = "gpt-4o-mini", "openai"
    researcher = Agent(name="researcher", provider=inner)
    outer = ScriptedProvider(
        [[*tool_call("researcher", {"input": "?"}, tool_call_id="P1")], ["summary"]],
        usage=Usage(input_tokens=1000, output_tokens=20, total_tokens=1020),
    )
    outer.model, outer.price_as = "claude-sonnet-4-5", "anthropic"
    lead = Agent(name="lead", provider=outer, tools=[researcher.as_tool()])
    async with Host.open(log_tap=False) as host:
        result = await (await host.open_session(lead)).run("go")
    expected = 2 * table(
        "claude-sonnet-4-5", "anthropic", input_tokens=1000, output_tokens=20
    ) + table("gpt-4o-mini", "openai", input_tokens=100, output_tokens=10)
    assert result.usage.cost == pytest.approx(expected)


# -- the budget ----------------------------------------------------------------------------


def looping_agent(cost: float | None, budget: Budget) -> tuple[Agent, ScriptedProvider]:
    usage = Usage(input_tokens=10, output_tokens=5, total_tokens=15, cost=cost)
    provider = ScriptedProvider([[*tool_call("echo", {"text": "a"})]] * 5, usage=usage)
    return Agent(provider=provider, tools=[echo], budget=budget), provider


async def test_max_cost_ends_the_turn_after_the_step_that_went_over():
    agent, provider = looping_agent(0.4, Budget(max_cost=1.0))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("go") as out:
            chunks = [c async for c in out]
    assert out.result.finish_reason == "budget" and out.result.budget == "max_cost"
    assert chunks[-1].type == "finish" and chunks[-1].budget == "max_cost"
    assert len(provider.requests) == 3  # 0.4, 0.8, then 1.2: over
    assert out.result.usage.cost == pytest.approx(1.2)


async def test_max_cost_ends_a_turn_whose_cost_is_unknown_after_its_first_call():
    agent, provider = looping_agent(None, Budget(max_cost=100.0))
    async with Host.open(log_tap=False) as host:
        result = await (await host.open_session(agent)).run("go")
    assert result.finish_reason == "budget" and result.budget == "max_cost"
    assert len(provider.requests) == 1


async def test_a_sub_agent_over_the_cost_budget_ends_the_turn_before_the_next_call():
    inner = ScriptedProvider(
        ["facts"], usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2, cost=5.0)
    )
    researcher = Agent(name="researcher", provider=inner)
    outer = ScriptedProvider(
        [[*tool_call("researcher", {"input": "?"}, tool_call_id="P1")], ["summary"]],
        usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2, cost=0.01),
    )
    lead = Agent(provider=outer, tools=[researcher.as_tool()], budget=Budget(max_cost=1.0))
    async with Host.open(log_tap=False) as host:
        result = await (await host.open_session(lead)).run("go")
    assert result.finish_reason == "budget" and result.budget == "max_cost"
    assert len(outer.requests) == 1


# -- where the cost shows ------------------------------------------------------------------


def test_opentelemetry_spans_carry_the_cost_when_it_is_known():
    from actors.plugins import otel

    class Span:
        def __init__(self) -> None:
            self.attributes: dict = {}

        def set_attribute(self, key, value):
            self.attributes[key] = value

    known, unknown = Span(), Span()
    otel._set_usage(known, Usage(input_tokens=3, output_tokens=4, cost=0.125))
    otel._set_usage(unknown, Usage(input_tokens=3, output_tokens=4))
    assert known.attributes["axon.usage.cost"] == 0.125
    assert "axon.usage.cost" not in unknown.attributes


def test_the_ai_sdk_finish_and_a_restored_message_carry_the_cost():
    from runtime import output as o
    from runtime.app.web.ui_stream import UIStreamEncoder, ui_messages

    usage = Usage(input_tokens=3, output_tokens=4, total_tokens=7, cost=0.125)
    (finish,) = UIStreamEncoder().encode(o.Finish(finish_reason="stop", usage=usage))
    assert finish["messageMetadata"]["usage"]["cost"] == 0.125
    stored = [
        UserMessage(content="hi"),
        AssistantMessage(content=(TextPart(text="yo", step=0),), usage=usage),
    ]
    assert ui_messages(stored)[1]["metadata"]["usage"]["cost"] == 0.125


def test_a_message_stored_before_usage_was_recorded_loads_without_it():
    from runtime.serde import structure, unstructure

    data = unstructure(AssistantMessage(content=(TextPart(text="yo", step=0),)))
    assert "usage" not in data
    assert structure(data, AssistantMessage).usage is None


async def test_show_prints_each_turns_usage_and_cost_and_the_sessions(tmp_path):
    from actors.stores import open_store

    db = str(tmp_path / "cost.db")

    def turn(n: int, cost: float | None) -> list:
        usage = Usage(input_tokens=100 * n, output_tokens=10 * n, total_tokens=110 * n, cost=cost)
        return [
            UserMessage(content=f"q{n}"),
            AssistantMessage(content=(TextPart(text=f"a{n}", step=0),), usage=usage),
        ]

    store = await open_store(db)
    await store.save("priced", 0, [*turn(1, 0.25), *turn(2, 0.5)], {})
    await store.save("mixed", 0, [*turn(1, 0.25), *turn(2, None)], {})
    await store.aclose()

    def show(session: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "runtime", "show", session, "--store", db],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    priced = show("priced")
    assert "usage: 100 in / 10 out tokens, $0.25" in priced
    assert "usage: 200 in / 20 out tokens, $0.5" in priced
    assert "session usage: 300 in / 30 out tokens, $0.75" in priced
    mixed = show("mixed")
    assert "usage: 200 in / 20 out tokens, cost unknown" in mixed
    assert "session usage: 300 in / 30 out tokens, cost unknown" in mixed


async def test_the_metrics_actor_sums_known_costs_and_counts_unpriced_steps():
    from actors.plugins import MetricsActor

    priced, _ = looping_agent(0.25, Budget(max_steps=2))
    unpriced, _ = looping_agent(None, Budget(max_steps=1))
    async with Host.open(log_tap=False) as host:
        metrics = await host.start_actor(MetricsActor())
        await (await host.open_session(priced, session_id="p")).run("go")
        await (await host.open_session(unpriced, session_id="u")).run("go")
    assert metrics.sessions["p"].cost == 0.5 and metrics.sessions["p"].unpriced_steps == 0
    assert metrics.sessions["u"].cost == 0 and metrics.sessions["u"].unpriced_steps == 1


def test_the_terminal_finish_line_shows_the_cost_only_when_it_is_known():
    import io

    from rich.console import Console

    from runtime import output as o
    from runtime.app.render import TerminalRenderer

    console = Console(file=io.StringIO(), width=200)
    renderer = TerminalRenderer(console)
    priced = Usage(input_tokens=3, output_tokens=4, total_tokens=7, cost=0.0125)
    renderer.render(o.Finish(finish_reason="stop", usage=priced))
    renderer.render(o.Finish(finish_reason="stop", usage=Usage(input_tokens=3, output_tokens=4)))
    lines = console.file.getvalue().splitlines()
    assert lines == ["[stop · 3 in / 4 out tokens · $0.0125]", "[stop · 3 in / 4 out tokens]"]


def test_gemini_and_claude_on_vertex_and_bedrock_are_priced_as_the_table_knows_them():
    from actors.providers import AnthropicBedrockProvider, AnthropicVertexProvider, GeminiProvider

    usage = Usage(input_tokens=1000, output_tokens=500)
    gemini = GeminiProvider("gemini-2.5-flash").price_key()
    assert gemini == PriceKey(model="gemini-2.5-flash", provider_id="google")
    assert cost_of(usage, gemini) == table(
        "gemini-2.5-flash", "google", input_tokens=1000, output_tokens=500
    )
    vertex = AnthropicVertexProvider(
        "claude-sonnet-4-5@20250929", region="us-east5", project_id="p"
    ).price_key()
    assert vertex is not None and vertex.api_url == "https://us-east5-aiplatform.googleapis.com/v1"
    assert cost_of(usage, vertex) == table(
        "claude-sonnet-4-5@20250929", "google", input_tokens=1000, output_tokens=500
    )
    model = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    bedrock = AnthropicBedrockProvider(model, region="us-east-1").price_key()
    assert bedrock is not None and not bedrock.input_includes_cache
    assert cost_of(usage, bedrock) == table(model, "aws", input_tokens=1000, output_tokens=500)
