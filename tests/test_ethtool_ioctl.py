"""The ioctl reader against a real kernel: a veth pair in a network namespace the test creates, read from inside
that namespace and compared with Debian's ``ethtool -S`` for the same interface, before and after its stat set
changes (``ethtool -L`` changes the number of per-queue stats)."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.sources.ethtool import parse_ethtool_statistics
from tests.conftest import require_tool

REPOSITORY = Path(__file__).resolve().parent.parent

# Runs inside the namespace (ip netns exec); prints what the reader and ethtool saw, as JSON.
INSIDE = r"""
import json, subprocess, sys
from exporter.sources.ethtool import EthtoolIoctlReader, EthtoolSource

ethtool = sys.argv[1]
reader = EthtoolIoctlReader()

def ethtool_s(interface):
    return subprocess.run([ethtool, "-S", interface], capture_output=True, text=True, check=True).stdout

def errno_of(interface):
    try:
        reader.read(interface)
    except OSError as exc:
        return exc.errno
    return None

seen = {"first": reader.read("va"), "first_text": ethtool_s("va"), "again": reader.read("va")}
subprocess.run([ethtool, "-L", "va", "rx", "2", "tx", "2"], check=True, capture_output=True)
seen["after"] = reader.read("va")
seen["after_text"] = ethtool_s("va")
seen["loopback_errno"] = errno_of("lo")
seen["missing_errno"] = errno_of("mfuabsent0")
reader.close()
# The source end to end: ip netns exec mounts the namespace's own /sys, so class/net lists va and vb.
source = EthtoolSource("/sys", interfaces_include=["^va$"], interfaces_exclude=[], stats_include=["^peer_ifindex$"])
snapshot = source.sample()
source.close()
seen["source_interfaces"] = list(snapshot.data["interfaces"])
seen["source_stats"] = snapshot.data["interfaces"]["va"].stats
print(json.dumps(seen))
"""

PERMISSION_WORDS = ("Operation not permitted", "Permission denied", "Read-only file system")


def _run(*command, check=True):
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@pytest.fixture(scope="module")
def namespace():
    ip = require_tool("ip", "iproute2")
    require_tool("ethtool", "ethtool")
    if os.geteuid() != 0:
        pytest.skip("creating a network namespace and a veth pair needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
    name = f"mfu-ethtool-test-{os.getpid()}"
    created = _run(ip, "netns", "add", name, check=False)
    if created.returncode != 0:
        if any(word in created.stderr for word in PERMISSION_WORDS):
            pytest.skip(f"this machine forbids creating network namespaces: {created.stderr.strip()}")
        raise AssertionError(f"ip netns add {name} failed: {created.stderr.strip()}")
    try:
        pair = _run(ip, "-n", name, "link", "add", "va", "numrxqueues", "4", "numtxqueues", "4", "type", "veth",
                    "peer", "name", "vb", "numrxqueues", "4", "numtxqueues", "4", check=False)
        if pair.returncode != 0:
            if any(word in pair.stderr for word in PERMISSION_WORDS):
                pytest.skip(f"this machine forbids creating veth interfaces: {pair.stderr.strip()}")
            raise AssertionError(f"creating the veth pair failed: {pair.stderr.strip()}")
        _run(ip, "-n", name, "link", "set", "va", "up")
        _run(ip, "-n", name, "link", "set", "vb", "up")
        yield name
    finally:
        _run(ip, "netns", "del", name, check=False)


@pytest.fixture(scope="module")
def seen(namespace):
    ethtool = require_tool("ethtool", "ethtool")
    ip = require_tool("ip", "iproute2")
    result = subprocess.run([ip, "netns", "exec", namespace, sys.executable, "-c", INSIDE, ethtool],
                            capture_output=True, text=True, timeout=60, cwd=REPOSITORY)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    links = json.loads(_run(ip, "-n", namespace, "-j", "link", "show").stdout)
    seen["ifindex"] = {link["ifname"]: link["ifindex"] for link in links}
    return seen


def test_reader_returns_what_ethtool_prints(seen):
    expected = parse_ethtool_statistics(seen["first_text"])
    assert len(expected) > 10
    assert seen["first"] == expected
    assert list(seen["first"]) == list(expected)  # same order: names and values were not misaligned
    assert seen["first"]["peer_ifindex"] == seen["ifindex"]["vb"]
    assert seen["again"] == seen["first"]


def test_reader_follows_a_stat_set_that_shrinks(seen):
    expected = parse_ethtool_statistics(seen["after_text"])
    assert len(expected) < len(seen["first"])
    assert seen["after"] == expected
    assert not any(name.startswith("rx_queue_3_") for name in seen["after"])


def test_reader_errors_name_the_problem(seen):
    assert seen["loopback_errno"] == errno.EOPNOTSUPP
    assert seen["missing_errno"] == errno.ENODEV


def test_source_reads_the_namespace_interfaces_with_the_ioctl(seen):
    assert seen["source_interfaces"] == ["va"]
    assert seen["source_stats"] == seen["after"]
