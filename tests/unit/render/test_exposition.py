"""mfu_exporter.render.exposition, fragment and collector: /metrics is the latest published page, in the library's bytes.
A source's snapshot is encoded once per format (ahead of the scrape when it can), a page's body is made once, a
report shows from the next tick, and a replaced fragment's encodings are let go with it."""

import asyncio
import gc
import gzip
import subprocess
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.render.collector import ExporterCollector
from mfu_exporter.render.encode import Encoder
from mfu_exporter.render.exposition import Exposition
from mfu_exporter.render.fragment import Fragment, Page
from mfu_exporter.scheduler import Scheduler
from mfu_exporter.sources.base import Snapshot, SourceUnavailable
from tests.support.wait import wait_for
from tests.unit.render.test_encode import ACCEPT_HEADERS

OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0"


class Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


async def test_a_page_is_served_in_the_library_bytes_for_every_format():
    counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
    counter.add_metric(["ens1np0"], 7)
    gauge = GaugeMetricFamily("mfu_test_gauge", "A gauge.")
    gauge.add_metric([], 1.5)
    page = Page([Fragment.of([counter]), Fragment.of([]), Fragment.of([gauge])])
    exposition = Exposition(lambda: page)
    for accept in ACCEPT_HEADERS:
        encoder, content_type = choose_encoder(accept)
        expected = encoder(Families([counter, gauge]))
        body, headers = await exposition.render(accept, None)
        assert (body, headers) == (expected, {"Content-Type": content_type}), accept
        packed, headers = await exposition.render(accept, "gzip")
        assert headers["Content-Encoding"] == "gzip" and gzip.decompress(packed) == expected, accept


async def test_an_unchanged_page_is_served_its_body_as_made():
    """A scrape of a page already served in its format is the kept body: nothing encoded, nothing joined."""
    page = Page([Fragment.of([GaugeMetricFamily("mfu_test", "A gauge.", value=1.0)])])
    exposition = Exposition(lambda: page)
    for accept_encoding in (None, "gzip"):
        body, _ = await exposition.render(OPENMETRICS_ACCEPT, accept_encoding)
        again, _ = await exposition.render(OPENMETRICS_ACCEPT, accept_encoding)
        assert again is body


@dataclass(frozen=True)
class Events:
    """A counting source's readings: its count, and the source that counts how often they are rendered."""

    value: int
    source: "CountingSource"

    def families(self):
        self.source.renders += 1
        family = CounterMetricFamily("mfu_test_events", "Events.", labels=["interface"])
        family.add_metric(["ens1np0"], self.value)
        yield family


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


@dataclass
class Node:
    scheduler: Scheduler
    jobs: JobTracker
    collector: ExporterCollector
    registry: CollectorRegistry
    exposition: Exposition

    def report(self, step):
        self.jobs.report(parse_progress({"job": "llama", "tokens_total": step * 1000, "step": step}, time.time()))

    def tick(self):
        self.collector.tick(self.jobs.tick())


async def published_node(sources, clock):
    """A scheduler, jobs, the collector and the exposition wired as build_service wires them, with a fake monotonic
    clock and a one-thread executor, so awaiting a no-op on it waits for everything queued before."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
    scheduler = Scheduler(sources)
    jobs = JobTracker()
    collector = ExporterCollector(scheduler, jobs)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    exposition = Exposition(lambda: collector.page, monotonic=clock)
    scheduler.on_sample(collector.sampled)
    scheduler.on_sample(exposition.sampled)
    await scheduler.start()
    # first_cycle_done is set by the first source to finish: wait for every source's first sample itself.
    await wait_for(lambda: all(state.cycles for state in scheduler.states.values()), 30, "every first sample")
    return Node(scheduler, jobs, collector, registry, exposition)


async def test_a_snapshot_is_encoded_once_per_format_however_often_the_jobs_change():
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    try:
        for step in range(1, 6):
            node.report(step)
            node.tick()  # a new page, with the same snapshot's fragment in it
            for accept in (OPENMETRICS_ACCEPT, ""):
                for accept_encoding in (None, "gzip"):
                    await node.exposition.render(accept, accept_encoding)
        assert source.renders == 1  # its families built once, encoded in two formats
        for accept in ACCEPT_HEADERS:
            encoder, content_type = choose_encoder(accept)
            assert await node.exposition.render(accept, None) == (
                encoder(node.registry),
                {"Content-Type": content_type},
            )
    finally:
        await node.scheduler.stop()


async def test_a_report_shows_in_metrics_from_the_next_tick():
    """A report changes the job model only; the tick publishes the jobs' views."""
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    try:
        node.report(0)  # the job's first count: its counters begin at 0 here
        node.tick()
        node.report(1)
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert b'mfu_job_tokens_total{training_job="llama"} 0.0' in body
        node.tick()
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert b'mfu_job_tokens_total{training_job="llama"} 1000.0' in body
        assert body == choose_encoder(OPENMETRICS_ACCEPT)[0](node.registry)
    finally:
        await node.scheduler.stop()


