"""The GPU source against the fake pynvml module: healthy and mixed nodes, every fault NVML reports, exact metrics."""

import logging
import subprocess

import pynvml
import pytest

from mfu_exporter.config import typed_config, validate
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.model.readings import GpuInfo
from mfu_exporter.node import gpm as gpm_module
from mfu_exporter.node import nvml_fields as fields_module
from mfu_exporter.node.nvml_fields import NVLINK_READ_INTERVAL, decode_throttle_reasons
from mfu_exporter.node.nvml_gpus import MIG_READ_INTERVAL
from mfu_exporter.service import build_service
from mfu_exporter.sim import nvml as fake
from mfu_exporter.sources.base import SourceContext, SourceUnavailable
from mfu_exporter.sources.gpu import GpuSource
from mfu_exporter.web.app import create_app
from tests.support import expo
from tests.support.tools import require_tool
from tests.support.wait import wait_for

# The calls whose figures the field values give where the driver answers the fields.
FIGURE_CALLS = (
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTotalEccErrors",
)
H100_PEAK = 989.4e12
A100_PEAK = 312e12
L40S_PEAK = 362e12


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class Node:
    """A fake NVML, a source on it, and a monotonic clock the test advances."""

    def __init__(self, nvml, **source_kwargs):
        self.nvml = nvml
        self.clock = Clock()
        self.source = GpuSource(nvml, monotonic=self.clock, **source_kwargs)

    def tick(self, seconds=1.0):
        self.nvml.advance(seconds)
        self.clock.now += seconds
        return self.source.sample()


def h100_node(count=8, **source_kwargs):
    return Node(fake.node(fake.h100, count=count), **source_kwargs)


def exposition(snapshot):
    """The snapshot's families as /metrics text and as {(sample name, sorted labels): value}."""
    text = expo.exposition(snapshot)
    return text, expo.samples(text)


def gpu(index, **labels):
    return tuple(sorted({"gpu": str(index), **labels}.items()))


def series_of(values, name):
    return {labels: value for (sample, labels), value in values.items() if sample == name}


PER_GPU_SERIES = {
    "mfu_gpu_up",
    "mfu_gpu_utilization_ratio",
    "mfu_gpu_memory_utilization_ratio",
    "mfu_gpu_memory_used_bytes",
    "mfu_gpu_memory_total_bytes",
    "mfu_gpu_sm_clock_hertz",
    "mfu_gpu_sm_clock_max_hertz",
    "mfu_gpu_power_watts",
    "mfu_gpu_power_limit_watts",
    "mfu_gpu_energy_joules_total",
    "mfu_gpu_temperature_celsius",
    "mfu_gpu_tensor_active_ratio",
    "mfu_gpu_sm_active_ratio",
    "mfu_gpu_sm_occupancy_ratio",
    "mfu_gpu_dram_active_ratio",
    "mfu_gpu_hardware_flops_utilization_ratio",
    "mfu_gpu_nvlink_transmit_bytes_total",
    "mfu_gpu_nvlink_receive_bytes_total",
    "mfu_gpu_pcie_transmit_bytes_total",
    "mfu_gpu_pcie_receive_bytes_total",
}


def busy(gpu_, tensor=55.0):
    gpu_.utilization, gpu_.memory_utilization = 97, 40
    gpu_.memory_used = 70 * 1024**3
    gpu_.sm_clock_mhz = 1830
    gpu_.power_mw, gpu_.energy_mj = 650_500, 1_000_000
    gpu_.temperature_c = 71
    gpu_.clocks_event_reasons = 0x4  # sw power cap
    gpu_.nvlink_tx_rate, gpu_.nvlink_rx_rate = 200e9, 190e9
    gpu_.pcie_tx_rate, gpu_.pcie_rx_rate = 2 * fake.MIB * 1000, fake.MIB * 1000
    gpu_.set_activity(tensor, sm=90, occupancy=45, dram=35)


def test_eight_healthy_h100s_export_every_series_in_base_units():
    node = h100_node()
    for g in node.nvml.gpus:
        busy(g)
    node.source.sample()
    snapshot = node.tick(1.0)
    _, values = exposition(snapshot)
    for name in PER_GPU_SERIES:
        assert set(series_of(values, name)) == {gpu(i) for i in range(8)}, name
    one = gpu(0)
    assert values[("mfu_gpu_up", one)] == 1
    assert values[("mfu_gpu_utilization_ratio", one)] == pytest.approx(0.97)
    assert values[("mfu_gpu_memory_utilization_ratio", one)] == pytest.approx(0.40)
    assert values[("mfu_gpu_memory_used_bytes", one)] == 70 * 1024**3
    assert values[("mfu_gpu_memory_total_bytes", one)] == 80 * 1024**3
    assert values[("mfu_gpu_sm_clock_hertz", one)] == 1830e6
    assert values[("mfu_gpu_sm_clock_max_hertz", one)] == 1980e6
    assert values[("mfu_gpu_power_watts", one)] == pytest.approx(650.5)
    assert values[("mfu_gpu_power_limit_watts", one)] == 700
    assert values[("mfu_gpu_energy_joules_total", one)] == pytest.approx(1000 + 650.5)  # 1 s at 650.5 W after 1000 J
    assert values[("mfu_gpu_temperature_celsius", one)] == 71
    assert values[("mfu_gpu_tensor_active_ratio", one)] == pytest.approx(0.55)
    assert values[("mfu_gpu_sm_active_ratio", one)] == pytest.approx(0.90)
    assert values[("mfu_gpu_sm_occupancy_ratio", one)] == pytest.approx(0.45)
    assert values[("mfu_gpu_dram_active_ratio", one)] == pytest.approx(0.35)
    # tensor active × SM clock ÷ the H100's 1830 MHz reference clock
    assert values[("mfu_gpu_hardware_flops_utilization_ratio", one)] == pytest.approx(0.55)
    assert values[("mfu_gpu_nvlink_transmit_bytes_total", one)] == pytest.approx(200e9, rel=1e-6)
    assert values[("mfu_gpu_nvlink_receive_bytes_total", one)] == pytest.approx(190e9, rel=1e-6)
    # Hopper has no PCIe byte fields: GPM's MiB/s rates integrated over the 1 s between the two GPM samples
    assert values[("mfu_gpu_pcie_transmit_bytes_total", one)] == pytest.approx(2 * fake.MIB * 1000)
    assert values[("mfu_gpu_pcie_receive_bytes_total", one)] == pytest.approx(fake.MIB * 1000)
    assert values[("mfu_gpu_peak_flops", gpu(0, dtype="bf16"))] == pytest.approx(H100_PEAK)
    assert values[("mfu_gpu_peak_flops", gpu(0, dtype="fp8"))] == pytest.approx(1978.9e12)
    assert values[("mfu_gpu_ecc_errors_total", gpu(0, kind="corrected"))] == 0
    assert values[("mfu_gpu_ecc_errors_total", gpu(0, kind="uncorrected"))] == 0
    assert values[("mfu_gpu_throttle_active", gpu(0, reason="sw_power_cap"))] == 1
    assert values[("mfu_gpu_throttle_active", gpu(0, reason="idle"))] == 0
    info = fake.h100(0)
    assert values[("mfu_gpu_info", gpu(0, uuid=info.uuid, name=info.name, pci_bus_id=info.pci_bus_id))] == 1
    assert (
        values[("mfu_exporter_driver_info", (("cuda_driver_version", "12.8"), ("driver_version", "570.133.20")))] == 1
    )
    assert snapshot.errors == {}
    assert snapshot.status["notes"] == []
    assert snapshot.readings.inventory == [GpuInfo(i, fake.h100(i).uuid, "NVIDIA H100 80GB HBM3") for i in range(8)]
    reading = snapshot.readings.gpus[0]
    assert reading.up is True and reading.xid_count == 0 and reading.throttle_reasons == ("sw_power_cap",)
    assert reading.pci_bus_id == info.pci_bus_id  # what places the GPU near its NICs, for the attribution
    assert (
        reading.utilization,
        reading.tensor_active,
        reading.sm_clock_hz,
        reading.temperature,
    ) == pytest.approx((0.97, 0.55, 1830e6, 71))
    shown = snapshot.status["gpus"][0]  # what the status page draws
    assert (shown["up"], shown["gpm"], shown["throttle"]) == (True, "active", ["sw_power_cap"])
    assert (
        shown["utilization"],
        shown["tensor_active"],
        shown["sm_clock_hz"],
        shown["temperature_celsius"],
        shown["power_watts"],
    ) == pytest.approx((0.97, 0.55, 1830e6, 71, 650.5))


