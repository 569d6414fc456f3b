"""Preflight: the guide's fabric verification before a distributed job, as read-only checks of one node.

Each check compares what the node has (socket buffers, RDMA ports, PFC/ECN, GPUDirect, PCIe topology, the job's
NCCL environment, the GPUs) with what a training job needs, and says how to fix a miss; none changes a setting.
A check that does not apply to this machine (no RDMA ports, no NVML) is SKIP with the reason. ``mfu-exporter
check`` prints the results (``mfu_exporter.preflight.report``); the daemon's ``preflight`` source exports them as
``mfu_preflight_check_ok``. The node's facts are ``mfu_exporter.preflight.facts``, the fabric's checks
``mfu_exporter.preflight.fabric``; here are the NCCL environment's and the GPUs' checks and the list of every check.

Files are read under configurable roots (``--path.sysfs``, ``--path.procfs``) so a container can check its host
and tests can check fixture trees. The PFC and global-pause queries go to the kernel (``mfu_exporter.node.nic_qos``).
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Callable, Iterable

from mfu_exporter.node.pci import GdrLevel
from mfu_exporter.preflight.fabric import (
    SOCKET_BUFFER_SYSCTLS,
    check_acs,
    check_ecn,
    check_global_pause,
    check_gpu_nic_affinity,
    check_gpudirect,
    check_iommu,
    check_link_layer,
    check_nic_per_gpu,
    check_node_bandwidth,
    check_pfc,
    check_pfc_other_priorities,
    check_port_rate,
    check_port_state,
    check_socket_buffer,
    nearest_nics,
    no_ports,
)
from mfu_exporter.preflight.facts import (
    GUIDE_NCCL,
    THROTTLE_FAULTS,
    CheckResult,
    NodeFacts,
    PreflightSettings,
    Status,
    plural,
)

# --- checks: the job's NCCL environment -------------------------------------------------------------------------


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as a shell, systemd or Docker env file writes them (``export``, quotes, comments).

    Raises OSError when unreadable and UnicodeDecodeError when not UTF-8; the file is decoded whole, so the
    error's ``start`` is the offending byte's offset in the file.
    """
    env = {}
    with open(path, "rb") as handle:
        text = handle.read().decode("utf-8")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            parts = shlex.split(value, comments=True)
        except ValueError:  # an unbalanced quote: keep the text as written
            parts = [value.strip()]
        env[key.strip()] = parts[0] if parts else ""
    return env


def _nccl_skip(facts: NodeFacts, name: str, expected: str) -> CheckResult | None:
    if facts.nccl_env is None:
        return CheckResult(
            f"nccl.{name}",
            Status.SKIP,
            "no job environment given (--env-file, or sources.preflight.nccl_env_file)",
            expected,
        )
    if not facts.ports:
        return CheckResult(f"nccl.{name}", Status.SKIP, no_ports(facts) + "; NCCL uses sockets", expected)
    return None


