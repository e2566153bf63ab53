"""The suite's own servers: it never uses, restarts or flushes the machine's.

These pin tests/support/services.py and the CI guard (tests/support/machine_guard.py)
that proves a whole run left the machine's PostgreSQL and Redis alone.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support import machine_guard
from tests.support.pg import EXTERNAL_PG, pg_base_url, restart_postgres
from tests.support.redis import EXTERNAL_REDIS, redis_address, start_redis, stop_redis
from tests.support.services import own_postgres, own_redis

pytestmark = [
    pytest.mark.skipif(EXTERNAL_PG is not None, reason="AXON_TEST_PG names the user's server"),
    pytest.mark.skipif(EXTERNAL_REDIS is not None, reason="AXON_TEST_REDIS names the user's"),
]


def test_postgresql_tests_use_a_server_the_run_started_on_a_port_of_its_own() -> None:
    url = urlsplit(pg_base_url())
    assert (url.hostname, url.port) == ("127.0.0.1", own_postgres().port)
    assert url.port != 5432


def test_redis_tests_use_a_server_the_run_started_on_a_port_of_its_own() -> None:
    assert redis_address() == ("127.0.0.1", own_redis().port)
    assert own_redis().port != 6379


def test_the_guard_passes_when_nothing_was_touched(tmp_path: Path) -> None:
    state = tmp_path / "guard.json"
    machine_guard.record(state, pg=pg_base_url(), redis=redis_address())
    assert machine_guard.check(state, pg=pg_base_url(), redis=redis_address()) == 0


def test_the_guard_catches_a_postgresql_restart(tmp_path: Path) -> None:
    state = tmp_path / "guard.json"
    machine_guard.record(state, pg=pg_base_url(), redis=redis_address())
    restart_postgres()  # the run's own server stands in for the machine's
    assert machine_guard.check(state, pg=pg_base_url(), redis=redis_address()) == 1


def test_the_guard_catches_a_redis_restart(tmp_path: Path) -> None:
    state = tmp_path / "guard.json"
    machine_guard.record(state, pg=pg_base_url(), redis=redis_address())
    stop_redis()
    start_redis()
    assert machine_guard.check(state, pg=pg_base_url(), redis=redis_address()) == 1


def test_the_guard_catches_a_flushed_redis(tmp_path: Path) -> None:
    state = tmp_path / "guard.json"
    machine_guard.record(state, pg=pg_base_url(), redis=redis_address())
    machine_guard._redis("FLUSHDB", at=redis_address())
    assert machine_guard.check(state, pg=pg_base_url(), redis=redis_address()) == 1
