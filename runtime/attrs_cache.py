"""The code attrs compiles for Axon's own classes, kept beside their bytecode.

Why: attrs writes each class's ``__init__`` (and whatever other methods it generates) as
Python source when the class is created, and compiles it, in every process, every time.
The contract's modules create about a hundred attrs classes, and those compilations were
about a quarter of what importing the contract costs a fresh process (issue 24, goal 2:
22 of 80 ms). Python keeps a module's compiled code in ``__pycache__`` so that a process
need not compile it again; this does the same for the methods attrs generates for the
classes of ``runtime`` and ``actors``, in one file in ``runtime``'s ``__pycache__`` (or
under ``sys.pycache_prefix``, as Python's bytecode would be). That file is the ``.pyc``
of :mod:`runtime.attrs_methods`, a module shipped empty and never imported: ``pip
uninstall`` removes the ``.pyc`` of every module it installed, so it removes this file
too (a file of another name was left behind, and with it a ``runtime`` folder that
Python then imported as an empty namespace package). It is a valid ``.pyc`` of that
module (whose code returns at once, the entries riding in its constants), stamped with
the module's size and time, so ``compileall`` deems it current and does not overwrite it.

What it changes: nothing a class does. attrs builds the same source as before (its own
checks, its ``linecache`` entry for debuggers); what is cached is the code that compiling
exactly that source under exactly that file name gives, marshalled as a ``.pyc`` holds a
module's, and it runs in the namespace attrs prepared, as attrs would run it. An entry is
used only for the same file name and the same source text, so a class that changed
compiles afresh; a file written by another Python is not read at all (compiled code
depends on the source, the name, the compiler flags and the Python, nothing else). Other
classes (the application's, other libraries') are compiled by attrs as ever.

How: :func:`install` wraps ``attr._make._compile_and_eval``, the one function through
which attrs compiles and runs what it generates. That function is private to attrs, so
the wrapper is installed only where it has the signature it was written against (that
of the attrs releases this project supports); elsewhere nothing is installed and attrs
compiles, as it would without Axon.
:mod:`runtime.chunks`, the first of the contract's modules to build classes, installs
it. The file is read then; it is written when the process exits if anything was
compiled (so once after an edit, or another Python), atomically (a rename: of two
processes writing at once, one's file is left, whole), and never when Python writes no
bytecode (``sys.dont_write_bytecode``, ``PYTHONDONTWRITEBYTECODE``) or where the folder
is not writable. Like a ``.pyc``, the file is code this process runs: it is as trusted
as the package's ``__pycache__`` it sits in.
"""

from __future__ import annotations
import __future__

import atexit
import functools
import importlib.util
import inspect
import marshal
import operator
import os
import stat
import sys
from collections.abc import Mapping
from types import CodeType
from typing import Any

import attr._make as make  # attrs' own module (loaded with attrs): what install() wraps

OURS = ("<attrs generated ", ("runtime.", "actors."))
"""The file names attrs gives the code it generates (``<attrs generated init
runtime.output.TextDelta>``) start with the first string; the class's module, the word
after the next space, with one of the prefixes when the class is ours."""

FORMAT = 3
"""Bumped when what the file holds changes shape (2: a generated ``__hash__``'s number
kept as :data:`SALT`; 3: kept as the ``.pyc`` of :data:`PLACEHOLDER`)."""

PLACEHOLDER = os.path.join(os.path.dirname(__file__), "attrs_methods.py")
"""The shipped module whose ``.pyc`` path the file takes (see the module's docstring)."""

_SIGNATURE = ("script", "globs", "locs", "filename")

SALT = -0x5A17_5A17_5A17_5A17
"""What the file keeps in place of a generated ``__hash__``'s per-process number (an
``int`` as wide, that no script of ours holds otherwise)."""

_state: _Cache | None = None