def test_handles_event_sets_and_gpm_samples_are_opened_once():
    node = h100_node()
    for _ in range(5):
        node.tick()
    calls = node.nvml.calls
    assert calls["nvmlInit"] == 1
    assert calls["nvmlDeviceGetHandleByIndex"] == 8
    assert calls["nvmlDeviceGetName"] == 8 and calls["nvmlDeviceGetPciInfo"] == 8
    assert calls["nvmlEventSetCreate"] == 8
    assert calls["nvmlGpmSampleAlloc"] == 16 and node.nvml.live_gpm_samples == 16
    assert calls["nvmlGpmMetricsGet"] == 4 * 8  # the first cycle opened GPM: its first sample was only just taken
    # One field-values call per GPU and cycle (byte counters, throttle time and NVLink errors together), plus one per
    # GPU at open for its NVLink link count; the PCIe fields H100 refused on the first cycle are not asked again.
    assert calls["nvmlDeviceGetFieldValues"] == 5 * 8 + 8


def test_nvlink_counters_are_summed_over_all_links_not_link_zero():
    node = h100_node(count=1)
    node.nvml.gpus[0].nvlink_tx_bytes = 18 * 1024 * 1000  # 1000 KiB on each of 18 links
    _, values = exposition(node.tick())
    assert values[("mfu_gpu_nvlink_transmit_bytes_total", gpu(0))] == 18 * 1024 * 1000


def test_blackwell_pcie_bytes_come_from_nvml_fields_not_gpm():
    node = Node(fake.node(fake.b200(0)))
    node.nvml.gpus[0].pcie_tx_bytes = 123_456_789
    node.source.sample()
    _, values = exposition(node.tick())
    assert values[("mfu_gpu_pcie_transmit_bytes_total", gpu(0))] == 123_456_789
    assert node.source.reader.by_uuid[fake.b200(0).uuid].gpm.keys == (
        "tensor_active",
        "sm_active",
        "sm_occupancy",
        "dram_active",
    )


def test_field_ids_the_driver_does_not_know_are_absent_not_errors():
    node = Node(
        fake.node(fake.h100(0, field_errors={197: pynvml.NVML_ERROR_INVALID_ARGUMENT, 138: pynvml.NVML_ERROR_TIMEOUT}))
    )
    first = node.tick()
    assert first.errors == {"nvml_timeout": 1}  # a passing failure: counted, asked again
    node.tick()
    snapshot = node.tick()
    assert snapshot.errors == {"nvml_timeout": 1}
    assert snapshot.status["gpus"][0]["unsupported"]["pcie_transmit_bytes"] == "Invalid Argument"
    assert gpm_module.GPM_RATES["pcie_transmit_bytes"] in [
        node.source.reader.by_uuid[fake.h100(0).uuid].gpm.request.metrics[i].metricId for i in range(6)
    ]


def test_mixed_node_series_peaks_and_notes():
    nvml = fake.node(fake.h100(0), fake.h100(1), fake.a100(2), fake.l40s(3))
    node = Node(nvml)
    node.source.sample()
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert set(series_of(values, "mfu_gpu_tensor_active_ratio")) == {gpu(0), gpu(1)}  # GPM: Hopper only
    assert set(series_of(values, "mfu_gpu_utilization_ratio")) == {gpu(i) for i in range(4)}
    assert set(series_of(values, "mfu_gpu_nvlink_transmit_bytes_total")) == {gpu(0), gpu(1), gpu(2)}  # L40S: PCIe only
    assert set(series_of(values, "mfu_gpu_pcie_transmit_bytes_total")) == {gpu(0), gpu(1)}  # from GPM rates
    assert values[("mfu_gpu_peak_flops", gpu(2, dtype="bf16"))] == pytest.approx(A100_PEAK)
    assert values[("mfu_gpu_peak_flops", gpu(3, dtype="bf16"))] == pytest.approx(L40S_PEAK)
    assert [g.name for g in snapshot.readings.inventory] == ["NVIDIA H100 80GB HBM3"] * 2 + [
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA L40S",
    ]
    assert (
        "GPUs 2, 3: no tensor/SM/DRAM activity series: GPM not supported by this GPU (NVML GPM needs Hopper or newer)"
        in snapshot.status["notes"]
    )
    assert snapshot.readings.gpus[3].tensor_active is None
    assert snapshot.errors == {}


