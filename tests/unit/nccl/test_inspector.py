"""NCCL Inspector's JSON lines and textfile, parsed from files in the plugin's layout (tests/fixtures/nccl/inspector)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mfu_exporter.nccl.inspector import (
    JSON_FILE,
    PROM_FILE,
    CollectiveTally,
    JsonObjects,
    LineError,
    message_size_bytes,
    parse_line,
    parse_textfile,
    shortest_outlier,
    size_class,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "nccl" / "inspector"
# The README's "Output Example" (NVIDIA/nccl plugins/profiler/inspector/README.md), pretty-printed there; the plugin
# writes it on one line. A v4.0 record without comm_name and coll_timing_source.
README_EXAMPLE = {
    "header": {"id": "0x7f8c496ae9f661", "rank": 2, "n_ranks": 8, "nnodes": 1},
    "metadata": {
        "inspector_output_format_version": "v4.0",
        "git_rev": "",
        "rec_mechanism": "profiler_plugin",
        "dump_timestamp_us": 1748030377748202,
        "hostname": "example-hostname",
        "pid": 1639453,
    },
    "coll_perf": {
        "coll": "AllReduce",
        "coll_sn": 1407,
        "coll_msg_size_bytes": 17179869184,
        "coll_exec_time_us": 61974,
        "coll_algobw_gbs": 277.210914,
        "coll_busbw_gbs": 485.119099,
    },
}


def test_the_readme_record():
    found = parse_line(json.dumps(README_EXAMPLE, separators=(",", ":")))
    assert (found.collective, found.rank, found.n_ranks, found.n_nodes, found.pid) == ("AllReduce", 2, 8, 1, 1639453)
    assert found.size_bytes == 16 << 30 and found.exec_time_seconds == pytest.approx(0.061974)
    assert found.busbw_bytes_per_second == pytest.approx(485.119099e9)
    assert found.timing_source is None and found.dump_time == pytest.approx(1748030377.748202)
    assert size_class(found.size_bytes) == "large"


def test_a_dump_file_line_by_line():
    path = FIXTURES / "node-a-pid4101.log"
    assert JSON_FILE.match(path.name).group("host", "pid") == ("node-a", "4101")
    parsed = [parse_line(line) for line in path.read_text().splitlines()]
    collectives = [p for p in parsed if p is not None]
    assert len(parsed) == 6 and len(collectives) == 5  # the P2P send is no collective
    assert [c.collective for c in collectives] == ["AllReduce", "AllReduce", "AllGather", "AllReduce", "ReduceScatter"]
    assert collectives[0].comm == "0x7f8c496ae9f661" and collectives[0].timing_source == "kernel_gpu"
    assert collectives[-1].busbw_bytes_per_second is None  # "nan" as Inspector writes it
    tally = CollectiveTally()
    for item in collectives:
        tally.add(item, "4101")
    summary = {(s.collective, s.size_class): s for s in tally.summaries()}
    assert set(summary) == {
        ("AllReduce", "large"),
        ("AllReduce", "small"),
        ("AllGather", "medium"),
        ("ReduceScatter", "large"),
    }
    large = summary["AllReduce", "large"]
    assert large.count == 2 and large.exec_seconds == pytest.approx(0.0025)
    assert large.busbw_bytes_per_second == pytest.approx((405.9e9 * 399.5e9) ** 0.5)
    assert large.exec_time_seconds == pytest.approx(0.00125)
    assert summary["ReduceScatter", "large"].busbw_bytes_per_second is None


@pytest.mark.parametrize(
    "line",
    [
        "",
        "not json",
        "[]",
        '{"header":{}}',
        '{"header":{"rank":0,"n_ranks":2},"coll_perf":{"coll":"AllReduce"}}',
        '{"header":{"rank":5,"n_ranks":2},"coll_perf":{"coll":"AllReduce","coll_sn":1,"coll_msg_size_bytes":1,"coll_exec_time_us":1}}',
    ],
)
def test_what_is_not_inspectors_is_refused(line):
    with pytest.raises(ValueError):
        parse_line(line)


def test_the_textfile():
    path = next(FIXTURES.glob("*.prom"))
    assert PROM_FILE.match(path.name).group("uuid") == "GPU-1b2c3d4e-0000-0000-0000-000000000000"
    buckets, bad = parse_textfile(path.read_text() + "garbage line\n")
    assert bad == 1
    by_comm = {b.comm_name: b for b in buckets}
    assert set(by_comm) == {"DP Group 0", "TP Group 0"}  # the P2P pair is left out
    dp = by_comm["DP Group 0"]
    assert (dp.gpu, dp.collective, dp.size_bytes, dp.n_ranks, dp.slurm_job_id) == (
        "GPU0",
        "AllReduce",
        4 << 30,
        4,
        None,
    )
    assert dp.busbw_bytes_per_second == pytest.approx(678.263e9) and dp.exec_time_seconds == pytest.approx(9498.47e-6)
    assert by_comm["TP Group 0"].slurm_job_id == "4242" and size_class(by_comm["TP Group 0"].size_bytes) == "medium"


def test_message_size_labels():
    assert message_size_bytes("0B") == 0
    assert message_size_bytes("1-2KB") == 1024
    assert message_size_bytes("512-513MB") == 512 << 20
    assert message_size_bytes("big") is None


def test_the_straggler_has_the_shortest_collectives():
    assert shortest_outlier({"0": 0.1, "1": 0.1, "2": 0.1, "3": 0.02}) == ("3", 0.02, 0.1)
    assert shortest_outlier({"0": 0.1, "1": 0.095, "2": 0.105, "3": 0.09}) is None  # close together: nobody
    assert shortest_outlier({"0": 0.1, "1": 0.02}) is None  # two ranks cannot say which is odd


def objects(lines):
    """Every line through one reader: the objects' texts and the errors, in order."""
    reader = JsonObjects()
    return [item for line in lines for item in reader.feed(line)], reader


