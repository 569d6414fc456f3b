"""The fleet simulator (mfu_exporter/sim/fleet.py) without serving it: job layout, shared sampling, lockstep jobs."""

from __future__ import annotations

from mfu_exporter.sim.fleet import Fleet, FleetSchedule, SharedSample, layout_jobs
from mfu_exporter.sim.node import RATE_FACTOR, SimClock
from mfu_exporter.sources.base import Snapshot


def test_jobs_take_8_to_32_nodes_in_turn_and_the_last_takes_the_rest():
    assert [len(job.nodes) for job in layout_jobs(32)] == [16, 8, 8]
    jobs = layout_jobs(256)
    assert sum(len(job.nodes) for job in jobs) == 256
    assert all(1 <= len(job.nodes) <= 32 for job in jobs)
    assert [n for job in jobs for n in job.nodes] == list(range(256))
    assert len({job.name for job in jobs}) == len(jobs)


class CountingSource:
    name, interval, timeout = "gpu", 10.0, 5.0

    def __init__(self):
        self.calls = 0

    def sample(self) -> Snapshot:
        self.calls += 1
        return Snapshot(readings={"call": self.calls})

    def close(self) -> None:
        pass


def test_a_shared_source_samples_once_per_interval_for_every_node():
    now = [0.0]
    source = CountingSource()
    shared = SharedSample(source, monotonic=lambda: now[0])
    first = [shared.sample() for _ in range(100)]
    assert source.calls == 1 and all(s is first[0] for s in first)
    now[0] = 9.5  # 0.95 of the interval: a node whose cycle comes early still gets a fresh one
    assert shared.sample().readings == {"call": 2}


def test_one_nodes_storm_slows_its_whole_job_and_no_other(tmp_path):
    clock = SimClock(1.0)
    fleet = Fleet(tmp_path, 32, 29000, clock, FleetSchedule("pfc-storm"), incident_node=17, interval=2.0)
    slowed = fleet.incident_job()
    assert 17 in slowed.nodes and fleet.nodes[17].machine.kind == "incident"
    assert {fleet.nodes[i].machine.kind for i in slowed.nodes if i != 17} == {"waiting"}
    assert {n.machine.kind for n in fleet.nodes if n.job is not slowed} == {"healthy"}
    assert len({n.port for n in fleet.nodes}) == 32 and fleet.nodes[5].port == 29005
    fleet.tick()
    before = {job.name: job.tokens for job in fleet.jobs}
    fleet._origin -= 30.0  # 30 simulated seconds on: the forced storm is on after its 10 s warm-up
    fleet.tick()
    assert fleet.incident == "pfc-storm"
    gained = {job.name: job.tokens - before[job.name] for job in fleet.jobs}
    healthy = [gained[job.name] for job in fleet.jobs if job is not slowed]
    # The healthy jobs stage their first checkpoint meanwhile (0.95 of their rate); the slowed job runs at 0.40.
    assert abs(gained[slowed.name] / min(healthy) - RATE_FACTOR["pfc-storm"] / 0.95) < 0.03
    storm = fleet.machines["incident"].fabric.nics
    waiting = fleet.machines["waiting"].fabric.nics
    assert max(nic.rx_pause_ratio for nic in storm) > 0.4
    assert max(nic.rx_pause_ratio for nic in waiting) == 0.0
    fleet.close()
