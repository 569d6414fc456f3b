#!/usr/bin/env python3
"""A GPU node's acceptance run: the exporter's GPU figures against a workload of known FLOP/s and real NVML.

    python scripts/gpu-truth.py [--json FILE] [--log FILE]     # a node with NVIDIA GPUs and PyTorch (make gpu-check)
    python scripts/gpu-truth.py --fake [--json FILE]           # the fake NVML and a CPU stand-in (make test runs it)

One command; prints a readable summary with each comparison's verdict (PASS, FAIL or SKIP, with its figures) and
writes the whole report as JSON. Exit status: 0 when nothing failed, 1 when a comparison failed, 2 when the machine
lacks what the run needs (PyTorch with CUDA, NVML).

What it runs, in order:

1. **The GPU source on this node's NVML**, built through ``build_sources`` and a ``SourceContext`` as the daemon
   builds it: every core series present for every GPU, GPM series on Hopper and newer, the time one sample takes;
   then its cost per GPU and sample at each series level (NVML calls, field values, wall and CPU milliseconds).
2. **NVML probes** that settle what the fake can only assume: fields 197/198 (PCIe bytes) and 138/139 (NVLink),
   the perf-policy counters (74-81: their unit, against wall time), the NVLink error counters, GPM at short
   intervals, memory from the v1 and v2 calls (reserved memory), nvmlInit's reference count, the Xid wait.
3. **A workload of known FLOP/s**: bf16 matrix products timed with CUDA events, reported through
   ``mfu_exporter.client`` to a real daemon (``python -m mfu_exporter run``) with model facts chosen so 6·P·tokens equals
   the products' FLOPs. The daemon's formula MFU must match measured FLOP/s ÷ the peak-table peak within 2 points;
   the hardware estimate (``mfu_gpu_hardware_flops_utilization_ratio``) and tensor activity are set beside it.
4. **A real framework run**: a small transformers ``Trainer`` (random weights and data, nothing downloaded) whose
   stdout/stderr go to a file the daemon's logs source follows with only ``jobs.<job>`` facts; the daemon's MFU
   must match what a Trainer callback counted over the same window within 2 points.
5. **The daemon's own CPU** at 1 s sampling (``process_cpu_seconds_total``), GPU idle and GPU busy.
6. **nvidia-smi** sampled alongside as the reference for utilization, SM clock and power.

With ``--fake`` the same steps run against ``mfu_exporter.sim.nvml`` (two simulated H100s, in this process and in the
daemon) with a CPU matrix product of known FLOPs as the workload and a stand-in peak (the measured CPU rate × 2, so
the formula MFU is near 0.5 and a wrong 6·P·tokens shows), so the script cannot rot while no GPU is at hand. What
needs the real thing (transformers, nvidia-smi, GPU-only probes) is SKIPped with the reason; the Trainer's log path
is then exercised by a stand-in that prints the Trainer's log lines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))  # runs from a checkout without installing it

import requests  # noqa: E402
import yaml  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

MFU_TOLERANCE = 0.02  # formula MFU within 2 points of the FLOP/s measured
CORE_SERIES = ("mfu_gpu_memory_used_bytes", "mfu_gpu_memory_total_bytes", "mfu_gpu_power_watts")
GPM_SERIES = ("mfu_gpu_tensor_active_ratio", "mfu_gpu_sm_active_ratio", "mfu_gpu_dram_active_ratio")
HOPPER_OR_NEWER = ("h100", "h200", "gh200", "h20", "b100", "b200", "b300", "gb200", "gb300")
GEMM_JOB = "gpu-check-gemm"
TRAINER_JOB = "gpu-check-trainer"
# nvml.h field IDs probed: NVLink data KiB (all links), PCIe bytes, perf-policy counters, NVLink error counters.
PERF_POLICY_FIELDS = {
    74: "power",
    75: "thermal",
    76: "sync_boost",
    77: "board_limit",
    78: "low_utilization",
    79: "reliability",
    80: "total_app_clocks",
    81: "total_base_clocks",
}
CLOCK_EVENT_FIELDS = {269: "sw_thermal_slowdown", 270: "hw_thermal_slowdown", 271: "hw_power_brake"}
NVLINK_ERROR_FIELDS = {
    38: "crc_flit_total",
    45: "crc_data_total",
    52: "replay_total",
    59: "recovery_total",
    91: "link_count",
    160: "ecc_data_total",
    161: "dl_replay",
    162: "dl_recovery",
    163: "dl_crc",
    213: "link_recovery_successful",
    214: "link_recovery_failed",
    215: "link_recovery_events",
    219: "effective_errors",
    221: "symbol_errors",
}
ALL_LINKS = 0xFFFFFFFF


class Report:
    """The checks with their verdicts and figures, and the raw measurements, as one JSON-able dict."""

    def __init__(self, mode: str, path: Path | None = None):
        self.path = path  # written after every check, so a run cut short still leaves what it measured
        self.data: dict[str, Any] = {
            "mode": mode,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "checks": [],
            "figures": {},
        }

    def check(self, name: str, ok: bool | None, detail: str, **figures: Any) -> None:
        """One comparison: ``ok`` True/False is PASS/FAIL, None is SKIP (``detail`` says why)."""
        verdict = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.data["checks"].append({"name": name, "verdict": verdict, "detail": detail, "figures": figures})
        print(f"  {verdict:4}  {name}: {detail}", flush=True)
        self.save()

    def figure(self, section: str, value: Any) -> None:
        self.data["figures"][section] = value
        self.save()

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(jsonable(self.data), indent=1) + "\n")

    @property
    def failed(self) -> list[str]:
        return [c["name"] for c in self.data["checks"] if c["verdict"] == "FAIL"]


# --- helpers ----------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition, keyed by (name, sorted label items)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def gpu_value(values: dict, name: str, gpu: str) -> float | None:
    return values.get((name, (("gpu", gpu),)))


def is_hopper_or_newer(name: str) -> bool:
    lowered = name.lower()
    return any(key in lowered for key in HOPPER_OR_NEWER)


# --- the fake node ----------------------------------------------------------------------------------------------


def fake_nvml() -> Any:
    """Two simulated H100s under load, as the fake mode's NVML (in this process and in the daemon)."""
    from mfu_exporter.sim import nvml as sim

    fake = sim.node(sim.h100, count=2)
    for gpu in fake.gpus:
        gpu.utilization = 95
        gpu.memory_used = 40 * 1024**3
        gpu.power_mw = 520_000
        gpu.sm_clock_mhz = 1830
        gpu.clocks_event_reasons = 0x4  # sw_power_cap, as under training load
        gpu.set_activity(45.0)
    return fake


