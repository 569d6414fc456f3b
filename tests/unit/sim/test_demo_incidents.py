"""The demo's incidents: one table that says, per incident, the cause it should yield and the jobs it touches; each
incident touches only those jobs; the truth (``DemoNode.truth``, served at ``GET /api/v1/demo``) records when each
began and ended on the demo clock."""

import math
import threading

import pytest
from pynvml import NVML_GPM_METRIC_ANY_TENSOR_UTIL

from mfu_exporter.cli import main
from mfu_exporter.model.attribution import CAUSES
from mfu_exporter.sim import node as demo
from mfu_exporter.sources.gpu import GpuSource

WALL = 1_800_000_000.0


def stepped(tmp_path, schedule, seconds, step=1.0):
    """A demo node ticked every ``step`` simulated seconds for ``seconds``."""
    monotonic = [0.0]
    clock = demo.SimClock(1.0, wall=lambda: WALL, monotonic=lambda: monotonic[0])
    node = demo.DemoNode(tmp_path, clock, schedule)
    while monotonic[0] <= seconds:
        node.tick()
        monotonic[0] += step
    return node


def test_every_incident_names_a_cause_and_the_jobs_it_touches():
    jobs = {demo.JOB, demo.DISCOVERED_JOB}
    assert demo.INCIDENTS == tuple(incident.name for incident in demo.INCIDENT_TABLE)
    for incident in demo.INCIDENT_TABLE:
        assert incident.cause in CAUSES and incident.cause not in ("none", "unknown"), incident.name
        assert incident.touches and set(incident.touches) <= jobs, incident.name
        assert incident.seconds == demo.INCIDENT_SECONDS[incident.name]
        assert incident.rate_factor == demo.RATE_FACTOR[incident.name]


@pytest.mark.parametrize("name", [i.name for i in demo.INCIDENT_TABLE if demo.DISCOVERED_JOB not in i.touches])
def test_an_incident_leaves_the_job_it_does_not_touch_training(tmp_path, name):
    """gpu-lost and crash-restart stop the job that has the GPU (or whose process died), not the other half of the
    node: bert-pretrain's GPUs stay busy, at their healthy tensor activity, and their NICs carry traffic."""
    node = stepped(tmp_path, demo.Schedule(name), demo.WARMUP + 5)
    assert node.incident == name
    for index in demo.DISCOVERED_GPUS:
        gpu = node.nvml.gpus[index]
        assert gpu.utilization == 95 and not gpu.lost, (name, index)
        assert gpu.gpm[NVML_GPM_METRIC_ANY_TENSOR_UTIL] == demo.DISCOVERED_TENSOR_ACTIVE, (name, index)
        assert node.fabric.nics[index].utilization > 0, (name, index)


@pytest.mark.parametrize("name", ["gpu-lost", "crash-restart"])
def test_a_stopped_job_stops_on_its_own_gpus(tmp_path, name):
    node = stepped(tmp_path, demo.Schedule(name), demo.WARMUP + 5)
    running = [i for i in demo.JOB_GPUS if not node.nvml.gpus[i].lost]
    assert running and all(node.nvml.gpus[i].utilization == 0 for i in running)
    assert not node.progressing


def test_the_truth_records_each_incident_on_the_demo_clock(tmp_path):
    """A rotation with a 30 s healthy gap: each incident begins 30 s after the last ended, with the table's cause
    and jobs; the clock's times are the simulated Unix time the status API shows."""
    schedule = demo.Schedule(healthy=30.0)
    node = stepped(tmp_path, schedule, schedule.rotation_seconds + 1, step=10.0)
    truth = node.truth()
    rows = truth["incidents"]
    assert [row["name"] for row in rows] == list(demo.INCIDENTS)
    at = 0.0
    for row, incident in zip(rows, demo.INCIDENT_TABLE):
        at += 30.0
        assert row["start_elapsed"] == pytest.approx(at) and row["start"] == pytest.approx(WALL + at)
        at += incident.seconds
        assert row["end_elapsed"] == pytest.approx(at) and row["end"] == pytest.approx(WALL + at)
        assert (row["cause"], row["touches"]) == (incident.cause, list(incident.touches))
    assert (
        truth["schedule"]["rotation_seconds"]
        == schedule.rotation_seconds
        == len(demo.INCIDENTS) * 30.0 + sum(demo.INCIDENT_SECONDS.values())
    )
    assert truth["jobs"][demo.DISCOVERED_JOB]["gpus"] == list(demo.DISCOVERED_GPUS)


