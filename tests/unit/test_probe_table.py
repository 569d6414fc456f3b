"""The reliability and security probe's table, one test per row: what failed (web config failing open, TLS on a
read-only temp directory, hostile NCCL Inspector lines, a wrong-password flood, a burst before a rotation, symlinked
log paths, names with a trailing newline, and the command line's rough edges), then, briefly, what held (malformed
and huge requests refused with the field named, a hung source never slowing a scrape, basic auth on every
endpoint). Each row asserts behaviour, never a wall-clock figure, so it passes on a busy machine."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from unittest import mock

import aiohttp
import bcrypt
import pytest
import trustme

from mfu_exporter.config import typed_config, validate
from mfu_exporter.model.checkpoints import CheckpointTracker
from mfu_exporter.node.nvml import NvmlSession
from mfu_exporter.node.tail import Follower
from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.service import build_service
from mfu_exporter.sim.nvml import FakeNvml, h100
from mfu_exporter.sources.checkpoint import CheckpointSource
from mfu_exporter.sources.nccl import NcclSource
from mfu_exporter.web import security as websecurity
from mfu_exporter.web.app import create_app
from mfu_exporter.web.security import WebSecurity
from mfu_exporter.web.webconfig import load_web_config
from tests.support.expo import samples
from tests.support.wait import wait_for
from tests.unit.web import test_app as app_tests

PASSWORD = "correct horse"
HASH = "$2y$" + bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()[4:]


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def write_config(path: Path, text: str, stamp: list[int] = [1_700_000_000]) -> str:
    """Write and move the mtime on, so a reload never waits on the file system's timestamp granularity."""
    path.write_text(text)
    stamp[0] += 10
    os.utime(path, (stamp[0], stamp[0]))
    return str(path)


@pytest.fixture
def secured(aiohttp_client):
    async def make(security, sources=()):
        service = build_service(validate({}), list(sources))
        client = await aiohttp_client(create_app(service, security))
        client.service = service
        return client

    return make


def exporter_command(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mfu_exporter", *argv], capture_output=True, timeout=60, **kwargs)


# --- what failed --------------------------------------------------------------------------------------------------


async def test_a_failed_web_config_reload_fails_closed(secured, tmp_path):
    path = tmp_path / "web.yml"
    write_config(path, f"basic_auth_users: {{alice: '{HASH}'}}\n")
    client = await secured(WebSecurity(str(path)))
    alice, bob = basic("alice", PASSWORD), basic("bob", PASSWORD)
    assert (await client.get("/metrics", headers=alice)).status == 200
    write_config(path, f"basic_auth_users: {{bob: '{HASH}'}}\n")  # alice removed, while TMPDIR is full
    with mock.patch.object(websecurity, "load_web_config", side_effect=OSError(28, "No space left on device")):
        assert [(await client.get("/metrics", headers=who)).status for who in (alice, alice, bob)] == [503] * 3
    assert (await client.get("/metrics", headers=alice)).status == 503  # the change is retried, not forgotten


def test_tls_starts_with_a_read_only_temp_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "read-only-root"))  # no such directory: nothing writable
    cert = trustme.CA().issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "server.crt")
    cert.private_key_pem.write_to_path(tmp_path / "server.key")
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    assert load_web_config(str(config)).tls is not None


def test_hostile_inspector_lines_are_skipped_and_nothing_infinite_is_exported(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    record = {
        "header": {"id": "0x1", "rank": 0, "n_ranks": 2, "nnodes": 1},
        "metadata": {"hostname": "node-a", "pid": 5000},
        "coll_perf": {
            "coll": "AllReduce",
            "coll_sn": 1,
            "coll_msg_size_bytes": 256 << 20,
            "coll_exec_time_us": 1200.0,
            "coll_busbw_gbs": 400.0,
        },
    }

    def variant(where: str, key: str, raw: str) -> str:
        changed = {**record, where: {**record[where], key: "@"}}
        return json.dumps(changed).replace('"@"', raw)

    lines = [
        variant("coll_perf", "coll_busbw_gbs", "1e308"),
        variant("metadata", "pid", "Infinity"),
        variant("metadata", "pid", "[1]"),
        variant("coll_perf", "coll_msg_size_bytes", "1e400"),
        "[" * 30_000 + "]" * 30_000,
        json.dumps(record),
    ]
    (dump / "node-a-pid5000.log").write_text("".join(line + "\n" for line in lines))
    config = validate({"sources": {"nccl": {"inspector_paths": [str(dump)]}}})
    gpus = [h100(0, processes=[5000])]
    source = NcclSource(typed_config(config).sources.nccl, nvml_session=NvmlSession(FakeNvml(gpus)))
    source.attach(lambda: {0: "llm"}, lambda: {gpus[0].uuid: 0})
    snapshot = source.sample()
    assert sum(snapshot.errors.values()) == 5
    values = [s.value for family in snapshot_families(snapshot) for s in family.samples]
    assert values and all(math.isfinite(v) for v in values)
    assert snapshot.readings.inspector["llm"].summaries[0].count == 1  # the good line after the bad ones


async def test_a_wrong_password_flood_does_not_delay_valid_scrapes(secured, tmp_path):
    gate = threading.Event()

    def checkpw(password, hashed):
        if bcrypt.checkpw(password, hashed):
            return True
        gate.wait(30)  # a wrong guess holds its worker until the test lets go
        return False

    path = write_config(tmp_path / "web.yml", f"basic_auth_users: {{alice: '{HASH}', bob: '{HASH}'}}\n")
    client = await secured(WebSecurity(path, checkpw=checkpw))
    url = client.make_url("/metrics")
    assert (await client.get("/metrics", headers=basic("alice", PASSWORD))).status == 200
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0)) as flood:

        async def guess():
            async with flood.get(url, headers=basic("alice", "wrong")) as response:
                return response.status

        try:
            guesses = [asyncio.create_task(guess()) for _ in range(50)]
            await wait_for(lambda: sum(task.done() for task in guesses) == 49, 30, "the flood answered 429")
            assert (await client.get("/metrics", headers=basic("alice", PASSWORD))).status == 200  # cached
            assert (await client.get("/metrics", headers=basic("bob", PASSWORD))).status == 200  # a free worker
        finally:
            gate.set()
        assert sorted(await asyncio.gather(*guesses)) == [401] + [429] * 49


