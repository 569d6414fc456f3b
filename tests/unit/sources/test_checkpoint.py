"""The checkpoint tracker and the directory watcher, on real temp directories, with an injected clock.

Each watcher test runs twice: with inotify and with polling (``poll: true``, as on NFS/Lustre/GPFS). File system
steps happen while the clock stands still and each is followed by a sample, so whichever thread reads an inotify
event stamps it with that step's time: the durations below are exact in both modes.
"""

import errno
import os
import shutil
import tracemalloc

import pytest
from inotify_simple import Event, INotify
from inotify_simple import flags as IN

from mfu_exporter.config import typed_config, validate
from mfu_exporter.model.checkpoints import (
    MAX_ENDED_BY_US_PER_JOB,
    MAX_OPEN_PER_JOB,
    CheckpointConflict,
    CheckpointTracker,
    parse_checkpoint_event,
)
from mfu_exporter.model.errors import ValidationError
from mfu_exporter.node.fswatch import filesystem_type, is_network_filesystem
from mfu_exporter.render.checkpoint import checkpoint_families
from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.sources import checkpoint as checkpoint_module
from mfu_exporter.sources.checkpoint import CheckpointSource

NOW = 1_800_000_000.0
JOB = "llama3-70b"
POLL_SETTING = {"inotify": "false", "poll": "true", "auto": "auto"}


class Clock:
    def __init__(self, now=NOW):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def values(snapshot):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in snapshot_families(snapshot)
        for s in family.samples
    }


def metric(snapshot, name, **labels):
    return values(snapshot).get((name, tuple(sorted({"training_job": JOB, **labels}.items()))))


@pytest.fixture
def make(tmp_path):
    """Build a checkpoint source watching one path; every source built is closed after the test."""
    made = []

    def build(
        root, clock, mode="inotify", mounts="/ / ext4 rw 0 0\n", inotify_factory=INotify, started_timeout="2h", **watch
    ):
        config = validate(
            {
                "sources": {
                    "checkpoint": {
                        "started_timeout": started_timeout,
                        "watch": [{"path": str(root), "job": JOB, "poll": POLL_SETTING[mode], **watch}],
                    }
                }
            }
        )
        section = typed_config(config).sources.checkpoint
        mounts_file = tmp_path / "mounts"
        mounts_file.write_text(mounts)
        tracker = CheckpointTracker(started_timeout=section.started_timeout, pinned=[JOB], clock=clock)
        source = CheckpointSource(
            section, tracker, mounts_file=str(mounts_file), clock=clock, inotify_factory=inotify_factory
        )
        made.append(source)
        return source

    yield build
    for source in made:
        source.close()


@pytest.fixture(params=["inotify", "poll"])
def mode(request):
    return request.param


