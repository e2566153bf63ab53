"""Structured output (``Agent(output_type=...)``): the schema side, the partial objects
that stream, validation with retries, and what is stored, through the scripted provider.
The real SDKs' side is in tests/test_structured_output_e2e.py."""

from __future__ import annotations

import itertools
import json

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.openai import map_messages as openai_messages
from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.turn.structured import StructuredTurn
from runtime import Agent, Host, tool
from runtime.actor_messages import ObjectUpdate, PartBegin, PartEnd, RetryPrompt
from runtime.chunks import FinishChunk, TextChunk
from runtime.errors import ConfigurationError, OutputValidationError
from runtime.messages import AssistantMessage, TextPart, ToolMessage, UserMessage
from runtime.output_schema import output_schema, strict_schema, unfence
from tests.support.grammar import check_grammar
from tests.support.listener import recording_server


class Weather(pydantic.BaseModel):
    """The weather in a city."""

    city: str
    temp: float


GOOD = '{"city": "Paris", "temp": 21.5}'
BAD = '{"city": "Paris", "temp": "hot"}'


async def run_turn(agent: Agent, text: str = "weather?"):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream(text) as out:
            chunks = [c async for c in out]
        return chunks, out.result, list(session.messages)


# -- the schema ------------------------------------------------------------------------------


def test_an_output_type_that_is_not_an_object_is_refused_when_the_agent_is_made():
    with pytest.raises(ConfigurationError, match="must describe a JSON object"):
        Agent(output_type=list[int])


def test_an_invalid_json_schema_is_refused_when_the_agent_is_made():
    with pytest.raises(ConfigurationError, match="not a usable JSON schema"):
        Agent(output_type={"type": "object", "properties": {"a": {"type": "integr"}}})


def test_a_json_schema_referring_outside_itself_is_refused_and_nothing_is_fetched():
    with recording_server() as attacker:
        remote = {"type": "object", "properties": {"a": {"$ref": f"{attacker.url}/x"}}}
        with pytest.raises(ConfigurationError, match=r"\$ref 'http://.*' points outside"):
            Agent(output_type=remote)
    assert attacker.contacts == []


def test_a_json_schema_referring_to_its_own_defs_validates_the_answer():
    schema = output_schema(
        {
            "type": "object",
            "$defs": {"temp": {"type": "number"}},
            "properties": {"temp": {"$ref": "#/$defs/temp"}},
        }
    )
    assert schema.parse('{"temp": 21.5}') == {"temp": 21.5}
    with pytest.raises(OutputValidationError, match="temp: 'hot' is not of type 'number'"):
        schema.parse('{"temp": "hot"}')


def test_negative_output_retries_are_refused():
    with pytest.raises(ValueError, match="output_retries"):
        Agent(output_type=Weather, output_retries=-1)


def test_the_schema_is_named_and_described_by_the_model():
    spec = output_schema(Weather)
    assert (spec.name, spec.description) == ("Weather", "The weather in a city.")
    assert spec.schema["required"] == ["city", "temp"]


def test_strict_schema_requires_every_property_and_closes_every_object():
    class Inner(pydantic.BaseModel):
        x: int | None = None

    class Outer(pydantic.BaseModel):
        inner: Inner
        note: str = "n"

    strict = strict_schema(output_schema(Outer).schema)
    assert strict["required"] == ["inner", "note"]
    assert strict["additionalProperties"] is False
    inner = strict["$defs"]["Inner"]
    assert inner["required"] == ["x"] and inner["additionalProperties"] is False
    assert "default" not in inner["properties"]["x"]  # a null default means nothing here


def test_strict_schema_inlines_a_ref_that_has_sibling_keys():
    class Inner(pydantic.BaseModel):
        x: int

    class Outer(pydantic.BaseModel):
        inner: Inner = pydantic.Field(description="the inner one")

    prop = strict_schema(output_schema(Outer).schema)["properties"]["inner"]
    assert "$ref" not in prop
    assert prop["description"] == "the inner one" and prop["required"] == ["x"]
    assert prop["additionalProperties"] is False


class Tree(pydantic.BaseModel):
    """A model whose field of its own type has a description: a ``$ref`` with a sibling."""

    name: str
    best: Tree = pydantic.Field(description="the best subtree")


