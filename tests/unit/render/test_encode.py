"""mfu_exporter.render.encode: ``encode`` writes exactly the bytes prometheus_client's encoders write, for every format a
scraper can ask for, on a real node's families and on arbitrary ones (which it partly hands to the library); the
cache serves those bytes, encoding a source's snapshot once per format, ahead of the scrape when it can."""

import asyncio
import gc
import gzip
import math
import subprocess
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar

from mfu_exporter.config import validate
from mfu_exporter.model.checkpoints import parse_checkpoint_event
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.render import encode as exposition
from mfu_exporter.render.collector import ExporterCollector
from mfu_exporter.render.encode import MetricsCache, encode
from mfu_exporter.render.snapshots import register
from mfu_exporter.scheduler import Scheduler
from mfu_exporter.service import build_service
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode
from mfu_exporter.sources.base import Snapshot
from mfu_exporter.sources.ethtool import EthtoolSource
from mfu_exporter.sources.gpu import GpuSource
from mfu_exporter.sources.rdma import RdmaSource
from tests.support.wait import wait_for

ACCEPT_HEADERS = [
    "",  # curl: text 0.0.4
    "text/plain;version=0.0.4",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0;escaping=underscores",
    "text/plain;version=1.0.0;escaping=dots",
    "text/plain;version=1.0.0;escaping=values",
    "application/openmetrics-text",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0;escaping=dots",
    "application/openmetrics-text;version=1.0.0;escaping=values",
    "application/openmetrics-text;version=2.0.0;escaping=allow-utf-8",
    # what Prometheus 2 and 3 send
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4",
]


class Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def assert_same_bytes(registry):
    for accept in ACCEPT_HEADERS:
        encoder, content_type = choose_encoder(accept)
        assert encode(registry, encoder, content_type) == encoder(registry), accept


def node_service(tmp_path):
    """A service whose scheduler sampled a two-GPU, two-NIC node once, with jobs and checkpoint writes."""
    fabric = SimulatedNode(tmp_path, nics=2)
    fabric.nics[0].rx_pause_ratio = 0.2
    fabric.tick(1.0)
    nvml = fake_nvml.node(fake_nvml.h100, count=2)
    config = validate({})
    sources = [
        GpuSource(nvml),
        RdmaSource(fabric.sysfs_root),
        EthtoolSource(fabric.sysfs_root, reader=EthtoolTextReader.from_directory(str(fabric.ethtool_directory))),
    ]
    service = build_service(config, sources)

    async def sample_once():
        await service.scheduler.start()
        while not all(state.cycles for state in service.scheduler.states.values()):
            await asyncio.sleep(0.01)
        await service.scheduler.stop()

    asyncio.run(sample_once())
    for step in (1, 2):
        service.jobs.report(
            parse_progress(
                {"job": "llama", "tokens_total": step * 1e6, "step": step, "model": {"params": "8B"}, "gpus": 2},
                time.time(),
            )
        )
    return service


def test_a_node_is_encoded_as_the_library_encodes_it(tmp_path):
    service = node_service(tmp_path)
    text = choose_encoder("")[0](service.registry).decode()
    for family in (
        "mfu_gpu_",
        "mfu_rdma_hw_counters_total",
        "mfu_nic_pfc_pause_duration_seconds_total",
        "mfu_job_info",
        "mfu_exporter_source_up",
    ):
        assert family in text  # every kind of family the exporter writes is in the comparison
    assert_same_bytes(service.registry)


def test_checkpoint_histograms_are_encoded_as_the_library_encodes_them():
    from mfu_exporter.model.checkpoints import CheckpointTracker
    from mfu_exporter.render.checkpoint import checkpoint_families

    tracker = CheckpointTracker()
    for index, seconds in enumerate((0.5, 38.2, 900.0)):
        tracker.record(
            parse_checkpoint_event(
                {"job": "llama", "checkpoint": f"step-{index}", "duration_seconds": seconds, "bytes": 1.6e10},
                time.time(),
            )
        )
    assert_same_bytes(Families(list(checkpoint_families(tracker.totals()))))