def test_dcp_layout_is_timed_from_the_first_shard_to_metadata(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    (root / "step-100").mkdir(parents=True)
    (root / "step-100" / "__0_0.distcp").write_bytes(b"old")  # there before the exporter: history, not a write
    clock = Clock()
    source = make(root, clock, mode, done_marker=".metadata")
    source.sample()
    step = root / "step-200"
    step.mkdir()
    assert metric(source.sample(), "mfu_checkpoint_in_progress") == 0  # an empty directory is no write yet

    clock.advance(5)
    (step / "__0_0.distcp").write_bytes(b"a" * 1000)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_in_progress") == 1
    assert metric(snapshot, "mfu_checkpoint_in_progress_seconds") == 0
    assert snapshot.status["watches"][0]["writes"] == [{"checkpoint": "step-200", "started": NOW + 5}]
    clock.advance(20)
    (step / "__1_0.distcp").write_bytes(b"b" * 3000)
    assert metric(source.sample(), "mfu_checkpoint_in_progress_seconds") == 20  # the write's age while it runs
    clock.advance(17)
    (step / ".metadata").write_bytes(b"m" * 96)
    snapshot = source.sample()

    assert metric(snapshot, "mfu_checkpoint_in_progress") == 0
    assert metric(snapshot, "mfu_checkpoint_in_progress_seconds") == 0
    assert metric(snapshot, "mfu_checkpoint_writes_total") == 1
    assert metric(snapshot, "mfu_checkpoint_write_failures_total") == 0
    assert metric(snapshot, "mfu_checkpoint_last_duration_seconds") == 37
    assert metric(snapshot, "mfu_checkpoint_last_success_timestamp_seconds") == NOW + 42
    assert metric(snapshot, "mfu_checkpoint_written_bytes_total") == 4096
    assert metric(snapshot, "mfu_checkpoint_last_write_bandwidth_bytes_per_second") == pytest.approx(4096 / 37)
    assert metric(snapshot, "mfu_checkpoint_write_duration_seconds_count") == 1
    assert metric(snapshot, "mfu_checkpoint_write_duration_seconds_sum") == 37
    assert metric(snapshot, "mfu_checkpoint_write_duration_seconds_bucket", le="30.0") == 0
    assert metric(snapshot, "mfu_checkpoint_write_duration_seconds_bucket", le="45.0") == 1
    assert not snapshot.errors

    (step / "late.log").write_bytes(b"x")  # the write is over: later files in it change nothing
    clock.advance(60)
    assert metric(source.sample(), "mfu_checkpoint_writes_total") == 1


def test_without_a_marker_a_write_ends_after_the_quiet_period_which_is_not_counted(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, quiet_period="30s")
    source.sample()
    step = root / "global_step500"
    step.mkdir()
    (step / "model.safetensors").write_bytes(b"a" * 100)
    source.sample()
    clock.advance(10)
    with open(step / "model.safetensors", "ab") as handle:
        handle.write(b"b" * 100)
    source.sample()
    clock.advance(5)
    (step / "optimizer.pt").write_bytes(b"c" * 300)
    source.sample()
    clock.advance(29)
    assert metric(source.sample(), "mfu_checkpoint_in_progress") == 1  # 29 s without a write: not yet quiet
    clock.advance(1)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_in_progress") == 0
    assert metric(snapshot, "mfu_checkpoint_last_duration_seconds") == 15
    assert metric(snapshot, "mfu_checkpoint_last_success_timestamp_seconds") == NOW + 15
    assert metric(snapshot, "mfu_checkpoint_written_bytes_total") == 500


def test_a_checkpoint_that_is_one_file(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, quiet_period="10s")
    source.sample()
    path = root / "consolidated.00.pth"
    path.write_bytes(b"a" * 10)
    source.sample()
    clock.advance(3)
    with open(path, "ab") as handle:
        handle.write(b"b" * 10)
    source.sample()
    clock.advance(10)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_last_duration_seconds") == 3
    assert metric(snapshot, "mfu_checkpoint_written_bytes_total") == 20


def test_with_a_marker_files_beside_the_checkpoints_are_not_writes(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, done_marker=".metadata")
    source.sample()
    (root / "latest_checkpointed_iteration.txt").write_text("200")
    clock.advance(3600)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_writes_total") == 0
    assert metric(snapshot, "mfu_checkpoint_in_progress") == 0


def test_a_directory_deleted_mid_write_is_a_failed_write(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, done_marker=".metadata")
    source.sample()
    step = root / "step-300"
    step.mkdir()
    (step / "__0_0.distcp").write_bytes(b"a" * 100)
    source.sample()
    clock.advance(10)
    shutil.rmtree(step)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_writes_total") == 1
    assert metric(snapshot, "mfu_checkpoint_write_failures_total") == 1
    assert metric(snapshot, "mfu_checkpoint_in_progress") == 0
    assert metric(snapshot, "mfu_checkpoint_write_duration_seconds_count") == 0
    assert metric(snapshot, "mfu_checkpoint_last_success_timestamp_seconds") is None
    failure = source.tracker.overlap(JOB, 60)["last_failure"]
    assert failure == {"checkpoint": "step-300", "reason": "deleted", "time": NOW + 10, "duration_seconds": 10}


def test_a_temporary_directory_renamed_into_place_is_one_write(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, quiet_period="30s")
    source.sample()
    temporary = root / "100.orbax-checkpoint-tmp-7"
    temporary.mkdir()
    (temporary / "params").write_bytes(b"p" * 50)
    source.sample()
    clock.advance(12)
    (temporary / "opt_state").write_bytes(b"o" * 50)
    source.sample()
    os.rename(temporary, root / "100")
    clock.advance(1)
    assert metric(source.sample(), "mfu_checkpoint_in_progress") == 1
    clock.advance(30)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_writes_total") == 1
    assert metric(snapshot, "mfu_checkpoint_write_failures_total") == 0
    assert metric(snapshot, "mfu_checkpoint_last_duration_seconds") == 12
    assert metric(snapshot, "mfu_checkpoint_written_bytes_total") == 100
    clock.advance(3600)
    assert metric(source.sample(), "mfu_checkpoint_writes_total") == 1  # the new name is no new checkpoint


def test_a_watched_path_that_does_not_exist_yet_is_waited_for(mode, tmp_path, make):
    root = tmp_path / "later" / "ckpt"
    clock = Clock()
    source = make(root, clock, mode, done_marker=".metadata")
    snapshot = source.sample()
    assert snapshot.status["watches"][0]["state"] == "waiting for the path to exist"
    assert metric(snapshot, "mfu_checkpoint_writes_total") == 0  # a watched job's series exist from the start
    (root / "step-1").mkdir(parents=True)
    (root / "step-1" / "__0_0.distcp").write_bytes(b"a")
    clock.advance(2)
    snapshot = source.sample()
    assert snapshot.status["watches"][0]["state"] == "watching"
    assert metric(snapshot, "mfu_checkpoint_in_progress") == 1  # what is in a path that appeared later is new
    clock.advance(8)
    (root / "step-1" / ".metadata").write_bytes(b"m")
    assert metric(source.sample(), "mfu_checkpoint_last_duration_seconds") == 8


def test_the_watched_path_removed_mid_write_fails_the_write_and_is_waited_for_again(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, done_marker=".metadata")
    source.sample()
    (root / "step-1").mkdir()
    (root / "step-1" / "__0_0.distcp").write_bytes(b"a")
    source.sample()
    clock.advance(4)
    shutil.rmtree(root)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_write_failures_total") == 1
    assert snapshot.status["watches"][0]["state"] == "waiting for the path to exist"
    (root / "step-2").mkdir(parents=True)
    (root / "step-2" / "__0_0.distcp").write_bytes(b"a")
    source.sample()
    clock.advance(6)
    (root / "step-2" / ".metadata").write_bytes(b"m")
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_writes_total") == 2
    assert metric(snapshot, "mfu_checkpoint_last_duration_seconds") == 6


def test_a_write_never_finished_times_out_and_is_not_counted_later(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, done_marker=".metadata", started_timeout="1h")
    source.sample()
    (root / "step-9").mkdir()
    (root / "step-9" / "__0_0.distcp").write_bytes(b"a")
    source.sample()
    clock.advance(3600)
    assert metric(source.sample(), "mfu_checkpoint_in_progress") == 1
    clock.advance(1)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_write_failures_total") == 1
    assert metric(snapshot, "mfu_checkpoint_in_progress") == 0
    assert source.tracker.overlap(JOB, 60)["last_failure"]["reason"] == "timeout"
    (root / "step-9" / ".metadata").write_bytes(b"m")
    clock.advance(1)
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_writes_total") == 1
    assert metric(snapshot, "mfu_checkpoint_write_duration_seconds_count") == 0


def test_thousands_of_files_cost_no_memory_per_file_and_no_series(mode, tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, mode, done_marker=".metadata")
    source.sample()
    step = root / "step-1000"
    step.mkdir()
    (step / "__0_0.distcp").write_bytes(b"x")
    source.sample()
    tracemalloc.start(32)
    try:
        before = tracemalloc.take_snapshot()
        for rank in range(1, 2000):
            descriptor = os.open(step / f"__{rank}_0.distcp", os.O_WRONLY | os.O_CREAT)
            os.write(descriptor, b"x")
            os.close(descriptor)
        clock.advance(30)
        source.sample()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # What the watcher's code allocated and still holds (other threads of the test process do not count).
    ours = [tracemalloc.Filter(True, checkpoint_module.__file__, all_frames=True)]
    held = sum(stat.size_diff for stat in after.filter_traces(ours).compare_to(before.filter_traces(ours), "filename"))
    assert held < 16 * 1024  # a record per file would hold 2000 × ≥100 bytes
    (step / ".metadata").write_bytes(b"m")
    snapshot = source.sample()
    assert metric(snapshot, "mfu_checkpoint_written_bytes_total") == 2001
    assert len(values(snapshot)) == 17 + 8  # the job's histogram (15 buckets, sum, count) and 8 more: none per file
    assert {name for (_, labels) in values(snapshot) for name, _ in labels} == {"training_job", "le"}


def test_polling_takes_over_when_inotify_is_unavailable(tmp_path, make):
    def no_inotify():
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    source = make(root, clock, "inotify", inotify_factory=no_inotify, done_marker=".metadata")
    watch = source.sample().status["watches"][0]
    assert watch["mode"] == "poll"
    assert "inotify unavailable" in watch["detail"]
    (root / "step-1").mkdir()
    (root / "step-1" / "__0_0.distcp").write_bytes(b"a")
    source.sample()
    clock.advance(7)
    (root / "step-1" / ".metadata").write_bytes(b"m")
    assert metric(source.sample(), "mfu_checkpoint_last_duration_seconds") == 7


def test_network_file_systems_are_polled_unless_the_config_says_otherwise(tmp_path, make):
    root = tmp_path / "nfs" / "ckpt"
    root.mkdir(parents=True)
    mounts = f"/dev/vda / ext4 rw 0 0\nfiler:/export {tmp_path / 'nfs'} nfs4 rw 0 0\n"
    watch = make(root, Clock(), "auto", mounts=mounts).sample().status["watches"][0]
    assert watch["mode"] == "poll"
    assert "nfs4" in watch["detail"]
    assert (
        make(root, Clock(), "inotify", mounts=mounts).sample().status["watches"][0]["mode"] == "inotify"
    )  # poll: false


def test_filesystem_type_takes_the_longest_mount_point_and_unescapes_spaces(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\nlustre@o2ib:/fs /mnt/my\\040ckpt lustre rw 0 0\n/dev/vdb /mnt/my ext4 rw 0 0\n"
    )
    assert filesystem_type("/mnt/my ckpt/llama", str(mounts)) == "lustre"
    assert filesystem_type("/mnt/my/x", str(mounts)) == "ext4"
    assert filesystem_type("/mnt/my ckpt/llama", str(tmp_path / "absent")) is None
    assert is_network_filesystem("fuse.juicefs") and is_network_filesystem("gpfs") and not is_network_filesystem("xfs")


class LosingINotify(INotify):
    """While ``losing``, events are lost as from a full inotify queue: one IN_Q_OVERFLOW in their place."""

    losing = False
    overflowed = False

    def read(self, timeout=None, read_delay=None):
        events = super().read(timeout, read_delay)
        if not self.losing or not events:
            return events
        if self.overflowed:
            return []
        self.overflowed = True
        return [Event(-1, IN.Q_OVERFLOW, 0, "")]


def test_after_lost_inotify_events_the_writes_under_way_are_polled(tmp_path, make):
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock()
    notifiers = []
    source = make(
        root,
        clock,
        "inotify",
        inotify_factory=lambda: notifiers.append(LosingINotify()) or notifiers[-1],
        quiet_period="30s",
    )
    source.sample()
    (root / "step-1").mkdir()
    (root / "step-1" / "shard").write_bytes(b"a")
    source.sample()
    clock.advance(20)
    notifiers[0].losing = True
    with open(root / "step-1" / "shard", "ab") as handle:
        handle.write(b"b")  # this write's events are lost
    assert source.sample().errors["inotify_overflow"] == 1
    notifiers[0].losing = False
    clock.advance(15)
    assert metric(source.sample(), "mfu_checkpoint_in_progress") == 1  # polling saw the write inotify lost
    clock.advance(15)
    assert metric(source.sample(), "mfu_checkpoint_last_duration_seconds") == 20


# --- the tracker on its own


def test_the_jobs_own_duration_wins_and_bytes_give_the_bandwidth():
    clock = Clock()
    tracker = CheckpointTracker(clock=clock)
    tracker.start(JOB, "step-1", NOW)
    assert tracker.finish(JOB, "step-1", NOW + 50, size=4e9, duration=40.0) == 40.0
    totals = tracker.totals()[JOB]
    assert totals.last_duration == 40.0
    assert totals.last_bandwidth == pytest.approx(1e8)
    assert totals.in_progress == 0


def test_a_finish_without_its_start_needs_a_duration():
    tracker = CheckpointTracker(clock=Clock())
    with pytest.raises(ValidationError) as error:
        tracker.finish(JOB, "step-1", NOW)
    assert error.value.field == "duration_seconds"
    assert tracker.totals() == {}  # a rejected event changes nothing
    tracker.start(JOB, "step-1", NOW)
    with pytest.raises(ValidationError) as error:
        tracker.finish(JOB, "step-1", NOW - 1)
    assert error.value.field == "time"
    tracker.finish(JOB, "step-1", NOW + 5)  # still open after the rejected finish
    with pytest.raises(ValidationError):
        tracker.finish(JOB, "step-1", NOW + 6)  # a repeated finish is not counted twice
    assert tracker.totals()[JOB].writes == 1


def test_open_writes_per_job_are_bounded():
    tracker = CheckpointTracker(clock=Clock())
    for index in range(MAX_OPEN_PER_JOB + 1):
        tracker.start(JOB, f"step-{index}", NOW + index)
    totals = tracker.totals()[JOB]
    assert totals.in_progress == MAX_OPEN_PER_JOB
    assert totals.failures == 1
    assert tracker.overlap(JOB, 60)["last_failure"]["checkpoint"] == "step-0"
    assert tracker.overlap(JOB, 60)["last_failure"]["reason"] == "superseded"


def event(**body):
    # Parsed when it is sent: an event's time is at most a little ahead of the node's clock.
    return parse_checkpoint_event({"job": JOB, **body}, max(NOW, body.get("time") or NOW))


def test_a_superseded_write_ended_late_is_refused_not_counted_again():
    tracker = CheckpointTracker(clock=Clock())
    for index in range(MAX_OPEN_PER_JOB + 1):
        tracker.record(event(checkpoint=f"step-{index}", phase="started", time=NOW + index))
    with pytest.raises(CheckpointConflict) as error:
        tracker.record(event(checkpoint="step-0", phase="finished", duration_seconds=30))
    assert error.value.field == "checkpoint"
    assert "superseded: more than 16 writes of the job were open" in error.value.message
    totals = tracker.totals()[JOB]
    assert (totals.writes, totals.failures, totals.cumulative_buckets[-1]) == (1, 1, 0)
    tracker.record(event(checkpoint="step-1", phase="finished", time=NOW + 20))  # still open: counted
    assert tracker.totals()[JOB].cumulative_buckets[-1] == 1


def test_the_record_of_writes_failed_here_is_bounded_per_job():
    clock = Clock()
    tracker = CheckpointTracker(started_timeout=60, clock=clock)
    for index in range(MAX_ENDED_BY_US_PER_JOB + 1):
        tracker.record(event(checkpoint=f"step-{index}", phase="started", time=clock.now))
        clock.advance(61)
        assert tracker.tick() == [("api", f"step-{index}")]
    assert len(tracker._jobs[JOB].ended_by_us) == MAX_ENDED_BY_US_PER_JOB
    for index in range(1, MAX_ENDED_BY_US_PER_JOB + 1):
        with pytest.raises(CheckpointConflict):
            tracker.record(event(checkpoint=f"step-{index}", phase="failed"))
    # the oldest is forgotten: its late end counts again, the price of bounded memory
    tracker.record(event(checkpoint="step-0", phase="finished", duration_seconds=61))
    assert tracker.totals()[JOB].writes == MAX_ENDED_BY_US_PER_JOB + 2


def test_idle_jobs_are_forgotten_but_watched_ones_are_kept():
    clock = Clock()
    tracker = CheckpointTracker(forget_after=3600, pinned=["watched"], clock=clock)
    tracker.finish("reported", "step-1", NOW, duration=10)
    clock.advance(3601)
    tracker.tick()
    assert set(tracker.totals()) == {"watched"}
    assert tracker.overlap("reported", 60) is None


def test_overlap_with_the_mfu_window():
    clock = Clock()
    tracker = CheckpointTracker(clock=clock)
    tracker.start(JOB, "step-1", NOW)
    clock.advance(12)
    view = tracker.overlap(JOB, 60)
    assert (view["in_progress"], view["elapsed_seconds"], view["overlaps_window"]) == ("step-1", 12, True)
    tracker.finish(JOB, "step-1", NOW + 30)
    clock.advance(60)  # ended 42 s ago: still inside a 60 s window
    view = tracker.overlap(JOB, 60)
    assert (view["in_progress"], view["last_duration_seconds"], view["overlaps_window"]) == (None, 30, True)
    clock.advance(30)
    assert tracker.overlap(JOB, 60)["overlaps_window"] is False


def test_histogram_buckets_are_cumulative_and_cover_one_second_to_one_hour():
    tracker = CheckpointTracker(clock=Clock())
    for duration in (0.5, 1, 44, 45, 46, 3600, 7200):
        tracker.finish(JOB, f"d{duration}", NOW, duration=duration)
    ((histogram, *_),) = [list(checkpoint_families(tracker.totals()))]
    buckets = {s.labels["le"]: s.value for s in histogram.samples if s.name.endswith("_bucket")}
    assert list(buckets) == [
        "1.0",
        "2.0",
        "5.0",
        "10.0",
        "15.0",
        "30.0",
        "45.0",
        "60.0",
        "120.0",
        "300.0",
        "600.0",
        "900.0",
        "1800.0",
        "3600.0",
        "+Inf",
    ]
    assert (buckets["1.0"], buckets["30.0"], buckets["45.0"], buckets["60.0"], buckets["3600.0"], buckets["+Inf"]) == (
        2,
        2,
        4,
        5,
        6,
        7,
    )
