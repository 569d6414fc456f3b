"""The log follower on real files: a buffered writer thread, logrotate's rename and copytruncate, truncation, late
files, megabyte lines, garbage bytes and the bounded resume."""

from __future__ import annotations

import os
import shutil
import threading
import time

from mfu_exporter.node.tail import BACKLOG, HEAD, LIVE, Follower, Lines
from tests.support.wait import wait_until


class Sink:
    def __init__(self):
        self.batches: list[Lines] = []
        self.lock = threading.Lock()

    def __call__(self, batch: Lines) -> None:
        with self.lock:
            self.batches.append(batch)

    def lines(self, kind: str | None = None) -> list[str]:
        with self.lock:
            return [line for b in self.batches if kind is None or b.kind == kind for line in b.lines]


def wait_for(predicate, timeout=10.0):
    return wait_until(predicate, timeout, "the follower's lines", interval=0.02)


def test_buffered_writer_thread_lines_arrive_whole_and_once(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"")
    sink = Sink()
    follower = Follower([str(path)], sink, interval=0.2)
    follower.poll()  # the file exists at start: an empty backlog
    follower.start()
    expected = [f"step: {i}  loss:  2.0  tps: 6,875  tflops: 358.12  mfu: 36.21%" for i in range(1, 401)]

    def writer():
        # Block-buffered stdout: bytes leave in pieces that split lines anywhere.
        data = "".join(line + "\n" for line in expected).encode()
        with open(path, "ab", buffering=0) as out:
            for i in range(0, len(data), 777):
                out.write(data[i : i + 777])
                time.sleep(0.001)

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    try:
        assert wait_for(lambda: len(sink.lines()) >= len(expected))
    finally:
        follower.stop()  # joins the follower's thread: nothing more can arrive after this
    assert sink.lines() == expected


def test_rename_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path):
    path = tmp_path / "train.log"
    sink = Sink()
    follower = Follower([str(path)], sink, use_inotify=False)
    out = open(path, "a", buffering=1)
    out.write("a1\na2\n")
    follower.poll()
    out.write("a3\npart")  # the writer has not yet reopened: these land in the renamed file
    os.rename(path, tmp_path / "train.log.1")
    out.write("ial\n")
    out.close()
    with open(path, "a") as new:
        new.write("b1\nb2\n")
    follower.poll()
    follower.poll()
    assert sink.lines() == ["a1", "a2", "a3", "partial", "b1", "b2"]
    assert follower.errors["rotated"] == 1


def test_a_renamed_file_the_glob_also_matches_is_not_read_twice(tmp_path):
    sink = Sink()
    follower = Follower([str(tmp_path / "train.log*")], sink, use_inotify=False)
    with open(tmp_path / "train.log", "a") as out:
        out.write("a1\na2\n")
    follower.poll()
    os.rename(tmp_path / "train.log", tmp_path / "train.log.1")
    with open(tmp_path / "train.log.1", "a") as out:
        out.write("a3\n")
    with open(tmp_path / "train.log", "a") as out:
        out.write("b1\n")
    follower.poll()
    assert sorted(sink.lines()) == ["a1", "a2", "a3", "b1"]


def test_copytruncate_with_an_append_writer_loses_nothing_after_the_copy(tmp_path):
    path = tmp_path / "train.log"
    sink = Sink()
    follower = Follower([str(path)], sink, use_inotify=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, b"l1\nl2\nhalf-")
    follower.poll()
    shutil.copyfile(path, tmp_path / "train.log.1")  # logrotate copytruncate: copy, then truncate in place
    os.truncate(path, 0)
    os.write(fd, b"line\nl3\n")
    follower.poll()
    os.write(fd, b"l4\n")
    follower.poll()
    os.close(fd)
    assert sink.lines() == ["l1", "l2", "half-line", "l3", "l4"]
    assert follower.errors["truncated"] == 1