class _Cache:
    """The entries read from the file, those used or compiled by this process, and
    whether anything was compiled (the file is then written at exit)."""

    __slots__ = ("compiled", "flags", "header", "path", "stored", "used")

    def __init__(self, path: str | None, flags: int) -> None:
        self.path = path
        self.flags = flags
        self.header: tuple[Any, ...] = (FORMAT, importlib.util.MAGIC_NUMBER, flags)
        self.stored: dict[str, tuple[str, CodeType]] = _read(path, self.header) if path else {}
        self.used: dict[str, tuple[str, CodeType]] = {}
        self.compiled = False

    def code(self, script: str, filename: str) -> CodeType:
        """The code of ``script`` compiled as ``filename``: from the file when it holds
        that very script under that name, else compiled (and kept).

        A generated ``__hash__`` starts its tuple with the class's own number, attrs'
        ``hash()`` of a string, which differs from process to process (string hashing
        is salted): kept as it is, such a script would never be found again, and every
        process would compile it and rewrite the file at exit. It is kept with
        :data:`SALT` in that number's place, and the code read is given this process's
        number back (:func:`_salted`)."""
        salt = hash(f"<attrs generated hash {filename.rsplit(' ', 1)[-1]}")
        line = f"        {salt},\n"
        salted = line in script
        if salted:
            script = script.replace(line, f"        {SALT},\n", 1)
        entry = self.stored.get(filename)
        if entry is not None and entry[0] == script:
            code = entry[1]
        else:
            code = compile(script, filename, "exec", flags=self.flags, dont_inherit=True)
            if not self.compiled and self.path is not None and not sys.dont_write_bytecode:
                atexit.register(self.write)
            self.compiled = True
        self.used[filename] = (script, code)
        return _salted(code, salt) if salted else code

    def write(self) -> None:
        """Store what this process used, with the file's other entries of modules this
        process built no class of (a module it did build is all in ``used``: an entry of
        it left out is a class that is gone or changed). Silently nothing where the folder
        cannot be written."""
        if self.path is None:
            return
        rebuilt = {_module(name) for name in self.used}
        kept = {k: v for k, v in self.stored.items() if _module(k) not in rebuilt}
        entries = {**kept, **self.used}
        tmp = f"{self.path}.{os.getpid()}.{id(self)}"  # as importlib writes a .pyc
        try:
            if not _replaceable(self.path):
                return
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(tmp, os.O_EXCL | os.O_CREAT | os.O_WRONLY, 0o666)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_pyc((self.header, entries)))
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass


def _pyc(payload: tuple[Any, ...]) -> bytes:
    """``payload`` as a ``.pyc`` of :data:`PLACEHOLDER`: the header ``importlib`` and
    ``compileall`` check (this Python's magic number, timestamp-based, the source's time
    and size), then a code object that returns ``None`` with ``payload`` among its
    constants (importing the placeholder runs it: an empty module)."""
    try:
        st = os.stat(PLACEHOLDER)
        mtime, size = int(st.st_mtime), st.st_size
    except OSError:
        mtime = size = 0
    code = compile("", PLACEHOLDER, "exec", dont_inherit=True)
    code = code.replace(co_consts=(*code.co_consts, payload))
    header = b"".join(
        [
            importlib.util.MAGIC_NUMBER,
            *(n.to_bytes(4, "little") for n in (0, mtime & 0xFFFF_FFFF, size & 0xFFFF_FFFF)),
        ]
    )
    return header + marshal.dumps(code)


def _salted(code: CodeType, salt: int) -> CodeType:
    """``code`` with :data:`SALT` replaced by ``salt`` in its constants and in those of
    the functions it defines (the generated ``__hash__`` is one of them)."""
    return code.replace(co_consts=tuple(_salted_const(c, salt) for c in code.co_consts))


def _salted_const(const: Any, salt: int) -> Any:
    """One constant of :func:`_salted`'s. A tuple is looked into: the ``__hash__`` of a
    class without fields hashes ``(SALT,)`` alone, which the compiler folds into one
    tuple constant (missed, every such class hashed alike, and unlike attrs' own)."""
    if type(const) is int and const == SALT:
        return salt
    if isinstance(const, CodeType):
        return _salted(const, salt)
    if type(const) is tuple:
        return tuple(_salted_const(c, salt) for c in const)
    return const


def _module(filename: str) -> str:
    """``runtime.output`` of ``<attrs generated init runtime.output.TextDelta>`` (a
    nested class's qualified name has more dots: its module then reads longer, which
    only keeps its entries apart from the module's own)."""
    return filename.rsplit(" ", 1)[-1].rstrip(">").rsplit(".", 1)[0]


def _ours(filename: str) -> bool:
    prefix, modules = OURS
    return filename.startswith(prefix) and filename.rsplit(" ", 1)[-1].startswith(modules)


