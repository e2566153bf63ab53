"""The code attrs compiles for Axon's classes, kept beside the bytecode (runtime.attrs_cache)."""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import CodeType

import attr._make
import attrs

import runtime.chunks  # noqa: F401 (its classes are the first built through the cache)
from runtime import attrs_cache

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json
import runtime.events, runtime.output
from runtime import attrs_cache
from runtime.output import TextDelta
state = attrs_cache._state
delta = TextDelta(step=0, part_id="t1", text="hi")
print(json.dumps({
    "compiled": state.compiled,
    "used": len(state.used),
    "path": state.path,
    "value": repr(delta),
    "equal": delta == TextDelta(step=0, part_id="t1", text="hi"),
}))
"""


def _child(prefix: Path, *, bytecode: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    env["PYTHONPATH"] = str(REPO)
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_a_second_process_builds_the_contract_from_the_file_without_compiling(tmp_path):
    first = _child(tmp_path)
    second = _child(tmp_path)
    assert first["compiled"] is True
    assert Path(first["path"]).is_file()
    assert Path(first["path"]).is_relative_to(tmp_path)
    assert second["compiled"] is False
    assert second["used"] == first["used"] > 50
    assert (
        second["value"]
        == first["value"]
        == ("TextDelta(step=0, part_id='t1', text='hi', seq=0, session_id='', turn_id='')")
    )
    assert second["equal"] is True


SALTED = """
import json
import runtime.ratelimit
from runtime import attrs_cache
from runtime.ratelimit import RateLimit
limit = RateLimit(requests_per_minute=3)
number = hash("<attrs generated hash runtime.ratelimit.RateLimit>")
print(json.dumps({
    "compiled": attrs_cache._state.compiled,
    "hash": hash(limit) == hash((number, 3, None, None, limit.max_pause)),
}))
"""


def test_a_class_with_a_generated_hash_is_read_from_the_file_by_another_process(tmp_path):
    """attrs' ``__hash__`` starts with a number that string hashing salts anew in each
    process: kept verbatim, a second process never found it, compiled it again and
    rewrote the file at exit. Now it reads it, and hashes as attrs' own would."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(tmp_path), PYTHONPATH=str(REPO))

    def child(seed: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", SALTED],
            env={**env, "PYTHONHASHSEED": seed},
            cwd=REPO, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return json.loads(out.stdout)

    children = [child("1"), child("2")]
    assert [c["compiled"] for c in children] == [True, False]
    assert [c["hash"] for c in children] == [True, True]


def test_no_file_is_written_where_python_writes_no_bytecode(tmp_path):
    child = _child(tmp_path, bytecode=False)
    assert child["compiled"] is True
    assert not Path(child["path"]).exists()


def _cache(path: Path) -> attrs_cache._Cache:
    return attrs_cache._Cache(str(path), attrs_cache._future_flags(attr._make))


NAME = "<attrs generated methods runtime.example.Point>"
SCRIPT = "def __init__(self, x):\n    _setattr(self, 'x', x)\n"


def test_the_same_source_under_the_same_name_is_read_not_compiled(tmp_path):
    path = tmp_path / "cache.bin"
    first = _cache(path)
    code = first.code(SCRIPT, NAME)
    first.write()
    again = _cache(path)
    assert again.code(SCRIPT, NAME).co_code == code.co_code
    assert again.code(SCRIPT, NAME).co_filename == NAME
    assert again.compiled is False


def test_a_changed_source_is_compiled_afresh(tmp_path):
    path = tmp_path / "cache.bin"
    first = _cache(path)
    first.code(SCRIPT, NAME)
    first.write()
    changed = SCRIPT.replace("x", "y")
    again = _cache(path)
    code = again.code(changed, NAME)
    assert again.compiled is True
    (init,) = (c for c in code.co_consts if isinstance(c, CodeType))
    assert init.co_varnames == ("self", "y")


def test_a_damaged_file_or_one_of_another_python_is_not_read(tmp_path):
    path = tmp_path / "cache.bin"
    path.write_bytes(b"\x00garbage")
    assert _cache(path).stored == {}
    entry = {NAME: (SCRIPT, compile(SCRIPT, NAME, "exec"))}
    path.write_bytes(attrs_cache._pyc(((attrs_cache.FORMAT, b"\x00\x00\r\n", 0), entry)))
    assert _cache(path).stored == {}


def test_entries_of_another_shape_are_dropped_and_the_rest_read(tmp_path):
    path = tmp_path / "cache.bin"
    header = _cache(path).header
    good = (SCRIPT, compile(SCRIPT, NAME, "exec"))
    path.write_bytes(attrs_cache._pyc((header, {NAME: good, "other": ("x", "not code"), "n": 1})))
    assert list(_cache(path).stored) == [NAME]


def test_writing_keeps_other_modules_entries_and_drops_a_rebuilt_modules_stale_ones(tmp_path):
    path = tmp_path / "cache.bin"
    other = "<attrs generated methods runtime.other.Thing>"
    stale = "<attrs generated methods runtime.example.Gone>"
    first = _cache(path)
    first.code(SCRIPT, other)
    first.code(SCRIPT, stale)
    first.write()
    second = _cache(path)
    second.code(SCRIPT, NAME)  # runtime.example rebuilt without Gone
    second.write()
    assert set(_cache(path).stored) == {other, NAME}


def test_the_file_is_readable_as_a_pyc_would_be(tmp_path):
    path = tmp_path / "cache.bin"
    cache = _cache(path)
    cache.code(SCRIPT, NAME)
    cache.write()
    assert path.stat().st_mode & 0o444 == 0o444 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == ["cache.bin"]  # no temporary file left


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_application_s_own_classes_are_not_cached():
    assert attrs_cache.install() is True  # installed already: runtime.chunks did it
    assert getattr(attr._make._compile_and_eval, "_axon_cached", False)

    @attrs.frozen
    class Local:
        x: int

    state = attrs_cache._state
    assert state is not None
    assert not any("Local" in name for name in state.used)
    assert any(name.endswith("runtime.chunks.TextChunk>") for name in state.used)
    assert Local(x=1).x == 1


def test_an_attrs_that_compiles_otherwise_is_left_alone(monkeypatch):
    def other(script, globs):  # another signature: not the function the cache wraps
        raise AssertionError("not called")

    monkeypatch.setattr(attr._make, "_compile_and_eval", other)
    assert attrs_cache.install() is False
    assert attr._make._compile_and_eval is other


def test_an_attrs_without_the_function_is_left_alone(monkeypatch):
    monkeypatch.delattr(attr._make, "_compile_and_eval")
    assert attrs_cache.install() is False
    assert not hasattr(attr._make, "_compile_and_eval")


def test_warming_writes_the_file_even_where_python_writes_no_bytecode(tmp_path):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "runtime.attrs_cache"],
        env=env, cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    path = Path(out.stdout.strip())
    assert path.is_file() and path.is_relative_to(tmp_path)
    after = _child(tmp_path, bytecode=False)  # reads it, writes nothing
    assert after["compiled"] is False
    assert after["used"] > 50


