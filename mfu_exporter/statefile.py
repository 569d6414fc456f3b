"""Files under ``state.dir``: read whole at start, written whole or not at all.

A write goes to a temporary file beside its target, is flushed to disk, and replaces the target in one rename, so
a crash or a full disk leaves the last good file, never half of one. The directory survives the exporter: a
hostPath volume in the shipped DaemonSet, systemd's ``StateDirectory`` in the unit.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

MAX_STATE_BYTES = 16 * 1024 * 1024  # far above a node's jobs (a few hundred bytes each): a bigger file is not ours


def read_json(path: str) -> Any:
    """The JSON in ``path``; None when there is no such file. Raises ``ValueError`` for a file that is not JSON or
    is too large, ``OSError`` when it cannot be read."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_STATE_BYTES:
        raise ValueError(f"{path} is over {MAX_STATE_BYTES} bytes")
    return json.loads(data)


def write_json(path: str, value: Any) -> None:
    """``value`` as JSON in ``path``, atomically; raises ``OSError`` (the old file stays) when it cannot."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(value, file, separators=(",", ":"), allow_nan=False)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename itself on disk
    finally:
        os.close(directory_fd)