async def scraped_every_15_s(node, clock):
    """Two OpenMetrics scrapes 15 s apart, as a Prometheus makes them: the exposition learns a periodic scraper."""
    await node.exposition.render(OPENMETRICS_ACCEPT, None)
    clock.now += 15
    await node.exposition.render(OPENMETRICS_ACCEPT, None)


async def sample_and_settle(node, source):
    await node.scheduler.sample_once(source)
    await node.exposition.settled()


async def test_a_new_snapshot_is_encoded_before_the_next_scrape_of_a_periodic_scraper():
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    try:
        await scraped_every_15_s(node, clock)
        await node.exposition.render("", None)  # text, once: a curl
        assert source.renders == 1
        clock.now += 10
        await sample_and_settle(node, source)
        assert source.renders == 2  # built and encoded ahead, as OpenMetrics only
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert source.renders == 2 and b'mfu_test_events_total{interface="ens1np0"} 2.0' in body
        assert not node.collector.page.fragments[1].encoded(choose_encoder("")[1])  # the curl's format was not
        clock.now += 2 * 10 + Exposition.WARM_MARGIN + 1  # the scraper missed two of its intervals
        await sample_and_settle(node, source)
        assert source.renders == 2 and not node.collector.page.fragments[1].encoded(
            choose_encoder(OPENMETRICS_ACCEPT)[1]
        )
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert source.renders == 3 and b'mfu_test_events_total{interface="ens1np0"} 3.0' in body
    finally:
        await node.scheduler.stop()


async def test_a_snapshot_replaced_before_the_next_scrape_is_not_encoded_ahead():
    """A 1 s source and a Prometheus scraping every 15 s: only the snapshots of the second or two before the scrape is
    due are encoded ahead, and the scrape finds the latest one done."""
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    # What on_sample reports as the source's next sample; the loop's own next cycle stays an hour away.
    node.scheduler.states[source.name].interval = 1.0
    try:
        await scraped_every_15_s(node, clock)  # the next scrape is due 15 s from now
        assert source.renders == 1
        for _ in range(12):
            clock.now += 1
            await sample_and_settle(node, source)
        assert source.renders == 1  # each replaced by the next second's before the scrape
        for expected in (2, 3):  # 2 s and 1 s before the scrape: the next sample might come after it
            clock.now += 1
            await sample_and_settle(node, source)
            assert source.renders == expected
        clock.now += 1
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert source.renders == 3 and b'mfu_test_events_total{interface="ens1np0"} 15.0' in body
    finally:
        await node.scheduler.stop()


