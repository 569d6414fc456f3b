"""The RDMA source's sample (``mfu_exporter.sources.rdma.RdmaSample``) as metric families."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.config import SERIES_LEVELS
from mfu_exporter.render.common import node_gauge
from mfu_exporter.sources.base import exports
from mfu_exporter.sources.rdma import (
    DATA_COUNTERS,
    FAMILY_LEVELS,
    OCTETS_PER_DATA_WORD,
    PACKET_COUNTERS,
    SUMMARY_WINDOW,
    RdmaSample,
)

# The families each series level exports, built at import and never changed.
_FAMILIES_ON = {
    series: frozenset(name for name, level in FAMILY_LEVELS.items() if exports(series, level))
    for series in SERIES_LEVELS
}


def rdma_families(sample: RdmaSample) -> Iterator[Metric]:
    """Metric families of one RDMA sample: per port at the source's series level, the node summaries at every level."""
    on = _FAMILIES_ON[sample.series]
    hw_allowed = sample.hw_counters
    labels = ["device", "port"]
    info = GaugeMetricFamily(
        "mfu_rdma_port_info",
        "RDMA port facts; always 1.",
        labels=["device", "port", "link_layer", "netdev", "state", "rate"],
    )
    up = GaugeMetricFamily("mfu_rdma_port_up", "1 when the RDMA port state is ACTIVE.", labels=labels)
    speed = GaugeMetricFamily("mfu_rdma_port_rate_bytes_per_second", "Link rate of the RDMA port.", labels=labels)
    data = {
        direction: CounterMetricFamily(
            f"mfu_rdma_port_data_{direction}_bytes",
            f"Bytes {direction} on the RDMA port (port_{short}_data x 4).",
            labels=labels,
        )
        for direction, short in (("received", "rcv"), ("transmitted", "xmit"))
    }
    packets = {
        direction: CounterMetricFamily(
            f"mfu_rdma_port_packets_{direction}",
            f"Packets {direction} on the RDMA port (port_{short}_packets).",
            labels=labels,
        )
        for direction, short in (("received", "rcv"), ("transmitted", "xmit"))
    }
    counter_labels = ["device", "port", "counter"]
    # Plural like the sysfs directories they mirror; promtool's lint rejects "_counter_" inside a metric name.
    other = CounterMetricFamily(
        "mfu_rdma_port_counters",
        "Other files of the port's counters/ directory (PMA port counters), raw.",
        labels=counter_labels,
    )
    hardware = CounterMetricFamily(
        "mfu_rdma_hw_counters",
        "Files of the port's hw_counters/ directory (driver and congestion counters), raw.",
        labels=counter_labels,
    )
    with_info, with_speed = "mfu_rdma_port_info" in on, "mfu_rdma_port_rate_bytes_per_second" in on
    with_data, with_packets = "mfu_rdma_port_data_received_bytes" in on, "mfu_rdma_port_packets_received" in on
    with_other, with_hardware = "mfu_rdma_port_counters" in on, "mfu_rdma_hw_counters" in on
    for reading in sample.ports.values():
        port = reading.port
        base = (port.device, str(port.port))
        if with_info:
            info.add_metric([*base, port.link_layer or "", port.netdev or "", port.state or "", port.rate or ""], 1)
        up.add_metric(base, 1 if port.active else 0)
        if with_speed and port.rate_gbps is not None:
            speed.add_metric(base, port.rate_gbps * 1e9 / 8)
        counters = reading.counters
        if with_data:
            for name, direction in DATA_COUNTERS.items():
                if (value := counters.get(name)) is not None:
                    data[direction].add_metric(base, value * OCTETS_PER_DATA_WORD)
        if with_packets:
            for name, direction in PACKET_COUNTERS.items():
                if (value := counters.get(name)) is not None:
                    packets[direction].add_metric(base, value)
        if with_other:
            for name, value in counters.items():
                if name not in DATA_COUNTERS and name not in PACKET_COUNTERS:
                    other.add_metric((*base, name), value)
        if with_hardware:
            for name, value in reading.hw_counters.items():
                if hw_allowed is None or name in hw_allowed:
                    hardware.add_metric((*base, name), value)
    for family in (info, up, speed, *data.values(), *packets.values(), other, hardware):
        if family.samples:
            yield family
    errors = CounterMetricFamily(
        "mfu_node_rdma_errors",
        "Error and retransmission counters (counters/ and hw_counters/) summed over the node's RDMA ports, "
        "since the exporter started.",
        labels=["counter"],
    )
    for name, total in sample.error_totals.items():
        errors.add_metric([name], total)
    if errors.samples:
        yield errors
    yield from node_gauge(
        "mfu_node_rdma_max_cnps_per_second",
        f"CNPs per second (np_cnp_sent + rp_cnp_handled) of the node's busiest RDMA port over the last "
        f"{SUMMARY_WINDOW:g} s.",
        sample.max_cnps,
    )
