"""The fake scrape targets of mfu_exporter/sim/targets.py: expositions captured from the simulated fleet at start, served
per node with its own labels, counters moving at the captured rates, the incident and the lost GPU on their nodes.
One capture for the module (a few seconds: about 70 steps of two 18-node fleets)."""

from __future__ import annotations

import asyncio
import re

import pytest

from mfu_exporter.sim.node import STEADY_MFU
from mfu_exporter.sim.targets import STATES, TargetFleet, capture, create_app, file_sd, instance, served_jobs

NODES = 64
ADDRESS = "127.0.0.1:9400"
INTERVAL = 15.0


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    return asyncio.run(capture(tmp_path_factory.mktemp("capture"), warmup=60.0))


class Served(TargetFleet):
    """The fleet on a clock the test moves: ``now[0]``."""

    def __init__(self, templates):
        self.now = [1_800_000_000.0]
        super().__init__(templates, NODES, ADDRESS, INTERVAL, incident_node=17, lost_node=25, clock=lambda: self.now[0])


@pytest.fixture
def fleet(templates):
    return Served(templates)


def samples(body: bytes) -> dict[str, float]:
    found = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


def test_every_state_is_a_real_exposition_of_the_collector(templates):
    assert set(templates) == set(STATES)
    for template in templates.values():
        text = template.render(0.0, 0.0)
        assert "# TYPE mfu_job_model_flops_total counter" in text
        assert len([line for line in text.splitlines() if line and not line.startswith("#")]) > 300


def test_counters_advance_at_the_captured_rate_and_gauges_stay(fleet):
    before = samples(fleet.body(3))
    fleet.now[0] += INTERVAL
    after = samples(fleet.body(3))
    assert before.keys() == after.keys()
    key = 'mfu_job_model_flops_total{training_job="llama3-70b-00"}'
    rate = fleet.templates["healthy"].job_rate("mfu_job_model_flops_total")
    assert rate and after[key] - before[key] == pytest.approx(rate * INTERVAL)
    # The node's hardware counters too (bytes, packets, pauses: whatever the series level exports), never back.
    counters = [k for k in before if k.split("{")[0].endswith("_total")]
    assert all(after[k] >= before[k] for k in counters)
    assert len([k for k in counters if after[k] > before[k] and not k.startswith("mfu_job_")]) >= 10
    stamp = 'mfu_job_last_report_timestamp_seconds{training_job="llama3-70b-00"}'
    assert after[stamp] - before[stamp] == pytest.approx(INTERVAL)
    gauges = [k for k in before if k.startswith(("mfu_gpu_temperature_celsius", "mfu_job_peak_flops"))]
    assert gauges and all(after[k] == before[k] for k in gauges)
    # Within an interval a scrape sees the same values: formatted once per interval, not per request.
    fleet.now[0] += 1.0
    assert samples(fleet.body(3)) == after


def test_node_and_job_labels_differ_per_node(fleet):
    uuids = {}
    for node in (0, 1, 16, 40):
        body = fleet.body(node).decode()
        uuids[node] = set(re.findall(r'uuid="([^"]+)"', body))
        assert len(uuids[node]) == 8
        jobs = set(re.findall(r'training_job="([^"]+)"', body))
        assert jobs == {fleet.jobs[fleet.node_job[node]].name}
    assert not set.intersection(*uuids.values())
    assert fleet.jobs[fleet.node_job[0]].name != fleet.jobs[fleet.node_job[16]].name


