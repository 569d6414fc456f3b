"""The nccl source on NCCL Inspector's files as the plugin writes them: each process's JSON lines tailed from where
the last sample stopped, the textfile re-read when rewritten, each file's job found through the GPU its process
holds (the fake NVML's compute processes) or its UUID, and the rank whose collectives are the shortest named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mfu_exporter.config import typed_config, validate
from mfu_exporter.node.nvml import NvmlSession
from mfu_exporter.render.collectives import collective_families
from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.sim.nvml import FakeNvml, h100
from mfu_exporter.sources.nccl import NcclSource

FIXTURES = Path(__file__).parents[2] / "fixtures" / "nccl" / "inspector"
LARGE = 256 << 20


def record(rank, pid, sn, exec_us, busbw, size=LARGE, coll="AllReduce"):
    """One line in the layout of inspector_json.cc (a compact object, then a newline)."""
    return json.dumps(
        {
            "header": {"id": "0x1f2e", "comm_name": "DP", "rank": rank, "n_ranks": 4, "nnodes": 1},
            "metadata": {
                "inspector_output_format_version": "v4.0",
                "git_rev": "",
                "rec_mechanism": "nccl_profiler_interface",
                "dump_timestamp_us": 1764849600000000 + sn,
                "hostname": "node-a",
                "pid": pid,
            },
            "coll_perf": {
                "coll": coll,
                "coll_sn": sn,
                "coll_msg_size_bytes": size,
                "coll_exec_time_us": exec_us,
                "coll_timing_source": "kernel_gpu",
                "coll_algobw_gbs": size / exec_us / 1e3,
                "coll_busbw_gbs": busbw,
            },
        },
        separators=(",", ":"),
    )


def source_on(tmp_path, gpus, jobs_by_gpu):
    config = validate({"sources": {"nccl": {"inspector_paths": [str(tmp_path / "dump*")]}}})
    source = NcclSource(typed_config(config).sources.nccl, nvml_session=NvmlSession(FakeNvml(gpus)))
    source.attach(lambda: dict(jobs_by_gpu), lambda: {g.uuid: i for i, g in enumerate(gpus)})
    return source


def series(snapshot):
    return {
        f.name: {tuple(s.labels.values()): s.value for s in f.samples}
        for f in [*snapshot_families(snapshot), *collective_families({}, snapshot.readings.inspector, False)]
    }


def test_each_process_file_goes_to_its_gpus_job_and_is_read_incrementally(tmp_path):
    gpus = [h100(i, processes=[5000 + i]) for i in range(4)]
    dump = tmp_path / "dump-1"
    dump.mkdir()
    for i in range(4):
        (dump / f"node-a-pid{5000 + i}.log").write_text(
            "".join(record(i, 5000 + i, sn, 1200, 400.0) + "\n" for sn in range(3))
        )
    source = source_on(tmp_path, gpus, {0: "llm", 1: "llm", 2: "llm", 3: "llm"})
    first = series(source.sample())
    assert first["mfu_job_nccl_collectives"] == {("llm", "AllReduce", "large"): 12}
    assert abs(first["mfu_job_nccl_bus_bandwidth_bytes_per_second"][("llm", "AllReduce", "large")] - 400e9) < 1
    assert first["mfu_job_nccl_collective_duration_seconds"][("llm", "AllReduce", "large")] == 0.0012
    # Two more lines on GPU 0, the second still being written: only the complete one counts, once.
    with open(dump / "node-a-pid5000.log", "a") as handle:
        handle.write(record(0, 5000, 3, 1200, 400.0) + "\n" + record(0, 5000, 4, 1200, 400.0)[:40])
    assert series(source.sample())["mfu_job_nccl_collectives"] == {("llm", "AllReduce", "large"): 13}
    assert series(source.sample())["mfu_job_nccl_collectives"] == {("llm", "AllReduce", "large"): 13}
    assert "mfu_job_straggler" not in first


def test_the_rank_with_the_shortest_collectives_is_the_straggler(tmp_path):
    gpus = [h100(i, processes=[5000 + i]) for i in range(4)]
    dump = tmp_path / "dump-1"
    dump.mkdir()
    for i in range(4):
        exec_us = 300 if i == 2 else 1200  # GPU 2 arrives last: the others wait in the all-reduce for it
        (dump / f"node-a-pid{5000 + i}.log").write_text(
            "".join(record(i, 5000 + i, sn, exec_us, 400.0) + "\n" for sn in range(8))
        )
    snapshot = source_on(tmp_path, gpus, dict.fromkeys(range(4), "llm")).sample()
    evidence = snapshot.readings.inspector["llm"].straggler
    assert (
        evidence.startswith("NCCL Inspector: GPU 2 of node-a (pid 5002) spends 0.3 ms") and "median 1.2 ms" in evidence
    )
    assert series(snapshot)["mfu_job_straggler"] == {("llm", "inspector"): 1.0}


def test_files_of_two_jobs_and_one_of_nobodys(tmp_path):
    gpus = [h100(i, processes=[5000 + i]) for i in range(3)]
    dump = tmp_path / "dump-1"
    dump.mkdir()
    for i in range(3):
        (dump / f"node-a-pid{5000 + i}.log").write_text(record(0, 5000 + i, 1, 1200, 400.0) + "\n")
    (dump / "node-a-pid7777.log").write_text(record(0, 7777, 1, 1200, 400.0) + "\n")  # a process NVML does not know
    snapshot = source_on(tmp_path, gpus, {0: "a", 1: "b"}).sample()
    assert set(snapshot.readings.inspector) == {"a", "b"}
    assert snapshot.errors["file_without_job"] == 2  # GPU 2 has no job, pid 7777 no GPU, and two jobs: no guess


def test_the_prometheus_textfile_by_gpu_uuid(tmp_path):
    gpus = [h100(0)]
    dump = tmp_path / "dump-prom"
    dump.mkdir()
    shutil.copy(next(FIXTURES.glob("*.prom")), dump / f"nccl_inspector_metrics_{gpus[0].uuid}.prom")
    source = source_on(tmp_path, gpus, {0: "llm"})
    exported = series(source.sample())
    assert exported["mfu_job_nccl_bus_bandwidth_bytes_per_second"] == pytest.approx(
        {("llm", "AllReduce", "large"): 678.263e9, ("llm", "AllGather", "medium"): 301.5e9}
    )
    assert "mfu_job_nccl_collectives" not in exported  # the textfile has means, not counts
    assert source.sample().status["inspector"]["bytes_read"] == 0  # not rewritten since: not read again


def test_hostile_inspector_lines_are_each_skipped_and_counted_and_the_rest_of_the_chunk_is_read(tmp_path):
    gpus = [h100(0, processes=[5000])]
    dump = tmp_path / "dump-1"
    dump.mkdir()
    good = [record(0, 5000, sn, 1200, 400.0) for sn in range(4)]
    base = json.loads(good[0])
    hostile = []
    for where, key, value in (
        ("coll_perf", "coll_busbw_gbs", "1e308"),
        ("metadata", "pid", "Infinity"),
        ("metadata", "pid", "[1]"),
        ("coll_perf", "coll_msg_size_bytes", "1e400"),
    ):
        text = json.dumps({**base, where: {**base[where], key: "@"}}, separators=(",", ":"))
        hostile.append(text.replace('"@"', value))
    hostile.append("[" * 30_000 + "]" * 30_000)  # nested past the JSON parser's recursion limit, under the line cap
    lines = [good[0], *hostile[:3], good[1], *hostile[3:], good[2], good[3]]
    (dump / "node-a-pid5000.log").write_text("".join(line + "\n" for line in lines))
    snapshot = source_on(tmp_path, gpus, {0: "llm"}).sample()
    assert snapshot.errors == {"value_out_of_range": 4, "nested_too_deep": 1}
    found = series(snapshot)
    assert found["mfu_job_nccl_collectives"] == {("llm", "AllReduce", "large"): 4}
    assert found["mfu_job_nccl_bus_bandwidth_bytes_per_second"] == {("llm", "AllReduce", "large"): pytest.approx(400e9)}


def test_objects_printed_over_many_lines_are_read_across_samples(tmp_path):
    """An Inspector file holding objects indented over lines (as the plugin's README prints them): an object whose
    end is not written yet counts at the sample that reads its end, once."""
    gpus = [h100(0, processes=[5000])]
    dump = tmp_path / "dump-1"
    dump.mkdir()
    path = dump / "node-a-pid5000.log"
    pretty = [json.dumps(json.loads(record(0, 5000, sn, 1200, 400.0)), indent=2) for sn in range(3)]
    text = "\n".join(pretty) + "\n"
    cut = text.index('"coll_perf"', len(pretty[0]) + 1)  # inside the second object
    path.write_text(text[:cut])
    source = source_on(tmp_path, gpus, {0: "llm"})
    assert series(source.sample())["mfu_job_nccl_collectives"] == {("llm", "AllReduce", "large"): 1}
    with open(path, "a") as handle:
        handle.write(text[cut:])
    snapshot = source.sample()
    assert series(snapshot)["mfu_job_nccl_collectives"] == {("llm", "AllReduce", "large"): 3}
    assert dict(snapshot.errors) == {}  # no line of the objects was taken for one of its own