def serve_fake(config_path: str, listen: str) -> int:
    """The daemon of ``mfu_exporter.cli.run.run_daemon`` with the fake NVML in its SourceContext (fake mode only)."""
    import asyncio

    from mfu_exporter.cli import setup_logging
    from mfu_exporter.cli.flags import load_daemon_config
    from mfu_exporter.service import build_service
    from mfu_exporter.sources import Paths, SourceContext, build_sources
    from mfu_exporter.web.app import serve

    setup_logging("warning")
    args = argparse.Namespace(
        config=config_path,
        listen_address=listen,
        sysfs="/sys",
        procfs="/proc",
        web_config_file=None,
        log_level="warning",
    )
    config = load_daemon_config(args)
    nvml = fake_nvml()
    stop = threading.Event()

    def tick() -> None:  # energy, byte and throttle-time counters move in steps finer than the 1 s samples
        while not stop.wait(0.1):
            nvml.advance(0.1)

    threading.Thread(target=tick, daemon=True).start()
    ctx = SourceContext(config, Paths(args.sysfs, args.procfs), nvml=nvml)
    service = build_service(config, build_sources(config, ctx), paths=ctx.paths)
    asyncio.run(serve(service))
    stop.set()
    return 0


# --- 1. the GPU source on this node's NVML ----------------------------------------------------------------------


class TimedNvml:
    """The NVML module with every function call timed: where the GPU source's sample time goes, call by call."""

    def __init__(self, nvml: Any):
        self._nvml = nvml
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(value) or isinstance(value, type):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def check_gpu_source(report: Report, nvml: Any, samples: int, pause: float) -> list[dict]:
    """Sample the GPU source as the daemon builds it; returns the status's GPU list (empty when NVML is down)."""
    from prometheus_client.exposition import choose_encoder

    from mfu_exporter.config import validate
    from mfu_exporter.render.encode import encode_families
    from mfu_exporter.render.snapshots import snapshot_families
    from mfu_exporter.sources import SourceContext, build_sources
    from mfu_exporter.sources.base import SourceUnavailable

    config = {
        "sources": {name: {"enabled": False} for name in ("rdma", "ethtool", "checkpoint", "logs", "preflight")},
        "discovery": {"kubernetes": {"enabled": False}, "slurm": {"enabled": False}},
    }
    # An acceptance run checks every series the source can give, not only the default level's.
    config["sources"]["gpu"] = {"enabled": True, "interval": "1s", "series": "full"}
    config = validate(config)
    nvml = TimedNvml(nvml)
    (source,) = [s for s in build_sources(config, SourceContext(config, nvml=nvml)) if s.name == "gpu"]
    timings: list[float] = []
    errors: dict[str, int] = {}
    try:
        started = time.perf_counter()
        try:
            snapshot = source.sample()
        except SourceUnavailable as exc:
            report.check("gpu_source_core_series", False, f"NVML did not start: {exc}")
            return []
        open_ms = (time.perf_counter() - started) * 1e3
        nvml.reset()  # from here: the steady cycle's calls
        for _ in range(samples):
            time.sleep(pause)
            started = time.perf_counter()
            snapshot = source.sample()
            timings.append((time.perf_counter() - started) * 1e3)
            for reason, count in snapshot.errors.items():
                errors[reason] = errors.get(reason, 0) + count
    finally:
        source.close()
    encoder, _ = choose_encoder("")
    values = parse_metrics(encode_families(snapshot_families(snapshot), encoder, openmetrics=False))
    gpus = snapshot.status["gpus"]
    problems, gpm_missing, hopper = [], [], []
    for gpu in gpus:
        label = str(gpu["index"])
        if gpu_value(values, "mfu_gpu_up", label) != 1:
            problems.append(f"GPU {label} is not up: {gpu['lost_reason']}")
            continue
        wanted = CORE_SERIES if gpu["mig"] else ("mfu_gpu_utilization_ratio", *CORE_SERIES)
        problems += [f"GPU {label} lacks {name}" for name in wanted if gpu_value(values, name, label) is None]
        if is_hopper_or_newer(gpu["name"]) and not gpu["mig"]:
            hopper.append(label)
            gpm_missing += [f"GPU {label} lacks {n}" for n in GPM_SERIES if gpu_value(values, n, label) is None]
    names = sorted({g["name"] for g in gpus})
    report.check(
        "gpu_source_core_series",
        bool(gpus) and not problems,
        f"{len(gpus)} GPU(s) ({', '.join(names)}) up with every core series"
        if gpus and not problems
        else "; ".join(problems) or "no GPU",
        gpus=len(gpus),
        problems=problems,
    )
    report.check(
        "gpu_source_gpm",
        None if not hopper else not gpm_missing,
        "no Hopper-or-newer GPU outside MIG here"
        if not hopper
        else "; ".join(gpm_missing) or f"GPM activity series on GPU(s) {', '.join(hopper)}",
        hopper_gpus=hopper,
    )
    # Nearest rank: the smallest sample at or above 95 % of them (the maximum for fewer than 20 samples).
    p95 = sorted(timings)[max(0, math.ceil(len(timings) * 0.95) - 1)] if timings else None
    report.check(
        "gpu_source_sample_time",
        bool(timings) and max(timings) < 1000.0,
        f"one sample of {len(gpus)} GPU(s): median {median(timings):.2f} ms, p95 {p95:.2f} ms, max "
        f"{max(timings):.2f} ms (the open: {open_ms:.1f} ms); must fit the 1 s interval"
        if timings
        else "no sample",
        median_ms=rounded(median(timings), 3),
        p95_ms=rounded(p95, 3),
        max_ms=rounded(max(timings) if timings else None, 3),
        open_ms=rounded(open_ms, 3),
        samples=len(timings),
        per_gpu_median_ms=rounded(median(timings) / len(gpus), 3) if timings and gpus else None,
    )
    per_call = {
        name: {"calls_per_sample": nvml.calls[name] / samples, "ms_per_call": round(sec / nvml.calls[name] * 1e3, 4)}
        for name, sec in sorted(nvml.seconds.items(), key=lambda item: -item[1])
    }
    families = sorted({name for name, _ in values if name.startswith("mfu_gpu_")})
    report.figure(
        "gpu_source",
        {
            "status_notes": snapshot.status["notes"],
            "errors": errors,
            "gpus": gpus,
            "sample_ms": timings,
            "nvml_calls": per_call,
            "families": families,
            "series": {
                n + json.dumps(dict(labels), sort_keys=True): v
                for (n, labels), v in values.items()
                if n.startswith("mfu_gpu_") and "gpu" in dict(labels)
            },
        },
    )
    return gpus


def check_sample_cost(report: Report, nvml: Any, samples: int, pause: float) -> None:
    """The GPU source's cost per GPU and sample at each series level on this NVML (``bench.nvml_calls.sample_cost``):
    NVML calls, field values, wall and CPU time. What the 5 s default interval and ``interval: 1s`` cost follows:
    an 8-GPU node at 1 s spends 8 × the wall time per second in NVML."""
    from bench.nvml_calls import LEVELS, describe, sample_cost

    results = [sample_cost(nvml, series, samples, between=lambda: time.sleep(pause)) for series in LEVELS]
    for result in results:
        print(f"        {describe(result)}", flush=True)
    slowest = max(result["wall_ms_per_gpu_sample"] * result["gpus"] for result in results)
    report.check(
        "gpu_source_cost_by_level",
        all(result["gpus"] for result in results) and slowest < 1000.0,
        "; ".join(
            f"{r['series']} {r['wall_ms_per_gpu_sample']:.3f} ms ({r['calls_per_gpu_sample']:g} calls, "
            f"{r['fields_per_gpu_sample']:g} fields)"
            for r in results
        )
        + " per GPU and sample",
        **{r["series"]: {k: v for k, v in r.items() if k != "calls"} for r in results},
    )
    report.figure("sample_cost", results)


