"""What a simulated job's NCCL writes: its ``NCCL_DEBUG=INFO`` lines (``NCCL_DEBUG_FILE``) and NCCL Inspector's
dump files, in the layouts real NCCL writes them (mfu_exporter/nccl/debug.py and mfu_exporter/nccl/inspector.py cite them).

Synthetic text for the demo: the transport lines of a job on RoCE with GPUDirect RDMA, or of one whose container
lost its ``/dev/infiniband`` devices (``NET/IB : No device found.``, then sockets between nodes); and one all-reduce
per rank and dump, each rank's execution time as the demo says (a straggler's is the shortest: its peers wait in
the collective for it).
"""

from __future__ import annotations

import json
from pathlib import Path

NCCL_VERSION = "2.27.7+cuda12.9"
ALLREDUCE_BYTES = 256 << 20  # a bucket of gradients: Inspector's "large" class
RANKS_PER_JOB = 1024  # the demo job's world (mfu_exporter/sim/node.py WORLD_GPUS)
IN_PLACE_SHARE = 0.995  # an in-place all-reduce runs a little slower than out-of-place in nccl-tests' tables


class NcclDebugFile:
    """The job's ``NCCL_DEBUG_FILE``: a run's communicator set-up, written when the run starts."""

    def __init__(self, path: Path, host: str, pid: int, gpus: tuple[int, ...]):
        self.path, self.host, self.pid, self.gpus = path, host, pid, gpus
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def run_starts(self, sockets: bool) -> None:
        """A new run's NCCL initialising: over RoCE with GPUDirect RDMA, or (``sockets``) with no IB device found."""
        prefix = f"{self.host}:{self.pid}:{self.pid + 80} [0] NCCL INFO "
        lines = [f"NCCL version {NCCL_VERSION}", "NCCL_SOCKET_IFNAME set by environment to eth0"]
        if sockets:
            lines += [
                "NET/IB : No device found.",
                "NET/Socket : Using [0]eth0:10.10.0.11<0>",
                "Using network Socket",
            ]
        else:
            lines += [
                "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [2]mlx5_2:1/RoCE [3]mlx5_3:1/RoCE [RO]; "
                "OOB eth0:10.10.0.11<0>",
                "Using network IB",
            ]
        via = "NET/Socket/0" if sockets else "NET/IB/0/GDRDMA"
        last = len(self.gpus) - 1
        for channel in range(2):
            lines.append(f"Channel {channel:02d}/0 : {RANKS_PER_JOB - 1}[{last}] -> 0[0] [receive] via {via}")
            lines.append(f"Channel {channel:02d}/0 : {last}[{last}] -> {last + 1}[0] [send] via {via}")
            lines += [f"Channel {channel:02d} : {g}[{g}] -> {g + 1}[{g + 1}] via P2P/IPC" for g in self.gpus[:-1]]
        lines.append(f"comm 0x7f3a5c000000 rank 0 nRanks {RANKS_PER_JOB} nNodes {RANKS_PER_JOB // 8} - Init COMPLETE")
        with open(self.path, "a") as out:
            out.write("".join(prefix + line + "\n" for line in lines))


