"""``mfu-exporter run`` over the fake NVML, as a process of its own: the daemon ``run_daemon`` builds, its GPUs eight
simulated H100s (``mfu_exporter/sim/nvml.py``, the one fake the project allows, at the pynvml boundary). Tests start it
as a given user with given capabilities (``setpriv``) to see what that user can read on a node:

    python -m tests.support.fake_gpu_daemon [--gpus N] -- <mfu-exporter run flags>
"""

from __future__ import annotations

import argparse
import sys

from mfu_exporter.cli import build_parser, setup_logging
from mfu_exporter.cli.run import run_daemon
from mfu_exporter.sim import node as demo
from mfu_exporter.sim import nvml as fake_nvml


def main(argv: list[str]) -> int:
    ours = argparse.ArgumentParser(prog="fake_gpu_daemon")
    ours.add_argument("--gpus", type=int, default=8)
    ours.add_argument("run_flags", nargs=argparse.REMAINDER)
    mine = ours.parse_args(argv)
    flags = mine.run_flags[1:] if mine.run_flags[:1] == ["--"] else mine.run_flags
    args = build_parser().parse_args(["run", *flags])
    setup_logging(args.log_level or "info")
    nvml = fake_nvml.node(fake_nvml.h100, count=mine.gpus)
    for gpu in nvml.gpus:
        demo.train_healthily(gpu)
    return run_daemon(args, nvml=nvml)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
