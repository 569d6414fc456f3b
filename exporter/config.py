"""The YAML config: a declarative schema, defaults for every key, and errors that name file, key and expected form.

Every key is optional. Unknown keys are errors, because a typo that passes silently (``intreval: 5s``) costs an
operator an afternoon. The schema is one table of frozen dataclasses, one per section (``Config`` and below), each
key with its validator and default. ``load_config`` returns the validated nested dicts with every default filled in;
``typed_config(config)`` gives the same values as those dataclasses (``typed_config(config).sources.gpu.interval``), the
tri-state ``enabled`` as an ``Enabled``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, TypeVar

import yaml

from exporter.quantities import parse_duration, parse_quantity

DEFAULT_LISTEN_ADDRESS = ":9495"
JOB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$")
JOB_NAME_FORM = "a job name of 1–128 letters, digits and _ . : @ + - starting with a letter or digit"


class ConfigError(Exception):
    """A config problem, worded for the person who wrote the file: ``file: key.path: expected X, got Y``."""

    def __init__(self, file: str, path: str, expected: str, got: Any = ..., problem: str = ""):
        self.file, self.path, self.expected = file, path, expected
        self.detail = f"{problem}expected {expected}"
        if got is not ...:
            self.detail += f", got {_show(got)}"
        super().__init__(f"{file}: {path}: {self.detail}" if path else f"{file}: {self.detail}")


class Invalid(Exception):
    """Raised by a field validator; ``load_config`` adds the file and key path."""

    def __init__(self, expected: str, path_suffix: str = "", got: Any = ...):
        super().__init__(expected)
        self.expected = expected
        self.path_suffix = path_suffix
        self.got = got


def _show(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


Validator = Callable[[Any], Any]


def quantity(value: Any) -> float:
    try:
        return parse_quantity(value)
    except (ValueError, OverflowError):  # OverflowError: an integer too large for a float
        raise Invalid('a number like 7e10 or "70B"') from None


def positive_quantity(value: Any) -> float:
    number = quantity(value)
    if number <= 0:
        raise Invalid('a positive number like 7e10 or "70B"')
    return number


def duration(value: Any) -> float:
    try:
        seconds = parse_duration(value)
    except (ValueError, OverflowError):
        raise Invalid('a duration like "30s", "5m" or "1h"') from None
    if seconds <= 0:
        raise Invalid('a positive duration like "30s", "5m" or "1h"')
    return seconds


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise Invalid("a positive whole number")
    return value


def pfc_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 7:
        raise Invalid("an 802.1p priority from 0 to 7")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid("true or false")
    return value


def ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise Invalid("a ratio between 0 and 1, like 0.45")
    return float(value)


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid("a non-empty string")
    return value


def optional(validator: Validator) -> Validator:
    def check(value: Any) -> Any:
        return None if value is None else validator(value)

    return check


def choice(*options: str) -> Validator:
    def check(value: Any) -> str:
        if value is True or value is False:
            value = "true" if value else "false"
        if value not in options:
            raise Invalid("one of " + ", ".join(options))
        return value

    return check


def regex_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise Invalid("a list of regular expressions")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise Invalid("a regular expression string", f"[{index}]", item)
        try:
            re.compile(item)
        except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999} overflows
            raise Invalid(f"a valid regular expression ({exc})", f"[{index}]", item) from None
    return value


def listen_address(value: Any) -> str:
    if not isinstance(value, str) or not re.match(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]*):[0-9]{1,5}$", value):
        raise Invalid('HOST:PORT such as ":9495" or "127.0.0.1:9495"')
    if not 0 < int(value.rsplit(":", 1)[1]) < 65536:
        raise Invalid("a port between 1 and 65535")
    return value


# Bounds on the facts a job gives (config jobs: and the progress API alike), wide enough for any real model and
# node, narrow enough that every figure derived from them (FLOPs per token, FLOPs totals, MFU, ETA) is a finite
# double: 6·P + 12·L·H·Q·T stays below 1.3e25 FLOPs per token, times at most 1e21 tokens. docs/metrics.md lists them.
MAX_PARAMS = 1e15  # a quadrillion parameters; the largest published models have ~2e12
MAX_LAYERS = MAX_HEADS = MAX_HEAD_DIM = 100_000
MAX_SEQ_LEN = 1_000_000_000  # a billion-token context
MAX_TOKENS = 1e21  # far above any training run (Llama 3: 1.56e13), per node or in all
MAX_JOB_GPUS = 1024  # GPUs of one job on one node (an NVL72 rack is 72)
MIN_PEAK_TFLOPS, MAX_PEAK_TFLOPS = 1e-3, 1e6  # per GPU: a GFLOP/s to an exaFLOP/s (a B200 is 2,250 dense bf16)


def bounded_quantity(low: float, high: float, example: str) -> Validator:
    """A quantity (number or "70B" form) from ``low`` to ``high``."""

    def check(value: Any) -> float:
        number = quantity(value)
        if not low <= number <= high:
            raise Invalid(f"a number from {low:g} to {high:g}, like {example}")
        return number

    return check


def bounded_int(low: int, high: int) -> Validator:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise Invalid(f"a whole number from {low} to {high:,}")
        return value

    return check


def job_gpus(value: Any) -> int | list[int | str]:
    """A GPU count, or a list of GPU indices and/or UUIDs, each GPU once (a repeat would count its peak twice)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_JOB_GPUS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_JOB_GPUS:
        raise Invalid(f"a GPU count from 1 to {MAX_JOB_GPUS} (GPUs of the job on this node)")
    if isinstance(value, list) and len(value) > MAX_JOB_GPUS:
        raise Invalid(f"a list of at most {MAX_JOB_GPUS} GPUs (GPUs of the job on this node)")
    if (
        isinstance(value, list)
        and value
        and all(
            (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_JOB_GPUS)
            or (isinstance(v, str) and 0 < len(v) <= 256)
            for v in value
        )
    ):
        seen: set[int | str] = set()
        for item in value:
            if item in seen:
                raise Invalid(f"each GPU listed once, like [0, 1, 2, 3] ({_show(item)} is listed twice)")
            seen.add(item)
        return value
    raise Invalid("a GPU count like 8, or a list of GPU indices or UUIDs like [0, 1, 2, 3]")


