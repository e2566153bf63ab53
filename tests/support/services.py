"""Throwaway PostgreSQL and Redis servers that the test run starts, owns and tears down.

The suite runs on people's workstations, next to databases they use. So it never connects
to a server it did not start, unless the user points it at one on purpose
(``AXON_TEST_PG`` / ``AXON_TEST_REDIS``, see docs/testing.md), and it restarts or kills
only servers it started itself. Each server here:

* lives in its own temporary data directory, on a free loopback port chosen at start;
* is started lazily, once per test run, by the first test that needs it, and stopped (its
  directory deleted) when the run ends;
* can be restarted or killed by the tests that exercise a server going away;
* is watched by a process of its own (:mod:`tests.support.reaper`) that stops it and
  deletes its directory if the run is killed before it could (``SIGTERM``, ``SIGKILL``).

PostgreSQL refuses to run as root; when the suite runs as root (CI, containers) the
server runs as the ``postgres`` system user the Debian package creates.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_TIMEOUT = 60.0


class ServiceUnavailable(Exception):
    """The server cannot be started here; the message says what to install or set."""


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, *, timeout: float, alive: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            raise ServiceUnavailable(f"the server exited with status {alive.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise ServiceUnavailable(f"nothing listened on 127.0.0.1:{port} after {timeout:.0f} s")


# -- PostgreSQL --------------------------------------------------------------------------


def _postgres_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: ``AXON_TEST_PG_BIN``, then Debian's newest
    ``/usr/lib/postgresql/N/bin``, then ``PATH``."""
    if explicit := os.environ.get("AXON_TEST_PG_BIN"):
        return Path(explicit)

    def version(initdb: str) -> int:
        name = Path(initdb).parent.parent.name
        return int(name) if name.isdigit() else 0

    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


class PostgresServer:
    """A PostgreSQL cluster of the test run's own: ``initdb`` into a temporary directory,
    ``pg_ctl start`` on a free port, database ``test``, user ``postgres``, trust auth.
    ``options``: more ``-c name=value`` settings for the server (a test that reads
    ``pg_stat_statements`` preloads it)."""

    def __init__(self, options: str = "") -> None:
        self.options = options
        bindir = _postgres_bindir()
        if bindir is None or not (bindir / "pg_ctl").exists():
            raise ServiceUnavailable(
                "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: "
                "apt-get install postgresql, or set AXON_TEST_PG_BIN to their folder"
            )
        self.bindir = bindir
        self.run_as: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise ServiceUnavailable(
                    "running as root, and PostgreSQL will not run as root: create a "
                    "'postgres' system user (Debian's postgresql package does)"
                ) from None
            self.run_as = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="axon-test-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        if self.run_as is not None:
            shutil.chown(self.root, user=self.run_as)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        watch(
            self.root,
            "postgresql",
            self._command("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop"),
        )
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "test")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/test"

    def _command(self, tool: str, *args: str) -> list[str]:
        command = [str(self.bindir / tool), *args]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        return command

    def _run(self, tool: str, *args: str, timeout: float = START_TIMEOUT) -> None:
        command = self._command(tool, *args)
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=timeout
            )
            if done.returncode != 0:
                out.seek(0)
                said = out.read().decode(errors="replace").strip()[-500:]
                raise ServiceUnavailable(f"{tool} failed ({done.returncode}): {said}")

    def _pg_ctl(self, *action: str) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            f"-c max_connections=300 {self.options}"
        )
        # -l on every call: a server started without it writes to pg_ctl's own output,
        # which then never closes.
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", str(int(START_TIMEOUT)), *action)  # fmt: skip

    def start(self) -> None:
        self._pg_ctl("start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def restart(self) -> None:
        """Stop the server (every connection is cut) and start it again on the same port."""
        self._pg_ctl("-m", "fast", "restart")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


# -- Redis -------------------------------------------------------------------------------


class RedisServer:
    """A ``redis-server`` of the test run's own on a free port: no persistence, its
    working directory temporary. ``stop`` kills it; ``start`` brings it back empty on
    the same port (what a restart without persistence does to a real deployment).

    ``tls``: it listens with TLS only (``rediss://``), on a self-signed certificate made
    for it (:func:`self_signed`); a ``redis-server`` built without TLS is
    :class:`ServiceUnavailable`, saying so. ``options``: more ``--name value`` settings."""

    def __init__(self, *, tls: bool = False, options: tuple[str, ...] = ()) -> None:
        self.tls = tls
        self.options = options
        binary = os.environ.get("AXON_TEST_REDIS_SERVER") or shutil.which("redis-server")
        if binary is None:
            raise ServiceUnavailable(
                "redis-server is not installed: apt-get install redis-server, or set "
                "AXON_TEST_REDIS_SERVER to its path"
            )
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="axon-test-redis-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        watch(self.root, "redis")
        listen = ["--port", str(self.port)]
        if tls:
            cert, key = self_signed(self.root)
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                      "--tls-key-file", str(key), "--tls-auth-clients", "no"]  # fmt: skip
        self._listen = listen
        try:
            self.start()
        except ServiceUnavailable as exc:
            said = (self.root / "server.log").read_text(errors="replace")[-300:].strip()
            shutil.rmtree(self.root, ignore_errors=True)
            if tls:
                raise ServiceUnavailable(
                    f"redis-server with TLS did not start (built without TLS?): {exc}; {said}"
                ) from None
            raise

    @property
    def url(self) -> str:
        if self.tls:  # the certificate is the test's own: not verified
            return f"rediss://127.0.0.1:{self.port}/0?ssl_cert_reqs=none"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.process = subprocess.Popen(
            [
                self.binary, *self._listen, "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.root),
                "--logfile", str(self.root / "server.log"), *self.options,
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_for_port(self.port, timeout=START_TIMEOUT, alive=self.process)

    def stop(self) -> None:
        """Kill the server at once (no save): everything it held is gone."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(timeout=30)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def self_signed(root: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, written in ``root``: made
    with ``openssl`` (what Debian's redis-server links against, so present where it
    is); :class:`ServiceUnavailable` where it is not installed."""
    cert, key = root / "cert.pem", root / "key.pem"
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServiceUnavailable("openssl is not installed: no certificate for a TLS Redis")
    try:
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            timeout=START_TIMEOUT, check=True,
        )  # fmt: skip
    except subprocess.CalledProcessError as exc:
        said = exc.stderr.decode(errors="replace")[-300:]
        raise ServiceUnavailable(f"openssl made no certificate: {said}") from None
    return cert, key


def watch(root: Path, kind: str, command: list[str] | None = None) -> None:
    """Have a :mod:`tests.support.reaper` stop the server in ``root`` (``command`` stops a
    PostgreSQL) and delete ``root`` once this process is gone, if nothing did before."""
    subprocess.run(
        [sys.executable, "-m", "tests.support.reaper", str(os.getpid()), str(root), kind,
         *(command or [])],
        cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=START_TIMEOUT,
        check=True,
    )  # fmt: skip


# -- PgBouncer ---------------------------------------------------------------------------


def _pgbouncer_binary() -> str | None:
    if explicit := os.environ.get("AXON_TEST_PGBOUNCER"):
        return explicit
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
    )


