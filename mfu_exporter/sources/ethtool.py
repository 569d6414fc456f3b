"""NIC statistics (``ethtool -S``) read with the SIOCETHTOOL ioctl: PFC pause, global pause, pause storms, discards.

The reader sits behind a small interface (``read(interface) -> {stat name: value}``, ``close()``) with two
implementations: ``EthtoolIoctlReader`` talks to the kernel, ``EthtoolTextReader`` parses ``ethtool -S`` output
(recorded fixtures, the demo). The ioctls run in the exporter's network namespace; ``--path.sysfs`` only says
where to find which interfaces exist.

mlx5's stat set is dynamic: ``rx_prio3_pause`` exists only while PFC is enabled on priority 3, so the names are
read with every sample and the count the kernel returns is checked against the count asked for.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from mfu_exporter.config import EthtoolConfig
from mfu_exporter.node.counters import Changes, CounterHistory, Totals, WindowedRates
from mfu_exporter.node.ethtool import EthtoolIoctlReader, StatsReader
from mfu_exporter.node.rdma import NameFilter, discover_ports, is_representor, natural_key
from mfu_exporter.sources.base import Snapshot, SourceContext, SourceUnavailable, exports

MICROSECONDS = 1e-6
REDISCOVER_INTERVAL = 30.0
RETRY_WHEN_NO_INTERFACES = 30.0


# What a curated stat becomes. Each kind is one metric family; the label values follow the interface label.
PFC_FRAMES, PFC_DURATION, PFC_TRANSITIONS = "pfc_frames", "pfc_duration", "pfc_transitions"
PAUSE_FRAMES, PAUSE_DURATION, STORM, DISCARDS, ECN_MARKED, PHY_ERRORS = (
    "pause_frames",
    "pause_duration",
    "storm",
    "discards",
    "ecn_marked",
    "phy_errors",
)

_PFC = re.compile(r"^(rx|tx)_prio([0-7])_pause(_duration)?$")
_PFC_TRANSITION = re.compile(r"^rx_prio([0-7])_pause_transition$")
_GLOBAL_PAUSE_DURATION = re.compile(r"^(rx|tx)_global_pause_duration$")
_PAUSE_FRAMES = re.compile(r"^(rx|tx)_pause_ctrl_phy$")
_STORM = re.compile(r"^tx_pause_storm_(warning|error)_events$")
_DISCARD = re.compile(
    r"^(?:rx_discards_phy|tx_discards_phy|rx_out_of_buffer|dev_out_of_buffer"
    r"|outbound_pci_buffer_overflow|rx_prio[0-7]_(?:discards|buf_discard|cong_discard))$"
)
_ECN_MARKED = re.compile(r"^rx_prio([0-7])_marked$")
# Not exported (stats_include can add them) but their deltas go into the snapshot data for diagnosis.
_PHY_ERROR_STATS = frozenset({"rx_crc_errors_phy", "rx_symbol_err_phy", "tx_errors_phy", "link_down_events_phy"})
# mlx5 Q-counters and the link-down count are 32-bit; every other ethtool stat is a u64.
STAT_WIDTHS = {"rx_out_of_buffer": 32, "dev_out_of_buffer": 32, "link_down_events_phy": 32}


@functools.lru_cache(maxsize=16384)
def classify(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(kind, label values after the interface) of a curated mlx5 stat; None for the rest."""
    if match := _PFC.match(name):
        return (PFC_DURATION if match.group(3) else PFC_FRAMES), (match.group(2), match.group(1))
    if match := _PFC_TRANSITION.match(name):
        return PFC_TRANSITIONS, (match.group(1),)
    if match := _PAUSE_FRAMES.match(name):
        return PAUSE_FRAMES, (match.group(1),)
    if match := _GLOBAL_PAUSE_DURATION.match(name):
        return PAUSE_DURATION, (match.group(1),)
    if match := _STORM.match(name):
        return STORM, (match.group(1),)
    if _DISCARD.match(name):
        return DISCARDS, (name,)
    if match := _ECN_MARKED.match(name):
        return ECN_MARKED, (match.group(1),)
    if name in _PHY_ERROR_STATS:
        return PHY_ERRORS, (name,)
    return None


