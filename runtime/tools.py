"""``@tool``: a plain function becomes a tool the model can call.

The JSON schema and argument validation come from the function's type hints through
pydantic (a model built from the signature, wrapped in a ``TypeAdapter``); descriptions
come from the docstring (its summary, and its ``Args:`` section for each parameter).
Sync functions run in a worker thread so they never block the Trio loop.

Schemas that come from elsewhere (an MCP server's tool, a structured-output ``dict``)
are checked with ``jsonschema`` through :func:`json_schema_validator`, which resolves
only the references inside the schema: nothing a schema says makes the host open a
connection or a file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_origin, get_type_hints, overload

import attrs
import orjson

from runtime import json_exact
from runtime.budget import OutputAccount, check_timeout
from runtime.chunks import Usage, _repr
from runtime.errors import ToolDefinitionError, describe_exception
from runtime.media import tool_output

if TYPE_CHECKING:
    import pydantic  # imported when the first tool is built, not with runtime

    from runtime.hosting import ToolHost  # type-only: hosting.py names Tool in its turn


ApprovalRule = Callable[[dict[str, Any], "ToolContext[Any]"], bool]
"""A per-call approval rule: ``(validated arguments, context) -> needs a decision``."""

Deps = TypeVar("Deps")
"""The type of :attr:`ToolContext.deps`: whatever the application hands its tools."""


AGENT_DEPTH_META = "agent_depth"
"""The session meta key holding how many agents-used-as-tools deep a sub-session runs
(set by :meth:`~runtime.agent.Agent.as_tool`; stored with the session, so a worker that
runs the sub-turn reads it too)."""


PARENT_SESSION_META = "parent_session_id"
"""The session meta key naming the session whose call opened this one (an agent used as
a tool, :meth:`~runtime.agent.Agent.as_tool`): the waits of its turns are that session's
to decide (:attr:`~runtime.messages.Awaiting.caller`)."""


def caller_of(meta: Any) -> str | None:
    """The calling session a session's ``meta`` names (:data:`PARENT_SESSION_META`), or
    ``None`` for a session an application opened."""
    caller = meta.get(PARENT_SESSION_META) if isinstance(meta, Mapping) else None
    return caller if isinstance(caller, str) else None


def sub_session_id(session_id: str, tool_name: str, tool_call_id: str) -> str:
    """The id of the session the call ``tool_call_id`` of the agent tool ``tool_name``
    in session ``session_id`` runs in: ``<parent>.<name>.<call id>``, hashed when that
    is too long, with the characters a session id may not hold replaced. Here, beside
    :func:`caller_of`, as the stores derive it too: a session deleted takes the
    sub-sessions its calls ran in with it (:meth:`runtime.store.Store.delete`)."""
    raw = f"{session_id}~{tool_name}~{tool_call_id}"
    if len(raw) > 128:
        raw = f"sub~{hashlib.sha256(raw.encode()).hexdigest()[:40]}"
    return "".join(c if c.isalnum() or c in "_.:-~" else "-" for c in raw).replace("~", ".")


def agent_depth(meta: Any) -> int:
    """The depth a session's ``meta`` gives (:data:`AGENT_DEPTH_META`): 0 when it gives
    none, or something that is no depth (a caller's meta of its own)."""
    depth = meta.get(AGENT_DEPTH_META) if isinstance(meta, Mapping) else None
    return depth if type(depth) is int and depth > 0 else 0


class ToolContext(Generic[Deps]):
    """What a tool may ask for by declaring a parameter annotated ``ToolContext`` (or
    ``ToolContext[MyDeps]``, which type checkers read as the type of :attr:`deps`).

    Such a parameter is not part of the tool's JSON schema; the executor passes it in.
    It hands the tool the application's own dependencies (:attr:`deps`: a database
    handle, the signed-in user), lets it stream progress into its call's place in the
    parent's output (an agent used as a tool streams its whole turn this way) and report
    token usage that counts toward the calling turn.
    """

    __slots__ = (
        "_emit",
        "confirm",
        "decision",
        "deps",
        "depth",
        "host",
        "may_wait",
        "output_account",
        "output_left",
        "session_id",
        "step",
        "tool_call_id",
        "tool_name",
        "turn_id",
        "usage",
        "waits_asked",
        "waits_client",
        "waits_for",
        "waits_until",
    )

    def __init__(
        self,
        *,
        host: ToolHost | None,
        session_id: str,
        turn_id: str,
        step: int,
        tool_call_id: str,
        tool_name: str,
        emit: Any,
        deps: Deps = None,  # type: ignore[assignment]
        depth: int = 0,
        may_wait: bool = False,
        decision: Any = None,
        confirm: Callable[[], Awaitable[bool]] | None = None,
        output_left: int | None = None,
        output_account: OutputAccount | None = None,
    ) -> None:
        self.host = host
        """The host running the call: its bus, and sub-sessions
        (:class:`~runtime.hosting.ToolHost`); ``None`` for a call made outside a host (a
        test calling :meth:`Tool.call` itself)."""
        self.deps: Deps = deps
        """The session's dependencies: what ``host.open_session(agent, deps=...)`` (or
        ``run_sync(..., deps=...)``) was given, ``None`` if nothing was. The model never
        sees them; they are the tool's way to reach the application's own objects
        without globals (as Pydantic AI's ``RunContext.deps``)."""
        self.depth = depth
        """How many agents-used-as-tools deep the calling session runs: 0 for a session
        an application opened, 1 for the sub-session of an agent another agent called
        (:meth:`~runtime.agent.Agent.as_tool`), and so on; past its ``max_depth`` an
        agent's tool refuses the call."""
        self.session_id = session_id
        self.turn_id = turn_id
        self.step = step
        self.tool_call_id = tool_call_id
        self.tool_name = tool_name
        self.usage: Any = None
        """Usage to add to the calling turn's (set with :meth:`add_usage`)."""
        self.may_wait = may_wait
        """Whether the call's turn can suspend on its behalf (:attr:`waits_for`): a call
        of a step the model just made; not one a person approved (its turn's
        continuation runs it), nor one made outside a turn."""
        self.decision = decision
        """A call that waited (:attr:`waits_for`) run again once a person decided: the
        decision (the call's decided :class:`~runtime.messages.Awaiting`); else ``None``."""
        self.waits_for: str | None = None
        """Set by an agent used as a tool whose sub-turn suspended for a person's approval
        (when :attr:`may_wait`): that approval's id. The call then has no result: its
        turn suspends, waiting for that id, and the call runs again with
        :attr:`decision` once it is decided (docs/approval.md)."""
        self.confirm = confirm
        """The calling turn's confirm (:meth:`~runtime.actor_messages.TurnCancel.
        confirmed`: whether it may still run tools), when it has one (a worker's turn,
        whose claim a takeover may have taken while the process was paused): an agent
        tool's sub-turn awaits it before each batch of its own tools; ``None``: nothing
        to confirm."""
        self.waits_until: float | None = None
        """With :attr:`waits_for`: when that wait expires (the sub-agent's
        ``approval_timeout``, wall-clock seconds), the deadline of the calling turn's."""
        self.waits_client: tuple[str, Any] | None = None
        """With :attr:`waits_for`: the sub-turn waits for a client tool's output, not an
        approval: that call's tool name and input (the calling stream shows the call;
        :attr:`waits_for` is then ``<this call's id>.<the sub call's id>``)."""
        self.waits_asked: tuple[str, Any, Any, tuple[str, ...]] | None = None
        """With :attr:`waits_for`, an approval: the sub-agent's call that asks for it
        (its tool's name, its input, its stored schema when no code holds one, and the
        agent tools between, two and more agents deep), which
        a person's edit of the approval replaces
        (:attr:`~runtime.messages.Awaiting.asked_tool`)."""
        self.output_left = output_left
        """The output tokens the calling turn has left as its calls began
        (``Budget.max_output_tokens`` less what it wrote, sub-agents' included;
        ``None``: no such budget). An agent used as a tool runs its sub-turn under it,
        as under its own budget (``Session.stream(max_output_tokens=...)``): the
        sub-turn's output counts toward the calling turn's, so it may not write more
        than the caller has. Calls of one step that run at once share it through
        :attr:`output_account`."""
        self.output_account = output_account
        """The account the calls of this call's batch draw their output tokens from
        (:class:`~runtime.budget.OutputAccount`, holding :attr:`output_left` as the
        batch began; ``None``: no output budget): an agent used as a tool runs its
        sub-turn on it (``Session.stream(output_account=...)``), each of its model calls
        reserving the cap it is sent, so the sub-turns of calls that run at once never
        write more, together, than the calling turn had left."""
        self._emit = emit

    @property
    def idempotency_key(self) -> str:
        """``"<turn_id>:<step>:<tool_call_id>"``: the same for every run of this call.

        A durable turn whose worker died is taken over by another worker, which runs the
        step that was in flight again; that step may call the tool again although its
        first run's side effects (a payment, an email) already happened. When the model
        repeats the call id, the re-run's key is the same as the first run's, so a tool
        with side effects can hand the key to whatever performs them (an idempotency
        header, a unique column) and have them done once."""
        return f"{self.turn_id}:{self.step}:{self.tool_call_id}"

    async def emit(self, chunk: Any) -> None:
        """Stream ``chunk`` (an output chunk) nested under this tool call."""
        await self._emit(chunk)

    def add_usage(self, usage: Any, *, drawn: bool = False) -> None:
        """Count ``usage`` (a :class:`~runtime.chunks.Usage`) toward the calling turn's,
        and take its output tokens from :attr:`output_account` at once (when the calling
        turn has an output budget), so the calls running beside this one see them
        spent: a sub-agent's next model call is sent less, or none when nothing is left
        (the calling turn then ends ``budget`` after the batch, as it would have).
        Why: a tool that calls a model of its own and reports its usage counted only
        once the batch was over, after its siblings had been given those tokens too,
        so one step could write past the budget. The tokens are taken after the fact:
        a tool that must keep its own call within what is left reserves its cap first
        (``await context.output_account.reserve(cap)``, then ``settle(held, written)``,
        as the turn runner does for a model call) and passes ``drawn=True`` here, as
        an agent used as a tool does (its sub-turn's calls drew as they ran): then the
        usage is only counted, not taken a second time.

        Anything but a ``Usage`` raises ``TypeError`` here, in the tool, as its
        error: taken, it failed the calling turn with an AttributeError once the call
        ended; an ``output_tokens`` that is no count (negative, text) ``ValueError``,
        before anything is counted (a negative one would give the account tokens)."""
        if not isinstance(usage, Usage):
            raise TypeError(f"add_usage takes a Usage, not {type(usage).__name__}")
        spent = usage.output_tokens
        if type(spent) is not int or spent < 0:  # (a negative count would give tokens back)
            raise ValueError(f"add_usage: output_tokens is a count, 0 or more; got {spent!r}")
        self.usage = usage if self.usage is None else self.usage + usage
        account = self.output_account
        if account is not None and spent and not drawn:
            account.settle(0, spent)  # written with no reservation


class InvalidJSONSchema(ValueError):
    """A JSON schema that cannot be used: not a valid schema, a reference that leaves it
    (``http:``, ``file:``, a relative URI) or points to nothing in it, or nesting too
    deep to walk. The message says which, in one line."""


def _refuse_retrieval(uri: str) -> Any:
    """The registry's ``retrieve``: every URI not in the schema itself is refused, so
    validation never fetches one (jsonschema's deprecated default is a blocking
    ``urlopen`` on the calling thread, the Trio loop's)."""
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class mypy misreads


_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _check_references(resolver: Any, resource: Any) -> None:
    """Refuse every reference of ``resource`` (and its subschemas, only where a schema
    can be: not inside ``const`` or ``enum``) that is not ``#...``, and every ``$ref``
    that does not resolve within the schema."""
    from referencing.exceptions import Unresolvable

    contents = resource.contents
    if isinstance(contents, dict):
        for keyword in _REF_KEYWORDS:
            ref = contents.get(keyword)
            if not isinstance(ref, str):
                continue
            if not ref.startswith("#"):
                raise InvalidJSONSchema(
                    f"{keyword} {ref[:200]!r} points outside the schema; only references "
                    "within it ('#/$defs/...') are resolved, nothing is fetched"
                )
            if keyword == "$ref":
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    raise InvalidJSONSchema(
                        f"$ref {ref[:200]!r} points to nothing in the schema"
                    ) from None
    for sub in resource.subresources():
        _check_references(resolver.in_subresource(sub), sub)


UNTRUSTED_STEPS = 10_000
"""Steps an untrusted schema may take checking one value: a keyword evaluated, a
subschema entered that has none, an error passed up a level, a ``$ref`` looked up (two,
and a segment of its pointer), :data:`BYTES_PER_STEP` names or items looped over (3-7
us each, whatever the schema: 0.07 s at most; a table of 800 rows of 10 string cells
takes ~9,600). Past them the value is refused, the schema too costly to check it."""

_STEPS_LEFT: ContextVar[list[int] | None] = ContextVar("axon_schema_steps_left", default=None)


class SchemaTooCostly(Exception):
    """An untrusted schema took more than :data:`UNTRUSTED_STEPS` keywords on a value."""


def _spend(steps: int) -> None:
    """Take ``steps`` from the check under way (:func:`check_against_schema` sets them);
    :class:`SchemaTooCostly` past them."""
    left = _STEPS_LEFT.get()
    if left is not None:
        left[0] -= steps
        if left[0] < 0:
            raise SchemaTooCostly


SEARCH_UNITS_PER_STEP = 50_000
"""A linear pattern search counted as a step of the check per this many units of its
pattern (:func:`_compile_units`) times characters searched. The engine is linear in the
text but its worst case also grows with the pattern (its automaton's states). On one
machine, in one process: ``\\w{60}\\W\\w{10}`` (4,615 units) searched 200,000 ``a`` at
0.43-0.59 ns a unit and character, where a keyword step of a ``$ref`` chain took
33-45 us: 57,000-80,000 units and characters a step. Uncounted, that pattern held the
loop 1.5 s (a loaded machine) on those 200,000 characters, inside the bound of steps."""


SEARCH_CALL_UNITS = 2_500
"""What one search costs beyond its characters, in the units of
:data:`SEARCH_UNITS_PER_STEP` (a twentieth of a step): a search that does not match
raises inside pydantic-core, 1.7 us where a keyword step took ~35 us. Uncounted, the
keys of a 10,000-key object tried against 50 ``patternProperties`` (one keyword step
each object) held the loop 0.9 s within the bound; 1,000 patterns, 18 s."""


def _spend_search(cost: int) -> None:
    """Take a pattern search of ``cost`` units and characters from the check under way,
    whole steps of :data:`SEARCH_UNITS_PER_STEP` (what is left over carries to the next
    search: a thousand small searches count as what they cost together)."""
    left = _STEPS_LEFT.get()
    if left is not None and cost:
        left[1] += cost
        if left[1] >= SEARCH_UNITS_PER_STEP:
            steps, left[1] = divmod(left[1], SEARCH_UNITS_PER_STEP)
            _spend(steps)


def _counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    """``keyword`` (a ``jsonschema`` keyword function), a step of the check under way."""

    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _spend(1)
        return keyword(validator, value, instance, schema)

    return counted


def _enum_counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    """``enum``, which compares the value with each of its members: a step per member
    that is an object or array (~3.5 us each: 1,000 values against 5,000 objects took
    19 s), per 64 scalar ones (~0.15 us each)."""

    def counted(validator: Any, enums: Any, instance: Any, schema: Any) -> Any:
        if isinstance(enums, list):
            nested = any(isinstance(member, dict | list) for member in enums)
            _spend(len(enums) + _json_steps(enums) if nested else len(enums) // 64)
        return keyword(validator, enums, instance, schema)

    return counted


def json_values_over(value: Any, limit: int) -> bool:
    """Whether ``value`` (JSON) holds more than ``limit`` values (objects, arrays and
    scalars; a long string a value per KiB), counted up to that and no further: what
    tells a check that may hold the event loop from one that may not, cheaply."""
    left = limit
    stack = [value]
    while stack:
        item = stack.pop()
        left -= 1 + (len(item) >> 10 if type(item) is str else 0)
        if left < 0:
            return True
        if type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list or type(item) is tuple:
            stack.extend(item)
    return False


BYTES_PER_STEP = 16
"""What a comparison of JSON values or a loop over names costs a check, in steps: one
per this many bytes of the value as JSON (~0.2-1 us a node compared, 3-5 us a step), or
per this many names (a ``properties`` of 5,000 names looked up in the value at each of
its 2**15 evaluations held a thread 46 us a step, uncounted)."""


def _json_steps(value: Any) -> int:
    """The steps comparing ``value`` costs (:data:`BYTES_PER_STEP`)."""
    try:
        return len(orjson.dumps(value)) // BYTES_PER_STEP
    except TypeError:  # not JSON (a caller's Python value): its length
        return len(value) // BYTES_PER_STEP if isinstance(value, dict | list) else 0


def _const_counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    """``const``, which compares the value with its own: a step per
    :data:`BYTES_PER_STEP` bytes of it (a 5,000-item ``const`` compared at each of
    2**15 evaluations: 266 us a step, uncounted)."""

    def counted(validator: Any, const: Any, instance: Any, schema: Any) -> Any:
        if isinstance(const, dict | list):
            _spend(_json_steps(const))
        return keyword(validator, const, instance, schema)

    return counted


def _names_counted(keyword: Callable[..., Any], of_instance: bool | str) -> Callable[..., Any]:
    """A keyword that loops over names without a step for each: the schema's
    (``properties``, ``required``, ``dependentRequired`` and its arrays,
    ``dependentSchemas``) or the value's (``of_instance``: ``additionalProperties``,
    ``unevaluatedProperties``, ``unevaluatedItems``, ``contains``), a step per
    :data:`BYTES_PER_STEP` of them."""

    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if of_instance == "arrays":  # the names, and those of each array under them
            if isinstance(value, dict):
                names = len(value) + sum(len(v) for v in value.values() if type(v) is list)
                _spend(names // BYTES_PER_STEP)
            return keyword(validator, value, instance, schema)
        looped = instance if of_instance else value
        charged = of_instance != "boolean" or isinstance(value, bool)
        if charged and isinstance(looped, dict | list):
            _spend(len(looped) // BYTES_PER_STEP)
        return keyword(validator, value, instance, schema)

    return counted


_NAME_LOOPS: dict[str, bool | str] = {
    "items": "boolean",
    "prefixItems": False,
    "properties": False,
    "required": False,
    "dependentRequired": "arrays",
    "dependentSchemas": False,
    "dependencies": "arrays",
    "additionalProperties": True,
    "unevaluatedProperties": True,
    "unevaluatedItems": True,
    "contains": True,
}
"""The keywords :func:`_names_counted` charges, and whether for the value's names
(``"boolean"``: only when the keyword's schema is ``true`` or ``false``: each item
of an array is otherwise a subschema entered, a step already; ``"arrays"``: the
schema's names and those of each array it maps one to, which ``jsonschema`` looks up
in the value one by one: ``{"dependentRequired": {"a": [6,000 names]}}`` at each of
2**15 ``allOf`` paths, charged a step for its one name, was quadratic in the value
that holds them: 24 KB 0.27 s, 76 KB 2 s, minutes a MiB; branch ``logs2``)."""


def _unique_items_counted(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    """``uniqueItems`` of a value checked against an untrusted schema, a step per item
    and per :data:`BYTES_PER_STEP` of nested ones: ``jsonschema`` compares every pair
    of objects or arrays (1,000 distinct objects: 4.5 s, 3,000: 32 s), so each pair was
    a step and 3,000 objects were refused as too costly; hashed
    (:func:`_unique_items_linear`), the check is linear in the array."""
    if unique and isinstance(instance, list):
        nested = any(isinstance(item, dict | list) for item in instance)
        # (each item hashed once: what hashing nested ones walks, by their size)
        _spend(len(instance) + (_json_steps(instance) if nested else 0))
    return _unique_items_linear(validator, unique, instance, schema)


SERVER_STEPS_PER_BYTE = 1
"""Keywords the check of a model's input against an MCP server's listed schema may
evaluate (:func:`server_schema_validator`): :data:`UNTRUSTED_STEPS`, and one more per byte
of the input as JSON. A hostile schema of 1.3 KB held the loop 2.3 s in 100,000 steps
(0.5 s since each step's work is counted); so a small input gets the untrusted bound,
and a big one room in proportion to what the model wrote: 1,000 rows of 10 string
cells (101 KB) take 12,000 steps, an array of small integers one every two bytes. Past
them the call fails, the server's schema too costly to check its input."""


PATTERN_UNITS = 5_000
"""The most one ``pattern`` of a server's schema may cost to compile for the linear
engine, in units of :func:`_compile_units` (a literal 1, a class such as ``\\w`` 64, each
times its repetition's count). Compiling holds the loop up to ~5 us a unit:
``^\\w{3,50}$`` is 3,252 units (14 ms), ``\\w{100}`` 6,500 (28 ms), ``(\\w{50}){50}``
55 ms to fail at the engine's size limit. A costlier pattern is not run here."""

LISTING_UNITS = 200_000
"""The units all the patterns of one listing of a server may newly cost to compile
(~1 s at most; a pattern compiled before costs none): past them, its further patterns
are not run here. Without it a 1 MiB listing of distinct ``\\w{40}`` took minutes."""

COMPILED_PATTERNS = 1_024
"""Compiled patterns kept for the process (a listing again after a restart or a
``tools/list_changed`` compiles none of them again)."""

_COMPILED: OrderedDict[str, Callable[[str], bool] | str] = OrderedDict()
"""Each pattern compiled: its search, or why the engine does not take it."""
_NOT_COMPILED = object()


def _compile_units(pattern: str) -> int:
    """What compiling ``pattern`` for the linear engine costs, estimated from Python's
    own parse of it (which ``check_schema`` ran already): more than :data:`PATTERN_UNITS`
    when it cannot be parsed."""
    cap = PATTERN_UNITS + 1
    try:  # private modules of re (3.11+): a Python without them runs no pattern here
        from re import _constants as sre  # type: ignore[attr-defined]
        from re import _parser  # type: ignore[attr-defined]
    except ImportError:
        return cap

    def units(parsed: Any) -> int:
        total = 0
        for op, arg in parsed:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                low, high, sub = arg
                total += max(low + 1 if high is sre.MAXREPEAT else high, 1) * units(sub)
            elif op is sre.SUBPATTERN:
                total += units(arg[-1])
            elif op is sre.ATOMIC_GROUP:
                total += units(arg)
            elif op is sre.BRANCH:
                total += sum(units(branch) for branch in arg[1])
            elif op is sre.IN:
                total += 1 + sum(64 if kind is sre.CATEGORY else 1 for kind, _ in arg)
            else:
                total += 8 if op is sre.ANY else 1
            if total >= cap:
                return cap
        return total

    try:
        return units(_parser.parse(pattern))
    except (Exception, RecursionError):
        return cap


def _linear_search(pattern: str) -> Callable[[str], bool] | str:
    """A search for ``pattern`` in linear time (pydantic-core's Rust ``regex`` engine: no
    backtracking, so no input makes it take long), or, when that engine does not take
    the pattern, its reason (a look-around, a backreference, an unknown class, too big
    to compile)."""
    from pydantic_core import SchemaError, SchemaValidator, ValidationError, core_schema

    try:
        validator = SchemaValidator(
            core_schema.str_schema(pattern=pattern, regex_engine="rust-regex")
        )
    except SchemaError as exc:
        # "... SchemaError: regex parse error: <pattern, caret> error: <reason>", or
        # "... SchemaError: Compiled regex exceeds size limit of 10485760 bytes."
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        last = lines[-1] if lines else "refused"
        return last.removeprefix("error: ").removeprefix("SchemaError: ")[:200]

    def search(text: str) -> bool:
        try:
            validator.validate_python(text)
        except ValidationError:
            return False
        return True

    return search


def _linear_patterns(
    patterns: Iterable[str], budget: list[int] | None
) -> tuple[dict[str, Callable[[str], bool] | None], dict[str, str]]:
    """Each of ``patterns`` with its linear search, or ``None`` and why it is not run
    here; what compiling newly costs is taken from ``budget`` (:data:`LISTING_UNITS`).
    ``budget=None``: a program's own schema, every pattern compiled whatever it costs
    (once, as the program builds its tool)."""
    searches: dict[str, Callable[[str], bool] | None] = {}
    why: dict[str, str] = {}
    for pattern in patterns:
        if pattern in searches:
            continue
        known = _COMPILED.get(pattern, _NOT_COMPILED)
        if known is not _NOT_COMPILED:
            with contextlib.suppress(KeyError):  # (another thread's Trio run evicted it)
                _COMPILED.move_to_end(pattern)
        elif budget is None:
            known = _COMPILED[pattern] = _linear_search(pattern)
        else:
            units = _compile_units(pattern)
            if units > PATTERN_UNITS:
                searches[pattern] = None
                why[pattern] = f"too costly to compile (over {PATTERN_UNITS} units)"
                continue
            if units > budget[0]:
                searches[pattern] = None
                why[pattern] = f"past the listing's {LISTING_UNITS} units of compiling"
                continue
            budget[0] -= units
            known = _COMPILED[pattern] = _linear_search(pattern)
        while len(_COMPILED) > COMPILED_PATTERNS:
            with contextlib.suppress(KeyError):
                _COMPILED.popitem(last=False)
        if isinstance(known, str):
            searches[pattern] = None
            why[pattern] = f"not taken by the linear engine: {known}"
        else:
            searches[pattern] = known  # type: ignore[assignment]
    return searches, why


def _matches(validator: Any, pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` of ``validator`` 's schema finds a match in ``text``; ``None``:
    not run here (:func:`linear_schema_validator`). Counted before it runs
    (:func:`_spend_search`): :class:`SchemaTooCostly` instead of a search past the bound."""
    search = validator.axon_patterns.get(pattern)
    if search is None:
        return None
    _spend_search(SEARCH_CALL_UNITS + len(text) * validator.axon_pattern_units.get(pattern, 0))
    return bool(search(text))


def _pattern_linear(validator: Any, pattern: Any, instance: Any, schema: Any) -> Any:
    """The ``pattern`` keyword of a server's schema, run in linear time, or not run when
    the linear engine does not take it (:func:`server_schema_validator`)."""
    from jsonschema.exceptions import ValidationError

    if isinstance(pattern, str) and validator.is_type(instance, "string"):
        if _matches(validator, pattern, instance) is False:
            yield ValidationError(f"{_quoted(instance)} does not match {pattern!r}")


QUOTED_CHARS = 100
"""Characters of a string a pattern refused that its error quotes."""


def _quoted(text: str) -> str:
    """``text`` quoted for an error, cut to :data:`QUOTED_CHARS` with its length said: a
    model's 100 KB string is not echoed whole (an approval's refusal cuts its message, and
    what a pattern refused was past the cut)."""
    if len(text) <= QUOTED_CHARS:
        return repr(text)
    return f"{text[:QUOTED_CHARS]!r}... ({len(text):,} characters)"


def _pattern_properties_linear(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    """``patternProperties``, its patterns run in linear time; a property only a pattern
    not run here could match is left unchecked."""
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _matches(validator, pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties_linear(validator: Any, extra: Any, instance: Any, schema: Any) -> Any:
    """``additionalProperties`` with the ``patternProperties`` beside it run in linear
    time; a property a pattern not run here could match is not counted as additional."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = sorted(
        key
        for key in instance
        if key not in properties
        and not any(_matches(validator, p, key) is not False for p in patterns)
    )
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        yield ValidationError(
            f"additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)"
        )


def _unevaluated_not_run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
    """``unevaluatedProperties`` in a server's schema that has ``patternProperties``:
    not run (jsonschema matches those patterns with ``re`` to find the evaluated keys)."""
    return iter(())


def _patterns(resource: Any) -> Iterator[tuple[str, str]]:
    """Every ``(keyword, pattern)`` of ``resource`` where a schema can be."""
    contents = resource.contents
    if isinstance(contents, dict):
        if isinstance(contents.get("pattern"), str):
            yield "pattern", contents["pattern"]
        if isinstance(contents.get("patternProperties"), dict):
            for pattern in contents["patternProperties"]:
                yield "patternProperties", pattern
        if "unevaluatedProperties" in contents:
            yield "unevaluatedProperties", ""
    for sub in resource.subresources():
        yield from _patterns(sub)


def server_schema_validator(schema: dict[str, Any], budget: list[int] | None = None) -> Any:
    """A validator of a model's input against the input schema an MCP server listed,
    checked on the event loop of the process making the call (every session's): an
    untrusted schema's (:func:`linear_schema_validator`), its patterns compiled within
    ``budget`` (the listing's :data:`LISTING_UNITS`, a fresh one when not given)."""
    return linear_schema_validator(
        schema,
        budget=[LISTING_UNITS] if budget is None else budget,
        steps_per_byte=SERVER_STEPS_PER_BYTE,
    )


def linear_schema_validator(
    schema: dict[str, Any],
    *,
    budget: list[int] | None = None,
    trusted: bool = False,
    steps_per_byte: int = 0,
) -> Any:
    """A validator whose ``pattern`` and ``patternProperties`` run in linear time: for a
    value nobody vouches for (a model's input, a browser's output), checked on an event
    loop that serves every session.

    Python's ``re`` has no time limit (``"^(a|aa)*$"`` against 45 ``a`` and a ``!``:
    minutes). So the patterns are run by pydantic-core's Rust engine, in time linear in
    the string (no backtracking; its ``$`` does not match before a final newline, as in
    JSON Schema's ECMA-262 and unlike ``re``), each compiled once for the process.

    An untrusted schema (``trusted=False``: an MCP server's, a client's, one stored with
    a wait) may be hostile as well: ``$ref`` makes a check exponential in its size (16
    ``anyOf`` definitions of two references to the one before, 1.3 KB: 9.5 s), and
    compiling a pattern costs up to milliseconds. So its patterns are compiled within
    ``budget`` (:data:`LISTING_UNITS`; one that costs more than :data:`PATTERN_UNITS`
    is not compiled), and a check stops past :data:`UNTRUSTED_STEPS` keywords and
    ``steps_per_byte`` more per byte of the value as JSON (an MCP server's:
    :data:`SERVER_STEPS_PER_BYTE`; :func:`schema_errors`, :class:`SchemaTooCostly`). A
    pattern the engine does not take (a look-around, a backreference), too costly or
    past the budget, is not run here, nor ``unevaluatedProperties`` beside a
    ``patternProperties``: the schema's owner runs the tool and checks its own input.
    ``axon_unchecked`` on the validator says which and why, for the caller to report
    once.

    A trusted schema (a program's own, :meth:`Tool.client`) has every pattern compiled,
    and one the engine does not take is an :class:`InvalidJSONSchema` naming it: the
    program's author learns it as the tool is built, where skipping it would leave the
    input unchecked and ``re`` would leave the loop to the value's author. Its checks
    are not bounded in steps (its author wrote the schema).
    Raises :class:`InvalidJSONSchema` as :func:`json_schema_validator` does."""
    from jsonschema.validators import extend
    from referencing.jsonschema import DRAFT202012, specification_with

    base = type(json_schema_validator(schema))
    resource = specification_with(
        base.META_SCHEMA.get("$schema", ""), default=DRAFT202012
    ).create_resource(schema)
    try:
        found = list(_patterns(resource))
    except RecursionError:
        raise InvalidJSONSchema("the schema is nested too deeply") from None
    kinds = {keyword for keyword, _ in found}
    searches, why = _linear_patterns(
        (p for k, p in found if k != "unevaluatedProperties"),
        None if trusted else [LISTING_UNITS] if budget is None else budget,
    )
    unchecked = {f"{k} {_quoted(p)}: {why[p]}" for k, p in found if p in why}
    if "patternProperties" in kinds and "unevaluatedProperties" in kinds:
        unchecked.add("unevaluatedProperties: beside patternProperties")
    if trusted and unchecked:
        raise InvalidJSONSchema(
            f"{min(unchecked)}; patterns here run in pydantic-core's Rust regex engine, "
            "in time linear in the text, so that no input can hold the event loop: "
            "rewrite it, or check it in the tool's own code"
        )
    keywords = {name: fn for name, fn in base.VALIDATORS.items()}
    keywords["pattern"] = _pattern_linear
    keywords["patternProperties"] = _pattern_properties_linear
    keywords["additionalProperties"] = _additional_properties_linear
    if not trusted:
        for name, of_instance in _NAME_LOOPS.items():
            if name in keywords:
                keywords[name] = _names_counted(keywords[name], of_instance)
        if "const" in keywords:
            keywords["const"] = _const_counted(keywords["const"])
        keywords = {name: _counted(fn) for name, fn in keywords.items()}
        if "enum" in base.VALIDATORS:
            keywords["enum"] = _counted(_enum_counted(base.VALIDATORS["enum"]))
        if "uniqueItems" in base.VALIDATORS:
            keywords["uniqueItems"] = _counted(_unique_items_counted)
    if "patternProperties" in kinds and "unevaluatedProperties" in base.VALIDATORS:
        keywords["unevaluatedProperties"] = _counted(_unevaluated_not_run)
    cls = extend(base, keywords)  # type: ignore[no-untyped-call]
    _stay_in(cls, counted=not trusted)
    if not trusted:
        cls.axon_steps = UNTRUSTED_STEPS
        cls.axon_steps_per_byte = steps_per_byte
        _count_errors(cls)
    cls.axon_patterns = searches
    cls.axon_pattern_units = {} if trusted else {p: _compile_units(p) for p in searches}
    cls.axon_unchecked = tuple(sorted(unchecked))
    registry, resolver = _crawled_resolver(resource)
    if not trusted:
        resolver = _counted_resolver(schema, resolver)
    return cls(schema, registry=registry, _resolver=resolver)


def _same_class_evolve(self: Any, **changes: Any) -> Any:
    """A validator's ``evolve`` (what ``descend`` calls for each subschema) that keeps
    its class. ``jsonschema``'s picks the class of a subschema's own ``$schema``: an
    untrusted schema's ``{"$schema": "...draft-07...", "pattern": "^(a|aa)*$"}`` one
    level down was checked by the stock draft-07 validator, its pattern in Python's
    ``re`` (33 ``a`` and a ``!``: 0.3 s, each more ``a`` 1.6 times that), its
    keywords uncounted (``uniqueItems`` over 2,000 objects: 3.5 s): every bound here
    left behind. So the whole schema is checked in its root's dialect."""
    cls = type(self)
    changes.setdefault("schema", self.schema)
    for field in attrs.fields(cls):
        if field.init and field.alias not in changes:
            changes[field.alias] = getattr(self, field.name)
    return cls(**changes)


SCHEMA_ERROR_CHARS = 500
"""The most characters of the meta-schema's complaint about a schema that
:class:`InvalidJSONSchema` keeps, its head and tail: ``jsonschema`` quotes the offending
value whole, then says what is wrong with it (a
client's 256 KiB ``properties`` array was a 256 KiB 400 body, an MCP server's a log
line as long)."""


def _crawled_resolver(resource: Any) -> tuple[Any, Any]:
    """A registry and a resolver of references within ``resource`` (the schema) for a
    validator (its ``registry`` and ``_resolver``), its subresources,
    ``$id`` s and anchors found once, here. Why: ``referencing`` finds an anchor
    (``"$ref": "#name"``) or an ``$id`` by crawling the whole schema, and a resolver that
    was not handed a crawled registry crawls again at each look-up: the check of the
    references as the schema is built, and each ``$ref`` a validation follows. 4,000
    ``{"$ref": "#foo"}`` (95 KB) took 55 s to build, and an input of 2,000 such
    properties 13 s to check, inside the bound of steps."""
    from referencing import Registry

    uri = resource.id() or ""
    registry: Any = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
    registry = registry.with_resource(uri, resource).crawl()
    return registry, registry.resolver(base_uri=uri)


_BOOL = object()
"""Tags a boolean in :func:`_hashable` (``True == 1`` in Python, not in JSON Schema)."""


def _hashable(value: Any) -> Any:
    """``value`` (JSON) as a hashable value equal to another's exactly when
    ``jsonschema`` finds the two equal (``1`` and ``1.0`` are, ``true`` and ``1`` not)."""
    if isinstance(value, bool):
        return (_BOOL, value)
    if isinstance(value, dict):
        return frozenset((key, _hashable(item)) for key, item in value.items())
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    return value


def _unique_items_linear(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    """``uniqueItems`` in time linear in the array: ``jsonschema`` compares every pair
    of items that are objects or arrays. The draft-04 meta-schema asks it of ``enum``,
    so a client's schema naming ``draft-04`` with an ``enum`` of 2,000 objects (21 KB)
    took 3.7 s to be checked as a schema, and 256 KiB of them some ten minutes."""
    from jsonschema.exceptions import ValidationError

    if unique and validator.is_type(instance, "array"):
        seen: set[Any] = set()
        for item in instance:
            key = _hashable(item)
            if key in seen:
                yield ValidationError(
                    f"an array of {len(instance):,} items has non-unique elements"
                )
                return
            seen.add(key)


@functools.cache
def _meta_checker(cls: Any) -> Any:
    """The validator class that checks a schema of ``cls`` 's dialect against its
    meta-schema (what ``cls.check_schema`` uses), its ``uniqueItems`` linear
    (:func:`_unique_items_linear`)."""
    from jsonschema.validators import extend, validator_for

    meta = validator_for(cls.META_SCHEMA, default=cls)
    checker = extend(meta, {"uniqueItems": _unique_items_linear})  # type: ignore[no-untyped-call]
    checker.evolve = _same_class_evolve  # (the meta-schema's own "$ref": "#" too)
    return checker


def _stay_in(cls: Any, *, counted: bool) -> None:
    """Give ``cls`` an ``evolve`` (what ``jsonschema`` calls to enter each subschema:
    ``descend``, ``is_valid`` of ``not``/``if``/``contains``/``oneOf``, each ``$ref`` of
    ``unevaluated*``) that stays in ``cls``, counted when ``counted``: a step for a
    subschema with no keyword of its own to count, and one per :data:`BYTES_PER_STEP`
    of its keys (``jsonschema`` lists them at each entry). Not counted:
    :func:`_same_class_evolve` (why it stays in ``cls``)."""
    if not counted:
        cls.evolve = _same_class_evolve
        return
    fields = [(f.name, f.alias) for f in attrs.fields(cls) if f.init]
    known = frozenset(cls.VALIDATORS)

    def evolve(self: Any, **changes: Any) -> Any:
        schema = changes.setdefault("schema", self.schema)
        # A step, unless a keyword of the subschema's will be one: a ``{}`` or ``true``
        # entered at each item of an array was a walk no step counted.
        if not isinstance(schema, dict):
            _spend(1)
        else:
            _spend((not schema.keys() & known) + len(schema) // BYTES_PER_STEP)
        for name, alias in fields:
            if alias not in changes:
                changes[alias] = getattr(self, name)
        return type(self)(**changes)

    cls.evolve = evolve


MESSAGE_CHARS_PER_STEP = 256
"""What an error's message costs a check beyond its step, in steps: one per this many of
its characters. ``jsonschema`` writes each error's message as it makes it, most with the
value quoted whole (``{instance!r} is not of type 'string'``, ``... is not valid under
any of the given schemas`` at each ``anyOf``): a schema that fails at each of its 2**15
``anyOf`` paths against one large object wrote the object out at each, a step each,
quadratic in the value (24 KB: 2 s, 76 KB: 13 s, ~40 min a MiB; branch ``logs2``). ~2 ns
a character: a step's message costs at most what a keyword step does."""


def _count_errors(cls: Any) -> None:
    """A step for each error as it passes each subschema it was found under (``jsonschema``
    sets its details at each level: an ``allOf`` chain 15 deep, 32,768 errors, each set
    30 times, uncounted), and one per :data:`MESSAGE_CHARS_PER_STEP` characters of its
    message (written as it was made: the value it quotes)."""
    descend = cls.descend

    def counted(
        self: Any,
        instance: Any,
        schema: Any,
        path: Any = None,
        schema_path: Any = None,
        resolver: Any = None,
    ) -> Any:
        for error in descend(self, instance, schema, path, schema_path, resolver):
            _spend(1 + len(error.message) // MESSAGE_CHARS_PER_STEP)
            yield error

    cls.descend = counted


_DYNAMIC = (b'"$dynamicAnchor"', b'"$recursiveAnchor"')
"""Keys whose presence makes where a ``$ref`` leads depend on the way there: its lookups
are not kept (:func:`_counted_resolver`)."""


def _counted_resolver(schema: Any, resolver: Any) -> _CountedResolver:
    """The root resolver of an untrusted schema's validator (:class:`_CountedResolver`
    around ``resolver``, :func:`_crawled_resolver` 's); its lookups kept unless the schema
    has dynamic anchors."""
    try:
        text = json_exact.dumps(schema, marked=False)  # (a bound past 64 bits written)
        dynamic = any(key in text for key in _DYNAMIC)
    except TypeError:  # (not JSON: a caller's Python values)
        dynamic = True
    return _CountedResolver(resolver, None if dynamic else {})


@attrs.frozen(slots=True, eq=False)
class _Resolved:
    """What :meth:`_CountedResolver.lookup` found (``jsonschema`` reads these two; never
    compared: no ``__eq__`` of its own to compile at import)."""

    contents: Any
    resolver: _CountedResolver


class _CountedResolver:
    """A ``referencing`` resolver whose ``$ref`` lookups are counted (``referencing``
    forbids subclassing: this wraps one, and every resolver it hands on).

    Each lookup is two steps (it and the entry into its target, whose resolver is made
    anew) and one per segment of its pointer (``referencing`` walks it, a resource made
    at each: ~8 us a segment; a ``$ref`` 200 segments deep, met at each of 2**15
    evaluations, took 64 us a counted step). A lookup is kept (``kept``) by base URI and
    reference, then two steps again: ``jsonschema`` walked the pointer at each use (~25
    us for ``#/$defs/Row``). Not kept with dynamic anchors in the schema, where a
    ``$ref`` 's target depends on the way there."""

    __slots__ = ("_inner", "_kept")

    def __init__(self, inner: Any, kept: dict[tuple[str, str], _Resolved] | None) -> None:
        self._inner = inner
        self._kept = kept

    def lookup(self, ref: str) -> _Resolved:
        kept = self._kept
        key = (self._inner._base_uri, ref)
        if kept is not None and (found := kept.get(key)) is not None:
            _spend(2)
            return found
        _spend(2 + ref.count("/"))
        resolved = self._inner.lookup(ref)
        found = _Resolved(resolved.contents, _CountedResolver(resolved.resolver, kept))
        if kept is not None:
            kept[key] = found
        return found

    def in_subresource(self, subresource: Any) -> _CountedResolver:
        return _CountedResolver(self._inner.in_subresource(subresource), self._kept)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def json_schema_validator(schema: dict[str, Any], *, trusted: bool = True) -> Any:
    """A ``jsonschema`` validator for ``schema`` (its ``$schema`` dialect, else 2020-12)
    that resolves only references within ``schema``.

    Raises :class:`InvalidJSONSchema` when ``schema`` is not a valid JSON schema or holds
    a reference that leaves it: such a schema is refused when it is given, not when a
    value is first checked against it. The validator's registry refuses every retrieval
    as well, so even a reference this check missed is an error, never a fetch.

    Its patterns run in Python's ``re``, which has no time limit: for a value nobody
    vouches for, :func:`linear_schema_validator`. ``trusted=False`` (a schema a client
    sent over the network, whose checks run on the event loop) is that validator's,
    untrusted: patterns linear, compiled within a budget, and a check bounded in steps.
    """
    from jsonschema import Draft202012Validator, SchemaError
    from jsonschema.validators import validator_for
    from referencing.jsonschema import DRAFT202012, specification_with

    if not trusted:
        return linear_schema_validator(schema)
    try:
        cls = validator_for(schema, default=Draft202012Validator)
        meta = _meta_checker(cls)
        for error in meta(cls.META_SCHEMA, format_checker=meta.FORMAT_CHECKER).iter_errors(
            schema
        ):  # (cls.check_schema, its uniqueItems linear)
            raise SchemaError.create_from(error)
        dialect = cls.META_SCHEMA.get("$schema", "")
        resource = specification_with(dialect, default=DRAFT202012).create_resource(schema)
        crawled = _crawled_resolver(resource)
        _check_references(crawled[1], resource)
    except SchemaError as exc:
        message = exc.message
        if len(message) > SCHEMA_ERROR_CHARS:  # (the value quoted first, the reason last)
            half = SCHEMA_ERROR_CHARS // 2
            message = f"{message[:half]}... ({len(message):,} characters) ...{message[-half:]}"
        raise InvalidJSONSchema(message) from None
    except RecursionError:
        raise InvalidJSONSchema("the schema is nested too deeply") from None
    registry, resolver = crawled
    return cls(schema, registry=registry, _resolver=resolver)  # type: ignore[call-arg]


class ToolInputError(Exception):
    """The model's input does not match the tool's schema; the model sees the message."""


CALLING_SESSION: ContextVar[str | None] = ContextVar("axon_calling_session", default=None)
"""The session whose turn called the tool running in this task (set by :meth:`Tool.call`):
a turn of that same session started from inside the tool would wait for the turn that
waits for the tool, so ``session.stream`` refuses it (:class:`~runtime.errors.SessionBusy`)."""

_abandoned = [0]


def note_abandoned_call(count: int = 1) -> None:
    """Count a tool call whose task was abandoned (it did not end when cancelled:
    :class:`actors.tool_executor._Detached`); ``-1`` once it ended after all."""
    _abandoned[0] += count


def abandoned_calls() -> int:
    """How many tool calls' tasks this process abandoned that are still running:
    ``trio.run`` waits for each at its very end, so the CLI ends its process
    itself once its host has closed (:func:`runtime.app.cli.main`)."""
    return _abandoned[0]


TOOL_THREADS = 40
"""Sync tools' calls running in worker threads at once per Trio run (its hosts'): more wait
for a thread (:func:`tool_thread_limiter`)."""

_TOOL_LIMITER: list[Any] = []
"""The run variable holding each run's :func:`tool_thread_limiter`, made at the first
sync tool's call (this module does not import Trio)."""


def tool_thread_limiter(trio: Any) -> Any:
    """The run's limiter of sync tools' threads (:data:`TOOL_THREADS` tokens), made on
    first use; ``trio`` is the module. Never Trio's default thread limiter: the SQLite
    store's saves, a model call's name resolution and every other
    ``to_thread.run_sync`` of the process draw from that one, and a call abandoned at
    its timeout keeps its token until its thread returns. A model that asked for forty
    calls of a sync tool that hangs took every token for good, and from then on no
    session of the host could save a long answer or reach a new server."""
    if not _TOOL_LIMITER:
        _TOOL_LIMITER.append(trio.lowlevel.RunVar("axon_tool_threads"))
    var = _TOOL_LIMITER[0]
    try:
        return var.get()
    except LookupError:
        limiter = trio.CapacityLimiter(TOOL_THREADS)
        var.set(limiter)
        return limiter


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Tool names every provider accepts (OpenAI's and Anthropic's pattern; Gemini's allows more)."""


def _check_name(tool: Any, attribute: Any, name: Any) -> None:
    """Refuse, as the tool is made, a name the provider would refuse at the turn's first
    model call (a 400 after the user message was stored)."""
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ToolDefinitionError(
            f"tool name {name!r} cannot be offered to a model: a tool name must be 1-64 "
            "letters, digits, '_' or '-' (name it with tool(fn, name=...))"
        )


def _check_rule(rule: Any) -> None:
    """Refuse an ``async def`` approval rule as the tool is made: its coroutine, never
    awaited, was true, so every call waited for a person whatever the rule said."""
    if inspect.iscoroutinefunction(rule):
        raise ToolDefinitionError(
            f"needs_approval rule {getattr(rule, '__name__', rule)!r} is async: it must be "
            "a plain function (arguments, context) -> bool"
        )


@attrs.frozen(kw_only=True, slots=True, eq=False)
class Tool:
    """A callable the model may use. Build one with :func:`tool`."""

    __repr__ = _repr

    name: str = attrs.field(validator=_check_name)
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""
    function: Callable[..., Any]
    is_async: bool
    timeout: float | None = attrs.field(
        default=None, validator=lambda t, a, v: check_timeout(v, ToolDefinitionError)
    )
    """Seconds before a call is abandoned; ``None`` takes the turn budget's default."""
    needs_approval: bool | ApprovalRule = attrs.field(
        default=False, validator=lambda t, a, v: _check_rule(v)
    )
    """``True``: every call waits for a person's decision before it runs; a function
    ``(arguments, context) -> bool`` decides per call (the validated arguments and the
    call's :class:`ToolContext`). A waiting call suspends its turn durably
    (docs/approval.md); an :class:`~actors.plugins.ApprovalActor` on the host decides in
    process instead."""
    _adapter: pydantic.TypeAdapter[Any] | None = attrs.field(alias="adapter")
    """Validates the arguments; ``None`` only for a subclass that overrides
    :meth:`validate` (``actors.mcp.MCPTool`` checks the server's schema instead)."""
    context_param: str | None = None
    """Name of the parameter that receives a :class:`ToolContext`, if any."""

    is_client: bool = False
    """The tool has no implementation here: the caller (a browser, any client) runs it
    and answers with its output (see :meth:`client`)."""

    waits_on_siblings: bool = False
    """Its calls may wait for other calls of their step (a barrier, a rendezvous, a
    consumer waiting for a producer): they run at once whatever the step's
    ``Budget.max_parallel_tool_calls``, taking none of its places (an async tool's
    only: a sync one's calls share the run's :data:`TOOL_THREADS` threads). Without it, calls
    past the bound wait for a place that the calls holding them, waiting for those,
    never give back: the step stalls until their timeouts (each timeout's error then
    names the bound)."""

    @classmethod
    def client(
        cls,
        name: str,
        schema: dict[str, Any],
        description: str = "",
        *,
        output_schema: dict[str, Any] | None = None,
        trusted: bool = True,
        budget: list[int] | None = None,
    ) -> ClientTool:
        """A client-side tool: offered to the model with ``schema`` (a JSON schema of the
        arguments object), run by the caller. A call suspends the turn until
        ``session.respond(tool_call_id, output=...)`` (or the AI SDK's ``addToolOutput``)
        supplies the output. The model's input is checked against ``schema`` like any
        tool's; the caller's output against ``output_schema`` when one is given (a
        mismatch is refused, nothing changes). Both are values nobody vouches for (a
        model's, a browser's), checked on the event loop: their ``pattern`` s run in
        linear time (:func:`linear_schema_validator`). Raises :class:`InvalidJSONSchema`
        for a schema that cannot be used, a pattern that engine does not take (a
        look-around, a backreference) among them. ``trusted=False`` for a schema a client
        sent: its patterns are compiled within ``budget`` (:data:`LISTING_UNITS`, shared
        by a request's tools; a fresh one when not given), one not taken is not run
        (``validator.axon_unchecked`` says which: the client checks its own tool's
        input), and a check stops past a number of steps."""
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ToolDefinitionError(
                f"client tool {name!r}: the schema must be a JSON schema of type 'object'"
            )
        outputs = None
        if output_schema is not None:
            outputs = linear_schema_validator(output_schema, trusted=True)
        if trusted:
            validator = linear_schema_validator(schema, trusted=True)
        else:
            validator = linear_schema_validator(schema, budget=budget)

        def unavailable(**_: Any) -> Any:
            raise RuntimeError(f"{name} is a client-side tool: the caller runs it")

        return ClientTool(
            name=name,
            description=description,
            parameters=schema,
            function=unavailable,
            is_async=False,
            adapter=None,
            is_client=True,
            validator=validator,
            output_validator=outputs,
        )

    def requires_approval(self, arguments: dict[str, Any], context: ToolContext[Any]) -> bool:
        """Whether this call (its validated ``arguments``) waits for a decision."""
        rule = self.needs_approval
        if callable(rule):
            verdict = rule(arguments, context)
            if inspect.isawaitable(verdict):  # an async callable object, say
                getattr(verdict, "close", lambda: None)()
                raise TypeError("the approval rule returned an awaitable: it must return a bool")
            return bool(verdict)
        return bool(rule)

    def rule_raised(self, exc: BaseException) -> str:
        """The error result of a call whose approval rule raised ``exc``: not run."""
        return (
            f"the tool call was not executed: the approval rule of {self.name} raised "
            f"{describe_exception(exc)}"
        )

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Keyword arguments for the function, or :class:`ToolInputError` saying why not."""
        if not isinstance(arguments, dict):
            raise ToolInputError(
                f"arguments for {self.name} must be a JSON object, got {type(arguments).__name__}"
            )
        import pydantic

        if self._adapter is None:
            raise TypeError(f"tool {self.name!r} has no adapter and does not override validate")
        try:
            model = self._adapter.validate_python(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise ToolInputError(f"invalid arguments for {self.name}: {problems}") from None
        return {k: getattr(model, k) for k in type(model).model_fields}

    async def call(self, arguments: dict[str, Any], context: ToolContext[Any] | None = None) -> Any:
        """Run the function with validated ``arguments``; sync functions in a thread."""
        if self.context_param is not None:
            arguments = {**arguments, self.context_param: context}
        if self.is_async:
            if context is None:
                return await self.function(**arguments)
            token = CALLING_SESSION.set(context.session_id)
            try:
                return await self.function(**arguments)
            finally:
                CALLING_SESSION.reset(token)
        import trio

        return await trio.to_thread.run_sync(
            functools.partial(self.function, **arguments),
            abandon_on_cancel=True,
            limiter=tool_thread_limiter(trio),
        )

    def spec(self) -> dict[str, Any]:
        """Provider-neutral description: ``name``, ``description``, ``parameters``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def stored_schema(self) -> dict[str, Any] | None:
        """The input schema a call of this tool that waits for approval stores with its
        wait (:attr:`~runtime.messages.Awaiting.schema`), to check an edit against in
        any process: one no code holds (an MCP server's, listed at run time). ``None``
        (every tool built in code): the decision finds the tool's check by its name."""
        return None


def schema_steps(validator: Any, value: Any) -> int | None:
    """The steps ``validator`` may take checking ``value`` (``None``: not counted)."""
    steps: int | None = getattr(validator, "axon_steps", None)
    per_byte = getattr(validator, "axon_steps_per_byte", 0)
    if steps is not None and per_byte:
        try:
            steps += per_byte * len(orjson.dumps(value))
        except TypeError:  # not JSON (a caller's Python value): the base bound
            pass
    return steps


def schema_errors(validator: Any, value: Any, left: list[int] | None = None) -> list[Any]:
    """``validator`` 's errors for ``value``, by path; :class:`SchemaTooCostly` past the
    steps of a validator that counts them (:func:`schema_steps`: an untrusted or a
    server's schema). ``left``: the caller's box of those steps (``[steps, 0]``: steps,
    then the units of pattern searches not yet a step), counted down instead of a new
    one: setting its steps below zero from another thread stops the check at its next
    step (a check in a worker thread whose caller went away)."""
    if left is None:
        steps = schema_steps(validator, value)
        left = [steps, 0] if steps is not None else None
    token = _STEPS_LEFT.set(left)
    try:
        return sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    finally:
        _STEPS_LEFT.reset(token)


def check_against_schema(name: str, validator: Any, value: Any, what: str) -> None:
    """Raise :class:`ToolInputError` naming the first problems when ``value`` does not
    match ``validator``'s schema (``what`` says what was checked: "arguments", "output")."""
    from referencing.exceptions import Unresolvable

    steps = schema_steps(validator, value)
    try:
        errors = schema_errors(validator, value)
    except Unresolvable as exc:
        raise ToolInputError(f"the schema of {name} has an unresolvable $ref: {exc}") from None
    except RecursionError:  # a recursive schema, a value nested deeper than Python goes
        raise ToolInputError(f"invalid {what} for {name}: nested too deeply to check") from None
    except OverflowError as exc:
        # jsonschema's multipleOf divides as floats: a model's 10**400 raised this out of
        # the check, and the turn failed instead of the model hearing its input is unusable.
        raise ToolInputError(f"invalid {what} for {name}: they cannot be checked: {exc}") from None
    except SchemaTooCostly:
        raise ToolInputError(
            f"invalid {what} for {name}: the schema took over {steps} steps to check them"
        ) from None
    if errors:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in errors[:5]
        )
        raise ToolInputError(f"invalid {what} for {name}: {problems}")


@attrs.frozen(kw_only=True, slots=True, eq=False)
class ClientTool(Tool):
    """A tool the caller runs (built with :meth:`Tool.client`); its input is checked
    against its JSON schema."""

    __repr__ = _repr

    validator: Any = attrs.field(repr=False)
    output_validator: Any = attrs.field(default=None, repr=False)

    def validate_output(self, output: Any) -> None:
        """Raise :class:`ToolInputError` when the caller's ``output`` does not match the
        tool's output schema (any output passes when it has none)."""
        if self.output_validator is not None:
            check_against_schema(self.name, self.output_validator, output, "output")

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolInputError(
                f"arguments for {self.name} must be a JSON object, got {type(arguments).__name__}"
            )
        check_against_schema(self.name, self.validator, arguments, "arguments")
        return dict(arguments)


def own_input(value: Any) -> Any:
    """A copy of a call's input for the tool's code (its validation, its approval rule,
    the function): every dict and list anew, the rest (strings, numbers: immutable;
    what JSON holds) shared.

    The input is the model's, what it sent: the history's :class:`ToolCallPart` holds
    it, and each later request sends it again. Pydantic copies what a parameter's type
    walks (``dict``'s top level, a ``list[int]``) and hands an ``Any`` or ``object``
    parameter, and the values inside a ``dict``, the very objects. A tool that kept
    one and changed it after its step's save changed the history in memory only: the
    store had written the call as it came (and a step's save encodes a part once,
    :func:`runtime.serde.message_json`), so this process's next request and one made
    after a reload differed. The tool's return value is copied already
    (:func:`to_jsonable`)."""
    t = type(value)  # (a leaf is not called for: most of a large input is leaves)
    if t is dict:
        return {k: own_input(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    if t is list:
        return [own_input(v) if type(v) in _CONTAINERS else v for v in value]
    if t is tuple:
        return tuple([own_input(v) if type(v) in _CONTAINERS else v for v in value])
    return value


_CONTAINERS = frozenset({dict, list, tuple})


def to_jsonable(value: Any) -> Any:
    """A JSON-ready form of a tool's return value; raises ``TypeError`` when impossible.

    An :class:`~runtime.messages.Image` / :class:`~runtime.messages.File`, or a list holding
    some, is kept as a tuple of parts (:func:`runtime.media.tool_output`): the provider
    sends it as image/document blocks where its API allows (docs/media.md)."""
    import pydantic_core  # heavy, and wanted only for a tool's return value: lazily

    media = tool_output(value)
    if media is not None:
        return media

    try:
        return pydantic_core.to_jsonable_python(value)
    except (pydantic_core.PydanticSerializationError, ValueError, RecursionError) as exc:
        # ValueError: bytes that are not UTF-8, a cycle, nesting too deep to walk.
        raise TypeError(f"tool returned a value that cannot be serialized: {exc}") from None


def _is_context(hint: Any) -> bool:
    """Whether ``hint`` is ``ToolContext`` or ``ToolContext[SomeDeps]``."""
    return hint is ToolContext or get_origin(hint) is ToolContext


def _build(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    timeout: float | None,
    needs_approval: bool | ApprovalRule,
    waits_on_siblings: bool = False,
) -> Tool:
    if waits_on_siblings and not inspect.iscoroutinefunction(fn):
        # A sync tool's calls run in threads that every sync tool of the run shares
        # (TOOL_THREADS): 45 calls meeting at a barrier all timed out, none said why.
        raise ToolDefinitionError(
            f"tool {getattr(fn, '__name__', fn)!r}: waits_on_siblings=True needs an async "
            f"function: a sync tool's calls run in at most {TOOL_THREADS} threads at once, "
            "shared by every sync tool of the host, so calls waiting on each other past "
            "them would stall until their timeouts"
        )
    try:
        import docstring_parser

        doc = docstring_parser.parse(inspect.getdoc(fn) or "")
        summary = "\n\n".join(x for x in (doc.short_description, doc.long_description) if x)
        param_docs = {p.arg_name: p.description for p in doc.params}
    except ImportError:  # pragma: no cover - docstring_parser is a dependency
        summary, param_docs = inspect.getdoc(fn) or "", {}
    try:
        hints = get_type_hints(fn)
    except Exception as exc:
        raise ToolDefinitionError(f"cannot read type hints of {fn!r}: {exc}") from exc
    import pydantic

    fields: dict[str, Any] = {}
    context_param: str | None = None
    for pname, param in inspect.signature(fn).parameters.items():
        if _is_context(hints.get(pname)):
            context_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {fn.__name__}: *args/**kwargs are not supported")
        if pname not in hints:
            raise ToolDefinitionError(f"tool {fn.__name__}: parameter {pname!r} has no type hint")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hints[pname], pydantic.Field(default, description=param_docs.get(pname)))
    tool_name = name or fn.__name__
    model = pydantic.create_model(tool_name, **fields)
    adapter = pydantic.TypeAdapter(model)
    schema = adapter.json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    return Tool(
        name=tool_name,
        description=description if description is not None else summary,
        parameters=schema,
        function=fn,
        is_async=inspect.iscoroutinefunction(fn),
        timeout=timeout,
        needs_approval=needs_approval,
        adapter=adapter,
        context_param=context_param,
        waits_on_siblings=waits_on_siblings,
    )


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    needs_approval: bool | ApprovalRule = False,
    waits_on_siblings: bool = False,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    needs_approval: bool | ApprovalRule = False,
    waits_on_siblings: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    needs_approval: bool | ApprovalRule = False,
    waits_on_siblings: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make ``fn`` a :class:`Tool`. Works bare (``@tool``), called (``@tool(name=...)``)
    or directly (``tool(fn, name=..., description=...)``). ``waits_on_siblings``: its
    calls wait for other calls of their step, and so run at once past
    ``Budget.max_parallel_tool_calls`` (:attr:`Tool.waits_on_siblings`)."""
    if not isinstance(waits_on_siblings, bool):
        raise ToolDefinitionError(
            f"waits_on_siblings must be True or False, not {waits_on_siblings!r}"
        )
    if fn is None:
        return lambda f: _build(f, name, description, timeout, needs_approval, waits_on_siblings)
    return _build(fn, name, description, timeout, needs_approval, waits_on_siblings)
