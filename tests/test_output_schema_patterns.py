"""An agent's JSON-schema ``output_type`` checks the model's answer as an untrusted
schema is checked (runtime/output_schema.py): patterns in pydantic-core's linear engine,
never Python's ``re`` (the answer is the model's: ``^(a|aa)*$`` took ``re`` minutes on 45
characters); one the engine cannot take skipped, said once; a check bounded in steps.
benchmarks/journal/pipeline.md ("mcpbounds")."""

from __future__ import annotations

import jsonschema._keywords
import jsonschema._utils
import pytest
from jsonschema.validators import Draft202012Validator
from structlog.testing import capture_logs

from runtime.errors import OutputValidationError
from runtime.output_schema import output_schema
from runtime.tools import UNTRUSTED_STEPS
from tests.test_schema_work import expo


@pytest.fixture
def no_re(monkeypatch) -> list[str]:
    """jsonschema's ``re.search`` records its pattern and refuses to run it."""
    ran: list[str] = []

    class Re:
        def search(self, pattern, text):
            ran.append(pattern)
            raise AssertionError(f"Python's re ran {pattern!r}")

    monkeypatch.setattr(jsonschema._keywords, "re", Re())
    monkeypatch.setattr(jsonschema._utils, "re", Re())
    return ran


def test_an_output_schema_pattern_runs_in_the_linear_engine_on_the_answer(no_re):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)*$"}}}
    checked = output_schema(schema)
    answer = '{"s": "' + "a" * 45 + '!"}'
    with pytest.raises(OutputValidationError) as refused:
        checked.parse(answer)
    assert refused.value.message == (
        "the answer does not match the output schema: s: "
        f"{'a' * 45 + '!'!r} does not match '^(a|aa)*$'"
    )
    assert checked.parse('{"s": "aaaa"}') == {"s": "aaaa"}
    assert no_re == []


def test_an_output_schema_pattern_the_engine_cannot_take_is_skipped_with_one_warning(no_re):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a)a+$"}}}
    with capture_logs() as logs:
        first, second = output_schema(schema), output_schema(schema)  # (an agent a session)
    assert first.parse('{"s": "b"}') == {"s": "b"}  # not run here
    assert second.parse('{"s": "b"}') == {"s": "b"}
    [warning] = [e for e in logs if e["event"] == "output.schema-not-checked-here"]
    assert warning["log_level"] == "warning"
    assert warning["error"].startswith(
        "output schema: not run on the model's answer here: pattern '^(?=a)a+$': not taken "
        "by the linear engine: "
    )
    assert no_re == []


def test_an_exponential_output_schema_refuses_the_answer_within_its_steps(monkeypatch):
    # 2**15 paths of anyOf refs: each answer's check took them all (~2 s of the loop);
    # now past its steps the answer is refused, and the model asked again, told why.
    evaluated = [0]
    any_of = Draft202012Validator.VALIDATORS["anyOf"]

    def counting(*args):
        evaluated[0] += 1
        return any_of(*args)

    monkeypatch.setitem(Draft202012Validator.VALIDATORS, "anyOf", counting)
    checked = output_schema(expo({"type": "string"}))
    bound = UNTRUSTED_STEPS + len(b'{"x":1}')
    with pytest.raises(OutputValidationError) as refused:
        checked.parse('{"x": 1}')
    assert refused.value.message == (
        "the answer does not match the output schema: (root): the output schema took over "
        f"{bound} steps to check the answer (a schema too costly to check)"
    )
    assert evaluated[0] <= bound
    assert checked.parse('{"x": "fine"}') == {"x": "fine"}
