"""The RDMA source on sysfs trees written by mfu_exporter.sim: RoCE and IB ports, missing and N/A counters, VFs,
representors, per-file errors injected into the source's ``os``, 32-bit wraps, resets and hot unplug. The wrap/reset
rules of mfu_exporter.node.counters it relies on are tested in test_counters.py."""

import errno
import os
import subprocess

import pytest

from mfu_exporter.config import validate
from mfu_exporter.node.rdma import discover_ports
from mfu_exporter.sim.mlx5 import hw_counters, port_counters
from mfu_exporter.sim.sysfs import FakeSysfs, KernfsOs
from mfu_exporter.sources import build_sources, rdma
from mfu_exporter.sources.base import Paths, SourceContext, SourceUnavailable
from mfu_exporter.sources.rdma import RdmaSource
from tests.support.expo import exposition, snapshot_samples, snapshot_value
from tests.support.nodes import representors
from tests.support.sources import Clock
from tests.support.tools import require_tool


@pytest.fixture
def sysfs(tmp_path):
    return FakeSysfs(tmp_path / "sys")


class InjectedOs:
    """``os`` as the RDMA source sees it, with errors injected per file: ``open_errors`` / ``read_errors`` map a path
    ending (``counters/symbol_error``) to the errno that opening / reading it raises."""

    def __init__(self):
        self.open_errors: dict[str, int] = {}
        self.read_errors: dict[str, int] = {}

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def _raise_for(errors, path):
        for ending, number in errors.items():
            if path.endswith("/" + ending):
                raise OSError(number, os.strerror(number), path)

    def open(self, path, flags, *mode):
        self._raise_for(self.open_errors, path)
        return os.open(path, flags, *mode)

    def pread(self, fd, length, offset):
        self._raise_for(self.read_errors, os.readlink(f"/proc/self/fd/{fd}"))
        return os.pread(fd, length, offset)


@pytest.fixture
def injected(monkeypatch):
    faulty = InjectedOs()
    monkeypatch.setattr(rdma, "os", faulty)
    return faulty


def roce_device(sysfs, device="mlx5_0", pci="0000:0c:00.0", netdev="ens1np0", numa_node=0, **counter_values):
    sysfs.add_rdma_device(device, pci, numa_node=numa_node)
    sysfs.add_rdma_port(
        device,
        1,
        netdev=netdev,
        counters=port_counters(**{k: v for k, v in counter_values.items() if k in port_counters()}),
        hw_counters=hw_counters(**{k: v for k, v in counter_values.items() if k not in port_counters()}),
    )


def ib_device(sysfs, device="mlx5_1", pci="0000:1c:00.0"):
    sysfs.add_rdma_device(device, pci, numa_node=1)
    sysfs.add_rdma_port(
        device,
        1,
        link_layer="InfiniBand",
        rate="200 Gb/sec (4X HDR)",
        counters=port_counters(port_rcv_data=18126345378, symbol_error=3),
        hw_counters={"lifespan": 10, "out_of_sequence": 2},
    )


# --- discovery -----------------------------------------------------------------------------------------------


def test_discover_ports_reads_roce_and_ib_ports_with_their_pci_function(sysfs):
    roce_device(sysfs)
    ib_device(sysfs)
    roce, ib = discover_ports(str(sysfs.root))
    assert (roce.device, roce.port, roce.link_layer, roce.netdev) == ("mlx5_0", 1, "Ethernet", "ens1np0")
    assert (roce.state, roce.physical_state, roce.active) == ("ACTIVE", "LinkUp", True)
    assert (roce.rate, roce.rate_gbps) == ("400 Gb/sec (4X NDR)", 400.0)
    assert (roce.pci_address, roce.numa_node, roce.virtual_function) == ("0000:0c:00.0", 0, False)
    assert roce.key == "mlx5_0/1"
    assert (ib.link_layer, ib.netdev, ib.rate_gbps, ib.numa_node) == ("InfiniBand", None, 200.0, 1)


