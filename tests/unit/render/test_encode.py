"""mfu_exporter.render.encode: ``encode`` writes exactly the bytes prometheus_client's encoders write, for every format a
scraper can ask for, on a real node's families and on arbitrary ones (which it partly hands to the library), with
what its ``Encoder`` keeps between encodings bounded."""

import asyncio
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar

from mfu_exporter.config import validate
from mfu_exporter.model.checkpoints import parse_checkpoint_event
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.render.encode import Encoder, encode
from mfu_exporter.service import build_service
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode
from mfu_exporter.sources.ethtool import EthtoolSource
from mfu_exporter.sources.gpu import GpuSource
from mfu_exporter.sources.rdma import RdmaSource

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


def assert_same_bytes(registry, kept=None):
    """``encode`` writes the library's bytes in every format, with ``kept`` (an ``Encoder``) or a fresh encoder."""
    for accept in ACCEPT_HEADERS:
        encoder, content_type = choose_encoder(accept)
        assert encode(registry, encoder, content_type, kept) == encoder(registry), accept


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
    service.evaluate_once()  # the tick publishes the jobs
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


def test_label_texts_and_plain_names_kept_are_bounded():
    kept = Encoder()
    kept.MAX_LABEL_TEXTS = kept.MAX_PLAIN_NAMES = 3
    counter = CounterMetricFamily("mfu_test", "A counter.", labels=[f"label{index}" for index in range(5)])
    for index in range(10):
        counter.add_metric([f"ens{index}np{label}" for label in range(5)], index)
    assert_same_bytes(Families([counter]), kept)
    assert len(kept._label_texts) <= 3 and len(kept._plain_names) <= 3


def test_each_encoder_keeps_its_own_lines():
    """Two services' encoders share nothing: each writes the library's bytes of its own families."""
    first, second = Encoder(), Encoder()
    for kept, value in ((first, 1.0), (second, 2.0), (first, 1.0)):
        gauge = GaugeMetricFamily("mfu_test", "A gauge.", labels=["interface"])
        gauge.add_metric(["ens1np0"], value)
        assert_same_bytes(Families([gauge]), kept)
    assert first._kept_lines["mfu_test"][1] == ['mfu_test{interface="ens1np0"} 1.0\n']
    assert second._kept_lines["mfu_test"][1] == ['mfu_test{interface="ens1np0"} 2.0\n']


def test_a_series_whose_value_changes_is_written_with_each_value():
    # Lines are kept by family with their samples: each new value, and a zero's sign, must still be written afresh.
    kept = Encoder()
    values = [0.0, -0.0, 0, -0.0, 0.0, 1, 1.0, True, 1.0, 2, math.nan, math.nan, 2**63, float(2**63), 1e6, 1e6 + 1]
    for value in values:
        counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
        counter.add_metric(["ens1np0"], value)
        gauge = GaugeMetricFamily("mfu_test_plain", "No labels.")
        gauge.add_metric([], value)
        assert_same_bytes(Families([counter, gauge]), kept)
    assert set(kept._kept_lines) == {"mfu_test", "mfu_test_plain"}  # so the comparisons above read them


def test_families_whose_lines_are_kept_are_bounded():
    kept = Encoder()
    kept.MAX_KEPT_FAMILIES = 3
    for index in range(10):
        counter = CounterMetricFamily(f"mfu_test_{index}", "A counter.", labels=["interface"])
        counter.add_metric(["ens1np0"], index)
        assert_same_bytes(Families([counter]), kept)
    assert len(kept._kept_lines) <= 3


def test_a_family_that_grows_changes_or_shrinks_is_written_as_it_is_now():
    kept = Encoder()
    counter = CounterMetricFamily("mfu_test", "A counter.", labels=["interface"])
    for step, value in enumerate((1, 2, 2, 3)):
        counter.add_metric([f"ens{step}np0"], value)
        assert_same_bytes(Families([counter]), kept)  # the same family object, one sample more each time
    for labels in (["ens0np0", "ens1np0"], ["ens1np0", "ens0np0"], ["ens0np0"], []):
        gauge = GaugeMetricFamily("mfu_test", "A gauge now.", labels=["interface"])
        for label in labels:
            gauge.add_metric([label], 1.0)
        assert_same_bytes(Families([gauge]), kept)


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


KEPT = Encoder()  # one encoder across the examples: each one's lines meet those the examples before left


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(families(), max_size=4), st.sampled_from(ACCEPT_HEADERS))
def test_arbitrary_families_are_encoded_as_the_library_encodes_them(metrics, accept):
    registry = Families(metrics)
    encoder, content_type = choose_encoder(accept)
    try:
        expected = encoder(registry)
    except Exception as exc:  # noqa: BLE001 - what the library refuses must be refused alike
        with pytest.raises(type(exc)):
            encode(registry, encoder, content_type, KEPT)
        return
    assert encode(registry, encoder, content_type, KEPT) == expected
