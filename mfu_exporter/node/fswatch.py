"""File-system facts for watching checkpoint writes: a tree's aggregate size, and whether a path is on a network FS.

A network file system (NFS, Lustre, GPFS) reports through inotify only the writes this node made, so the checkpoint
source polls paths on one instead of trusting inotify.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Where inotify sees only this node's writes (inotify(7)): remote ranks' shards and rank 0's marker never show.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "beegfs",
        "wekafs",
        "panfs",
        "pvfs2",
        "orangefs",
        "afs",
        "9p",
        "glusterfs",
        "ocfs2",
        "gfs2",
        "virtiofs",
        "fuse",
    }
)


@dataclass(frozen=True)
class Tree:
    """The aggregate of a write's files at one look: enough to see that it changed."""

    bytes: int
    files: int
    newest_mtime_ns: int


def measure(path: str, is_dir: bool) -> Tree | None:
    """Size, file count and newest mtime under ``path`` (symlinks not followed); None once it is gone.

    Raises OSError when ``path`` cannot be read (permissions); unreadable directories below it are skipped."""
    try:
        if not is_dir:
            info = os.lstat(path)
            return Tree(info.st_size, 1, info.st_mtime_ns)
        total = files = newest = 0
        directories = [path]
        while directories:
            directory = directories.pop()
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                directories.append(entry.path)
                                continue
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # removed while we looked: a temporary file renamed into place
                        total += info.st_size
                        files += 1
                        newest = max(newest, info.st_mtime_ns)
            except OSError:
                if directory == path:
                    raise
        return Tree(total, files, newest)
    except (FileNotFoundError, NotADirectoryError):
        return None


def filesystem_type(path: str, mounts_file: str) -> str | None:
    """The type of the file system holding ``path``, from the longest matching mount point in ``mounts_file``."""
    target = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


def is_network_filesystem(kind: str | None) -> bool:
    return kind is not None and (kind in NETWORK_FILESYSTEMS or kind.startswith("fuse."))
