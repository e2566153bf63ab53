"""A host's own running marker (branch ``ownmarker``): each marker names the Host
instance that wrote it (:data:`~runtime.liveness.HOST_KEY`, its ``marker_id``), so the
twin check of that host reads a marker it left (its turn's end saves refused) as its own,
while another Host, of this process too (same writer name), still reads it as a turn
running elsewhere. End to end: tests/test_sqlite_twin_claim_faults.py and
tests/test_sqlite_twin_protocols.py."""

from __future__ import annotations

from runtime.liveness import (
    HOST_KEY,
    RUNNING_META,
    answering_elsewhere,
    host_closed,
    host_opened,
    running_marker,
)


def _meta(host: str | None) -> dict[str, object]:
    return {RUNNING_META: running_marker("turn_1", "msg_1", host)}


def test_the_running_marker_names_the_host_that_wrote_it():
    marker = running_marker("turn_1", "msg_1", "host_a")
    assert marker is not None
    assert marker[HOST_KEY] == "host_a"


def test_a_hosts_own_marker_is_not_a_turn_running_elsewhere():
    assert not answering_elsewhere(_meta("host_a"), "host_a")


class _OpenHost:
    """Stands for an open Host of this process (:func:`runtime.liveness.host_opened`)."""


def test_another_hosts_marker_of_this_process_is_a_turn_running_elsewhere():
    other = _OpenHost()
    host_opened("host_b", other)
    try:
        assert answering_elsewhere(_meta("host_b"), "host_a")
    finally:
        host_closed("host_b")


def test_a_marker_without_a_host_is_a_turn_running_elsewhere():
    """Written by an older version: judged by its writer alone, as before."""
    assert answering_elsewhere(_meta(None), "host_a")


def test_a_marker_naming_the_host_but_another_writer_is_judged_by_its_writer():
    """The host's name copied by another process (no id is unique across machines):
    its writer decides, here one this process cannot see, saved just now."""
    meta = _meta("host_a")
    marker = meta[RUNNING_META]
    assert isinstance(marker, dict)
    marker["writer"] = "other-machine:" + marker["writer"].split(":", 1)[1]
    assert answering_elsewhere(meta, "host_a")
