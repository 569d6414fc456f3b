"""``mfu-exporter nccl FILE|-``: what an NCCL test's output shows, judged against this node's fabric.

Reads nccl-tests output and NCCL_DEBUG=INFO lines as people have them (a log, a paste, a pipe) and says the table
(busbw by size, wrong values), the transport NCCL chose and the verdict. Exit 0 pass, 1 fail, 2 unreadable input
or usage: an empty or unrecognisable input never passes.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO

from mfu_exporter.cli import quiet_closed_pipe
from mfu_exporter.cli.flags import add_flag, positive
from mfu_exporter.nccl.perf import Judgement, Reading, report
from mfu_exporter.node.rdma import discover_ports
from mfu_exporter.preflight.nccl import (
    Expectation,
    Unreadable,
    decode,
    fabric_expectation,
    read_lines,
    user_expectation,
    verify,
)

EXIT = {"pass": 0, "fail": 1, "unreadable": 2}


def add_nccl_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the test's output; - reads stdin")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of a summary")
    parser.add_argument(
        "--expect-busbw",
        metavar="GB/s",
        type=positive(float),
        help="the bus bandwidth the largest size should reach; default: from the ACTIVE RDMA ports under --path.sysfs",
    )
    add_flag(
        parser, "--path.sysfs", "sysfs mount point", dest="sysfs", default="/sys", metavar="DIR", metavar_default="/sys"
    )


def expectation(args: argparse.Namespace) -> Expectation:
    if args.expect_busbw is not None:
        return user_expectation(args.expect_busbw)
    return fabric_expectation(discover_ports(args.sysfs))


def _gbps(value: float | None) -> str:
    return "not a number" if value is None else f"{value:g} GB/s"


def summary(reading: Reading, judgement: Judgement) -> str:
    lines = [f"verdict: {judgement.verdict.upper()}"]
    perf = reading.perf
    if perf is not None:
        ranks = f"{perf.n_ranks} ranks" if perf.n_ranks else "ranks not shown"
        lines.append(f"test: {perf.collective or 'collective not shown'}, {ranks}, {len(perf.rows)} rows")
        if perf.rows:
            average = "not printed" if perf.avg_busbw_gbps is None else f"{perf.avg_busbw_gbps:g} GB/s"
            lines.append(
                f"busbw at the largest size ({perf.largest_size_bytes} B): {_gbps(judgement.measured_busbw_gbps)}; "
                f"max {_gbps(perf.max_busbw_gbps)}; average as printed: {average}"
            )
    transport = reading.transport
    if transport is not None:
        gdr = {True: "on", False: "off", None: "not shown"}[transport.gdr]
        fell = "; FELL BACK TO SOCKETS between nodes" if transport.fell_back_to_socket else ""
        lines.append(f"transport: {transport.transport or 'not decided in the text'}, GPUDirect RDMA {gdr}{fell}")
        lines.append(f"  evidence: {transport.evidence}")
    lines += [f"- {reason}" for reason in judgement.reasons]
    return "\n".join(lines)


def run_nccl(args: argparse.Namespace, stdin: IO[bytes] | None = None, out: IO[str] = sys.stdout) -> int:
    try:
        expected = expectation(args)
    except ValueError as exc:
        print(f"mfu-exporter nccl: {exc}", file=sys.stderr)
        return 2
    try:
        if args.file == "-":
            source = stdin if stdin is not None else sys.stdin.buffer
            lines = decode(source.read(), "stdin")
        else:
            lines = read_lines(args.file)
    except Unreadable as exc:
        print(f"mfu-exporter nccl: {exc}", file=sys.stderr)
        if not args.json:
            return EXIT["unreadable"]
        # --json always answers in JSON: a missing or binary file is unreadable, with the reason, as an empty one.
        reading, judgement = Reading(None, None), Judgement("unreadable", (str(exc),))
    else:
        reading, judgement = verify(lines, expected)
    text = json.dumps(report(reading, judgement), indent=2) if args.json else summary(reading, judgement)
    try:
        out.write(text + "\n")
        out.flush()
    except BrokenPipeError:  # the reader stopped (| head): what it read is all it wanted
        return quiet_closed_pipe(EXIT[judgement.verdict]) if out is sys.stdout else EXIT[judgement.verdict]
    return EXIT[judgement.verdict]
