"""A bounded soak: concurrent scrapes and progress reports while the hardware misbehaves.

For ``SOAK_SECONDS`` (default 50, so the test stays within a minute; ``make soak`` runs it for ten) the real
exporter serves over HTTP while a chaos thread makes the fake NVML raise GPU_IS_LOST, UNKNOWN and TIMEOUT, lose
GPUs and hang calls past the source timeout, unplugs RDMA devices (their sysfs counter files vanish and come back,
at any moment of a sample: reads of the removed files fail as the kernel's do, ``KernfsOs``) and makes the ethtool
reader fail. The RDMA source rediscovers its ports every second, so a device whose directory appeared before its
ports (as the kernel creates them) is found within a second, not the production 30. Afterwards, with the faults
healed: the server still answers, its memory grew by a bounded amount, every source reports again with current
values, and every job's ``mfu_job_tokens_total`` is the last total its reporter sent. ``SOAK_SEED`` picks the
chaos sequence.
"""

import asyncio
import errno
import os
import random
import threading
import time

import pynvml
import pytest
import requests

from mfu_exporter.client import ProgressReporter
from mfu_exporter.config import validate
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.service import build_service
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode, hw_counters, port_counters
from mfu_exporter.sim.sysfs import KernfsOs
from mfu_exporter.sources import rdma
from mfu_exporter.sources.ethtool import EthtoolSource
from mfu_exporter.sources.gpu import GpuSource
from mfu_exporter.sources.rdma import RdmaSource
from mfu_exporter.web.app import serve
from tests.support.expo import matching, samples
from tests.support.net import free_port
from tests.support.wait import wait_until

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "50"))
SEED = int(os.environ.get("SOAK_SEED", "0"))
GPUS, NICS = 8, 4
JOBS = ("llama", "mixtral", "gpt-oss", "qwen")
# Per-cycle NVML calls of the GPU source, and the failures a sick driver gives them.
NVML_CALLS = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetClockInfo",
)
NVML_FAULTS = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_TIMEOUT)
RSS_GROWTH_LIMIT = 32 * 1024 * 1024
GARBAGE = (
    b"",
    b"{",
    b"[]",
    b'{"job": "x"}',
    b'{"job": "../x", "tokens_total": 1}',
    b'{"job": "x", "tokens_total": -1}',
    b'{"job": "x", "tokens_total": NaN}',
    b"\xff\xfe",
    b"[" * 4000,
    b'{"job": "x", "tokens_total": 1, "model": 5}',
)


def rss_bytes():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class FlakyReader:
    """The ethtool statistics reader, failing with EIO while ``failing`` is set."""

    def __init__(self, reader):
        self.reader = reader
        self.failing = False

    def read(self, interface):
        if self.failing:
            raise OSError(errno.EIO, "injected ethtool failure")
        return self.reader.read(interface)

    def close(self):
        self.reader.close()