def _replaceable(path: str) -> bool:
    """Whether the rename may put the file at ``path``: nothing there, or a regular file.
    A device, a FIFO or a symbolic link there (``/dev/null`` linked or bound in to keep
    no cache) was replaced by a regular file; ``py_compile`` refuses the same."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return True
    return stat.S_ISREG(mode)


def _read(path: str, header: tuple[Any, ...]) -> dict[str, tuple[str, CodeType]]:
    """The file's entries, or none when it is missing, unreadable, no regular file (a
    FIFO there made importing ``runtime`` wait for a writer), or of another Python or
    format."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return {}
            data = f.read()  # marshal.load(f) would read it object by object
        if data[:4] != importlib.util.MAGIC_NUMBER:
            return {}
        code = marshal.loads(memoryview(data)[16:])  # past the .pyc header (see _pyc)
        stored_header, entries = code.co_consts[-1]
    except (OSError, EOFError, ValueError, TypeError, AttributeError, IndexError):
        return {}  # IndexError: a code object without constants (not one _pyc wrote)
    if stored_header != header or not isinstance(entries, dict):
        return {}
    return {
        name: entry
        for name, entry in entries.items()
        if isinstance(name, str)  # write() reads the module out of it at exit
        and isinstance(entry, tuple)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], CodeType)
    }


def cache_path() -> str | None:
    """Where the file is: the ``.pyc`` of :data:`PLACEHOLDER` in ``runtime``'s
    ``__pycache__`` (or its place under ``sys.pycache_prefix``), named for this Python;
    ``None`` where Python keeps no bytecode (no cache tag). The unoptimised name even
    under ``-O``: the one ``pip uninstall`` removes. ``None`` too where the placeholder
    is missing (a package built without it): a file there would be left behind."""
    if not os.path.isfile(PLACEHOLDER):
        return None
    try:
        return importlib.util.cache_from_source(PLACEHOLDER, optimization="")
    except NotImplementedError:
        return None


def _future_flags(module: Any) -> int:
    """The compiler flags of the ``__future__`` features ``module`` imports: attrs
    compiles with ``compile``'s default of inheriting its own module's, so the code
    cached is compiled with the same."""
    return functools.reduce(
        operator.or_,
        (v.compiler_flag for v in vars(module).values() if isinstance(v, __future__._Feature)),
        0,
    )


def install() -> bool:
    """Cache the code attrs compiles for ``runtime``'s and ``actors``' classes from now
    on (idempotent). ``False``, and nothing changed, when this attrs compiles through
    something else than the function this wraps."""
    global _state
    original = getattr(make, "_compile_and_eval", None)
    if original is None or getattr(original, "_axon_cached", False):
        return original is not None
    try:
        params = tuple(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return False
    if params != _SIGNATURE:
        return False
    _state = _Cache(cache_path(), _future_flags(make))
    state = _state

    def _compile_and_eval(
        script: str,
        globs: dict[str, Any] | None,
        locs: Mapping[str, object] | None = None,
        filename: str = "",
    ) -> None:
        if not _ours(filename):
            return original(script, globs, locs, filename)
        eval(state.code(script, filename), globs, locs)

    _compile_and_eval._axon_cached = True  # type: ignore[attr-defined]
    _compile_and_eval.__wrapped__ = original  # type: ignore[attr-defined]
    make._compile_and_eval = _compile_and_eval
    return True


def warm(packages: tuple[str, ...] = ("runtime", "actors")) -> str | None:
    """Import every module of ``packages`` whose dependencies are installed (so every
    class is built) and write the file now, even where Python writes no bytecode: what
    an image's build step runs (``python -m runtime.attrs_cache``), as ``python -m
    compileall`` writes bytecode whatever ``PYTHONDONTWRITEBYTECODE`` says. The file's
    path; ``None`` when this attrs or this Python keeps none."""
    import pkgutil  # only here: not a cost of every process's start-up (issue 24)

    if not install() or _state is None or _state.path is None:
        return None
    for name in packages:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if module.name.endswith(".__main__") or module.name == "runtime.attrs_methods":
                continue  # a command, not a module to import; the file's placeholder
            try:
                importlib.import_module(module.name)
            except ImportError:
                continue  # an optional dependency (a provider's SDK, a store's driver)
    _state.write()
    return _state.path if os.path.exists(_state.path) else None


def main() -> int:
    """``python -m runtime.attrs_cache``: :func:`warm`, saying where the file is."""
    # Run as ``-m``, this file is ``__main__``, a second copy of the module: the one
    # runtime.chunks installs from is runtime.attrs_cache.
    from runtime import attrs_cache

    path = attrs_cache.warm()
    if path is None:
        print("no attrs method cache here: this Python or attrs keeps none", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["cache_path", "install", "warm"]