@dataclass(frozen=True)
class Section:
    """A mapping with known keys, each with a validator (or a nested Section) and a default."""

    fields: dict[str, tuple[Any, Any]]


@dataclass(frozen=True)
class MapOf:
    """A mapping from names (validated by ``key``) to sections, e.g. ``jobs: {llama: {...}}``."""

    key: Validator
    key_form: str
    value: Section


@dataclass(frozen=True)
class ListOf:
    value: Section


LOG_FORMATS = ("auto", "torchtitan", "megatron", "hf", "nemo", "deepspeed", "regex")  # = exporter.logs.FORMATS
# The groups a regex pattern may name (exporter.logs.regex reads this list).
LOG_REGEX_GROUPS = (
    "step",
    "time",
    "tokens_seen",
    "samples_seen",
    "tokens_per_second_per_gpu",
    "samples_per_second",
    "global_batch",
    "step_seconds",
    "tflops_per_gpu",
    "mfu",
)
LOG_PROGRESS_GROUPS = ("step", "tokens_seen", "samples_seen", "tokens_per_second_per_gpu", "samples_per_second")


def log_pattern(value: Any) -> str:
    form = "a regular expression with named groups, e.g. 'step (?P<step>\\d+) tokens (?P<tokens_seen>\\d+)'"
    if not isinstance(value, str) or not value:
        raise Invalid(form)
    try:
        compiled = re.compile(value)
    except re.error as exc:
        raise Invalid(f"{form} (this one does not compile: {exc})") from None
    unknown = sorted(set(compiled.groupindex) - set(LOG_REGEX_GROUPS))
    if unknown:
        raise Invalid(f"group names among {', '.join(LOG_REGEX_GROUPS)} ({', '.join(unknown)} is not one)")
    if not set(compiled.groupindex) & set(LOG_PROGRESS_GROUPS):
        raise Invalid(f"a pattern naming at least one of the groups {', '.join(LOG_PROGRESS_GROUPS)}")
    return value