def test_strict_schema_of_a_recursive_ref_with_siblings_keeps_every_levels_constraints():
    """Inlining the ``$ref`` inside the definition it points to, as that definition was
    being rewritten, left ``{"description": ...}`` at the third level: a schema taking
    anything there."""
    from jsonschema import Draft202012Validator

    strict = strict_schema(output_schema(Tree).schema)
    answer: dict = {"name": "a", "best": {"name": "b", "best": {"name": "c", "best": 5}}}
    paths = [list(e.absolute_path) for e in Draft202012Validator(strict).iter_errors(answer)]
    assert ["best", "best", "best"] in paths


def test_strict_schema_refuses_a_ref_whose_sibling_contradicts_its_target():
    """The sibling's value replaced the target's: ``maxLength: 10`` beside a ``$ref`` to
    a ``maxLength: 5`` string allowed 10 characters, where the schema allows 5."""
    schema = {
        "type": "object",
        "properties": {"code": {"$ref": "#/$defs/Code", "maxLength": 10}},
        "$defs": {"Code": {"type": "string", "maxLength": 5}},
    }
    with pytest.raises(ConfigurationError, match=r"\(root\)\.code: .*'maxLength'"):
        strict_schema(schema)


def test_strict_schema_refuses_a_dict_field_clearly():
    class Tags(pydantic.BaseModel):
        tags: dict[str, int]

    with pytest.raises(ConfigurationError, match=r"\(root\)\.tags: an object with additional"):
        strict_schema(output_schema(Tags).schema)


def test_strict_schema_leaves_the_agents_schema_as_it_was():
    spec = output_schema(Weather)
    before = json.dumps(spec.schema, sort_keys=True)
    strict_schema(spec.schema)
    assert json.dumps(spec.schema, sort_keys=True) == before


# -- partial objects -------------------------------------------------------------------------


def _feed(batches: list[list[str]]) -> list[object]:
    turn = StructuredTurn(output_schema(Weather), retries=0, message_id="m")
    out: list[object] = []
    for i, batch in enumerate(batches):
        items: list[object] = [PartBegin(kind="text", part_id="p")] if i == 0 else []
        items += [TextChunk(text=t) for t in batch]
        if i == len(batches) - 1:
            items.append(PartEnd(kind="text", part_id="p"))
        out += turn.observe(items)
    return out


@given(
    value=st.fixed_dictionaries(
        {"city": st.text(max_size=12), "temp": st.floats(allow_nan=False, allow_infinity=False)}
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=8),
    group=st.integers(min_value=1, max_value=3),
)
def test_object_deltas_end_with_the_whole_value_and_each_one_differs(value, cuts, group):
    text = json.dumps(value)
    points = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)]
    batches = [pieces[i : i + group] for i in range(0, len(pieces), group)]
    out = _feed(batches)
    updates = [x.value for x in out if isinstance(x, ObjectUpdate)]
    assert updates[-1] == value
    assert all(a != b for a, b in itertools.pairwise(updates))
    assert len(updates) <= len(batches)
    assert isinstance(out[-1], PartEnd)  # the last update comes before its part ends


def test_prose_and_refusals_produce_no_object_deltas():
    turn = StructuredTurn(output_schema(Weather), retries=0, message_id="m")
    out = turn.observe(
        [
            PartBegin(kind="text", part_id="p"),
            TextChunk(text="Sure, here it is"),
            PartEnd(kind="text", part_id="p"),
            PartBegin(kind="text", part_id="q"),
            TextChunk(text='{"city": "x"}', refusal=True),
            PartEnd(kind="text", part_id="q"),
        ]
    )
    assert not any(isinstance(x, ObjectUpdate) for x in out)


# -- turns through the scripted provider ----------------------------------------------------


async def test_a_valid_answer_is_the_typed_output_and_streams_object_deltas(autojump_clock):
    pieces = ['{"city": "Par', Sleep(1), 'is", ', Sleep(1), '"temp": 21.5}']
    provider = ScriptedProvider([pieces], chunk_size=100)
    chunks, result, _ = await run_turn(Agent(provider=provider, output_type=Weather))
    check_grammar(chunks)
    assert result.output == Weather(city="Paris", temp=21.5)
    deltas = [c.value for c in chunks if c.type == "object-delta"]
    # one per arrival that changed the value: ``{"city": "Paris"`` parses as before+
    assert deltas == [{"city": "Par"}, {"city": "Paris"}, {"city": "Paris", "temp": 21.5}]
    assert provider.requests[0].output is not None


