"""The ioctl reader against a real kernel: a veth pair in a network namespace the test creates, read from inside
that namespace and compared with Debian's ``ethtool -S`` for the same interface, before and after its stat set
changes (``ethtool -L`` changes the number of per-queue stats).

As root (CI) the namespace is a named one (``ip netns add``). Otherwise it is an unprivileged user + network +
mount namespace (``unshare -Urnm``), where the test is root over its own network: the kernel lets a user namespace
create veth pairs, change their channels and mount a sysfs of that network. Only a machine that forbids user
namespaces (or the steps inside one) skips, with the step and the kernel's answer."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mfu_exporter.node.ethtool import parse_ethtool_statistics
from tests.support.tools import require_tool

REPOSITORY = Path(__file__).resolve().parents[2]

# Runs inside the namespace (ip netns exec); prints what the reader and ethtool saw, as JSON.
INSIDE = r"""
import json, subprocess, sys
from mfu_exporter.sources.ethtool import EthtoolIoctlReader, EthtoolSource

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
seen["source_interfaces"] = list(snapshot.readings.interfaces)
seen["source_stats"] = snapshot.readings.interfaces["va"].stats
print(json.dumps(seen))
"""

PERMISSION_WORDS = ("Operation not permitted", "Permission denied", "Read-only file system")

# Runs as root of a fresh user + network + mount namespace (unshare -Urnm); prints INSIDE's JSON, then the links.
# Exit 77 when a setup step is refused (the machine's policy, a skip); anything else that fails is a failure.
IN_USER_NAMESPACE = r"""
ip="$1" python="$2" ethtool="$3" inside="$4"
refused() { echo "$1: $2" >&2; exit 77; }
out=$("$ip" link add va numrxqueues 4 numtxqueues 4 type veth peer name vb numrxqueues 4 numtxqueues 4 2>&1) \
    || refused "creating a veth pair in a user namespace" "$out"
"$ip" link set va up && "$ip" link set vb up || exit 1
# ip netns exec does the same: /sys shows the network namespace of whoever mounted it.
out=$(mount -t sysfs sysfs /sys 2>&1) || refused "mounting this namespace's sysfs" "$out"
"$python" -c "$inside" "$ethtool" || exit 1
"$ip" -j link show
"""


def _run(*command, check=True):
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@pytest.fixture(scope="module")
def namespace():
    """A named network namespace with the veth pair; root only."""
    ip = require_tool("ip", "iproute2")
    require_tool("ethtool", "ethtool")
    name = f"mfu-ethtool-test-{os.getpid()}"
    created = _run(ip, "netns", "add", name, check=False)
    if created.returncode != 0:
        if any(word in created.stderr for word in PERMISSION_WORDS):
            pytest.skip(f"this machine forbids creating network namespaces: {created.stderr.strip()}")
        raise AssertionError(f"ip netns add {name} failed: {created.stderr.strip()}")
    try:
        pair = _run(
            ip,
            "-n",
            name,
            "link",
            "add",
            "va",
            "numrxqueues",
            "4",
            "numtxqueues",
            "4",
            "type",
            "veth",
            "peer",
            "name",
            "vb",
            "numrxqueues",
            "4",
            "numtxqueues",
            "4",
            check=False,
        )
        if pair.returncode != 0:
            if any(word in pair.stderr for word in PERMISSION_WORDS):
                pytest.skip(f"this machine forbids creating veth interfaces: {pair.stderr.strip()}")
            raise AssertionError(f"creating the veth pair failed: {pair.stderr.strip()}")
        _run(ip, "-n", name, "link", "set", "va", "up")
        _run(ip, "-n", name, "link", "set", "vb", "up")
        yield name
    finally:
        _run(ip, "netns", "del", name, check=False)


def _seen_in_named_namespace(namespace: str, ip: str, ethtool: str) -> dict:
    result = subprocess.run(
        [ip, "netns", "exec", namespace, sys.executable, "-c", INSIDE, ethtool],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPOSITORY,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    links = json.loads(_run(ip, "-n", namespace, "-j", "link", "show").stdout)
    seen["ifindex"] = {link["ifname"]: link["ifindex"] for link in links}
    return seen


def _seen_in_user_namespace(ip: str, ethtool: str) -> dict:
    unshare = require_tool("unshare", "util-linux")
    result = subprocess.run(
        [
            unshare,
            "--user",
            "--map-root-user",
            "--net",
            "--mount",
            "sh",
            "-c",
            IN_USER_NAMESPACE,
            "sh",
            ip,
            sys.executable,
            ethtool,
            INSIDE,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPOSITORY,
    )
    if result.returncode == 77:
        pytest.skip(f"not root, and this machine refuses a step in a user namespace: {result.stderr.strip()}")
    if (
        result.returncode != 0
        and result.stderr.startswith("unshare:")
        and any(word in result.stderr for word in PERMISSION_WORDS)
    ):
        pytest.skip(f"not root, and this machine forbids unprivileged user namespaces: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    inside, links = result.stdout.split("\n", 1)
    seen = json.loads(inside)
    seen["ifindex"] = {link["ifname"]: link["ifindex"] for link in json.loads(links)}
    return seen


@pytest.fixture(scope="module")
def seen(request):
    ethtool = require_tool("ethtool", "ethtool")
    ip = require_tool("ip", "iproute2")
    if os.geteuid() == 0:
        return _seen_in_named_namespace(request.getfixturevalue("namespace"), ip, ethtool)
    return _seen_in_user_namespace(ip, ethtool)


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