def test_discover_ports_orders_devices_naturally_and_applies_the_regexes(sysfs):
    for index in (10, 2, 0):
        roce_device(sysfs, f"mlx5_{index}", f"0000:{index + 16:02x}:00.0", f"ens{index}np0")
    root = str(sysfs.root)
    assert [p.device for p in discover_ports(root)] == ["mlx5_0", "mlx5_2", "mlx5_10"]
    assert [p.device for p in discover_ports(root, [r"^mlx5_1"])] == ["mlx5_10"]
    assert [p.device for p in discover_ports(root, [".*"], [r"_2$"])] == ["mlx5_0", "mlx5_10"]
    assert discover_ports(root, []) == []


def test_host_side_virtual_functions_are_left_out_unless_asked_for(sysfs):
    roce_device(sysfs)
    sysfs.pci_function("0000:0c:00.2", physfn="0000:0c:00.0")
    roce_device(sysfs, "mlx5_4", "0000:0c:00.2", "ens1f0v0")
    root = str(sysfs.root)
    assert [p.device for p in discover_ports(root)] == ["mlx5_0"]
    vf = discover_ports(root, virtual_functions=True)[1]
    assert (vf.device, vf.virtual_function, vf.netdev) == ("mlx5_4", True, "ens1f0v0")


def test_discover_ports_tolerates_missing_files_and_unknown_numa(sysfs, tmp_path):
    sysfs.add_rdma_device("bnxt_re0", "0000:41:00.0", numa_node=None)
    path = sysfs.add_rdma_port("bnxt_re0", 1, netdev="eno1np0")
    (path / "rate").unlink()
    (path / "state").unlink()
    (port,) = discover_ports(str(sysfs.root))
    assert (port.numa_node, port.rate, port.rate_gbps, port.state, port.active) == (None, None, None, None, False)
    assert discover_ports(str(tmp_path / "nowhere")) == []


# --- sampling ------------------------------------------------------------------------------------------------


def test_sample_exports_data_in_bytes_packets_and_every_other_counter_file(sysfs):
    roce_device(
        sysfs,
        port_rcv_data=1000,
        port_xmit_data=250,
        port_rcv_packets=7,
        port_xmit_packets=9,
        symbol_error=1,
        port_xmit_wait=77,
        np_cnp_sent=5,
        rp_cnp_handled=4,
        out_of_sequence=3,
    )
    snapshot = RdmaSource(str(sysfs.root), clock=Clock()).sample()
    assert snapshot_value(snapshot, "mfu_rdma_port_data_received_bytes_total", device="mlx5_0", port="1") == 4000
    assert snapshot_value(snapshot, "mfu_rdma_port_data_transmitted_bytes_total", device="mlx5_0", port="1") == 1000
    assert snapshot_value(snapshot, "mfu_rdma_port_packets_received_total", device="mlx5_0", port="1") == 7
    assert snapshot_value(snapshot, "mfu_rdma_port_packets_transmitted_total", device="mlx5_0", port="1") == 9
    assert (
        snapshot_value(snapshot, "mfu_rdma_port_counters_total", device="mlx5_0", port="1", counter="symbol_error") == 1
    )
    assert (
        snapshot_value(snapshot, "mfu_rdma_port_counters_total", device="mlx5_0", port="1", counter="port_xmit_wait")
        == 77
    )
    assert snapshot_value(snapshot, "mfu_rdma_hw_counters_total", device="mlx5_0", port="1", counter="np_cnp_sent") == 5
    assert (
        snapshot_value(snapshot, "mfu_rdma_hw_counters_total", device="mlx5_0", port="1", counter="out_of_sequence")
        == 3
    )
    assert (
        snapshot_value(
            snapshot,
            "mfu_rdma_port_info",
            device="mlx5_0",
            port="1",
            link_layer="Ethernet",
            netdev="ens1np0",
            state="ACTIVE",
            rate="400 Gb/sec (4X NDR)",
        )
        == 1
    )
    assert snapshot_value(snapshot, "mfu_rdma_port_up", device="mlx5_0", port="1") == 1
    assert snapshot_value(snapshot, "mfu_rdma_port_rate_bytes_per_second", device="mlx5_0", port="1") == 50e9
    counters = {labels for name, labels in snapshot_samples(snapshot) if name == "mfu_rdma_port_counters_total"}
    exported = {dict(labels)["counter"] for labels in counters}
    assert not exported & {"port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets"}
    hardware = {
        dict(labels)["counter"] for name, labels in snapshot_samples(snapshot) if name == "mfu_rdma_hw_counters_total"
    }
    assert "lifespan" not in hardware and len(hardware) == len(hw_counters()) - 1
    assert snapshot.errors == {}