def test_labels_values_and_help_that_need_escaping():
    gauge = GaugeMetricFamily("mfu_test_gauge", 'Help with a \\ backslash,\na newline and "quotes".', labels=["b", "a"])
    gauge.add_metric(['back\\slash "quoted"\nnewline', "ünïcode ✓"], 1.5)
    gauge.add_metric(["", "empty"], -0.0)
    counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
    for value in (0, 1, 12345678, 1.5e300, math.inf, -math.inf, math.nan, 1e-9, 2**63):
        counter.add_metric([str(value)], value)
    assert_same_bytes(Families([gauge, counter]))


def test_label_texts_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(exposition, "MAX_LABEL_TEXTS", 3)
    counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
    for index in range(10):
        counter.add_metric([f"ens{index}np0"], index)
    assert_same_bytes(Families([counter]))
    assert len(exposition._label_texts) <= 3


def test_a_series_whose_value_changes_is_written_with_each_value(monkeypatch):
    # Lines are kept by family with their samples: each new value, and a zero's sign, must still be written afresh.
    monkeypatch.setattr(exposition, "_kept_lines", {})
    values = [0.0, -0.0, 0, -0.0, 0.0, 1, 1.0, True, 1.0, 2, math.nan, math.nan, 2**63, float(2**63), 1e6, 1e6 + 1]
    for value in values:
        counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
        counter.add_metric(["ens1np0"], value)
        gauge = GaugeMetricFamily("mfu_test_plain", "No labels.")
        gauge.add_metric([], value)
        assert_same_bytes(Families([counter, gauge]))
    assert set(exposition._kept_lines) == {"mfu_test", "mfu_test_plain"}  # so the comparisons above read them


def test_families_whose_lines_are_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(exposition, "MAX_KEPT_FAMILIES", 3)
    monkeypatch.setattr(exposition, "_kept_lines", {})
    for index in range(10):
        counter = CounterMetricFamily(f"mfu_test_{index}", "A counter.", labels=["interface"])
        counter.add_metric(["ens1np0"], index)
        assert_same_bytes(Families([counter]))
    assert len(exposition._kept_lines) <= 3


def test_a_family_that_grows_changes_or_shrinks_is_written_as_it_is_now(monkeypatch):
    monkeypatch.setattr(exposition, "_kept_lines", {})
    counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
    for step, value in enumerate((1, 2, 2, 3)):
        counter.add_metric([f"ens{step}np0"], value)
        assert_same_bytes(Families([counter]))  # the same family object, one sample more each time
    for labels in (["ens0np0", "ens1np0"], ["ens1np0", "ens0np0"], ["ens0np0"], []):
        gauge = GaugeMetricFamily("mfu_test", "A gauge now.", labels=["interface"])
        for label in labels:
            gauge.add_metric([label], 1.0)
        assert_same_bytes(Families([gauge]))


def test_units_and_created_samples():
    duration = GaugeMetricFamily("mfu_test_duration", "A duration.", labels=["job"], unit="seconds")
    duration.add_metric(["llama"], 38.2)
    created = CounterMetricFamily("mfu_test_writes", "Writes.", labels=["job"], created=1.7e9)
    created.add_metric(["llama"], 3, created=1.7e9)
    assert_same_bytes(Families([duration, created]))


def mostly(common, rare):
    """``common`` nine times in ten: families the fast path writes, with now and then one it hands over."""

    def pick(roll):
        return rare if roll == 0 else common

    return st.integers(0, 9).flatmap(pick)


NAMES = mostly(
    st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True), st.sampled_from(["job:rate5m", "__reserved", "a.b", "ünï"])
)
LABEL_NAMES = mostly(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), st.sampled_from(["__name", "a.b", "ü"]))
VALUES = st.one_of(st.integers(-(2**64), 2**64), st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def families(draw):
    kind = draw(
        st.sampled_from(["gauge", "counter", "info", "histogram", "summary", "stateset", "gaugehistogram", "unknown"])
    )
    name = draw(NAMES)
    metric = Metric(name, draw(st.text(max_size=20)), kind, unit=draw(mostly(st.just(""), st.just("seconds"))))
    suffixes = {
        "counter": ["_total", "_created"],
        "info": ["_info"],
        "histogram": ["_bucket", "_count", "_sum", "_created"],
        "summary": ["", "_count", "_sum"],
        "gaugehistogram": ["_bucket", "_gcount", "_gsum"],
    }.get(kind, [""])
    for _ in range(draw(st.integers(0, 4))):
        labels = draw(st.dictionaries(LABEL_NAMES, st.text(max_size=10), max_size=3))
        timestamp = draw(mostly(st.none(), st.floats(0, 2e9)))
        exemplar = draw(
            mostly(
                st.none(),
                st.builds(Exemplar, st.dictionaries(st.just("trace_id"), st.text(max_size=5)), VALUES, st.none()),
            )
        )
        metric.add_sample(metric.name + draw(st.sampled_from(suffixes)), labels, draw(VALUES), timestamp, exemplar)
    return metric


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(families(), max_size=4), st.sampled_from(ACCEPT_HEADERS))
def test_arbitrary_families_are_encoded_as_the_library_encodes_them(metrics, accept):
    registry = Families(metrics)
    encoder, content_type = choose_encoder(accept)
    try:
        expected = encoder(registry)
    except Exception as exc:  # noqa: BLE001 - what the library refuses must be refused alike
        with pytest.raises(type(exc)):
            encode(registry, encoder, content_type)
        return
    assert encode(registry, encoder, content_type) == expected