class InspectorDump:
    """NCCL Inspector's JSON-lines files under ``directory``: one per rank (process) of the job on this node."""

    def __init__(self, directory: Path, host: str, pids: dict[int, int]):
        """``pids``: GPU index -> the process of the rank on it."""
        self.directory, self.host, self.pids = directory, host, pids
        directory.mkdir(parents=True, exist_ok=True)
        self.sn = 0

    def path(self, gpu: int) -> Path:
        return self.directory / f"{self.host}-pid{self.pids[gpu]}.log"

    def dump(self, stamp: float, exec_us: dict[int, float]) -> None:
        """One all-reduce of each rank: ``exec_us`` GPU index -> its execution time in µs."""
        self.sn += 1
        for rank, (gpu, micros) in enumerate(sorted(exec_us.items())):
            algbw = ALLREDUCE_BYTES / micros / 1e3
            record = {
                "header": {
                    "id": "0x5c1d2e3f4a5b6c",
                    "comm_name": "DP Group 0",
                    "rank": rank,
                    "n_ranks": RANKS_PER_JOB,
                    "nnodes": RANKS_PER_JOB // 8,
                },
                "metadata": {
                    "inspector_output_format_version": "v4.0",
                    "git_rev": "",
                    "rec_mechanism": "nccl_profiler_interface",
                    "dump_timestamp_us": int(stamp * 1e6),
                    "hostname": self.host,
                    "pid": self.pids[gpu],
                },
                "coll_perf": {
                    "coll": "AllReduce",
                    "coll_sn": self.sn,
                    "coll_msg_size_bytes": ALLREDUCE_BYTES,
                    "coll_exec_time_us": int(micros),
                    "coll_timing_source": "kernel_gpu",
                    "coll_algobw_gbs": round(algbw, 6),
                    "coll_busbw_gbs": round(algbw * 2 * (RANKS_PER_JOB - 1) / RANKS_PER_JOB, 6),
                },
            }
            with open(self.path(gpu), "a") as out:
                out.write(json.dumps(record, separators=(",", ":")) + "\n")


class NcclTestsOutput:
    """The node's pre-job fabric check as the guide runs it: ``all_reduce_perf -b 8M -e 1G -f 2 -g 1`` across
    ``ranks`` ranks, one per GPU, written as nccl-tests 2.x prints it (src/util.cu's headers and row format, the
    layout of tests/fixtures/nccl/real/perf.txt's current pastes) to a file the nccl source reads
    (``sources.nccl.tests_paths``)."""

    SIZES = tuple(8 << 20 << i for i in range(8))  # -b 8M -e 1G -f 2
    HALF_SIZE = 24 << 20  # bytes at which a ring reaches half its peak: latency dominates below

    def __init__(self, directory: Path, hosts: tuple[str, ...], gpus_per_host: int = 8):
        self.directory, self.hosts, self.gpus_per_host = directory, hosts, gpus_per_host
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def ranks(self) -> int:
        return len(self.hosts) * self.gpus_per_host

    def write(self, name: str, peak_busbw_gbps: float) -> Path:
        """One run whose bus bandwidth approaches ``peak_busbw_gbps`` (GB/s) at the largest sizes; its path."""
        n = self.ranks
        factor = 2 * (n - 1) / n  # all-reduce's bus bandwidth over its algorithm bandwidth
        lines = [
            "# nccl-tests version 2.17.1 nccl-headers=22707 nccl-library=22707",
            "# Collective test starting: all_reduce_perf",
            f"# nThread 1 nGpus 1 minBytes {self.SIZES[0]} maxBytes {self.SIZES[-1]} step: 2(factor) warmup iters: 5 "
            "iters: 20 agg iters: 1 validation: 1 graph: 0",
            "#",
            "# Using devices",
        ]
        for rank in range(n):
            host, device = self.hosts[rank // self.gpus_per_host], rank % self.gpus_per_host
            lines.append(
                f"#  Rank {rank:2d} Group  0 Pid {4100 + rank:6d} on {host:>10} device {device:2d} "
                f"[0000:{0x18 + device:02x}:00] NVIDIA H100 80GB HBM3"
            )
        lines += [
            "#",
            "#                                                              out-of-place                       in-place",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
            "busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
        ]
        busbws = []
        for size in self.SIZES:
            halves = []
            for share in (1.0, IN_PLACE_SHARE):
                algbw = round(share * peak_busbw_gbps * size / (size + self.HALF_SIZE) / factor, 2)
                busbw = round(algbw * factor, 2)  # nccl-tests derives busbw from algbw
                halves.append(f"{size / (algbw * 1e3):8.1f} {algbw:7.2f} {busbw:7.2f} {0:6d}")
                busbws.append(busbw)
            lines.append(f"{size:12d} {size // 4:13d}     float     sum      -1 {halves[0]} {halves[1]}")
        lines += [
            "# Out of bounds values : 0 OK",
            f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f} ",
            "#",
            "# Collective test concluded: all_reduce_perf",
            "#",
        ]
        path = self.directory / name
        path.write_text("\n".join(lines) + "\n")
        return path