# Each child, having compiled, waits until all four have before it exits (and writes): without
# this a slow starter could find a fast one's file already there and read it instead.
BARRIER = """
import os, sys, time
open(os.path.join(sys.argv[1], f"ready-{os.getpid()}"), "w").close()
while sum(name.startswith("ready-") for name in os.listdir(sys.argv[1])) < 4:
    time.sleep(0.01)
"""


def test_processes_writing_the_file_at_once_leave_one_whole_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(tmp_path / "prefix"), PYTHONPATH=str(REPO))
    argv = [sys.executable, "-c", CHILD + BARRIER, str(tmp_path)]
    children = [
        subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE) for _ in range(4)
    ]  # all compile (no file yet), all write at exit
    outs = [json.loads(child.communicate(timeout=120)[0]) for child in children]
    assert all(out["compiled"] for out in outs)
    path = Path(outs[0]["path"])
    assert len(_cache(path).stored) == outs[0]["used"]  # whole: one writer's file
    assert [p.name for p in path.parent.iterdir() if "attrs_methods" in p.name] == [path.name]
    assert _child(tmp_path / "prefix")["compiled"] is False


def test_compileall_leaves_the_file_as_it_is(tmp_path):
    """The file is the ``.pyc`` of the placeholder module, stamped as current: an image's
    ``python -m compileall`` after ``python -m runtime.attrs_cache`` keeps it."""
    path = Path(_child(tmp_path)["path"])
    assert path.name.startswith("attrs_methods.")
    written = path.read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", attrs_cache.PLACEHOLDER],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    assert path.read_bytes() == written


