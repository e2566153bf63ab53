"""Structured output: ``Agent(output_type=...)`` makes a turn's answer a typed object.

Everything provider-neutral about it lives here, so the turn runner has one hook per
concern and each provider only maps :class:`OutputSchema` onto its request:

* :func:`output_schema` turns the agent's ``output_type`` (a pydantic model, a
  ``TypedDict``, a dataclass, or a JSON schema ``dict``) into an :class:`OutputSchema`:
  the JSON schema the provider asks for, and the validation of an answer against it
  (pydantic for a type; ``jsonschema`` for a plain schema, whose references must stay
  within it: a ``$ref`` to ``http:`` or ``file:`` is refused, nothing is fetched);
* :func:`strict_schema` rewrites a schema for OpenAI's strict ``json_schema`` mode, and
  refuses clearly what strict mode cannot express;
* :class:`actors.turn.structured.StructuredTurn` (the actors' side) is one turn's state:
  partial objects while the answer streams, then the verdict on the answer.

Decisions, and why:

* The answer is JSON *text*, for every provider: OpenAI's ``response_format`` answers in
  text, and the Anthropic provider turns its forced ``final_output`` tool call into the
  same text chunks. So the answer streams as a text part, is stored as a text part,
  restores into either provider as plain assistant text (no ``tool_use`` left waiting
  for a ``tool_result``), and the parts rebuilt from the stream equal the stored parts.
* A rejected answer stays in the stored message (the user saw it stream). The retry
  request shows the model its answer followed by a user message with the validation
  error (:meth:`StructuredTurn.request_messages`); that feedback is not stored, so later
  turns see every attempt of the turn, without the feedback between them.
* A refusal (finish reason ``content-filter``) is not validated and not retried: the
  turn ends as the model ended it, with ``output`` ``None``.
* An answer that is one fenced block (```` ```json ```` or a bare ```` ``` ````, nothing
  around it), as compatible servers without a JSON mode write it, is the JSON inside
  (:func:`unfence`); asking again would get the same fence until the retries ran out.
  Two blocks, or prose around one, are not an answer: they are rejected as before.
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import orjson

from runtime.chunks import _repr
from runtime.errors import ConfigurationError, OutputValidationError, describe_exception
from runtime.json_exact import exact
from runtime.logging import get_logger
from runtime.redact import redact
from runtime.tools import (
    LISTING_UNITS,
    SERVER_STEPS_PER_BYTE,
    InvalidJSONSchema,
    SchemaTooCostly,
    linear_schema_validator,
    schema_errors,
    schema_steps,
)

OUTPUT_TOOL = "final_output"
"""Name of the tool an Anthropic request is forced to call with the answer."""
MAX_PROBLEMS = 20
"""Validation problems listed in one retry prompt; the rest are counted."""
MAX_PROBLEM_CHARS = 300
"""Characters of one validation problem in a retry prompt; the rest are counted."""


@attrs.frozen(kw_only=True, slots=True, eq=False)
class OutputSchema:
    """What an agent's answer must be: a JSON schema (object at the root), and the
    function that turns the answer's JSON text into the typed value."""

    __repr__ = _repr

    name: str
    """A name for the schema (``[A-Za-z0-9_-]``, at most 64), as OpenAI requires."""
    description: str | None
    schema: dict[str, Any]
    output_type: Any
    """What the agent was given: a type, or the schema ``dict`` itself."""
    _parse: Callable[[str], Any] = attrs.field(alias="parse")

    def parse(self, text: str) -> Any:
        """The typed value of ``text`` (or of the one fenced block it is:
        :func:`unfence`); :class:`OutputValidationError` says why not."""
        inner = unfence(text)
        try:
            return self._parse(text if inner is None else inner)
        except OutputValidationError as exc:
            if inner is None:
                raise
            raise OutputValidationError(exc.message, text=text) from None
        except Exception as exc:
            # A validator of the output type's own that raised past pydantic (a KeyError,
            # a TypeError): the answer is rejected, and the model asked again, as for a
            # ValueError; it failed the turn with that KeyError ("'Oslo'").
            problem = f"(root): validation raised {describe_exception(exc)}"
            raise OutputValidationError(_problems([problem]), text=text) from None


