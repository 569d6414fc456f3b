"""Job names as the exporter accepts them, shared by the daemon's discovery and the training-side client, so a job
that reports and the same job found by discovery are one job.

Standard library only: the client distribution (clients/python) ships this module beside ``mfu_exporter.client``.
"""

from __future__ import annotations

import re

JOB_NAME_MAX = 128
_JOB_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:@+-]")

# Without labels: <job>-master-0, <job>-worker-3, <job>-launcher-0 (Kubeflow v1's and MPI's pod names) become <job>.
DEFAULT_POD_NAME_PATTERN = r"^(?P<job>.+)-(?:master|worker|launcher)-[0-9]+$"


def sanitize_job_name(value: str) -> str | None:
    """A job name as JobTracker accepts it (1–128 of letters, digits and ``_ . : @ + -``, starting with a letter or
    digit), or None when nothing usable is left. Deterministic, so every node turns one value into one name."""
    cleaned = _JOB_NAME_BAD.sub("_", value).lstrip("_.:@+-")[:JOB_NAME_MAX]
    return cleaned or None


def compile_pod_name_pattern(pattern: str) -> re.Pattern:
    """The pattern with a ``job`` group (or a first group) naming the job; raises ValueError with the reason."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"not a regular expression: {error}") from None
    if "job" not in compiled.groupindex and compiled.groups < 1:
        raise ValueError("needs a group naming the job, (?P<job>...) or a first (...)")
    return compiled
