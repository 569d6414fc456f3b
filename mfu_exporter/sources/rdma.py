"""RDMA ports (InfiniBand and RoCE v2) from sysfs: state, data and packet counters, and every counter file.

Layout read, under the configurable sysfs root (``--path.sysfs``)::

    class/infiniband/<device>/device            -> the PCI function (its name is the PCI address)
    class/infiniband/<device>/device/numa_node
    class/infiniband/<device>/device/physfn     (present on SR-IOV virtual functions)
    class/infiniband/<device>/ports/<n>/{state,phys_state,rate,link_layer}
    class/infiniband/<device>/ports/<n>/gid_attrs/ndevs/<index>   (the netdev of a RoCE port)
    class/infiniband/<device>/ports/<n>/counters/*     (PMA port counters)
    class/infiniband/<device>/ports/<n>/hw_counters/*  (driver counters: mlx5 Q-counters, congestion)

Every counter file is optional (firmware decides which groups exist) and read through a file descriptor kept
open across samples: one ``pread`` per file per sample. The ports are rediscovered, every file closed and opened
again, when the device list changes, when a read finds its device gone (hot unplug, driver reload) and every
``rediscover_interval`` seconds (the kernel creates a device's directory before its ports). A file the device
does not support (EOPNOTSUPP, EINVAL, ``N/A (no PMA)``) or will not let us read (EACCES, EPERM) is counted once
as an error and never opened again while its port exists: its path is remembered across rediscoveries and
forgotten only with the port, so a device plugged in again is asked afresh.

Switchdev representors (a VF's or SF's port on the eswitch, ``phys_port_name`` ``pf0vf3``) are left out by
default: mlx5 names them like any port (``mlx5_0`` port 2), so no device-name regex can.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

from mfu_exporter.config import RdmaConfig
from mfu_exporter.node.counters import Changes, CounterHistory, Totals, WindowedRates
from mfu_exporter.node.rdma import (
    RdmaPort,
    discover_ports,
    list_devices,
    parse_rate_gbps,
    state_name,
)
from mfu_exporter.sources.base import Snapshot, SourceContext, SourceUnavailable, exports

# port_rcv_data / port_xmit_data count 4-octet words: the kernel ABI says "divided by 4 (lanes)", and mlx5
# literally shifts the octet count right by 2. The factor is always 4, never the link width.
OCTETS_PER_DATA_WORD = 4
RETRY_WHEN_NO_PORTS = 30.0
REDISCOVER_INTERVAL = 30.0
DEFAULT_MAX_OPEN_FILES = 512

DATA_COUNTERS = {"port_rcv_data": "received", "port_xmit_data": "transmitted"}
PACKET_COUNTERS = {"port_rcv_packets": "received", "port_xmit_packets": "transmitted"}
# Not a counter: how long the kernel caches hw_counters between firmware queries.
NOT_COUNTERS = frozenset({"lifespan"})

# counters/ that mean lost or corrupted traffic; a non-zero delta is worth showing.
PORT_ERROR_COUNTERS = frozenset(
    {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_rcv_discards",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
    }
)
# hw_counters/ that mean drops, retransmissions or broken connections on a supposedly lossless fabric.
HW_ERROR_COUNTERS = frozenset(
    {
        "out_of_buffer",
        "out_of_sequence",
        "packet_seq_err",
        "implied_nak_seq_err",
        "local_ack_timeout_err",
        "rnr_nak_retry_err",
        "duplicate_request",
        "req_cqe_error",
        "resp_cqe_error",
        "req_remote_invalid_request",
        "req_remote_access_errors",
        "resp_remote_access_errors",
        "resp_local_length_error",
        "req_transport_retries_exceeded",
        "req_rnr_retries_exceeded",
        "rx_icrc_encapsulated",
        "roce_adp_retrans",
        "roce_adp_retrans_to",
    }
)
# DCQCN: ECN marks seen and CNPs sent by the notification point, CNPs acted on or ignored by the reaction point.
CONGESTION_COUNTERS = frozenset({"np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored"})

# The lowest series level (sources.rdma.series) at which each family is on. hw_counters at standard are the ones
# sources.rdma.hw_counters lists; the PMA error counters and the transport errors reach rules and dashboards summed
# per node (mfu_node_rdma_errors_total), each port's at full.
FAMILY_LEVELS = {
    "mfu_rdma_port_info": "standard",
    "mfu_rdma_port_up": "minimal",
    "mfu_rdma_port_rate_bytes_per_second": "standard",
    "mfu_rdma_port_data_received_bytes": "standard",
    "mfu_rdma_port_data_transmitted_bytes": "standard",
    "mfu_rdma_port_packets_received": "full",
    "mfu_rdma_port_packets_transmitted": "full",
    "mfu_rdma_port_counters": "full",
    "mfu_rdma_hw_counters": "standard",
}
# Node summaries, on at every level. The error counters summed over the node's ports: the link errors the fabric
# dashboard and the RDMA alerts read, and the transport errors and retransmissions (the attribution's set among them).
NODE_PORT_ERROR_COUNTERS = (  # counters/
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
NODE_HW_ERROR_COUNTERS = (  # hw_counters/
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "out_of_sequence",
    "implied_nak_seq_err",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
    "rx_icrc_encapsulated",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
)
NODE_ERROR_COUNTERS = NODE_PORT_ERROR_COUNTERS + NODE_HW_ERROR_COUNTERS
# A port's CNP rate is np_cnp_sent + rp_cnp_handled, as in the attribution.
# The files read at every series level: data counters, and the error and congestion counters the attribution, the
# node summaries and the status page read.
READ_ALWAYS = (
    frozenset(DATA_COUNTERS)
    | PORT_ERROR_COUNTERS
    | HW_ERROR_COUNTERS
    | CONGESTION_COUNTERS
    | frozenset(NODE_ERROR_COUNTERS)
)
SUMMARY_WINDOW = 60.0  # seconds over which mfu_node_rdma_max_cnps_per_second takes each port's rate

# Counters narrower than 64 bits, which wrap. mlx5 Q-counters are 32-bit (read with be32_to_cpu); the
# congestion counters and rx_icrc_encapsulated are 64-bit. The narrow PMA error fields (symbol_error is 16 bits,
# link_downed 8) saturate instead of wrapping, so a decrease there is a reset and needs no width.
PORT_COUNTER_WIDTHS = {"port_xmit_wait": 32}
HW_COUNTER_WIDTHS = dict.fromkeys(
    (
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
    ),
    32,
)

_UNSUPPORTED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.EINVAL})
_GONE_ERRNOS = frozenset({errno.ENODEV, errno.ENOENT, errno.ENXIO})
_DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


class _Gone(Exception):
    """The port's device disappeared while it was being read."""


