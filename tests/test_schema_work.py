"""An untrusted schema's check (an MCP server's input or output schema, a client's) does
work in proportion to its steps: each hostile shape below made one counted step cost
work in proportion to the value or the schema (``items: true`` over the whole array at
each of 2**15 paths: hours for 40 KB), or escaped the count and the linear patterns
(a subschema naming another dialect). The work is counted here as ``jsonschema`` does
it, apart from Axon's own count: keyword calls, the names and items they loop over, the
pointer segments ``referencing`` walks. A tripwire ends a check that works on past
``WORK_PER_STEP`` times its bound (without it, the unbounded cases would run for hours).
benchmarks/journal/pipeline.md ("mcpbounds") has the measurements."""

from __future__ import annotations

import jsonschema._keywords
import jsonschema._utils
import orjson
import pytest
from jsonschema.validators import Draft202012Validator
from referencing._core import Resolver

from runtime import tools as tools_module
from runtime.tools import (
    BYTES_PER_STEP,
    UNTRUSTED_STEPS,
    SchemaTooCostly,
    schema_errors,
    schema_steps,
    server_schema_validator,
)

WORK_PER_STEP = 2 * BYTES_PER_STEP
"""The most work a step may stand for: a loop of :data:`BYTES_PER_STEP` names or items
is a step (twice that for what is not counted exactly: a keyword's own call)."""

LOOPS_VALUE = {"items", "contains", "additionalProperties", "unevaluatedItems"}
LOOPS_SCHEMA = {"properties", "required", "dependentRequired", "dependentSchemas"}


class TooMuchWork(AssertionError):
    pass


@pytest.fixture
def work(monkeypatch):
    return count_work(monkeypatch)


def count_work(monkeypatch):
    """Count the work of checks: each keyword call 1, plus what it loops over; each
    pointer lookup 1 and a segment; raise past ``limit[0]``.

    The meta-schema's checker (what checks each schema as it is built) is built first,
    from the stock keywords: it is made once for the process from the 2020-12 keywords
    of the moment, and made under this count it kept the counting keywords, and this
    count's ``done`` and ``limit``, for every later check of a schema. The next tests
    added their schemas' own checks to the first's count, past its limit: ``properties``
    (5,000 names, 439,000 units) after ``const`` failed on 604,614 of 604,608."""
    tools_module._meta_checker.cache_clear()
    tools_module._meta_checker(Draft202012Validator)
    done = [0]
    limit = [10**9]

    def add(n: int) -> None:
        done[0] += n
        if done[0] > limit[0]:
            raise TooMuchWork(f"{done[0]} units of work")

    def counting(name, keyword):
        def count(validator, value, instance, schema):
            n = 1
            if name in LOOPS_VALUE and isinstance(instance, list | dict):
                n += len(instance)
            if name in LOOPS_SCHEMA and isinstance(value, list | dict):
                n += len(value)
            if name == "const":
                n += len(orjson.dumps(value))
            add(n)
            return keyword(validator, value, instance, schema)

        return count

    for name, keyword in list(Draft202012Validator.VALIDATORS.items()):
        monkeypatch.setitem(Draft202012Validator.VALIDATORS, name, counting(name, keyword))
    for name, attr in (("additionalProperties", "_additional_properties_linear"),):
        # (Axon's own, in place of jsonschema's)
        monkeypatch.setattr(tools_module, attr, counting(name, getattr(tools_module, attr)))
    lookup = Resolver.lookup

    def counted_lookup(self, ref):
        add(1 + ref.count("/"))
        return lookup(self, ref)

    monkeypatch.setattr(Resolver, "lookup", counted_lookup)
    return done, limit


def expo(leaf: dict, depth: int = 15, combinator: str = "anyOf") -> dict:
    """A schema whose ``x`` has 2**depth paths, each ending in ``leaf``."""
    defs: dict = {"d0": leaf}
    for n in range(1, depth + 1):
        defs[f"d{n}"] = {combinator: [{"$ref": f"#/$defs/d{n - 1}"}] * 2}
    return {"type": "object", "$defs": defs, "properties": {"x": {"$ref": f"#/$defs/d{depth}"}}}


def deep_pointer() -> dict:
    """Paths ending in a ``$ref`` 200 segments deep."""
    target: dict = {"type": "string"}
    for _ in range(200):
        target = {"a": target}
    schema = expo({"$ref": "#/$defs/deep" + "/a" * 200})
    schema["$defs"]["deep"] = target
    return schema


