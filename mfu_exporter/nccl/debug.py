"""Which transport NCCL chose, read from its ``NCCL_DEBUG=INFO`` lines.

The lines come as ``host:pid:tid [cudaDev] NCCL INFO <message>``, often behind a launcher's prefix; only the
message after ``NCCL INFO`` is read. Formats (NVIDIA/nccl, ../shared/reference/collectives-and-input.md):

- the network: ``NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>`` (the link layer is
  the suffix of each device), ``NET/IB : No device found.``, ``NET/Socket : Using [0]eth0:...``, ``NET/OFI ...``
  (aws-ofi-nccl), and since 2.5 the decision itself, ``Using network IB|Socket|AWS Libfabric|IBext...``;
- each channel: ``Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA`` (2.4: ``Ring 00 : 0 -> 8 [send] via
  ...``; since 2.12 ``NET/IB/0(4)/GDRDMA`` when another rank proxies, ``(PCI)`` and ``/Shared`` after it), and the
  intra-node ``via P2P/IPC``, ``via SHM/direct``.

NCCL up to 2.4.7 initialises sockets first and prints ``NET/Socket : Using`` even when it then uses IB, so the
channel lines decide, then ``Using network``, then the device lists, in that order. Falling back to sockets means
traffic between nodes went over them: a single host whose NCCL says ``Using network Socket`` did not fall back.

Pure: no files, no threads. ``TransportScanner`` keeps a bounded state, so a daemon can feed it a job's log as it
grows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Literal

Transport = Literal["ib", "roce", "socket", "ofi", "mixed"]

#: What the message of an INFO line starts after (anything before it is the host/pid/device prefix or a launcher's).
_INFO = "NCCL INFO"
_HOST = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]*):\d+:\d+\s+\[\d+\]\s+NCCL INFO")
_NET_CHANNEL = re.compile(r"\bvia NET/(?P<net>[^/\n]+?)/(?P<dev>\d+)(?:\(\d+\))?(?P<tail>\S*)")
_LOCAL_CHANNEL = re.compile(r"\bvia (?:P2P|SHM|NVLS|CollNet)\b")
_IB_USING = re.compile(r"^NET/IB\s*:\s*Using\b")
_IB_NONE = re.compile(r"^NET/IB\s*:\s*No device found")
_SOCKET_USING = re.compile(r"^NET/Socket\s*:\s*Using\b")
_OFI = re.compile(r"^NET/OFI\b")
_USING_NETWORK = re.compile(r"^(?:Using network|Assigned NET plugin)\s+(?P<net>.+?)(?:\s+to comm)?\s*$")
#: A device of an IB list: ``[0]mlx5_0:1/RoCE``, ``[0]mlx5_0:1:2/IB`` (rail), bonded ``[1] mlx5_3:1/RoCE``,
#: SHARP ``/IB/SHARP``.
_LINK_LAYER = re.compile(r"[\w.-]+:\d+(?::\d*)*/(?P<ll>IB|RoCE)\b")
_NODES = re.compile(r"\bnNodes (?P<n>\d+)")

#: Cap on the remembered host names: enough to tell one host from several.
_MAX_HOSTS = 2
_MAX_NODES = 1 << 20  # a node count past this is no job's
MAX_LINE_CHARS = 64 << 10  # of one line: NCCL's INFO lines are a few hundred characters


@dataclass(frozen=True)
class TransportFinding:
    """What the lines say about NCCL's transport between nodes.

    ``transport`` is None when the lines show no network decision (only intra-node channels, or an unknown plugin);
    ``gdr`` is True when a NET channel uses GPUDirect RDMA, False when NET channel lines exist without it, None when
    there are none; ``evidence`` quotes what decided.
    """

    transport: Transport | None
    gdr: bool | None
    fell_back_to_socket: bool
    evidence: str


def _kind(net: str) -> str:
    """A network (plugin) name as NCCL prints it, to a transport family: IB, IBext_v8 (the SHARP plugin) are ib."""
    name = net.strip()
    lower = name.lower()
    if lower.startswith("ib"):
        return "ib"
    if lower == "socket":
        return "socket"
    if "libfabric" in lower or "ofi" in lower:
        return "ofi"
    return "other:" + name


class TransportScanner:
    """Feed NCCL's log lines one by one; ``finding()`` says what they showed so far (None: nothing about it)."""

    def __init__(self) -> None:
        self._net_channels: dict[str, int] = {}  # family -> NET channel lines seen
        self._net_channel_example: dict[str, str] = {}
        self._gdr_channels = 0
        self._local_channels = 0
        self._using_network: dict[str, str] = {}  # family -> the line that said so
        self._ib_using: str | None = None
        self._ib_none: str | None = None
        self._socket_using: str | None = None
        self._ofi: str | None = None
        self._link_layers: set[str] = set()
        self._hosts: set[str] = set()
        self._nodes = 0
        self.skipped = 0  # lines that broke the parser, each skipped on its own

    def feed(self, line: str) -> None:
        """One line; a line that breaks the parser is counted in ``skipped``, never raised, so the rest is read."""
        try:
            self._feed(line[:MAX_LINE_CHARS])
        except Exception:  # noqa: BLE001 - one hostile or garbled line must not end the scan
            self.skipped += 1

    def _feed(self, line: str) -> None:
        at = line.find(_INFO)
        if at < 0:
            return
        end = at + len(_INFO)
        message = line[end:].strip()
        if len(self._hosts) < _MAX_HOSTS:  # two hosts tell "several": more would not change the finding
            host = _HOST.search(line, 0, end)
            if host is not None:
                self._hosts.add(host.group("host"))
        # Most of a busy log's NCCL lines are channel lines: a substring test spares them every regex that cannot
        # match.
        if "via " in message:
            channel = _NET_CHANNEL.search(message) if "via NET/" in message else None
            if channel is not None:
                kind = _kind(channel.group("net"))
                self._net_channels[kind] = self._net_channels.get(kind, 0) + 1
                self._net_channel_example.setdefault(kind, message)
                if "/GDRDMA" in channel.group("tail"):
                    self._gdr_channels += 1
                return
            if _LOCAL_CHANNEL.search(message):
                self._local_channels += 1
                return
        using = _USING_NETWORK.match(message)
        if using is not None:
            self._using_network.setdefault(_kind(using.group("net")), message)
            return
        if message.startswith("NET/IB"):
            self._link_layers.update(m.group("ll") for m in _LINK_LAYER.finditer(message))
            if _IB_USING.match(message) and self._ib_using is None:
                self._ib_using = message
            elif _IB_NONE.match(message) and self._ib_none is None:
                self._ib_none = message
            return
        if _SOCKET_USING.match(message):
            if self._socket_using is None:
                self._socket_using = message
            return
        if _OFI.match(message):
            if self._ofi is None:
                self._ofi = message
            return
        nodes = _NODES.search(message) if "nNodes" in message else None
        if nodes is not None:
            count = int(nodes.group("n"))
            if count <= _MAX_NODES:
                self._nodes = max(self._nodes, count)

    def _ib_flavour(self) -> Transport:
        if self._link_layers == {"RoCE"}:
            return "roce"
        if self._link_layers == {"IB", "RoCE"}:
            return "mixed"
        return "ib"

    def _family_transport(self, kinds: list[str]) -> Transport | None:
        named: set[Transport] = set()
        for kind in kinds:
            if kind == "ib":
                named.add(self._ib_flavour())
            elif kind in ("socket", "ofi"):
                named.add("socket" if kind == "socket" else "ofi")
        if len(kinds) > len(named) and len(kinds) == 1:
            return None  # one network NCCL names but this reader does not know (a vendor's plugin)
        if len(kinds) > 1 or len(named) > 1:
            return "mixed"
        return next(iter(named), None)

    def _many_nodes(self) -> bool:
        return self._nodes > 1 or len(self._hosts) > 1

    def finding(self) -> TransportFinding | None:
        gdr = None if not self._net_channels else self._gdr_channels > 0
        if self._net_channels:
            # NET channels carry traffic between nodes: what they use is what NCCL uses, whatever it printed before.
            kinds = sorted(self._net_channels)
            transport = self._family_transport(kinds)
            socket = self._net_channels.get("socket", 0)
            total = sum(self._net_channels.values())
            if socket:
                evidence = f"{socket} of {total} NET channel lines via sockets: {self._net_channel_example['socket']}"
            else:
                evidence = f"{total} NET channel lines: {self._net_channel_example[kinds[0]]}"
            return TransportFinding(transport, gdr, socket > 0, evidence)
        if self._using_network:
            transport = self._family_transport(sorted(self._using_network))
            evidence = "; ".join(self._using_network.values())
            socket = "socket" in self._using_network
        elif self._ib_using is not None:
            transport, evidence, socket = self._ib_flavour(), self._ib_using, False
        elif self._ofi is not None:
            transport, evidence, socket = "ofi", self._ofi, False
        elif self._socket_using is not None:
            transport, socket = "socket", True
            evidence = self._socket_using if self._ib_none is None else f"{self._ib_none}; {self._socket_using}"
        elif self._local_channels:
            return TransportFinding(None, None, False, f"{self._local_channels} intra-node channel lines only")
        else:
            return None
        fell_back = socket and self._many_nodes()
        if socket and not fell_back:
            evidence += " (one node: no traffic between nodes)"
        return TransportFinding(transport, gdr, fell_back, evidence)


def scan_transport(lines: Iterable[str]) -> TransportFinding | None:
    """The finding of a whole text (a file's lines, a paste)."""
    scanner = TransportScanner()
    for line in lines:
        scanner.feed(line)
    return scanner.finding()
