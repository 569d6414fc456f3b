"""A detected format whose progress lines read nothing, through the real aiohttp app: /api/v1/jobs, /api/v1/status
and /metrics say so, with the line, within a minute of the lines being written (issue 29)."""

from __future__ import annotations

import asyncio
import time

from exporter.config import typed_config, validate
from exporter.sources.logs import LogsSource
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
    await wait_for(lambda: client.runtime.daemon.states.get("logs"), 10, "the logs source's first sample")

    lines = next(p for p in load() if p.name == "hf/trl-3452-grpo-nothing-useful").lines  # real, TRL GRPO
    written = time.monotonic()
    with path.open("a") as f:
        f.write("".join(line + "\n" for line in lines))

    async def jobs():
        return (await (await client.get("/api/v1/jobs")).json())["jobs"]

    reason = None
    while time.monotonic() - written < 60:
        reason = next((j["reason"] for j in await jobs() if j["job"] == "grpo"), None)
        if reason and "no progress read" in reason:
            break
        await asyncio.sleep(0.2)
    assert reason and "detected hf" in reason and "first unread line \"{'loss': 0.0" in reason, reason
    assert time.monotonic() - written < 60

    async def status_files():
        status = await (await client.get("/api/v1/status")).json()
        logs = next(s for s in status["sources"] if s["source"] == "logs")
        return logs["status"]["files"]

    files = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        files = await status_files()
        if files and files[0]["no_progress"]:
            break
        await asyncio.sleep(0.2)
    assert files[0]["no_progress"] and files[0]["formats"] == ["hf"]
    key = ("mfu_exporter_source_errors_total", (("reason", "no_progress_read"), ("source", "logs")))

    async def counted():
        return samples(await (await client.get("/metrics")).text()).get(key)

    errors = None
    while time.monotonic() < deadline and errors is None:
        errors = await counted()
        await asyncio.sleep(0.2)
    assert errors == 1
