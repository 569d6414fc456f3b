"""Follow log files by glob, as ``tail -F`` would, but never losing or repeating a line and never growing.

What it survives:

- **rotation by rename** (logrotate's default, the kubelet's ``0.log`` -> ``0.log.<time>``): the path names a new
  inode; the old file is read to its end through the descriptor still open, then the new one from its start.
- **copytruncate** and any **truncation**: the size drops below the read offset; reading restarts at 0. A line
  whose start was read before the truncation keeps its start: an ``O_APPEND`` writer continues it at offset 0.
- a file **rewritten whole in place** (truncated and written again, longer, before the follower looked: Lightning's
  CSVLogger adds a column so): the size never drops, but the bytes just before the offset changed; reading restarts
  at 0 (counted as ``rewritten``).
- a file that **appears later**, or is deleted and written again: every glob is expanded again each ``interval``
  (and ``find``, when given, names the globs again first: its caller's files come and go with jobs).
  A file renamed to a name the glob also matches is continued where it was, not read again; a copytruncate copy is
  a new inode with old lines, so a glob should name the live file (``train.log``, not ``train.log*``).
- a **partial last line** (a writer that flushes mid-line, block-buffered stdout): kept until its newline.
- **lines of megabytes**: a line longer than ``max_line_bytes`` is dropped, its bytes never held past the cap,
  and counted (``line_too_long``); the reader takes at most ``read_budget`` bytes of a file per wake, so a flood in
  one file does not starve the others.
- **a burst, then a rotation**: the rest of the old file is read ``read_budget`` bytes a pass, like any read, and
  its successor only after it: memory holds one budget and one line of a file at most, never the whole backlog.
- **symbolic links**: only regular files whose real path lies under the fixed part of their glob are opened (the
  last component with ``O_NOFOLLOW``); a link leading elsewhere is counted as ``outside_path`` and never opened.
- **binary garbage**: NUL bytes (a non-append writer after copytruncate leaves a hole of them) are removed and
  invalid UTF-8 is replaced (U+FFFD), each counted, never raised.

Exporter restart: **a bounded resume**, not the end and not the whole file. A file that exists when following
starts is read from its head (up to ``head_bytes``, delivered as ``head``: the start-up lines with the model size,
arguments and batch) and from its last ``tail_bytes`` (``backlog``: the latest progress lines), then followed
(``live``). Starting at the end would lose the start-up facts and leave MFU unknown until two new progress lines
(Megatron logs every 100 iterations: minutes); reading all of a week-long log would cost unbounded time and memory
at every restart. A file that appears after following started is new: all of it is ``live``.

Waiting costs nothing: with inotify the thread sleeps in ``read`` until a followed file changes (and wakes each
``interval`` to expand the globs and stat the files, which also covers writes inotify does not see, such as those
of another node on NFS); without inotify (watches exhausted) it stats every ``interval``. Never a busy loop.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

try:
    from inotify_simple import INotify, flags
except ImportError:  # pragma: no cover - a dependency; kept optional so polling still works without it
    INotify = None
    flags = None

CHUNK = 64 * 1024
RETIRED = 256  # identities of closed files remembered, so a rotated file matched again is not read twice
HEAD, BACKLOG, LIVE = "head", "backlog", "live"


@dataclass(frozen=True)
class Lines:
    """Complete lines read from one file at one time; ``kind`` is ``head``, ``backlog`` or ``live``."""

    path: str
    lines: list[str]
    read_time: float
    kind: str


_WILDCARD = re.compile(r"[*?[]")


def _confinement(pattern: str) -> str:
    """The real directory a glob's files must lie under: its longest leading part without a wildcard."""
    parts = []
    for part in os.path.abspath(pattern).split(os.sep)[:-1]:
        if _WILDCARD.search(part):
            break
        parts.append(part)
    return os.path.realpath(os.sep.join(parts) or os.sep)


SEEN_BYTES = 32  # the bytes kept from just before a file's offset: a rewrite in place changes them