# --- 2. NVML probes ---------------------------------------------------------------------------------------------


class Probes:
    """Direct NVML calls that settle what the fake assumes. Every probe records what NVML answered, error or value."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.handle: Any = None

    def _error(self, exc: BaseException) -> str:
        if isinstance(exc, AttributeError):
            return f"not implemented by the fake NVML ({exc})"
        return f"{type(exc).__name__}: {exc}"

    def open(self) -> None:
        self.nvml.nvmlInit()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(0)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - the probe session is ours; nothing to do if it is gone
            pass

    def fields(self, ids: dict[int, str], scope: int = 0) -> dict[str, Any]:
        """Each field's nvmlReturn, valueType and value (None unless SUCCESS), read in one call."""
        nvml = self.nvml
        try:
            values = nvml.nvmlDeviceGetFieldValues(self.handle, [(field_id, scope) for field_id in ids])
        except Exception as exc:  # noqa: BLE001 - recorded as what NVML answered
            return {"error": self._error(exc)}
        out: dict[str, Any] = {"taken_at": time.time()}
        for (field_id, name), value in zip(ids.items(), values):
            entry: dict[str, Any] = {"id": field_id, "return": int(value.nvmlReturn)}
            if value.nvmlReturn == nvml.NVML_SUCCESS:
                member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[value.valueType]
                entry["value_type"] = int(value.valueType)
                entry["value"] = getattr(value.value, member)
                entry["timestamp_us"] = int(value.timestamp)
                entry["latency_us"] = int(value.latencyUsec)
            else:
                entry["error"] = str(nvml.NVMLError(value.nvmlReturn))
            out[name] = entry
        return out

    def memory(self) -> dict[str, Any]:
        nvml, out = self.nvml, {}
        try:
            v1 = nvml.nvmlDeviceGetMemoryInfo(self.handle)
            out["v1"] = {"total": v1.total, "free": v1.free, "used": v1.used}
        except Exception as exc:  # noqa: BLE001
            out["v1"] = {"error": self._error(exc)}
        try:
            v2 = nvml.nvmlDeviceGetMemoryInfo(self.handle, version=nvml.nvmlMemory_v2)
            out["v2"] = {"total": v2.total, "free": v2.free, "used": v2.used, "reserved": v2.reserved}
        except Exception as exc:  # noqa: BLE001
            out["v2"] = {"error": self._error(exc)}
        return out

    def violation(self) -> dict[str, Any]:
        """nvmlDeviceGetViolationStatus per perf policy: the legacy route to the same throttle time, in ns."""
        nvml, out = self.nvml, {}
        for policy, name in ((0, "power"), (1, "thermal"), (2, "sync_boost"), (3, "board_limit"), (4, "low_util")):
            try:
                status = nvml.nvmlDeviceGetViolationStatus(self.handle, policy)
                out[name] = {"reference_time": status.referenceTime, "violation_time": status.violationTime}
            except Exception as exc:  # noqa: BLE001
                out[name] = {"error": self._error(exc)}
        return out

    def clock_reasons(self) -> dict[str, Any]:
        nvml, out = self.nvml, {}
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            try:
                out[name] = getattr(nvml, name)(self.handle)
            except Exception as exc:  # noqa: BLE001
                out[name] = self._error(exc)
        return out

    def gpm_intervals(self, gaps: tuple[float, ...]) -> dict[str, Any]:
        """Each requested GPM metric's nvmlReturn and value for two samples ``gap`` seconds apart."""
        nvml = self.nvml
        ids = {2: "sm_util", 3: "sm_occupancy", 5: "any_tensor_util", 10: "dram_bw_util", 20: "pcie_tx", 21: "pcie_rx"}
        ids |= {60: "nvlink_rx", 61: "nvlink_tx"}
        out: dict[str, Any] = {}
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(self.handle)
            if not support.isSupportedDevice:
                return {"supported": False}
            samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        except Exception as exc:  # noqa: BLE001
            return {"error": self._error(exc)}
        try:
            for gap in gaps:
                request = nvml.c_nvmlGpmMetricsGet_t()
                request.version = nvml.NVML_GPM_METRICS_GET_VERSION
                request.numMetrics = len(ids)
                for slot, metric_id in enumerate(ids):
                    request.metrics[slot].metricId = metric_id
                entry: dict[str, Any] = {}
                try:
                    nvml.nvmlGpmSampleGet(self.handle, samples[0])
                    time.sleep(gap)
                    nvml.nvmlGpmSampleGet(self.handle, samples[1])
                    request.sample1, request.sample2 = samples[0], samples[1]
                    nvml.nvmlGpmMetricsGet(request)
                except Exception as exc:  # noqa: BLE001
                    out[f"{gap * 1e3:g}ms"] = {"error": self._error(exc)}
                    continue
                for slot, name in enumerate(ids.values()):
                    metric = request.metrics[slot]
                    item: dict[str, Any] = {"return": int(metric.nvmlReturn)}
                    if metric.nvmlReturn == nvml.NVML_SUCCESS:
                        item["value"] = round(metric.value, 4)
                        unit = getattr(metric.metricInfo, "unit", None)
                        if unit:
                            item["unit"] = unit.decode() if isinstance(unit, bytes) else str(unit)
                    else:
                        item["error"] = str(nvml.NVMLError(metric.nvmlReturn))
                    entry[name] = item
                out[f"{gap * 1e3:g}ms"] = entry
        finally:
            for sample in samples:
                try:
                    nvml.nvmlGpmSampleFree(sample)
                except Exception:  # noqa: BLE001
                    pass
        return out

    def init_refcount(self) -> dict[str, Any]:
        """nvmlInit twice, nvmlShutdown once: does a handle from before still answer (the reference count holds)?"""
        nvml, out = self.nvml, {}
        try:
            nvml.nvmlInit()
            nvml.nvmlShutdown()
            out["handle_after_init_shutdown"] = nvml.nvmlDeviceGetUUID(self.handle)
            out["count_after"] = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001
            out["error"] = self._error(exc)
        return out

    def xid_wait(self) -> dict[str, Any]:
        nvml, out = self.nvml, {}
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:  # noqa: BLE001
            return {"error": self._error(exc)}
        try:
            nvml.nvmlDeviceRegisterEvents(self.handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            started = time.perf_counter()
            try:
                nvml.nvmlEventSetWait(event_set, 0)
                out["answer"] = "an event"
            except nvml.NVMLError as exc:
                out["answer"] = type(exc).__name__
            out["wait_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        except Exception as exc:  # noqa: BLE001
            out["error"] = self._error(exc)
        finally:
            try:
                nvml.nvmlEventSetFree(event_set)
            except Exception:  # noqa: BLE001
                pass
        return out


def counter_rates(before: dict, after: dict) -> dict[str, Any]:
    """Per field: the change between two reads and that change per second of wall time between them."""
    elapsed = after.get("taken_at", 0) - before.get("taken_at", 0)
    out: dict[str, Any] = {"elapsed_s": round(elapsed, 3)}
    for name, entry in after.items():
        first = before.get(name)
        if not isinstance(entry, dict) or not isinstance(first, dict) or "value" not in entry or "value" not in first:
            continue
        delta = entry["value"] - first["value"]
        out[name] = {"delta": delta, "per_second": round(delta / elapsed, 3) if elapsed > 0 else None}
    return out


# --- the daemon -------------------------------------------------------------------------------------------------


class Daemon:
    """The exporter as a process of its own: ``python -m mfu_exporter run`` (fake mode: the same with the fake NVML)."""

    def __init__(self, work: Path, config: dict, fake: bool):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = work / "exporter.yaml"
        path.write_text(yaml.safe_dump(config))
        listen = f"127.0.0.1:{self.port}"
        if fake:
            argv = [sys.executable, __file__, "--serve-fake", str(path), "--listen", listen]
        else:
            argv = [sys.executable, "-m", "mfu_exporter", "run", "--config", str(path), "--web.listen-address", listen]
        self.log_path = work / "exporter.log"
        self.log = self.log_path.open("w")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPOSITORY), os.environ.get("PYTHONPATH", "")])}
        self.popen = subprocess.Popen(argv, cwd=REPOSITORY, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"the exporter exited ({self.popen.returncode}): {self.tail()}")
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the exporter was not ready within {timeout:g}s: {self.tail()}")

    def tail(self) -> str:
        return self.log_path.read_text()[-2000:]

    def metrics(self) -> dict:
        return parse_metrics(requests.get(self.url + "/metrics", timeout=5).text)

    def job(self, name: str) -> dict | None:
        jobs = requests.get(self.url + "/api/v1/jobs", timeout=5).json()["jobs"]
        return next((j for j in jobs if j["job"] == name), None)

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self.log.close()