def test_a_rotation_right_after_a_burst_is_read_in_bounded_chunks(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"")
    batches: list[int] = []
    follower = Follower(
        [str(path)], lambda b: batches.append(sum(map(len, b.lines))), use_inotify=False, read_budget=1 << 20
    )
    follower.poll()
    with open(path, "a") as out:
        out.writelines(f"step: {i} {'x' * 90}\n" for i in range(200_000))  # about 20 MB
    os.rename(path, tmp_path / "train.log.1")
    path.write_text("step: new\n")
    for _ in range(60):
        follower.poll()
    assert len(batches) >= 10 and max(batches) <= (1 << 20)  # about 20 MB in 1 MiB reads, never one list


def test_the_log_follower_never_opens_a_symlink_leading_outside(tmp_path):
    (tmp_path / "logs").mkdir()
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret\n")
    (tmp_path / "logs" / "train.log").symlink_to(secret)
    read: list[str] = []
    follower = Follower([str(tmp_path / "logs" / "*.log")], lambda b: read.extend(b.lines), use_inotify=False)
    follower.poll()
    assert read == [] and follower.error_counts()["outside_path"] == 1


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/api/v1/progress", {"job": "j1\n", "tokens_total": 1}, "job"),
        ("/api/v1/progress", {"job": "j1", "tokens_total": 1, "run": "r1\n"}, "run"),
        ("/api/v1/checkpoints", {"job": "j1", "checkpoint": "step-1\n", "phase": "started"}, "checkpoint"),
    ],
)
async def test_a_trailing_newline_does_not_pass_the_name_checks(make_client, path, body, field):
    section = typed_config(validate({})).sources.checkpoint
    client = await make_client({}, [CheckpointSource(section, CheckpointTracker())])
    response = await client.post(path, json=body)
    assert response.status == 400
    assert (await response.json())["field"] == field
    assert 'training_job="j1\\n"' not in await (await client.get("/metrics")).text()


# A port already in use: one line, and no source started (the row's test lives beside the server's others).
test_a_port_in_use_is_one_line_before_any_source_starts = (
    app_tests.test_a_port_in_use_is_one_line_before_any_source_starts
)


@pytest.mark.parametrize("content", [None, b"\x00\xff binary\x80"])
def test_nccl_json_is_printed_for_a_missing_or_binary_file(tmp_path, content):
    path = tmp_path / "out.txt"
    if content is not None:
        path.write_bytes(content)
    result = exporter_command("nccl", str(path), "--json", "--expect-busbw", "400")
    assert result.returncode == 2
    assert json.loads(result.stdout)["verdict"] == "unreadable"


def test_nccl_json_into_a_closed_pipe_ends_quietly(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("")
    child = subprocess.Popen(
        [sys.executable, "-m", "mfu_exporter", "nccl", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child.stdout.close()  # as `| head` that has already gone
    stderr = child.stderr.read()
    assert child.wait() == 2  # the verdict's exit code: unreadable
    assert stderr == b""


def test_check_with_a_bad_flag_prints_its_own_usage():
    result = exporter_command("check", "--bogus")
    assert result.returncode == 2
    assert result.stderr.decode().startswith("usage: mfu-exporter check ")


# --- what held ----------------------------------------------------------------------------------------------------


async def test_held_malformed_and_huge_requests_get_a_4xx_naming_the_field(make_client):
    client = await make_client({"ingest": {"max_body_bytes": 1024}})
    bad = await client.post("/api/v1/progress", json={"job": "j1", "tokens_total": "lots"})
    assert bad.status == 400 and (await bad.json())["field"] == "tokens_total"
    assert (await client.post("/api/v1/progress", data=b"{" * 4096)).status == 413
    assert (await client.post("/api/v1/progress", data=b"{not json")).status == 400


async def test_held_a_hung_source_never_blocks_a_scrape(make_client, scripted_source):
    client = await make_client(sources=[scripted_source])
    state = client.service.scheduler.states["fake"]
    await wait_for(lambda: state.up, 30)
    scripted_source.release.clear()
    await wait_for(lambda: not state.up, 30)
    body = await (await client.get("/metrics")).text()
    assert samples(body)[("mfu_exporter_source_up", (("source", "fake"),))] == 0


async def test_held_basic_auth_covers_every_endpoint_but_the_probes(secured, tmp_path):
    client = await secured(WebSecurity(write_config(tmp_path / "web.yml", f"basic_auth_users: {{a: '{HASH}'}}\n")))
    for path in ("/", "/metrics", "/api/v1/status", "/api/v1/jobs"):
        assert (await client.get(path)).status == 401, path
    for path in ("/healthz", "/readyz"):
        assert (await client.get(path)).status in (200, 503), path