@functools.lru_cache(maxsize=256)
def _pfc_priorities(stat_names: tuple[str, ...]) -> tuple[int, ...]:
    """Kept by stat names: an interface shows the same ~300 stats sample after sample, and the status asks every
    sample (classifying each name was a tenth of the ethtool source's time)."""
    return tuple(
        sorted(
            {
                int(curated[1][0])
                for curated in map(classify, stat_names)
                if curated is not None and curated[0] in (PFC_FRAMES, PFC_DURATION)
            }
        )
    )


@dataclass
class InterfaceReading:
    """One interface in one sample: every stat the driver reported, and rates of the curated ones.

    Pause keys are ``(direction, priority)`` with direction ``rx`` (the link partner paused us: the fabric pushes
    back) or ``tx`` (we paused the partner: this host cannot absorb), and priority 0–7, or ``"global"`` for
    802.3x pause.
    """

    interface: str
    rdma_ports: tuple[str, ...]  # "mlx5_0/1" keys of the RDMA ports on this netdev
    stats: dict[str, int]
    changes: Changes  # of the curated stats

    @functools.cached_property
    def _deltas_by_kind(self) -> dict[str, list[tuple[str, tuple[str, ...], int]]]:
        """(kind, labels, delta) of the curated deltas by kind, classified once for the several views the status
        and the attribution read (each reads one or two kinds of the ~60 curated stats)."""
        grouped: dict[str, list[tuple[str, tuple[str, ...], int]]] = {}
        for name, delta in self.changes.deltas.items():
            curated = classify(name)
            if curated is not None:
                grouped.setdefault(curated[0], []).append((curated[0], curated[1], delta))
        return grouped

    def _by_kind(self, kinds: set[str]) -> Iterator[tuple[str, tuple[str, ...], int]]:
        grouped = self._deltas_by_kind
        return (item for kind in kinds for item in grouped.get(kind, ()))

    @property
    def pfc_priorities(self) -> tuple[int, ...]:
        """Priorities with PFC counters, i.e. PFC enabled (mlx5 shows the counters only then)."""
        return _pfc_priorities(tuple(self.stats))

    @property
    def pause_ratio(self) -> dict[tuple[str, int | str], float]:
        """Fraction of the last interval spent paused, 0–1, by (direction, priority)."""
        elapsed = self.changes.elapsed
        if not elapsed:
            return {}
        ratios = {}
        for kind, labels, delta in self._by_kind({PFC_DURATION, PAUSE_DURATION}):
            key = (labels[1], int(labels[0])) if kind == PFC_DURATION else (labels[0], "global")
            ratios[key] = min(delta * MICROSECONDS / elapsed, 1.0)
        return ratios

    @property
    def pause_frame_rates(self) -> dict[tuple[str, int | str], float]:
        """PFC pause frames per second by (direction, priority); 802.3x pause frames under ``"global"``."""
        elapsed = self.changes.elapsed
        if not elapsed:
            return {}
        return {
            (labels[1], int(labels[0])) if kind == PFC_FRAMES else (labels[0], "global"): delta / elapsed
            for kind, labels, delta in self._by_kind({PFC_FRAMES, PAUSE_FRAMES})
        }

    @property
    def storm_event_deltas(self) -> dict[str, int]:
        """New pause-storm watermark events (``warning``, ``error``); an error means pause TX was disabled."""
        return {labels[0]: delta for _, labels, delta in self._by_kind({STORM})}

    @property
    def discard_deltas(self) -> dict[str, int]:
        return {labels[0]: delta for _, labels, delta in self._by_kind({DISCARDS}) if delta}

    @property
    def error_deltas(self) -> dict[str, int]:
        """Discards, CRC/symbol errors, link downs and pause-storm errors that grew since the previous sample."""
        grown = {labels[0]: delta for _, labels, delta in self._by_kind({DISCARDS, PHY_ERRORS}) if delta}
        if self.storm_event_deltas.get("error"):
            grown["tx_pause_storm_error_events"] = self.storm_event_deltas["error"]
        return grown

    @property
    def ecn_marked_rates(self) -> dict[int, float]:
        elapsed = self.changes.elapsed
        if not elapsed:
            return {}
        return {int(labels[0]): delta / elapsed for _, labels, delta in self._by_kind({ECN_MARKED})}

    def as_json(self) -> dict:
        def keyed(values: dict) -> dict:
            return {
                f"{direction}/{priority}": value for (direction, priority), value in sorted(values.items(), key=str)
            }

        return {
            "interface": self.interface,
            "rdma_ports": list(self.rdma_ports),
            "stats": len(self.stats),
            "pfc_priorities": list(self.pfc_priorities),
            "pause_ratio": keyed(self.pause_ratio),
            "pause_frame_rates": keyed(self.pause_frame_rates),
            "storm_event_deltas": self.storm_event_deltas,
            "error_deltas": self.error_deltas,
            "ecn_marked_rates": {str(p): rate for p, rate in sorted(self.ecn_marked_rates.items())},
            "counter_resets": self.changes.resets,
        }