class Scraper:
    """Scrapes the daemon's /metrics every ``interval`` seconds in a thread; each scrape is (wall time, values)."""

    def __init__(self, daemon: Daemon, interval: float = 1.0):
        self.daemon = daemon
        self.interval = interval
        self.scrapes: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scrapes.append((time.time(), self.daemon.metrics()))
            except requests.RequestException:
                pass
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[tuple[float, dict]]:
        return [(t, v) for t, v in self.scrapes if start <= t <= end]


def cpu_share(scrapes: list[tuple[float, dict]]) -> float | None:
    """The daemon's CPU over the scrapes, as a share of one core: Δprocess_cpu_seconds_total ÷ Δwall."""
    points = [(t, v[("process_cpu_seconds_total", ())]) for t, v in scrapes if ("process_cpu_seconds_total", ()) in v]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def series_median(scrapes: list[tuple[float, dict]], name: str, gpu: str = "0") -> float | None:
    return median([v for _, values in scrapes if (v := gpu_value(values, name, gpu)) is not None])


# --- 3. the workload of known FLOP/s ----------------------------------------------------------------------------


class GpuGemm:
    """bf16 n×n×n matrix products on GPU 0, timed with CUDA events; one product is one "token"."""

    def __init__(self, n: int = 8192, batch: int = 40):
        import torch

        self.torch = torch
        self.n, self.batch = n, batch
        self.flops_per_product = 2.0 * n**3
        generator = torch.Generator(device="cuda").manual_seed(0)
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=generator)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=generator)
        self.out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        self.describe = f"bf16 {n}×{n}×{n} matrix products (torch.matmul), CUDA-event timed, batches of {batch}"
        self.events = True

    def warm_up(self) -> float:
        return self.run_batch()

    def run_batch(self) -> float:
        """Seconds the GPU spent on one batch of products (CUDA events)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.batch):
            torch.matmul(self.a, self.b, out=self.out)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


class CpuGemm:
    """The fake mode's stand-in: a pure-Python n×n×n matrix product, timed by the wall clock between reports."""

    def __init__(self, n: int = 30, batch: int = 30):
        import random

        self.n, self.batch = n, batch
        self.flops_per_product = 2.0 * n**3
        rng = random.Random(0)
        self.a = [[rng.random() for _ in range(n)] for _ in range(n)]
        self.b = [[rng.random() for _ in range(n)] for _ in range(n)]
        self.bt = list(zip(*self.b))
        self.describe = f"pure-Python {n}×{n}×{n} float matrix products, wall-clock timed, batches of {batch}"
        self.events = False

    def warm_up(self) -> float:
        """A batch's CPU time, not its wall time: the stand-in peak is then the CPU's own rate on a core, which a
        machine busy with other work slows in wall time only, so the run's MFU never passes it."""
        started = time.thread_time()
        self.run_batch()
        return time.thread_time() - started

    def run_batch(self) -> float:
        started = time.perf_counter()
        for _ in range(self.batch):
            [[sum(x * y for x, y in zip(row, col)) for col in self.bt] for row in self.a]
        return time.perf_counter() - started


class DeliveredSession:
    """The reporter's HTTP session, keeping the totals the daemon took. The reporter sends the newest total when its
    thread runs, so on a loaded machine some totals are never sent: the daemon's rate is over the ones it took, and
    the truth is measured over the same ones."""

    def __init__(self) -> None:
        from mfu_exporter.client_http import HttpSession

        self._session = HttpSession()
        self.times: dict[float, float] = {}  # each total the daemon took: the report's own time

    def post(self, url: str, json: dict, headers: dict, timeout: float) -> Any:
        response = self._session.post(url, json=json, headers=headers, timeout=timeout)
        if response.status_code < 300 and "tokens_total" in json and "event" not in json:
            self.times[json["tokens_total"]] = json["time"]
        return response

    def close(self) -> None:
        self._session.close()


