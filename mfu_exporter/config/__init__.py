"""The YAML config: a declarative schema, defaults for every key, and errors that name file, key and expected form.

Every key is optional. Unknown keys are errors, because a typo that passes silently (``intreval: 5s``) costs an
operator an afternoon. The schema is one table of frozen dataclasses, one per section (``Config`` and below), each
key with its validator and default. ``load_config`` returns the validated nested dicts with every default filled in;
``typed_config(config)`` gives the same values as those dataclasses (``typed_config(config).sources.gpu.interval``), the
tri-state ``enabled`` as an ``Enabled``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

import yaml

from mfu_exporter.config.validators import (  # the vocabulary, importable from mfu_exporter.config too
    DEFAULT_LISTEN_ADDRESS,
    DISCOVERY_LABEL_KEYS,
    DISCOVERY_POD_NAME_PATTERN,
    JOB_NAME_FORM,
    JOB_NAME_PATTERN,
    LOG_FORMATS,
    LOG_PROGRESS_GROUPS,
    LOG_REGEX_GROUPS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_JOB_GPUS,
    MAX_LAYERS,
    MAX_PARAMS,
    MAX_PEAK_TFLOPS,
    MAX_SEQ_LEN,
    MAX_TOKENS,
    MIN_PEAK_TFLOPS,
    PODRESOURCES_SOCKET,
    SERVICE_ACCOUNT_DIR,
    ConfigError,
    Enabled,
    Invalid,
    ListOf,
    MapOf,
    Section,
    Validator,
    absolute_globs,
    boolean,
    bounded_int,
    bounded_quantity,
    choice,
    command,
    duration,
    job_gpus,
    listen_address,
    log_pattern,
    optional,
    pfc_priority,
    pod_name_pattern,
    positive_int,
    positive_quantity,
    quantity,
    ratio,
    regex_list,
    string,
    string_list,
    tristate,
)

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


# The default interval of every source and of the job model's tick (mfu.interval). The NVML calls and the sysfs and
# ethtool reads are most of the daemon's CPU, and the attribution reads time shares from their counters over each
# interval (pause, throttle time, errors), so nothing between two samples is lost at 5 s. The checkpoints' inotify
# events and the logs' lines are read as they come, in threads of their own, dated when they happen or are read, and
# the tick applies them: sampling oftener only wakes the daemon oftener. interval: 1s stays available, at a cost in CPU.
DEFAULT_INTERVAL = 5.0
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
    interval: float = setting(duration, DEFAULT_INTERVAL)
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
class NcclConfig(SourceConfig):
    """NCCL's own reports of a job's collectives: ``inspector_paths`` are globs of NCCL Inspector's dump
    directories (``NCCL_INSPECTOR_DUMP_DIR``: its ``<host>-pid<pid>.log`` JSON lines and its
    ``nccl_inspector_metrics_<GPU UUID>.prom`` textfiles), or of the files themselves.

    And the node's last NCCL verification: the newest file matching ``tests_paths`` (an all_reduce_perf output a
    Slurm prolog or a Kubernetes init container wrote), judged like ``mfu-exporter nccl``; ``expect_busbw`` (GB/s)
    overrides the figure read from the ACTIVE RDMA ports."""

    inspector_paths: tuple[str, ...] = setting(string_list, [])
    tests_paths: tuple[str, ...] = setting(absolute_globs, [])
    expect_busbw: float | None = setting(optional(positive_quantity), None)


@dataclass(frozen=True)
class StorageConfig(SourceConfig):
    """``sources.storage``: reads per mount of the jobs' data (``jobs.<name>.data_paths``), of their checkpoint
    watches and of ``mounts``, and the nvidia-fs driver's GPUDirect Storage counters (``gds``)."""

    mounts: tuple[str, ...] = setting(string_list, [])
    gds: Enabled = setting(tristate, Enabled.AUTO)
    # Whose mounts, under --path.procfs: the exporter's own (self), or, in a container with the host's PID
    # namespace and /proc, the host's (1/mountstats), where the training pods' volumes are mounted.
    mount_table: str = setting(string, "self/mountstats")


@dataclass(frozen=True)
class SourcesConfig:
    gpu: GpuConfig = subsection(GpuConfig)
    rdma: RdmaConfig = subsection(RdmaConfig)
    ethtool: EthtoolConfig = subsection(EthtoolConfig)
    checkpoint: CheckpointConfig = subsection(CheckpointConfig)
    logs: LogsConfig = subsection(LogsConfig)
    preflight: PreflightConfig = subsection(PreflightConfig)
    nccl: NcclConfig = subsection(NcclConfig)
    storage: StorageConfig = subsection(StorageConfig)


@dataclass(frozen=True)
class MfuConfig:
    window: float = setting(duration, 60.0)
    # How often the job model is evaluated: each job's MFU and its attribution, the status page's history and the
    # jobs' series on /metrics. The attribution reads the hardware sources' samples (5 s by default) and books each
    # interval's gap whatever its length, so a shorter tick evaluates the same signals again at a cost in CPU.
    interval: float = setting(duration, DEFAULT_INTERVAL)


@dataclass(frozen=True)
class AttributionConfig:
    """The loss attribution's thresholds (``mfu_exporter.model.attribution``)."""

    tolerance: float = setting(ratio, 0.10)  # a gap under 10% of the baseline is noise: cause "none"
    pause_ratio: float = setting(ratio, 0.05)  # share of the interval a port was paused
    # Share of the interval a GPU's SM clock was held down for heat (thermal) or power (power).
    throttle_ratio: float = setting(ratio, 0.05)
    # A fixed level, not a rise: above what the job's ports see when healthy.
    cnp_per_second: float = setting(positive_quantity, 1000.0)
    idle_utilization: float = setting(ratio, 0.5)  # mean GPU utilization under which GPUs count as mostly idle
    # Share of wall time the job's loop waited for its next batch (client or log) over which the gap is "input".
    input_wait_ratio: float = setting(ratio, 0.10)
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
    # The same peak in FLOP/s per device, for a device the GPU table lacks (a CPU, a new accelerator) where TFLOP/s
    # reads awkwardly (a CPU core's 5e10 is 0.05 TFLOP/s). Config only: the job model takes it as peak_tflops, and a
    # job sets one of the two.
    peak_flops: float | None = setting(
        optional(bounded_quantity(MIN_PEAK_TFLOPS * 1e12, MAX_PEAK_TFLOPS * 1e12, '5e10 or "50G" (FLOP/s per device)'))
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
    interval: float = setting(duration, DEFAULT_INTERVAL)
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
class StateConfig:
    # Where the job counters are kept across exporter restarts (mfu_exporter.statefile); none: they begin at 0 at each
    # start, never resuming at a lower value.
    dir: str | None = setting(optional(string))
    save_interval: float = setting(duration, 10.0)


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
    state: StateConfig = subsection(StateConfig)


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
# The node's business, not the job's (data_paths), or another spelling of a fact (peak_flops): the progress API does
# not take them, and the job model gets its facts through model_facts.
CONFIG_ONLY_JOB_KEYS = ("data_paths", "peak_flops")
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
    for name, job in config["jobs"].items():
        if job["peak_flops"] is not None and job["peak_tflops"] is not None:
            raise ConfigError(
                file, f"jobs.{name}.peak_flops", "one peak: peak_flops (FLOP/s) or peak_tflops (TFLOP/s), not both"
            )
    return config


def model_facts(job: Mapping[str, Any]) -> dict:
    """The facts the job model takes from one validated ``jobs.<name>`` section: the config-only keys left out,
    ``peak_flops`` as the ``peak_tflops`` the model and the progress API share."""
    facts = {key: value for key, value in job.items() if key not in CONFIG_ONLY_JOB_KEYS}
    if job.get("peak_flops") is not None:
        facts["peak_tflops"] = job["peak_flops"] / 1e12
    return facts


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