def test_ib_port_has_no_netdev_and_a_down_port_reports_up_0(sysfs):
    ib_device(sysfs)
    source = RdmaSource(str(sysfs.root), clock=Clock())
    first = source.sample()
    assert (
        snapshot_value(
            first,
            "mfu_rdma_port_info",
            device="mlx5_1",
            port="1",
            link_layer="InfiniBand",
            netdev="",
            state="ACTIVE",
            rate="200 Gb/sec (4X HDR)",
        )
        == 1
    )
    assert snapshot_value(first, "mfu_rdma_port_data_received_bytes_total", device="mlx5_1", port="1") == 72505381512
    sysfs.set_port_state("mlx5_1", 1, "DOWN", "Disabled")
    second = source.sample()
    assert snapshot_value(second, "mfu_rdma_port_up", device="mlx5_1", port="1") == 0
    assert second.readings.ports["mlx5_1/1"].port.state == "DOWN"
    assert second.status["ports"][0]["state"] == "DOWN"


def test_no_pma_files_are_skipped_and_counted_once(sysfs):
    sysfs.add_rdma_device("i40iw0", "0000:3d:00.0")
    counters = dict.fromkeys(["symbol_error", "link_downed", "port_rcv_errors"], "N/A (no PMA)")
    sysfs.add_rdma_port(
        "i40iw0", 1, netdev="eno3", counters={**counters, "port_rcv_data": 10}, hw_counters={"lifespan": 10}
    )
    source = RdmaSource(str(sysfs.root), clock=Clock())
    first = source.sample()
    assert first.errors == {"no_pma": 3}
    assert snapshot_value(first, "mfu_rdma_port_data_received_bytes_total", device="i40iw0", port="1") == 40
    assert (
        snapshot_value(first, "mfu_rdma_port_counters_total", device="i40iw0", port="1", counter="symbol_error") is None
    )
    assert snapshot_value(first, "mfu_rdma_port_up", device="i40iw0", port="1") == 1
    assert source.sample().errors == {}


@pytest.mark.parametrize(
    "at, number, reason",
    [
        ("read", errno.EOPNOTSUPP, "not_supported"),
        ("read", errno.EINVAL, "not_supported"),
        ("open", errno.EACCES, "unreadable"),
        ("read", errno.EACCES, "unreadable"),
        ("open", errno.ENOENT, "missing"),
    ],
)
def test_a_failing_counter_file_skips_that_file_only(sysfs, injected, at, number, reason):
    roce_device(sysfs, symbol_error=2, link_downed=1, port_rcv_data=10, np_cnp_sent=5)
    (injected.open_errors if at == "open" else injected.read_errors)["counters/symbol_error"] = number
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock)
    first = source.sample()
    assert first.errors == {reason: 1}
    port = {"device": "mlx5_0", "port": "1"}
    assert snapshot_value(first, "mfu_rdma_port_counters_total", **port, counter="symbol_error") is None
    assert snapshot_value(first, "mfu_rdma_port_counters_total", **port, counter="link_downed") == 1
    assert snapshot_value(first, "mfu_rdma_port_data_received_bytes_total", **port) == 40
    assert snapshot_value(first, "mfu_rdma_hw_counters_total", **port, counter="np_cnp_sent") == 5
    assert snapshot_value(first, "mfu_rdma_port_up", **port) == 1
    clock.now += 1
    second = source.sample()
    assert second.errors == {}  # the file is not tried again until the ports are rediscovered
    assert snapshot_value(second, "mfu_rdma_port_counters_total", **port, counter="link_downed") == 1
    injected.open_errors.clear()
    injected.read_errors.clear()
    clock.now += 30
    rediscovered = source.sample()
    assert rediscovered.errors == {}
    # A file that vanished between listing and opening is a race, tried again at the next rediscovery; one the
    # device refused stays known-bad for the life of the port.
    expected = 2 if reason == "missing" else None
    assert snapshot_value(rediscovered, "mfu_rdma_port_counters_total", **port, counter="symbol_error") == expected


