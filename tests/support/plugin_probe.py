"""A plug-in from outside Axon, as a package would ship one (tests/test_plugin_registry.py).

``--plugin probe:PATH`` starts a :class:`Probe`: it writes ``started`` to ``PATH`` when the
host starts it, and ``turn <finish_reason>`` for every turn that finishes, so a test in
another process sees that the command loaded it by name and that it saw the bus.
The tests register it under the ``axon.plugins`` entry-point group of a distribution they
put on ``PYTHONPATH`` (:func:`probe_distribution`), the way an installed package does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from runtime.actor import Actor
from runtime.errors import ConfigurationError
from runtime.events import TurnFinished

TARGET = "tests.support.plugin_probe:probe_plugin"


class Probe(Actor):
    subscribes_to: ClassVar[Any] = (TurnFinished,)

    def __init__(self, path: str) -> None:
        super().__init__(name="probe")
        self.path = Path(path)

    async def on_start(self) -> None:
        self._write("started")

    async def handle(self, event: Any) -> None:
        self._write(f"turn {event.finish_reason}")

    def _write(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def probe_plugin(options: str | None) -> Probe:
    """The ``probe`` plug-in's factory: ``options`` is the file it writes."""
    if not options:
        raise ConfigurationError("plug-in 'probe' needs a file: --plugin probe:PATH")
    return Probe(options)


def probe_distribution(root: Path) -> Path:
    """A directory holding an installed distribution (``axon-probe``) whose only entry
    point registers :func:`probe_plugin` as the ``probe`` plug-in; on ``sys.path`` (via
    ``PYTHONPATH``) its entry point is found by ``importlib.metadata`` like any package's."""
    info = root / "axon_probe-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: axon-probe\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[axon.plugins]\nprobe = {TARGET}\n")
    return root


def read_probe(path: Path) -> list[str]:
    """The lines the probe wrote (none when it never started)."""
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []
