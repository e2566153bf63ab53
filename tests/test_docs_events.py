"""docs/actors.md lists every bus event class with its ``kind`` and fields, as
:mod:`runtime.events` and :mod:`runtime.output` define them: the table between the
``events`` markers is rendered from the classes, so it cannot drift. After changing an
event, paste the output of ``python -m tests.test_docs_events`` between the markers."""

from __future__ import annotations

from pathlib import Path

import attrs

from runtime import events
from runtime.events import LIFECYCLE_EVENT_TYPES
from runtime.output import OUTPUT_CHUNK_TYPES

DOC = Path(__file__).resolve().parents[1] / "docs" / "actors.md"
BEGIN = "<!-- events: generated from runtime/events.py and runtime/output.py -->"
END = "<!-- events: end -->"


def _row(module: str, cls: type) -> str:
    fields = ", ".join(f"`{f.name}`" for f in attrs.fields(cls))
    return f"| `{cls.kind}` | `{module}.{cls.__name__}` | {fields} |"


def render() -> str:
    """The event tables as docs/actors.md holds them."""
    lines = ["| `kind` | Class | Fields |", "|---|---|---|"]
    lines += [_row("runtime.events", cls) for cls in LIFECYCLE_EVENT_TYPES]
    lines += [_row("runtime.output", cls) for cls in OUTPUT_CHUNK_TYPES]
    return "\n".join(lines)


def documented() -> str:
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def test_every_event_class_of_runtime_events_is_a_lifecycle_event_type():
    defined = {
        value
        for value in vars(events).values()
        if isinstance(value, type) and issubclass(value, events.Event) and "kind" in vars(value)
    }  # the bases (``Event`` and the ones carrying the ids) have no ``kind`` of their own
    assert defined == set(LIFECYCLE_EVENT_TYPES)


def test_actors_doc_lists_every_bus_event_class_with_its_kind_and_fields():
    assert documented() == render(), "run `python -m tests.test_docs_events` and paste it"


if __name__ == "__main__":
    print(render())
