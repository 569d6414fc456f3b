"""``mfu-exporter check``: the preflight checks of this node, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import pynvml

from mfu_exporter.cli.flags import add_flag, add_path_flags, positive, require_path_flags
from mfu_exporter.config import ConfigError, load_config, typed_config
from mfu_exporter.node.nic_qos import NicQos
from mfu_exporter.preflight import nccl
from mfu_exporter.preflight.checks import read_env_file, run_checks
from mfu_exporter.preflight.facts import CheckResult, PreflightSettings, Status, gather
from mfu_exporter.preflight.report import render_table, results_json


def add_check_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "--config", "YAML config file; thresholds come from sources.preflight", metavar="FILE")
    add_path_flags(parser)
    parser.add_argument(
        "--env-file",
        metavar="FILE",
        help="the job's environment (KEY=VALUE lines) for the NCCL checks; default: this shell's environment",
    )
    parser.add_argument(
        "--nccl",
        metavar="FILE",
        help="an NCCL test's output (nccl-tests, NCCL_DEBUG=INFO) to judge against this node's fabric, as check nccl.test",
    )
    parser.add_argument(
        "--expect-busbw",
        metavar="GB/s",
        type=positive(float),
        help="with --nccl: the bus bandwidth the largest size should reach; default: from the ACTIVE RDMA ports",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_check(args: argparse.Namespace, nvml: Any = pynvml, qos: NicQos | None = None, out=sys.stdout) -> int:
    require_path_flags(args)
    settings = PreflightSettings.from_config(typed_config(load_config(args.config)).sources.preflight)
    try:
        env = read_env_file(args.env_file) if args.env_file else dict(os.environ)
    except OSError as exc:
        raise ConfigError(args.env_file, "", f"a readable env file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(args.env_file, "", f"a UTF-8 text file (byte {exc.start} is not UTF-8)") from None
    facts = gather(settings, args.sysfs, args.procfs, nvml=nvml, qos=qos, nccl_env=env)
    results = run_checks(facts, settings)
    if args.nccl:
        results.append(nccl_check(args, facts.active_ports))
    if args.json:
        json.dump(results_json(results), out, indent=2)
        out.write("\n")
    else:
        out.write(render_table(results) + "\n")
    return 1 if any(r.status == Status.FAIL for r in results) else 0


def nccl_check(args: argparse.Namespace, active_ports) -> CheckResult:
    """``--nccl FILE`` as one more check; a file that cannot be read is a usage error (exit 2), like --env-file."""
    try:
        lines = nccl.read_lines(args.nccl)
        expected = (
            nccl.user_expectation(args.expect_busbw)
            if args.expect_busbw is not None
            else nccl.fabric_expectation(active_ports)
        )
    except nccl.Unreadable as exc:
        raise ConfigError(args.nccl, "", f"a readable NCCL test output ({exc})") from None
    except ValueError as exc:
        raise ConfigError("--expect-busbw", "", str(exc)) from None
    reading, judgement = nccl.verify(lines, expected)
    return nccl.check_result(reading, judgement, args.nccl)
