"""Property tests of every parser of untrusted text: NCCL Inspector's JSON lines and textfile, NCCL_DEBUG lines,
nccl-tests output, training logs, mountstats and nvidia-fs stats. Whatever a line holds, no exception escapes, each
bad line is skipped on its own, and every figure that could reach /metrics is finite and within its bounds.

Derandomized, so a run in CI tries the same inputs as a run here; the hostile inputs found by hand come first as
explicit examples."""

from __future__ import annotations

import json
import math
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mfu_exporter.logs.stream import MAX_FIGURE, LogStream
from mfu_exporter.nccl import inspector
from mfu_exporter.nccl.debug import TransportScanner
from mfu_exporter.nccl.perf import MAX_BUSBW_GBPS, read_text
from mfu_exporter.node.storage import COUNTER_MAX, parse_mountstats, parse_nvfs_stats
from mfu_exporter.render.collectives import inspector_families
from mfu_exporter.sources.inspector import InspectorReading

FUZZ = settings(
    max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow], database=None
)

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 100_000 + "1" + "}" * 100_000
hostile_numbers = st.sampled_from(
    ["1e308", "-1e308", "1e400", "Infinity", "-Infinity", "NaN", "[1]", "{}", '"7"', "true", "9" * 5000, "-0", "1.5"]
)