HOSTILE = {
    "items-true": (expo({"type": "string", "items": True}), {"x": [0] * 2_000}),
    "contains": (expo({"type": "string", "contains": {}}), {"x": [0] * 2_000}),
    "properties": (
        expo({"type": "string", "properties": {f"p{i}": {} for i in range(5_000)}}),
        {"x": {"q": 1}},
    ),
    "const": (expo({"const": list(range(2_000))}), {"x": [*range(1_999), 0]}),
    "additional": (
        expo({"type": "string", "additionalProperties": True}),
        {"x": {f"k{i}": 1 for i in range(1_000)}},
    ),
    "deep-pointer": (deep_pointer(), {"x": 1, "pad": "p" * 20_000}),
}


@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_a_hostile_schema_is_refused_within_work_in_proportion_to_its_steps(work, shape):
    done, limit = work
    schema, value = HOSTILE[shape]
    validator = server_schema_validator(schema)
    steps = schema_steps(validator, value)
    assert steps == UNTRUSTED_STEPS + len(orjson.dumps(value))
    done[0], limit[0] = 0, WORK_PER_STEP * steps  # (not the schema's own check, as built)
    with pytest.raises(SchemaTooCostly):
        schema_errors(validator, value)
    assert done[0] <= WORK_PER_STEP * steps


def test_a_big_legit_value_is_checked_within_its_steps():
    # The counting of work must leave room for what servers send: a table of rows of
    # ten string cells, an array of integers (the densest: 2 bytes an item), and rows of
    # a model defined once and referred to (pydantic's $defs).
    row = {
        "type": "object",
        "properties": {c: {"type": "string"} for c in "abcdefghij"},
        "required": list("abcdefghij"),
    }
    schema = {
        "type": "object",
        "$defs": {"Row": row},
        "properties": {
            "rows": {"type": "array", "items": {"$ref": "#/$defs/Row"}},
            "ints": {"type": "array", "items": {"type": "integer"}},
        },
    }
    value = {"rows": [dict.fromkeys("abcdefghij", "cell")] * 2_000, "ints": [7] * 50_000}
    validator = server_schema_validator(schema)
    assert schema_errors(validator, value) == []
    bad = {**value, "ints": [*value["ints"][:-1], "x"]}
    assert [e.message for e in schema_errors(validator, bad)] == ["'x' is not of type 'integer'"]


def test_a_subschema_naming_another_dialect_is_checked_with_linear_patterns_and_counted(
    monkeypatch,
):
    # jsonschema enters each subschema with the class its own $schema names: a property
    # whose schema named draft-07 was checked by the stock Draft7Validator, its pattern in
    # Python's re (minutes on 45 characters) and no step counted below it.
    ran: list[str] = []

    class Re:
        def search(self, pattern, text):
            ran.append(pattern)
            raise AssertionError(f"Python's re ran {pattern!r}")

    monkeypatch.setattr(jsonschema._keywords, "re", Re())
    monkeypatch.setattr(jsonschema._utils, "re", Re())
    draft7 = "http://json-schema.org/draft-07/schema#"
    schema = {
        "type": "object",
        "properties": {
            "s": {"$schema": draft7, "type": "string", "pattern": "^(a|aa)*$"},
            "x": {"$schema": draft7, "$ref": "#/$defs/d15"},
        },
        "$defs": expo({"type": "string"})["$defs"],
    }
    validator = server_schema_validator(schema)
    [error] = schema_errors(validator, {"s": "a" * 45 + "!"})
    assert error.message == f"{'a' * 45 + '!'!r} does not match '^(a|aa)*$'"
    assert ran == []
    with pytest.raises(SchemaTooCostly):  # below a draft-07 subschema, steps still count
        schema_errors(validator, {"x": 1})


def test_counting_work_leaves_the_schemas_own_check_with_the_stock_keywords():
    tools_module._meta_checker.cache_clear()  # a fresh process: first made under the count
    with pytest.MonkeyPatch.context() as monkeypatch:
        count_work(monkeypatch)
        server_schema_validator(expo({"type": "string"}))
    meta = tools_module._meta_checker(Draft202012Validator)
    stock = {k: f for k, f in Draft202012Validator.VALIDATORS.items() if k != "uniqueItems"}
    assert {k: meta.VALIDATORS[k] for k in stock} == stock