class _SysfsFile:
    """One sysfs attribute, read with pread on a kept descriptor, or opened per read when over the fd budget."""

    __slots__ = ("name", "path", "fd")

    def __init__(self, name: str, path: str, fd: int | None):
        self.name, self.path, self.fd = name, path, fd

    def read(self) -> bytes:
        if self.fd is not None:
            return os.pread(self.fd, 128, 0)
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, 128)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _FileBudget:
    """How many more descriptors the source may keep open (the process soft limit is often 1024)."""

    def __init__(self, limit: int):
        self.left = limit

    def open(self, name: str, path: str) -> _SysfsFile:
        """The file, kept open while the budget lasts; raises OSError when it is unreadable or gone."""
        fd = None
        if self.left > 0:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                self.left -= 1
            except OSError as exc:
                if exc.errno in _DENIED_ERRNOS or exc.errno in _GONE_ERRNOS:
                    raise
                # EMFILE/ENFILE and friends: read this one by path instead.
        return _SysfsFile(name, path, fd)


@dataclass
class PortReading:
    """One port in one sample: its latest values and what changed since the previous sample.

    ``counters`` and ``hw_counters`` are raw, as sysfs reports them (``port_rcv_data`` in 4-octet words); use the
    ``*_bytes_per_second`` properties for bytes.
    """

    port: RdmaPort
    counters: dict[str, int]
    hw_counters: dict[str, int]
    counter_changes: Changes
    hw_counter_changes: Changes

    @property
    def receive_bytes_per_second(self) -> float | None:
        return self.counter_changes.rate("port_rcv_data", OCTETS_PER_DATA_WORD)

    @property
    def transmit_bytes_per_second(self) -> float | None:
        return self.counter_changes.rate("port_xmit_data", OCTETS_PER_DATA_WORD)

    @property
    def error_deltas(self) -> dict[str, int]:
        """Error counters (counters/ and hw_counters/) that grew since the previous sample, by name."""
        grown = {n: d for n, d in self.counter_changes.deltas.items() if d and n in PORT_ERROR_COUNTERS}
        grown.update((n, d) for n, d in self.hw_counter_changes.deltas.items() if d and n in HW_ERROR_COUNTERS)
        return grown

    @property
    def congestion_rates(self) -> dict[str, float]:
        """Per-second rates of the DCQCN counters the device has (ECN marks, CNPs sent, handled, ignored)."""
        return {n: rate for n, rate in self.hw_counter_changes.rates().items() if n in CONGESTION_COUNTERS}

    @property
    def resets(self) -> list[str]:
        return self.counter_changes.resets + self.hw_counter_changes.resets

    def as_json(self) -> dict:
        port = self.port
        return {
            "device": port.device,
            "port": port.port,
            "netdev": port.netdev,
            "link_layer": port.link_layer,
            "state": port.state,
            "rate": port.rate,
            "rate_gbps": port.rate_gbps,
            "pci_address": port.pci_address,
            "numa_node": port.numa_node,
            "receive_bytes_per_second": self.receive_bytes_per_second,
            "transmit_bytes_per_second": self.transmit_bytes_per_second,
            "error_deltas": self.error_deltas,
            "congestion_rates": self.congestion_rates,
            "counter_resets": self.resets,
        }