def test_known_bad_files_are_counted_once_for_the_life_of_the_port(sysfs, injected):
    roce_device(sysfs, port_rcv_data=10)
    sysfs.write_counters("mlx5_0", 1, {"symbol_error": "N/A (no PMA)"})
    injected.read_errors["hw_counters/np_cnp_sent"] = errno.EOPNOTSUPP
    injected.open_errors["hw_counters/rp_cnp_handled"] = errno.EACCES
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock, rediscover_interval=30.0)
    assert source.sample().errors == {"no_pma": 1, "not_supported": 1, "unreadable": 1}
    for index in range(1, 4):
        # Each round rediscovers the ports twice: a device that appears changes the listing, then the timer.
        roce_device(sysfs, f"mlx5_{index}", f"0000:{index + 0x10:02x}:00.0", f"ens{index + 1}np0")
        sysfs.write_counters(f"mlx5_{index}", 1, {"symbol_error": "N/A (no PMA)"})
        clock.now += 1
        appeared = source.sample()
        assert f"mlx5_{index}/1" in appeared.readings.ports
        assert appeared.errors == {"no_pma": 1, "not_supported": 1, "unreadable": 1}  # the new port's, once
        clock.now += 30
        assert source.sample().errors == {}
    assert snapshot_value(appeared, "mfu_rdma_port_data_received_bytes_total", device="mlx5_0", port="1") == 40
    # Unplugged and plugged in again, the device is a new one and is asked afresh.
    sysfs.remove_rdma_device("mlx5_0")
    clock.now += 1
    assert source.sample().errors == {"port_removed": 1}
    roce_device(sysfs, port_rcv_data=10)
    sysfs.write_counters("mlx5_0", 1, {"symbol_error": "N/A (no PMA)"})
    clock.now += 1
    assert source.sample().errors == {"no_pma": 1, "not_supported": 1, "unreadable": 1}


def test_a_device_removed_and_added_back_between_samples_is_read_afresh(sysfs, monkeypatch):
    monkeypatch.setattr(rdma, "os", KernfsOs())
    roce_device(sysfs, port_rcv_data=10)
    roce_device(sysfs, "mlx5_1", "0000:1c:00.0", "ens2np0", port_rcv_data=7)
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock)
    source.sample()
    # A driver reload between two samples: the device list reads the same, but the files kept open are gone.
    sysfs.remove_rdma_device("mlx5_1")
    roce_device(sysfs, "mlx5_1", "0000:1c:00.0", "ens2np0", port_rcv_data=3)
    clock.now += 1
    gone = source.sample()
    assert gone.errors == {"port_removed": 1}
    assert list(gone.readings.ports) == ["mlx5_0/1"]
    clock.now += 1
    back = source.sample()
    assert back.errors == {}
    assert snapshot_value(back, "mfu_rdma_port_data_received_bytes_total", device="mlx5_1", port="1") == 12


def test_unparsable_value_counts_every_sample_but_keeps_the_file(sysfs):
    roce_device(sysfs)
    sysfs.write_counters("mlx5_0", 1, {"symbol_error": "garbage"})
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock)
    assert source.sample().errors == {"unparsable": 1}
    sysfs.write_counters("mlx5_0", 1, {"symbol_error": 4})
    clock.now += 1
    snapshot = source.sample()
    assert snapshot.errors == {}
    assert (
        snapshot_value(snapshot, "mfu_rdma_port_counters_total", device="mlx5_0", port="1", counter="symbol_error") == 4
    )


def test_device_without_counters_directory_still_reports_its_port(sysfs):
    sysfs.add_rdma_device("bnxt_re0", "0000:41:00.0")
    sysfs.add_rdma_port("bnxt_re0", 1, netdev="eno1np0", hw_counters={"rx_pkts": 12, "lifespan": 10})
    snapshot = RdmaSource(str(sysfs.root), clock=Clock()).sample()
    assert snapshot_value(snapshot, "mfu_rdma_port_up", device="bnxt_re0", port="1") == 1
    assert snapshot_value(snapshot, "mfu_rdma_hw_counters_total", device="bnxt_re0", port="1", counter="rx_pkts") == 12
    assert snapshot_value(snapshot, "mfu_rdma_port_data_received_bytes_total", device="bnxt_re0", port="1") is None
    assert snapshot.errors == {}


