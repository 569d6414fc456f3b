"""The config's vocabulary: the validators every key is checked with (each raises ``Invalid`` with the expected
form), the schema's shapes (``Section``, ``MapOf``, ``ListOf``), the bounds and patterns keys share, and the
tri-state ``Enabled``. The table of keys is ``mfu_exporter.config``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from mfu_exporter.jobname import DEFAULT_POD_NAME_PATTERN
from mfu_exporter.quantities import parse_duration, parse_quantity

DEFAULT_LISTEN_ADDRESS = ":9495"
JOB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}\Z")
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
    if not isinstance(value, str) or not re.match(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]*):[0-9]{1,5}\Z", value):
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


LOG_FORMATS = (
    "auto",
    "torchtitan",
    "megatron",
    "hf",
    "nemo",
    "deepspeed",
    "lightning_csv",
    "regex",
)  # = mfu_exporter.logs.FORMATS
# The groups a regex pattern may name (mfu_exporter.logs.regex reads this list).
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
DISCOVERY_POD_NAME_PATTERN = DEFAULT_POD_NAME_PATTERN  # the client names a job from its pod name by the same rule
PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def string_list(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise Invalid("a list of non-empty strings")
    return value


def absolute_globs(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item.startswith("/") for item in value):
        raise Invalid('a list of absolute paths or globs, like ["/var/lib/mfu-exporter/nccl/*.txt"]')
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
