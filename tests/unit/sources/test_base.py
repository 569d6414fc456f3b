"""The snapshot a source hands the daemon: its status built on demand."""

from collections import Counter

from mfu_exporter.sources.base import Snapshot


def test_a_status_given_as_a_call_is_built_when_first_read_and_once():
    calls = []

    def build():
        calls.append(1)
        return {"ports": [1, 2]}

    snapshot = Snapshot(readings="r", status=build)
    assert calls == []
    assert snapshot.status == {"ports": [1, 2]} and snapshot.status is snapshot.status
    assert calls == [1]


def test_a_snapshot_without_status_or_errors_has_empty_ones():
    snapshot = Snapshot()
    assert (snapshot.readings, snapshot.errors, snapshot.status) == (None, Counter(), {})
    assert Snapshot(status={"a": 1}).status == {"a": 1}
    assert Snapshot().errors is not Snapshot().errors