def run_gemm(
    report: Report,
    daemon: Daemon,
    scraper: Scraper,
    workload: Any,
    seconds: float,
    window: float,
    fake: bool,
    probes: Any,
) -> tuple[float, float]:
    """Run the products for ``seconds``, reporting one token per product; compare the daemon's MFU with the truth."""
    from mfu_exporter.client import ProgressReporter
    from mfu_exporter.model.flops import peak_flops

    # 6·P·tokens = the products' FLOPs with one token per product: P = 2n³ / 6. On the fake, each CPU FLOP stands
    # for a million (params and the stand-in peak alike, so the MFU is unchanged): the API takes peaks from 1 GFLOP/s.
    scale = 1e6 if fake else 1.0
    params = workload.flops_per_product * scale / 6.0
    warm = [workload.warm_up() for _ in range(2 if fake else 3)]
    peak_tflops = None
    if fake:
        # A stand-in peak: twice the CPU's rate, so the formula MFU lands near 0.5 (lower on a busy machine) and a
        # wrong count shows.
        peak_tflops = 2 * workload.batch * workload.flops_per_product * scale / min(warm) / 1e12
    facts = {"model": {"params": params}, "dtype": "bf16", "gpus": [0]}
    if peak_tflops is not None:
        facts["peak_tflops"] = peak_tflops
    delivered = DeliveredSession()
    reporter = ProgressReporter(daemon.url, GEMM_JOB, session=delivered, **facts)
    products, busy = 0, 0.0
    reporter.update(tokens_total=0, step=0)
    first_report = time.time()
    # The reporter sends only the newest total: wait until the daemon holds this first point, so the daemon's rate
    # (over its window, longer than this run) starts exactly where the timing starts.
    for _ in range(100):
        if daemon.job(GEMM_JOB) is not None:
            break
        time.sleep(0.05)
    points = [(first_report, 0, 0.0)]  # (report time, products, seconds the products ran) at each report
    deadline = time.monotonic() + seconds
    under_load: dict[str, Any] = {}
    field_ids = {138: "nvlink_tx_kib", 139: "nvlink_rx_kib", 197: "pcie_tx_bytes", 198: "pcie_rx_bytes"}
    try:
        while time.monotonic() < deadline:
            busy += workload.run_batch()
            products += workload.batch
            reporter.update(tokens_total=products, step=products)
            last_report = time.time()
            points.append((last_report, products, busy))
            if probes is not None and "fields_1" not in under_load and time.monotonic() > deadline - seconds / 2:
                under_load["fields_1"] = probes.fields(field_ids | PERF_POLICY_FIELDS | CLOCK_EVENT_FIELDS)
                under_load["violation_1"] = probes.violation()
        if probes is not None:
            under_load["fields_2"] = probes.fields(field_ids | PERF_POLICY_FIELDS | CLOCK_EVENT_FIELDS)
            under_load["violation_2"] = probes.violation()
            under_load["gpm"] = probes.gpm_intervals((0.02, 0.05, 0.2))
        # Before close (which ends the job and its MFU): wait until the daemon holds a total reported since the
        # deadline, working on meanwhile. A job silent past its stall_after (3 s at this cadence) has an MFU of 0,
        # which a starved daemon's late view would otherwise show.
        since = products
        reported = {point[1] for point in points}
        view = None
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            view = daemon.job(GEMM_JOB)
            if view and view["mfu"] is not None and view["tokens_total"] in reported and view["tokens_total"] >= since:
                break
            busy += workload.run_batch()
            products += workload.batch
            reporter.update(tokens_total=products, step=products)
            last_report = time.time()
            points.append((last_report, products, busy))
            reported.add(products)
    finally:
        reporter.close()
        delivered.close()
    # The daemon's MFU is over its window (mfu.window) back from the newest report: measure the same reports.
    end = view["last_report_time"] if view and view["last_report_time"] else last_report
    window = (view or {}).get("window_seconds") or window  # the daemon's, longer for a job of slow reports
    taken = [(delivered.times[n], n, b) for _, n, b in points if n in delivered.times] or points
    inside = [p for p in taken if end - window <= p[0] <= end] or taken
    (t0, n0, b0), (t1, n1, b1) = inside[0], inside[-1]
    if n1 == n0 or b1 == b0:
        (t0, n0, b0), (t1, n1, b1) = points[0], points[-1]
    # FLOP/s while the products ran: by CUDA events on the GPU; the CPU stand-in has no such timer, and its gaps
    # between products (the reporter's thread holding the GIL) are work the daemon rightly counts as time: the wall.
    measured = (n1 - n0) * workload.flops_per_product / ((b1 - b0) if workload.events else (t1 - t0))
    wall = (n1 - n0) * workload.flops_per_product / (t1 - t0)  # the same products over the reports' wall time
    whole_run = products * workload.flops_per_product / busy
    peak = peak_tflops * 1e12 / scale if peak_tflops else peak_flops(gpu_name_of(daemon), "bf16")
    truth = measured / peak if peak else None
    mfu = view["mfu"] if view else None
    during = scraper.between(first_report + min(3.0, seconds / 3), last_report)  # after the clocks ramp up
    hardware = series_median(during, "mfu_gpu_hardware_flops_utilization_ratio")
    tensor = series_median(during, "mfu_gpu_tensor_active_ratio")
    clock = series_median(during, "mfu_gpu_sm_clock_hertz")
    figures = {
        "workload": workload.describe,
        "products": products,
        "seconds": round(last_report - first_report, 3),
        "window_s": window,
        "window_products": n1 - n0,
        "measured_tflops": round(measured / 1e12, 3),
        "whole_run_tflops": round(whole_run / 1e12, 3),
        "wall_tflops": round(wall / 1e12, 3),
        "peak_tflops": round(peak / 1e12, 3) if peak else None,
        "peak_is_stand_in": fake,
        "truth_mfu": rounded(truth),
        "wall_mfu": rounded(wall / peak if peak else None),
        "formula_mfu": rounded(mfu),
        "daemon_reason": view["reason"] if view else "the job never reached the daemon",
        "hardware_flops_utilization": rounded(hardware),
        "tensor_active": rounded(tensor),
        "sm_clock_mhz": rounded(clock / 1e6 if clock else None, 1),
        "params": params,
    }
    if truth is not None and tensor:
        # The reference clock that would make tensor active × SM clock ÷ reference equal the measured MFU.
        figures["calibrated_reference_clock_mhz"] = rounded(tensor * clock / truth / 1e6, 1) if clock else None
        figures["measured_over_tensor_active"] = rounded(truth / tensor)
    if hardware is not None and truth:
        figures["hardware_over_truth"] = rounded(hardware / truth)
    if mfu is None or truth is None:
        report.check(
            "gemm_formula_mfu", False, f"no formula MFU from the daemon: {figures['daemon_reason']}", **figures
        )
    else:
        report.check(
            "gemm_formula_mfu",
            abs(mfu - truth) <= MFU_TOLERANCE,
            f"formula MFU {mfu:.4f} vs measured {measured / 1e12:.4g} TFLOP/s ÷ peak {peak / 1e12:.4g} = {truth:.4f} "
            f"(|Δ| {abs(mfu - truth) * 100:.2f} points, limit {MFU_TOLERANCE * 100:g})",
            **figures,
        )
    if hardware is None or truth is None:
        report.check("gemm_hardware_estimate", None, "no hardware estimate (no GPM or no reference clock)", **figures)
    else:
        report.check(
            "gemm_hardware_estimate",
            True,
            f"hardware estimate {hardware:.4f}, tensor active {tensor:.4f} at {clock / 1e6:.0f} MHz, vs measured MFU "
            f"{truth:.4f}: {hardware - truth:+.4f} and {tensor - truth:+.4f} (reported, not judged)",
            **figures,
        )
    report.figure("gemm_under_load", under_load)
    check_throttle_time(report, scraper.between(first_report, last_report + 1.0))
    return first_report, last_report