async def test_a_tick_just_before_a_periodic_scrape_has_that_scrape_s_body_made():
    """The jobs' views move at every tick: the tick before a periodic scraper's next scrape encodes them and joins the
    page off the loop, as a sample does its snapshot and the exporter's own series, so the scrape finds its body made.
    A tick long before the scrape encodes nothing."""
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    _, content_type = choose_encoder(OPENMETRICS_ACCEPT)
    try:
        node.report(0)
        node.tick()
        await scraped_every_15_s(node, clock)  # the next scrape is due 15 s from now
        clock.now += 1
        node.report(1)
        node.tick()
        node.exposition.ticked(next_in=1.0)
        await node.exposition.settled()
        page = node.collector.page
        assert not page.fragments[2].encoded(content_type) and page.kept(content_type, False) is None
        clock.now += 12.5  # the next tick may come after the scrape
        node.report(2)
        node.tick()
        node.exposition.ticked(next_in=1.0)
        await node.exposition.settled()
        page = node.collector.page
        body = page.kept(content_type, False)
        assert body is not None and b'mfu_job_tokens_total{training_job="llama"} 2000.0' in body
        # A sample between the tick and the scrape: its snapshot and the exporter's own series, encoded ahead too.
        node.scheduler.states[source.name].interval = 1.0
        await sample_and_settle(node, source)
        body = node.collector.page.kept(content_type, False)
        assert body is not None and b'mfu_test_events_total{interface="ens1np0"} 2.0' in body
        clock.now += 1
        assert await node.exposition.render(OPENMETRICS_ACCEPT, None) == (body, {"Content-Type": content_type})
        assert body == choose_encoder(OPENMETRICS_ACCEPT)[0](node.registry)
    finally:
        await node.scheduler.stop()


async def test_a_burst_of_scrapes_does_not_keep_encoding_ahead():
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    try:
        for _ in range(100):
            clock.now += 0.001
            await node.exposition.render(OPENMETRICS_ACCEPT, None)
        clock.now += Exposition.WARM_MARGIN + 1
        await sample_and_settle(node, source)
        assert source.renders == 1
    finally:
        await node.scheduler.stop()


def counted_passes(monkeypatch):
    """The passes of encoding ahead, one entry each, as they run."""
    passes = []
    encode_fragments = Exposition._encode_fragments
    monkeypatch.setattr(Exposition, "_encode_fragments", lambda *args: passes.append(encode_fragments(*args)))
    return passes


async def test_a_round_of_samples_is_encoded_ahead_in_one_pass(monkeypatch):
    sources, clock = [CountingSource(), CountingSource()], Clock()
    sources[1].name = "counting-too"
    passes = counted_passes(monkeypatch)
    node = await published_node(sources, clock)
    try:
        for _ in range(2):
            await node.exposition.render(OPENMETRICS_ACCEPT, None)
            clock.now += 15
        assert [source.renders for source in sources] == [1, 1]
        # The same round: the executor's one thread is held until both samples are in, so however slow the
        # machine, the second ends before the encoding ahead of the first starts.
        held = threading.Event()
        holding = asyncio.get_running_loop().run_in_executor(None, held.wait)
        for source in sources:
            await node.scheduler.sample_once(source)
        held.set()
        await holding
        await node.exposition.settled()
        assert len(passes) == 1 and [source.renders for source in sources] == [2, 2]
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert [source.renders for source in sources] == [2, 2] and body.count(b"} 2.0") == 2
    finally:
        await node.scheduler.stop()


class SteadySource(CountingSource):
    """A counting source that reads the same count at every sample (a quiet log, no checkpoint write), or fails
    once told to."""

    fail = False

    def sample(self):
        if self.fail:
            raise SourceUnavailable("gone")
        return Snapshot(readings=Events(1, self))


async def scraped_every_15_s_then_due(node, clock, accept_encoding):
    for _ in range(2):
        await node.exposition.render(OPENMETRICS_ACCEPT, accept_encoding)
        clock.now += 15
    clock.now -= 1  # the next scrape is due in a second


def served(body, accept_encoding):
    return gzip.decompress(body) if accept_encoding else body


