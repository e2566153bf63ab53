"""The three layers (docs/architecture.md) hold: import-linter's contracts, and what
``import runtime`` loads.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``); these tests run
``lint-imports`` on the project, show that the contracts do fail on an upward import
(in a copy of the sources), and check that no module escapes them by being in no layer,
and no actor by being missing from the list of actors that may not import each other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Beside the interpreter first: a virtual environment's python run without activating it
# (``.venv/bin/python -m pytest``) has the linter installed but not on the PATH.
LINT_IMPORTS = shutil.which("lint-imports", path=Path(sys.executable).parent) or shutil.which(
    "lint-imports"
)
needs_linter = pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter not installed")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [LINT_IMPORTS or "lint-imports", "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def contracts() -> list[dict]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def copy_sources(root: Path) -> Path:
    for name in ("runtime", "actors"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def lint_with_import(root: Path, module: str, line: str) -> str:
    """Copy the sources into ``root``, append ``line`` to the module at ``module`` (a
    path under ``root``; created when new) and run ``lint-imports`` on the copy: the
    contracts must break, and what they say is returned for the test to check."""
    copy_sources(root)
    path = root / module
    before = path.read_text() if path.exists() else ""
    path.write_text(before + line)
    result = lint_imports(root)
    assert result.returncode != 0
    return result.stdout


@needs_linter
def test_the_project_keeps_its_layer_contracts():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@needs_linter
def test_an_actor_importing_the_host_breaks_the_layers(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "actors/engine.py", "\nfrom runtime.app.host import Host  # upward\n"
    )
    assert "actors.engine -> runtime.app.host" in stdout


@needs_linter
def test_a_contract_module_importing_the_facade_is_refused(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "runtime/errors.py", "\nfrom runtime import Agent  # the facade\n"
    )
    assert "runtime.errors -> runtime" in stdout


@needs_linter
def test_a_contract_module_importing_the_kits_breaks_the_layers(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "runtime/store.py", "\nfrom runtime.testing.stores import turn  # a kit\n"
    )
    assert "runtime.store -> runtime.testing.stores" in stdout


@needs_linter
def test_the_kits_importing_an_implementation_is_refused(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "runtime/testing/stores.py", "\nfrom actors.stores import MemoryStore\n"
    )
    assert "runtime.testing.stores -> actors.stores" in stdout


@needs_linter
def test_two_web_modules_importing_each_other_is_a_cycle(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "runtime/app/web/resume.py", "\nfrom runtime.app.web.app import create_app\n"
    )
    assert "No cycles are allowed in runtime.app.web" in stdout


FAMILIES = ("plugins", "providers")
"""Folders of actors/ each of whose modules is an actor of its own."""
FAMILY_HELPERS = {
    "actors.mcp_lines",
    "actors.plugins.otel_export",
    "actors.plugins.registry",
    "actors.providers.anthropic_platforms",
    "actors.providers.failures",
    "actors.providers.gemini_wire",
    "actors.providers.json_slot",
    "actors.providers.openai_common",
    "actors.providers.read_batch",
    "actors.providers.registry",
    "actors.providers.sdk",
    "actors.providers.sse",
}
"""Modules a family shares (its members import them); they are no actors."""


def actor_modules() -> set[str]:
    """Every actor of actors/, found in the tree: each top-level module or package, each
    module of a family folder, less the families' shared helpers."""
    found = set()
    for path in (ROOT / "actors").iterdir():
        if path.name.startswith(("_", ".")):
            continue
        if path.is_dir() and path.name in FAMILIES:
            found |= {
                f"actors.{path.name}.{m.stem}"
                for m in path.glob("*.py")
                if not m.name.startswith("_")
            }
        elif path.suffix == ".py" or (path / "__init__.py").exists():
            found.add(f"actors.{path.stem}")
    return found - FAMILY_HELPERS


def test_the_contracts_name_folders_not_modules():
    """Only the independence contract names modules, and only actors (one each)."""
    folders = {
        "runtime",
        "runtime.__main__",
        "runtime.app",
        "runtime.app.**",
        "runtime.testing",
        "actors",
    }
    named = set()
    for contract in contracts():
        for key in ("layers", "protected_modules", "allowed_importers", "ancestors", "modules"):
            named.update(contract.get(key, ()))
    allowed = folders | actor_modules()
    assert named <= allowed, named - allowed


def test_every_actor_is_in_the_independence_contract():
    (independence,) = [c for c in contracts() if c["type"] == "independence"]
    assert set(independence["modules"]) == actor_modules()


@needs_linter
def test_an_actor_importing_another_actor_is_refused(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "actors/stream_controller.py", "\nfrom actors.turn.parts import PartsManager\n"
    )
    assert "actors.stream_controller -> actors.turn.parts " in stdout