_FENCE = re.compile(r"\A\s*```[ \t]*(?:json)?[ \t]*\r?\n(.*?)\r?\n?[ \t]*```\s*\Z", re.I | re.S)
_OPENING = re.compile(r"\A\s*```[ \t]*(?:json)?[ \t]*\r?\n", re.I)
_CLOSING = re.compile(r"\r?\n?[ \t]*```\s*\Z")


def unfence(text: str) -> str | None:
    """The inside of ``text`` if it is exactly one fenced block, ```` ```json ````
    (any case) or a bare ```` ``` ````, with nothing but whitespace around it; else
    ``None``. A fence inside the block is left in it (two blocks are then not JSON)."""
    found = _FENCE.match(text)
    return found.group(1) if found is not None else None


def unfence_partial(text: str) -> str:
    """The JSON so far of an answer still streaming: an opening fence line (and a
    closing fence once it has come) taken off; other text as it is."""
    opening = _OPENING.match(text)
    if opening is None:
        return text
    return _CLOSING.sub("", text[opening.end() :])


def output_schema(output_type: Any) -> OutputSchema | None:
    """The :class:`OutputSchema` of an agent's ``output_type`` (``None`` stays ``None``).

    Raises :class:`ConfigurationError` for a type pydantic cannot describe, an invalid
    JSON schema, or one whose root is not an object (both providers need an object: a
    tool's input is one; wrap a list in a model).
    """
    if output_type is None:
        return None
    if isinstance(output_type, dict):
        schema, parse = _from_json_schema(output_type)
        fallback = "output"
    else:
        schema, parse = _from_type(output_type)
        fallback = getattr(output_type, "__name__", "output")
    schema = _rooted(schema)
    if schema.get("type") != "object":
        raise ConfigurationError(
            f"output_type must describe a JSON object (a pydantic model, a TypedDict, a "
            f"dataclass or an object schema), not {schema.get('type') or 'this schema'}: "
            "wrap it in a model with one field"
        )
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or fallback))[:64]
    description = schema.get("description")
    return OutputSchema(
        name=name or "output",
        description=description if isinstance(description, str) else None,
        schema=schema,
        output_type=output_type,
        parse=parse,
    )