async def test_an_invalid_answer_is_sent_back_with_its_error_and_the_second_is_accepted():
    provider = ScriptedProvider([[BAD], [GOOD]])
    chunks, result, stored = await run_turn(Agent(provider=provider, output_type=Weather))
    check_grammar(chunks)
    assert result.output == Weather(city="Paris", temp=21.5)
    assert result.finish_reason == "stop" and result.steps == 2
    retry = provider.requests[1].messages
    assert [type(m) for m in retry] == [UserMessage, AssistantMessage, RetryPrompt]
    assert retry[1].text == BAD
    assert "temp: Input should be a valid number" in retry[2].content
    # both answers are stored, as they streamed; the feedback is not
    assert [type(m) for m in stored] == [UserMessage, AssistantMessage]
    assert stored[1].content == (TextPart(text=BAD, step=0), TextPart(text=GOOD, step=1))
    assert stored[1].error is None


async def test_after_the_last_retry_the_turn_fails_with_output_validation_error():
    provider = ScriptedProvider([[BAD], ["not json"]])
    agent = Agent(provider=provider, output_type=Weather, output_retries=1)
    chunks, result, stored = await run_turn(agent)
    check_grammar(chunks, ending="error")
    # what the user sees
    assert chunks[-1].error.kind == "OutputValidationError"
    assert "Invalid JSON" in chunks[-1].error.message
    assert result.finish_reason == "error" and result.output is None
    assert len(provider.requests) == 2
    # what is saved: both answers, and why the turn failed
    assert [p.text for p in stored[1].content] == [BAD, "not json"]
    assert stored[1].error.kind == "OutputValidationError"
    assert stored[1].status == "failed"


async def test_an_empty_answer_is_rejected_with_a_clear_reason():
    answers = [[], [GOOD]]  # an empty step leaves no part to count steps by: use request.step
    provider = ScriptedProvider(responder=lambda request: answers[request.step])
    _, result, _ = await run_turn(Agent(provider=provider, output_type=Weather))
    assert result.output == Weather(city="Paris", temp=21.5)
    assert "the answer was empty" in provider.requests[1].messages[-1].content


async def test_a_refusal_is_neither_validated_nor_retried():
    refusal = [TextChunk(text="I can't help with that.", refusal=True)]
    provider = ScriptedProvider([[*refusal, FinishChunk(reason="content-filter")]])
    _, result, _ = await run_turn(Agent(provider=provider, output_type=Weather))
    assert result.finish_reason == "content-filter" and result.output is None
    assert result.error is None and len(provider.requests) == 1


async def test_a_json_schema_output_is_the_validated_dict():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    provider = ScriptedProvider([['{"n": "one"}'], ['{"n": 1}']])
    _, result, _ = await run_turn(Agent(provider=provider, output_type=schema))
    assert result.output == {"n": 1}
    assert "n: 'one' is not of type 'integer'" in provider.requests[1].messages[-1].content


FENCED = f"```json\n{GOOD}\n```"


@pytest.mark.parametrize(
    "answer",
    [FENCED, f"```\n{GOOD}\n```", f"\n```JSON\n{GOOD}\n```\n", f"```json\r\n{GOOD}\r\n```"],
)
async def test_an_answer_in_one_fenced_json_block_is_accepted_without_a_retry(answer):
    provider = ScriptedProvider([[answer], [GOOD]])
    _, result, stored = await run_turn(Agent(provider=provider, output_type=Weather))
    assert result.output == Weather(city="Paris", temp=21.5)
    assert len(provider.requests) == 1
    assert stored[1].content == (TextPart(text=answer, step=0),)  # stored as it streamed


@pytest.mark.parametrize(
    "answer",
    [
        f"{FENCED}\n{FENCED}",  # two blocks
        f"Here it is:\n{FENCED}",  # prose before
        f"{FENCED}\nHope this helps.",  # prose after
        f"```python\n{GOOD}\n```",  # not JSON's fence
    ],
)
async def test_an_answer_that_is_not_exactly_one_fenced_block_is_rejected(answer):
    provider = ScriptedProvider([[answer], [GOOD]])
    _, result, _ = await run_turn(Agent(provider=provider, output_type=Weather))
    assert result.output == Weather(city="Paris", temp=21.5)
    assert len(provider.requests) == 2  # the first answer was sent back as invalid