@needs_linter
def test_a_provider_importing_another_provider_is_refused(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path,
        "actors/providers/openai_responses.py",
        "\nfrom actors.providers.openai import map_tools\n",
    )
    assert "actors.providers.openai_responses -> actors.providers.openai " in stdout


@needs_linter
def test_a_new_contract_module_is_in_the_contract_layer_without_an_edit(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "runtime/brand_new.py", "from actors.engine import Engine\n"
    )
    assert "runtime.brand_new -> actors.engine" in stdout


@needs_linter
def test_a_session_importing_its_host_is_a_cycle(tmp_path: Path):
    stdout = lint_with_import(
        tmp_path, "runtime/app/session.py", "\nfrom runtime.app.host import Host\n"
    )
    assert "No cycles are allowed in runtime.app" in stdout


def test_importing_runtime_and_actors_loads_no_application_module_and_no_heavy_library():
    heavy = (
        "runtime.app.host",
        "runtime.app.session",
        "runtime.app.cli",
        "runtime.app.web",
        "actors.turn.runner",
        "openai",
        "anthropic",
        "google.genai",
        "botocore",
        "httpx",
        "pydantic",
        "starlette",
        "hypercorn",
        "opentelemetry",
        "mcp",
        "coredis",
        "psycopg",
        "genai_prices",
        "runtime.testing",
        "pytest",
    )
    code = (
        "import sys, runtime, actors, actors.providers, actors.stores\n"
        f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_the_facade_still_gives_the_application_names():
    import runtime
    from runtime.app.host import Host
    from runtime.app.session import Session, TurnStream

    assert (runtime.Host, runtime.Session, runtime.TurnStream) == (Host, Session, TurnStream)
    assert {"Host", "Session", "TurnStream"} <= set(runtime.__all__)


def test_an_unknown_facade_name_is_an_attribute_error():
    import runtime

    with pytest.raises(AttributeError, match="no attribute 'Hots'"):
        runtime.Hots  # noqa: B018


def test_importing_runtime_and_actors_builds_no_contract_module():
    """The facade resolves its names on first use (issue 24, start-up): a program pays
    for the part of the contract it uses, not for every class of it."""
    code = (
        "import sys, runtime, actors\n"
        "print(' '.join(m for m in sys.modules if m.startswith(('runtime.', 'actors.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_an_applications_first_line_imports_no_actor():
    """``from runtime import Agent, Host, tool`` is what an application starts with; the
    host imports the actors it assembles when it opens (issue 24, start-up), so a program
    that only builds its agent, or prints its --help, does not pay for them."""
    code = (
        "import sys\nfrom runtime import Agent, Host, tool\n"
        "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'actors'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_the_whole_contract_builds_no_lifecycle_event_until_one_is_used():
    """Every module the facade takes names from, imported: the lifecycle events (27
    attrs classes, runtime/events.py) are not built; the contract's machinery names the
    few it publishes through ``runtime.lifecycle``, which imports them on first use and
    keeps them (issue 24, start-up)."""
    code = (
        "import sys, runtime\n"
        "for m in runtime._MODULES: __import__(m)\n"
        "before = 'runtime.events' in sys.modules\n"
        "from runtime import lifecycle\n"
        "lagged = lifecycle.Lagged\n"
        "import runtime.events\n"
        "print(before, lagged is runtime.events.Lagged, 'Lagged' in vars(lifecycle),"
        " runtime.Event is runtime.events.Event)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True", "True", "True"]


def test_the_lifecycle_module_lends_only_event_classes():
    from runtime import lifecycle

    assert issubclass(lifecycle.ActorCrashed, lifecycle.Event)
    for name in ("attrs", "LIFECYCLE_EVENT_TYPES", "_InTurn", "Nothing"):
        with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
            getattr(lifecycle, name)


def test_every_facade_name_is_the_object_of_its_module():
    import importlib

    import runtime

    for module, names in runtime._MODULES.items():
        for name in names:
            assert getattr(runtime, name) is getattr(importlib.import_module(module), name)
    assert set(runtime.__all__) == set(runtime._WHERE)
    assert set(runtime.__all__) <= set(dir(runtime))


def test_the_architecture_drawing_shows_every_module_in_its_folder():
    """docs/architecture.md draws the three folders with their modules: a module added,
    moved or renamed without the drawing following fails here."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## The three layers") :]
    drawing = section[section.index("```") + 3 :]
    drawing = drawing[: drawing.index("```")]
    tokens = drawing.replace("/", " ").replace("(", " ").replace(")", " ").split()
    words = {token.strip(",:").removesuffix(".py") for token in tokens}
    missing = []
    for path in sorted([*(ROOT / "runtime").rglob("*.py"), *(ROOT / "actors").rglob("*.py")]):
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py" or rel.parts[:2] == ("runtime", "testing"):
            continue
        if path.stem not in words:
            missing.append(str(rel))
    assert missing == []
