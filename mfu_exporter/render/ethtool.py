"""The ethtool source's sample (``mfu_exporter.sources.ethtool.EthtoolSample``) as metric families."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.render.common import node_gauge
from mfu_exporter.sources.ethtool import (
    DISCARDS,
    ECN_MARKED,
    MICROSECONDS,
    PAUSE_DURATION,
    PAUSE_FRAMES,
    PFC_DURATION,
    PFC_FRAMES,
    PFC_TRANSITIONS,
    STORM,
    SUMMARY_WINDOW,
    EthtoolSample,
)

# Each kind: (family, help, labels, scale). Which kinds are exported at each series level is the source's
# (KIND_LEVELS): it keeps only the rows of those.
_FAMILIES = {
    PFC_FRAMES: (
        "mfu_nic_pfc_pause_frames",
        "PFC pause frames per priority (mlx5 rx_prio{p}_pause / tx_prio{p}_pause); "
        "rx: the link partner paused us, tx: we paused it.",
        ["interface", "priority", "direction"],
        1.0,
    ),
    PFC_DURATION: (
        "mfu_nic_pfc_pause_duration_seconds",
        "Time paused per priority (mlx5 *_prio{p}_pause_duration); "
        "rx: time we could not send, tx: time we held the partner.",
        ["interface", "priority", "direction"],
        MICROSECONDS,
    ),
    PFC_TRANSITIONS: (
        "mfu_nic_pfc_pause_transitions",
        "XOFF to XON transitions per priority (rx_prio{p}_pause_transition).",
        ["interface", "priority"],
        1.0,
    ),
    PAUSE_FRAMES: (
        "mfu_nic_pause_frames",
        "Link-level pause frames (rx_pause_ctrl_phy / tx_pause_ctrl_phy).",
        ["interface", "direction"],
        1.0,
    ),
    PAUSE_DURATION: (
        "mfu_nic_pause_duration_seconds",
        "Time paused by 802.3x global pause (*_global_pause_duration).",
        ["interface", "direction"],
        MICROSECONDS,
    ),
    STORM: (
        "mfu_nic_pause_storm_events",
        "Pause-storm watermark events (tx_pause_storm_*_events); error means the NIC "
        "stopped sending pause frames and drops could follow.",
        ["interface", "level"],
        1.0,
    ),
    DISCARDS: (
        "mfu_nic_discards",
        "Packets the NIC dropped, by mlx5 counter (rx_discards_phy, rx_out_of_buffer, rx_prio{p}_discards...).",
        ["interface", "counter"],
        1.0,
    ),
    ECN_MARKED: (
        "mfu_nic_ecn_marked_packets",
        "Packets ECN-marked for congestion per priority (rx_prio{p}_marked).",
        ["interface", "priority"],
        1.0,
    ),
}


_NODE_TOTALS = {
    "mfu_node_nic_pause_storm_events": (
        "Pause-storm watermark events summed over the node's interfaces, by level, since the exporter started.",
        ["level"],
    ),
    "mfu_node_nic_pause_frames": (
        "802.3x link-level pause frames summed over the node's interfaces, by direction, since the exporter started.",
        ["direction"],
    ),
    "mfu_node_nic_discards": (
        "Packets the node's NICs dropped (every mfu_nic_discards counter), since the exporter started.",
        [],
    ),
    "mfu_node_nic_ecn_marked_packets": (
        "Packets ECN-marked on the node's NICs, all priorities, since the exporter started.",
        [],
    ),
}


def ethtool_families(sample: EthtoolSample) -> Iterator[Metric]:
    """Metric families of one ethtool sample: the exported stats per interface, then the node summaries."""
    rows, extras = sample.rows, sample.extras
    families = {
        kind: CounterMetricFamily(name, help_text, labels=labels)
        for kind, (name, help_text, labels, _) in _FAMILIES.items()
    }
    scales = {kind: spec[3] for kind, spec in _FAMILIES.items()}
    for kind, labels, value in rows:
        family = families.get(kind)
        if family is not None:
            scale = scales[kind]
            family.add_metric(labels, value * scale if scale != 1.0 else value)
    yield from (family for family in families.values() if family.samples)
    if extras:
        stat = CounterMetricFamily(
            "mfu_nic_stat",
            "ethtool -S statistics selected by sources.ethtool.stats_include, raw.",
            labels=["interface", "stat"],
        )
        for labels, value in extras:
            stat.add_metric(labels, value)
        yield stat
    totals, paused = sample.totals, sample.max_pause_ratio
    nodes = {name: CounterMetricFamily(name, text, labels=labels) for name, (text, labels) in _NODE_TOTALS.items()}
    for key, total in sorted(totals.items()):
        name, _, value = key.partition("|")
        nodes[name].add_metric([value] if value else [], total)
    yield from (family for family in nodes.values() if family.samples)
    yield from node_gauge(
        "mfu_node_nic_max_pause_ratio",
        f"Largest share of time any of the node's interfaces was paused, on any priority (PFC) or by 802.3x "
        f"pause, either direction, over the last {SUMMARY_WINDOW:g} s.",
        paused,
    )