def check_throttle_time(report: Report, scrapes: list[tuple[float, dict]]) -> None:
    """GPU 0's throttle seconds over the run against the share of scrapes its clock-event bit was set: the counter
    (nanoseconds from NVML, or the bit integrated) must grow at that share of wall time, for each reason."""
    figures, problems = {}, []
    if len(scrapes) < 3:
        report.check("throttle_seconds", None, "fewer than 3 scrapes during the products")
        return
    (_, first), (_, last) = scrapes[0], scrapes[-1]
    # Time between the GPU source's samples the two scrapes show, not between the scrapes: the counters are as of those.
    taken = ("mfu_exporter_source_last_success_timestamp_seconds", (("source", "gpu"),))
    t0, t1 = first.get(taken, 0.0), last.get(taken, 0.0)
    if t1 <= t0:
        report.check("throttle_seconds", None, "the GPU source did not sample between the first and last scrape")
        return
    for reason in ("sw_power_cap", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake"):
        key = ("mfu_gpu_throttle_seconds_total", (("gpu", "0"), ("reason", reason)))
        if key not in first or key not in last:
            problems.append(f"{reason}: no mfu_gpu_throttle_seconds_total series")
            continue
        grew = (last[key] - first[key]) / (t1 - t0)
        active = [v.get(("mfu_gpu_throttle_active", (("gpu", "0"), ("reason", reason))), 0.0) for _, v in scrapes]
        share = statistics.mean(active)
        figures[reason] = {"seconds_per_second": round(grew, 4), "share_of_scrapes_active": round(share, 4)}
        if abs(grew - share) > 0.15:
            problems.append(f"{reason}: grew {grew:.3f} s/s while active in {share:.0%} of scrapes")
    report.check(
        "throttle_seconds",
        not problems,
        "; ".join(problems)
        or "each reason's throttle seconds grew at the share of time its clock-event bit was set: "
        + ", ".join(
            f"{r} {f['seconds_per_second']:.3f} s/s vs {f['share_of_scrapes_active']:.0%}" for r, f in figures.items()
        ),
        **figures,
    )


def gpu_name_of(daemon: Daemon) -> str:
    values = daemon.metrics()
    for (name, labels), _ in values.items():
        if name == "mfu_gpu_info" and dict(labels).get("gpu") == "0":
            return dict(labels)["name"]
    return ""


# --- 4. the framework run ---------------------------------------------------------------------------------------


TRAINER_SEQ = 1024


def trainer_model_config() -> Any:
    """The Trainer's model: a 199.8 M-parameter Llama (8 layers, hidden 1024), random weights, nothing downloaded."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=TRAINER_SEQ,
    )


def trainer_child(log_records: str, seconds: float, standin: bool) -> int:
    """The training process: its stdout/stderr go to the file the daemon follows; a callback writes the Trainer's
    own token count with the wall time to ``log_records`` (JSON lines), at every step."""
    records = open(log_records, "a", buffering=1)
    if standin:
        # Prints what HF Trainer's PrinterCallback prints, at a known rate: the log path without transformers.
        params, tokens, step, started = 1.0e9, 0, 0, time.time()
        records.write(json.dumps({"params": params}) + "\n")
        while time.time() - started < seconds:
            time.sleep(0.05)
            step += 1
            tokens += 4096
            records.write(json.dumps({"time": time.time(), "tokens": tokens, "step": step}) + "\n")
            if step % 2 == 0:
                print({"loss": "2.345", "grad_norm": "1.2", "learning_rate": "1e-05", "num_input_tokens_seen": tokens})
                sys.stdout.flush()
        return 0
    import torch
    from transformers import LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    seq, batch = TRAINER_SEQ, 8
    config = trainer_model_config()
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    params = float(model.num_parameters())
    records.write(json.dumps({"params": params, "non_embedding": float(model.num_parameters(exclude_embeddings=True))}))
    records.write("\n")

    class Random(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, index: int) -> dict:
            ids = torch.randint(0, config.vocab_size, (seq,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids.clone()}

    class Count(TrainerCallback):
        def __init__(self) -> None:
            self.started: float | None = None

        def on_step_end(self, args, state, control, **kwargs):
            records.write(
                json.dumps({"time": time.time(), "tokens": state.num_input_tokens_seen, "step": state.global_step})
            )
            records.write("\n")
            self.started = self.started or time.time()  # from the first step: imports and set-up do not count
            if time.time() - self.started > seconds:
                control.should_training_stop = True
            return control

    arguments = TrainingArguments(
        output_dir=str(Path(log_records).parent / "trainer-out"),
        per_device_train_batch_size=batch,
        max_steps=1_000_000,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        bf16=True,
        include_num_input_tokens_seen=True,
        dataloader_num_workers=0,
        disable_tqdm=False,
        learning_rate=1e-4,
    )
    Trainer(model=model, args=arguments, train_dataset=Random(), callbacks=[Count()]).train()
    return 0


def run_trainer(report: Report, daemon: Daemon, work: Path, seconds: float, window: float, standin: bool, peak: float):
    records_path = work / "trainer-records.jsonl"
    log_path = work / "trainer.log"
    name = "trainer_log_mfu" if not standin else "log_mfu_standin"
    with log_path.open("a") as log:
        child = subprocess.Popen(
            [sys.executable, __file__, "--trainer-child", str(records_path), "--seconds", str(seconds)]
            + (["--standin"] if standin else []),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
        scrapes: list[dict] = []
        give_up = time.monotonic() + seconds + 180  # imports, model set-up and the first step come before the clock
        while child.poll() is None:
            if time.monotonic() > give_up:
                child.kill()
                child.wait()
                break
            view = daemon.job(TRAINER_JOB)
            if view is not None:
                scrapes.append({"at": time.time(), **{k: view.get(k) for k in ("mfu", "last_report_time", "reason")}})
                scrapes[-1]["tokens_total"] = view.get("tokens_total")
            time.sleep(0.5 if standin else 1.0)
    started_at = scrapes[0]["at"] if scrapes else time.time()
    lines = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    params = lines[0]["params"] if lines else None
    steps = [r for r in lines[1:] if "time" in r]
    comparisons = []
    for scrape in scrapes:
        end = scrape["last_report_time"]
        if scrape["mfu"] is None or end is None or not steps or end - window < steps[0]["time"]:
            continue  # the daemon's window must lie inside the run (after its first step) to compare like with like
        inside = [r for r in steps if end - window <= r["time"] <= end]
        if len(inside) < 2 or inside[-1]["time"] <= inside[0]["time"]:
            continue
        rate = (inside[-1]["tokens"] - inside[0]["tokens"]) / (inside[-1]["time"] - inside[0]["time"])
        counted = 6 * params * rate / peak
        comparisons.append({"at": round(scrape["at"] - started_at, 2), "daemon": scrape["mfu"], "callback": counted})
    if child.returncode != 0:
        report.check(name, False, f"the training process exited {child.returncode}: {log_path.read_text()[-1500:]}")
        return
    figures = {
        "params": params,
        "steps": len(steps),
        "tokens": steps[-1]["tokens"] if steps else 0,
        "comparisons": [{k: rounded(v) for k, v in c.items()} for c in comparisons],
        "peak_tflops": peak / 1e12,
        "window_s": window,
        "last_reason": scrapes[-1]["reason"] if scrapes else None,
    }
    if len(comparisons) < 3:
        report.check(name, False, f"fewer than 3 scrape windows to compare ({len(comparisons)})", **figures)
        return
    worst = max(abs(c["daemon"] - c["callback"]) for c in comparisons)
    relative = median([abs(c["daemon"] - c["callback"]) / c["callback"] for c in comparisons if c["callback"]])
    figures |= {"max_abs_diff": rounded(worst), "median_relative_diff": rounded(relative)}
    mean_daemon = statistics.mean(c["daemon"] for c in comparisons)
    mean_callback = statistics.mean(c["callback"] for c in comparisons)
    report.check(
        name,
        worst <= MFU_TOLERANCE,
        f"{len(comparisons)} windows of {window:g}s: MFU from the log {mean_daemon:.4f} vs the Trainer's own count "
        f"{mean_callback:.4f} (mean); worst |Δ| {worst * 100:.2f} points (limit {MFU_TOLERANCE * 100:g}), median "
        f"relative {relative * 100:.1f} %",
        **figures,
    )


# --- 6. nvidia-smi ----------------------------------------------------------------------------------------------


class Smi:
    """nvidia-smi's own sampling of GPU 0 every 500 ms, each line stamped with the wall time it arrived."""

    QUERY = "index,utilization.gpu,clocks.sm,power.draw,memory.used"

    def __init__(self) -> None:
        self.rows: list[tuple[float, dict]] = []
        self.popen = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", "-lms", "500", "-i", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 5:
                continue
            try:
                row = {
                    "utilization": float(parts[1]) / 100,
                    "sm_clock_mhz": float(parts[2]),
                    "power_w": float(parts[3]),
                }
                row["memory_used_mib"] = float(parts[4])
            except ValueError:
                continue
            self.rows.append((time.time(), row))

    def median(self, key: str, start: float, end: float) -> float | None:
        return median([r[key] for t, r in self.rows if start <= t <= end])

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait()


def compare_smi(report: Report, smi: Smi | None, scraper: Scraper, phases: dict[str, tuple[float, float]]) -> None:
    if smi is None:
        report.check("nvidia_smi_reference", None, "nvidia-smi is not on this machine (fake mode or no driver tools)")
        return
    figures, problems = {}, []
    for phase, (start, end) in phases.items():
        scrapes = scraper.between(start + 2, end)
        ours = {
            "utilization": series_median(scrapes, "mfu_gpu_utilization_ratio"),
            "sm_clock_mhz": (series_median(scrapes, "mfu_gpu_sm_clock_hertz") or 0) / 1e6 or None,
            "power_w": series_median(scrapes, "mfu_gpu_power_watts"),
        }
        theirs = {key: smi.median(key, start + 2, end) for key in ours}
        figures[phase] = {"exporter": {k: rounded(v, 3) for k, v in ours.items()}, "nvidia_smi": theirs}
        for key, limit in (("utilization", 0.10), ("sm_clock_mhz", 0.05), ("power_w", 0.10)):
            a, b = ours[key], theirs[key]
            if a is None or b is None:
                problems.append(f"{phase} {key}: no figure ({a} vs {b})")
            elif (abs(a - b) > limit) if key == "utilization" else (abs(a - b) > limit * max(b, 1.0)):
                problems.append(f"{phase} {key}: exporter {a:.3g} vs nvidia-smi {b:.3g}")
    report.check(
        "nvidia_smi_reference",
        not problems,
        "; ".join(problems)
        or "utilization (±10 points), SM clock (±5 %) and power (±10 %) match nvidia-smi in every phase",
        **figures,
    )


# --- main -------------------------------------------------------------------------------------------------------


def requirements(fake: bool) -> str | None:
    """Why this machine cannot run the real check, or None."""
    if fake:
        return None
    try:
        import torch
    except ImportError:
        return (
            "PyTorch is not importable by this Python: install torch (with CUDA) into the environment that runs this "
            "script (for make gpu-check: GPU_PYTHON=/path/to/python), or run --fake"
        )
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU here"
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        return f"NVML does not start here: {exc}"
    return None


def daemon_config(work: Path, fake: bool, window: float, trainer_log: Path, trainer_params: float | None) -> dict:
    jobs: dict[str, Any] = {}
    if trainer_params is not None:
        jobs[TRAINER_JOB] = {"params": trainer_params, "dtype": "bf16", "gpus": [0], "world_size": 1}
    # Sampled and evaluated every second: the run lasts a few MFU windows, and each second gives a comparison.
    return {
        "mfu": {"window": f"{window:g}s", "interval": "1s"},
        "sources": {
            "gpu": {"enabled": True, "interval": "1s", "series": "full"},
            "logs": {
                "enabled": True,
                "interval": "1s",
                "discovered_pods": False,
                "files": [{"path": str(trainer_log), "job": TRAINER_JOB, "format": "hf"}],
            },
            **{name: {"enabled": False} for name in ("rdma", "ethtool", "checkpoint", "preflight")},
        },
        "discovery": {"kubernetes": {"enabled": False}, "slurm": {"enabled": False}},
        "jobs": jobs,
    }


def trainer_params_for(standin: bool) -> float:
    """The params the daemon is told for the Trainer's job: the model's own count (what the callback multiplies)."""
    if standin:
        return 1.0e9
    import torch
    from transformers import LlamaForCausalLM

    config = trainer_model_config()
    with torch.device("meta"):  # counted without allocating or initialising anything
        return float(LlamaForCausalLM(config).num_parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="the fake NVML and a CPU stand-in workload (make test)")
    parser.add_argument("--json", type=Path, help="write the report here (default: print only the summary)")
    parser.add_argument("--work", type=Path, help="keep the daemon's config and logs in this folder")
    parser.add_argument("--gemm-seconds", type=float, help="how long the matrix products run (30; fake 4)")
    parser.add_argument("--trainer-seconds", type=float, help="how long the Trainer trains (45; fake 6)")
    parser.add_argument("--idle-seconds", type=float, help="the idle phase (10; fake 3)")
    # Internal: the processes this script starts.
    parser.add_argument("--serve-fake", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--listen", help=argparse.SUPPRESS)
    parser.add_argument("--trainer-child", metavar="RECORDS", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--standin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fake:
        return serve_fake(args.serve_fake, args.listen)
    if args.trainer_child:
        return trainer_child(args.trainer_child, args.seconds, args.standin)

    fake = args.fake
    why = requirements(fake)
    if why:
        print(f"gpu-truth: cannot run here: {why}", file=sys.stderr)
        return 2
    # 5 s on the fake: a loaded test machine must still get the 3 scrapes the throttle comparison needs.
    gemm_seconds = args.gemm_seconds or (5.0 if fake else 20.0)
    idle_seconds = args.idle_seconds or (3.0 if fake else 10.0)
    # The daemon's MFU window: longer than the products run (its MFU then covers exactly that run); the Trainer
    # trains a few windows' worth past its first step, so several scrape windows lie wholly inside training.
    window = (gemm_seconds + 1.5) if fake else (gemm_seconds + 10.0)
    trainer_seconds = args.trainer_seconds or (window + (3.0 if fake else 25.0))
    report = Report("fake" if fake else "real", args.json)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-truth-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        import transformers  # noqa: F401

        have_transformers = not fake
    except ImportError:
        have_transformers = False
    print(f"gpu-truth ({report.data['mode']} NVML), work folder {work}", flush=True)

    # 1 and 2: the GPU source, then the probes, on NVML in this process.
    if fake:
        import mfu_exporter.sim.nvml as sim_nvml  # noqa: F401 - imported here so the real mode never loads the fake

        nvml = fake_nvml()
    else:
        import pynvml as nvml
    report.figure("machine", machine(nvml, fake))
    gpus = check_gpu_source(report, nvml, samples=6 if fake else 20, pause=0.12 if fake else 0.25)
    if not gpus:
        return finish(report, args.json)
    check_sample_cost(report, nvml, samples=4 if fake else 20, pause=0.11 if fake else 0.25)
    probes = Probes(nvml)
    probes.open()
    idle_probe: dict[str, Any] = {
        "memory_idle": probes.memory(),
        "clock_reasons": probes.clock_reasons(),
        "init_refcount": probes.init_refcount(),
        "xid_wait": probes.xid_wait(),
        "nvlink_errors": probes.fields(NVLINK_ERROR_FIELDS, ALL_LINKS),
        "nvlink_errors_link0": probes.fields(NVLINK_ERROR_FIELDS, 0),
        "gpm_idle": probes.gpm_intervals((0.02, 0.05, 0.1, 0.2) if fake else (0.02, 0.05, 0.1, 0.2, 1.0)),
    }

    # 3-6: the daemon, as a process of its own.
    trainer_log = work / "trainer.log"
    trainer_log.write_text("")  # a work folder used before starts empty: the daemon follows this file from the start
    (work / "trainer-records.jsonl").write_text("")
    standin = not have_transformers
    params = trainer_params_for(standin) if (have_transformers or fake) else None
    daemon = Daemon(work, daemon_config(work, fake, window, trainer_log, params), fake)
    smi = None if fake or not shutil.which("nvidia-smi") else Smi()
    scraper = None
    phases: dict[str, tuple[float, float]] = {}
    try:
        daemon.wait_ready()
        scraper = Scraper(daemon)
        start = time.time()
        idle_probe["fields_idle_1"] = probes.fields(PERF_POLICY_FIELDS | CLOCK_EVENT_FIELDS)
        idle_probe["violation_idle_1"] = probes.violation()
        time.sleep(idle_seconds)
        idle_probe["fields_idle_2"] = probes.fields(PERF_POLICY_FIELDS | CLOCK_EVENT_FIELDS)
        idle_probe["violation_idle_2"] = probes.violation()
        phases["idle"] = (start, time.time())
        idle_probe["perf_policy_idle_rates"] = counter_rates(idle_probe["fields_idle_1"], idle_probe["fields_idle_2"])
        workload = CpuGemm() if fake else GpuGemm()
        phases["gemm"] = run_gemm(report, daemon, scraper, workload, gemm_seconds, window, fake, probes)
        loaded = report.data["figures"]["gemm_under_load"]
        if "fields_1" in loaded and "fields_2" in loaded:
            loaded["rates"] = counter_rates(loaded["fields_1"], loaded["fields_2"])
        del workload
        if not fake:
            import torch

            torch.cuda.empty_cache()
        idle_probe["memory_after_gemm"] = probes.memory()
        if have_transformers or fake:
            from mfu_exporter.model.flops import peak_flops

            peak = peak_flops(gpus[0]["name"], "bf16")
            start = time.time()
            run_trainer(report, daemon, work, trainer_seconds, window, standin, peak)
            phases["trainer"] = (start, time.time())
        if not have_transformers:
            report.check(
                "trainer_log_mfu",
                None,
                "transformers is not importable here (fake mode runs the HF-format stand-in above instead)"
                if fake
                else "transformers is not importable here",
            )
        scraper.stop()
        idle_cpu = cpu_share(scraper.between(*phases["idle"]))
        busy_cpu = cpu_share(scraper.between(*phases["gemm"]))
        report.check(
            "daemon_cpu",
            idle_cpu is not None and busy_cpu is not None,
            f"the daemon's own CPU at 1 s sampling: {idle_cpu * 100:.2f} % of a core with the GPU idle, "
            f"{busy_cpu * 100:.2f} % busy (make bench's figure is on the fake NVML with a full node)"
            if idle_cpu is not None and busy_cpu is not None
            else "process_cpu_seconds_total missing",
            idle_core_share=rounded(idle_cpu),
            busy_core_share=rounded(busy_cpu),
        )
        compare_smi(report, smi, scraper, phases)
        report.figure("nvml_probes", idle_probe)
        report.figure(
            "phases_exporter_medians",
            {
                phase: {
                    name: rounded(series_median(scraper.between(s + 2, e), name), 4)
                    for name in (
                        "mfu_gpu_utilization_ratio",
                        "mfu_gpu_tensor_active_ratio",
                        "mfu_gpu_sm_active_ratio",
                        "mfu_gpu_hardware_flops_utilization_ratio",
                        "mfu_gpu_sm_clock_hertz",
                        "mfu_gpu_power_watts",
                        "mfu_gpu_memory_used_bytes",
                    )
                }
                for phase, (s, e) in phases.items()
            },
        )
        if smi is not None:
            report.figure("nvidia_smi_rows", [[round(t, 2), r] for t, r in smi.rows])
    except Exception as exc:  # noqa: BLE001 - the report says what broke; the rest of it is still worth having
        report.check("run", False, f"{type(exc).__name__}: {exc}; exporter log: {daemon.tail()[-800:]}")
    finally:
        if scraper is not None:
            scraper.stop()
        if smi is not None:
            smi.stop()
        daemon.stop()
        probes.close()
    report.figure("exporter_log_tail", daemon.tail()[-3000:])
    return finish(report, args.json)


def machine(nvml: Any, fake: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0], "fake": fake}
    try:
        import pynvml

        out["nvidia_ml_py"] = getattr(pynvml, "__version__", None)
    except ImportError:
        pass
    try:
        nvml.nvmlInit()
        out["driver"] = nvml.nvmlSystemGetDriverVersion()
        out["gpus"] = [
            nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())
        ]
        nvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001
        out["nvml_error"] = str(exc)
    if not fake:
        import torch

        out["torch"] = torch.__version__
        out["cuda_capability"] = list(torch.cuda.get_device_capability(0))
        out["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    return out


def jsonable(value: Any) -> Any:
    """The report as JSON takes it: string keys, lists for tuples, str for anything else exotic."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def finish(report: Report, path: Path | None) -> int:
    report.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    checks = report.data["checks"]
    counts = {v: sum(c["verdict"] == v for c in checks) for v in ("PASS", "FAIL", "SKIP")}
    print(f"gpu-truth: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped", flush=True)
    if path is not None:
        report.save()
        print(f"gpu-truth: report written to {path}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