async def test_a_good_sample_that_read_what_the_last_one_did_publishes_nothing_until_the_tick(monkeypatch):
    """Its page, and the body made of it, stay; the tick publishes the exporter's own series it moved."""
    source, clock = SteadySource(), Clock()
    passes = counted_passes(monkeypatch)
    node = await published_node([source], clock)
    try:
        for accept_encoding in (None, "gzip"):
            await scraped_every_15_s_then_due(node, clock, accept_encoding)
            page = node.collector.page
            body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, accept_encoding)
            await sample_and_settle(node, source)
            assert node.collector.page is page and passes == [] and source.renders == 1
            assert (await node.exposition.render(OPENMETRICS_ACCEPT, accept_encoding))[0] is body
            node.tick()
            body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, accept_encoding)
            shown = [
                sample.value
                for family in text_string_to_metric_families(served(body, accept_encoding).decode())
                for sample in family.samples
                if sample.name == "mfu_exporter_source_last_success_timestamp_seconds"
            ]
            assert shown == [node.scheduler.states[source.name].last_success]
            assert served(body, accept_encoding) == choose_encoder(OPENMETRICS_ACCEPT)[0](node.registry)
            assert source.renders == 1
    finally:
        await node.scheduler.stop()


async def test_a_sample_that_leaves_every_snapshot_encoded_encodes_nothing_ahead(monkeypatch):
    """A source gone down takes its snapshot off the page: only the exporter's own series are left to encode, which
    the scrape does on the loop, in the library's bytes."""
    source, clock = SteadySource(), Clock()
    passes = counted_passes(monkeypatch)
    node = await published_node([source], clock)
    try:
        await scraped_every_15_s_then_due(node, clock, "gzip")
        page = node.collector.page
        source.fail = True
        await sample_and_settle(node, source)
        assert node.collector.page is not page and passes == []
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, "gzip")
        assert b'mfu_exporter_source_up{source="counting"} 0.0' in gzip.decompress(body)
        assert gzip.decompress(body) == choose_encoder(OPENMETRICS_ACCEPT)[0](node.registry)
    finally:
        await node.scheduler.stop()


async def test_encodings_of_replaced_snapshots_are_let_go():
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    try:
        for _ in range(2):
            await node.exposition.render(OPENMETRICS_ACCEPT, "gzip")
            clock.now += 15
        first = weakref.ref(node.scheduler.states[source.name].snapshot)
        first_fragment = weakref.ref(node.collector.page.fragments[1])
        for _ in range(3):  # sampled and encoded ahead, not scraped
            await sample_and_settle(node, source)
        assert source.renders == 4
        gc.collect()
        assert first() is None and first_fragment() is None
    finally:
        await node.scheduler.stop()


async def test_a_part_is_collected_again_at_a_tick_only_when_its_key_moved(monkeypatch):
    """An added part whose key stays is not collected nor encoded again; one without a key is, at every tick. The
    bytes are the library's."""
    encoded = []
    families = Encoder.families

    def counting(self, metrics, library, openmetrics):
        metrics = list(metrics)
        encoded.extend(metric.name for metric in metrics)
        return families(self, metrics, library, openmetrics)

    monkeypatch.setattr(Encoder, "families", counting)
    collected = {"kept": 0, "fresh": 0}

    def part(name):
        def collect():
            collected[name] += 1
            return [GaugeMetricFamily(f"mfu_test_{name}", "A part.", value=float(collected[name]))]

        return collect

    node = await published_node([], Clock())
    key = [0]
    node.collector.add(part("kept"), key=lambda: key[0])
    node.collector.add(part("fresh"))
    try:
        for _ in range(3):
            node.tick()
            for accept in (OPENMETRICS_ACCEPT, ""):
                encoder, content_type = choose_encoder(accept)
                assert await node.exposition.render(accept, None) == (
                    encoder(node.registry),
                    {"Content-Type": content_type},
                )
        assert collected == {"kept": 1, "fresh": 4}  # at add, then at each of the three ticks
        assert encoded.count("mfu_test_kept") == 2 and encoded.count("mfu_test_fresh") == 6  # once per format each
        key[0] += 1
        node.tick()
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert collected["kept"] == 2 and b"mfu_test_kept 2.0" in body
    finally:
        await node.scheduler.stop()