def test_the_incident_and_the_lost_gpu_are_on_their_nodes_only(fleet):
    def pausing(node: int) -> float:
        before = samples(fleet.body(node))
        fleet.now[0] += INTERVAL
        after = samples(fleet.body(node))
        fleet.now[0] -= INTERVAL
        keys = [k for k in after if k.startswith("mfu_nic_pfc_pause_duration_seconds_total")]
        return max((after[k] - before[k]) / INTERVAL for k in keys)

    assert pausing(17) > 0.4  # the storm's ports are paused nearly half the time
    assert pausing(16) == pausing(3) == 0.0  # its job's other nodes wait; other jobs are healthy
    up = samples(fleet.body(25))
    assert up['mfu_gpu_up{gpu="3"}'] == 0.0
    assert all(v == 1.0 for k, v in samples(fleet.body(24)).items() if k.startswith("mfu_gpu_up"))


def test_the_truth_is_what_the_served_counters_make_it(fleet):
    truth = fleet.truth()
    jobs = {job["name"]: job for job in truth["jobs"]}
    assert truth["incident"] == {
        "name": "pfc-storm",
        "node": 17,
        "instance": instance(17, ADDRESS),
        "job": "llama3-70b-01",
        "cause": "network",
        "touches": ["llama3-70b-01"],
    }
    assert truth["lost"]["job"] == "llama3-70b-02" and truth["lost"]["instance"] == f"{ADDRESS}/node/25"
    assert truth["lost"]["cause"] == "gpu_lost" and truth["lost"]["touches"] == ["llama3-70b-02"]
    assert jobs["llama3-70b-00"]["mfu_1m"] == pytest.approx(STEADY_MFU, abs=0.01)
    assert jobs["llama3-70b-01"]["mfu_1m"] == pytest.approx(0.40 * STEADY_MFU, abs=0.01)
    assert jobs["llama3-70b-02"]["mfu_1m"] == 0.0
    assert sum(len(job["nodes"]) for job in truth["jobs"]) == NODES


def test_a_file_sd_list_gives_each_node_its_path_and_instance():
    groups = file_sd(3, ADDRESS)
    assert groups[2] == {
        "targets": [ADDRESS],
        "labels": {"__metrics_path__": "/node/2/metrics", "instance": f"{ADDRESS}/node/2"},
    }


def test_bad_nodes_are_refused(templates):
    with pytest.raises(ValueError, match="--incident-node must be a node of the fleet: 0 to 7"):
        TargetFleet(templates, 8, ADDRESS, incident_node=8, lost_node=None)
    with pytest.raises(ValueError, match="different jobs"):
        TargetFleet(templates, 64, ADDRESS, incident_node=17, lost_node=18)


async def test_served_over_http_one_path_per_node(fleet, aiohttp_client):
    client = await aiohttp_client(create_app(fleet))
    response = await client.get("/node/17/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"mfu_nic_pfc_pause_duration_seconds_total" in await response.read()
    for path in ("/node/64/metrics", "/node/x/metrics"):
        response = await client.get(path)
        assert response.status == 404 and "node must be" in await response.text()
    truth = await (await client.get("/api/v1/fleet")).json()
    assert truth["nodes"] == NODES


@pytest.mark.parametrize(
    "layout, sizes",
    [
        ("small", [16, 8, 32, 8]),
        ("one", [64]),
        ("mixed", [32, 16, 8, 8]),
    ],
)
def test_a_layout_places_the_jobs(layout, sizes):
    """Many small jobs (16, 8, 32 in turn), one job on every node, or one on half the nodes and small ones after."""
    jobs = served_jobs(64, layout)
    assert [len(job.nodes) for job in jobs] == sizes
    assert [node for job in jobs for node in job.nodes] == list(range(64))


def test_a_layout_is_served_and_said_in_the_truth(templates):
    fleet = TargetFleet(templates, 64, ADDRESS, incident_node=17, lost_node=None, layout="one")
    truth = fleet.truth()
    assert truth["layout"] == "one"
    (job,) = truth["jobs"]
    assert job["nodes"] == list(range(64)) and truth["incident"]["job"] == job["name"]
    assert job["states"].count("incident") == 1 and job["states"].count("waiting") == 63
    with pytest.raises(ValueError, match="--layout must be one of small, one, mixed"):
        served_jobs(8, "giant")