@dataclass(frozen=True)
class RdmaSample:
    """One sample of the node's RDMA ports: what ``mfu_exporter.render.rdma`` exports and the attribution reads."""

    series: str  # sources.rdma.series: which families are exported (FAMILY_LEVELS)
    hw_counters: frozenset[str] | None  # the hw_counters files exported per port; None: every one
    ports: dict[str, PortReading]  # "mlx5_0/1" -> its reading
    error_totals: dict[str, float]  # node summary: error counter -> its total over the ports since the exporter started
    max_cnps: float | None  # node summary: the busiest port's CNP rate over SUMMARY_WINDOW; None before a window


class _OpenPort:
    """A discovered port with its files open.

    ``known_bad`` holds the paths of the port's files already counted as unsupported or unreadable; they are not
    opened. The source keeps the set across rediscoveries of the port, and this port adds to it.
    """

    def __init__(
        self,
        port: RdmaPort,
        budget: _FileBudget,
        errors: Counter,
        known_bad: set[str],
        wanted: frozenset[str] | None = None,
    ):
        self.port = port
        self.wanted = wanted
        self.known_bad = known_bad
        self.state_file = self._open("state", os.path.join(port.path, "state"), budget, errors)
        self.rate_file = self._open("rate", os.path.join(port.path, "rate"), budget, errors)
        self.counter_files = self._open_dir(os.path.join(port.path, "counters"), budget, errors)
        self.hw_files = self._open_dir(os.path.join(port.path, "hw_counters"), budget, errors)

    def _open(self, name: str, path: str, budget: _FileBudget, errors: Counter) -> _SysfsFile | None:
        if path in self.known_bad:
            return None
        try:
            return budget.open(name, path)
        except OSError as exc:
            if exc.errno in _DENIED_ERRNOS:
                errors["unreadable"] += 1
                self.known_bad.add(path)
            else:
                # Listed a moment ago, gone now: the device is going away, or the file was being replaced. Not
                # remembered; the next rediscovery tries it again.
                errors["missing"] += 1
            return None

    def _open_dir(self, path: str, budget: _FileBudget, errors: Counter) -> list[_SysfsFile]:
        try:
            names = sorted(os.listdir(path))
        except OSError:
            return []  # Broadcom bnxt_re has no counters/; older kernels no hw_counters/
        files = []
        for name in names:
            if name in NOT_COUNTERS or (self.wanted is not None and name not in self.wanted):
                continue
            opened = self._open(name, os.path.join(path, name), budget, errors)
            if opened is not None:
                files.append(opened)
        return files

    def close(self) -> None:
        for handle in (self.state_file, self.rate_file, *self.counter_files, *self.hw_files):
            if handle is not None:
                handle.close()