class _File:
    __slots__ = ("path", "fd", "dev", "ino", "offset", "partial", "dropping", "watch", "seen")

    def __init__(self, path: str, fd: int, st: os.stat_result):
        self.path, self.fd, self.dev, self.ino = path, fd, st.st_dev, st.st_ino
        self.offset = 0
        self.partial = b""
        self.dropping = False
        self.watch: int | None = None
        self.seen = b""  # the last bytes read, which end at ``offset``


class Follower:
    def __init__(
        self,
        patterns: list[str],
        on_lines: Callable[[Lines], None],
        *,
        interval: float = 1.0,
        head_bytes: int = 1 << 20,
        tail_bytes: int = 256 << 10,
        max_line_bytes: int = 1 << 20,
        read_budget: int = 4 << 20,
        use_inotify: bool = True,
        clock: Callable[[], float] = time.time,
        find: Callable[[], list[str]] | None = None,
    ):
        self.patterns = list(patterns)
        self.on_lines = on_lines
        self.find = find
        self.interval = interval
        self.head_bytes = head_bytes
        self.tail_bytes = tail_bytes
        self.max_line_bytes = max_line_bytes
        self.read_budget = read_budget
        self.clock = clock
        self.errors: Counter = Counter()
        self._files: dict[str, _File] = {}
        # Rotated or removed files whose rest is still being read, ``read_budget`` per pass, by the path they had:
        # that path's new file waits until its predecessor is done, so lines stay in order.
        self._draining: dict[str, _File] = {}
        self._started = False
        # Our clock when the last whole pass began: every line written before it has been read.
        self.read_until: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inotify = None
        self._by_watch: dict[int, str] = {}
        # (dev, inode) of files no longer followed -> (offset read, the bytes before it)
        self._retired: dict[tuple[int, int], tuple[int, bytes]] = {}
        if use_inotify and INotify is not None:
            try:
                self._inotify = INotify()
            except OSError:
                self.errors["inotify_unavailable"] += 1

    # -- control ------------------------------------------------------------------------------------------
    def set_patterns(self, patterns: list[str]) -> None:
        with self._lock:
            self.patterns = list(patterns)

    def start(self) -> None:
        """Follow in a thread of its own, after a first ``poll()`` by the caller (the bounded resume)."""
        self._thread = threading.Thread(target=self._run, name="log-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for file in [*self._files.values(), *self._draining.values()]:
                self._close(file)
            self._files.clear()
            self._draining.clear()
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None

    def error_counts(self) -> Counter:
        with self._lock:
            return Counter(self.errors)

    def followed(self) -> list[str]:
        with self._lock:
            return sorted(self._files)

    def _run(self) -> None:
        next_scan = time.monotonic() + self.interval  # the caller's first poll() was the pass before this one
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                self.poll()
                next_scan = now + self.interval
                continue
            wait = max(next_scan - now, 0.0)
            if self._inotify is None:
                self._stop.wait(wait)
                continue
            try:
                events = self._inotify.read(timeout=int(wait * 1000) + 1)
            except (OSError, ValueError):
                self._stop.wait(wait)
                continue
            changed = {self._by_watch.get(e.wd) for e in events}
            if any(e.mask & (flags.MOVE_SELF | flags.DELETE_SELF | flags.Q_OVERFLOW) for e in events):
                next_scan = 0.0  # renamed or removed: find what the path names now
                continue
            with self._lock:
                for path in changed:
                    file = self._files.get(path) if path else None
                    if file is not None:
                        self._read_current(file)

    # -- one pass -----------------------------------------------------------------------------------------
    def poll(self) -> None:
        """Expand the globs, notice new, rotated, truncated and vanished files, and read what is new."""
        began = self.clock()
        if self.find is not None:
            # Outside the lock: ``find`` takes its caller's lock, which ``on_lines`` takes inside this one.
            try:
                patterns = list(self.find())
            except Exception:  # noqa: BLE001 - the thread must outlive a failed look: the files found last time stay
                with self._lock:
                    self.errors["find_failed"] += 1
            else:
                with self._lock:
                    self.patterns = patterns
        with self._lock:
            first = not self._started
            self._started = True
            for path, old in list(self._draining.items()):
                self._drain(old)
            paths: dict[str, str] = {}  # path -> the directory its pattern confines it to
            for pattern in self.patterns:
                try:
                    for path in glob.glob(pattern):
                        paths.setdefault(path, _confinement(pattern))
                except OSError:
                    self.errors["glob_failed"] += 1
            for path in list(self._files):
                if path not in paths:  # removed or renamed away: what is left in it is still ours
                    self._drain(self._files.pop(path))
            for path in sorted(paths):
                if path in self._draining:
                    continue  # its predecessor's rest first: the next pass opens the new file
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # gone between the glob and the stat: the next pass decides
                if not stat.S_ISREG(st.st_mode):
                    continue
                file = self._files.get(path)
                if file is not None and (file.dev, file.ino) != (st.st_dev, st.st_ino):
                    self.errors["rotated"] += 1
                    self._drain(self._files.pop(path))
                    if path in self._draining:
                        continue
                    file = None
                if file is None:
                    file = self._open(path, resume=first, within=paths[path])
                    if file is None:
                        continue
                    continue  # _open read what it needed
                self._read_current(file, st)
            self.read_until = began

    # -- files --------------------------------------------------------------------------------------------
    def _open(self, path: str, resume: bool, within: str = os.sep) -> _File | None:
        """Open ``path`` if it is a regular file whose real location is under ``within``: a symbolic link that
        leads elsewhere (a log path made a link to a password file) is never opened, and counted as
        ``outside_path``; the final component is opened with O_NOFOLLOW, so a link swapped in after the check is
        refused too."""
        real = os.path.realpath(path)
        if os.path.commonpath([real, within]) != within:
            self.errors["outside_path"] += 1
            return None
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            self.errors["open_failed"] += 1
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self.errors["not_a_regular_file"] += 1
            return None
        file = _File(path, fd, st)
        self._files[path] = file
        if self._inotify is not None:
            try:
                file.watch = self._inotify.add_watch(path, flags.MODIFY | flags.MOVE_SELF | flags.DELETE_SELF)
                self._by_watch[file.watch] = path
            except OSError:
                self.errors["inotify_watch_failed"] += 1  # polled every interval instead
        retired = self._retired.pop((st.st_dev, st.st_ino), None)
        if retired is not None and self._signature(fd, retired[0]) != retired[1]:
            retired = None  # the inode number was reused by a new file
        if retired is not None:
            # A file we followed under another name (renamed by rotation, and the glob matches the new name too):
            # continue where its old name left off instead of reading it twice.
            file.offset = retired[0]
            self._read(file, LIVE)
        elif resume and st.st_size > self.head_bytes + self.tail_bytes:
            self._read(file, HEAD, limit=self.head_bytes)
            file.partial, file.dropping = b"", False
            file.offset, file.seen = st.st_size - self.tail_bytes, b""
            try:  # the tail starts mid-line unless the byte before it ends one: skip to the first newline
                file.dropping = os.pread(fd, 1, file.offset - 1) != b"\n"
            except OSError:
                file.dropping = True
            self._read(file, BACKLOG, limit=st.st_size - file.offset)
        elif resume:
            self._read(file, BACKLOG, limit=st.st_size)
        else:
            self._read(file, LIVE)
        return file

    @staticmethod
    def _signature(fd: int, offset: int) -> bytes:
        """The bytes before ``offset``: the same file renamed still has them, a new one on a reused inode not."""
        try:
            return os.pread(fd, min(offset, 256), max(offset - 256, 0))
        except OSError:
            return b""

    def _read_current(self, file: _File, st: os.stat_result | None = None) -> None:
        if st is None:
            try:
                st = os.fstat(file.fd)
            except OSError:
                return
        if st.st_size < file.offset:
            self.errors["truncated"] += 1
            file.offset, file.seen = 0, b""
        elif st.st_size > file.offset and file.seen and self._rewritten(file):
            # Truncated and written again past where we were before we looked (Lightning's CSVLogger rewrites its
            # file whole, header first, when a column is added): the size alone does not show it, the bytes do.
            self.errors["rewritten"] += 1
            file.offset, file.seen, file.partial, file.dropping = 0, b"", b"", False
        if st.st_size > file.offset:
            self._read(file, LIVE)

    @staticmethod
    def _rewritten(file: _File) -> bool:
        try:
            return os.pread(file.fd, len(file.seen), file.offset - len(file.seen)) != file.seen
        except OSError:
            return False

    def _drain(self, file: _File) -> None:
        """The rest of a file that is going away, through the descriptor still open, and its unfinished line.

        At most ``read_budget`` bytes a pass, like any read: a burst of 100 MB before a rotation is read over
        several passes (the file waits in ``_draining``), never into memory at once."""
        try:
            size = os.fstat(file.fd).st_size
        except OSError:
            size = -1
        if size >= 0 and size < file.offset:
            file.offset, file.seen = 0, b""
        if size >= 0:
            self._read(file, LIVE)
        if 0 <= file.offset < size:
            self._draining[file.path] = file  # more next pass
            return
        self._draining.pop(file.path, None)
        if file.partial and not file.dropping:
            self._deliver(file, [self._decode(file.partial)], LIVE)
        file.partial = b""
        self._close(file)

    def _close(self, file: _File) -> None:
        self._retired[(file.dev, file.ino)] = (file.offset, self._signature(file.fd, file.offset))
        while len(self._retired) > RETIRED:
            del self._retired[next(iter(self._retired))]
        if file.watch is not None and self._inotify is not None:
            self._by_watch.pop(file.watch, None)
            try:
                self._inotify.rm_watch(file.watch)
            except OSError:
                pass  # the kernel dropped it with the file
        try:
            os.close(file.fd)
        except OSError:
            pass

    def _read(self, file: _File, kind: str, limit: int | None = None) -> None:
        budget = self.read_budget if limit is None else limit
        lines: list[str] = []
        while budget > 0:
            try:
                data = os.pread(file.fd, min(CHUNK, budget), file.offset)
            except OSError:
                self.errors["read_failed"] += 1
                break
            if not data:
                break
            file.offset += len(data)
            file.seen = (file.seen + data[-SEEN_BYTES:])[-SEEN_BYTES:]
            budget -= len(data)
            self._split(file, data, lines)
        if lines:
            self._deliver(file, lines, kind)

    def _split(self, file: _File, data: bytes, lines: list[str]) -> None:
        if file.dropping:  # inside a line over the cap: skip to its end
            end = data.find(b"\n")
            if end < 0:
                return
            file.dropping = False
            data = data[end + 1 :]
        last = data.rfind(b"\n")
        if last < 0:
            if len(file.partial) + len(data) > self.max_line_bytes:
                self.errors["line_too_long"] += 1
                file.partial, file.dropping = b"", True
            else:
                file.partial += data
            return
        block = data[:last]
        if file.partial:
            block, file.partial = file.partial + block, b""
        rest = data[last + 1 :]
        if len(rest) > self.max_line_bytes:
            self.errors["line_too_long"] += 1
            file.dropping = True
        else:
            file.partial = rest
        # The complete lines of a chunk are decoded together (one C call, not one per line); only a chunk with a
        # NUL byte, a CR, an over-long line or invalid UTF-8 takes the slow path, line by line.
        if len(block) <= self.max_line_bytes and b"\x00" not in block and b"\r" not in block:
            try:
                lines.extend(block.decode("utf-8").split("\n"))
                return
            except UnicodeDecodeError:
                pass
        for piece in block.split(b"\n"):
            if len(piece) > self.max_line_bytes:
                self.errors["line_too_long"] += 1
                continue
            lines.append(self._decode(piece))

    def _decode(self, raw: bytes) -> str:
        if b"\x00" in raw:
            self.errors["nul_bytes"] += 1
            raw = raw.replace(b"\x00", b"")
        if raw.endswith(b"\r"):
            raw = raw[:-1]  # CRLF line ends
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.errors["invalid_utf8"] += 1
            return raw.decode("utf-8", errors="replace")

    def _deliver(self, file: _File, lines: list[str], kind: str) -> None:
        try:
            self.on_lines(Lines(file.path, lines, self.clock(), kind))
        except Exception:  # noqa: BLE001 - a consumer's bug must not stop following the other files
            self.errors["consumer_failed"] += 1
