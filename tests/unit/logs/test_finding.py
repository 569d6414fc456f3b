"""The logs source finds new files in its follower's thread, every second, whatever its own interval: a file's
lines are read when it appears, not at the source's next sample."""

from __future__ import annotations

from mfu_exporter.config import DEFAULT_INTERVAL, typed_config, validate
from mfu_exporter.model.feed import Progress
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.readings import GpuInfo
from mfu_exporter.sources.base import ModelReads
from mfu_exporter.sources.logs import FIND_INTERVAL, LogsSource
from tests.support.wait import wait_until
from tests.unit.logs import framework_lines as fl


def test_a_file_that_appears_between_two_samples_is_found_and_read_by_the_follower(tmp_path):
    config = validate({"sources": {"logs": {"files": [{"path": str(tmp_path / "*.log"), "job": "llm"}]}}})
    section = typed_config(config).sources.logs
    assert section.interval == DEFAULT_INTERVAL > FIND_INTERVAL
    tracker = JobTracker(configured=config["jobs"], gpu_inventory=lambda: [GpuInfo(0, "GPU-0", "NVIDIA H100")])
    source = LogsSource(section, config["jobs"], use_inotify=False)
    source.bind(ModelReads(gpu_count=tracker.gpu_count, is_discovered=tracker.is_discovered, job_names=tracker.names))
    try:
        assert source.sample().status["wanted"] == 0  # nothing to follow yet; the follower's thread starts
        path = tmp_path / "train.log"
        step = fl.titan_step(10, 2.0, 0.3, 1.0, 1.0, 1000.0, 1.0, 1.0)
        path.write_text(fl.titan_logger(1.7e9, step) + "\n")
        # No sample from here on: only the follower's own pass can find the file and read its line.
        assert wait_until(lambda: str(path) in source.follower.followed(), 30, "the follower to find train.log")
        read: list = []
        progress = wait_until(
            lambda: [i for i in (read.extend(source.take_feed()) or read) if isinstance(i, Progress)],
            30,
            "the new file's progress line in the source's feed",
        )
        assert [(p.job, p.step) for p in progress] == [("llm", 10)]
        assert source.sample().status["wanted"] == 1
    finally:
        source.close()