class PgBouncerServer:
    """A ``pgbouncer`` of the test run's own in front of the run's own PostgreSQL: its
    configuration, log and pid file in a temporary directory, a free loopback port,
    ``pool_mode = transaction`` (what most deployments run), trust auth, every database
    of the server reachable under its own name (``* = host=... port=...``). Runs as the
    ``postgres`` system user when the suite runs as root (PgBouncer refuses root)."""

    def __init__(self, server: PostgresServer, *, pool_mode: str = "transaction") -> None:
        binary = _pgbouncer_binary()
        if binary is None:
            raise ServiceUnavailable(
                "pgbouncer is not installed: apt-get install pgbouncer, or set "
                "AXON_TEST_PGBOUNCER to its path"
            )
        self.binary = binary
        self.server = server
        self.root = Path(tempfile.mkdtemp(prefix="axon-test-pgbouncer-"))
        self.port = free_port()
        self.run_as = server.run_as
        (self.root / "userlist.txt").write_text('"postgres" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'userlist.txt'}\n"
            f"pool_mode = {pool_mode}\nmax_client_conn = 500\ndefault_pool_size = 20\n"
            f"logfile = {self.root / 'pgbouncer.log'}\npidfile = {self.root / 'pgbouncer.pid'}\n"
            "admin_users = postgres\nserver_reset_query =\n"
        )
        if self.run_as is not None:
            for path in (self.root, *self.root.iterdir()):
                shutil.chown(path, user=self.run_as)
        self.process: subprocess.Popen[bytes] | None = None
        watch(self.root, "pgbouncer")
        self.start()

    @property
    def url(self) -> str:
        """The URL of database ``test`` through the bouncer."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/test"

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        command = [self.binary, str(self.root / "pgbouncer.ini")]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        self.process = subprocess.Popen(
            command, cwd=self.root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_for_port(self.port, timeout=START_TIMEOUT, alive=self.process)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


# -- one of each per test run ------------------------------------------------------------

_started: dict[str, PostgresServer | RedisServer | PgBouncerServer | ServiceUnavailable] = {}


def _own(kind: str) -> PostgresServer | RedisServer | PgBouncerServer:
    """The run's own server of ``kind``, started on first use (and its failure kept)."""
    got = _started.get(kind)
    if got is None:
        try:
            if kind == "pgbouncer":
                got = PgBouncerServer(own_postgres())
            else:
                got = PostgresServer() if kind == "postgresql" else RedisServer()
        except (ServiceUnavailable, OSError, subprocess.SubprocessError) as err:
            got = err if isinstance(err, ServiceUnavailable) else ServiceUnavailable(str(err))
        else:
            atexit.register(got.close)
        _started[kind] = got
    if isinstance(got, ServiceUnavailable):
        raise got
    return got


def own_postgres() -> PostgresServer:
    server = _own("postgresql")
    assert isinstance(server, PostgresServer)
    return server


def own_redis() -> RedisServer:
    server = _own("redis")
    assert isinstance(server, RedisServer)
    return server


def own_pgbouncer() -> PgBouncerServer:
    """The run's own PgBouncer (transaction pooling) in front of its own PostgreSQL."""
    server = _own("pgbouncer")
    assert isinstance(server, PgBouncerServer)
    return server


def close_all() -> None:
    """Stop every server this run started (pytest's session end; atexit as a backstop)."""
    for server in sorted(_started.values(), key=lambda s: not isinstance(s, PgBouncerServer)):
        if not isinstance(server, ServiceUnavailable):
            server.close()
    _started.clear()
