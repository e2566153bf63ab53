"""configure_logging: the libraries' stdlib log records come out as the runtime's JSON lines."""

from __future__ import annotations

import io
import json
import logging

import structlog

from runtime.logging import configure_logging, get_logger, log_exception
from runtime.redact import register_secret


def configured(level: str = "info") -> io.StringIO:
    out = io.StringIO()
    configure_logging(level, stream=out)
    return out


def test_a_pool_warning_is_one_json_line_like_the_runtimes(capsys):
    out = configured()
    try:
        logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "pool-1", "refused")
    finally:
        configure_logging("warning")
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["event"] == "error connecting in 'pool-1': refused"
    assert (record["logger"], record["level"]) == ("psycopg.pool", "warning")
    assert "timestamp" in record
    assert capsys.readouterr().err == ""  # not printed a second time as plain text


def test_configuring_again_replaces_the_library_handler():
    configured()
    out = configured()
    try:
        logging.getLogger("psycopg.pool").warning("pool closed")
    finally:
        configure_logging("warning")
    assert len(out.getvalue().splitlines()) == 1


def test_library_info_lines_stay_out_even_at_the_runtimes_info_level():
    out = configured("info")
    try:
        logging.getLogger("psycopg.pool").info("connection added")
    finally:
        configure_logging("warning")
    assert out.getvalue() == ""


def test_a_library_line_is_redacted_like_every_line():
    out = configured()
    key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 2
    try:
        logging.getLogger("coredis").error("auth failed with %s", key)
    finally:
        configure_logging("warning")
    assert key not in out.getvalue() and "auth failed" in out.getvalue()


def test_the_timestamp_is_iso_utc_like_structlogs_to_the_microsecond(monkeypatch):
    import datetime
    import time

    from runtime.logging import UtcStamper

    stamper = UtcStamper()
    for ns in (1764786028844091000, 1764786028000000000, 1764786029500000000, 1764786029999999999):
        monkeypatch.setattr(time, "time_ns", lambda ns=ns: ns)
        got = stamper(None, "info", {})["timestamp"]
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        expected = epoch + datetime.timedelta(microseconds=ns // 1000)
        assert got == expected.isoformat().replace("+00:00", "Z")  # structlog's TimeStamper
        parsed = datetime.datetime.fromisoformat(got.replace("Z", "+00:00"))
        assert got.endswith("Z") and abs((parsed - expected).total_seconds()) < 2e-6
        assert ("." in got) == (expected.microsecond != 0)


def test_a_logger_is_made_once_per_name_and_again_after_reconfiguring():
    from runtime.logging import get_logger

    configure_logging("info", stream=io.StringIO())
    try:
        first = get_logger("axon.cached")
        assert get_logger("axon.cached") is first
        assert get_logger("axon.other") is not first
        out = io.StringIO()
        configure_logging("info", stream=out)
        again = get_logger("axon.cached")
        assert again is not first
        again.info("fresh")
        assert '"event":"fresh"' in out.getvalue()  # the new configuration's stream
    finally:
        configure_logging("warning")


def test_the_json_renderer_writes_what_structlogs_with_orjson_wrote():
    import datetime

    import orjson
    import structlog

    from runtime.logging import JsonRenderer

    def old_serializer(obj, **_):
        return orjson.dumps(obj, default=str).decode()

    old = structlog.processors.JSONRenderer(serializer=old_serializer)
    event = {
        "logger": "axon.events",
        "n": 1,
        "x": 1.5,
        "none": None,
        "nested": {"a": [1, "b", None], "when": datetime.date(2026, 12, 4)},
        "error": RuntimeError("boom"),
        "text": 'quote " and \\ and ünïcode',
        "event": "turn.finished",
    }
    assert JsonRenderer()(None, "info", dict(event)) == old(None, "info", dict(event))


def test_format_exc_info_runs_only_for_a_line_that_carries_exc_info(monkeypatch):
    import structlog

    from runtime.logging import format_exc_info

    calls = []
    real = structlog.processors.format_exc_info

    def counting(logger, method, event_dict):
        calls.append(event_dict)
        return real(logger, method, event_dict)

    monkeypatch.setattr(structlog.processors, "format_exc_info", counting)
    plain = {"event": "x"}
    assert format_exc_info(None, "info", plain) is plain and plain == {"event": "x"}
    assert calls == []
    try:
        raise ValueError("boom")
    except ValueError as exc:
        line = format_exc_info(None, "error", {"event": "x", "exc_info": exc})
    assert "exc_info" not in line and "ValueError: boom" in line["exception"]
    assert len(calls) == 1
    assert format_exc_info(None, "error", {"event": "x", "exc_info": None}) == {"event": "x"}


def test_an_exception_logged_through_a_chain_that_does_not_redact_quotes_no_key(capsys):
    """structlog's defaults (an application that configured structlog its own way) do not
    redact, and with ``rich`` installed print each frame's locals: the runtime's own
    exception lines are redacted all the same, as the log tap's are."""
    key = "sk-proj-" + "Q7w8E9r0T1y2U3i4O5p6"
    register_secret(key)
    structlog.reset_defaults()
    try:
        raise RuntimeError(f"the provider refused {key}")
    except RuntimeError:
        log_exception(get_logger("axon.test"), "test.failed", note=f"with {key}")
    out = capsys.readouterr().out
    assert "test.failed" in out and "RuntimeError" in out
    assert key not in out
