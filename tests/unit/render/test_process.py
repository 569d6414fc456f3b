"""The daemon's process families: client_python's, with open descriptors counted from /proc/self/fd's size."""

from __future__ import annotations

import os
import types

from prometheus_client import ProcessCollector

from mfu_exporter.render import process
from mfu_exporter.render.process import DaemonProcessCollector, open_descriptors


def test_the_families_are_client_pythons_names_help_and_types():
    theirs = {family.name: family for family in ProcessCollector(registry=None).collect()}
    ours = {family.name: family for family in DaemonProcessCollector().collect()}
    assert (
        set(ours)
        == set(theirs)
        == {
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_cpu_seconds",
            "process_open_fds",
            "process_max_fds",
        }
    )
    for name, family in ours.items():
        assert (family.documentation, family.type) == (theirs[name].documentation, theirs[name].type)
        assert [sample.name for sample in family.samples] == [sample.name for sample in theirs[name].samples]
    assert ours["process_start_time_seconds"].samples[0].value == theirs["process_start_time_seconds"].samples[0].value
    assert ours["process_max_fds"].samples[0].value == theirs["process_max_fds"].samples[0].value


def fd_count() -> float:
    (family,) = [f for f in DaemonProcessCollector().collect() if f.name == "process_open_fds"]
    return family.samples[0].value


def test_open_descriptors_counts_each_descriptor_opened_and_closed():
    before = fd_count()
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(40)]
    try:
        assert fd_count() == before + 40
    finally:
        for fd in opened:
            os.close(fd)
    assert fd_count() == before


def test_a_kernel_before_6_2_gives_the_directory_no_size_and_it_is_listed(monkeypatch):
    real_stat = os.stat
    directory = "/proc/self/fd"
    listed = len(os.listdir(directory))
    monkeypatch.setattr(
        process.os, "stat", lambda path: types.SimpleNamespace(st_size=0) if path == directory else real_stat(path)
    )
    assert open_descriptors(directory) == listed
