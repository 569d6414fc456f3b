"""What a ConnectX (mlx5) NIC shows, and a simulated node of them whose counters move with each tick.

- ``PMA_COUNTERS`` / ``HW_COUNTERS``: the files of a port's ``counters/`` and ``hw_counters/`` on a ConnectX-7
  (drivers/infiniband/hw/mlx5/counters.c, every capability on).
- ``ethtool_stat_names``: ``ethtool -S`` names in the driver's order (en_stats.c groups: software, Q-counter,
  vport, IEEE 802.3, RFC 2863/2819, phy, PCIe, per priority with PFC, module events, channels, per-TC
  congestion). PFC counters exist only for the priorities given, as on the real driver.
- ``format_ethtool_statistics``: the text ``ethtool -S`` prints.
- ``SimulatedNode``: N RoCE NICs in a ``FakeSysfs`` tree plus ``ethtool -S`` texts for ``EthtoolTextReader``,
  advanced by ``tick(seconds)`` with settable load, pause, congestion and drops per NIC.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from mfu_exporter.sim.sysfs import FakeSysfs

PMA_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
)

HW_COUNTERS = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
    "lifespan",
)

_SOFTWARE = (
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "tx_bytes",
    "tx_tso_packets",
    "tx_tso_bytes",
    "tx_tso_inner_packets",
    "tx_tso_inner_bytes",
    "tx_added_vlan_packets",
    "tx_nop",
    "tx_mpwqe_blks",
    "tx_mpwqe_pkts",
    "rx_lro_packets",
    "rx_lro_bytes",
    "rx_gro_packets",
    "rx_gro_bytes",
    "rx_gro_skbs",
    "rx_gro_match_packets",
    "rx_gro_large_hds",
    "rx_ecn_mark",
    "rx_removed_vlan_packets",
    "rx_csum_unnecessary",
    "rx_csum_none",
    "rx_csum_complete",
    "rx_csum_complete_tail",
    "rx_csum_complete_tail_slow",
    "rx_csum_unnecessary_inner",
    "rx_xdp_drop",
    "rx_xdp_redirect",
    "rx_xdp_tx_xmit",
    "rx_xdp_tx_mpwqe",
    "rx_xdp_tx_inlnw",
    "rx_xdp_tx_nops",
    "rx_xdp_tx_full",
    "rx_xdp_tx_err",
    "rx_xdp_tx_cqe",
    "tx_csum_none",
    "tx_csum_partial",
    "tx_csum_partial_inner",
    "tx_queue_stopped",
    "tx_queue_dropped",
    "tx_xmit_more",
    "tx_recover",
    "tx_cqes",
    "tx_queue_wake",
    "tx_cqe_err",
    "tx_xdp_xmit",
    "tx_xdp_mpwqe",
    "tx_xdp_inlnw",
    "tx_xdp_nops",
    "tx_xdp_full",
    "tx_xdp_err",
    "tx_xdp_cqes",
    "rx_wqe_err",
    "rx_mpwqe_filler_cqes",
    "rx_mpwqe_filler_strides",
    "rx_oversize_pkts_sw_drop",
    "rx_buff_alloc_err",
    "rx_cqe_compress_blks",
    "rx_cqe_compress_pkts",
    "rx_cache_reuse",
    "rx_cache_full",
    "rx_cache_empty",
    "rx_cache_busy",
    "rx_cache_waive",
    "rx_congst_umr",
    "rx_arfs_err",
    "rx_recover",
    "ch_events",
    "ch_poll",
    "ch_arm",
    "ch_aff_change",
    "ch_force_irq",
    "ch_eq_rearm",
    "rx_xsk_packets",
    "rx_xsk_bytes",
    "rx_xsk_csum_complete",
    "rx_xsk_csum_unnecessary",
    "rx_xsk_csum_unnecessary_inner",
    "rx_xsk_csum_none",
    "rx_xsk_ecn_mark",
    "rx_xsk_removed_vlan_packets",
    "rx_xsk_xdp_drop",
    "rx_xsk_xdp_redirect",
    "rx_xsk_wqe_err",
    "rx_xsk_mpwqe_filler_cqes",
    "rx_xsk_mpwqe_filler_strides",
    "rx_xsk_oversize_pkts_sw_drop",
    "rx_xsk_buff_alloc_err",
    "rx_xsk_cqe_compress_blks",
    "rx_xsk_cqe_compress_pkts",
    "rx_xsk_congst_umr",
    "rx_xsk_arfs_err",
    "tx_xsk_xmit",
    "tx_xsk_mpwqe",
    "tx_xsk_inlnw",
    "tx_xsk_full",
    "tx_xsk_err",
    "tx_xsk_cqes",
)
_PORT = (
    # Q-counter and vNIC environment
    "rx_out_of_buffer",
    "rx_if_down_packets",
    "rx_steer_missed_packets",
    # vport
    "rx_vport_unicast_packets",
    "rx_vport_unicast_bytes",
    "tx_vport_unicast_packets",
    "tx_vport_unicast_bytes",
    "rx_vport_multicast_packets",
    "rx_vport_multicast_bytes",
    "tx_vport_multicast_packets",
    "tx_vport_multicast_bytes",
    "rx_vport_broadcast_packets",
    "rx_vport_broadcast_bytes",
    "tx_vport_broadcast_packets",
    "tx_vport_broadcast_bytes",
    "rx_vport_rdma_unicast_packets",
    "rx_vport_rdma_unicast_bytes",
    "tx_vport_rdma_unicast_packets",
    "tx_vport_rdma_unicast_bytes",
    "rx_vport_rdma_multicast_packets",
    "rx_vport_rdma_multicast_bytes",
    "tx_vport_rdma_multicast_packets",
    "tx_vport_rdma_multicast_bytes",
    # IEEE 802.3
    "tx_packets_phy",
    "rx_packets_phy",
    "rx_crc_errors_phy",
    "tx_bytes_phy",
    "rx_bytes_phy",
    "tx_multicast_phy",
    "tx_broadcast_phy",
    "rx_multicast_phy",
    "rx_broadcast_phy",
    "rx_in_range_len_errors_phy",
    "rx_out_of_range_len_phy",
    "rx_oversize_pkts_phy",
    "rx_symbol_err_phy",
    "tx_mac_control_phy",
    "rx_mac_control_phy",
    "rx_unsupported_op_phy",
    "rx_pause_ctrl_phy",
    "tx_pause_ctrl_phy",
    # RFC 2863, RFC 2819
    "rx_discards_phy",
    "tx_discards_phy",
    "tx_errors_phy",
    "rx_undersize_pkts_phy",
    "rx_fragments_phy",
    "rx_jabbers_phy",
    "rx_64_bytes_phy",
    "rx_65_to_127_bytes_phy",
    "rx_128_to_255_bytes_phy",
    "rx_256_to_511_bytes_phy",
    "rx_512_to_1023_bytes_phy",
    "rx_1024_to_1518_bytes_phy",
    "rx_1519_to_2047_bytes_phy",
    "rx_2048_to_4095_bytes_phy",
    "rx_4096_to_8191_bytes_phy",
    "rx_8192_to_10239_bytes_phy",
    # phy, Ethernet extended, PCIe
    "link_down_events_phy",
    "rx_pcs_symbol_err_phy",
    "rx_corrected_bits_phy",
    "rx_err_lane_0_phy",
    "rx_err_lane_1_phy",
    "rx_err_lane_2_phy",
    "rx_err_lane_3_phy",
    "rx_buffer_passed_thres_phy",
    "rx_pci_signal_integrity",
    "tx_pci_signal_integrity",
    "outbound_pci_buffer_overflow",
    "outbound_pci_stalled_rd",
    "outbound_pci_stalled_wr",
    "outbound_pci_stalled_rd_events",
    "outbound_pci_stalled_wr_events",
)
_PRIORITY_TRAFFIC = (
    "rx_prio{p}_bytes",
    "rx_prio{p}_packets",
    "rx_prio{p}_discards",
    "tx_prio{p}_bytes",
    "tx_prio{p}_packets",
)
_PAUSE = ("rx_{s}_pause", "rx_{s}_pause_duration", "tx_{s}_pause", "tx_{s}_pause_duration", "rx_{s}_pause_transition")
_MODULE = ("module_unplug", "module_bus_stuck", "module_high_temp", "module_bad_shorted")
_CHANNEL = ("events", "poll", "arm", "aff_change", "force_irq", "eq_rearm")
_RX_QUEUE = (
    "packets",
    "bytes",
    "csum_complete",
    "csum_complete_tail",
    "csum_complete_tail_slow",
    "csum_unnecessary",
    "csum_unnecessary_inner",
    "csum_none",
    "xdp_drop",
    "xdp_redirect",
    "lro_packets",
    "lro_bytes",
    "gro_packets",
    "gro_bytes",
    "gro_skbs",
    "gro_match_packets",
    "gro_large_hds",
    "ecn_mark",
    "removed_vlan_packets",
    "wqe_err",
    "mpwqe_filler_cqes",
    "mpwqe_filler_strides",
    "oversize_pkts_sw_drop",
    "buff_alloc_err",
    "cqe_compress_blks",
    "cqe_compress_pkts",
    "cache_reuse",
    "cache_full",
    "cache_empty",
    "cache_busy",
    "cache_waive",
    "congst_umr",
    "arfs_err",
    "recover",
)
_TX_QUEUE = (
    "packets",
    "bytes",
    "tso_packets",
    "tso_bytes",
    "tso_inner_packets",
    "tso_inner_bytes",
    "csum_partial",
    "csum_partial_inner",
    "added_vlan_packets",
    "nop",
    "mpwqe_blks",
    "mpwqe_pkts",
    "csum_none",
    "stopped",
    "dropped",
    "xmit_more",
    "recover",
    "cqes",
    "wake",
    "cqe_err",
)
_TC_CONGESTION = ("rx_prio{p}_buf_discard", "rx_prio{p}_cong_discard", "rx_prio{p}_marked")


PFC_PREVENTION_TIMEOUT = 0.1  # seconds: mlx5's pfc-prevention-tout "auto" (MLX5E_PFC_PREVEN_AUTO_TOUT_MSEC)


def port_counters(**values: int) -> dict[str, int]:
    """Every ``counters/`` file, zero unless given."""
    return {name: values.pop(name, 0) for name in PMA_COUNTERS} | values


def hw_counters(**values: int) -> dict[str, int]:
    """Every ``hw_counters/`` file, zero unless given; ``lifespan`` is the kernel default of 10 ms."""
    return {name: values.pop(name, 10 if name == "lifespan" else 0) for name in HW_COUNTERS} | values


def ethtool_stat_names(
    *,
    pfc_priorities: Iterable[int] = (3,),
    global_pause: bool = False,
    pause_storm: bool = True,
    channels: int = 1,
    tc_congestion: bool = True,
) -> list[str]:
    """``ethtool -S`` names of a ConnectX-7 netdev in driver order. About 325 with one channel."""
    names = [*_SOFTWARE, *_PORT]
    names += [f.format(p=p) for p in range(8) for f in _PRIORITY_TRAFFIC]
    names += [f.format(s=f"prio{p}") for p in sorted(set(pfc_priorities)) for f in _PAUSE]
    if global_pause:
        names += [f.format(s="global") for f in _PAUSE]
    if pause_storm:
        names += ["tx_pause_storm_warning_events", "tx_pause_storm_error_events"]
    names += _MODULE
    names += [f"ch{c}_{n}" for c in range(channels) for n in _CHANNEL]
    names += [f"rx{c}_{n}" for c in range(channels) for n in _RX_QUEUE]
    names += [f"tx{c}_{n}" for c in range(channels) for n in _TX_QUEUE]
    if tc_congestion:
        names += [f.format(p=p) for p in range(8) for f in _TC_CONGESTION]
    return names


def format_ethtool_statistics(stats: Mapping[str, int]) -> str:
    """The text ``ethtool -S <interface>`` prints for ``stats``."""
    return "NIC statistics:\n" + "".join(f"     {name}: {value}\n" for name, value in stats.items())


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` through a rename, so a reader that opens it afresh never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


@dataclass
class SimulatedNic:
    """One RoCE NIC of a ``SimulatedNode``. Change the load and trouble fields between ticks."""

    device: str
    netdev: str
    pci_address: str
    numa_node: int
    rate_gbps: float
    pfc_priorities: tuple[int, ...]
    utilization: float = 0.6  # of the link rate, in each direction
    rx_pause_ratio: float = 0.0  # fraction of time the switch pauses us on the RoCE priority
    tx_pause_ratio: float = 0.0  # fraction of time we pause the switch
    cnp_per_second: float = 0.0  # DCQCN notifications, sent and handled
    drops_per_second: float = 0.0  # receive-buffer drops, seen as RoCE out-of-sequence packets too
    # A receive path that backs up keeps the link partner paused without a break: each such stall lasts
    # ``stall_seconds``, ``stalls_per_second`` times a second (0: none). mlx5's storm prevention counts them below.
    stall_seconds: float = 0.0
    stalls_per_second: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    hw_counters: dict[str, float] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def roce_priority(self) -> int:
        return self.pfc_priorities[0] if self.pfc_priorities else 0


class SimulatedNode:
    """``nics`` ConnectX-7 RoCE ports (mlx5_0 → ens1np0, ...) under ``root``: ``root/sys`` is the sysfs root,
    ``root/ethtool/<netdev>/statistics`` the ``ethtool -S`` texts (``EthtoolTextReader.from_directory``)."""

    def __init__(
        self,
        root: str | os.PathLike,
        nics: int = 8,
        rate_gbps: float = 400.0,
        pfc_priorities: Iterable[int] = (3,),
        channels: int = 1,
    ):
        self.root = Path(root)
        self.sysfs = FakeSysfs(self.root / "sys")
        self.ethtool_directory = self.root / "ethtool"
        self._channels = channels
        self._written: dict[tuple[str, str], dict[str, int]] = {}
        self.nics: list[SimulatedNic] = []
        for index in range(nics):
            nic = SimulatedNic(
                device=f"mlx5_{index}",
                netdev=f"ens{index + 1}np0",
                pci_address=f"0000:{0x0C + index * 0x10:02x}:00.0",
                numa_node=0 if index < nics / 2 else 1,
                rate_gbps=rate_gbps,
                pfc_priorities=tuple(sorted(set(pfc_priorities))),
            )
            nic.counters = {name: 0.0 for name in PMA_COUNTERS}
            nic.hw_counters = {name: 0.0 for name in HW_COUNTERS if name != "lifespan"}
            nic.stats = dict.fromkeys(self._stat_names(nic), 0.0)
            self.sysfs.add_rdma_device(nic.device, nic.pci_address, numa_node=nic.numa_node)
            self.sysfs.add_rdma_port(
                nic.device,
                1,
                netdev=nic.netdev,
                rate=_rate_text(rate_gbps),
                counters=port_counters(),
                hw_counters=hw_counters(),
            )
            self.sysfs.add_netdev(nic.netdev, nic.pci_address, ifindex=index + 2, mac=f"b8:3f:d2:00:00:{index:02x}")
            self.nics.append(nic)
            self._write(nic)

    @property
    def sysfs_root(self) -> str:
        return str(self.sysfs.root)

    def _stat_names(self, nic: SimulatedNic) -> list[str]:
        return ethtool_stat_names(pfc_priorities=nic.pfc_priorities, channels=self._channels)

    def set_pfc_priorities(self, nic: SimulatedNic, priorities: Iterable[int]) -> None:
        """Change the NIC's PFC priorities: its ethtool stat set changes as mlx5's does."""
        nic.pfc_priorities = tuple(sorted(set(priorities)))
        nic.stats = {name: nic.stats.get(name, 0.0) for name in self._stat_names(nic)}
        self._write(nic)

    def tick(self, seconds: float) -> None:
        """Advance every NIC's counters by ``seconds`` of simulated traffic and rewrite the files."""
        for nic in self.nics:
            self._advance(nic, seconds)
            self._write(nic)

    @staticmethod
    def _advance(nic: SimulatedNic, seconds: float) -> None:
        def add(values: dict[str, float], name: str, amount: float) -> None:
            if name in values:
                values[name] += amount

        carried = nic.utilization * nic.rate_gbps * 1e9 / 8 * seconds
        packets = carried / 4096
        for direction, short in (("rx", "rcv"), ("tx", "xmit")):
            add(nic.counters, f"port_{short}_data", carried / 4)
            add(nic.counters, f"port_{short}_packets", packets)
            add(nic.counters, f"unicast_{short}_packets", packets)
            add(nic.stats, f"{direction}_bytes_phy", carried)
            add(nic.stats, f"{direction}_packets_phy", packets)
            add(nic.stats, f"{direction}_vport_rdma_unicast_bytes", carried)
            add(nic.stats, f"{direction}_vport_rdma_unicast_packets", packets)
            add(nic.stats, f"{direction}_prio{nic.roce_priority}_bytes", carried)
            add(nic.stats, f"{direction}_prio{nic.roce_priority}_packets", packets)
        add(nic.hw_counters, "rx_write_requests", packets / 2)
        add(nic.hw_counters, "rx_read_requests", packets / 64)
        for direction, ratio in (("rx", nic.rx_pause_ratio), ("tx", nic.tx_pause_ratio)):
            paused_us = ratio * seconds * 1e6
            # A 400G pause frame holds the link for at most ~84 µs; switches refresh well before it ends.
            add(nic.stats, f"{direction}_prio{nic.roce_priority}_pause_duration", paused_us)
            add(nic.stats, f"{direction}_prio{nic.roce_priority}_pause", paused_us / 40)
            if direction == "rx":
                add(nic.stats, f"rx_prio{nic.roce_priority}_pause_transition", paused_us / 400)
        # mlx5's PFC storm prevention (ethtool --set-tunable pfc-prevention-tout, default auto = 100 ms): a stall
        # past the minor watermark, max(80 ms, 85% of the timeout), counts tx_pause_storm_warning_events; one that
        # reaches the timeout counts tx_pause_storm_error_events too, and the device stops sending pause frames.
        stalls = nic.stalls_per_second * seconds
        if nic.stall_seconds >= max(0.08, 0.85 * PFC_PREVENTION_TIMEOUT):
            add(nic.stats, "tx_pause_storm_warning_events", stalls)
        if nic.stall_seconds >= PFC_PREVENTION_TIMEOUT:
            add(nic.stats, "tx_pause_storm_error_events", stalls)
        add(nic.counters, "port_xmit_wait", nic.rx_pause_ratio * seconds * 1e6)
        cnps = nic.cnp_per_second * seconds
        for name, amount in (
            ("np_ecn_marked_roce_packets", cnps * 1.2),
            ("np_cnp_sent", cnps),
            ("rp_cnp_handled", cnps),
            ("roce_slow_restart_cnps", cnps / 100),
        ):
            add(nic.hw_counters, name, amount)
        add(nic.stats, f"rx_prio{nic.roce_priority}_marked", cnps * 1.2)
        drops = nic.drops_per_second * seconds
        add(nic.stats, "rx_discards_phy", drops)
        add(nic.stats, f"rx_prio{nic.roce_priority}_discards", drops)
        add(nic.hw_counters, "out_of_sequence", drops)
        add(nic.hw_counters, "packet_seq_err", drops / 2)

    def _write(self, nic: SimulatedNic) -> None:
        for directory, values in (("counters", nic.counters), ("hw_counters", nic.hw_counters)):
            written = self._written.setdefault((nic.device, directory), {})
            changed = {name: int(value) for name, value in values.items() if written.get(name) != int(value)}
            if changed:
                self.sysfs.write_counters(nic.device, 1, changed, directory=directory)
                written.update(changed)
        text = format_ethtool_statistics({name: int(value) for name, value in nic.stats.items()})
        write_atomically(self.ethtool_directory / nic.netdev / "statistics", text)


def _rate_text(rate_gbps: float) -> str:
    lanes = {400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 800: "4X XDR"}.get(int(rate_gbps), "4X")
    return f"{rate_gbps:g} Gb/sec ({lanes})"
