"""``serve`` on a PostgreSQL store without psycopg installed says so first."""

from __future__ import annotations

import argparse
import sys

from runtime.app.web import serve


async def test_serve_says_a_missing_psycopg_in_one_line_before_redis_is_tried(monkeypatch, capsys):
    """With Redis not answering (port 1: nothing listens there), ``serve`` retried it for
    about 30 s, then failed on Redis, never naming the package to install."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg: ImportError
    argv = ["--store", "postgresql://x/y", "--redis", "redis://127.0.0.1:1/0", "--port", "0"]
    args = serve.add_serve_arguments(argparse.ArgumentParser()).parse_args(argv)
    assert await serve.serve_command(args) == 2
    assert capsys.readouterr().err == (
        "error: the PostgreSQL store needs the psycopg package, which is not installed: "
        "pip install 'axon-runtime[postgres]'\n"
    )