async def test_the_cache_serves_the_library_bytes():
    registry = CollectorRegistry(auto_describe=False)
    counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
    counter.add_metric(["ens1np0"], 7)
    registry.register(Families([counter]))
    cache = MetricsCache(registry, lambda: 0)
    for accept in ACCEPT_HEADERS:
        body, headers = await cache.render(accept, None)
        encoder, content_type = choose_encoder(accept)
        assert (body, headers["Content-Type"]) == (encoder(registry), content_type)


OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0"


@dataclass(frozen=True)
class Events:
    """A counting source's readings: its count, and the source that counts how often they are rendered."""

    value: int
    source: "CountingSource"


def events_families(readings: Events):
    readings.source.renders += 1
    family = CounterMetricFamily("mfu_test_events", "Events.", labels=["interface"])
    family.add_metric(["ens1np0"], readings.value)
    yield family


register(Events, events_families)


class CountingSource:
    """A source whose snapshots count how often their families are rendered."""

    name, interval, timeout = "counting", 3600.0, 5.0  # sampled once at start; the tests sample it again by hand

    def __init__(self):
        self.value = 0
        self.renders = 0

    def sample(self):
        self.value += 1
        return Snapshot(readings=Events(self.value, self))

    def close(self):
        pass


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


async def cached_node(source, clock):
    """A scheduler, jobs and the cache wired as build_service wires them, with a fake monotonic clock and a
    one-thread executor, so awaiting a no-op on it waits for everything queued before."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
    scheduler = Scheduler([source])
    jobs = JobTracker()
    collector = ExporterCollector(scheduler, jobs)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    cache = MetricsCache(
        registry, lambda: scheduler.generation + jobs.generation, monotonic=clock, parts=collector.parts
    )
    scheduler.on_sample(cache.sampled)
    await scheduler.start()
    await scheduler.first_cycle_done.wait()
    return scheduler, jobs, registry, cache


def report(jobs, step):
    jobs.report(parse_progress({"job": "llama", "tokens_total": step * 1000, "step": step}, time.time()))


async def test_a_snapshot_is_encoded_once_per_format_however_often_the_state_changes():
    source, clock = CountingSource(), Clock()
    scheduler, jobs, registry, cache = await cached_node(source, clock)
    try:
        for step in range(1, 6):
            report(jobs, step)  # a new state: a new body, with the same snapshot in it
            for accept in (OPENMETRICS_ACCEPT, ""):
                for accept_encoding in (None, "gzip"):
                    await cache.render(accept, accept_encoding)
        assert source.renders == 2
        for accept in ACCEPT_HEADERS:
            encoder, content_type = choose_encoder(accept)
            assert await cache.render(accept, None) == (encoder(registry), {"Content-Type": content_type})
    finally:
        await scheduler.stop()


async def sample_and_settle(scheduler, cache, source):
    await scheduler.sample_once(source)
    await cache.settled()


async def test_a_new_snapshot_is_encoded_before_the_next_scrape_of_a_periodic_scraper():
    source, clock = CountingSource(), Clock()
    scheduler, jobs, registry, cache = await cached_node(source, clock)
    try:
        await cache.render(OPENMETRICS_ACCEPT, None)
        clock.now += 15
        await cache.render(OPENMETRICS_ACCEPT, None)  # every 15 s: a Prometheus
        await cache.render("", None)  # text, once: a curl
        assert source.renders == 2
        clock.now += 10
        await sample_and_settle(scheduler, cache, source)
        assert source.renders == 3  # encoded once more, as OpenMetrics only
        body, _ = await cache.render(OPENMETRICS_ACCEPT, None)
        assert source.renders == 3 and b'mfu_test_events_total{interface="ens1np0"} 2.0' in body
        clock.now += 2 * 10 + MetricsCache.WARM_MARGIN + 1  # the scraper missed two of its intervals
        await sample_and_settle(scheduler, cache, source)
        assert source.renders == 3
        body, _ = await cache.render(OPENMETRICS_ACCEPT, None)
        assert source.renders == 4 and b'mfu_test_events_total{interface="ens1np0"} 3.0' in body
    finally:
        await scheduler.stop()


async def test_a_snapshot_replaced_before_the_next_scrape_is_not_encoded_ahead():
    """A 1 s source and a Prometheus scraping every 15 s: only the snapshots of the second or two before the scrape is
    due are encoded ahead, and the scrape finds the latest one done."""
    source, clock = CountingSource(), Clock()
    scheduler, jobs, registry, cache = await cached_node(source, clock)
    # What on_sample reports as the source's next sample; the loop's own next cycle stays an hour away.
    scheduler.states[source.name].interval = 1.0
    try:
        await cache.render(OPENMETRICS_ACCEPT, None)
        clock.now += 15
        await cache.render(OPENMETRICS_ACCEPT, None)  # every 15 s: the next one is due 15 s from now
        assert source.renders == 1
        for _ in range(12):
            clock.now += 1
            await sample_and_settle(scheduler, cache, source)
        assert source.renders == 1  # each replaced by the next second's before the scrape
        for expected in (2, 3):  # 2 s and 1 s before the scrape: the next sample might come after it
            clock.now += 1
            await sample_and_settle(scheduler, cache, source)
            assert source.renders == expected
        clock.now += 1
        body, _ = await cache.render(OPENMETRICS_ACCEPT, None)
        assert source.renders == 3 and b'mfu_test_events_total{interface="ens1np0"} 15.0' in body
    finally:
        await scheduler.stop()


async def test_a_burst_of_scrapes_does_not_keep_encoding_ahead():
    source, clock = CountingSource(), Clock()
    scheduler, jobs, registry, cache = await cached_node(source, clock)
    try:
        for _ in range(100):
            clock.now += 0.001
            await cache.render(OPENMETRICS_ACCEPT, None)
        clock.now += MetricsCache.WARM_MARGIN + 1
        await sample_and_settle(scheduler, cache, source)
        assert source.renders == 1
    finally:
        await scheduler.stop()


async def test_a_round_of_samples_is_encoded_ahead_in_one_pass(monkeypatch):
    sources, clock = [CountingSource(), CountingSource()], Clock()
    sources[1].name = "counting-too"
    passes = []
    encode_snapshots = MetricsCache._encode_snapshots
    monkeypatch.setattr(MetricsCache, "_encode_snapshots", lambda *args: passes.append(encode_snapshots(*args)))
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
    scheduler = Scheduler(sources)
    collector = ExporterCollector(scheduler, JobTracker())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    cache = MetricsCache(registry, lambda: scheduler.generation, monotonic=clock, parts=collector.parts)
    scheduler.on_sample(cache.sampled)
    await scheduler.start()
    # first_cycle_done is set by the first source to finish: wait for both sources' first samples themselves.
    await wait_for(lambda: all(state.cycles for state in scheduler.states.values()), 30, "both first samples")
    try:
        for _ in range(2):
            await cache.render(OPENMETRICS_ACCEPT, None)
            clock.now += 15
        assert [source.renders for source in sources] == [1, 1]
        # The same round: the executor's one thread is held until both samples are in, so however slow the
        # machine, the second ends before the encoding ahead of the first starts.
        held = threading.Event()
        holding = asyncio.get_running_loop().run_in_executor(None, held.wait)
        for source in sources:
            await scheduler.sample_once(source)
        held.set()
        await holding
        await cache.settled()
        assert len(passes) == 1 and [source.renders for source in sources] == [2, 2]
        body, _ = await cache.render(OPENMETRICS_ACCEPT, None)
        assert [source.renders for source in sources] == [2, 2] and body.count(b"} 2.0") == 2
    finally:
        await scheduler.stop()


async def test_encodings_of_replaced_snapshots_are_let_go():
    source, clock = CountingSource(), Clock()
    scheduler, jobs, registry, cache = await cached_node(source, clock)
    try:
        for _ in range(2):
            await cache.render(OPENMETRICS_ACCEPT, None)
            clock.now += 15
        first = weakref.ref(scheduler.states[source.name].snapshot)
        for _ in range(3):  # sampled and encoded ahead, not scraped
            await sample_and_settle(scheduler, cache, source)
        assert source.renders == 4
        gc.collect()
        assert first() is None
    finally:
        await scheduler.stop()


async def test_a_part_that_returns_the_same_families_is_encoded_once_per_format(monkeypatch):
    """The jobs' families while no job changed, the process' read once a second: the same list again is served from
    its kept encoding; a part building new families each time is encoded each time. The bytes are the library's."""
    encoded = []
    original = exposition.encode_families

    def counting(families, encoder, openmetrics):
        encoded.append(families)
        return original(families, encoder, openmetrics)

    monkeypatch.setattr(exposition, "encode_families", counting)
    kept = [GaugeMetricFamily("mfu_test_kept", "Kept.", value=1.0)]

    def fresh():
        return [GaugeMetricFamily("mfu_test_fresh", "Fresh.", value=2.0)]

    generation = [0]
    registry = CollectorRegistry(auto_describe=False)
    parts = [lambda: kept, fresh]

    class Both:
        def collect(self):
            for part in parts:
                yield from part()

    registry.register(Both())
    cache = MetricsCache(registry, lambda: generation[0], parts=lambda: parts)
    for _ in range(3):
        generation[0] += 1
        for accept in (OPENMETRICS_ACCEPT, ""):
            encoder, content_type = choose_encoder(accept)
            assert await cache.render(accept, None) == (encoder(registry), {"Content-Type": content_type})
    assert sum(families is kept for families in encoded) == 2  # once per format
    assert sum(families is not kept for families in encoded) == 6  # every render


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self):
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, *args, **kwargs):
        self.submitted += 1
        return super().submit(*args, **kwargs)