@given(
    value=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=4),
    indent=st.sampled_from([None, 2]),
    lang=st.sampled_from(["json", "JSON", ""]),
)
def test_unfence_gives_back_any_json_written_in_one_fence(value, indent, lang):
    assert json.loads(unfence(f"```{lang}\n{json.dumps(value, indent=indent)}\n```")) == value


def test_a_fenced_answer_that_fails_validation_keeps_its_text_as_written():
    bad = f"```json\n{BAD}\n```"
    with pytest.raises(OutputValidationError) as caught:
        output_schema(Weather).parse(bad)
    assert caught.value.text == bad
    assert "temp: Input should be a valid number" in caught.value.message


def test_a_fenced_answer_streams_object_deltas_from_inside_its_fence():
    out = _feed([["```json\n"], ['{"city": "Paris", '], ['"temp": 21.5}'], ["\n```"]])
    updates = [x.value for x in out if isinstance(x, ObjectUpdate)]
    assert updates == [{"city": "Paris"}, {"city": "Paris", "temp": 21.5}]


@tool
async def lookup(city: str) -> str:
    """Look the weather up."""
    return "21.5 degrees"


async def test_tool_steps_before_a_rejected_answer_keep_their_results_in_the_retry_request():
    provider = ScriptedProvider(
        [tool_call("lookup", {"city": "Paris"}, tool_call_id="c1"), [BAD], [GOOD]]
    )
    agent = Agent(provider=provider, output_type=Weather, tools=[lookup])
    _, result, _ = await run_turn(agent)
    assert result.output == Weather(city="Paris", temp=21.5) and result.steps == 3
    retry = provider.requests[2].messages
    assert [type(m) for m in retry] == [UserMessage, AssistantMessage, ToolMessage, RetryPrompt]
    # restored per step, the rejected answer comes after the tool result it used
    restored = openai_messages(None, retry)
    assert [m["role"] for m in restored] == ["user", "assistant", "tool", "assistant", "user"]
    assert restored[2]["content"] == "21.5 degrees" and restored[3]["content"] == BAD


async def test_a_second_turn_sees_every_answer_of_the_first_and_no_feedback():
    provider = ScriptedProvider(turns=[[[BAD], [GOOD]], [[GOOD]]])
    agent = Agent(provider=provider, output_type=Weather)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("first")
        result = await session.run("second")
    assert result.output == Weather(city="Paris", temp=21.5)
    history = provider.requests[2].messages
    assert [type(m) for m in history[:3]] == [UserMessage, AssistantMessage, UserMessage]
    assert [p.text for p in history[1].content] == [BAD, GOOD]


# -- the command line's bad input -------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read the output schema"),
        ("{not json", "is not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"type": "array"}', "cannot be used: output_type must describe a JSON object"),
    ],
)
def test_run_with_an_unusable_output_schema_says_why_and_exits_2(tmp_path, capsys, content, says):
    from runtime.app.cli import main

    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    store = tmp_path / "s.db"
    code = main(["run", "--store", str(store), "--output-schema", str(path), "hi"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err
    assert not store.exists()  # nothing was written


async def test_an_answer_cut_by_the_token_limit_is_retried_saying_so():
    cut = ['{"city": "Par', FinishChunk(reason="length")]
    provider = ScriptedProvider([cut, [GOOD]])
    _, result, _ = await run_turn(Agent(provider=provider, output_type=Weather))
    assert result.output == Weather(city="Paris", temp=21.5)
    assert "cut by the output token limit" in provider.requests[1].messages[-1].content


async def test_a_structured_turn_stored_on_disk_replays_into_the_next_turn(tmp_path):
    store = str(tmp_path / "s.db")
    provider = ScriptedProvider(turns=[[[BAD], [GOOD]], [[GOOD]]])
    agent = Agent(provider=provider, output_type=Weather)
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s1")
        await session.run("first")
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s1")
        result = await session.run("second")
    assert result.output == Weather(city="Paris", temp=21.5)
    restored = provider.requests[2].messages
    assert [p.text for p in restored[1].content] == [BAD, GOOD]
    assert not any(isinstance(m, RetryPrompt) for m in restored)