def mixed_jobs(inventory):
    def job(**facts):
        return {"params": 70e9, **facts}

    configured = {
        "all": job(),
        "three": job(gpus=3),
        "picked": job(gpus=[1, fake.l40s(3).uuid]),
        "fp8": job(dtype="fp8"),
    }
    return JobTracker(configured=configured, window=60, gpu_inventory=inventory, clock=Clock(1e9))


def test_mixed_node_jobs_sum_the_peak_of_their_own_gpus():
    nvml = fake.node(fake.h100(0), fake.h100(1), fake.a100(2), fake.l40s(3))
    node = Node(nvml, retry_interval=30)
    snapshot = node.tick()
    jobs = mixed_jobs(lambda: snapshot.readings.inventory)
    for name in ("all", "three", "picked", "fp8"):
        jobs.report(parse_progress({"job": name, "tokens_total": 0}, 1e9))
    views = {v.name: v for v in jobs.views()}
    assert views["all"].peak_flops == pytest.approx(2 * H100_PEAK + A100_PEAK + L40S_PEAK)
    assert views["all"].gpu_indices == [0, 1, 2, 3]
    assert views["three"].peak_flops == pytest.approx(2 * H100_PEAK + A100_PEAK)
    assert views["picked"].peak_flops == pytest.approx(H100_PEAK + L40S_PEAK)
    assert views["picked"].gpu_indices == [1, 3]
    assert views["fp8"].peak_flops is None and "A100" in views["fp8"].reason  # the A100 has no FP8 peak

    nvml.lose(2)  # a lost GPU stays in the inventory, so the job's peak does not jump
    snapshot = node.tick()
    views = {v.name: v for v in jobs.views()}
    assert views["all"].peak_flops == pytest.approx(2 * H100_PEAK + A100_PEAK + L40S_PEAK)
    assert views["three"].gpu_indices == [0, 1, 2]


def test_no_nvml_library_reports_down_logs_once_and_retries_slowly(caplog):
    nvml = fake.FakeNvml([fake.h100(0)], library_present=False)
    config = validate({"sources": {"gpu": {"retry_interval": "2m"}}})
    source = GpuSource.from_config(typed_config(config).sources.gpu, SourceContext(config, nvml=nvml))
    caplog.set_level(logging.INFO, logger="mfu_exporter.node.nvml_gpus")
    for _ in range(3):
        with pytest.raises(SourceUnavailable) as raised:
            source.sample()
        assert raised.value.reason == "library_not_found"
        assert raised.value.retry_after == 120
    assert [r.getMessage() for r in caplog.records] == [
        "no GPU metrics: NVML library libnvidia-ml.so.1 not found; retrying every 120s"
    ]
    nvml.library_present = True  # the driver got installed: the next retry works
    assert source.sample().readings.inventory[0].uuid == fake.h100(0).uuid


def test_real_pynvml_without_a_driver_is_library_not_found():
    source = GpuSource(pynvml)
    try:
        with pytest.raises(SourceUnavailable) as raised:
            source.sample()
    finally:
        source.close()
    assert raised.value.reason in ("library_not_found", "driver_not_loaded")


@pytest.mark.parametrize(
    "code,reason",
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission"),
        (pynvml.NVML_ERROR_IRQ_ISSUE, "nvml_init_failed"),
    ],
)
def test_init_failures_name_their_reason(code, reason):
    with pytest.raises(SourceUnavailable) as raised:
        GpuSource(fake.FakeNvml([fake.h100(0)], init_error=code), retry_interval=60).sample()
    assert raised.value.reason == reason and raised.value.retry_after == 60


