"""What ``pip install axon-runtime`` gets: the wheel built from this checkout holds every
file of the packages (the web page and its icons, which the runtime opens from beside its
modules; the ``py.typed`` markers), its entry points load, and it builds without the
build backend's deprecation warnings. An editable install reads the checkout itself, so
only a built wheel shows what a newcomer's install would lack."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from configparser import ConfigParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "actors")
OFFLINE = ("Could not find a version that satisfies", "No matching distribution found")
"""What pip says when it cannot fetch the build backend (no registry, no local wheel)."""


def package_files() -> set[str]:
    """The packages' files as the repository holds them (without git: as the folder does,
    bytecode left out)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", *PACKAGES],
        capture_output=True,
        text=True,
    )
    if listed.returncode == 0 and listed.stdout:
        return {name for name in listed.stdout.split("\0") if name}
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[zipfile.ZipFile, str]:
    """The wheel built from a copy of the checkout's packaged files (the build writes its
    ``build/`` and ``.egg-info`` beside its sources: not into the checkout), and what the
    build printed."""
    src = tmp_path_factory.mktemp("src")
    for name in ["pyproject.toml", "README.md", *sorted(package_files())]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    printed = proc.stdout + proc.stderr
    if proc.returncode != 0 and any(line in printed for line in OFFLINE):
        pytest.skip("the build backend cannot be fetched (offline)")
    assert proc.returncode == 0, printed[-3000:]
    [wheel] = out.glob("axon_runtime-*.whl")
    return zipfile.ZipFile(wheel), printed


def test_the_wheel_holds_every_file_of_the_packages(built):
    wheel, _ = built
    shipped = {name for name in wheel.namelist() if ".dist-info/" not in name}
    assert shipped == package_files()


def test_the_wheel_marks_both_packages_as_typed(built):
    wheel, _ = built
    assert {"runtime/py.typed", "actors/py.typed"} <= set(wheel.namelist())


def test_the_wheels_entry_points_load(built):
    wheel, _ = built
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    points = ConfigParser()
    points.read_string(wheel.read(name).decode())
    targets = {
        f"{group}:{key}": value
        for group in points.sections()
        for key, value in points[group].items()
    }
    assert set(targets) == {"console_scripts:axon", "axon.plugins:otel", "axon.plugins:recorder"}
    for target in targets.values():
        module, attr = target.split(":")
        assert callable(getattr(importlib.import_module(module), attr)), target


def test_the_wheel_builds_without_a_deprecation_warning(built):
    _, printed = built
    assert "deprecated" not in printed.lower()


CACHED = """
import json
import runtime.output
from runtime import attrs_cache
state = attrs_cache._state
print(json.dumps({"file": runtime.__file__, "compiled": state.compiled, "read": len(state.stored),
                  "used": len(state.used), "path": state.path}))
"""


def test_uninstalling_the_wheel_leaves_nothing_even_after_the_attrs_method_cache_was_written(
    built, tmp_path
):
    """A process writes the compiled attrs methods into ``runtime``'s ``__pycache__`` at
    exit (runtime.attrs_cache); under a name of its own, pip left it (and so a ``runtime``
    folder, imported then as an empty namespace package). The venv sees the system's
    packages for Axon's dependencies; Axon itself comes from the wheel."""
    wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
    # Without the caller's PYTHONPATH: a checkout on it holds an editable install's
    # .egg-info, which pip would then find first and refuse to uninstall (outside the venv).
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
    }
    install = [*pip, "install", "--no-deps", "--no-index", "--ignore-installed", wheel.filename]
    subprocess.run(install, check=True, capture_output=True, env=env)

    def child() -> dict:
        out = subprocess.run(
            [python, "-c", CACHED],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout)

    first, second = child(), child()
    package = Path(first["file"]).parent
    assert package.is_relative_to(venv)
    assert Path(first["path"]).is_file() and Path(first["path"]).is_relative_to(package)
    assert (first["compiled"], second["compiled"]) == (True, False)  # the second read them all
    assert second["read"] == second["used"] == first["used"] > 30
    subprocess.run(
        [*pip, "uninstall", "-y", "axon-runtime"], check=True, capture_output=True, env=env
    )
    assert not package.exists(), sorted(str(p) for p in package.rglob("*"))