def test_vf_is_excluded_by_default_and_included_by_config(sysfs):
    roce_device(sysfs)
    sysfs.pci_function("0000:0c:00.2", physfn="0000:0c:00.0")
    roce_device(sysfs, "mlx5_4", "0000:0c:00.2", "ens1f0v0")
    paths = Paths(sysfs=str(sysfs.root))
    (default,) = [s for s in build_sources(validate({}), SourceContext(validate({}), paths)) if s.name == "rdma"]
    assert list(default.sample().readings.ports) == ["mlx5_0/1"]
    config = validate({"sources": {"rdma": {"virtual_functions": True}}})
    (with_vfs,) = [s for s in build_sources(config, SourceContext(config, paths)) if s.name == "rdma"]
    assert list(with_vfs.sample().readings.ports) == ["mlx5_0/1", "mlx5_4/1"]


def test_switchdev_representors_are_left_out_unless_asked_for(sysfs):
    representors(sysfs)
    root = str(sysfs.root)
    assert [p.netdev for p in discover_ports(root)] == ["ens1f0np0"]
    assert [p.netdev for p in discover_ports(root, representors=True)] == ["ens1f0np0", "ens1f0pf0vf0", "ens1f0pf0sf88"]
    assert list(RdmaSource(root, clock=Clock()).sample().readings.ports) == ["mlx5_0/1"]
    with_representors = RdmaSource(root, clock=Clock(), representors=True).sample()
    assert list(with_representors.readings.ports) == ["mlx5_0/1", "mlx5_0/2", "mlx5_0/3"]
    # The configured default regex cannot see them: they are ports of mlx5_0, not devices named "rep".
    (default,) = [
        s for s in build_sources(validate({}), SourceContext(validate({}), Paths(sysfs=root))) if s.name == "rdma"
    ]
    assert list(default.sample().readings.ports) == ["mlx5_0/1"]


def test_32_bit_counter_wrap_between_samples_gives_the_true_increase(sysfs):
    roce_device(sysfs, out_of_sequence=2**32 - 6, port_rcv_data=1_000_000)
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock)
    source.sample()
    sysfs.write_counters("mlx5_0", 1, {"out_of_sequence": 4}, directory="hw_counters")
    sysfs.write_counters("mlx5_0", 1, {"port_rcv_data": 1_000_000 + 2_500_000_000})
    clock.now += 2
    reading = source.sample().readings.ports["mlx5_0/1"]
    assert reading.hw_counter_changes.deltas["out_of_sequence"] == 10
    assert reading.error_deltas == {"out_of_sequence": 10}
    assert reading.receive_bytes_per_second == 5e9
    assert reading.resets == []


def test_reset_never_yields_a_negative_or_huge_rate(sysfs):
    roce_device(sysfs, port_rcv_data=10**12, out_of_sequence=3_000_000_000, np_cnp_sent=500)
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock)
    source.sample()
    # Driver reload: everything restarts near zero.
    sysfs.write_counters("mlx5_0", 1, {"port_rcv_data": 100})
    sysfs.write_counters("mlx5_0", 1, {"out_of_sequence": 1, "np_cnp_sent": 2}, directory="hw_counters")
    clock.now += 1
    reading = source.sample().readings.ports["mlx5_0/1"]
    assert reading.receive_bytes_per_second is None
    assert reading.error_deltas == {}
    assert "np_cnp_sent" not in reading.congestion_rates
    assert set(reading.resets) == {"port_rcv_data", "out_of_sequence", "np_cnp_sent"}
    assert all(delta >= 0 for delta in reading.hw_counter_changes.deltas.values())
    sysfs.write_counters("mlx5_0", 1, {"np_cnp_sent": 12}, directory="hw_counters")
    clock.now += 1
    assert source.sample().readings.ports["mlx5_0/1"].congestion_rates["np_cnp_sent"] == 10