# Job discovery defaults (model/discovery.py explains them). Kubernetes label keys naming the job a pod belongs to,
# first match wins; JobSet before batch Job, since a JobSet's pods also carry its child Job's label,
# <jobset>-<replicated job>-<index>, which differs across nodes.
DISCOVERY_LABEL_KEYS = (
    "training.kubeflow.org/job-name",  # Kubeflow training-operator v1: PyTorchJob, MPIJob, TFJob...
    "jobset.sigs.k8s.io/jobset-name",  # JobSet, and Kubeflow Trainer v2 TrainJob (a JobSet named after it)
    "volcano.sh/job-name",  # Volcano vcjob
    "leaderworkerset.sigs.k8s.io/name",  # LeaderWorkerSet
    "kueue.x-k8s.io/pod-group-name",  # Kueue plain-pod groups
    "batch.kubernetes.io/job-name",  # batch/v1 Job
    "job-name",  # batch/v1 Job, the legacy unprefixed label
)
# Without labels: <job>-master-0, <job>-worker-3, <job>-launcher-0 (Kubeflow v1's and MPI's pod names) become <job>.
DISCOVERY_POD_NAME_PATTERN = r"^(?P<job>.+)-(?:master|worker|launcher)-[0-9]+$"
PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def string_list(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise Invalid("a list of non-empty strings")
    return value


def command(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise Invalid('a command as a list of arguments, like ["squeue", "-h", "-o", "%j", "-j", "{job}"], or []')
    if value and not any("{job}" in item for item in value):
        raise Invalid('a command with a "{job}" argument, where the Slurm job ID goes')
    return value


def pod_name_pattern(value: Any) -> str:
    form = "a regular expression with a group naming the job, like ^(?P<job>.+)-worker-[0-9]+$"
    if not isinstance(value, str):
        raise Invalid(form)
    try:
        compiled = re.compile(value)
    except (re.error, OverflowError, RecursionError) as exc:
        raise Invalid(f"{form} ({exc})") from None
    if "job" not in compiled.groupindex and compiled.groups < 1:
        raise Invalid(form)
    return value


class Enabled(str, Enum):
    """The tri-state of ``enabled`` (and of a watch's ``poll``): ``auto`` uses it where it works and reports it down
    where not, ``true`` requires it (the start fails without it), ``false`` turns it off.

    A ``str`` enum, so the validated dicts that carry it still compare equal to the strings of the file."""

    AUTO = "auto"
    TRUE = "true"
    FALSE = "false"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


_tristate_choice = choice("auto", "true", "false")


def tristate(value: Any) -> Enabled:
    return Enabled(_tristate_choice(value))


# --- the declarative table ----------------------------------------------------------------------------------------
#
# Each section of the file is a frozen dataclass below; each key a field made by ``setting(validator, default)``.
# The table is written once: ``schema_of`` reads it into the ``Section`` tree that ``validate`` checks a file against
# (nested dicts, the defaults filled in), and ``settings_of`` turns such dicts into these dataclasses (lists become
# tuples). The dataclasses' own defaults are the table's, so ``AttributionConfig()`` is the default attribution, and
# classes elsewhere that need a default (``PreflightSettings``, ``JobTracker``) take it from here.

_SPEC = "config_spec"


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def setting(validator: Validator, default: Any = None) -> Any:
    """A key: its validator (what it accepts and how it reads) and its default (None: unset, or required in a list)."""
    return field(default=_frozen(default), metadata={_SPEC: (validator, default)})


def subsection(cls: type) -> Any:
    """A nested section: a mapping of its own keys, every default when absent."""
    return field(default_factory=cls, metadata={_SPEC: (cls, None)})


@dataclass(frozen=True)
class ListOfConfig:
    """A list of sections, each a ``value`` (``sources.checkpoint.watch``)."""

    value: type


@dataclass(frozen=True)
class MapOfConfig:
    """Names (checked by ``key``, worded ``key_form``) to sections (``jobs``)."""

    key: Validator
    key_form: str
    value: type


def items(spec: ListOfConfig | MapOfConfig) -> Any:
    """A list or a map of sections, empty by default."""
    if isinstance(spec, MapOfConfig):
        return field(default_factory=dict, metadata={_SPEC: (spec, {})})
    return field(default=(), metadata={_SPEC: (spec, [])})


def _job_name(value: Any) -> str:
    if not isinstance(value, str) or not JOB_NAME_PATTERN.match(value):
        raise Invalid(JOB_NAME_FORM)
    return value


@dataclass(frozen=True)
class WebServerConfig:
    listen_address: str = setting(listen_address, DEFAULT_LISTEN_ADDRESS)
    config_file: str | None = setting(optional(string))


# How many series a source exports (docs/metrics.md "Series levels"): every metric family is tagged with the lowest
# level at which it is on. minimal: what the central rules read (the node summaries, up and identity); standard (the
# default): what a rule, dashboard panel or runbook step reads; full: every raw counter, for drill-down.
SERIES_LEVELS = ("minimal", "standard", "full")
# The hw_counters exported per RDMA port at series: standard (sources.rdma.hw_counters): the DCQCN counters the fabric
# dashboard and MfuRoceMisconfigured read per port. The error counters reach rules and dashboards summed per node
# (mfu_node_rdma_errors_total); series: full exports every hw_counters file whatever this list says.
DEFAULT_HW_COUNTERS = ("np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored", "np_ecn_marked_roce_packets")


@dataclass(frozen=True)
class SourceConfig:
    """What every source has: whether it runs, how often it samples, how long one sample may take, and how many
    series it exports."""

    enabled: Enabled = setting(tristate, Enabled.AUTO)
    interval: float = setting(duration, 1.0)
    timeout: float = setting(duration, 5.0)
    series: str = setting(choice(*SERIES_LEVELS), "standard")


@dataclass(frozen=True)
class GpuConfig(SourceConfig):
    retry_interval: float = setting(duration, 60.0)
    gpm: bool = setting(boolean, True)


@dataclass(frozen=True)
class RdmaConfig(SourceConfig):
    devices_include: tuple[str, ...] = setting(regex_list, [".*"])
    devices_exclude: tuple[str, ...] = setting(regex_list, [r".*vf.*", r".*rep.*"])
    virtual_functions: bool = setting(boolean, False)
    hw_counters: tuple[str, ...] = setting(string_list, list(DEFAULT_HW_COUNTERS))


@dataclass(frozen=True)
class EthtoolConfig(SourceConfig):
    interfaces_include: tuple[str, ...] = setting(regex_list, [])
    interfaces_exclude: tuple[str, ...] = setting(
        regex_list, [r"^lo$", r"^(br|docker|virbr|veth|cni|flannel|cali|vxlan)"]
    )
    stats_include: tuple[str, ...] = setting(regex_list, [])


@dataclass(frozen=True)
class WatchConfig:
    path: str = setting(string)
    job: str = setting(_job_name)
    done_marker: str | None = setting(optional(string))
    quiet_period: float = setting(duration, 30.0)
    poll: Enabled = setting(tristate, Enabled.AUTO)


@dataclass(frozen=True)
class CheckpointConfig(SourceConfig):
    watch: tuple[WatchConfig, ...] = items(ListOfConfig(WatchConfig))
    started_timeout: float = setting(duration, 7200.0)
    forget_after: float = setting(duration, 86400.0)


@dataclass(frozen=True)
class LogFileConfig:
    path: str = setting(string)
    job: str = setting(_job_name)
    format: str = setting(choice(*LOG_FORMATS), "auto")
    pattern: str | None = setting(optional(log_pattern))


@dataclass(frozen=True)
class LogsConfig(SourceConfig):
    files: tuple[LogFileConfig, ...] = items(ListOfConfig(LogFileConfig))
    discovered_pods: bool = setting(boolean, True)
    pods_root: str = setting(string, "/var/log/pods")
    takeover_after: float = setting(duration, 30.0)
    max_line_bytes: int = setting(positive_int, 1 << 20)


@dataclass(frozen=True)
class PreflightConfig(SourceConfig):
    interval: float = setting(duration, 300.0)
    timeout: float = setting(duration, 30.0)
    link_layer: str | None = setting(optional(choice("Ethernet", "InfiniBand")))
    roce_priority: int = setting(pfc_priority, 3)  # the priority NVIDIA's RoCE configuration guides make lossless
    port_rate_gbps: float | None = setting(optional(positive_quantity))
    min_node_gbps: float = setting(positive_quantity, 400.0)  # the guide's FAQ: at least 400 Gb/s per node
    socket_buffer_bytes: int = setting(positive_int, 64 * 1024 * 1024)  # the guide's net.core.rmem_max=67108864
    expected_gpus: int | None = setting(optional(positive_int))
    nccl_env_file: str | None = setting(optional(string))
    devices_include: tuple[str, ...] = setting(regex_list, [".*"])
    devices_exclude: tuple[str, ...] = setting(regex_list, [r".*vf.*", r".*rep.*"])


@dataclass(frozen=True)
class StorageConfig(SourceConfig):
    """``sources.storage``: reads per mount of the jobs' data (``jobs.<name>.data_paths``), of their checkpoint
    watches and of ``mounts``, and the nvidia-fs driver's GPUDirect Storage counters (``gds``)."""

    interval: float = setting(duration, 5.0)
    mounts: tuple[str, ...] = setting(string_list, [])
    gds: Enabled = setting(tristate, Enabled.AUTO)


@dataclass(frozen=True)
class SourcesConfig:
    gpu: GpuConfig = subsection(GpuConfig)
    rdma: RdmaConfig = subsection(RdmaConfig)
    ethtool: EthtoolConfig = subsection(EthtoolConfig)
    checkpoint: CheckpointConfig = subsection(CheckpointConfig)
    logs: LogsConfig = subsection(LogsConfig)
    preflight: PreflightConfig = subsection(PreflightConfig)
    storage: StorageConfig = subsection(StorageConfig)


@dataclass(frozen=True)
class MfuConfig:
    window: float = setting(duration, 60.0)


@dataclass(frozen=True)
class AttributionConfig:
    """The loss attribution's thresholds (``exporter.model.attribution``)."""

    tolerance: float = setting(ratio, 0.10)  # a gap under 10% of the baseline is noise: cause "none"
    pause_ratio: float = setting(ratio, 0.05)  # share of time a port was paused
    # A fixed level, not a rise: above what the job's ports see when healthy.
    cnp_per_second: float = setting(positive_quantity, 1000.0)
    idle_utilization: float = setting(ratio, 0.5)  # mean GPU utilization under which GPUs count as mostly idle
    baseline_window: float = setting(duration, 3600.0)
    baseline_percentile: float = setting(ratio, 0.9)
    baseline_min_samples: int = setting(positive_int, 30)
    baseline_interval: float = setting(duration, 10.0)


@dataclass(frozen=True)
class JobConfig:
    """The model facts of one job: ``jobs.<name>`` in the config, and the progress API's ``model`` and others."""

    params: float | None = setting(optional(bounded_quantity(1, MAX_PARAMS, '"70B" or 7e10')))
    layers: int | None = setting(optional(bounded_int(1, MAX_LAYERS)))
    heads: int | None = setting(optional(bounded_int(1, MAX_HEADS)))
    head_dim: int | None = setting(optional(bounded_int(1, MAX_HEAD_DIM)))
    seq_len: int | None = setting(optional(bounded_int(1, MAX_SEQ_LEN)))
    causal_attention: bool = setting(boolean, False)
    dtype: str = setting(choice("bf16", "fp16", "fp8", "tf32"), "bf16")
    gpus: int | tuple[int | str, ...] | None = setting(optional(job_gpus))
    target_tokens: float | None = setting(optional(bounded_quantity(1, MAX_TOKENS, '"15T"')))
    peak_tflops: float | None = setting(
        optional(bounded_quantity(MIN_PEAK_TFLOPS, MAX_PEAK_TFLOPS, "989.4 (an H100's dense bf16)"))
    )
    expected_mfu: float | None = setting(optional(ratio))
    # What a log-fed job's lines may not say (sources.logs): its GPUs over all nodes, and sequences per step.
    world_size: int | None = setting(optional(positive_int))
    global_batch: int | None = setting(optional(positive_int))
    # Where the job reads its dataset from (sources.storage exports the mounts holding them); config only, not a
    # fact the progress API takes.
    data_paths: tuple[str, ...] = setting(string_list, [])


@dataclass(frozen=True)
class ApiServerConfig:
    enabled: Enabled = setting(tristate, Enabled.AUTO)
    url: str | None = setting(optional(string))
    token_path: str = setting(string, f"{SERVICE_ACCOUNT_DIR}/token")
    ca_path: str | None = setting(optional(string), f"{SERVICE_ACCOUNT_DIR}/ca.crt")
    timeout: float = setting(duration, 2.0)
    retry_after: float = setting(duration, 300.0)


@dataclass(frozen=True)
class KubernetesConfig:
    enabled: Enabled = setting(tristate, Enabled.AUTO)
    socket: str = setting(string, PODRESOURCES_SOCKET)
    timeout: float = setting(duration, 5.0)
    max_message_bytes: int = setting(positive_int, 64 * 1024 * 1024)
    api_server: ApiServerConfig = subsection(ApiServerConfig)
    label_keys: tuple[str, ...] = setting(string_list, list(DISCOVERY_LABEL_KEYS))
    pod_name_pattern: str = setting(pod_name_pattern, DISCOVERY_POD_NAME_PATTERN)


@dataclass(frozen=True)
class SlurmConfig:
    enabled: Enabled = setting(tristate, Enabled.AUTO)
    job_mapping_dir: str | None = setting(optional(string))
    processes: bool = setting(boolean, True)
    cgroup_root: str | None = setting(optional(string))
    name_command: tuple[str, ...] = setting(command, [])
    name_timeout: float = setting(duration, 5.0)


@dataclass(frozen=True)
class DiscoveryConfig:
    interval: float = setting(duration, 5.0)
    timeout: float = setting(duration, 10.0)
    max_jobs: int = setting(positive_int, 64)
    kubernetes: KubernetesConfig = subsection(KubernetesConfig)
    slurm: SlurmConfig = subsection(SlurmConfig)


@dataclass(frozen=True)
class IngestConfig:
    token_file: str | None = setting(optional(string))
    max_jobs: int = setting(positive_int, 32)
    max_body_bytes: int = setting(positive_int, 64 * 1024)
    job_ttl: float = setting(duration, 86400.0)


@dataclass(frozen=True)
class Config:
    """The whole file, every key optional."""

    web: WebServerConfig = subsection(WebServerConfig)
    sources: SourcesConfig = subsection(SourcesConfig)
    mfu: MfuConfig = subsection(MfuConfig)
    attribution: AttributionConfig = subsection(AttributionConfig)
    jobs: Mapping[str, JobConfig] = items(MapOfConfig(_job_name, JOB_NAME_FORM, JobConfig))
    discovery: DiscoveryConfig = subsection(DiscoveryConfig)
    ingest: IngestConfig = subsection(IngestConfig)


def schema_of(cls: type) -> Section:
    """The ``Section`` tree ``validate`` checks against, read from a config dataclass."""

    def spec(item: Any) -> Any:
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            return schema_of(item)
        if isinstance(item, ListOfConfig):
            return ListOf(schema_of(item.value))
        if isinstance(item, MapOfConfig):
            return MapOf(item.key, item.key_form, schema_of(item.value))
        return item

    return Section({f.name: (spec(f.metadata[_SPEC][0]), f.metadata[_SPEC][1]) for f in dataclasses.fields(cls)})


T = TypeVar("T")


def settings_of(cls: type[T], values: Mapping[str, Any]) -> T:
    """A validated section (nested dicts, as ``validate`` returns) as its config dataclass."""

    def typed(item: Any, value: Any) -> Any:
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            return settings_of(item, value)
        if isinstance(item, ListOfConfig):
            return tuple(settings_of(item.value, v) for v in value)
        if isinstance(item, MapOfConfig):
            return {name: settings_of(item.value, v) for name, v in value.items()}
        return _frozen(value)

    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    return cls(**{f.name: typed(f.metadata[_SPEC][0], values[f.name]) for f in fields})


def typed_config(config: Mapping[str, Any]) -> Config:
    """The validated config as typed, frozen sections: ``typed_config(config).sources.gpu.interval``."""
    return settings_of(Config, config)


SCHEMA = schema_of(Config)
JOB_SECTION = schema_of(JobConfig)
CONFIG_ONLY_JOB_KEYS = ("data_paths",)  # the node's business, not the job's: the progress API does not take them
JOB_FACTS_SECTION = Section({k: v for k, v in JOB_SECTION.fields.items() if k not in CONFIG_ONLY_JOB_KEYS})
WATCH_SECTION = schema_of(WatchConfig)
LOG_FILE_SECTION = schema_of(LogFileConfig)
DISCOVERY_SECTION = schema_of(DiscoveryConfig)
DEFAULTS = Config()  # every default, typed: what a class that needs one takes (PreflightSettings, JobTracker)


def _validate(spec: Any, value: Any, file: str, path: str) -> Any:
    if isinstance(spec, Section):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(file, path, "a mapping of keys", value)
        unknown = [k for k in value if k not in spec.fields]
        if unknown:
            key = unknown[0]
            raise ConfigError(file, _join(path, str(key)), "one of " + ", ".join(spec.fields), problem="unknown key; ")
        return {
            key: _validate(
                sub, value.get(key, default) if key in value else _default(sub, default), file, _join(path, key)
            )
            for key, (sub, default) in spec.fields.items()
        }
    if isinstance(spec, MapOf):
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(file, path, "a mapping of names to sections", value)
        result = {}
        for name, item in value.items():
            try:
                spec.key(name)
            except Invalid:
                raise ConfigError(file, _join(path, str(name)), f"the name to be {spec.key_form}", name) from None
            result[name] = _validate(spec.value, item, file, _join(path, name))
        return result
    if isinstance(spec, ListOf):
        if value is None:
            return []
        if not isinstance(value, list):
            raise ConfigError(file, path, "a list", value)
        items = [_validate(spec.value, item, file, f"{path}[{i}]") for i, item in enumerate(value)]
        for i, item in enumerate(items):
            missing = [
                k
                for k, v in item.items()
                if v is None and spec.value.fields[k][1] is None and not _is_optional(spec.value.fields[k][0])
            ]
            if missing:
                raise ConfigError(file, f"{path}[{i}].{missing[0]}", "a value (this key is required)")
        return items
    try:
        return spec(value)
    except Invalid as exc:
        raise ConfigError(file, path + exc.path_suffix, exc.expected, value if exc.got is ... else exc.got) from None


def _is_optional(validator: Any) -> bool:
    return getattr(validator, "__qualname__", "").startswith("optional.")


def _default(spec: Any, default: Any) -> Any:
    if isinstance(spec, Section) and default is None:
        return {}
    return default


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def validate(raw: Any, file: str = "<config>") -> dict:
    """Validate a parsed YAML document; ``ConfigError`` names the first bad key."""
    config = _validate(SCHEMA, raw, file, "")
    for i, entry in enumerate(config["sources"]["logs"]["files"]):
        if entry["format"] == "regex" and entry["pattern"] is None:
            raise ConfigError(file, f"sources.logs.files[{i}].pattern", "a pattern (format regex needs one)")
        if entry["format"] != "regex" and entry["pattern"] is not None:
            raise ConfigError(
                file,
                f"sources.logs.files[{i}].format",
                "regex (a pattern is read only with format: regex)",
                entry["format"],
            )
    return config


def validate_job_facts(raw: dict, where: str = "job") -> dict:
    """The model facts of one job, as in ``jobs:`` of the config; also used by the progress API."""
    return _validate(JOB_FACTS_SECTION, raw, where, "")


def validate_section(spec: Any, raw: Any, file: str) -> Any:
    """Validate ``raw`` against any schema node, for other files in this style (the web config)."""
    return _validate(spec, raw, file, "")


def defaults() -> dict:
    return validate({})


def read_yaml(path: str) -> Any:
    """The parsed YAML document in ``path``; ``ConfigError`` for anything that is not readable UTF-8 YAML."""
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(path, "", f"a readable YAML file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "", f"a UTF-8 text file (byte {exc.start} is not UTF-8)") from None
    except RecursionError:
        raise ConfigError(path, "", "YAML nested less deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(path, "", f"valid YAML{where}: {getattr(exc, 'problem', exc)}") from None


def load_config(path: str | None) -> dict:
    """Read and validate ``path``; with no path, every default."""
    if path is None:
        return defaults()
    return validate(read_yaml(path), path)
