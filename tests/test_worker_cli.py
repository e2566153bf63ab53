"""``python -m runtime worker``'s options that need no database to check."""

from __future__ import annotations

import sys

import pytest

from actors.relays.redis_streams import END_WAIT, FLUSH_INTERVAL, RedisRelay
from runtime.app.cli import build_parser
from runtime.app.worker import relay_options_of
from runtime.errors import ConfigurationError


def _args(*flags: str):
    return build_parser().parse_args(["worker", "--store", "postgresql://x/y", *flags])


def test_the_relay_keeps_its_own_timings_unless_the_command_line_sets_them():
    assert relay_options_of(_args()) == {}


def test_the_relay_timings_on_the_command_line_reach_the_relay_by_its_keywords():
    options = relay_options_of(
        _args("--relay-flush-interval", "0", "--relay-end-wait", "0.2", "--redis-prefix", "p:")
    )
    assert options == {"flush_interval": 0.0, "end_wait": 0.2, "prefix": "p:"}
    relay = RedisRelay(client=None, nursery=_Nursery(), **options)
    assert (relay.flush_interval, relay.end_wait, relay.prefix) == (0.0, 0.2, "p:")
    assert (FLUSH_INTERVAL, END_WAIT) != (0.0, 0.2)  # the defaults are something else


@pytest.mark.parametrize("flag", ["--relay-flush-interval", "--relay-end-wait"])
@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_negative_or_nan_relay_timing_is_a_configuration_error_naming_the_flag(flag, value):
    with pytest.raises(ConfigurationError, match=flag):
        relay_options_of(_args(flag, value))


class _Nursery:
    """Takes the relay's batcher task without running it."""

    def start_soon(self, fn, *args):
        pass


def test_max_sessions_on_the_command_line_reaches_the_worker():
    from runtime.app.worker import DEFAULT_MAX_SESSIONS, worker_options

    assert worker_options(_args())["max_sessions"] == DEFAULT_MAX_SESSIONS
    assert worker_options(_args("--max-sessions", "3"))["max_sessions"] == 3


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_max_sessions_below_one_is_refused_in_one_line_with_exit_2(value, capsys):
    import trio

    from runtime.app.worker import _run_worker_command

    code = trio.run(_run_worker_command, _args("--max-sessions", value))
    assert code == 2
    assert capsys.readouterr().err == f"error: --max-sessions must be >= 1, not {value}\n"


def test_a_missing_psycopg_is_said_in_one_line_before_redis_is_tried(monkeypatch, capsys):
    """Without psycopg and with Redis not answering, the worker retried Redis for about
    30 s, then failed on Redis, never naming the package to install. Port 1: nothing
    listens there (were Redis tried, the error would be Redis's)."""
    import trio

    from runtime.app.worker import _run_worker_command

    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg: ImportError
    args = _args("--redis", "redis://127.0.0.1:1/0")
    code = trio.run(_run_worker_command, args)
    assert code == 2
    assert capsys.readouterr().err == (
        "error: the PostgreSQL store needs the psycopg package, which is not installed: "
        "pip install 'axon-runtime[postgres]'\n"
    )