def test_routine_checkpoints_keep_out_of_the_incidents(tmp_path):
    """A checkpoint outranks network and heat in the attribution: the demo's routine writes end before an incident
    begins (or wait until it is over), so each incident has the one cause its row says."""
    schedule = demo.Schedule(healthy=30.0)
    monotonic = [0.0]
    clock = demo.SimClock(1.0, wall=lambda: WALL, monotonic=lambda: monotonic[0])
    node = demo.DemoNode(tmp_path, clock, schedule)
    while monotonic[0] <= schedule.rotation_seconds:
        node.tick()
        if node.incident not in (None, "checkpoint-stall"):
            assert not node.checkpoints.writing, (monotonic[0], node.incident)
        monotonic[0] += 5.0


@pytest.mark.parametrize("gap", ["29s", "0s", "-5s"])
def test_the_incident_gap_is_at_least_thirty_seconds(gap, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--incident-gap", gap])
    assert exited.value.code == 2
    assert "--incident-gap" in capsys.readouterr().err


def test_the_storm_reaches_the_nics_storm_prevention_timeout(tmp_path):
    """A real storm's counters: the storm's NICs stall past mlx5's 100 ms pfc-prevention timeout, so they count
    error storm events (pause TX disabled) as well as warnings; the other NICs count neither."""
    node = stepped(tmp_path, demo.Schedule("pfc-storm"), demo.WARMUP + 60)
    node.sync_counters()
    for index, nic in enumerate(node.fabric.nics):
        warning, error = (nic.stats[f"tx_pause_storm_{level}_events"] for level in ("warning", "error"))
        if index in demo.STORM_NICS:
            assert warning >= 5 and error >= 5, (index, warning, error)
        else:
            assert warning == error == 0, (index, warning, error)


def test_a_forced_incident_lasts_until_the_demo_stops_or_for_its_length(tmp_path):
    forever = stepped(tmp_path / "forever", demo.Schedule.from_flags("thermal"), demo.WARMUP + 3600, step=60.0)
    assert forever.incident == "thermal" and forever.truth()["incidents"][0]["end"] is None
    assert forever.truth()["schedule"]["incident_seconds"] == {"thermal": None}
    node = stepped(tmp_path / "timed", demo.Schedule.from_flags("thermal", lengths=300.0), demo.WARMUP + 400)
    assert node.incident is None
    (row,) = node.truth()["incidents"]
    assert row["start_elapsed"] == pytest.approx(demo.WARMUP) and row["end_elapsed"] == pytest.approx(demo.WARMUP + 300)
    assert node.nvml.gpus[demo.HOT_GPU].clocks_event_reasons == 0  # healthy again
    crash = demo.Schedule.from_flags("crash-restart")
    assert crash.seconds("crash-restart") == demo.INCIDENT_SECONDS["crash-restart"]


def test_for_sets_the_rotations_lengths_by_name(tmp_path):
    schedule = demo.Schedule.from_flags(None, 30.0, {"thermal": 700.0, "gpu-lost": 150.0})
    assert schedule.seconds("thermal") == 700.0 and schedule.seconds("gpu-lost") == 150.0
    assert schedule.seconds("pfc-storm") == demo.INCIDENT_SECONDS["pfc-storm"]
    node = stepped(tmp_path, schedule, schedule.rotation_seconds + 1, step=10.0)
    rows = {row["name"]: row for row in node.truth()["incidents"]}
    assert rows["thermal"]["end_elapsed"] - rows["thermal"]["start_elapsed"] == pytest.approx(700.0)
    assert node.truth()["schedule"]["incident_seconds"]["gpu-lost"] == 150.0
    every = demo.Schedule.from_flags(None, 30.0, 600.0)
    assert {every.seconds(name) for name in demo.INCIDENTS} == {600.0}


def test_a_checkpoint_stall_holds_its_write_while_it_lasts_and_it_completes_when_it_ends(tmp_path):
    """Storage slow for 20 minutes: a write that stalls for the whole time (one of fifteen minutes, then the next),
    and the write under way completes as the stall ends, so nothing is left writing after the incident."""
    schedule = demo.Schedule.from_flags("checkpoint-stall", lengths=1200.0)
    monotonic = [0.0]
    clock = demo.SimClock(1.0, wall=lambda: WALL, monotonic=lambda: monotonic[0])
    node = demo.DemoNode(tmp_path, clock, schedule)
    while monotonic[0] <= demo.WARMUP + 1200 + 5:
        node.tick()
        if demo.WARMUP + 1 < monotonic[0] < demo.WARMUP + 1200:
            assert node.checkpoints.writing, monotonic[0]
        monotonic[0] += 5.0
    assert node.incident is None and not node.checkpoints.writing
    written = sorted(path.name for path in node.checkpoints.root.iterdir())
    assert len(written) == 2 and all((node.checkpoints.root / name / ".metadata").exists() for name in written)


@pytest.mark.parametrize("value", ["0s", "thermal=-1m", "nosuch=5m", "5 parsecs"])
def test_for_takes_a_duration_or_lengths_by_name(value, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--for", value])
    assert exited.value.code == 2
    assert "--for" in capsys.readouterr().err


def test_for_with_a_forced_incident_names_only_it(capsys):
    assert main(["demo", "--incident", "thermal", "--for", "gpu-lost=5m"]) == 2
    assert "--for" in capsys.readouterr().err


def test_a_warm_up_delays_the_first_incident_and_the_rotation_follows_it():
    schedule = demo.Schedule.from_flags(None, 30.0, warmup=100.0)
    spans = schedule.spans(0.0, schedule.rotation_seconds + 100.0)
    first = demo.INCIDENT_SECONDS[demo.INCIDENTS[0]]
    assert spans[0] == (demo.INCIDENTS[0], 100.0, 100.0 + first)
    assert spans[1][1] == pytest.approx(100.0 + first + 30.0)
    assert spans[len(demo.INCIDENTS)][1] == pytest.approx(100.0 + schedule.rotation_seconds)  # the next rotation
    assert schedule.incident(99.0) is None and schedule.next_start(0.0) == 100.0
    assert demo.Schedule.from_flags("thermal", warmup=60.0).spans(0.0, 100.0) == [("thermal", 60.0, math.inf)]


class GpuHealthIncidents(demo.Schedule):
    """The rotation's two incidents that change a GPU's health, 10 s of healthy training before each."""

    incidents = ("gpu-lost", "uncorrectable-ecc")


def test_the_gpu_health_incidents_show_their_state_and_action_and_clear_after_the_reset(tmp_path):
    """gpu-lost puts its GPU in reboot_required (Xid 79, off the bus), uncorrectable-ecc its GPU in reset_required
    (Xid 95, the driver's recovery action GPU_RESET), each as the truth's row says, through the real GPU source on the
    demo's fake NVML; every other GPU stays healthy, and each comes back healthy once the incident's end resets it."""
    monotonic = [0.0]
    clock = demo.SimClock(1.0, wall=lambda: WALL, monotonic=lambda: monotonic[0])
    node = demo.DemoNode(tmp_path, clock, GpuHealthIncidents(healthy=10.0))
    source = GpuSource(node.nvml, monotonic=clock.monotonic, retry_interval=30.0)
    truth = {row["name"]: row["gpu_health"] for row in node.truth()["incident_table"]}
    assert truth["gpu-lost"] == {"gpu": demo.LOST_GPU, "xids": [79], "state": "reboot_required"}
    assert truth["uncorrectable-ecc"] == {"gpu": demo.ECC_GPU, "xids": [95, 154], "state": "reset_required"}
    actions = {}
    while monotonic[0] <= 265:
        node.tick()
        snapshot = source.sample()
        states = {index: reading.health for index, reading in snapshot.readings.gpus.items()}
        row = truth.get(node.incident)
        # An incident's Xids are drained by the sample after it began.
        if row is not None and monotonic[0] > node.timeline[-1]["start_elapsed"] + 1:
            gpu = row["gpu"]
            assert states[gpu] == row["state"], (node.incident, monotonic[0])
            assert {i for i, s in states.items() if s != "healthy"} == {gpu}, (node.incident, monotonic[0])
            health = next(g for g in snapshot.status["gpus"] if g["index"] == gpu)["health"]
            assert health["last_xid"]["code"] == row["xids"][-1]
            actions[node.incident] = health["action"]
        monotonic[0] += 1.0
    assert "reboot" in actions["gpu-lost"] and "nvidia-smi -r" in actions["uncorrectable-ecc"]
    # 265 s: the ECC incident ended at 260 with the operator's reset; the lost GPU came back by NVML's re-init.
    assert node.incident is None and set(states.values()) == {"healthy"}


def test_a_pinned_clock_stands_still_in_its_thread_only():
    """A source reading the simulated counters reads its clock at the instant they were brought to, however long
    its sample takes in wall time; the simulation's other threads see time go on."""
    wall = [100.0]
    clock = demo.SimClock(20.0, wall=lambda: 1_700_000_000.0, monotonic=lambda: wall[0])
    seen = []
    with clock.pinned():
        at, stamp = clock.monotonic(), clock.time()
        wall[0] += 0.05  # a loaded machine's 50 ms between the counters' sync and the source's clock
        worker = threading.Thread(target=lambda: seen.append(clock.monotonic()))
        worker.start()
        worker.join()
        assert (clock.monotonic(), clock.time()) == (at, stamp)
    assert seen == [pytest.approx(at + 1.0)] and clock.monotonic() == pytest.approx(at + 1.0)