async def test_a_render_that_needs_no_snapshot_encoded_runs_on_the_loop():
    """Once every snapshot's encoding in the format is kept, a new state's render encodes the call parts only, on the
    loop (less than a thread's round trip); a format whose snapshots are not encoded yet still goes to a thread."""
    source, clock = CountingSource(), Clock()
    scheduler, jobs, registry, cache = await cached_node(source, clock)
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        report(jobs, 0)  # the job's first count: its counters begin at 0 here
        await cache.render(OPENMETRICS_ACCEPT, "gzip")  # the snapshot encoded, in a thread
        assert executor.submitted == 1
        report(jobs, 1)
        body, _ = await cache.render(OPENMETRICS_ACCEPT, None)
        assert executor.submitted == 1 and b'mfu_job_tokens_total{training_job="llama"} 1000.0' in body
        encoder, _ = choose_encoder(OPENMETRICS_ACCEPT)
        assert body == encoder(registry)
        await cache.render("", None)  # the text format: its snapshot not encoded yet
        assert executor.submitted == 2
    finally:
        await scheduler.stop()


async def test_a_gzip_body_joins_kept_segments_into_one_valid_member():
    """Each text's deflate segment is kept while the text is (a snapshot's encoding): a new state's gzip body reuses
    them and compresses the rest; it is one gzip member that Python and the gzip tool read as the plain body."""
    source, clock = CountingSource(), Clock()
    scheduler, jobs, registry, cache = await cached_node(source, clock)
    report(jobs, 0)  # the job's first count: its counters begin at 0 here
    try:
        for first, accept in ((1, OPENMETRICS_ACCEPT), (4, "")):
            for step in range(first, first + 3):
                report(jobs, step)
                packed, headers = await cache.render(accept, "gzip")
                plain, _ = await cache.render(accept, None)
                assert headers["Content-Encoding"] == "gzip" and gzip.decompress(packed) == plain
                assert f'mfu_job_tokens_total{{training_job="llama"}} {step * 1000}.0'.encode() in plain
                tool = subprocess.run(["gzip", "-dc"], input=packed, capture_output=True, check=True)
                assert tool.stdout == plain and len(packed) < len(plain) / 3
        assert source.renders == 2  # the snapshot encoded once per format, its segment kept across the states
    finally:
        await scheduler.stop()