def test_the_readme_examples_printed_over_many_lines_read_as_their_compact_form():
    path = FIXTURES / "example-hostname-pid1639453.log"
    texts, reader = objects(path.read_text().splitlines())
    assert len(texts) == 2 and not reader.open and all(isinstance(t, str) and "\n" in t for t in texts)
    first, verbose = (parse_line(t) for t in texts)
    assert first == parse_line(json.dumps(README_EXAMPLE, separators=(",", ":")))
    assert (verbose.collective, verbose.rank, verbose.sn, verbose.timing_source) == (
        "ReduceScatter",
        4,
        1231,
        "kernel_gpu",
    )
    assert verbose.busbw_bytes_per_second == pytest.approx(366.134533e9)
    # The compact lines the plugin writes pass through unchanged, before and after a pretty-printed object.
    compact = (FIXTURES / "node-a-pid4101.log").read_text().splitlines()
    mixed, _ = objects([compact[0], *path.read_text().splitlines(), compact[1]])
    assert mixed[0] == compact[0] and mixed[-1] == compact[1] and len(mixed) == 4


def pretty(record: dict) -> list[str]:
    return json.dumps(record, indent=2).splitlines()


def test_a_pretty_printed_object_holds_to_the_same_bounds():
    nested = {**README_EXAMPLE, "extra": json.loads("[" * 40 + "]" * 40)}
    big = {**README_EXAMPLE, "extra": ["x" * 100] * 800}
    after = pretty(README_EXAMPLE)
    for record, reason in ((nested, "nested_too_deep"), (big, "line_too_long")):
        items, reader = objects([*pretty(record), *after])
        errors = [i for i in items if isinstance(i, LineError)]
        assert [e.reason for e in errors] == [reason]  # refused whole, once; the object after it still reads
        assert [parse_line(i).rank for i in items if isinstance(i, str)] == [2] and not reader.open
    # Numbers JSON does not allow, and a value past its bound, are refused as in a compact line.
    for text, value in (("NaN", "NaN"), ("1e400", "1e400"), ("Infinity", "Infinity")):
        lines = [line.replace("61974", value) for line in after]
        (item,), _ = objects(lines)
        with pytest.raises(LineError) as refused:
            parse_line(item)
        assert refused.value.reason == "value_out_of_range", text


def test_an_object_cut_off_by_the_next_one_is_refused_and_the_next_one_read():
    lines = pretty(README_EXAMPLE)
    items, reader = objects([*lines[:10], *lines])
    assert [type(i).__name__ for i in items] == ["LineError", "str"] and not reader.open
    assert items[0].reason == "unreadable_line" and parse_line(items[1]).rank == 2
    # Lines that are no object at all each reach the parser, which refuses them.
    stray, _ = objects(["  }", "not json", "]"])
    assert len(stray) == 3 and all(isinstance(s, str) for s in stray)
