"""The nccl source's verification half through the registered factory: the newest file under sources.nccl.tests_paths,
judged against a fixture /sys of eight ACTIVE 400 Gb/s ports (320 GB/s expected), rendered through render/nccl.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mfu_exporter.config import ConfigError, validate
from mfu_exporter.sources import SOURCES, Paths, SourceContext, build_sources
from mfu_exporter.sources.nccl import NcclSource
from tests.support.expo import snapshot_samples, snapshot_value
from tests.support.nodes import hgx_node
from tests.unit.nccl.real_nccl import load

PERF = {b.name: b for b in load("real/perf.txt")}
DEBUG = {b.name: b for b in load("real/debug.txt")}
OTHERS_OFF = {name: {"enabled": "false"} for name in ("gpu", "rdma", "ethtool", "logs", "preflight", "storage")}


def build(tmp_path: Path, **section) -> NcclSource:
    node = hgx_node(tmp_path / "node")
    config = validate(
        {
            "sources": {**OTHERS_OFF, "nccl": section},
            "discovery": {"kubernetes": {"enabled": "false"}, "slurm": {"enabled": "false"}},
        }
    )
    sources = build_sources(config, SourceContext(config, Paths(str(node.sys), str(node.proc))))
    source = next(s for s in sources if s.name == "nccl")
    assert isinstance(source, NcclSource)
    return source


def write(path: Path, lines: list[str], mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    os.utime(path, (mtime, mtime))


def test_the_newest_file_is_judged_and_rendered(tmp_path: Path) -> None:
    results = tmp_path / "nccl"
    source = build(tmp_path, tests_paths=[str(results / "*.txt"), str(tmp_path / "other" / "*.log")])
    write(results / "old.txt", PERF["nccl-tests-232-tree-two-nodes"].lines, 1_700_000_000)
    write(results / "new.txt", PERF["coreweave-nccl-tests-43-nvl72"].lines, 1_700_000_100)
    snapshot = source.sample()
    assert snapshot.readings.test.path == str(results / "new.txt")
    assert snapshot_value(snapshot, "mfu_nccl_test_passed") == 1.0
    assert snapshot_value(snapshot, "mfu_nccl_test_busbw_bytes_per_second", collective="unknown") == 834.57e9
    assert snapshot_value(snapshot, "mfu_nccl_test_expected_busbw_bytes_per_second") == 320e9
    assert snapshot_value(snapshot, "mfu_nccl_test_wrong_values") == 0.0
    assert snapshot_value(snapshot, "mfu_nccl_test_timestamp_seconds") == 1_700_000_100
    # A newer slow run in another matching directory replaces it.
    write(tmp_path / "other" / "prolog.log", PERF["nccl-tests-78-256-gpus-nccl-2.8"].lines, 1_700_000_200)
    snapshot = source.sample()
    assert snapshot_value(snapshot, "mfu_nccl_test_passed") == 0.0
    assert snapshot_value(snapshot, "mfu_nccl_test_busbw_bytes_per_second", collective="all_reduce") == 71.55e9
    assert snapshot_value(snapshot, "mfu_nccl_test_wrong_values") is None  # the 2021 error column: not a count
    assert any("below 0.9 x the expected 320 GB/s" in r for r in snapshot.status["test"]["reasons"])


def test_socket_fallback_and_an_empty_file_fail(tmp_path: Path) -> None:
    source = build(tmp_path, tests_paths=[str(tmp_path / "*.txt")])
    write(tmp_path / "a.txt", DEBUG["nccl-226-aws-sockets-many-hosts"].lines, 1_700_000_000)
    snapshot = source.sample()
    assert snapshot.readings.test.fell_back_to_socket is True
    assert snapshot_value(snapshot, "mfu_nccl_test_passed") == 0.0
    assert snapshot_value(snapshot, "mfu_nccl_test_timestamp_seconds") == 1_700_000_000
    (tmp_path / "b.txt").write_bytes(b"")  # a prolog whose test died before printing
    os.utime(tmp_path / "b.txt", (1_700_000_100, 1_700_000_100))
    snapshot = source.sample()
    assert snapshot.readings.test.verdict == "unreadable"
    assert snapshot_value(snapshot, "mfu_nccl_test_passed") == 0.0
    (tmp_path / "c.txt").write_bytes(b"\xff\xfe binary")
    os.utime(tmp_path / "c.txt", (1_700_000_200, 1_700_000_200))
    snapshot = source.sample()
    assert snapshot.errors["unreadable_file"] == 1
    assert snapshot_value(snapshot, "mfu_nccl_test_passed") == 0.0


def test_nothing_configured_or_matching_is_a_status_not_an_error(tmp_path: Path) -> None:
    for source in (build(tmp_path / "a"), build(tmp_path / "b", tests_paths=[str(tmp_path / "none" / "*.txt")])):
        snapshot = source.sample()
        assert snapshot_samples(snapshot) == {}
        assert not snapshot.errors
        assert snapshot.readings.test.verdict == "none"
        assert (
            "tests_paths" in snapshot.status["test"]["verdict"]
            or "no file matches" in snapshot.status["test"]["verdict"]
        )


def test_a_file_is_read_again_only_when_it_changes(tmp_path: Path, monkeypatch) -> None:
    source = build(tmp_path, tests_paths=[str(tmp_path / "*.txt")], expect_busbw=40)
    write(tmp_path / "a.txt", PERF["nccl-tests-232-tree-two-nodes"].lines, 1_700_000_000)
    first = source.sample().readings.test
    assert first.passed is True and first.expected_bytes_per_second == 40e9  # expect_busbw, in GB/s
    reads = []
    import mfu_exporter.sources.nccl_tests as module

    monkeypatch.setattr(module, "read_lines", lambda path: reads.append(path) or [])
    assert source.sample().readings.test is first
    assert reads == []
    write(tmp_path / "a.txt", PERF["nccl-tests-232-tree-two-nodes"].lines[:-1], 1_700_000_050)
    source.sample()
    assert reads == [str(tmp_path / "a.txt")]


def test_series_levels(tmp_path: Path) -> None:
    source = build(tmp_path, tests_paths=[str(tmp_path / "*.txt")], series="minimal")
    write(tmp_path / "a.txt", PERF["coreweave-nccl-tests-43-nvl72"].lines, 1_700_000_000)
    names = {name for name, _ in snapshot_samples(source.sample())}
    assert names == {
        "mfu_nccl_test_passed",
        "mfu_nccl_test_busbw_bytes_per_second",
        "mfu_nccl_test_timestamp_seconds",
    }


@pytest.mark.parametrize(
    "section, key",
    [
        ({"tests_paths": "/var/lib/nccl/*.txt"}, "sources.nccl.tests_paths"),
        ({"tests_paths": ["relative/*.txt"]}, "sources.nccl.tests_paths"),
        ({"expect_busbw": -3}, "sources.nccl.expect_busbw"),
        ({"expect_busbw": "fast"}, "sources.nccl.expect_busbw"),
        ({"prolog": "yes"}, "sources.nccl.prolog"),
    ],
)
def test_config_errors_name_file_and_key(section: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key) as exc:
        validate({"sources": {"nccl": section}}, "node.yaml")
    assert str(exc.value).startswith("node.yaml: ")
    assert "nccl" in SOURCES
