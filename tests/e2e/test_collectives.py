"""A job's collectives end to end: the demo's ``nccl-socket-fallback`` incident (its job's NCCL_DEBUG_FILE
shows NCCL choosing sockets) scraped each second by Debian's Prometheus running the real rules and alerts (windows
and ``for:`` shortened, as in test_e2e_prometheus.py), and its ``straggler`` incident (NCCL Inspector's dumps show
GPU 2's all-reduces far shorter than its peers') read from the demo itself.

The fallback demo runs at ``--speed 1`` for the reason test_e2e_prometheus.py gives: Prometheus stamps scrapes with
its own clock, so rates are right only when the demo's clock is the wall clock. Its incident starts at 10 s; its
first checkpoint (20-60 s, a cause of higher precedence) comes after."""

from __future__ import annotations

import pytest

from mfu_exporter.model.attribution import SOCKET_FALLBACK
from mfu_exporter.sim import node as demo
from tests.support.demo_harness import get_json, metric_samples, running_demo
from tests.support.fleet_harness import FleetStack
from tests.support.prom_harness import demo_under_rules
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow

WINDOWS = {"1m": "30s", "5m": "10s"}
FOR = "3s"
DEADLINE = 90.0


def job_bottleneck(base: str) -> dict | None:
    (job,) = [j for j in get_json(base + "api/v1/jobs")["jobs"] if j["job"] == demo.JOB]
    return job["bottleneck"]


def test_nccl_on_sockets_is_attributed_network_on_the_node_and_by_the_rules(tmp_path):
    with demo_under_rules(tmp_path, "nccl-socket-fallback", WINDOWS, FOR) as run:
        base, node = run.base, run.node
        # The node: its verdict, with the NCCL line as evidence, within one poll of reading it.
        verdict = wait_until(
            lambda: (b := job_bottleneck(base)) and b["cause"] == "network" and b, DEADLINE, "network on the node"
        )
        assert verdict["evidence"].startswith(SOCKET_FALLBACK) and "via NET/Socket/0" in verdict["evidence"]
        values = metric_samples(base)
        job = (("training_job", demo.JOB),)
        assert values[("mfu_job_nccl_socket_fallback", job)] == 1
        assert values[("mfu_job_nccl_transport_info", (("gdr", "false"), *job, ("transport", "socket")))] == 1
        # The rules: the job's cause across its nodes is network, on this node, and the alert fires.
        recorded = wait_until(
            lambda: run.ever(f'training_job:mfu_bottleneck:cause{{training_job="{demo.JOB}", cause="network"}}'),
            DEADLINE,
            "the rules to attribute the fallback to the network",
        )
        assert {series["metric"].get("instance") for series in recorded} == {node}
        firing = wait_until(lambda: run.firing("MfuNcclSocketFallback"), DEADLINE, "MfuNcclSocketFallback to fire")
        assert firing[0]["labels"]["training_job"] == demo.JOB
        assert node in firing[0]["annotations"]["description"]


def test_the_straggler_gpu_is_named_from_nccl_inspector():
    with running_demo("--incident", "straggler", speed=10) as base:
        verdict = wait_until(
            lambda: (b := job_bottleneck(base)) and b["cause"] == "straggler" and b, 60, "straggler on the node"
        )
        assert verdict["evidence"].startswith(f"NCCL Inspector: GPU {demo.SLOW_GPU} of {demo.HOST}")
        values = metric_samples(base)
        job = (("training_job", demo.JOB),)
        assert values[("mfu_job_straggler", (("source", "inspector"), *job))] == 1
        large = (("collective", "AllReduce"), ("size_class", "large"), *job)
        assert values[("mfu_job_nccl_collectives_total", large)] > 0
        assert values[("mfu_job_nccl_bus_bandwidth_bytes_per_second", large)] > 0
        assert (
            values[("mfu_gpu_sm_clock_hertz", (("gpu", str(demo.SLOW_GPU)),))]
            < values[("mfu_gpu_sm_clock_hertz", (("gpu", "0"),))]
        )


FLEET_NODES = 128  # the 1,024-node run is make bench-fleet's scale; this machine's e2e suite runs a smaller one
FLEET_DEADLINE = 240.0


def test_the_fleets_straggler_node_is_named_by_the_central_rules(tmp_path):
    """A fleet from the target server, one node's GPUs clocked low (its captured exposition: the fleet
    simulator's straggler), scraped by Prometheus with the real rules: the job's cause is straggler on that node,
    from the node summaries alone, and no other job has one."""
    stack = FleetStack(
        tmp_path, nodes=FLEET_NODES, incident="straggler", incident_node=17, source="targets", paths=("prometheus",)
    ).start()
    try:
        truth = stack.fleet_json()["incident"]
        assert truth["name"] == "straggler"
        store = stack.stores["prometheus"]

        def named() -> list[dict]:
            return store.query('training_job:mfu_bottleneck:cause{cause="straggler"}')

        found = wait_until(named, FLEET_DEADLINE, "the rules to name the straggler", interval=2.0)
        assert [(s["metric"]["training_job"], s["metric"]["instance"]) for s in found] == [
            (truth["job"], truth["instance"])
        ]
        scores = store.query(f'training_job_instance:mfu_straggler:score{{training_job="{truth["job"]}"}} >= 1')
        assert {s["metric"]["instance"] for s in scores} == {truth["instance"]}
    finally:
        stack.stop()