def test_a_code_object_without_constants_at_the_path_is_not_read(tmp_path):
    path = tmp_path / "cache.bin"
    empty = compile("", "x", "exec").replace(co_consts=())
    path.write_bytes(importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(empty))
    assert _cache(path).stored == {}


def test_an_entry_named_by_other_than_a_string_is_dropped_so_the_file_can_be_written(tmp_path):
    path = tmp_path / "cache.bin"
    header = _cache(path).header
    good = (SCRIPT, compile(SCRIPT, NAME, "exec"))
    path.write_bytes(attrs_cache._pyc((header, {1: good, NAME: good})))
    cache = _cache(path)
    cache.code(SCRIPT, "<attrs generated methods runtime.other.Thing>")
    cache.write()
    assert set(_cache(path).stored) == {NAME, "<attrs generated methods runtime.other.Thing>"}


def test_a_hashed_class_without_fields_hashes_with_its_own_number():
    """Its ``__hash__`` hashes ``(number,)``, folded into one tuple constant: the
    number was left the file's stand-in, so all such classes hashed alike."""
    namespace: dict[str, object] = {"__name__": "runtime.example_empty", "attrs": attrs}
    exec(
        "@attrs.frozen\nclass Empty:\n    pass\n@attrs.frozen\nclass Other:\n    pass\n",
        namespace,
    )
    empty, other = namespace["Empty"](), namespace["Other"]()  # type: ignore[operator]
    own = hash("<attrs generated hash runtime.example_empty.Empty>")
    assert hash(empty) == hash((own,))
    assert hash(empty) != hash(other)


def _written_at(path: Path) -> None:
    """A cache holding one compiled entry written to ``path`` (read nothing first)."""
    cache = _cache(tmp := path.parent / "elsewhere.bin")
    assert not tmp.exists()
    cache.path = str(path)
    cache.code(SCRIPT, NAME)
    cache.write()


def test_a_fifo_at_the_path_is_not_replaced_by_the_write(tmp_path):
    """A device (``/dev/null`` bound or linked in to keep no cache) or a FIFO at the path
    was replaced by a regular file, as ``py_compile`` refuses to."""
    path = tmp_path / "cache.bin"
    os.mkfifo(path)
    _written_at(path)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["cache.bin"]  # no temporary file left


def test_a_symbolic_link_at_the_path_is_not_replaced_by_the_write(tmp_path):
    target = tmp_path / "theirs"
    target.write_text("theirs")
    path = tmp_path / "cache.bin"
    path.symlink_to(target)
    _written_at(path)
    assert path.is_symlink() and target.read_text() == "theirs"


def test_a_fifo_at_the_path_is_read_as_no_entries_without_waiting_for_a_writer(tmp_path):
    """Importing ``runtime`` opened it and waited for a writer's end of file. The test
    holds both ends, so that the read, if made, waits until the end is closed."""
    path = tmp_path / "cache.bin"
    os.mkfifo(path)
    both = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    read: list[dict] = []
    reader = threading.Thread(target=lambda: read.append(_cache(path).stored), daemon=True)
    reader.start()
    reader.join(30)
    done_before_the_end_was_closed = bool(read)
    os.close(both)
    reader.join(30)
    assert done_before_the_end_was_closed and read == [{}]
