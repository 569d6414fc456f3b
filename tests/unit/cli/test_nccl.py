"""``mfu-exporter nccl`` and ``mfu-exporter check --nccl``: the JSON contract, the verdict, the exit codes.

The texts are the real pastes of tests/fixtures/nccl/real/ (and the synthetic block with wrong values); the fabric is
a fixture /sys of an HGX node with eight ACTIVE 400 Gb/s ports (0.8 x 3200 Gb/s / 8 = 320 GB/s expected).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mfu_exporter.cli import build_parser, main
from mfu_exporter.cli.check import run_check
from mfu_exporter.cli.nccl import run_nccl
from mfu_exporter.sim.nvml import FakeNvml, h100
from tests.support.nodes import FakeQos, hgx_node
from tests.unit.nccl.real_nccl import load

PERF = {b.name: b for b in load("real/perf.txt")}
DEBUG = {b.name: b for b in load("real/debug.txt")}
SYNTHETIC = {b.name: b for b in load("synthetic/perf.txt")}


def write(tmp_path: Path, lines: list[str], name: str = "out.txt") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def nccl(*argv: str) -> tuple[int, str]:
    args = build_parser().parse_args(["nccl", *argv])
    out = io.StringIO()
    return run_nccl(args, out=out), out.getvalue()


def test_json_contract_keys_and_values(tmp_path: Path) -> None:
    code, out = nccl(write(tmp_path, PERF["coreweave-nccl-tests-43-nvl72"].lines), "--json", "--expect-busbw", "400")
    document = json.loads(out)
    assert code == 0
    assert set(document) == {"perf", "transport", "verdict", "reasons"}
    perf = document["perf"]
    assert set(perf) == {
        "collective", "rows", "avg_busbw_gbps", "max_busbw_gbps", "largest_size_bytes", "n_ranks", "wrong_nonzero",
    }  # fmt: skip
    assert set(perf["rows"][0]) == {"size_bytes", "count", "type", "redop", "out_of_place", "in_place"}
    assert set(perf["rows"][0]["out_of_place"]) == {"time_us", "algbw_gbps", "busbw_gbps", "wrong"}
    assert perf["rows"][-1] == {
        "size_bytes": 8589934592,
        "count": 2147483648,
        "type": "float",
        "redop": "sum",
        "out_of_place": {"time_us": 20299.0, "algbw_gbps": 423.16, "busbw_gbps": 834.57, "wrong": 0.0},
        "in_place": {"time_us": 20006.0, "algbw_gbps": 429.37, "busbw_gbps": 846.82, "wrong": 0.0},
    }
    assert (perf["avg_busbw_gbps"], perf["max_busbw_gbps"], perf["n_ranks"]) == (745.53, 839.16, 72)
    assert perf["collective"] is None  # the paste does not say; never guessed
    assert document["transport"] is None
    assert document["verdict"] == "pass"


def test_transport_in_the_json(tmp_path: Path) -> None:
    code, out = nccl(write(tmp_path, DEBUG["nccl-707-a100-gdrdma-channels"].lines), "--json")
    document = json.loads(out)
    assert document["perf"] is None
    assert {k: document["transport"][k] for k in ("transport", "gdr", "fell_back_to_socket")} == {
        "transport": "ib",
        "gdr": True,
        "fell_back_to_socket": False,
    }
    assert "NET/IB/5/GDRDMA" in document["transport"]["evidence"]
    assert code == 0


def test_busbw_judged_against_the_node_fabric(tmp_path: Path) -> None:
    node = hgx_node(tmp_path)
    good = write(tmp_path, PERF["coreweave-nccl-tests-43-nvl72"].lines, "good.txt")
    slow = write(tmp_path, PERF["nccl-tests-232-tree-two-nodes"].lines, "slow.txt")
    assert nccl(good, "--path.sysfs", str(node.sys))[0] == 0
    code, out = nccl(slow, "--path.sysfs", str(node.sys), "--json")
    reasons = json.loads(out)["reasons"]
    assert code == 1
    assert any("busbw 41.31 GB/s at 33554432 B is below 0.9 x the expected 320 GB/s" in r for r in reasons), reasons
    assert any("8 ACTIVE RDMA ports' 3200 Gb/s" in r for r in reasons), reasons
    # --expect-busbw overrides the fabric's figure.
    assert nccl(slow, "--path.sysfs", str(node.sys), "--expect-busbw", "40")[0] == 0


def test_no_rdma_port_means_bandwidth_not_judged(tmp_path: Path) -> None:
    code, out = nccl(write(tmp_path, PERF["nccl-tests-232-tree-two-nodes"].lines), "--path.sysfs", str(tmp_path))
    assert code == 0
    assert "bandwidth not judged" in out


def test_socket_fallback_fails(tmp_path: Path) -> None:
    code, out = nccl(write(tmp_path, DEBUG["nccl-447-gcp-slurm-sockets"].lines), "--json")
    document = json.loads(out)
    assert code == 1
    assert document["verdict"] == "fail"
    assert document["transport"]["fell_back_to_socket"] is True
    assert any("NCCL uses sockets, not RDMA" in r for r in document["reasons"])


def test_wrong_values_fail(tmp_path: Path) -> None:
    block = SYNTHETIC["synthetic-srun-wrong-values-info-between-rows"]
    code, out = nccl(write(tmp_path, block.lines), "--json", "--expect-busbw", "10")
    document = json.loads(out)
    assert code == 1
    assert document["perf"]["wrong_nonzero"] is True
    assert document["perf"]["rows"][1]["out_of_place"]["wrong"] == 1048580  # "%g" of 1048576, as printed
    assert any("wrong values" in r for r in document["reasons"])
    assert any("FAILED" in r for r in document["reasons"])


def test_a_table_cut_before_its_first_row_fails(tmp_path: Path) -> None:
    code, out = nccl(write(tmp_path, PERF["nccl-1530-tree-4090-header-only"].lines), "--json")
    assert code == 1
    assert json.loads(out)["perf"]["rows"] == []


def test_ranks_that_did_not_run_together_fail(tmp_path: Path) -> None:
    # All-reduce busbw is 2(n-1)/n x algbw: with the 16 ranks listed, 20.48 GB/s algbw cannot give 20.48 busbw.
    lines = ["# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20"]
    lines += [
        f"#  Rank {r:2d} Group  0 Pid {100 + r:6d} on      node{r // 8} device {r % 8:2d} [0x18] H100"
        for r in range(16)
    ]
    lines += ["# Collective test starting: all_reduce_perf"]
    lines += [
        "     1048576        262144     float     sum      -1    51.20   20.48   20.48      0    50.90   20.60   20.60      0"
    ]
    code, out = nccl(write(tmp_path, lines), "--json")
    assert code == 1
    assert any("not algbw x the all_reduce factor for 16 ranks" in r for r in json.loads(out)["reasons"])


@pytest.mark.parametrize(
    "content",
    [b"", b"\n\n", b"hello world\nno nccl here\n", b"\xff\xfe\x00garbage"],
    ids=["empty", "blank", "other text", "not utf-8"],
)
def test_unreadable_input_exits_2(tmp_path: Path, content: bytes, capsys) -> None:
    path = tmp_path / "x.txt"
    path.write_bytes(content)
    code, out = nccl(str(path), "--json")
    assert code == 2
    if out:
        assert json.loads(out)["verdict"] == "unreadable"


def test_missing_file_and_bad_expectation_exit_2(tmp_path: Path, capsys) -> None:
    assert nccl(str(tmp_path / "missing.txt"))[0] == 2
    assert "missing.txt" in capsys.readouterr().err
    good = write(tmp_path, PERF["coreweave-nccl-tests-43-nvl72"].lines)
    for bad in ("0", "-5", "nan", "inf", "fast"):
        with pytest.raises(SystemExit) as exc:
            main(["nccl", good, "--expect-busbw", bad])
        assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["nccl"])  # FILE is required
    assert exc.value.code == 2


def test_stdin_through_the_installed_entry_point(tmp_path: Path) -> None:
    text = "\n".join(PERF["nccl-tests-78-eight-nodes-allreduce"].lines) + "\n"
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "nccl", "-", "--json", "--path.sysfs", str(tmp_path)],
        input=text.encode(),
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["perf"]["avg_busbw_gbps"] == 4.32178
    empty = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "nccl", "-"], input=b"", capture_output=True, check=False
    )
    assert empty.returncode == 2


# --- check --nccl ----------------------------------------------------------------------------------------------------


def check(node, *extra: str) -> tuple[int, dict]:
    args = build_parser().parse_args(
        ["check", "--path.sysfs", str(node.sys), "--path.procfs", str(node.proc), "--json", *extra]
    )
    out = io.StringIO()
    qos = FakeQos(pfc={f"eth{i}": {3} for i in range(8)}, pause={})
    code = run_check(args, nvml=FakeNvml([h100(i) for i in range(8)]), qos=qos, out=out)
    return code, json.loads(out.getvalue())


def nccl_result(document: dict) -> dict:
    return next(r for r in document["results"] if r["check"] == "nccl.test")


def test_check_adds_the_nccl_verification(tmp_path: Path, monkeypatch) -> None:
    for key in [k for k in __import__("os").environ if k.startswith("NCCL_")]:
        monkeypatch.delenv(key)
    node = hgx_node(tmp_path / "node")
    good = write(tmp_path, PERF["coreweave-nccl-tests-43-nvl72"].lines, "good.txt")
    code, document = check(node, "--nccl", good)
    assert nccl_result(document)["status"] == "PASS"
    assert "busbw ≥ 288 GB/s" in nccl_result(document)["expected"]
    slow = write(tmp_path, PERF["nccl-tests-232-tree-two-nodes"].lines, "slow.txt")
    code, document = check(node, "--nccl", slow)
    assert code == 1
    assert nccl_result(document)["status"] == "FAIL"
    assert "slow.txt" in nccl_result(document)["observed"]
    empty = write(tmp_path, [""], "empty.txt")
    code, document = check(node, "--nccl", empty)
    assert code == 1 and nccl_result(document)["status"] == "FAIL"
    _, document = check(node)
    assert not [r for r in document["results"] if r["check"] == "nccl.test"]


def test_check_with_an_unreadable_nccl_file_exits_2(tmp_path: Path) -> None:
    node = hgx_node(tmp_path / "node")
    assert main(["check", "--path.sysfs", str(node.sys), "--nccl", str(tmp_path / "missing.txt")]) == 2


@pytest.mark.parametrize("content", [None, b"\x00\xff\xfe binary \x80\x81", b""])
def test_json_is_printed_with_the_reason_for_missing_binary_and_empty_files(tmp_path: Path, content) -> None:
    path = tmp_path / "out.txt"
    if content is not None:
        path.write_bytes(content)
    code, out = nccl(str(path), "--json", "--expect-busbw", "400")
    document = json.loads(out)
    assert code == 2
    assert document["verdict"] == "unreadable" and document["perf"] is None
    assert document["reasons"] and all(isinstance(reason, str) and reason for reason in document["reasons"])
    if content is None:
        assert "No such file" in document["reasons"][0]


def test_a_closed_pipe_ends_quietly_with_the_verdicts_exit_code(tmp_path: Path) -> None:
    good = write(tmp_path, PERF["coreweave-nccl-tests-43-nvl72"].lines)
    # The reader is gone before the command writes (as `| head` after its lines): the write meets EPIPE.
    child = subprocess.Popen(
        [sys.executable, "-m", "mfu_exporter", "nccl", good, "--json", "--expect-busbw", "400"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child.stdout.close()
    stderr = child.stderr.read().decode()
    assert child.wait() == 0
    assert stderr == ""


@pytest.mark.parametrize(
    "command,required",
    [("check", []), ("nccl", ["out.txt"]), ("plan", ["--params", "7B", "--tokens", "1T"]), ("healthcheck", [])],
)
def test_a_bad_flag_prints_the_subcommands_own_usage(command, required, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, *required, "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: mfu-exporter {command} ")
    assert "unrecognized arguments: --bogus" in err
