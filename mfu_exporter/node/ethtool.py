"""NIC statistics (``ethtool -S``): the SIOCETHTOOL ioctl, and a parser of ``ethtool -S`` text.

Both readers share one small interface (``read(interface) -> {stat name: value}``, ``close()``).
``EthtoolIoctlReader`` talks to the kernel in the exporter's network namespace. ``EthtoolTextReader`` reads
recorded ``ethtool -S`` output (fixtures, the demo).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import operator
import os
import re
import socket
import struct
from array import array
from typing import Callable, Protocol

# include/uapi/linux/sockios.h and include/uapi/linux/ethtool.h
SIOCETHTOOL = 0x8946


ETHTOOL_GSTRINGS = 0x1B


ETHTOOL_GSTATS = 0x1D


ETHTOOL_GSSET_INFO = 0x37


ETH_SS_STATS = 1


ETH_GSTRING_LEN = 32


IFNAMSIZ = 16


# safchain/ethtool's buffer size. Kernels before 7b07be1ff1cb write their *current* stat count whatever count
# they were given, so a set that grew between two ioctls would overflow a buffer sized to the old count.
MAX_STATS = 32768


READ_ATTEMPTS = 3


class StatsReader(Protocol):
    def read(self, interface: str) -> dict[str, int]:
        """Every statistic of ``interface`` by name; raises OSError (ENODEV: no such interface, EOPNOTSUPP: no stats)."""

    def close(self) -> None:
        """Release the reader's handles."""