@dataclass(frozen=True)
class EthtoolSample:
    """One sample of the node's interfaces: what ``mfu_exporter.render.ethtool`` exports and the attribution reads."""

    interfaces: dict[str, InterfaceReading]  # by interface name
    rows: tuple[tuple[str, tuple[str, ...], int], ...]  # (kind, label values, raw value) of each exported stat
    extras: tuple[tuple[tuple[str, str], int], ...]  # ((interface, stat), raw value) selected by stats_include
    totals: dict[str, float]  # node totals: "family" or "family|label value" -> since the exporter started
    max_pause_ratio: float | None  # node summary over SUMMARY_WINDOW; None before a window


class _Interface:
    """Per-interface state kept across samples while discovery keeps finding the interface: counter history, what
    to do with each of its stats, and whether its driver has no statistics (counted once, then not read).

    The driver names the same stats sample after sample (mlx5's set changes only with the PFC configuration), so
    each name is classified once per stat set (``plan``), not once per sample: that was most of the source's time."""

    def __init__(self, name: str, rdma_ports: tuple[str, ...]):
        self.name = name
        self.rdma_ports = rdma_ports
        self.unsupported = False
        self.history = CounterHistory(STAT_WIDTHS)
        self.names: tuple[str, ...] = ()
        self.curated: tuple[tuple[str, str, tuple[str, ...], bool], ...] = ()  # (stat, kind, labels, exported)
        self.extras: tuple[tuple[str, tuple[str, str]], ...] = ()  # (stat, labels) selected by stats_include

    def plan(self, names: tuple[str, ...], kinds: frozenset[str], is_extra: Callable[[str], bool] | None) -> None:
        """What to do with each stat of this stat set: ``names``, in the order the driver gives them."""
        self.names = names
        self.curated = tuple(
            (stat, curated[0], (self.name, *curated[1]), curated[0] in kinds)
            for stat in names
            if (curated := classify(stat)) is not None
        )
        self.extras = tuple((stat, (self.name, stat)) for stat in names if is_extra is not None and is_extra(stat))