def test_hot_unplug_drops_the_device_and_keeps_the_others(sysfs):
    roce_device(sysfs, "mlx5_0", port_rcv_data=0)
    roce_device(sysfs, "mlx5_1", "0000:1c:00.0", "ens2np0", port_rcv_data=0)
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock)
    source.sample()
    sysfs.remove_rdma_device("mlx5_1")
    sysfs.write_counters("mlx5_0", 1, {"port_rcv_data": 250})
    clock.now += 1
    snapshot = source.sample()
    assert snapshot.errors == {"port_removed": 1}
    assert list(snapshot.readings.ports) == ["mlx5_0/1"]
    assert snapshot_value(snapshot, "mfu_rdma_port_up", device="mlx5_1", port="1") is None
    assert snapshot.readings.ports["mlx5_0/1"].receive_bytes_per_second == 1000
    sysfs.remove_rdma_device("mlx5_0")
    with pytest.raises(SourceUnavailable) as raised:
        source.sample()
    assert raised.value.reason == "no_devices" and raised.value.retry_after


def test_ports_created_after_their_device_are_found_on_a_later_look(sysfs):
    roce_device(sysfs, "mlx5_0")
    sysfs.add_rdma_device("mlx5_1", "0000:1c:00.0")  # the kernel makes the device directory before its ports
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock)
    assert list(source.sample().readings.ports) == ["mlx5_0/1"]
    sysfs.add_rdma_port("mlx5_1", 1, netdev="ens2np0", counters=port_counters(), hw_counters=hw_counters())
    clock.now += 1
    assert list(source.sample().readings.ports) == ["mlx5_0/1"]  # same device listing: no walk every second
    clock.now += 30
    assert sorted(source.sample().readings.ports) == ["mlx5_0/1", "mlx5_1/1"]


def test_rediscover_interval_is_a_constructor_argument(sysfs):
    roce_device(sysfs, "mlx5_0")
    sysfs.add_rdma_device("mlx5_1", "0000:1c:00.0")
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock, rediscover_interval=1.0)
    assert list(source.sample().readings.ports) == ["mlx5_0/1"]
    sysfs.add_rdma_port("mlx5_1", 1, netdev="ens2np0", counters=port_counters(), hw_counters=hw_counters())
    clock.now += 0.5
    assert list(source.sample().readings.ports) == ["mlx5_0/1"]
    clock.now += 0.5
    assert sorted(source.sample().readings.ports) == ["mlx5_0/1", "mlx5_1/1"]


def test_no_rdma_driver_is_source_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable) as raised:
        RdmaSource(str(tmp_path)).sample()
    assert raised.value.reason == "no_devices"
    assert "does not exist" in raised.value.detail


def test_files_over_the_descriptor_budget_are_read_by_path(sysfs):
    roce_device(sysfs, symbol_error=2, np_cnp_sent=9)
    clock = Clock()
    source = RdmaSource(str(sysfs.root), clock=clock, max_open_files=3)
    source.sample()
    sysfs.write_counters("mlx5_0", 1, {"np_cnp_sent": 19}, directory="hw_counters")
    clock.now += 1
    snapshot = source.sample()
    assert (
        snapshot_value(snapshot, "mfu_rdma_port_counters_total", device="mlx5_0", port="1", counter="symbol_error") == 2
    )
    assert snapshot.readings.ports["mlx5_0/1"].congestion_rates["np_cnp_sent"] == 10
    source.close()


def test_snapshot_status_is_json_and_names_the_port(sysfs):
    import json

    roce_device(sysfs)
    status = RdmaSource(str(sysfs.root), clock=Clock()).sample().status
    port = json.loads(json.dumps(status))["ports"][0]
    assert (port["device"], port["netdev"], port["pci_address"], port["state"]) == (
        "mlx5_0",
        "ens1np0",
        "0000:0c:00.0",
        "ACTIVE",
    )


def test_metrics_pass_promtool(sysfs):
    promtool = require_tool("promtool", "prometheus")
    roce_device(sysfs, port_rcv_data=5)
    ib_device(sysfs)
    body = exposition(RdmaSource(str(sysfs.root), clock=Clock()).sample())
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
