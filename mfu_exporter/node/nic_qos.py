"""A NIC's lossless-Ethernet settings as the kernel reports them: the PFC priorities and 802.3x global pause.

Both are read-only queries any user may make: the PFC bitmap through dcbnl (rtnetlink ``RTM_GETDCB`` with
``DCB_CMD_IEEE_GET``, the query behind ``dcb pfc show``, vendor-neutral), global pause through the
``ETHTOOL_GPAUSEPARAM`` ioctl (``ethtool -a``). Neither lives in sysfs, so ``--path.sysfs`` does not redirect them:
they describe the network namespace the process runs in (``hostNetwork`` in Kubernetes). Layouts:
``include/uapi/linux/dcbnl.h``, ``rtnetlink.h`` and ``ethtool.h``.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Protocol

RTM_GETDCB = 78
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
DCB_CMD_IEEE_GET = 21
DCB_ATTR_IFNAME = 1
DCB_ATTR_IEEE = 13
DCB_ATTR_IEEE_PFC = 2
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED / NLA_F_NET_BYTEORDER

SIOCETHTOOL = 0x8946
ETHTOOL_GPAUSEPARAM = 0x12
IFREQ_SIZE = 40  # struct ifreq on 64-bit: 16-byte name, then a union led by the ifr_data pointer


@dataclass(frozen=True)
class GlobalPause:
    autoneg: bool
    rx: bool
    tx: bool

    @property
    def enabled(self) -> bool:
        return self.rx or self.tx


class NicQos(Protocol):
    def pfc_priorities(self, interface: str) -> frozenset[int]:
        """Priorities (0–7) with PFC enabled. Raises OSError (EOPNOTSUPP: the driver has no DCB support)."""

    def global_pause(self, interface: str) -> GlobalPause:
        """802.3x pause settings. Raises OSError (EOPNOTSUPP: the driver does not report them)."""


def _attributes(payload: bytes) -> dict[int, bytes]:
    """Netlink attributes (type → value) of one nesting level; later duplicates win, as the kernel's parser does."""
    found = {}
    offset = 0
    while offset + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            break
        found[kind & NLA_TYPE_MASK] = payload[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return found


def build_ieee_get(interface: str, sequence: int) -> bytes:
    name = interface.encode() + b"\0"
    attribute = struct.pack("=HH", 4 + len(name), DCB_ATTR_IFNAME) + name
    attribute += b"\0" * (-len(attribute) % 4)
    body = struct.pack("=BBH", socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0) + attribute
    return struct.pack("=IHHII", 16 + len(body), RTM_GETDCB, NLM_F_REQUEST, sequence, 0) + body


def parse_ieee_reply(message: bytes) -> frozenset[int]:
    """The PFC-enabled priorities from one ``RTM_GETDCB`` reply (or raise the OSError an NLMSG_ERROR carries)."""
    length, kind = struct.unpack_from("=IH", message)
    if kind == NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", message, 16)
        raise OSError(-code, os.strerror(-code))
    if kind != RTM_GETDCB:
        raise OSError(errno.EPROTO, f"unexpected netlink message type {kind}")
    top = _attributes(message[20:length])  # after nlmsghdr (16) and dcbmsg (4)
    ieee = _attributes(top.get(DCB_ATTR_IEEE, b""))
    pfc = ieee.get(DCB_ATTR_IEEE_PFC)
    if pfc is None or len(pfc) < 2:
        raise OSError(errno.EOPNOTSUPP, "the driver reports no IEEE PFC settings")
    enabled = pfc[1]  # struct ieee_pfc { u8 pfc_cap; u8 pfc_en; ... }
    return frozenset(p for p in range(8) if enabled & (1 << p))


class KernelNicQos:
    """Queries the running kernel. Thread-safe; one netlink socket per query keeps replies from crossing."""

    def __init__(self) -> None:
        self._sequence = 0
        self._lock = threading.Lock()

    def pfc_priorities(self, interface: str) -> frozenset[int]:
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
            sock.settimeout(2.0)
            sock.bind((0, 0))
            sock.send(build_ieee_get(interface, sequence))
            while True:
                reply = sock.recv(65536)
                if struct.unpack_from("=I", reply, 8)[0] == sequence:
                    return parse_ieee_reply(reply)

    def global_pause(self, interface: str) -> GlobalPause:
        request = array.array("B", struct.pack("=IIII", ETHTOOL_GPAUSEPARAM, 0, 0, 0))
        address, _ = request.buffer_info()
        ifreq = struct.pack("16sP", interface.encode(), address).ljust(IFREQ_SIZE, b"\0")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
        _, autoneg, rx, tx = struct.unpack("=IIII", request.tobytes())
        return GlobalPause(bool(autoneg), bool(rx), bool(tx))