class EthtoolSource:
    """PFC/pause/discard counters of the RDMA ports' netdevs plus configured interfaces.

    The RDMA ports are those of the devices ``rdma_devices_include``/``rdma_devices_exclude`` select (pass
    ``sources.rdma``'s lists), host-side VFs left out. The netdev of an excluded device is never read, even when
    ``interfaces_include`` matches it: devices are excluded because some (Fabric Manager's limited PFs on DGX and
    GB200) reject the register reads behind ``ethtool -S`` and flood the kernel log. Switchdev representors are
    left out unless ``representors``, whichever list names them.

    The interface list is resolved from sysfs every ``rediscover_interval`` seconds and whenever an interface
    goes missing. An interface whose driver has no statistics is counted once and not read again while
    discovery keeps finding it.
    """

    name = "ethtool"

    def __init__(
        self,
        sysfs_root: str = "/sys",
        interfaces_include: Iterable[str] = (),
        interfaces_exclude: Iterable[str] = (),
        stats_include: Iterable[str] = (),
        reader: StatsReader | None = None,
        interval: float = 1.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rediscover_interval: float = REDISCOVER_INTERVAL,
        rdma_devices_include: Iterable[str] = (".*",),
        rdma_devices_exclude: Iterable[str] = (),
        representors: bool = False,
        series: str = "full",  # every family; the config (sources.ethtool.series) defaults to standard
    ):
        self.interval = interval
        self.timeout = timeout
        self._sysfs_root = sysfs_root
        self._include = list(interfaces_include)
        self._exclude = NameFilter([".*"], interfaces_exclude)
        self._rdma_devices = NameFilter(rdma_devices_include, rdma_devices_exclude)
        self._representors = representors
        stats_pattern = "|".join(f"(?:{p})" for p in stats_include)
        self._stats_include = re.compile(stats_pattern) if stats_pattern else None
        self._reader = reader if reader is not None else EthtoolIoctlReader()
        self._clock = clock
        self._rediscover_interval = rediscover_interval
        self._interfaces: dict[str, _Interface] = {}
        self._missing: set[str] = set()  # interfaces the reader did not find: not read until the next discovery
        self._next_discovery = float("-inf")
        self._kinds = frozenset(kind for kind, level in KIND_LEVELS.items() if exports(series, level))
        self._totals = Totals()
        self._pauses = WindowedRates(SUMMARY_WINDOW)

    def _discover(self, now: float) -> None:
        by_netdev: dict[str, list[str]] = {}
        # Netdevs of RDMA devices the filters leave out; one shared with a selected device is left out too, since
        # the register reads go to the devices behind it.
        excluded: set[str] = set()
        for port in discover_ports(self._sysfs_root, representors=self._representors):
            if port.netdev:
                if self._rdma_devices(port.device):
                    by_netdev.setdefault(port.netdev, []).append(port.key)
                else:
                    excluded.add(port.netdev)
        names = [name for name in by_netdev if name not in excluded and self._exclude(name)]
        if self._include:
            include = NameFilter(self._include)
            try:
                present = sorted(os.listdir(os.path.join(self._sysfs_root, "class", "net")), key=natural_key)
            except OSError:
                present = []
            # discover_ports already left the representors out of by_netdev; these are the rest of the node's.
            names += [
                name
                for name in present
                if include(name)
                and self._exclude(name)
                and name not in by_netdev
                and name not in excluded
                and (self._representors or not is_representor(self._sysfs_root, name))
            ]
        interfaces = {}
        for name in names:
            rdma_ports = tuple(by_netdev.get(name, ()))
            interface = interfaces[name] = self._interfaces.get(name) or _Interface(name, rdma_ports)
            interface.rdma_ports = rdma_ports  # a port can gain or lose its netdev; the history is the interface's
        self._interfaces = interfaces
        self._missing = set()
        self._next_discovery = now + self._rediscover_interval

    def _is_extra(self, name: str) -> bool:
        return self._stats_include is not None and bool(self._stats_include.search(name))

    def sample(self) -> Snapshot:
        now = self._clock()
        if now >= self._next_discovery:
            self._discover(now)
        if not self._interfaces:
            raise SourceUnavailable(
                "no_interfaces",
                "no RDMA port has a netdev and no interface matches sources.ethtool.interfaces_include",
                retry_after=RETRY_WHEN_NO_INTERFACES,
            )
        errors: Counter = Counter()
        readings: list[InterfaceReading] = []
        rows: list[tuple[str, tuple[str, ...], int]] = []
        extras: list[tuple[tuple[str, str], int]] = []
        kinds = self._kinds
        for name, state in self._interfaces.items():
            if state.unsupported or name in self._missing:
                continue
            try:
                stats = self._reader.read(name)
            except OSError as exc:
                if exc.errno in (errno.ENODEV, errno.ENOENT, errno.ENXIO):
                    errors["interface_missing"] += 1
                    self._missing.add(name)
                    self._next_discovery = now  # renamed or unplugged: look again next sample
                elif exc.errno == errno.EOPNOTSUPP:
                    errors["not_supported"] += 1
                    state.unsupported = True
                else:
                    errors["read_failed"] += 1
                continue
            read_at = self._clock()
            names = tuple(stats)
            if names != state.names:
                state.plan(names, kinds, self._is_extra if self._stats_include is not None else None)
            curated: dict[str, int] = {}
            for stat, kind, labels, exported in state.curated:
                value = curated[stat] = stats[stat]
                if exported:
                    rows.append((kind, labels, value))
            for stat, labels in state.extras:
                extras.append((labels, stats[stat]))
            readings.append(InterfaceReading(name, state.rdma_ports, stats, state.history.update(read_at, curated)))
        if not readings:
            skipped = Counter(
                "not_supported" if state.unsupported else "interface_missing"
                for name, state in self._interfaces.items()
                if state.unsupported or name in self._missing
            )
            reason = (errors or skipped).most_common(1)[0][0]
            raise SourceUnavailable(reason, f"no statistics could be read from {', '.join(self._interfaces)}")
        totals, max_pause_ratio = self._summarize(readings)
        sample = EthtoolSample(
            {reading.interface: reading for reading in readings}, tuple(rows), tuple(extras), totals, max_pause_ratio
        )
        # Built when the status page asks (``Snapshot``): a third of the sample's CPU when it was built every second;
        # each reading is this sample's and never changes.
        return Snapshot(
            readings=sample, errors=errors, status=lambda: {"interfaces": [reading.as_json() for reading in readings]}
        )

    def _summarize(self, readings: list[InterfaceReading]) -> tuple[dict[str, float], float | None]:
        """The node summaries: pause-storm events, discards, ECN marks and 802.3x pause frames summed over the
        interfaces, and the largest share of time any interface was paused on any priority over the window."""
        totals = self._totals.totals
        paused: dict[str, float] = {}
        for reading in readings:
            first = reading.changes.elapsed is None
            # The first sample of an interface has no increase yet, but its totals exist (at 0) from now on.
            for stat, delta in dict.fromkeys(reading.stats, 0).items() if first else reading.changes.deltas.items():
                route = _summary_route(stat)
                if route is None:
                    continue
                if route[0]:
                    paused[f"{reading.interface}/{route[1]}"] = delta * MICROSECONDS
                else:
                    totals[route[1]] = totals.get(route[1], 0) + delta
        self._pauses.add(self._clock(), paused)
        ratio = self._pauses.max_rate()
        return dict(totals), None if ratio is None else min(ratio, 1.0)

    def close(self) -> None:
        self._reader.close()