def replace_undecodable(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


lines_of_text = st.text(max_size=200) | st.binary(max_size=200).map(replace_undecodable)


def _record(rank=0, pid=5000, sn=1, size=256 << 20, busbw=400.0):
    return {
        "header": {"id": "0x1f2e", "comm_name": "DP", "rank": rank, "n_ranks": 4, "nnodes": 1},
        "metadata": {"dump_timestamp_us": 1764849600000000, "hostname": "node-a", "pid": pid},
        "coll_perf": {
            "coll": "AllReduce",
            "coll_sn": sn,
            "coll_msg_size_bytes": size,
            "coll_exec_time_us": 1200.0,
            "coll_timing_source": "kernel_gpu",
            "coll_busbw_gbs": busbw,
        },
    }


def _with(where: str, key: str, raw: str) -> str:
    """A valid record whose ``where.key`` is the raw JSON text ``raw`` (Infinity, 1e400: what json.dumps won't)."""
    record = _record()
    record[where][key] = "@"
    return json.dumps(record, separators=(",", ":")).replace('"@"', raw)


FIELDS = [(where, key) for where, keys in _record().items() for key in keys]


def _finite_families(families) -> None:
    for family in families:
        for sample in family.samples:
            assert math.isfinite(sample.value), (family.name, sample)


def _inspector_line_holds(line: str) -> None:
    tally = inspector.CollectiveTally()
    try:
        item = inspector.parse_line(line)
    except ValueError:
        return
    if item is None:
        return
    numbers = [item.size_bytes, item.exec_time_seconds, item.rank, item.n_ranks, item.pid, item.sn]
    assert all(math.isfinite(n) for n in numbers)
    assert item.size_bytes <= inspector.MAX_SIZE_BYTES and item.pid <= inspector.MAX_PID
    if item.busbw_bytes_per_second is not None:
        assert item.busbw_bytes_per_second <= inspector.MAX_BUSBW_GBS * inspector.GBS
    tally.add(item, "pid 1")
    _finite_families(inspector_families({"job": InspectorReading(tuple(tally.summaries()), None)}))


@FUZZ
@given(field=st.sampled_from(FIELDS), raw=hostile_numbers)
@example(field=("coll_perf", "coll_busbw_gbs"), raw="1e308")
@example(field=("metadata", "pid"), raw="Infinity")
@example(field=("metadata", "pid"), raw="[1]")
@example(field=("coll_perf", "coll_msg_size_bytes"), raw="1e400")
def test_inspector_json_lines_with_hostile_values_parse_or_raise_value_error(field, raw):
    _inspector_line_holds(_with(*field, raw))


@FUZZ
@given(line=lines_of_text)
@example(line=DEEP)
@example(line=DEEP_OBJECT)
@example(line='{"header":{},"coll_perf":' + DEEP + "}")
def test_inspector_json_lines_of_any_text_parse_or_raise_value_error(line):
    _inspector_line_holds(line)


def test_the_inspector_bounds_name_the_field():
    try:
        inspector.parse_line(_with("coll_perf", "coll_busbw_gbs", "1e308"))
    except inspector.LineError as error:
        assert "coll_perf.coll_busbw_gbs" in str(error) and error.reason == "value_out_of_range"
    else:
        raise AssertionError("a bus bandwidth of 1e308 GB/s was accepted")


PROM = (
    'nccl_bus_bandwidth_gbs{{version="v4.0",gpu="GPU0",comm_name="DP",n_nodes="{nodes}",nranks="8",'
    'collective="AllReduce",message_size="{size}",algo_proto="Ring_Simple"}} {value}'
)


@FUZZ
@given(
    value=hostile_numbers | st.text(max_size=20),
    size=st.sampled_from(["4-5GB", "0B", "9" * 5000 + "-1GB", "²-3MB", "1-2PB"]) | st.text(max_size=20),
    nodes=st.sampled_from(["1", "²", "9" * 5000, "-1"]) | st.text(max_size=10),
    noise=lines_of_text,
)
@example(value="1e308", size="4-5GB", nodes="1", noise="")
@example(value="400", size="4-5GB", nodes="²", noise="")
def test_inspector_textfiles_give_finite_bounded_buckets(value, size, nodes, noise):
    text = "\n".join(
        [PROM.format(value=value, size=size, nodes=nodes), noise, PROM.format(value=1, size="0B", nodes=1)]
    )
    buckets, bad = inspector.parse_textfile(text)
    assert bad >= 0
    for bucket in buckets:
        assert bucket.busbw_bytes_per_second is None or bucket.busbw_bytes_per_second <= 1e4 * inspector.GBS
        assert bucket.size_bytes <= inspector.MAX_SIZE_BYTES


NCCL_DEBUG_LINES = st.sampled_from(
    [
        "node-a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "node-a:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes " + "9" * 5000 + " localRanks 8",
        "node-a:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8",
        "node-a:1:2 [0] NCCL INFO Using network IB",
        "node-a:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE",
    ]
)


@FUZZ
@given(lines=st.lists(NCCL_DEBUG_LINES | lines_of_text.map("h:1:2 [0] NCCL INFO ".__add__), max_size=12))
@example(lines=["node-a:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes " + "9" * 5000 + " localRanks 8"])
def test_nccl_debug_lines_never_raise(lines):
    scanner = TransportScanner()
    for line in lines:
        scanner.feed(line)
    scanner.finding()


ROW = "   {size}  {count}  float  sum  -1  {time}  {algbw}  {busbw}  0  {time}  {algbw}  {busbw}  0"


@FUZZ
@given(
    size=st.sampled_from(["1048576", "²", "9" * 5000]) | st.text(max_size=8),
    figure=hostile_numbers | st.text(max_size=8),
    noise=st.lists(lines_of_text, max_size=4),
)
@example(size="1048576", figure="1e308", noise=[])
@example(size="9" * 5000, figure="1.5", noise=["#  Rank  " + "9" * 5000 + " Group  0 Pid 1 on host device  0"])
@example(size="1048576", figure="1.5", noise=["# Out of bounds values : " + "9" * 5000 + " OK"])
def test_nccl_tests_output_is_read_line_by_line_and_stays_bounded(size, figure, noise):
    header = "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
    row = ROW.format(size=size, count="262144", time="11.5", algbw="91.0", busbw=figure)
    reading = read_text([header, *noise, row, ROW.format(size="2048", count="512", time="1", algbw="2", busbw="3")])
    for row in reading.perf.rows if reading.perf else ():
        for half in (row.out_of_place, row.in_place):
            if half is not None and half.busbw_gbps is not None:
                assert math.isfinite(half.busbw_gbps) and half.busbw_gbps <= MAX_BUSBW_GBPS


PROGRESS = "[rank0]: [titan] 2025-01-01 00:00:00,000 - root - INFO - step: {step}  loss: 2.5  memory: 10GiB  tps: {tps}"


@FUZZ
@given(
    step=hostile_numbers | st.text(max_size=10),
    tps=hostile_numbers | st.text(max_size=10),
    noise=st.lists(lines_of_text, max_size=6),
)
@example(step="1", tps="9" * 5000, noise=[])
@example(step="1e400", tps="1e308", noise=[DEEP])
@example(step="9" * 400, tps="1", noise=[])
@example(step=str(2**60), tps="1", noise=[])
def test_training_log_lines_are_read_one_by_one_and_never_raise(step, tps, noise):
    stream = LogStream()
    events = stream.feed_many([PROGRESS.format(step=step, tps=tps), *noise, PROGRESS.format(step=2, tps=1)], 1.0)
    for event in events:
        for value in vars(event.record).values():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert math.isfinite(value) and abs(value) <= MAX_FIGURE


MOUNT = "device srv:/data mounted on /data with fstype nfs4 statvers=1.1"


@FUZZ
@given(
    figure=st.sampled_from(["1", "-1", "9" * 30, "9" * 5000, "²", "1e3", str(COUNTER_MAX + 1)]) | st.text(max_size=8),
    noise=st.lists(lines_of_text, max_size=4),
)
@example(figure="9" * 5000, noise=[])
@example(figure="²", noise=["\tage:\t²"])
def test_mountstats_lines_are_each_read_or_skipped_and_counters_stay_bounded(figure, noise):
    text = "\n".join(
        [
            MOUNT,
            f"\tbytes:\t{figure} 0 0 0 10 0 0 0",
            *noise,
            "\tper-op statistics",
            f"\t        READ: 5 5 0 1 {figure} 0 1 2 0",
            "device other mounted on /other with fstype ext4",
        ]
    )
    skipped: Counter = Counter()
    mounts = parse_mountstats(text, skipped)
    assert [m.mount_point for m in mounts][-1] == "/other"  # the lines after a bad one are still read
    for mount in mounts:
        if mount.nfs is not None:
            values = [*mount.nfs.bytes.values()] + [v for op in mount.nfs.ops.values() for v in vars(op).values()]
            assert all(v is None or 0 <= v <= COUNTER_MAX for v in values)


NVFS = """NVFS statistics(ver: 4.0)
NVFS Driver(version: 2.17.5)
IO stats: Enabled, peer IO stats: Disabled
Active Process: {figure}
Reads\t\t\t\t: n={figure} ok=10 err=0 readMiB=3 io_state_err=0
Writes\t\t\t\t: n=1 ok=1 err=0 writeMiB=1 io_state_err=0
GPU 0000:3b:00.0 uuid:GPU-1 : Registered_MiB={figure} Cache_MiB=0 max_pinned_MiB=1
"""


@FUZZ
@given(
    figure=st.sampled_from(["1", "-1", "9" * 5000, "²", str(COUNTER_MAX + 1)]) | st.text(max_size=8),
    noise=lines_of_text,
)
@example(figure="9" * 5000, noise="")
@example(figure="²", noise="")
def test_nvidia_fs_stats_lines_are_each_read_or_skipped(figure, noise):
    stats = parse_nvfs_stats(NVFS.format(figure=figure) + noise + "\n", Counter())
    assert stats is not None and stats.writes.operations == 1  # the lines after a bad one are still read
    values = [stats.reads.operations, stats.active_processes, *(g.registered_mib for g in stats.gpus)]
    assert all(v is None or abs(v) <= COUNTER_MAX for v in values)


STRAGGLER_LINES = [
    " 0: INFO:megatron.core.utils:[2024-03-14 23:07:56] | MnRtt/Rnk: {f}ms/8 | MxRtt/Rnk: 3468.20ms/0 | "
    "MnEtpt/Rnk: {f}TF/0 | MxEtpt/Rnk: 297.32TF/8",
    " 0: INFO:megatron.core.utils:^^^^ Bottom 2 Ranks with lowest  Etpt(TF): {f}/3, 1.0/{f},",
    " 0: INFO:megatron.core.utils:^^^^ Top    2 Ranks with highest Etpt(TF): {f}/15, 297.32/8,",
    "\t Train MinThroughput/Rank: {f}TF/Rank-3",
    "\t Train MaxThroughput/Rank: {f}TF/{f}",
    "GPU relative performance:",
    "  Rank={f} Node=n Score={f}",
    "=== Straggler Report at Step 10 ===",
    "⚠️  Detected Stragglers: [{f}, 3]",
    "  - Rank 3 ({f})",
    "GPU Performance Scores (higher=faster):",
    "  Rank 3 (node): {f}",
    "Section Timings (ms):",
    "  optimizer:",
    "    Rank 3: {f}ms",
]
PROFILER_LINES = [
    "-" * 20,
    "                    Name    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg    # of Calls  ",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter._...        1.00%     {f}ms        1.00%     {f}s     {f}ms   9  ",
    "| Name | CPU total |",
    "| enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ | {f}us |",
    "Profile stats for: [_TrainingEpochLoop].train_dataloader_next",
    "         {f} function calls ({f} primitive calls) in {f} seconds",
    "time (ms) | forward-compute: {f} |",
    "# optimizer: {f} | batch-generator: {f}",
]


@FUZZ
@given(
    figure=hostile_numbers | st.sampled_from(["9" * 400, "1.2.3", "99999999999", ""]) | st.text(max_size=8),
    order=st.permutations(range(len(STRAGGLER_LINES))),
    noise=st.lists(lines_of_text, max_size=4),
)
@example(figure="9" * 400, order=list(range(len(STRAGGLER_LINES))), noise=[])
def test_straggler_reports_never_raise_and_name_only_finite_figures(figure, order, noise):
    from mfu_exporter.sources.logs import _JobScanners

    scanners = _JobScanners()
    scanners.feed([*(STRAGGLER_LINES[i].format(f=figure) for i in order), *noise])
    found = scanners.reading().straggler
    assert scanners.skipped == 0
    if found is not None:
        assert found.score is None or (math.isfinite(found.score) and 0 <= found.score < 1)
        assert "inf" not in found.evidence and "nan" not in found.evidence and 0 <= found.rank < 1 << 24


@FUZZ
@given(
    figure=hostile_numbers | st.sampled_from(["9" * 400, "1.2.3", ""]) | st.text(max_size=8),
    noise=st.lists(lines_of_text, max_size=4),
)
@example(figure="9" * 400, noise=[])
def test_profiler_tables_give_finite_data_waits_or_none(figure, noise):
    stream = LogStream()
    lines = [line.format(f=figure) for line in PROFILER_LINES]
    events = stream.feed_many([*lines, *noise, *lines], 1.0)
    for event in events:
        for value in vars(event.record).values():
            if isinstance(value, float):
                assert math.isfinite(value) and value >= 0


@FUZZ
@given(lines=st.lists(lines_of_text | st.sampled_from(["{", "}", "  [", "  ]", '  "a": {', "  },"]), max_size=40))
@example(lines=["{", *["  [" for _ in range(40)]])
@example(lines=["{", '  "a": "' + "x" * 70_000 + '"', "}"])
def test_inspector_objects_over_lines_are_bounded(lines):
    reader = inspector.JsonObjects()
    for line in lines:
        for item in reader.feed(line):
            if isinstance(item, str):
                assert len(item) <= inspector.MAX_OBJECT_BYTES + len(line) + 1
                _inspector_line_holds(item)
            else:
                assert item.reason in ("unreadable_line", "nested_too_deep", "line_too_long")
