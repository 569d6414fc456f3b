"""mfu_exporter.service: the wiring's own helpers (the service's API is driven through the server in tests/unit/web)."""

from prometheus_client.core import GaugeMetricFamily

from mfu_exporter.service import kept_while, once_a_second


def test_the_process_read_is_made_once_a_second_and_its_families_kept_between():
    reads, now = [], [100.2]

    def collect():
        reads.append(now[0])
        yield GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", value=len(reads))

    part = once_a_second(collect, monotonic=lambda: now[0])
    first = part()
    now[0] = 100.9
    assert part() is first and reads == [100.2]  # the same second: the same list, whose encoding the cache keeps
    now[0] = 101.0
    second = part()
    assert second is not first and reads == [100.2, 101.0]
    assert [sample.value for family in second for sample in family.samples] == [2.0]


def test_families_are_collected_again_only_when_their_key_moves():
    key, collected = [0], []

    def collect():
        collected.append(key[0])
        return [GaugeMetricFamily("mfu_test", "Test.", value=key[0])]

    part = kept_while(lambda: key[0], collect)
    assert part() is part() and collected == [0]
    key[0] = 1
    assert [s.value for f in part() for s in f.samples] == [1.0] and collected == [0, 1]
