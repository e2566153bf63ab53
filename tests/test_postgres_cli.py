"""``--store postgresql://...`` on ``run``, ``sessions`` and ``show``: the same commands as
with an SQLite file, against the machine's real PostgreSQL (a fresh schema per test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def axon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_run_saves_to_postgresql_and_show_and_sessions_read_it_back(pg_url):
    first = axon("run", "--store", pg_url, "--session", "pg1", "--jsonl", "Weather in Paris?")
    assert first.returncode == 0, first.stderr
    again = axon("run", "--store", pg_url, "--session", "pg1", "--jsonl", "And Oslo?")
    assert again.returncode == 0, again.stderr
    listed = axon("sessions", "--store", pg_url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("pg1\t") and "messages" in listed.stdout
    shown = axon("show", "--store", pg_url, "pg1")
    assert shown.returncode == 0, shown.stderr
    assert "Weather in Paris?" in shown.stdout and "And Oslo?" in shown.stdout


def test_a_postgresql_url_whose_server_does_not_answer_is_one_line_and_exit_2():
    shown = axon("sessions", "--store", "postgresql://nobody@127.0.0.1:1/none")
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert shown.stderr.startswith("error: ") and "Traceback" not in shown.stderr
