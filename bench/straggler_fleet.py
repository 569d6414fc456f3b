"""The straggler named at fleet scale: the target server's fleet with one node's GPUs clocked low, the real
rules on VictoriaMetrics (one evaluator: every tier at once), until the global tier names the job's cause
``straggler`` on that node, or a deadline passes. Prints what was named and how long it took.

    python -m bench.straggler_fleet --nodes 1024
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.support.fleet_harness import FleetStack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.straggler_fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--incident-node", type=int, default=517)
    parser.add_argument("--interval", default="15s")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds to wait for the rules to name it")
    parser.add_argument("--path", default="victoria-metrics", choices=("victoria-metrics", "prometheus"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mfu-straggler-") as tmp:
        stack = FleetStack(
            Path(tmp),
            nodes=args.nodes,
            incident="straggler",
            incident_node=args.incident_node,
            interval=args.interval,
            source="targets",
            paths=(args.path,),
        ).start()
        try:
            truth = stack.fleet_json()["incident"]
            store = stack.stores[args.path]
            started = time.monotonic()
            found: list = []
            while time.monotonic() - started < args.deadline:
                found = store.query('training_job:mfu_bottleneck:cause{cause="straggler"}')
                if found:
                    break
                time.sleep(5)
            named = sorted({(s["metric"].get("training_job"), s["metric"].get("instance")) for s in found})
            result = {
                "nodes": args.nodes,
                "path": args.path,
                "truth": {"job": truth["job"], "instance": truth["instance"]},
                "named": named,
                "seconds_after_start": round(time.monotonic() - started, 1),
                "right": named == [(truth["job"], truth["instance"])],
            }
            print(json.dumps(result, indent=2))
            return 0 if result["right"] else 1
        finally:
            stack.stop()


if __name__ == "__main__":
    sys.exit(main())
