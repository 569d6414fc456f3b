"""A detected format whose progress lines read nothing, through the real aiohttp app: /api/v1/jobs, /api/v1/status
and /metrics say so, with the line. Every wait is on the served value itself."""

from __future__ import annotations

from mfu_exporter.config import typed_config, validate
from mfu_exporter.sources.logs import LogsSource
from tests.support.expo import samples
from tests.support.wait import wait_for
from tests.unit.logs.real_pastes import load


async def test_unread_progress_reaches_the_api_the_status_and_the_metrics_within_a_minute(make_client, tmp_path):
    path = tmp_path / "train.log"
    path.write_text("")
    config = validate(
        {"sources": {"logs": {"interval": "1s", "files": [{"path": str(path), "job": "grpo"}]}}, "jobs": {}}
    )
    source = LogsSource(typed_config(config).sources.logs, config["jobs"], use_inotify=False)
    client = await make_client(config, [source])
    state = client.service.scheduler.states["logs"]
    await wait_for(lambda: state.snapshot, 10, "the logs source's first stored snapshot")

    lines = next(p for p in load() if p.name == "hf/trl-3452-grpo-nothing-useful").lines  # real, TRL GRPO
    with path.open("a") as f:
        f.write("".join(line + "\n" for line in lines))

    async def jobs_reason():
        jobs = (await (await client.get("/api/v1/jobs")).json())["jobs"]
        reason = next((j["reason"] for j in jobs if j["job"] == "grpo"), None) or ""
        return reason if "no progress read" in reason else None

    # A timeout only bounds a failing run: the reason must show within a minute, the follower's and the model's
    # intervals.
    reason = await wait_for(jobs_reason, 60, "the job's reason to say no progress was read")
    assert "detected hf" in reason and "first unread line \"{'loss': 0.0" in reason, reason

    async def status_files():
        status = await (await client.get("/api/v1/status")).json()
        logs = next(s for s in status["sources"] if s["source"] == "logs")
        files = logs["status"].get("files") or []
        return files if files and files[0]["no_progress"] else None

    files = await wait_for(status_files, 60, "the logs status to list the file with no progress read")
    assert files[0]["formats"] == ["hf"]
    key = ("mfu_exporter_source_errors_total", (("reason", "no_progress_read"), ("source", "logs")))

    async def errors_counted():
        return samples(await (await client.get("/metrics")).text()).get(key)

    assert await wait_for(errors_counted, 60, "the no_progress_read error on /metrics") == 1