def _rooted(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the definition its root refers to (``{"$ref": "#/$defs/Node",
    "$defs": {...}}``, pydantic's schema of a recursive model: a tree, a thread of
    comments) written at the root, its ``$defs`` kept for the references inside; any
    other schema as it is. Every provider needs an object at the root (a tool's input is
    one), and such a model was refused as not being one."""
    ref = schema.get("$ref")
    defs = schema.get("$defs")
    if not (isinstance(ref, str) and ref.startswith("#/$defs/") and isinstance(defs, dict)):
        return schema
    target = defs.get(ref.removeprefix("#/$defs/"))
    if not isinstance(target, dict) or "$defs" in target:
        return schema
    rest = {k: v for k, v in schema.items() if k != "$ref"}
    return {**copy.deepcopy(target), **rest}


def _from_type(output_type: Any) -> tuple[dict[str, Any], Callable[[str], Any]]:
    import pydantic

    try:
        adapter = pydantic.TypeAdapter(output_type)
        schema = adapter.json_schema()
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        raise ConfigurationError(f"output_type {output_type!r} has no JSON schema: {exc}") from exc

    def parse(text: str) -> Any:
        try:
            return adapter.validate_json(text)
        except pydantic.ValidationError as exc:
            problems = [
                f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            ]
            raise OutputValidationError(_problems(problems), text=text) from None

    return schema, parse


WARNED_SCHEMAS = 1_024
"""Output schemas whose unchecked patterns were said (the last this many, per process)."""

_warned: OrderedDict[int, None] = OrderedDict()


def _from_json_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], Callable[[str], Any]]:
    """The schema and the check of an answer against it.

    The check is the one of an untrusted schema (:func:`~runtime.tools.linear_schema_validator`):
    its patterns run in pydantic-core's linear engine, never Python's ``re`` (the answer
    is the model's, and a ``pattern`` such as ``^(a|aa)*$`` took ``re`` minutes on 45
    characters of it), compiled within :data:`~runtime.tools.LISTING_UNITS`; a check
    stops past 10,000 steps and one a byte of the answer (a schema of ``$ref`` s that is
    exponential to check). A pattern the engine does not take (a look-around, a
    backreference) is not run, said once (``output.schema-not-checked-here``)."""
    try:
        validator = linear_schema_validator(
            schema, budget=[LISTING_UNITS], steps_per_byte=SERVER_STEPS_PER_BYTE
        )
    except InvalidJSONSchema as exc:
        raise ConfigurationError(f"output_type is not a usable JSON schema: {exc}") from None
    _warn_unchecked(schema, validator.axon_unchecked)
    schema = copy.deepcopy(schema)  # the agent's own copy: nobody mutates it from outside

    def parse(text: str) -> Any:
        try:
            value = exact(orjson.loads(text), text)  # (an integer past 64 bits exactly)
        except orjson.JSONDecodeError as exc:
            raise OutputValidationError(
                _problems([f"(root): invalid JSON: {exc}"]), text=text
            ) from None
        try:
            problems = [
                f"{'.'.join(str(x) for x in e.absolute_path) or '(root)'}: {e.message}"
                for e in schema_errors(validator, value)
            ]
        except RecursionError:  # a recursive schema, an answer nested deeper than Python
            problems = ["(root): the answer is nested too deeply to validate"]
        except SchemaTooCostly:
            problems = [
                f"(root): the output schema took over {schema_steps(validator, value)} "
                "steps to check the answer (a schema too costly to check)"
            ]
        if problems:
            raise OutputValidationError(_problems(problems), text=text)
        return value

    return schema, parse


def _warn_unchecked(schema: dict[str, Any], unchecked: tuple[str, ...]) -> None:
    """Say once per process (of the last :data:`WARNED_SCHEMAS`) what of an output
    schema is not run on the answers here: an agent made per session would say it at
    each session."""
    if not unchecked:
        return
    key = hash(unchecked)
    if key in _warned:
        return
    _warned[key] = None
    while len(_warned) > WARNED_SCHEMAS:
        _warned.popitem(last=False)
    get_logger("axon.output").warning(
        "output.schema-not-checked-here",
        title=redact(str(schema.get("title") or "")),
        unchecked=[redact(s) for s in unchecked],
        error="output schema: not run on the model's answer here: " + "; ".join(unchecked),
    )


def _problems(problems: Sequence[str]) -> str:
    shown = [_shortened(p) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        shown.append(f"... and {len(problems) - MAX_PROBLEMS} more")
    return "the answer does not match the output schema: " + "; ".join(shown)


def _shortened(problem: str) -> str:
    """One problem, cut to :data:`MAX_PROBLEM_CHARS`: jsonschema's messages quote the
    value (``"[...] is not of type 'object'"``), which is the whole answer at the root,
    so a retry prompt repeated a long answer once per problem."""
    if len(problem) <= MAX_PROBLEM_CHARS:
        return problem
    return problem[:MAX_PROBLEM_CHARS] + f"… ({len(problem) - MAX_PROBLEM_CHARS} characters more)"


# -- OpenAI strict mode ---------------------------------------------------------------------


_ANNOTATIONS = frozenset(
    ("title", "description", "default", "examples", "$comment", "deprecated")
) | {"readOnly", "writeOnly"}
"""Keywords that describe a value and constrain nothing: beside a ``$ref``, whatever
their value, they take nothing from its target's."""


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` rewritten for OpenAI's strict ``json_schema`` mode (a new dict).

    The rules of the ``openai`` SDK's own ``to_strict_json_schema`` (private, and only
    for pydantic types, so not imported): every object gets ``additionalProperties:
    false`` and lists all its properties as ``required`` (a field with a default must
    then be given; pydantic still accepts it); ``default: null`` is dropped; a ``$ref``
    with sibling keys is inlined (its target, from the schema as given, with the
    siblings beside its keys). An object that allows additional properties (a
    ``dict[str, X]`` field) cannot be expressed in strict mode, nor a sibling that
    contradicts its target (``maxLength: 10`` beside a ``$ref`` to ``maxLength: 5``):
    that raises :class:`ConfigurationError` before anything is sent. A ``$ref`` met
    again inside its own inlining (a recursive model's field of its own type, with a
    description) stays a ``$ref``, its descriptive siblings dropped there.
    """
    root = copy.deepcopy(schema)
    return _strict(root, copy.deepcopy(schema), "(root)", ())


def _strict(node: Any, given: dict[str, Any], path: str, inlining: tuple[str, ...]) -> Any:
    """Rewrite ``node`` in place. ``given`` is the schema as it was given: a ``$ref``'s
    target is read there, never from the schema being rewritten (a recursive model's
    definition inlined into itself, half rewritten, lost a level's ``$ref``);
    ``inlining`` the ``$ref`` s being inlined around ``node``."""
    if not isinstance(node, dict):
        return node
    for key in ("$defs", "definitions"):
        defs = node.get(key)
        if isinstance(defs, dict):
            for name, sub in defs.items():
                _strict(sub, given, f"{path}.{key}.{name}", ())  # not inside any inlining
    if node.get("type") == "object":
        extra = node.setdefault("additionalProperties", False)
        if extra is not False:
            raise ConfigurationError(
                f"OpenAI strict structured output cannot express {path}: an object with "
                "additional properties (a dict field); use a model with named fields"
            )
    props = node.get("properties")
    if isinstance(props, dict):
        node["required"] = list(props)
        for name, sub in props.items():
            _strict(sub, given, f"{path}.{name}", inlining)
    if isinstance(node.get("items"), dict):
        _strict(node["items"], given, f"{path}[]", inlining)
    for key in ("anyOf", "allOf", "oneOf"):
        for i, sub in enumerate(node.get(key) or ()):
            _strict(sub, given, f"{path}.{key}[{i}]", inlining)
    if "default" in node and node["default"] is None:
        del node["default"]
    ref = node.get("$ref")
    if isinstance(ref, str) and len(node) > 1:
        _inline(node, ref, given, path, inlining)
    return node


def _inline(
    node: dict[str, Any], ref: str, given: dict[str, Any], path: str, inlining: tuple[str, ...]
) -> None:
    """Replace ``node``, a ``$ref`` with siblings, by its target with the siblings."""
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    constraints = sorted(k for k in siblings if k not in _ANNOTATIONS)
    if ref in inlining:  # inside its own inlining: inlining again would never end
        if constraints:
            raise ConfigurationError(
                f"OpenAI strict structured output cannot express {path}: a $ref {ref!r} "
                f"inside itself with {constraints} beside it (strict mode takes a $ref "
                "alone, and inlining it again would never end)"
            )
        node.clear()
        node["$ref"] = ref
        return
    target: Any = given
    try:
        for key in ref.removeprefix("#/").split("/") if ref != "#" else ():
            target = target[key.replace("~1", "/").replace("~0", "~")]
    except (KeyError, IndexError, TypeError):
        raise ConfigurationError(
            f"OpenAI strict structured output cannot express {path}: $ref {ref!r} points "
            "to nothing in the schema"
        ) from None
    if not isinstance(target, dict):
        raise ConfigurationError(
            f"OpenAI strict structured output cannot express {path}: $ref {ref!r} points "
            "to no schema"
        )
    clashing = [k for k in constraints if k in target and target[k] != siblings[k]]
    if clashing:
        raise ConfigurationError(
            f"OpenAI strict structured output cannot express {path}: {clashing} beside "
            f"$ref {ref!r} differ from its target's, and strict mode takes a $ref alone "
            "(inlined, one of the two would be lost)"
        )
    node.clear()
    node.update({**copy.deepcopy(target), **siblings})
    _strict(node, given, path, (*inlining, ref))
