"""Property: valid progress reports and checkpoint events with one or two fields replaced by edge values never put a
NaN, an infinity, a negative number or an MFU above 1 on /metrics, never move a counter backwards, and leave a fresh
job's MFU exact.

One real exporter process serves every example, so what an earlier example left behind (its jobs, their counters)
is still there when a later one runs: the invariants hold for the exporter's whole life, not per request. Each
example trains a job of its own name; the reports go over HTTP as a client would send them (4xx answers are fine:
refusing a value is one way to keep it off /metrics), and after each example /metrics is read, parsed and checked,
and given to ``promtool check metrics``.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import time
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.support.prom_harness import Exporter, no_sources_config
from tests.support.tools import require_tool
from tests.support.wait import wait_until

# Finite numbers a client could send that sit at the edges of what the fields mean: zero, the smallest doubles,
# fractions, 2^53 and past it, the largest double, negatives; strings in the quantity forms the API takes.
EDGE_NUMBERS = [
    0,
    -0.0,
    5e-324,
    2.2250738585072014e-308,
    1e-300,
    1e-12,
    1e-9,
    1e-3,
    0.5,
    0.999999,
    1,
    1.000001,
    2,
    7,
    1023,
    1024,
    1025,
    65535,
    65536,
    2**31,
    2**32,
    2**53,
    2**53 + 1,
    2**63,
    1e15,
    1e18,
    1e21,
    1.0000001e21,
    1e30,
    1e100,
    1e300,
    1.7976931348623157e308,
    -1,
    -1e-300,
    -1e21,
]
EDGE_STRINGS = ["0", "1", "0.000001", "1e-300", "1e21", "1e300", "999P", "1000000000000P", "70B", "1e15T", ""]
EDGE_VALUES = EDGE_NUMBERS + EDGE_STRINGS + [None, True, [], {}, [0, 0], list(range(64))]

PROGRESS_FIELDS = [
    "tokens_total",
    "time",
    "step",
    "gpus",
    "peak_tflops",
    "target_tokens",
    "expected_mfu",
    "model.params",
    "model.layers",
    "model.heads",
    "model.head_dim",
    "model.seq_len",
    "run",  # the time ledger's fields
    "event",
    "heartbeat_seconds",
    "duration_seconds",
]
CHECKPOINT_FIELDS = ["bytes", "duration_seconds", "time"]
STATES = ["running", "finished", "failed", "cancelled"]
RELATIVE_TIMES = [0.0, 1e-9, 1e-6, 1e-3, 0.999, 1.0, 1.001]  # a report this long after the one before it

# A fresh job after every example: its MFU is exactly FLOPs/token × tokens/s ÷ peak.
PROBE_PARAMS, PROBE_GPUS, PROBE_PEAK_TFLOPS = 7e9, 8, 1000.0
PROBE_TOKENS, PROBE_SECONDS = 2_000_000, 20.0  # 100k tokens/s: 52.5% MFU
PROBE_MFU = 6 * PROBE_PARAMS * (PROBE_TOKENS / PROBE_SECONDS) / (PROBE_GPUS * PROBE_PEAK_TFLOPS * 1e12)

COUNTER_TYPES = {"counter", "histogram"}
names = (f"prop-{n}" for n in itertools.count())


def valid_reports(job: str, start: float) -> list[dict[str, Any]]:
    """Four reports of a healthy 8-GPU job, 10 s apart, at about 35% MFU."""
    facts = {
        "model": {"params": "8B", "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192},
        "gpus": 8,
        "peak_tflops": 989.4,
        "target_tokens": "1T",
        "expected_mfu": 0.4,
    }
    reports = []
    for i in range(4):
        report = {
            "job": job,
            "run": f"{job}-1",
            "tokens_total": 1_000_000 + i * 700_000,
            "step": 100 + i,
            "time": start + 10 * i,
        }
        if i == 0:
            report.update(facts)
        reports.append(report)
    return reports


def valid_checkpoint(job: str, start: float) -> list[dict[str, Any]]:
    return [
        {"job": job, "checkpoint": "step-100", "phase": "started", "time": start + 1},
        {"job": job, "checkpoint": "step-100", "phase": "finished", "time": start + 25, "bytes": 16e9},
        {"job": job, "checkpoint": "step-101", "duration_seconds": 12.5, "bytes": 2**40, "time": start + 28},
    ]


def put(body: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        body = body.setdefault(key, {})
    if value is None:
        body.pop(keys[-1], None)
    else:
        body[keys[-1]] = value


@st.composite
def mutated_run(draw):
    """A valid run of reports and checkpoint events with one or two fields of them replaced by edge values."""
    kinds = draw(st.lists(st.sampled_from(["progress", "checkpoint", "timestep", "state"]), min_size=1, max_size=2))
    mutations = []
    for kind in kinds:
        if kind == "progress":
            mutations.append(
                (
                    kind,
                    draw(st.integers(0, 3)),
                    draw(st.sampled_from(PROGRESS_FIELDS)),
                    draw(st.sampled_from(EDGE_VALUES)),
                )
            )
        elif kind == "checkpoint":
            mutations.append(
                (
                    kind,
                    draw(st.integers(0, 2)),
                    draw(st.sampled_from(CHECKPOINT_FIELDS)),
                    draw(st.sampled_from(EDGE_VALUES)),
                )
            )
        elif kind == "timestep":  # a report right after the one before it: a time step of zero or nanoseconds
            mutations.append((kind, draw(st.integers(1, 3)), "time", draw(st.sampled_from(RELATIVE_TIMES))))
        else:  # the job ends mid-run (the reports after it are a new run), or says running when it runs
            mutations.append(("progress", draw(st.integers(0, 3)), "state", draw(st.sampled_from(STATES))))
    return mutations


def scrape(url: str) -> tuple[str, dict[tuple[str, tuple], tuple[str, float]]]:
    response = requests.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = (family.type, sample.value)
    return response.text, samples


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    config = no_sources_config(ingest={"max_jobs": 1000}, mfu={"window": "1m", "interval": "1s"})
    config["sources"]["checkpoint"] = {"enabled": True}  # the API's events; no directory is watched
    server = Exporter(tmp_path_factory.mktemp("property"), config).start()
    yield server
    server.stop()


def test_edge_values_never_reach_metrics(exporter):
    promtool = require_tool("promtool", "prometheus")
    url = exporter.url
    previous: dict[tuple[str, tuple], float] = {}

    @settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(mutated_run())
    def run(mutations):
        job = next(names)
        start = time.time() - 60
        reports, events = valid_reports(job, start), valid_checkpoint(job, start)
        for kind, index, field, value in mutations:
            if kind == "progress":
                put(reports[index], field, value)
            elif kind == "checkpoint":
                put(events[index], field, value)
            else:
                before = reports[index - 1]["time"]
                # A step from a time another mutation made a string or null has no base: that report keeps its time.
                if isinstance(before, (int, float)) and not isinstance(before, bool):
                    reports[index]["time"] = before + value
        reported = False
        for body in reports[:2] + events + reports[2:]:
            path = "/api/v1/checkpoints" if "checkpoint" in body else "/api/v1/progress"
            answer = requests.post(url + path, json=body, timeout=10)
            assert answer.status_code < 500, (body, answer.text)
            if answer.status_code >= 400:
                assert "field" in answer.json() or answer.status_code == 409, answer.text
            reported |= path == "/api/v1/progress" and answer.status_code == 200
        check_metrics(url, promtool, previous, job if reported else None)

    run()
    assert_fresh_job_is_exact(url)


def served_job(url: str, job: str) -> tuple[str, dict[tuple[str, tuple], tuple[str, float]]] | None:
    """The scrape once it shows ``job`` (the exporter's tick publishes a report to /metrics), else None."""
    text, samples = scrape(url)
    return (text, samples) if any(("training_job", job) in labels for _, labels in samples) else None


def check_metrics(url: str, promtool: str, previous: dict, job: str | None = None) -> None:
    """Check a scrape; one that shows ``job``, when given (a job with an accepted report)."""
    if job is None:
        text, samples = scrape(url)
    else:
        text, samples = wait_until(lambda: served_job(url, job), 20, f"job {job} on /metrics")
    for (name, labels), (kind, value) in samples.items():
        assert math.isfinite(value), f"{name}{dict(labels)} = {value}"
        if name.startswith(("mfu_job_", "mfu_checkpoint_", "mfu_model_")):
            assert value >= 0, f"{name}{dict(labels)} = {value}"
        if name in ("mfu_model_flops_utilization_ratio", "mfu_job_goodput_ratio", "mfu_job_effective_mfu_ratio"):
            assert 0 <= value <= 1, f"{name}{dict(labels)} = {value}"
        if kind in COUNTER_TYPES and not name.endswith("_created"):
            key = (name, labels)
            assert value >= previous.get(key, 0.0), f"{name}{dict(labels)} went back from {previous[key]} to {value}"
            previous[key] = value
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def assert_fresh_job_is_exact(url: str) -> None:
    job, now = next(names), time.time()
    first = {
        "job": job,
        "tokens_total": 0,
        "time": now - PROBE_SECONDS,
        "model": {"params": PROBE_PARAMS},
        "gpus": PROBE_GPUS,
        "peak_tflops": PROBE_PEAK_TFLOPS,
    }
    for body in (first, {"job": job, "tokens_total": PROBE_TOKENS, "time": now}):
        answer = requests.post(url + "/api/v1/progress", json=body, timeout=10)
        assert answer.status_code == 200, answer.text
    jobs = {j["job"]: j for j in requests.get(url + "/api/v1/jobs", timeout=10).json()["jobs"]}
    assert jobs[job]["mfu"] == pytest.approx(PROBE_MFU, rel=1e-12)

    def exported_mfu():  # /metrics shows the reports from the exporter's next tick on
        _, samples = scrape(url)
        return [
            v
            for (name, labels), v in samples.items()
            if name == "mfu_model_flops_utilization_ratio" and dict(labels)["training_job"] == job
        ]

    ((_, exported),) = wait_until(exported_mfu, 20, f"the MFU of job {job} on /metrics")
    assert exported == pytest.approx(PROBE_MFU, rel=1e-12)
