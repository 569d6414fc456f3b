"""The daemon's own cost: client_python's ``ProcessCollector`` families, with open descriptors counted cheaply.

The daemon keeps a descriptor open per RDMA counter file (about 300 on an 8-port node). Listing ``/proc/self/fd``
to count them, as ``ProcessCollector`` does, makes a string per descriptor: about 70 µs hot and 0.4 ms on a once-a-
second scrape (docs/benchmarks.md). Since Linux 6.2 the size ``stat`` gives of that directory is the count itself;
an older kernel gives 0 and the directory is listed. Sample output::

    # HELP process_open_fds Number of open file descriptors.
    # TYPE process_open_fds gauge
    process_open_fds 312.0
"""

from __future__ import annotations

import os
from typing import Iterable

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric


def open_descriptors(fd_directory: str) -> int:
    """How many descriptors are open under ``/proc/<pid>/fd``: its size on Linux 6.2 and later, else its listing.
    A process has at least its standard streams open, so a size of 0 means a kernel that does not count."""
    return os.stat(fd_directory).st_size or len(os.listdir(fd_directory))


class DaemonProcessCollector(ProcessCollector):
    """``ProcessCollector``'s six families with its names, help texts and /proc reads (its clock ticks, page size
    and boot time), but ``process_open_fds`` from ``open_descriptors``. Reads this process's own /proc/self."""

    def __init__(self, proc: str = "/proc"):
        super().__init__(proc=proc, registry=None)

    def collect(self) -> Iterable[Metric]:
        if not self._btime:  # /proc unreadable: what ProcessCollector does too
            return []
        pid = os.path.join(self._proc, "self")
        result: list[Metric] = []
        try:
            with open(os.path.join(pid, "stat"), "rb") as stat:
                parts = stat.read().split(b")")[-1].split()
            result += [
                GaugeMetricFamily(
                    "process_virtual_memory_bytes", "Virtual memory size in bytes.", value=float(parts[20])
                ),
                GaugeMetricFamily(
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    value=float(parts[21]) * self._pagesize,
                ),
                GaugeMetricFamily(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    value=float(parts[19]) / self._ticks + self._btime,
                ),
                CounterMetricFamily(
                    "process_cpu_seconds",
                    "Total user and system CPU time spent in seconds.",
                    value=(float(parts[11]) + float(parts[12])) / self._ticks,
                ),
            ]
        except OSError:
            pass
        try:
            with open(os.path.join(pid, "limits"), "rb") as limits:
                max_fds = next(float(line.split()[3]) for line in limits if line.startswith(b"Max open file"))
            result += [
                GaugeMetricFamily(
                    "process_open_fds",
                    "Number of open file descriptors.",
                    float(open_descriptors(os.path.join(pid, "fd"))),
                ),
                GaugeMetricFamily("process_max_fds", "Maximum number of open file descriptors.", value=max_fds),
            ]
        except (OSError, StopIteration):
            pass
        return result
