"""Restart without loss: kill -9 of a real exporter process, a restart on the same port, and the training-side client
brings the job back, because it sends the model facts and cumulative totals with every report. The job's counters
resume from state.dir, or begin at 0 without one: never at a lower non-zero value, which Prometheus would count again."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from mfu_exporter.client import ProgressReporter
from mfu_exporter.config import defaults
from tests.support.expo import matching, samples
from tests.support.net import free_port
from tests.support.wait import wait_until

TOKEN = "restart-test-token"
MODEL = {"params": "7B"}
GPUS, PEAK_TFLOPS = 8, 989.0
FLOPS_PER_TOKEN = 6 * 7e9
REPORT_INTERVAL = 10.0  # seconds of the job's clock between reports; the test drives that clock


class ExporterProcess:
    def __init__(self, config_path, port):
        self.config_path, self.port = config_path, port
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mfu_exporter", "--config", str(self.config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        wait_until(self.ready, timeout=20)

    def ready(self):
        assert self.process.poll() is None, self.process.stdout.read().decode()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
            return response.read().decode()

    def job(self):
        [job] = json.loads(self.get("/api/v1/jobs"))["jobs"]
        return job

    def tokens_total(self):
        """The job's total as the exporter has it; None before it knows the job."""
        jobs = json.loads(self.get("/api/v1/jobs"))["jobs"]
        return jobs[0]["tokens_total"] if jobs else None

    def metric(self, name):
        values = matching(samples(self.get("/metrics")), name, training_job="llama")
        return values[0] if values else None

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process.stdout.close()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process:
            self.process.stdout.close()


@pytest.fixture(params=["state-dir", "no-state-dir"])
def exporter(tmp_path, request):
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    config = {
        "web": {"listen_address": f"127.0.0.1:{port}"},
        "ingest": {"token_file": str(token_file)},
        "sources": {name: {"enabled": "false"} for name in defaults()["sources"]},
    }
    if request.param == "state-dir":
        config["state"] = {"dir": str(tmp_path / "state")}
    state_file = tmp_path / "state" / "jobs.json"
    config_path = tmp_path / "config.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    process = ExporterProcess(config_path, port)
    process.resumes = request.param == "state-dir"
    process.saved = lambda: state_file.exists() and "llama" in json.loads(state_file.read_text())["jobs"]
    process.start()
    yield process
    process.stop()


def test_kill_9_and_restart_loses_no_job(exporter):
    job_clock = [time.time() - 600]
    reporter = ProgressReporter(
        f"http://127.0.0.1:{exporter.port}",
        "llama",
        model=MODEL,
        gpus=GPUS,
        peak_tflops=PEAK_TFLOPS,
        token=TOKEN,
        max_backoff=0.2,
        timeout=1.0,
        clock=lambda: job_clock[0],
    )

    def report(tokens):
        reporter.update(tokens_total=tokens, step=int(tokens // 1000))
        # The total itself, on the exporter: the reporter's count of posts includes its start event, and a total
        # still waiting to be posted when the next comes is replaced by it.
        wait_until(lambda: exporter.tokens_total() == tokens, timeout=20, what=f"the total {tokens:g} reported")
        job_clock[0] += REPORT_INTERVAL

    expected_mfu = FLOPS_PER_TOKEN * (1e6 / REPORT_INTERVAL) / (GPUS * PEAK_TFLOPS * 1e12)
    try:
        report(1e6)
        report(2e6)
        assert exporter.job()["mfu"] == pytest.approx(expected_mfu)
        if exporter.resumes:
            wait_until(exporter.saved, timeout=20)  # the tick after a job's first count saves it

        exporter.kill()
        failures = reporter.failures
        reporter.update(tokens_total=3e6, step=3000)  # the training loop goes on while the exporter is down
        wait_until(lambda: reporter.failures > failures, timeout=20)  # it met the dead exporter
        job_clock[0] += REPORT_INTERVAL

        exporter.start()  # same port, empty memory: everything below comes from the reporter
        wait_until(lambda: exporter.tokens_total() == 3e6, timeout=20, what="the pending total on the new exporter")
        job = exporter.job()
        assert job["tokens_total"] == 3e6
        assert job["mfu"] is None  # one report: no rate yet
        assert job["flops_per_token"] == pytest.approx(FLOPS_PER_TOKEN)
        assert job["peak_flops"] == pytest.approx(GPUS * PEAK_TFLOPS * 1e12)
        # The counters began at 0 at the first count (1e6). The killed exporter saved them (state.dir) at its
        # first tick and every 10 s: the new one resumes them, adding what the job's running total grew meanwhile;
        # without a state.dir they begin at 0 again.
        counted = 2e6 if exporter.resumes else 0.0

        def served(value):
            # /metrics shows a report from the exporter's next tick on.
            return lambda: exporter.metric("mfu_job_tokens_total") == value

        wait_until(served(counted), timeout=20, what=f"mfu_job_tokens_total {counted:g} on /metrics")

        report(4e6)  # one report interval later, MFU is back
        assert exporter.job()["mfu"] == pytest.approx(expected_mfu)
        wait_until(served(counted + 1e6), timeout=20, what=f"mfu_job_tokens_total {counted + 1e6:g} on /metrics")
        assert exporter.metric("mfu_job_model_flops_total") == pytest.approx(FLOPS_PER_TOKEN * (counted + 1e6))
    finally:
        reporter.close(timeout=1)
