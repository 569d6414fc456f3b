"""CPU of job discovery on a node with 8 GPUs and 16 pods (docs/benchmarks.md; target: under 1 ms CPU per second).

    python -m bench.discovery [--samples 200] [--interval 5] [--json FILE]

The kubelet is a real pod-resources gRPC server on a unix socket in another process (its CPU is not ours); the
discovery source lists it, matches the 16 pods' devices to the 8 simulated GPUs (8 pods with two GPUs' halves
each as time-sliced replicas, 8 with NICs only), names the jobs by the pod-name pattern, and follows 16 GPU
processes through a Slurm procfs fixture. CPU is ``time.process_time`` of this process (the client's gRPC threads
included) over ``--samples`` samples, divided by the samples' share of wall time at the configured interval.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path


def _serve(socket_path: str, uuids: list[str], ready) -> None:
    from mfu_exporter.sim.podresources import PodResourcesServer, SimPod

    pods = []
    for i in range(8):
        pods.append(
            SimPod(
                f"job{i // 2}-worker-{i % 2}",
                f"team-{i % 3}",
                {"trainer": [("nvidia.com/gpu", [uuids[i]])], "sidecar": [("rdma/hca", [f"mlx5_{i}"])]},
            )
        )
    for i in range(8):
        pods.append(SimPod(f"service-{i}", "infra", {"app": [("rdma/hca", [f"mlx5_{i}"])]}))
    server = PodResourcesServer(socket_path, pods).start()
    ready.set()
    while True:
        time.sleep(3600)
    server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0, help="discovery.interval the figure is for (s)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    from mfu_exporter.config import typed_config, validate
    from mfu_exporter.sim.nvml import FakeNvml, h100
    from mfu_exporter.sim.procfs import add_process, host_procfs, v2_job
    from mfu_exporter.sources.discovery import DiscoverySource

    nvml = FakeNvml([h100(i) for i in range(8)])
    tmp = Path(tempfile.mkdtemp(prefix="bench-discovery-"))
    socket_path = f"/tmp/bench-discovery-{os.getpid()}.sock"
    procfs = host_procfs(tmp)
    for gpu in range(8):
        for k in range(2):
            pid = 10_000 + 2 * gpu + k
            add_process(procfs, pid, v2_job(500 + gpu))
            nvml.gpus[gpu].processes = [*getattr(nvml.gpus[gpu], "processes", []), pid]
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    server = context.Process(target=_serve, args=(socket_path, [g.uuid for g in nvml.gpus], ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            print("the pod-resources server did not start", file=sys.stderr)
            return 1
        section = validate(
            {
                "discovery": {
                    "interval": f"{args.interval}s",
                    "kubernetes": {"enabled": "true", "socket": socket_path, "api_server": {"enabled": "false"}},
                    "slurm": {"enabled": "true", "cgroup_root": str(tmp / "cgroup")},
                }
            }
        )
        source = DiscoverySource(typed_config(section).discovery, procfs=str(procfs), nvml=nvml)
        for _ in range(5):  # warm-up: channel dial, NVML inventory, PID cache
            snapshot = source.sample()
        jobs = len(snapshot.readings.jobs)
        started = time.process_time()
        wall = time.perf_counter()
        for _ in range(args.samples):
            source.sample()
        cpu = (time.process_time() - started) / args.samples
        wall = (time.perf_counter() - wall) / args.samples
        source.close()
    finally:
        server.kill()
        server.join(5)
        if os.path.exists(socket_path):
            os.unlink(socket_path)
    figures = {
        "gpus": 8,
        "pods": 16,
        "jobs_found": jobs,
        "samples": args.samples,
        "interval_seconds": args.interval,
        "cpu_seconds_per_sample": cpu,
        "wall_seconds_per_sample": wall,
        "cpu_ms_per_second": 1000 * cpu / args.interval,
        "target_cpu_ms_per_second": 1.0,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["cpu_ms_per_second"] < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