def _read_counters(files: list[_SysfsFile], errors: Counter, known_bad: set[str]) -> dict[str, int]:
    """Values of ``files``; files that turn out unsupported or unreadable are closed, dropped from the list and
    added to ``known_bad``. Other failures (EIO, an unparsable value) count every sample and keep the file."""
    values: dict[str, int] = {}
    dropped: list[_SysfsFile] = []
    for handle in files:
        try:
            raw = handle.read()
        except OSError as exc:
            if exc.errno in _GONE_ERRNOS:
                raise _Gone from exc
            if exc.errno in _UNSUPPORTED_ERRNOS:
                errors["not_supported"] += 1
                dropped.append(handle)
            elif exc.errno in _DENIED_ERRNOS:
                errors["unreadable"] += 1
                dropped.append(handle)
            else:
                errors["read_failed"] += 1
            continue
        try:
            values[handle.name] = int(raw)
        except ValueError:
            if b"N/A" in raw:  # "N/A (no PMA)": iWARP and ConnectX-3 VFs on older kernels
                errors["no_pma"] += 1
                dropped.append(handle)
            else:
                errors["unparsable"] += 1
    for handle in dropped:
        handle.close()
        files.remove(handle)
        known_bad.add(handle.path)
    return values


def _read_attribute(handle: _SysfsFile | None) -> str | None:
    if handle is None:
        return None
    try:
        return handle.read().decode("utf-8", "replace").strip() or None
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            raise _Gone from exc
        return None