def check_nccl_ib_disable(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = f"unset or {GUIDE_NCCL['NCCL_IB_DISABLE']} (the guide's value)"
    skipped = _nccl_skip(facts, "NCCL_IB_DISABLE", expected)
    if skipped:
        return skipped
    value = facts.nccl_env.get("NCCL_IB_DISABLE")
    if value is None or value.strip() == "0":
        return CheckResult("nccl.NCCL_IB_DISABLE", Status.PASS, "unset" if value is None else value, expected)
    return CheckResult(
        "nccl.NCCL_IB_DISABLE",
        Status.FAIL,
        f"{value}: NCCL ignores the RDMA ports and uses TCP sockets",
        expected,
        "export NCCL_IB_DISABLE=0 (in the job's environment)",
    )


NCCL_DEFAULT_GDR_LEVEL = GdrLevel.PXB  # NCCL's default when NCCL_NET_GDR_LEVEL is unset


def parse_gdr_level(value: str) -> GdrLevel | None:
    text = value.strip().upper()
    if text in GdrLevel.__members__:
        return GdrLevel[text]
    if text.isdigit():
        return GdrLevel(min(int(text), GdrLevel.SYS))
    return None


def farthest_gpu_nic_path(facts: NodeFacts) -> GdrLevel | None:
    """The longest of the GPU-to-nearest-NIC paths: the GDR level every GPU needs; None when the topology is unknown."""
    if facts.gpus.unavailable:
        return None
    return max((affinity.level for _, affinity in nearest_nics(facts).values()), default=None)


def check_nccl_gdr_level(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    name = "NCCL_NET_GDR_LEVEL"
    check = f"nccl.{name}"
    guide = GUIDE_NCCL[name]
    guide_expected = f"{guide} (SYS), the guide's value"
    skipped = _nccl_skip(facts, name, guide_expected)
    if skipped:
        return skipped
    value = facts.nccl_env.get(name)
    level = NCCL_DEFAULT_GDR_LEVEL if value is None else parse_gdr_level(value)
    observed = f"unset (NCCL default {NCCL_DEFAULT_GDR_LEVEL.name})" if value is None else value
    fix = f"export {name}={guide} (in the job's environment)"
    if level is None:
        return CheckResult(
            check, Status.FAIL, f"{value}: not a level NCCL knows", "LOC, PIX, PXB, PHB, SYS or 0–5", fix
        )
    if level == GdrLevel.LOC:
        return CheckResult(check, Status.FAIL, f"{observed}: GPUDirect RDMA disabled", guide_expected, fix)
    needed = farthest_gpu_nic_path(facts)
    if needed is None:  # without the topology, hold the value to the guide's
        if level == GdrLevel.SYS:
            return CheckResult(check, Status.PASS, f"{observed} (GPU/NIC topology unknown)", guide_expected)
        return CheckResult(check, Status.WARN, f"{observed} (GPU/NIC topology unknown)", guide_expected, fix)
    expected = f"≥ {needed.name}, the farthest GPU-to-nearest-NIC path here (guide: {guide})"
    if level >= needed:
        return CheckResult(check, Status.PASS, observed, expected)
    return CheckResult(
        check, Status.FAIL, f"{observed}: GPUDirect RDMA off for GPUs whose NIC is {needed.name} away", expected, fix
    )


def hca_selection(spec: str, devices: Iterable[str]) -> tuple[set[str], list[str]]:
    """What NCCL_IB_HCA selects among ``devices``: (selected devices, entries that match none).

    Syntax (NCCL docs): a comma list of ``device[:port]``; a leading ``^`` excludes them instead, a leading ``=``
    (after any ``^``) asks for exact names instead of prefixes.
    """
    devices = sorted(set(devices))
    text = spec.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    names = [entry.split(":")[0].strip() for entry in text.split(",") if entry.strip()]
    matched, unmatched = set(), []
    for name in names:
        hits = {d for d in devices if (d == name if exact else d.startswith(name))}
        if not hits:
            unmatched.append(name)
        matched |= hits
    return (set(devices) - matched if exclude else matched), unmatched


def check_nccl_ib_hca(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    name = "NCCL_IB_HCA"
    expected = "unset, or naming the RDMA devices found and all ACTIVE ones"
    skipped = _nccl_skip(facts, name, expected)
    if skipped:
        return skipped
    value = facts.nccl_env.get(name)
    active = sorted({p.device for p in facts.active_ports})
    fix = f"export {name}={','.join(active)} (in the job's environment)" if active else ""
    if value is None:
        return CheckResult(f"nccl.{name}", Status.PASS, "unset (NCCL uses every RDMA device)", expected)
    selected, unmatched = hca_selection(value, (p.device for p in facts.ports))
    if unmatched:
        return CheckResult(
            f"nccl.{name}", Status.FAIL, f"{value}: {', '.join(unmatched)} match no device here", expected, fix
        )
    unused = [d for d in active if d not in selected]
    if active and len(unused) == len(active):
        return CheckResult(
            f"nccl.{name}",
            Status.FAIL,
            f"{value}: selects no ACTIVE device, so NCCL falls back to sockets",
            expected,
            fix,
        )
    if unused:
        return CheckResult(
            f"nccl.{name}",
            Status.WARN,
            f"{value}: leaves {', '.join(unused)} unused ({len(active) - len(unused)} of {len(active)} ACTIVE)",
            expected,
            fix,
        )
    return CheckResult(f"nccl.{name}", Status.PASS, value, expected)


# --- checks: GPUs -----------------------------------------------------------------------------------------------


def check_gpu_inventory(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    want = f"{settings.expected_gpus} " if settings.expected_gpus else ""
    expected = f"{want}GPUs of one model, all visible to NVML"
    if facts.gpus.unavailable:
        return CheckResult("gpu.inventory", Status.SKIP, facts.gpus.unavailable, expected)
    models = Counter(g.name for g in facts.gpus.devices if g.name)
    count = len(facts.gpus.devices)
    observed = ", ".join(f"{n}× {model}" for model, n in sorted(models.items())) or "no GPUs"
    on_bus = facts.topology.nvidia_gpus()
    problems = []
    if len(models) > 1:
        problems.append("mixed models")
    if on_bus and len(on_bus) != count:
        problems.append(f"NVML sees {count}, the PCI bus has {len(on_bus)}")
    if settings.expected_gpus and count != settings.expected_gpus:
        problems.append(f"{count} instead of {settings.expected_gpus}")
    if problems:
        return CheckResult(
            "gpu.inventory",
            Status.FAIL,
            f"{observed}: {'; '.join(problems)}",
            expected,
            "nvidia-smi -L; dmesg | grep -iE 'NVRM|Xid' (a GPU missing from NVML needs a reset or service)",
        )
    return CheckResult("gpu.inventory", Status.PASS, observed, expected)


def check_gpu_persistence(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "persistence mode on for every GPU"
    if facts.gpus.unavailable:
        return CheckResult("gpu.persistence_mode", Status.SKIP, facts.gpus.unavailable, expected)
    answering = [g for g in facts.gpus.devices if g.lost is None and g.persistence_mode is not None]
    if not answering:
        return CheckResult("gpu.persistence_mode", Status.SKIP, "no GPU reports persistence mode", expected)
    off = [g.index for g in answering if not g.persistence_mode]
    if not off:
        return CheckResult("gpu.persistence_mode", Status.PASS, f"on for {plural(len(answering), 'GPU')}", expected)
    return CheckResult(
        "gpu.persistence_mode",
        Status.WARN,
        f"off for GPU {', '.join(map(str, off))}",
        expected,
        "nvidia-smi -pm 1 (or run nvidia-persistenced)",
    )


def check_gpu_health(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "every GPU answering, none held back by a hardware slowdown, thermal limit or power brake"
    if facts.gpus.unavailable:
        return CheckResult("gpu.health", Status.SKIP, facts.gpus.unavailable, expected)
    problems, fixes = [], []
    for gpu in facts.gpus.devices:
        if gpu.lost:
            problems.append(f"GPU {gpu.index} lost ({gpu.lost})")
            fixes.append(f"nvidia-smi -q -i {gpu.index}")
            continue
        faults = [name for bit, name in THROTTLE_FAULTS.items() if (gpu.clocks_event_reasons or 0) & bit]
        if faults:
            problems.append(f"GPU {gpu.index} {'+'.join(faults)}")
            fixes.append(f"nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {gpu.index}")
    if problems:
        return CheckResult("gpu.health", Status.FAIL, ", ".join(problems), expected, "; ".join(fixes))
    return CheckResult("gpu.health", Status.PASS, f"{plural(len(facts.gpus.devices), 'GPU')} healthy", expected)


CheckFunction = Callable[[NodeFacts, PreflightSettings], CheckResult]


def _socket_buffer_check(name: str) -> CheckFunction:
    return lambda facts, settings: check_socket_buffer(facts, settings, name)


CHECKS: tuple[CheckFunction, ...] = (
    *(_socket_buffer_check(name) for name in SOCKET_BUFFER_SYSCTLS),
    check_port_state,
    check_port_rate,
    check_link_layer,
    check_node_bandwidth,
    check_nic_per_gpu,
    check_gpu_nic_affinity,
    check_pfc,
    check_pfc_other_priorities,
    check_ecn,
    check_global_pause,
    check_gpudirect,
    check_acs,
    check_iommu,
    check_nccl_ib_disable,
    check_nccl_gdr_level,
    check_nccl_ib_hca,
    check_gpu_inventory,
    check_gpu_persistence,
    check_gpu_health,
)


def run_checks(facts: NodeFacts, settings: PreflightSettings) -> list[CheckResult]:
    return [check(facts, settings) for check in CHECKS]
