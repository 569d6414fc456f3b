"""The transport NCCL chose, from NCCL_DEBUG=INFO lines built from NCCL's own format strings (NVIDIA/nccl
src/transport/net.cc, net_ib/init.cc, net_socket.cc, init.cc). The real pastes are scored in test_real_nccl.py."""

from __future__ import annotations

import pytest

from mfu_exporter.nccl import TransportFinding, TransportScanner, scan_transport

P0 = "node-a:1234:1290 [0] NCCL INFO "
P1 = "node-b:2234:2290 [0] NCCL INFO "

CASES = {
    "ib with gdr": (
        [
            P0 + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.0.0.1<0>",
            P0 + "Using network IB",
            P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
            P0 + "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
            P0 + "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read",
        ],
        ("ib", True, False),
    ),
    "roce without gdr": (
        [
            P0 + "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>",
            P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0",
            P0 + "Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1",
        ],
        ("roce", False, False),
    ),
    "proxied channel, PCI gdr and shared buffers (2.12+)": (
        [
            P0 + "NET/IB : Using [0]mlx5_0:1/RoCE; OOB eth0:10.0.0.1<0>",
            P0 + "Channel 02/1 : 0[0] -> 8[0] [send] via NET/IB/0(4)/GDRDMA(PCI)/Shared",
        ],
        ("roce", True, False),
    ),
    "socket between nodes": (
        [
            P0 + "NET/IB : No device found.",
            P0 + "NET/Socket : Using [0]eth0:10.0.0.1<0>",
            P0 + "Using network Socket",
            P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0",
        ],
        ("socket", False, True),
    ),
    "socket on one host is no fallback": (
        [
            P0 + "NET/IB : No device found.",
            P0 + "NET/Socket : Using [0]eth0:10.0.0.1<0>",
            P0 + "Using network Socket",
            P0 + "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
        ],
        ("socket", None, False),
    ),
    "socket chosen, two nodes in the comm line": (
        [
            P0 + "Using network Socket",
            P0 + "comm 0x55d5c0 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
        ],
        ("socket", None, True),
    ),
    "socket chosen, lines from two hosts": (
        [P0 + "NET/Socket : Using [0]eth0:10.0.0.1<0>", P1 + "NET/Socket : Using [0]eth0:10.0.0.2<0>"],
        ("socket", None, True),
    ),
    "NCCL 2.4: sockets initialised first, IB used": (
        [
            P0 + "NET/Socket : Using [0]ib0:10.0.0.1<0>",
            P0 + "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
            P0 + "Ring 00 : 7 -> 8 [send] via NET/IB/0/GDRDMA",
        ],
        ("ib", True, False),
    ),
    "NCCL 2.4 without channel lines": (
        [P0 + "NET/Socket : Using [0]ib0:10.0.0.1<0>", P0 + "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>"],
        ("ib", None, False),
    ),
    "aws-ofi-nccl": (
        [
            P0 + "NET/OFI Selected Provider is efa (found 4 nics)",
            P0 + "Using network AWS Libfabric",
            P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",
        ],
        ("ofi", True, False),
    ),
    "SHARP plugin (IBext) on RoCE": (
        [
            P0 + "NET/Plugin: Loaded net plugin IBext_v8 (v8)",
            P0 + "NET/IB : Using [0]mlx5_0:1/RoCE [1]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}; OOB eth0:1.2.3.4<0>",
            P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/0/GDRDMA",
        ],
        ("roce", True, False),
    ),
    "some channels on sockets": (
        [
            P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
            P1 + "Channel 00/0 : 8[0] -> 0[0] [send] via NET/Socket/0",
        ],
        ("mixed", True, True),
    ),
    "IB and RoCE ports": (
        [P0 + "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB; OOB eth0:1.2.3.4<0>"],
        ("mixed", None, False),
    ),
    "2.28 plugin assignment": (
        [P0 + "NET/IB : Using [0]mlx5_0:1:0/IB; OOB ib0:1.2.3.4<0>", P0 + "Assigned NET plugin IB to comm"],
        ("ib", None, False),
    ),
    "launcher prefixes before the NCCL prefix": (
        [
            "[1,0]<stdout>:" + P0 + "NET/IB : Using [0]mlx5_0:1/RoCE; OOB eth0:1.2.3.4<0>",
            "0: " + P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
        ],
        ("roce", True, False),
    ),
    "an unknown vendor plugin": (
        [P0 + "Using network FasTrak", P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/FasTrak/0/GDRDMA"],
        (None, True, False),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_transport_from_lines(name: str) -> None:
    lines, (transport, gdr, fell_back) = CASES[name]
    finding = scan_transport(lines)
    assert finding is not None
    assert (finding.transport, finding.gdr, finding.fell_back_to_socket) == (transport, gdr, fell_back)
    assert finding.evidence


def test_nothing_about_nccl_is_none() -> None:
    assert scan_transport([]) is None
    assert scan_transport(["iteration 10 | loss 2.3", "NCCL version 2.18.3+cuda12.2"]) is None
    assert scan_transport([P0 + "cudaDriverVersion 12020", P0 + "Bootstrap : Using eth0:10.0.0.1<0>"]) is None


def test_intra_node_channels_only() -> None:
    finding = scan_transport(
        [P0 + "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC", P0 + "Channel 00 : 1[1] -> 0[0] via SHM/direct"]
    )
    assert finding == TransportFinding(None, None, False, finding.evidence if finding else "")


def test_scanner_is_incremental() -> None:
    scanner = TransportScanner()
    assert scanner.finding() is None
    scanner.feed(P0 + "NET/IB : Using [0]mlx5_0:1/IB; OOB ib0:1.2.3.4<0>")
    first = scanner.finding()
    assert first is not None and (first.transport, first.gdr) == ("ib", None)
    scanner.feed(P0 + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0")
    second = scanner.finding()
    assert second is not None and (second.transport, second.gdr) == ("ib", False)


def test_scanner_state_stays_bounded() -> None:
    scanner = TransportScanner()
    for i in range(5000):
        scanner.feed(f"host{i}:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA")
    assert len(scanner._hosts) <= 2
    assert len(scanner._net_channel_example) == 1