class Chaos:
    """Moves the node's counters forward and injects faults, each undone after a while; ``heal`` undoes all."""

    def __init__(self, nvml, fabric, reader, rng):
        self.nvml, self.fabric, self.reader, self.rng = nvml, fabric, reader, rng
        self.undo = []  # (due, action)
        self.unplugged = {}  # device -> nic
        self.steps = 0

    def later(self, low, high, action):
        self.undo.append((time.monotonic() + self.rng.uniform(low, high), action))

    def step(self, seconds):
        self.nvml.advance(seconds)
        self.fabric.tick(seconds)
        now = time.monotonic()
        for due, action in [u for u in self.undo if u[0] <= now]:
            self.undo.remove((due, action))
            action()
        # Every kind of fault once at the start, whatever the seed and duration; then at random.
        faults = (self.fail_call, self.lose_gpu, self.hang_call, self.unplug_nic, self.fail_reader)
        if self.steps < len(faults):
            faults[self.steps]()
        elif self.rng.random() < 0.25:
            self.rng.choice(faults)()
        self.steps += 1

    def fail_call(self):
        gpu, call = self.rng.choice(self.nvml.gpus), self.rng.choice(NVML_CALLS)
        gpu.fail[call] = self.rng.choice(NVML_FAULTS)
        self.later(0.2, 2.0, lambda: gpu.fail.pop(call, None))

    def lose_gpu(self):
        gpu = self.rng.choice(self.nvml.gpus)
        if not gpu.lost:
            self.nvml.lose(self.nvml.gpus.index(gpu))
            self.later(0.5, 3.0, lambda: setattr(gpu, "lost", False))

    def hang_call(self):
        if not self.nvml.hangs:
            call = self.rng.choice(NVML_CALLS)
            released = self.nvml.hang(call)
            self.later(0.4, 1.5, lambda: (self.nvml.hangs.pop(call, None), released.set()))

    def unplug_nic(self):
        if len(self.unplugged) < NICS - 1:
            nic = self.rng.choice(self.fabric.nics)
            self.unplug(nic)
            self.later(0.5, 2.0, lambda: self.replug(nic))

    def fail_reader(self):
        if not self.reader.failing:
            self.reader.failing = True
            self.later(0.2, 2.0, lambda: setattr(self.reader, "failing", False))

    def unplug(self, nic):
        """A driver reload: the device's sysfs directory, counter files included, disappears."""
        self.fabric.nics.remove(nic)
        self.fabric.sysfs.remove_rdma_device(nic.device)
        self.unplugged[nic.device] = nic

    def replug(self, nic):
        sysfs = self.fabric.sysfs
        sysfs.add_rdma_device(nic.device, nic.pci_address, numa_node=nic.numa_node)
        sysfs.add_rdma_port(
            nic.device,
            1,
            netdev=nic.netdev,
            rate=f"{nic.rate_gbps:g} Gb/sec (4X NDR)",
            counters=port_counters(**{k: int(v) for k, v in nic.counters.items()}),
            hw_counters=hw_counters(**{k: int(v) for k, v in nic.hw_counters.items()}),
        )
        self.fabric.nics.append(nic)
        del self.unplugged[nic.device]

    def heal(self):
        for _, action in sorted(self.undo, key=lambda u: u[0]):
            action()
        self.undo.clear()


class Load(threading.Thread):
    """Runs ``action`` until stopped, keeping every problem it meets for the test to report."""

    def __init__(self, name, action, stop):
        super().__init__(name=name, daemon=True)
        self.action, self.stop, self.problems, self.calls = action, stop, [], 0

    def run(self):
        while not self.stop.is_set():
            try:
                self.action()
                self.calls += 1
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.problems.append(f"{self.name}: {type(exc).__name__}: {exc}")
                if len(self.problems) > 20:
                    return


def value(found, name, **labels):
    """The value of the one sample ``name`` with these labels (and maybe others); None when not exactly one."""
    matches = matching(found, name, **labels)
    return matches[0] if len(matches) == 1 else None


