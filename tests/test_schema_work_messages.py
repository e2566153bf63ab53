"""Two costs of an untrusted schema's check that its steps did not count (the charges
were by keyword name, one step a call): the message of each error, which ``jsonschema``
writes with the value quoted whole (``{instance!r} is not of type 'string'``, and at
each ``anyOf`` that fails), and the names of ``dependentRequired``'s (``dependencies``')
arrays, each looked up in the value. At each of 2**15 paths both were quadratic in the
value (76 KB: 13 s and 2 s of the loop's CPU, minutes to hours a MiB). Now an error
costs a step per :data:`~runtime.tools.MESSAGE_CHARS_PER_STEP` characters of its
message, and those keywords a step per :data:`~runtime.tools.BYTES_PER_STEP` names of
their arrays. The work is counted here as ``jsonschema`` does it, with a tripwire past
twice the bound (without the fix, the checks ran on for minutes).
benchmarks/journal/pipeline.md ("logs2")."""

from __future__ import annotations

import jsonschema.exceptions
import orjson
import pytest
from jsonschema.validators import Draft7Validator, Draft202012Validator

from runtime.tools import (
    BYTES_PER_STEP,
    MESSAGE_CHARS_PER_STEP,
    UNTRUSTED_STEPS,
    SchemaTooCostly,
    schema_errors,
    schema_steps,
    server_schema_validator,
)
from tests.test_schema_work import TooMuchWork, expo

DRAFT7 = "http://json-schema.org/draft-07/schema#"
WIDE = {f"k{i}": i for i in range(2_000)}
"""An object of 2,000 names (24 KB as JSON)."""


def _bound(validator, value) -> int:
    steps = schema_steps(validator, value)
    assert steps == UNTRUSTED_STEPS + len(orjson.dumps(value))
    return steps


def test_errors_quoting_a_large_value_are_charged_by_their_message(monkeypatch):
    written = [0]
    limit = [10**12]
    made = jsonschema.exceptions._Error.__init__

    def counting(self, message, *args, **kwargs):
        written[0] += len(message)
        if written[0] > limit[0]:
            raise TooMuchWork(f"{written[0]} characters of messages")
        made(self, message, *args, **kwargs)

    value = {"x": WIDE}
    validator = server_schema_validator(expo({"type": "string"}))
    steps = _bound(validator, value)
    monkeypatch.setattr(jsonschema.exceptions._Error, "__init__", counting)
    limit[0] = 2 * MESSAGE_CHARS_PER_STEP * steps
    with pytest.raises(SchemaTooCostly):
        schema_errors(validator, value)
    assert written[0] <= MESSAGE_CHARS_PER_STEP * steps + 2 * len(repr(WIDE))


@pytest.mark.parametrize(
    ("cls", "keyword", "dialect"),
    [(Draft202012Validator, "dependentRequired", None), (Draft7Validator, "dependencies", DRAFT7)],
    ids=["dependentRequired", "dependencies"],
)
def test_a_dependency_arrays_names_are_charged(monkeypatch, cls, keyword, dialect):
    looked = [0]
    limit = [10**12]
    original = cls.VALIDATORS[keyword]

    def counting(validator, value, instance, schema):
        looked[0] += 1 + sum(len(v) for v in value.values() if isinstance(v, list))
        if looked[0] > limit[0]:
            raise TooMuchWork(f"{looked[0]} names looked up")
        return original(validator, value, instance, schema)

    monkeypatch.setitem(cls.VALIDATORS, keyword, counting)  # (before the class is made)
    schema = expo({keyword: {"k0": list(WIDE)}}, combinator="allOf")
    if dialect:
        schema["$schema"] = dialect
    value = {"x": WIDE}  # every name there: each is looked up, none is an error
    validator = server_schema_validator(schema)
    steps = _bound(validator, value)
    limit[0] = 2 * BYTES_PER_STEP * steps
    with pytest.raises(SchemaTooCostly):
        schema_errors(validator, value)
    assert looked[0] <= 2 * BYTES_PER_STEP * steps


def test_a_legit_values_errors_and_dependencies_stay_within_its_steps():
    # A model's large object against an Optional[Model]-style anyOf whose first branch
    # fails with the object quoted, and a dependency of ten names: checked, not refused.
    row = {"type": "object", "dependentRequired": {"a": list("bcdefghij")}}
    schema = {"anyOf": [{"type": "null"}, {"type": "array", "items": row}]}
    value = [dict.fromkeys("abcdefghij", "cell")] * 2_000  # 104 KB, quoted by "null"
    validator = server_schema_validator(schema)
    assert schema_errors(validator, value) == []
    bad = [*value[:-1], {"a": 1}]
    [error] = schema_errors(validator, bad)
    assert error.message.endswith("is not valid under any of the given schemas")


REVIEWED = {
    # (each read in jsonschema 4.26 for what it loops over, and how that is charged:
    # runtime.tools._NAME_LOOPS, const, enum, uniqueItems; a subschema entered, an
    # error made or passed up, a $ref looked up are steps wherever they happen)
    *("$dynamicRef", "$recursiveRef", "$ref", "additionalItems", "additionalProperties"),
    *("allOf", "anyOf", "const", "contains", "dependencies", "dependentRequired"),
    *("dependentSchemas", "disallow", "divisibleBy", "enum", "exclusiveMaximum"),
    *("exclusiveMinimum", "extends", "format", "if", "items", "maxItems", "maxLength"),
    *("maxProperties", "maximum", "minItems", "minLength", "minProperties", "minimum"),
    *("multipleOf", "not", "oneOf", "pattern", "patternProperties", "prefixItems"),
    *("properties", "propertyNames", "required", "type", "unevaluatedItems"),
    *("unevaluatedProperties", "uniqueItems"),
}


def test_every_keyword_of_every_dialect_was_reviewed_for_its_charge():
    # The charges beyond a step a call are keyed by keyword name: a keyword a newer
    # jsonschema adds is one step a call whatever it loops over. Read it, charge it
    # (runtime/tools.py), then add it here.
    from jsonschema import validators

    dialects = [
        validators.Draft3Validator,
        validators.Draft4Validator,
        validators.Draft6Validator,
        validators.Draft7Validator,
        validators.Draft201909Validator,
        validators.Draft202012Validator,
    ]
    assert {k for cls in dialects for k in cls.VALIDATORS} <= REVIEWED