class EthtoolIoctlReader:
    """``ethtool -S`` without a subprocess: ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS and ETHTOOL_GSTATS.

    Two ioctls per interface per sample once the stat count is known: names, then values, each told the count
    expected. A kernel that answers with another count (the set changed in between) makes the reader count again
    and start over. One datagram socket and the buffers are kept for the reader's life.
    """

    def __init__(
        self,
        max_stats: int = MAX_STATS,
        open_socket: Callable[[], socket.socket] = lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
    ):
        self._max_stats = max_stats
        self._open_socket = open_socket
        self._socket: socket.socket | None = None
        # array.array gives the buffer address the kernel writes to (ifr_data) without ctypes.
        self._set_info = array("B", bytes(16 + 4))
        self._strings = array("B", bytes(12 + ETH_GSTRING_LEN * max_stats))
        self._values = array("B", bytes(8 + 8 * max_stats))
        self._counts: dict[str, int] = {}
        self._names: dict[str, tuple[bytes, list[str]]] = {}

    def read(self, interface: str) -> dict[str, int]:
        name = interface.encode()
        if not name or len(name) >= IFNAMSIZ or b"/" in name:
            raise OSError(errno.ENODEV, f"not an interface name: {interface!r}")
        if self._socket is None:
            self._socket = self._open_socket()
        count = self._counts.get(interface)
        if count is None:
            count = self._count(interface, name)
        for _ in range(READ_ATTEMPTS):
            if count == 0:
                return {}
            names = self._read_names(interface, name, count)
            values = self._read_values(name, count) if names is not None else None
            if names is not None and values is not None:
                self._counts[interface] = count
                return dict(zip(names, values))
            count = self._count(interface, name)
        self._counts.pop(interface, None)
        raise OSError(errno.EAGAIN, f"{interface}: the stat set changed during {READ_ATTEMPTS} reads in a row")

    def _ioctl(self, name: bytes, buffer: array) -> None:
        # struct ifreq: ifr_name[16], then the union whose first member is the ifr_data pointer; 40 bytes on 64-bit.
        assert self._socket is not None, "read() opens the socket before any ioctl"
        fcntl.ioctl(self._socket.fileno(), SIOCETHTOOL, struct.pack("16sP16x", name, buffer.buffer_info()[0]))

    def _count(self, interface: str, name: bytes) -> int:
        struct.pack_into("=IIQ", self._set_info, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS)
        self._ioctl(name, self._set_info)
        mask, count = struct.unpack_from("=QI", self._set_info, 8)
        if not mask & (1 << ETH_SS_STATS):
            raise OSError(errno.EOPNOTSUPP, f"{interface}: the driver has no statistics")
        if count > self._max_stats:
            raise OSError(errno.EOVERFLOW, f"{interface}: {count} statistics, more than {self._max_stats}")
        return count

    def _read_names(self, interface: str, name: bytes, count: int) -> list[str] | None:
        struct.pack_into("=III", self._strings, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        self._ioctl(name, self._strings)
        if struct.unpack_from("=I", self._strings, 8)[0] != count:
            return None
        raw = memoryview(self._strings)[12 : 12 + ETH_GSTRING_LEN * count].tobytes()
        cached = self._names.get(interface)
        if cached is not None and cached[0] == raw:
            return cached[1]
        names = [
            raw[i : i + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("utf-8", "replace")
            for i in range(0, len(raw), ETH_GSTRING_LEN)
        ]
        self._names[interface] = (raw, names)
        return names

    def _read_values(self, name: bytes, count: int) -> list[int] | None:
        struct.pack_into("=II", self._values, 0, ETHTOOL_GSTATS, count)
        self._ioctl(name, self._values)
        if struct.unpack_from("=I", self._values, 4)[0] != count:
            return None
        return memoryview(self._values)[8 : 8 + 8 * count].cast("Q").tolist()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


# "     rx_prio3_pause: 12" as ethtool prints it; names may themselves contain ": " (bnxt_en's "[0]: rx_bytes").
_STAT_LINE = re.compile(r"^\s+(\S.*?): ([0-9]+)\s*$", re.MULTILINE)


def parse_ethtool_statistics(text: str) -> dict[str, int]:
    """The statistics in ``ethtool -S`` output, by name."""
    return {name: int(value) for name, value in _STAT_LINE.findall(text)}


_ONE_STAT_LINE = re.compile(r"\s+(\S.*?): ([0-9]+)\s*")
# What ``_parse_line`` makes of a line of whitespace only. ``_STAT_LINE`` can match across such a line before the
# text's end (its ``^\s+`` takes line ends too), so a text with one is left to it; without, the regex matches line
# by line, as ``_parse_line`` does. Empty, so ``filter(None, ...)`` drops it with the lines that are no stat.
_BLANK: tuple = ()


def _parse_line(line: str) -> tuple[str, int] | tuple | None:
    if not line.strip():
        return _BLANK
    match = _ONE_STAT_LINE.fullmatch(line)
    return (match.group(1), int(match.group(2))) if match else None


class EthtoolTextReader:
    """Statistics parsed from ``ethtool -S`` text that ``load(interface)`` returns (recorded output, the demo)."""

    def __init__(self, load: Callable[[str], str]):
        self._load = load
        # Per interface, the lines of its previous text and their parses: from one sample to the next most lines of
        # a NIC's statistics keep their value (error and idle-queue counters), so most lines need no parse.
        self._lines: dict[str, tuple[list[str], list[tuple[str, int] | tuple | None]]] = {}

    @classmethod
    def from_directory(cls, directory: str, filename: str = "statistics") -> "EthtoolTextReader":
        """Texts at ``<directory>/<interface>/statistics``, the layout of node_exporter's ethtool fixtures.

        A missing file reads as ENODEV (no such interface). Writers should replace files atomically (rename):
        each read opens the file afresh.
        """

        def load(interface: str) -> str:
            try:
                with open(os.path.join(directory, interface, filename), encoding="utf-8") as handle:
                    return handle.read()
            except FileNotFoundError:
                raise OSError(errno.ENODEV, f"no statistics file for {interface} in {directory}") from None

        return cls(load)

    def read(self, interface: str) -> dict[str, int]:
        text = self._load(interface)
        lines = text.split("\n")
        previous = self._lines.get(interface)
        if previous is not None and len(previous[0]) == len(lines):
            # Only the lines that differ from the previous text's are parsed again (found without a Python loop).
            parsed = previous[1].copy()
            for index in itertools.compress(itertools.count(), map(operator.ne, lines, previous[0])):
                parsed[index] = _parse_line(lines[index])
        else:
            parsed = [_parse_line(line) for line in lines]
        self._lines[interface] = (lines, parsed)
        if _BLANK in parsed[:-1]:  # the piece after the final line end may be blank
            return parse_ethtool_statistics(text)
        return dict(filter(None, parsed))

    def close(self) -> None:
        self._lines.clear()