async def test_a_part_with_a_renderer_is_read_at_the_tick_and_rendered_when_first_scraped():
    node = await published_node([], Clock())
    reads, renders = [], []

    def read():
        reads.append(len(reads) + 1)
        return len(reads)

    def render(value):
        renders.append(value)
        return [GaugeMetricFamily("mfu_test_read", "A read.", value=float(value))]

    node.collector.add(read, render=render)
    try:
        for _ in range(3):
            node.tick()
        assert reads == [1, 2, 3, 4] and renders == []  # read when added and at each tick; nothing scraped yet
        for accept in (OPENMETRICS_ACCEPT, ""):
            body, _ = await node.exposition.render(accept, None)
            assert b"mfu_test_read 4.0" in body
        assert renders == [4]  # the latest read, rendered once for both formats
    finally:
        await node.scheduler.stop()


async def test_a_part_that_fails_at_a_tick_keeps_its_last_families_and_the_rest_is_published():
    node = await published_node([], Clock())
    fail = []

    def collect():
        if fail:
            raise RuntimeError("a bug in a part")
        return [GaugeMetricFamily("mfu_test_part", "A part.", value=1.0)]

    node.collector.add(collect)
    try:
        node.report(0)
        fail.append(True)
        try:
            node.tick()
        except RuntimeError:
            pass
        else:
            raise AssertionError("the part's error reaches the tick, which logs it")
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert b"mfu_test_part 1.0" in body and b'mfu_job_tokens_total{training_job="llama"} 0.0' in body
    finally:
        await node.scheduler.stop()


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self):
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, *args, **kwargs):
        self.submitted += 1
        return super().submit(*args, **kwargs)


async def test_a_body_that_needs_no_snapshot_encoded_is_made_on_the_loop():
    """Once every snapshot's encoding in the format is made, a new page's body encodes the tick's parts only, on the
    loop (less than a thread's round trip); a format whose snapshots are not encoded yet still goes to a thread."""
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        node.report(0)  # the job's first count: its counters begin at 0 here
        node.tick()
        await node.exposition.render(OPENMETRICS_ACCEPT, "gzip")  # the snapshot encoded, in a thread
        assert executor.submitted == 1
        node.report(1)
        node.tick()
        body, _ = await node.exposition.render(OPENMETRICS_ACCEPT, None)
        assert executor.submitted == 1 and b'mfu_job_tokens_total{training_job="llama"} 1000.0' in body
        encoder, _ = choose_encoder(OPENMETRICS_ACCEPT)
        assert body == encoder(node.registry)
        await node.exposition.render("", None)  # the text format: its snapshot not encoded yet
        assert executor.submitted == 2
    finally:
        await node.scheduler.stop()


async def test_concurrent_scrapes_of_a_page_share_one_body_made_in_a_thread(monkeypatch):
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    made = []
    make = Page._make
    monkeypatch.setattr(Page, "_make", lambda *args: made.append(1) or make(*args))
    try:
        bodies = await asyncio.gather(*[node.exposition.render(OPENMETRICS_ACCEPT, "gzip") for _ in range(16)])
        assert len(made) == 1 and all(body is bodies[0][0] for body, _ in bodies)
    finally:
        await node.scheduler.stop()


async def test_a_gzip_body_joins_kept_segments_into_one_valid_member():
    """Each fragment keeps its deflate segment: a new page's gzip body reuses the unchanged fragments' and compresses
    the rest; it is one gzip member that Python and the gzip tool read as the plain body."""
    source, clock = CountingSource(), Clock()
    node = await published_node([source], clock)
    node.report(0)  # the job's first count: its counters begin at 0 here
    try:
        for first, accept in ((1, OPENMETRICS_ACCEPT), (4, "")):
            for step in range(first, first + 3):
                node.report(step)
                node.tick()
                packed, headers = await node.exposition.render(accept, "gzip")
                plain, _ = await node.exposition.render(accept, None)
                assert headers["Content-Encoding"] == "gzip" and gzip.decompress(packed) == plain
                assert f'mfu_job_tokens_total{{training_job="llama"}} {step * 1000}.0'.encode() in plain
                tool = subprocess.run(["gzip", "-dc"], input=packed, capture_output=True, check=True)
                assert tool.stdout == plain and len(packed) < len(plain) / 3
        assert source.renders == 1  # the snapshot's families built once, its segment kept across the pages
    finally:
        await node.scheduler.stop()
