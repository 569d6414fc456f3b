"""A GPU's health through the real GPU source on the fake NVML: an Xid event, a lost GPU or a driver condition sets
the state; the exposition's mfu_gpu_health and the status (/api/v1/status) show it with the action; a reset the
source sees sets it back to healthy."""

import pynvml

from mfu_exporter.config import validate
from mfu_exporter.service import build_service
from mfu_exporter.sim import nvml as fake
from mfu_exporter.sources.gpu import GpuSource
from mfu_exporter.web.app import create_app
from tests.support import expo
from tests.support.wait import wait_for

STATES = ("healthy", "degraded", "reset_required", "reboot_required", "inspection_required")


class Node:
    """A fake NVML and the source on it, with a monotonic clock the test advances."""

    def __init__(self, count=4, retry_interval=30.0):
        self.nvml = fake.node(fake.h100, count=count)
        self.now = 1000.0
        self.source = GpuSource(self.nvml, monotonic=lambda: self.now, retry_interval=retry_interval)

    def tick(self, seconds=1.0):
        self.nvml.advance(seconds)
        self.now += seconds
        return self.source.sample()


def health_series(snapshot, index):
    """{state: value} of one GPU's mfu_gpu_health in the snapshot's exposition."""
    values = expo.samples(expo.exposition(snapshot))
    return {
        dict(labels)["state"]: value
        for (name, labels), value in values.items()
        if name == "mfu_gpu_health" and dict(labels)["gpu"] == str(index)
    }


def in_state(snapshot, index, state):
    return health_series(snapshot, index) == {s: 1.0 if s == state else 0.0 for s in STATES}


def status_health(snapshot, index):
    return next(g for g in snapshot.status["gpus"] if g["index"] == index)["health"]


def test_an_uncontained_ecc_xid_needs_a_reset_and_the_reset_clears_it():
    node = Node()
    first = node.tick()  # registers the Xid event sets
    assert all(in_state(first, i, "healthy") for i in range(4))
    node.nvml.gpus[1].health.update({fake.RECOVERY_ACTION: 1, fake.REMAP_PENDING: 1})
    node.nvml.xid(1, 95)
    snapshot = node.tick()
    assert in_state(snapshot, 1, "reset_required")
    assert all(in_state(snapshot, i, "healthy") for i in (0, 2, 3))
    assert snapshot.readings.gpus[1].health == "reset_required"
    health = status_health(snapshot, 1)
    assert health["state"] == "reset_required" and health["reason"] == "Xid 95 ROBUST_CHANNEL_UNCONTAINED_ERROR"
    assert "nvidia-smi -r" in health["action"]
    assert health["last_xid"]["code"] == 95 and health["last_xid"]["nvidia_action"] == "RESET_GPU"
    assert any(n.startswith("GPU 1: reset_required (Xid 95") for n in snapshot.status["notes"])
    assert in_state(node.tick(10), 1, "reset_required")  # it holds until a reset

    node.nvml.reset(1)  # the operator's reset: the recovery action done, the row remapped
    snapshot = node.tick()
    assert in_state(snapshot, 1, "healthy")
    assert status_health(snapshot, 1)["last_xid"]["code"] == 95  # the last Xid stays on the page
    assert not any(n.startswith("GPU 1:") for n in snapshot.status["notes"])


def test_an_application_fault_leaves_the_gpu_healthy_and_names_its_action():
    node = Node()
    node.tick()
    node.nvml.xid(0, 13)
    snapshot = node.tick()
    assert in_state(snapshot, 0, "healthy")
    last = status_health(snapshot, 0)["last_xid"]
    assert (last["code"], last["state"], last["nvidia_action"]) == (13, "healthy", "RESTART_APP")


def test_xids_of_one_cycle_are_read_in_order_and_an_unknown_one_is_degraded():
    node = Node()
    node.tick()
    for code in (13, 999):
        node.nvml.xid(2, code)
    snapshot = node.tick()
    assert in_state(snapshot, 2, "degraded")
    health = status_health(snapshot, 2)
    assert health["last_xid"]["code"] == 999 and "catalogue" in health["action"]


def test_a_gpu_off_the_bus_needs_a_reboot_until_it_is_back():
    node = Node(retry_interval=30)
    node.tick()
    node.nvml.lose(3)  # Xid 79, then every call fails
    snapshot = node.tick()
    assert in_state(snapshot, 3, "reboot_required")
    health = status_health(snapshot, 3)
    assert health["last_xid"]["code"] == 79 and "reboot" in health["action"]
    assert any(n.startswith("GPU 3: lost") and "reboot_required" in n for n in snapshot.status["notes"])
    node.nvml.gpus[3].lost = False  # back on the bus: NVML re-initialised finds it
    snapshot = node.tick(30)
    assert snapshot.readings.gpus[3].up
    assert in_state(snapshot, 3, "healthy")


def test_a_gpu_lost_with_reset_required_needs_a_reset():
    node = Node()
    node.tick()
    node.nvml.gpus[0].fail_all = pynvml.NVML_ERROR_RESET_REQUIRED
    snapshot = node.tick()
    assert not snapshot.readings.gpus[0].up
    assert in_state(snapshot, 0, "reset_required")


def test_a_failed_row_remap_needs_inspection_while_the_driver_says_so():
    node = Node()
    node.tick()
    node.nvml.gpus[2].health[fake.REMAP_FAILED] = 1
    snapshot = node.tick()
    assert in_state(snapshot, 2, "inspection_required")
    assert status_health(snapshot, 2)["reason"] == "row remap failed"


async def test_the_status_api_carries_each_gpus_health(aiohttp_client):
    nvml = fake.node(fake.h100, count=2)
    source = GpuSource(nvml, interval=0.05)
    service = build_service(validate({}), [source])
    client = await aiohttp_client(create_app(service))
    state = service.scheduler.states["gpu"]
    await wait_for(lambda: state.cycles >= 1, what="the first cycle, which registers the Xid event sets")
    nvml.xid(1, 74)

    async def gpu_health():
        status = await (await client.get("/api/v1/status")).json()
        gpu = next(s for s in status["sources"] if s["source"] == "gpu")
        return {g["index"]: g["health"] for g in gpu["status"]["gpus"]}

    seen = {}

    async def reset_required():
        seen.update(await gpu_health())
        return seen[1]["state"] == "reset_required"

    await wait_for(reset_required, what="GPU 1's Xid 74 in the status")
    assert seen[1]["last_xid"]["code"] == 74 and seen[1]["last_xid"]["mnemonic"] == "NVLINK_ERROR"
    assert seen[0]["state"] == "healthy" and seen[0]["last_xid"] is None
    body = await (await client.get("/metrics")).text()
    assert 'mfu_gpu_health{gpu="1",state="reset_required"} 1.0' in body