class RdmaSource:
    """Samples every RDMA port under the sysfs root; see the module docstring for the layout and error rules."""

    name = "rdma"

    def __init__(
        self,
        sysfs_root: str = "/sys",
        devices_include: Iterable[str] = (".*",),
        devices_exclude: Iterable[str] = (),
        virtual_functions: bool = False,
        interval: float = 1.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        rediscover_interval: float = REDISCOVER_INTERVAL,
        representors: bool = False,
        series: str = "full",  # every family; the config (sources.<name>.series) defaults to standard
        hw_counters: Iterable[str] | None = None,
    ):
        self.interval = interval
        self.timeout = timeout
        self._sysfs_root = sysfs_root
        self._include = list(devices_include)
        self._exclude = list(devices_exclude)
        self._virtual_functions = virtual_functions
        self._representors = representors
        self._clock = clock
        self._max_open_files = max_open_files
        self._rediscover_interval = rediscover_interval
        self._ports: dict[str, _OpenPort] = {}
        # Port key -> paths of its files counted as unsupported or unreadable; lives as long as the port does.
        self._known_bad: dict[str, set[str]] = {}
        self._histories: dict[str, tuple[CounterHistory, CounterHistory]] = {}
        self._listed: list[str] | None = None
        self._stale = True
        self._next_discovery = float("-inf")
        self._series = series
        self._families = frozenset(name for name, level in FAMILY_LEVELS.items() if exports(series, level))
        # None: every hw_counters file (series: full, or no list given).
        self._hw_allowed = None if series == "full" or hw_counters is None else frozenset(hw_counters)
        # The files read: below full, only those something uses (exported, summed per node, read by the attribution
        # or shown on the status page), a third fewer reads a second; every file at full.
        self._wanted = (
            None
            if self._hw_allowed is None or "mfu_rdma_port_counters" in self._families
            else READ_ALWAYS
            | self._hw_allowed
            | (frozenset(PACKET_COUNTERS) if "mfu_rdma_port_packets_received" in self._families else frozenset())
        )
        self._errors_total = Totals()
        self._cnps = WindowedRates(SUMMARY_WINDOW)

    def _rediscover(self, listed: list[str] | None, errors: Counter) -> None:
        for opened in self._ports.values():
            opened.close()
        previous = set(self._ports)
        budget = _FileBudget(self._max_open_files)
        discovered = discover_ports(
            self._sysfs_root,
            self._include,
            self._exclude,
            virtual_functions=self._virtual_functions,
            representors=self._representors,
        )
        self._known_bad = {port.key: self._known_bad.get(port.key, set()) for port in discovered}
        self._ports = {
            port.key: _OpenPort(port, budget, errors, self._known_bad[port.key], self._wanted) for port in discovered
        }
        removed = len(previous - set(self._ports))
        if removed:
            errors["port_removed"] += removed
        for key in set(self._histories) - set(self._ports):
            del self._histories[key]
        self._listed = listed
        self._stale = False
        self._next_discovery = self._clock() + self._rediscover_interval

    def sample(self) -> Snapshot:
        errors: Counter = Counter()
        listed = list_devices(self._sysfs_root)
        # The kernel creates a device's directory before its ports: a listing that did not change can still hide
        # ports that appeared since, so look again now and then.
        if self._stale or listed != self._listed or self._clock() >= self._next_discovery:
            self._rediscover(listed, errors)
        if not self._ports:
            where = os.path.join(self._sysfs_root, "class", "infiniband")
            detail = (
                f"{where} does not exist (no RDMA driver loaded)"
                if listed is None
                else f"no ports of an included device under {where} (devices: {', '.join(listed) or 'none'})"
            )
            raise SourceUnavailable("no_devices", detail, retry_after=RETRY_WHEN_NO_PORTS)
        readings: list[PortReading] = []
        for key, opened in list(self._ports.items()):
            try:
                readings.append(self._read_port(key, opened, errors))
            except _Gone:
                opened.close()
                del self._ports[key]
                self._histories.pop(key, None)
                self._known_bad.pop(key, None)
                errors["port_removed"] += 1
                self._stale = True
        error_totals, max_cnps = self._summarize(readings)
        sample = RdmaSample(
            self._series,
            self._hw_allowed,
            {reading.port.key: reading for reading in readings},
            error_totals,
            max_cnps,
        )
        # Built when the status page asks (``Snapshot``): each reading is this sample's and never changes.
        return Snapshot(
            readings=sample, errors=errors, status=lambda: {"ports": [reading.as_json() for reading in readings]}
        )

    def _summarize(self, readings: list[PortReading]) -> tuple[dict[str, float], float | None]:
        """The node summaries: error counters summed over the ports, and the busiest port's CNP rate."""
        totals = self._errors_total.totals
        cnps: dict[str, float] = {}
        for reading in readings:
            hw = reading.hw_counter_changes.deltas
            for deltas, values, names in (
                (reading.counter_changes.deltas, reading.counters, NODE_PORT_ERROR_COUNTERS),
                (hw, reading.hw_counters, NODE_HW_ERROR_COUNTERS),
            ):
                for name in names:
                    if name in values:  # a file the port has: its total is exported, 0 until it grows
                        totals[name] = totals.get(name, 0) + deltas.get(name, 0)
            cnps[reading.port.key] = hw.get("np_cnp_sent", 0) + hw.get("rp_cnp_handled", 0)
        self._cnps.add(self._clock(), cnps)
        return dict(totals), self._cnps.max_rate()

    def _read_port(self, key: str, opened: _OpenPort, errors: Counter) -> PortReading:
        now = self._clock()
        port = opened.port
        state = state_name(_read_attribute(opened.state_file))
        rate = _read_attribute(opened.rate_file)
        if state != port.state or rate != port.rate:
            port = opened.port = dataclasses.replace(port, state=state, rate=rate, rate_gbps=parse_rate_gbps(rate))
        counters = _read_counters(opened.counter_files, errors, opened.known_bad)
        hw_counters = _read_counters(opened.hw_files, errors, opened.known_bad)
        histories = self._histories.get(key)
        if histories is None:
            histories = self._histories[key] = (CounterHistory(PORT_COUNTER_WIDTHS), CounterHistory(HW_COUNTER_WIDTHS))
        return PortReading(
            port, counters, hw_counters, histories[0].update(now, counters), histories[1].update(now, hw_counters)
        )

    def close(self) -> None:
        for opened in self._ports.values():
            opened.close()
        self._ports = {}
        self._stale = True


def rdma_source(section: RdmaConfig, ctx: SourceContext) -> RdmaSource:
    """The ``mfu_exporter.sources.SOURCES`` factory: ``sources.rdma`` over ``ctx``'s sysfs tree."""
    return RdmaSource(
        sysfs_root=ctx.paths.sysfs,
        devices_include=section.devices_include,
        devices_exclude=section.devices_exclude,
        virtual_functions=section.virtual_functions,
        interval=section.interval,
        timeout=section.timeout,
        clock=ctx.monotonic,
        series=section.series,
        hw_counters=section.hw_counters,
    )