@pytest.mark.slow
async def test_soak_under_faults(tmp_path, monkeypatch):
    monkeypatch.setattr(rdma, "os", KernfsOs())
    rng = random.Random(SEED)
    nvml = fake_nvml.node(fake_nvml.h100, count=GPUS)
    fabric = SimulatedNode(tmp_path / "fabric", nics=NICS)
    for nic in fabric.nics:
        nic.cnp_per_second, nic.rx_pause_ratio = 100.0, 0.01
    reader = FlakyReader(EthtoolTextReader.from_directory(str(fabric.ethtool_directory)))
    chaos = Chaos(nvml, fabric, reader, rng)
    sources = [
        GpuSource(nvml, interval=0.1, timeout=0.3, retry_interval=0.5),
        RdmaSource(fabric.sysfs_root, interval=0.1, timeout=1.0, rediscover_interval=1.0),
        EthtoolSource(fabric.sysfs_root, reader=reader, interval=0.1, timeout=1.0, rediscover_interval=1.0),
    ]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = build_service(validate({"web": {"listen_address": f"127.0.0.1:{port}"}}), sources)
    stop_server, started = asyncio.Event(), asyncio.Event()
    server = asyncio.create_task(serve(service, on_started=lambda urls: started.set(), stop=stop_server))
    await asyncio.wait_for(started.wait(), 30)

    stop = threading.Event()
    reporters = {
        job: ProgressReporter(url, job, model={"params": "8B"}, gpus=2, peak_tflops=989.0, max_backoff=0.5)
        for job in JOBS
    }
    last_total = dict.fromkeys(JOBS, 0)
    for job in JOBS:  # each job's first count, 0: its counters begin there, so they end at its last total
        reporters[job].update(tokens_total=0, step=0)
    await asyncio.to_thread(wait_until, lambda: all(reporters[job].sent > 0 for job in JOBS), 30, "first reports")

    def chaos_step():
        chaos.step(0.05)
        time.sleep(0.05)

    def scraper():
        session = requests.Session()  # one per thread: a Session is not thread-safe

        def scrape():
            accept = rng.choice(
                [{}, {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"}]
            )
            response = session.get(url + "/metrics", headers=accept, timeout=10)
            assert response.status_code == 200, response.status_code
            assert response.content.endswith(b"# EOF\n") if accept else b"mfu_gpu_up" in response.content  # un-gzipped
            for path in ("/api/v1/status", "/api/v1/jobs", "/"):
                assert session.get(url + path, timeout=10).status_code == 200, path
            time.sleep(0.02)  # a busy scraper, not a CPU hog that starves the samplers on a 2-core CI machine

        return scrape

    def report(job):
        def step():
            total = last_total[job] + rng.randint(1_000, 100_000)
            last_total[job] = total
            reporters[job].update(tokens_total=total, step=total // 1000)
            time.sleep(0.01)

        return step

    garbage_session = requests.Session()

    def garbage():
        response = garbage_session.post(url + "/api/v1/progress", data=rng.choice(GARBAGE), timeout=10)
        assert 400 <= response.status_code < 500, response.status_code
        time.sleep(0.01)

    loads = [Load("chaos", chaos_step, stop), Load("garbage", garbage, stop)]
    loads += [Load(f"scrape-{i}", scraper(), stop) for i in range(2)]
    loads += [Load(f"report-{job}", report(job), stop) for job in JOBS]
    for load in loads:
        load.start()
    try:
        await asyncio.sleep(min(5.0, SOAK_SECONDS / 5))
        rss_after_warmup = rss_bytes()
        await asyncio.sleep(SOAK_SECONDS - min(5.0, SOAK_SECONDS / 5))
    finally:
        stop.set()
        for load in loads:
            await asyncio.to_thread(load.join, 30)
        chaos.heal()
        for reporter in reporters.values():
            await asyncio.to_thread(reporter.close, 10)

    try:
        problems = [p for load in loads for p in load.problems]
        assert problems == [], problems[:10]
        assert all(load.calls > 0 for load in loads), [(load.name, load.calls) for load in loads]

        def unsettled():
            """The scrape, and what in it still shows a fault (an empty list once every source has recovered)."""
            found = samples(requests.get(url + "/metrics", timeout=10).text)
            problems = [
                f"source {s} down"
                for s in ("gpu", "rdma", "ethtool")
                if value(found, "mfu_exporter_source_up", source=s) != 1
            ]
            problems += [f"GPU {i} down" for i in range(GPUS) if value(found, "mfu_gpu_up", gpu=str(i)) != 1]
            problems += [
                f"{nic.device} reads {value(found, 'mfu_rdma_port_data_received_bytes_total', device=nic.device)}"
                f" instead of {int(nic.counters['port_rcv_data']) * 4}"
                for nic in fabric.nics
                if value(found, "mfu_rdma_port_data_received_bytes_total", device=nic.device)
                != int(nic.counters["port_rcv_data"]) * 4
            ]
            # A job's last report shows from the tick after it arrived.
            problems += [
                f"{job} shows {value(found, 'mfu_job_tokens_total', training_job=job)} tokens, not {last_total[job]}"
                for job in JOBS
                if value(found, "mfu_job_tokens_total", training_job=job) != last_total[job]
            ]
            return found, problems

        deadline = time.monotonic() + 30
        while (result := await asyncio.to_thread(unsettled))[1]:
            assert time.monotonic() < deadline, f"not recovered after the faults were healed: {result[1]}"
            await asyncio.to_thread(fabric.tick, 0.05)
            await asyncio.sleep(0.2)
        found = result[0]
        assert len(fabric.nics) == NICS

        healthz = await asyncio.to_thread(requests.get, url + "/healthz", timeout=10)  # never block the server's loop
        assert healthz.status_code == 200
        for job in JOBS:
            assert reporters[job].sent > 0
        for source in ("gpu", "rdma", "ethtool"):  # the faults did reach every source
            assert sum(matching(found, "mfu_exporter_source_errors_total", source=source)) > 0, source
        growth = rss_bytes() - rss_after_warmup
        print(
            f"soak: {SOAK_SECONDS:g} s, {chaos.steps} chaos steps, RSS {rss_after_warmup / 2**20:.0f} MiB after warm-up, "
            f"{growth / 2**20:+.1f} MiB at the end; {sum(load.calls for load in loads)} load calls"
        )
        assert growth < RSS_GROWTH_LIMIT, f"RSS grew by {growth / 2**20:.1f} MiB over the soak"
    finally:
        stop_server.set()
        await asyncio.wait_for(server, 30)  # a shutdown that hangs fails the test instead of CI
