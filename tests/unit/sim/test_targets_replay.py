"""A real node replayed by the target server (mfu_exporter/sim/targets.py ``--exposition``): two captures of a node's
``/metrics`` (here a simulated node's, rendered by the real collector, with a second job beside its own), served by
every node with every job, counters advancing at the rate between the captures, each node's GPUs its own."""

from __future__ import annotations

import asyncio
import http.server
import os
import re
import threading

import pytest

from mfu_exporter.sim.targets import (
    HEALTHY,
    REPLAY,
    StateTemplate,
    TargetFleet,
    _capture_fleet,
    main,
    replay_rendering,
)

NODES = 8
ADDRESS = "127.0.0.1:9400"
INTERVAL = 15.0
APART = 60.0
SECOND_JOB = "replayed-second"


def with_a_second_job(text: str, job: str) -> str:
    """The exposition with every series of ``job`` also under SECOND_JOB, in its family: a node with two jobs."""
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if f'training_job="{job}"' in line and not line.startswith("#"):
            lines.append(line.replace(f'training_job="{job}"', f'training_job="{SECOND_JOB}"'))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """A node's two expositions 60 s apart, as files written when captured (the second's time is its mtime)."""
    root = tmp_path_factory.mktemp("replay")
    rendering = asyncio.run(_capture_fleet(root / "fleet", "pfc-storm", {HEALTHY: 0}, 60.0))[HEALTHY]
    first, second = root / "first.txt", root / "second.txt"
    first.write_text(with_a_second_job(rendering.first, rendering.job))
    second.write_text(with_a_second_job(rendering.second, rendering.job))
    os.utime(second, (rendering.at, rendering.at))
    return str(first), str(second), rendering.job


@pytest.fixture
def fleet(captures):
    first, second, _ = captures
    template = StateTemplate.parse(REPLAY, replay_rendering([first, second], APART))
    now = [1_800_000_000.0]
    served = TargetFleet({REPLAY: template}, NODES, ADDRESS, INTERVAL, None, None, clock=lambda: now[0])
    served.now = now  # type: ignore[attr-defined]
    return served


def samples(body: bytes) -> dict[str, float]:
    found = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


def captured(path: str) -> dict[str, float]:
    return samples(open(path, "rb").read())


def test_every_node_serves_every_job_with_its_own_gpus(fleet, captures):
    _, second, job = captures
    bodies = {node: fleet.body(node).decode() for node in (0, 1, NODES - 1)}
    for body in bodies.values():
        assert f'training_job="{job}"' in body and f'training_job="{SECOND_JOB}"' in body
        # The node's series as captured: the same names and labels, bar the GPUs' UUIDs.
        assert len(samples(body.encode())) == len(captured(second))
    uuids = {node: set(re.findall(r'uuid="([^"]+)"', body)) for node, body in bodies.items()}
    assert all(len(found) == 8 for found in uuids.values())
    assert not uuids[0] & uuids[1] and not uuids[1] & uuids[NODES - 1]


def test_counters_advance_at_the_rate_between_the_captures(fleet, captures):
    first, second, job = captures
    before = samples(fleet.body(2))
    fleet.now[0] += INTERVAL
    after = samples(fleet.body(2))
    key = f'mfu_job_model_flops_total{{training_job="{job}"}}'
    captured_rate = (captured(second)[key] - captured(first)[key]) / APART
    assert captured_rate > 0 and after[key] - before[key] == pytest.approx(captured_rate * INTERVAL)
    gauge = f'mfu_job_peak_flops{{training_job="{job}"}}'
    assert after[gauge] == before[gauge] == captured(second)[gauge]


def test_the_truth_is_each_job_on_every_node_and_no_incident(fleet, captures):
    first, second, job = captures
    truth = fleet.truth()
    assert truth["layout"] == REPLAY and truth["incident"] is None and truth["lost"] is None
    jobs = {entry["name"]: entry for entry in truth["jobs"]}
    assert set(jobs) == {job, SECOND_JOB}
    key = f'mfu_job_model_flops_total{{training_job="{job}"}}'
    mfu = (
        (captured(second)[key] - captured(first)[key])
        / APART
        / captured(second)[f'mfu_job_peak_flops{{training_job="{job}"}}']
    )
    for entry in jobs.values():
        assert entry["nodes"] == list(range(NODES)) and entry["mfu_1m"] == pytest.approx(mfu)


def test_one_file_has_no_rates_and_is_refused(captures, capsys):
    first, _, _ = captures
    with pytest.raises(ValueError, match="one file has no counter rates"):
        replay_rendering([first], APART)
    assert main(["--nodes", "4", "--exposition", first]) == 2
    assert "one file has no counter rates" in capsys.readouterr().err


def test_a_url_is_read_twice_apart(captures):
    """A running node's /metrics (a real server on loopback serving the two captures in turn), read ``apart``."""
    first, second, _ = captures
    bodies = iter([open(first, "rb").read(), open(second, "rb").read()])

    class Node(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(bodies)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Node)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        slept: list[float] = []
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        rendering = replay_rendering([url], APART, sleep=slept.append)
    finally:
        server.shutdown()
    assert slept == [APART] and rendering.first == open(first).read() and rendering.second == open(second).read()