def test_truncation_to_empty_then_new_lines(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("x1\nx2\n")
    sink = Sink()
    follower = Follower([str(path)], sink, use_inotify=False)
    follower.poll()
    path.write_text("")  # > train.log
    follower.poll()
    path.write_text("y1\n")
    follower.poll()
    assert sink.lines() == ["x1", "x2", "y1"]


def test_a_file_rewritten_whole_past_the_offset_before_the_follower_looks_is_read_again_from_its_start(tmp_path):
    """Lightning's CSVLogger adds a column by truncating its file and writing it again, longer, in place: the size
    never shows the truncation, the bytes before the offset do."""
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss\n49,5.5\n")
    sink = Sink()
    follower = Follower([str(path)], sink, use_inotify=False)
    follower.poll()
    path.write_text("lr,step,loss\n0.1,49,5.5\n0.1,99,5.4\n")  # open("w"): the same inode, truncated, longer
    follower.poll()
    with open(path, "a") as handle:
        handle.write("0.1,149,5.3\n")
    follower.poll()
    assert sink.lines() == ["step,loss", "49,5.5", "lr,step,loss", "0.1,49,5.5", "0.1,99,5.4", "0.1,149,5.3"]
    assert follower.errors["rewritten"] == 1 and follower.errors["truncated"] == 0


def test_a_file_that_appears_later_is_read_from_its_start_as_live(tmp_path):
    sink = Sink()
    follower = Follower([str(tmp_path / "pods" / "*" / "0.log")], sink, use_inotify=False)
    follower.poll()
    assert sink.lines() == []
    (tmp_path / "pods" / "p1").mkdir(parents=True)
    (tmp_path / "pods" / "p1" / "0.log").write_text("first\nsecond\n")
    follower.poll()
    assert sink.lines(LIVE) == ["first", "second"]


def test_find_names_the_globs_before_each_pass_and_a_failed_look_keeps_the_last_ones(tmp_path):
    (tmp_path / "a.log").write_text("from a\n")
    (tmp_path / "b.log").write_text("from b\n")
    answers = [[str(tmp_path / "a.log")], RuntimeError("discovery's answer is unreadable"), [str(tmp_path / "*.log")]]

    def find():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sink = Sink()
    follower = Follower([], sink, use_inotify=False, find=find)
    follower.poll()
    assert follower.followed() == [str(tmp_path / "a.log")]
    follower.poll()  # find raised: a.log is still followed, and the failure counted
    assert follower.followed() == [str(tmp_path / "a.log")]
    assert follower.error_counts()["find_failed"] == 1
    follower.poll()
    assert follower.followed() == [str(tmp_path / "a.log"), str(tmp_path / "b.log")]
    assert sink.lines(LIVE) == ["from b"]


def test_megabyte_lines_are_dropped_and_counted_without_holding_them(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("")
    sink = Sink()
    follower = Follower([str(path)], sink, use_inotify=False, max_line_bytes=64 * 1024, read_budget=1 << 30)
    follower.poll()
    with open(path, "ab") as out:
        out.write(b"before\n")
        out.flush()
        for _ in range(48):  # a 3 MiB line written in 64 KiB pieces, read between pieces
            out.write(b"x" * 65536)
            out.flush()
            follower.poll()
            assert all(len(f.partial) <= 64 * 1024 for f in follower._files.values())
        out.write(b"\nafter\n")
    follower.poll()
    assert sink.lines() == ["before", "after"]
    assert follower.errors["line_too_long"] == 1


def test_binary_garbage_and_invalid_utf8_are_counted_not_raised(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"\x00\x00\x00ok\n\xff\xfe bad \xc3\n" + os.urandom(4096).replace(b"\n", b"") + b"\nend\n")
    sink = Sink()
    follower = Follower([str(path)], sink, use_inotify=False)
    follower.poll()
    lines = sink.lines()
    assert lines[0] == "ok" and lines[-1] == "end" and len(lines) == 4
    assert "\ufffd" in lines[1]
    assert follower.errors["nul_bytes"] >= 1 and follower.errors["invalid_utf8"] >= 1


def test_resume_reads_a_bounded_head_and_tail_of_a_big_existing_file(tmp_path):
    path = tmp_path / "train.log"
    with open(path, "w") as out:
        out.write("  seq_length ...................................... 4096\n")
        for i in range(20000):
            out.write(f"line {i:06d} " + "." * 40 + "\n")
    sink = Sink()
    follower = Follower([str(path)], sink, use_inotify=False, head_bytes=4096, tail_bytes=4096)
    follower.poll()
    head, backlog = sink.lines(HEAD), sink.lines(BACKLOG)
    assert head[0].startswith("  seq_length") and len(head) < 100
    assert backlog[-1].startswith("line 019999") and len(backlog) < 100
    assert all(line.startswith("line ") and len(line) == 52 for line in backlog)  # no cut line at the tail's start
    assert len(head) + len(backlog) < 200
    with open(path, "a") as out:
        out.write("new\n")
    follower.poll()
    assert sink.lines(LIVE) == ["new"]


def test_a_quiet_log_does_not_wake_the_follower_more_than_once_an_interval(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("x\n")
    polls = []
    interval = 0.2

    class Counting(Follower):
        def poll(self):
            polls.append(time.monotonic())
            super().poll()

    follower = Counting([str(path)], Sink(), interval=interval)
    follower.start()
    try:
        assert wait_for(lambda: len(polls) >= 4), polls  # waits on the polls themselves
    finally:
        follower.stop()
    # No spinning in between: each scan comes an interval after the one before, however loaded the machine (a
    # late thread only makes the gaps longer). Half an interval allows for the poll's own time before its stamp.
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    assert min(gaps) >= interval / 2, gaps


def test_a_log_path_that_is_a_symlink_leading_outside_its_directory_is_never_opened(tmp_path, monkeypatch):
    logs, secret = tmp_path / "logs", tmp_path / "shadow"
    (logs / "run-2").mkdir(parents=True)
    secret.write_text("root:$6$hash:19000:0:99999:7:::\n")
    (logs / "evil.log").symlink_to(secret)
    (logs / "run-2" / "train.log").write_text("step: 1\n")
    (logs / "current.log").symlink_to(logs / "run-2" / "train.log")  # a link that stays inside: followed
    opened = []
    real_open = os.open
    monkeypatch.setattr(
        os, "open", lambda path, *args, **kwargs: opened.append(str(path)) or real_open(path, *args, **kwargs)
    )
    sink = Sink()
    follower = Follower([str(logs / "*.log")], sink, use_inotify=False)
    follower.poll()
    assert str(secret) not in opened
    assert sink.lines() == ["step: 1"]
    assert follower.error_counts()["outside_path"] == 1


def test_a_burst_then_a_rotation_is_read_in_bounded_chunks_in_order(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"")
    sink = Sink()
    budget = 1 << 20
    follower = Follower([str(path)], sink, use_inotify=False, read_budget=budget)
    follower.poll()
    line = "step: {:>8}  loss: 2.0  tps: 6,875  tflops: 358.12  mfu: 36.21%  " + "x" * 40 + "\n"
    burst = 400_000  # about 40 MB
    with open(path, "a") as out:
        out.writelines(line.format(i) for i in range(burst))
    os.rename(path, tmp_path / "train.log.1")
    path.write_text(line.format(burst))
    for _ in range(100):
        follower.poll()
        if len(sink.lines()) > burst:
            break
    sizes = [sum(len(text) + 1 for text in batch.lines) for batch in sink.batches]
    assert max(sizes) <= budget + len(line)  # one read budget at a time, and the line it cut in two
    assert len(sizes) >= 40  # the burst arrived in chunks, not one list
    numbers = [int(text.split()[1]) for text in sink.lines()]
    assert numbers == list(range(burst + 1))  # the old file to its end, then the new one