@functools.lru_cache(maxsize=16384)
def _summary_route(stat: str) -> tuple[bool, str] | None:
    """Where a stat goes in the node summaries: (True, "direction/priority") for a pause duration, (False, the node
    total's key) for a counter summed over the interfaces, None for neither."""
    curated = classify(stat)
    if curated is None:
        return None
    kind, labels = curated
    if kind == PFC_DURATION or kind == PAUSE_DURATION:
        return True, "/".join(labels)
    key = _total_key(kind, labels)
    return None if key is None else (False, key)


def _total_key(kind: str, labels: tuple[str, ...]) -> str | None:
    """Which node total a curated stat adds to: "family" or "family|label value"; None for the ones summed nowhere."""
    if kind == STORM:
        return f"mfu_node_nic_pause_storm_events|{labels[0]}"
    if kind == PAUSE_FRAMES:
        return f"mfu_node_nic_pause_frames|{labels[0]}"
    if kind == DISCARDS:
        return "mfu_node_nic_discards"
    if kind == ECN_MARKED:
        return "mfu_node_nic_ecn_marked_packets"
    return None


SUMMARY_WINDOW = 60.0  # seconds over which mfu_node_nic_max_pause_ratio takes each interface's share of time paused

# The lowest series level (sources.ethtool.series) at which each kind's family is on. At standard, per interface,
# the PFC families the fabric dashboard and the node-tier rules read; storms, discards, ECN marks and 802.3x pause
# reach rules and dashboards as node totals (mfu_node_nic_*), each interface's at full. ``mfu_exporter.render.ethtool``
# names each kind's family.
KIND_LEVELS = {
    PFC_FRAMES: "standard",
    PFC_DURATION: "standard",
    PFC_TRANSITIONS: "standard",
    PAUSE_FRAMES: "full",
    PAUSE_DURATION: "full",
    STORM: "full",
    DISCARDS: "full",
    ECN_MARKED: "full",
}


def ethtool_source(section: EthtoolConfig, ctx: SourceContext) -> EthtoolSource:
    """The ``mfu_exporter.sources.SOURCES`` factory: ``sources.ethtool`` over ``ctx``'s sysfs tree and ethtool reader.
    The device lists of ``sources.rdma`` also choose the RDMA netdevs read here, so both sources see one fabric."""
    rdma = ctx.settings.sources.rdma
    return EthtoolSource(
        sysfs_root=ctx.paths.sysfs,
        interfaces_include=section.interfaces_include,
        interfaces_exclude=section.interfaces_exclude,
        stats_include=section.stats_include,
        reader=ctx.ethtool_reader,
        interval=section.interval,
        timeout=section.timeout,
        clock=ctx.monotonic,
        rdma_devices_include=rdma.devices_include,
        rdma_devices_exclude=rdma.devices_exclude,
        series=section.series,
    )
