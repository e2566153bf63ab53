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


# -- credentials never reach a start-up line -------------------------------------------------

SECRET = "hunter2-pg-secret"
SSL_SECRET = "ssl-key-secret-42"


def with_credentials(pg_url: str) -> str:
    """``pg_url`` carrying a password in every place libpq reads one (the test server
    trusts loopback, so it ignores them and the command starts)."""
    scheme, _, rest = pg_url.partition("://")
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:{SECRET}@{host}&password={SECRET}&sslpassword={SSL_SECRET}"


def server(pg_url: str) -> str:
    """The ``host:port`` of the test server (the run's own, on a port of its own)."""
    return pg_url.partition("@")[2].partition("/")[0]


def first_line(*args: str) -> tuple[str, str]:
    """The first line a long-running command prints, and its stderr, after stopping it."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    return line, err


def test_serve_prints_its_postgresql_store_without_the_passwords(pg_url):
    line, err = first_line("serve", "--port", "0", "--store", with_credentials(pg_url))
    assert line.startswith("Axon web UI on http://127.0.0.1:"), err
    assert f"store postgresql://postgres:[redacted]@{server(pg_url)}/test?schema=" in line
    assert SECRET not in line + err and SSL_SECRET not in line + err


def test_worker_prints_its_postgresql_store_without_the_passwords(pg_url):
    line, err = first_line("worker", "--store", with_credentials(pg_url))
    assert line.startswith("Axon worker "), err
    assert f"on postgresql://postgres:[redacted]@{server(pg_url)}/test?schema=" in line
    assert SECRET not in line + err and SSL_SECRET not in line + err