def test_unsupported_call_drops_that_series_on_that_gpu_only_and_is_not_retried():
    node = h100_node(count=4)
    node.nvml.gpus[0].clocks_event_reasons = 0
    node.nvml.gpus[1].fail["nvmlDeviceGetClockInfo"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    node.nvml.gpus[2].fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    for _ in range(3):
        snapshot = node.tick()
    _, values = exposition(snapshot)
    assert set(series_of(values, "mfu_gpu_sm_clock_hertz")) == {gpu(0), gpu(2), gpu(3)}
    assert set(series_of(values, "mfu_gpu_temperature_celsius")) == {gpu(0), gpu(1), gpu(3)}
    assert node.nvml.calls["nvmlDeviceGetClockInfo"] == 3 * 3 + 1  # GPU 1 asked once
    assert snapshot.errors == {}  # not an error: a fact about this GPU model
    assert snapshot.status["gpus"][1]["unsupported"]["sm_clock"] == "Not Supported"
    assert "sm_clock" not in snapshot.status["gpus"][0]["unsupported"]


def test_the_figures_with_a_field_id_come_in_one_field_values_call_per_gpu_and_sample():
    """Power, power limit, energy and the ECC counts are fields of the one request a GPU gets per sample, beside the
    byte and throttle-time counters: none of their calls is made where the driver answers the fields."""
    node = h100_node(count=2)
    for g in node.nvml.gpus:
        busy(g)
        g.ecc_corrected, g.ecc_uncorrected = 12, 1
    node.tick()
    node.nvml.calls.clear()
    _, values = exposition(node.tick())
    assert node.nvml.calls["nvmlDeviceGetFieldValues"] == 2
    for call in FIGURE_CALLS:
        assert call not in node.nvml.calls, call
    assert values[("mfu_gpu_power_watts", gpu(1))] == pytest.approx(650.5)
    assert values[("mfu_gpu_power_limit_watts", gpu(1))] == 700
    assert values[("mfu_gpu_energy_joules_total", gpu(1))] == pytest.approx(1000 + 2 * 650.5)
    assert values[("mfu_gpu_ecc_errors_total", gpu(1, kind="corrected"))] == 12
    assert values[("mfu_gpu_ecc_errors_total", gpu(1, kind="uncorrected"))] == 1


def test_a_field_a_gpu_does_not_answer_falls_back_to_its_call_once_and_for_good():
    """An A100 has no averaged power field: its power comes from nvmlDeviceGetPowerUsage, the field is not asked
    again. A GPU that answers neither the field nor the call (ECC off) has no series and is asked neither again."""
    nvml = fake.node(fake.h100(0), fake.a100(1))
    nvml.gpus[0].fields -= {3}
    nvml.gpus[0].fail["nvmlDeviceGetTotalEccErrors"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    node = Node(nvml)
    asked: dict[int, list[bool]] = {0: [], 1: []}  # GPU -> whether each of its requests asked for the power field
    real = nvml.nvmlDeviceGetFieldValues

    def fields(handle, request):
        asked[nvml.gpus.index(handle.gpu)].append(any(field_id == 185 for field_id, _ in request))
        return real(handle, request)

    nvml.nvmlDeviceGetFieldValues = fields
    for _ in range(3):
        snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_power_watts", gpu(1))] == 70  # the A100's, from the call
    assert values[("mfu_gpu_power_watts", gpu(0))] == 70  # the H100's, from the field
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 3  # the A100 each sample, the H100 never
    # Each GPU's first request is its NVLink link count, asked when it is opened; then the A100 is asked once.
    assert asked == {0: [False, True, True, True], 1: [False, True, False, False]}
    assert gpu(0, kind="corrected") not in series_of(values, "mfu_gpu_ecc_errors_total")
    assert values[("mfu_gpu_ecc_errors_total", gpu(0, kind="uncorrected"))] == 0  # the other count still a field
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 1  # the H100's corrected count, asked once
    status = snapshot.status["gpus"]
    assert status[1]["unsupported"]["field:power_watts"] == "Not Supported"
    assert set(status[0]["unsupported"]) >= {"field:ecc_corrected", "ecc_corrected"}
    assert snapshot.errors == {}


def test_a_driver_without_field_values_gives_every_figure_from_its_call():
    nvml = fake.node(fake.h100, count=1)
    nvml.gpus[0].fail["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    node = Node(nvml)
    node.tick()
    _, values = exposition(node.tick())
    assert values[("mfu_gpu_power_watts", gpu(0))] == 70
    assert values[("mfu_gpu_power_limit_watts", gpu(0))] == 700
    assert ("mfu_gpu_energy_joules_total", gpu(0)) in values
    assert values[("mfu_gpu_ecc_errors_total", gpu(0, kind="corrected"))] == 0
    assert all(nvml.calls[call] == 2 for call in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"))


def test_passing_call_failure_is_counted_and_retried_next_cycle():
    node = h100_node(count=2)
    node.nvml.gpus[0].fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_TIMEOUT
    snapshot = node.tick()
    assert snapshot.errors == {"nvml_timeout": 1}
    assert set(series_of(exposition(snapshot)[1], "mfu_gpu_temperature_celsius")) == {gpu(1)}
    del node.nvml.gpus[0].fail["nvmlDeviceGetTemperature"]
    assert set(series_of(exposition(node.tick())[1], "mfu_gpu_temperature_celsius")) == {gpu(0), gpu(1)}


def lose_by_unknown(nvml, index):
    # Every call answers UNKNOWN, as when a container lost access to the GPU: one call's UNKNOWN is not a loss.
    nvml.gpus[index].fail_all = pynvml.NVML_ERROR_UNKNOWN


def lose_by_falling_off_the_bus(nvml, index):
    nvml.lose(index)


@pytest.mark.parametrize("lose", [lose_by_falling_off_the_bus, lose_by_unknown])
def test_lost_gpu_goes_down_alone_and_comes_back_after_reinit(lose):
    node = h100_node(count=4, retry_interval=30)
    node.tick()
    lose(node.nvml, 2)
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_up", gpu(2))] == 0
    assert {values[("mfu_gpu_up", gpu(i))] for i in (0, 1, 3)} == {1}
    for name in PER_GPU_SERIES - {
        "mfu_gpu_up",
        "mfu_gpu_pcie_transmit_bytes_total",
        "mfu_gpu_pcie_receive_bytes_total",
    }:
        assert set(series_of(values, name)) == {gpu(0), gpu(1), gpu(3)}, name
    assert gpu(2, dtype="bf16") not in series_of(values, "mfu_gpu_peak_flops")
    assert (
        "mfu_gpu_info",
        gpu(2, uuid=fake.h100(2).uuid, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:3A:00.0"),
    ) in values
    assert snapshot.errors["gpu_lost"] == 1
    assert len(snapshot.readings.inventory) == 4
    assert snapshot.readings.gpus[2].up is False
    assert any(note.startswith("GPU 2: lost") for note in snapshot.status["notes"])

    assert node.tick(10).errors == {}  # counted once per loss, not every cycle
    inits = node.nvml.calls["nvmlInit"]
    snapshot = node.tick(25)  # retry_interval after the loss: NVML re-initialised, GPU 2 still gone
    assert node.nvml.calls["nvmlInit"] == inits + 1
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_up", gpu(2))] == 0
    # Real NVML keeps the failing GPU at its index: it is the same lost GPU, not counted again, listed once.
    assert snapshot.errors == {}
    assert [note for note in snapshot.status["notes"] if "2" in note.split(":")[0]] == [
        note for note in snapshot.status["notes"] if note.startswith("GPU 2: lost")
    ]
    assert not any(note.startswith("cannot open") for note in snapshot.status["notes"])
    assert snapshot.readings.gpus[3].uuid == fake.h100(3).uuid and snapshot.readings.gpus[3].up is True

    node.nvml.gpus[2].lost = False  # back on the bus
    node.nvml.gpus[2].fail_all = None
    node.tick(10)
    snapshot = node.tick(25)
    _, values = exposition(snapshot)
    assert {values[("mfu_gpu_up", gpu(i))] for i in range(4)} == {1}
    assert snapshot.readings.gpus[2].uuid == fake.h100(2).uuid
    assert node.nvml.live_gpm_samples == 8  # the samples of the old session were freed
    assert node.tick(100).status["notes"] == []
    assert node.nvml.calls["nvmlInit"] == inits + 2  # nothing missing: no more re-initialisation


def test_gpu_lost_at_startup_is_counted_and_looked_for_again():
    nvml = fake.node(fake.h100, count=3)
    nvml.gpus[1].fail["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_GPU_IS_LOST
    node = Node(nvml, retry_interval=30)
    snapshot = node.tick()
    assert snapshot.errors["gpu_lost"] == 1
    assert [g.index for g in snapshot.readings.inventory] == [0, 2]
    assert "cannot open NVML index 1: GPU is lost" in snapshot.status["notes"]
    del nvml.gpus[1].fail["nvmlDeviceGetUUID"]
    snapshot = node.tick(31)
    assert [g.index for g in snapshot.readings.inventory] == [0, 1, 2]


def test_xid_events_are_counted_once_each_including_the_one_a_lost_gpu_leaves():
    node = h100_node(count=4)
    node.tick()
    for code in (13, 13, 31):
        node.nvml.xid(1, code)
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert series_of(values, "mfu_gpu_xid_errors_total") == {gpu(1, xid="13"): 2, gpu(1, xid="31"): 1}
    assert snapshot.readings.gpus[1].xid_count == 3
    _, values = exposition(node.tick())
    assert series_of(values, "mfu_gpu_xid_errors_total") == {gpu(1, xid="13"): 2, gpu(1, xid="31"): 1}
    node.nvml.lose(3)
    _, values = exposition(node.tick())
    assert values[("mfu_gpu_xid_errors_total", gpu(3, xid="79"))] == 1  # fell off the bus, and still says so


def test_reinit_for_a_lost_gpu_costs_the_healthy_gpu_no_activity_and_no_xid():
    node = h100_node(count=2, retry_interval=30)
    healthy = node.nvml.gpus[0]
    busy(healthy)
    node.tick()
    node.nvml.lose(1)
    node.tick(5)  # GPU 1 is lost: NVML is re-initialised 30 s from now
    inits = node.nvml.calls["nvmlInit"]
    pcie_rate = healthy.pcie_tx_rate
    pcie_before = exposition(node.tick(5))[1][("mfu_gpu_pcie_transmit_bytes_total", gpu(0))]
    for step, tensor in enumerate(
        (50.0, 60.0, 70.0, 80.0), start=1
    ):  # the third step, 30 s after the loss, re-initialises
        healthy.set_activity(tensor)
        if step == 3:
            node.nvml.xid(0, 31)  # queued in the old session's event set, which the re-initialisation frees
        snapshot = node.tick(10)
        _, values = exposition(snapshot)
        assert values[("mfu_gpu_tensor_active_ratio", gpu(0))] == pytest.approx(tensor / 100), step
        assert values[("mfu_gpu_hardware_flops_utilization_ratio", gpu(0))] == pytest.approx(tensor / 100), step
        # GPM's PCIe rate integrated over every interval, the one the re-initialisation closed included
        pcie = values[("mfu_gpu_pcie_transmit_bytes_total", gpu(0))]
        assert pcie - pcie_before == pytest.approx(pcie_rate * 10), step
        pcie_before = pcie
        assert values[("mfu_gpu_up", gpu(1))] == 0
    assert node.nvml.calls["nvmlInit"] == inits + 1
    assert values[("mfu_gpu_xid_errors_total", gpu(0, xid="31"))] == 1
    assert values[("mfu_gpu_xid_errors_total", gpu(1, xid="79"))] == 1
    assert node.nvml.live_gpm_samples == 2  # the old session's samples were freed


def test_throttle_bitmask_decoding():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(0x1FF) == [
        "idle",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake",
    ]
    assert dict(fields_module.THROTTLE_REASONS) == {
        "idle": pynvml.nvmlClocksEventReasonGpuIdle,
        "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
        "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
        "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
        "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
        "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    }
    node = h100_node(count=1)
    node.nvml.gpus[0].clocks_event_reasons = 0x8 | 0x80 | 0x100  # display clock: not a reason we export
    snapshot = node.tick()
    throttle = series_of(exposition(snapshot)[1], "mfu_gpu_throttle_active")
    assert {dict(k)["reason"] for k, v in throttle.items() if v == 1} == {"hw_slowdown", "hw_power_brake"}
    assert len(throttle) == 7
    assert snapshot.readings.gpus[0].throttle_reasons == ("hw_slowdown", "hw_power_brake")


def test_old_driver_without_clocks_event_reasons_falls_back_to_throttle_reasons():
    node = h100_node(count=1)
    node.nvml.gpus[0].fail["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    node.nvml.gpus[0].clocks_event_reasons = 0x20
    node.tick()
    assert node.tick().readings.gpus[0].throttle_reasons == ("sw_thermal_slowdown",)
    assert node.nvml.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1


def test_nvml_ids_match_the_real_module():
    assert dict(gpm_module.GPM_ACTIVITY) == {
        "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
        "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    }
    assert gpm_module.GPM_RATES == {
        "pcie_transmit_bytes": pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        "pcie_receive_bytes": pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        "nvlink_transmit_bytes": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        "nvlink_receive_bytes": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    }
    assert [spec[1] for spec in fields_module.FIELD_COUNTERS] == [
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    ]


def test_gpm_samples_stay_at_least_100ms_apart():
    node = h100_node(count=1)
    node.source.sample()  # the first GPM sample was taken when the GPU was opened, just now
    assert node.nvml.calls["nvmlGpmMetricsGet"] == 0
    node.nvml.gpus[0].set_activity(40)
    snapshot = node.tick(0.5)
    assert snapshot.readings.gpus[0].tensor_active == pytest.approx(0.40)
    node.nvml.gpus[0].set_activity(80)
    snapshot = node.tick(0.05)  # too soon for a new GPM sample: the last values stand
    assert node.nvml.calls["nvmlGpmMetricsGet"] == 1
    assert snapshot.readings.gpus[0].tensor_active == pytest.approx(0.40)
    assert node.tick(0.06).readings.gpus[0].tensor_active == pytest.approx(0.80)


def test_gpm_metric_a_gpu_lacks_is_absent_and_dropped_from_the_request():
    node = h100_node(count=1)
    del node.nvml.gpus[0].gpm[pynvml.NVML_GPM_METRIC_SM_OCCUPANCY]
    node.source.sample()
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert ("mfu_gpu_sm_occupancy_ratio", gpu(0)) not in values
    assert ("mfu_gpu_tensor_active_ratio", gpu(0)) in values
    node.tick()
    assert "sm_occupancy" not in node.source.reader.by_uuid[fake.h100(0).uuid].gpm.keys


def test_gpm_off_in_config():
    node = Node(fake.node(fake.h100, count=2), gpm=False)
    node.source.sample()
    snapshot = node.tick()
    assert not series_of(exposition(snapshot)[1], "mfu_gpu_tensor_active_ratio")
    assert node.nvml.calls["nvmlGpmSampleAlloc"] == 0
    assert (
        "GPUs 0, 1: no tensor/SM/DRAM activity series: GPM off (sources.gpu.gpm is false)" in snapshot.status["notes"]
    )
    assert validate({"sources": {"gpu": {"gpm": False}}})["sources"]["gpu"]["gpm"] is False


def test_mig_gpu_reports_identity_and_what_works_and_says_why():
    nvml = fake.node(fake.h100(0), fake.h100(1, mig_mode=1))
    node = Node(nvml)
    node.source.sample()
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert set(series_of(values, "mfu_gpu_utilization_ratio")) == {gpu(0)}
    assert set(series_of(values, "mfu_gpu_tensor_active_ratio")) == {gpu(0)}
    for name in (
        "mfu_gpu_memory_used_bytes",
        "mfu_gpu_power_watts",
        "mfu_gpu_sm_clock_hertz",
        "mfu_gpu_temperature_celsius",
    ):
        assert gpu(1) in series_of(values, name), name
    assert values[("mfu_gpu_up", gpu(1))] == 1
    assert snapshot.readings.gpus[1].mig is True and snapshot.readings.gpus[1].utilization is None
    assert any(note.startswith("GPU 1: in MIG mode") for note in snapshot.status["notes"])
    assert snapshot.errors == {}

    nvml.gpus[1].mig_mode = 0  # MIG disabled: utilization and GPM come back once the mode is read again
    calls = nvml.calls["nvmlDeviceGetMigMode"]
    assert node.tick().readings.gpus[1].mig is True  # the mode is read every MIG_READ_INTERVAL, not every sample
    assert nvml.calls["nvmlDeviceGetMigMode"] == calls
    node.tick(MIG_READ_INTERVAL)
    assert nvml.calls["nvmlDeviceGetMigMode"] == calls + 2  # both GPUs' modes, once
    snapshot = node.tick()
    assert snapshot.readings.gpus[1].utilization == 0.0
    assert snapshot.readings.gpus[1].tensor_active is not None
    assert snapshot.status["notes"] == []


def test_close_releases_everything():
    node = h100_node(count=2)
    node.tick()
    node.source.close()
    assert not node.nvml.initialized
    assert node.nvml.live_gpm_samples == 0
    assert node.nvml.calls["nvmlEventSetFree"] == 2


def test_snapshots_do_not_change_once_taken():
    node = h100_node(count=1)
    node.source.sample()  # registers the Xid event set: the driver delivers nothing raised before
    node.nvml.xid(0, 48)
    first = node.tick()
    before = exposition(first)[0]
    node.nvml.xid(0, 48)
    node.nvml.gpus[0].temperature_c = 90
    node.tick()
    assert exposition(first)[0] == before


async def test_metrics_pass_promtool(aiohttp_client):
    promtool = require_tool("promtool", "prometheus")
    nvml = fake.node(fake.h100(0), fake.a100(1), fake.l40s(2), fake.h100(3, mig_mode=1))
    source = GpuSource(nvml, interval=0.05)
    service = build_service(validate({}), [source])
    client = await aiohttp_client(create_app(service))
    state = service.scheduler.states["gpu"]
    await wait_for(lambda: state.cycles >= 1, what="the first cycle, which registers the Xid event sets")
    nvml.xid(0, 13)
    await wait_for(lambda: state.cycles >= 4, what="a few cycles more, so GPM has values and the Xid is read")
    body = await (await client.get("/metrics")).read()
    assert b"mfu_gpu_tensor_active_ratio" in body and b'mfu_gpu_xid_errors_total{gpu="0",xid="13"} 1.0' in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


async def test_hanging_nvml_call_leaves_metrics_answering_from_the_last_snapshot(aiohttp_client):
    nvml = fake.node(fake.h100, count=2)
    clock = Clock(1_800_000_000.0)
    source = GpuSource(nvml, interval=0.05, timeout=0.2)
    service = build_service(validate({}), [source], clock=clock)
    client = await aiohttp_client(create_app(service))
    state = service.scheduler.states["gpu"]

    async def scrape():
        return expo.samples(await (await client.get("/metrics")).text())

    await wait_for(lambda: state.up)
    release = nvml.hang("nvmlDeviceGetFieldValues")
    try:
        await wait_for(lambda: not state.up)
        assert state.reason == "timeout"
        values = await scrape()
        assert values[("mfu_exporter_source_up", (("source", "gpu"),))] == 0
        assert values[("mfu_gpu_power_watts", gpu(0))] == 70  # the last good snapshot
        assert values[("mfu_gpu_up", gpu(1))] == 1
        age = (await (await client.get("/api/v1/status")).json())["sources"][0]["sample_age_seconds"]
        clock.now += 30
        later = (await (await client.get("/api/v1/status")).json())["sources"][0]["sample_age_seconds"]
        assert later == pytest.approx(age + 30)
        assert not release.is_set()  # all of this while the NVML call was still blocked
    finally:
        release.set()
    await wait_for(lambda: state.up)


# --- throttle time and NVLink errors --------------------------------------------------------------------------------


def test_throttle_seconds_come_from_nvml_counters_in_nanoseconds():
    node = h100_node(count=2)
    node.nvml.gpus[0].clocks_event_reasons = 0x4  # power capped, as under training load
    for _ in range(3):
        snapshot = node.tick()
    _, values = exposition(snapshot)
    throttle = series_of(values, "mfu_gpu_throttle_seconds_total")
    assert throttle[gpu(0, reason="sw_power_cap")] == 3.0  # 3 s of 1e9 ns each, from field 74
    assert throttle[gpu(0, reason="hw_thermal_slowdown")] == 0.0
    assert len(throttle) == 2 * 4  # four reasons per GPU: the node's series budget
    assert snapshot.status["gpus"][0]["throttle_time_from"]["sw_power_cap"] == "field"


def test_throttle_seconds_integrate_the_bit_where_the_driver_has_no_counter():
    node = Node(fake.node(fake.l40s, count=1))  # no field values at all
    node.nvml.gpus[0].clocks_event_reasons = 0x20  # SW thermal slowdown
    for _ in range(4):
        snapshot = node.tick(0.5)
    _, values = exposition(snapshot)
    throttle = series_of(values, "mfu_gpu_throttle_seconds_total")
    # The first sample starts the integration; each later one adds the 0.5 s since the one before.
    assert throttle[gpu(0, reason="sw_thermal_slowdown")] == 1.5
    assert throttle[gpu(0, reason="sw_power_cap")] == 0.0
    assert snapshot.status["gpus"][0]["throttle_time_from"]["sw_thermal_slowdown"] == "samples"
    node.nvml.gpus[0].clocks_event_reasons = 0x1  # idle now: the counter stands
    _, values = exposition(node.tick(0.5))
    assert values[("mfu_gpu_throttle_seconds_total", gpu(0, reason="sw_thermal_slowdown"))] == 1.5


def test_the_throttle_share_is_the_counters_growth_over_the_time_since_the_last_read():
    """The share of each interval a reason held the clock down: from the counters, whatever the state at the samples;
    an interval whose read failed adds its time to the next share instead of losing its throttle time."""
    node = h100_node(count=1)
    g = node.nvml.gpus[0]
    g.clocks_event_reasons = 0
    assert node.tick(5).readings.gpus[0].throttle_ratio == ()  # the first sample: no interval yet
    g.clocks_event_reasons = 0x40
    node.nvml.advance(2)  # 2 s of HW thermal slowdown, then none, all before the next sample
    node.clock.now += 2
    g.clocks_event_reasons = 0
    ratios = dict(node.tick(3).readings.gpus[0].throttle_ratio)
    assert ratios == {
        "sw_power_cap": 0.0,
        "sw_thermal_slowdown": 0.0,
        "hw_thermal_slowdown": 0.4,
        "hw_power_brake": 0.0,
    }
    g.fail["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_TIMEOUT
    g.clocks_event_reasons = 0x40
    assert node.tick(5).readings.gpus[0].throttle_ratio == ()  # not read: no share this time
    del g.fail["nvmlDeviceGetFieldValues"]
    g.clocks_event_reasons = 0
    assert dict(node.tick(5).readings.gpus[0].throttle_ratio)["hw_thermal_slowdown"] == 0.5  # 5 s of the last 10


def test_nvlink_errors_are_summed_over_links_and_kinds_per_gpu():
    nvml = fake.node(fake.h100(0), fake.a100(1), fake.l40s(2), fake.b200(3))
    nvml.gpus[0].nvlink_errors = {(38, 0): 5, (52, 17): 2}  # CRC flit on link 0, replay on link 17
    nvml.gpus[1].nvlink_errors = {(59, 11): 1}  # recovery on the A100's last link
    nvml.gpus[3].nvlink_errors = {(215, 3): 4, (38, 3): 99}  # B200: the newer counter (the older one it lacks)
    node = Node(nvml)
    node.tick()
    snapshot = node.tick()
    _, values = exposition(snapshot)
    errors = series_of(values, "mfu_gpu_nvlink_errors_total")
    assert errors == {gpu(0): 7.0, gpu(1): 1.0, gpu(3): 4.0}  # the L40S has no NVLink: no series
    status = snapshot.status["gpus"]
    assert status[0]["nvlink_errors"] == {"crc_flit": 5.0, "replay": 2.0, "crc_data": 0.0, "recovery": 0.0}
    assert status[3]["nvlink_errors"] == {"receive": 0.0, "link_integrity": 0.0, "link_recovery": 4.0}
    assert status[2]["unsupported"]["nvlink_errors"]
    nvml.gpus[0].nvlink_errors[(45, 3)] = 1  # a new CRC data error: the counter grows
    _, values = exposition(node.tick(NVLINK_READ_INTERVAL))
    assert values[("mfu_gpu_nvlink_errors_total", gpu(0))] == 8.0


def test_nvlink_errors_are_read_every_10_seconds_and_stand_between_reads():
    # 72 of an 18-link H100's 87 fields: a 1 s sample between two reads asks for the other 15 only (power, power
    # limit, energy, two ECC counts, two NVLink byte counters, four throttle times, and the 4 health fields).
    node = h100_node(count=1)
    node.tick()
    node.tick()  # planned again (the fake H100 lacks the PCIe byte fields): NVLink read again, the plan settled
    asked = []
    real = node.nvml.nvmlDeviceGetFieldValues
    node.nvml.nvmlDeviceGetFieldValues = lambda handle, request: asked.append(len(request)) or real(handle, request)
    node.nvml.gpus[0].nvlink_errors = {(38, 4): 3}
    for _ in range(int(NVLINK_READ_INTERVAL) - 1):
        _, values = exposition(node.tick())
        assert values[("mfu_gpu_nvlink_errors_total", gpu(0))] == 0.0  # the last read's total stands, still a series
    _, values = exposition(node.tick())
    assert values[("mfu_gpu_nvlink_errors_total", gpu(0))] == 3.0  # 10 s after the last read: read again
    assert asked == [15] * (int(NVLINK_READ_INTERVAL) - 1) + [87]


def test_an_unknown_error_on_one_field_degrades_that_series_only(caplog):
    node = h100_node(count=1)
    node.nvml.gpus[0].clocks_event_reasons = 0x4
    node.tick()
    node.nvml.gpus[0].field_errors[74] = pynvml.NVML_ERROR_UNKNOWN
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_up", gpu(0))] == 1  # not lost
    assert snapshot.errors["nvml_unknown"] == 1
    assert values[("mfu_gpu_nvlink_errors_total", gpu(0))] == 0.0
    # The counter keeps its last value through the failing cycle (never absent, never backwards).
    assert values[("mfu_gpu_throttle_seconds_total", gpu(0, reason="sw_power_cap"))] == 1.0
    del node.nvml.gpus[0].field_errors[74]
    _, values = exposition(node.tick())
    assert values[("mfu_gpu_throttle_seconds_total", gpu(0, reason="sw_power_cap"))] == 3.0


def test_throttle_time_and_nvlink_errors_are_at_most_40_series_on_an_8_gpu_node():
    _, values = exposition(h100_node().tick())
    added = [k for k in values if k[0] in ("mfu_gpu_throttle_seconds_total", "mfu_gpu_nvlink_errors_total")]
    assert len(added) == 40


# --- what the real H200 showed (docs/benchmarks.md "On a real H200") ------------------------------------------------


def test_a_32_bit_pcie_field_is_not_exported_the_gpm_rate_is_integrated_instead():
    # The H200 answers fields 197/198 as UNSIGNED_INT: at PCIe Gen5 rates they wrap many times a second.
    node = Node(fake.node(fake.h200, count=1))
    fake_gpu = node.nvml.gpus[0]
    fake_gpu.pcie_tx_bytes = 5 * 2**32 + 100  # already wrapped five times
    fake_gpu.pcie_tx_rate = 10 * 2**20  # 10 MiB/s, which GPM reports
    node.tick()
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_pcie_transmit_bytes_total", gpu(0))] == pytest.approx(10 * 2**20)  # one second of GPM
    assert "32-bit" in snapshot.status["gpus"][0]["unsupported"]["pcie_transmit_bytes"]


def test_memory_used_leaves_out_what_the_driver_reserves():
    node = Node(fake.node(fake.h200, count=1))
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_memory_used_bytes", gpu(0))] == 0  # idle: v1 would say 615 MiB
    assert snapshot.status["gpus"][0]["memory_reserved_bytes"] == 644_939_776


def test_memory_falls_back_to_v1_on_a_driver_without_the_v2_call():
    node = h100_node(count=1)
    node.nvml.gpus[0].memory_used = 2**30
    original = node.nvml.nvmlDeviceGetMemoryInfo

    def v1_only(handle, version=None):
        if version:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return original(handle)

    node.nvml.nvmlDeviceGetMemoryInfo = v1_only
    _, values = exposition(node.tick())
    assert values[("mfu_gpu_memory_used_bytes", gpu(0))] == 2**30


def test_a_gpm_metric_answered_as_nan_is_left_out_not_exported():
    # The H200 answered DRAM_BW_UTIL = NaN with SUCCESS for samples 20 and 50 ms apart: nothing non-finite is served.
    node = h100_node(count=1)
    node.nvml.gpus[0].set_activity(40.0)
    node.nvml.gpus[0].gpm[pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL] = float("nan")
    node.tick()
    _, values = exposition(node.tick())
    assert ("mfu_gpu_dram_active_ratio", gpu(0)) not in values
    assert values[("mfu_gpu_tensor_active_ratio", gpu(0))] == pytest.approx(0.4)


# --- NVML's lifecycle as the real library has it --------------------------------------------------------------------


def test_one_call_answering_unknown_degrades_that_call_only():
    node = h100_node(count=2)
    node.tick()
    node.nvml.gpus[1].fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_up", gpu(1))] == 1  # the GPU still answers its UUID: not lost
    assert snapshot.errors == {"nvml_unknown": 1}
    assert set(series_of(values, "mfu_gpu_temperature_celsius")) == {gpu(0)}
    assert values[("mfu_gpu_power_watts", gpu(1))] == 70.0


def test_an_unknown_gpm_metric_degrades_that_metric_only():
    node = h100_node(count=1)
    node.nvml.gpus[0].set_activity(30.0)
    node.nvml.gpus[0].gpm_errors[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL] = pynvml.NVML_ERROR_UNKNOWN
    node.tick()
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_up", gpu(0))] == 1 and snapshot.errors == {"nvml_unknown": 1}
    assert ("mfu_gpu_tensor_active_ratio", gpu(0)) not in values
    assert values[("mfu_gpu_sm_active_ratio", gpu(0))] == pytest.approx(0.3)
    del node.nvml.gpus[0].gpm_errors[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL]
    _, values = exposition(node.tick())  # asked again: an unknown error is not "unsupported"
    assert values[("mfu_gpu_tensor_active_ratio", gpu(0))] == pytest.approx(0.3)


def test_an_unknown_error_registering_for_xids_degrades_xids_only():
    nvml = fake.node(fake.h100, count=2)
    nvml.gpus[0].fail["nvmlDeviceRegisterEvents"] = pynvml.NVML_ERROR_UNKNOWN
    node = Node(nvml)
    snapshot = node.tick()
    _, values = exposition(snapshot)
    assert values[("mfu_gpu_up", gpu(0))] == 1 and snapshot.errors == {"nvml_unknown": 1}
    assert nvml.calls["nvmlEventSetFree"] == 1  # nvml.h: the set is in an undefined state and must be freed
    nvml.xid(1, 13)
    assert exposition(node.tick())[1][("mfu_gpu_xid_errors_total", gpu(1, xid="13"))] == 1


def test_a_gpu_this_process_may_not_open_is_listed_once_and_never_reinitialised_for():
    nvml = fake.node(fake.h100, count=3)
    nvml.gpus[1].fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVML_ERROR_NO_PERMISSION  # a cgroup device rule
    node = Node(nvml, retry_interval=30)
    snapshot = node.tick()
    assert snapshot.errors == {"nvml_no_permission": 1}
    assert [g.index for g in snapshot.readings.inventory] == [0, 2]
    assert snapshot.status["notes"] == [
        "cannot open NVML index 1: Insufficient Permissions (not this process's: no re-initialisation for it)"
    ]
    for _ in range(4):
        assert node.tick(30).errors == {}
    assert nvml.calls["nvmlInit"] == 1  # the healthy GPUs' Xid registrations and GPM intervals are never cut


def test_a_gpu_unbound_from_the_driver_leaves_the_enumeration_and_labels_follow_the_uuid():
    node = h100_node(count=4, retry_interval=30)
    node.tick()
    node.nvml.lose(2)
    node.nvml.gpus[2].unbound = True  # then unbound: the next session no longer enumerates it
    node.tick()
    snapshot = node.tick(30)
    assert node.nvml.nvmlDeviceGetCount() == 3  # NVML now numbers the GPU that was 3 as 2
    assert snapshot.readings.gpus[2].up is False and snapshot.readings.gpus[3].up is True
    assert snapshot.readings.gpus[3].uuid == fake.h100(3).uuid
    assert snapshot.errors == {}  # still the one loss, counted when it happened


def test_gpu_source_discovery_and_preflight_share_one_nvml_session_so_a_reinit_enumerates_anew():
    from mfu_exporter.config import typed_config
    from mfu_exporter.node.nvml import NvmlSession
    from mfu_exporter.preflight.facts import read_gpus
    from mfu_exporter.sources.discovery import DiscoverySource

    nvml = fake.node(fake.h100, count=4)
    session = NvmlSession(nvml)
    clock = Clock()
    source = GpuSource(nvml, retry_interval=30, monotonic=clock, session=session)
    section = typed_config(validate({"discovery": {"kubernetes": {"enabled": False}}})).discovery
    discovery = DiscoverySource(section, nvml=nvml, nvml_session=session, clock=clock)

    def tick(seconds):
        nvml.advance(seconds)
        clock.now += seconds
        try:
            discovery.sample()  # holds its reference from its first answer on
        except SourceUnavailable:
            pass
        assert len(read_gpus(nvml, session).devices) == nvml.nvmlDeviceGetCount()  # preflight borrows it too
        return source.sample()

    tick(1)
    assert nvml.calls["nvmlInit"] == 1  # one nvmlInit for the three of them
    nvml.lose(3)
    nvml.gpus[3].unbound = True
    tick(1)
    nvml.gpus[3].lost = nvml.gpus[3].unbound = False  # reset and re-bound to the driver
    snapshot = tick(30)
    # The re-initialisation really ended NVML (its reference count reached zero: the fake started a second session,
    # enumerating anew) though discovery held a reference throughout; with an nvmlInit of discovery's own, the count
    # would have stayed above zero and the "re-initialisation" would have enumerated nothing.
    assert nvml.calls["nvmlInit"] == 2 and nvml.calls["nvmlShutdown"] == 1
    assert nvml._session == 2
    assert snapshot.readings.gpus[3].up is True
    discovery.close()
    source.close()
    assert not nvml.initialized and not session.initialized
