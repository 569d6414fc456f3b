"""The ethtool source with the text reader: recorded-style ConnectX-7 ``ethtool -S`` output with PFC on priority 3,
then on 3 and 4, interface selection from sysfs (RDMA device filters, representors), stats_include, and every way an
interface read can fail."""

import errno
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mfu_exporter.config import typed_config, validate
from mfu_exporter.node.ethtool import EthtoolTextReader, parse_ethtool_statistics
from mfu_exporter.sim.mlx5 import SimulatedNode, ethtool_stat_names, format_ethtool_statistics
from mfu_exporter.sim.sysfs import FakeSysfs
from mfu_exporter.sources import build_sources, ethtool
from mfu_exporter.sources.base import Paths, SourceContext, SourceUnavailable
from mfu_exporter.sources.ethtool import EthtoolSource, ethtool_source
from tests.support.expo import exposition, snapshot_samples, snapshot_value
from tests.support.nodes import representors
from tests.support.sources import Clock
from tests.support.tools import require_tool

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ethtool"
PFC3 = (FIXTURES / "connectx7-pfc3.txt").read_text()
PFC3_4 = (FIXTURES / "connectx7-pfc3-4.txt").read_text()


class Texts:
    """``ethtool -S`` text per interface that a test changes between samples; an OSError stands for a failed read."""

    def __init__(self, **texts):
        self.texts = texts
        self.reads = []  # interfaces asked for, in order

    def __call__(self, interface):
        self.reads.append(interface)
        text = self.texts.get(interface)
        if text is None:
            raise OSError(errno.ENODEV, "No such device")
        if isinstance(text, OSError):
            raise text
        return text


@pytest.fixture
def sysfs(tmp_path):
    sysfs = FakeSysfs(tmp_path / "sys")
    sysfs.add_rdma_device("mlx5_0", "0000:0c:00.0")
    sysfs.add_rdma_port("mlx5_0", 1, netdev="ens1np0", counters={}, hw_counters={})
    sysfs.add_netdev("ens1np0", "0000:0c:00.0")
    return sysfs


def source_for(sysfs, texts, clock=None, **kwargs):
    return EthtoolSource(str(sysfs.root), reader=EthtoolTextReader(texts), clock=clock or Clock(), **kwargs)


# Lines as ethtool prints them and lines that only look alike: unindented, blank, spaced, odd whitespace, names with
# ": " inside, values that are not plain ASCII digits.
_LINE_PIECES = st.sampled_from(
    [
        "",
        " ",
        "\t",
        "     ",
        "\x0c",
        "\r",
        "rx_prio3_pause",
        "[0]: rx_bytes",
        "NIC statistics:",
        ": ",
        ":",
        "7",
        "12",
        "007",
        "\u0663",
        "x",
        " y",
        "18446744073709551615",
    ]
)
_TEXTS = st.lists(st.lists(_LINE_PIECES, max_size=5).map("".join), max_size=12).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(_TEXTS, min_size=1, max_size=4))
@example(["NIC statistics:\n     rx: 1\n\n     tx: 2\n", "NIC statistics:\n     rx: 1\n\ntx: 2\n"])
@example(["     a: 1\n  \nb: 2", "     a: 1\n\nb: 2", "     a: 1\nb: 2\n"])
def test_text_reader_parses_as_the_regex_does_sample_after_sample(texts):
    # The reader reuses the previous text's line parses; whatever the texts, it must read what the regex reads.
    current = {}
    reader = EthtoolTextReader(lambda interface: current["text"])
    for text in texts:
        current["text"] = text
        assert reader.read("eth0") == parse_ethtool_statistics(text)
        assert list(reader.read("eth0")) == list(parse_ethtool_statistics(text))


def test_parse_ethtool_statistics_reads_every_stat_line():
    text = (
        "NIC statistics:\n     rx_packets: 12\n     tx_prio3_pause_duration: 18446744073709551615\n"
        "     [0]: rx_ucast_packets: 7\n     not a stat line\n"
    )
    assert parse_ethtool_statistics(text) == {
        "rx_packets": 12,
        "tx_prio3_pause_duration": 2**64 - 1,
        "[0]: rx_ucast_packets": 7,
    }
    stats = parse_ethtool_statistics(PFC3)
    assert len(stats) == len(ethtool_stat_names(pfc_priorities=(3,))) == 306
    assert stats["rx_prio3_pause_duration"] == 80012345


def test_pfc_families_from_recorded_connectx_output(sysfs):
    snapshot = source_for(sysfs, Texts(ens1np0=PFC3)).sample()
    labels = {"interface": "ens1np0"}
    assert snapshot_value(snapshot, "mfu_nic_pfc_pause_frames_total", **labels, priority="3", direction="rx") == 1520433
    assert snapshot_value(snapshot, "mfu_nic_pfc_pause_frames_total", **labels, priority="3", direction="tx") == 12
    assert snapshot_value(
        snapshot, "mfu_nic_pfc_pause_duration_seconds_total", **labels, priority="3", direction="rx"
    ) == pytest.approx(80.012345)
    assert snapshot_value(snapshot, "mfu_nic_pfc_pause_transitions_total", **labels, priority="3") == 152004
    assert snapshot_value(snapshot, "mfu_nic_pause_frames_total", **labels, direction="rx") == 0
    assert snapshot_value(snapshot, "mfu_nic_pause_storm_events_total", **labels, level="warning") == 2
    assert snapshot_value(snapshot, "mfu_nic_pause_storm_events_total", **labels, level="error") == 0
    assert snapshot_value(snapshot, "mfu_nic_discards_total", **labels, counter="rx_out_of_buffer") == 4294967290
    assert snapshot_value(snapshot, "mfu_nic_discards_total", **labels, counter="rx_prio3_buf_discard") == 0
    assert snapshot_value(snapshot, "mfu_nic_ecn_marked_packets_total", **labels, priority="3") == 448131
    names = {name for name, _ in snapshot_samples(snapshot)}
    assert "mfu_nic_stat_total" not in names  # stats_include is off by default
    pfc = {
        dict(labels)["priority"] for n, labels in snapshot_samples(snapshot) if n == "mfu_nic_pfc_pause_frames_total"
    }
    assert pfc == {"3"}
    discards = {dict(labels)["counter"] for n, labels in snapshot_samples(snapshot) if n == "mfu_nic_discards_total"}
    assert {
        "rx_discards_phy",
        "tx_discards_phy",
        "rx_out_of_buffer",
        "outbound_pci_buffer_overflow",
        "rx_prio0_discards",
        "rx_prio7_cong_discard",
    } <= discards
    assert snapshot.readings.interfaces["ens1np0"].rdma_ports == ("mlx5_0/1",)
    assert snapshot.errors == {}


def test_stat_set_change_between_samples_and_the_rates_it_yields(sysfs):
    texts = Texts(ens1np0=PFC3)
    clock = Clock()
    source = source_for(sysfs, texts, clock)
    first = source.sample().readings.interfaces["ens1np0"]
    assert first.pfc_priorities == (3,) and first.pause_ratio == {}
    texts.texts["ens1np0"] = PFC3_4  # PFC enabled on priority 4 too: five more stats
    clock.now += 10
    snapshot = source.sample()
    reading = snapshot.readings.interfaces["ens1np0"]
    assert reading.pfc_priorities == (3, 4)
    assert (
        snapshot_value(snapshot, "mfu_nic_pfc_pause_frames_total", interface="ens1np0", priority="4", direction="rx")
        == 3310
    )
    # 2.5 s of rx pause in 10 s on priority 3; priority 4 only starts its baseline.
    assert reading.pause_ratio == {("rx", 3): 0.25, ("tx", 3): 0.0}
    assert reading.pause_frame_rates[("rx", 3)] == 6250
    assert ("rx", 4) not in reading.pause_frame_rates
    assert reading.storm_event_deltas == {"warning": 1, "error": 1}
    # rx_out_of_buffer is a 32-bit Q-counter: 4294967290 -> 5 is a wrap by 11, not a reset.
    assert reading.discard_deltas == {
        "rx_out_of_buffer": 11,
        "rx_discards_phy": 7,
        "rx_prio3_discards": 7,
        "rx_prio3_buf_discard": 4,
    }
    assert reading.error_deltas["tx_pause_storm_error_events"] == 1
    assert reading.ecn_marked_rates[3] == 1200
    assert reading.changes.resets == []
    texts.texts["ens1np0"] = PFC3  # a later sample, before the status page asks for this one's status
    clock.now += 10
    source.sample()
    status = snapshot.status["interfaces"][0]  # built now, on demand: still this sample's
    assert status["pause_ratio"]["rx/3"] == 0.25 and status["pfc_priorities"] == [3, 4]


def test_pause_ratio_is_capped_at_one_and_resets_give_no_rate(sysfs):
    def stats(duration, discards):
        return format_ethtool_statistics(
            {"rx_prio3_pause": 1, "rx_prio3_pause_duration": duration, "rx_discards_phy": discards}
        )

    texts = Texts(ens1np0=stats(0, 10**9))
    clock = Clock()
    source = source_for(sysfs, texts, clock)
    source.sample()
    texts.texts["ens1np0"] = stats(1_000_500, 3)  # sampled a little late: 1.0005 s of pause in 1 s; driver reload
    clock.now += 1
    reading = source.sample().readings.interfaces["ens1np0"]
    assert reading.pause_ratio == {("rx", 3): 1.0}
    assert reading.discard_deltas == {} and reading.changes.resets == ["rx_discards_phy"]


def test_interfaces_are_the_rdma_netdevs_plus_includes_minus_excludes(sysfs):
    sysfs.add_netdev("eth9", "0000:5c:00.0")
    sysfs.add_netdev("veth12ab")
    sysfs.add_netdev("lo")
    sysfs.pci_function("0000:0c:00.2", physfn="0000:0c:00.0")
    sysfs.add_rdma_device("mlx5_4", "0000:0c:00.2")
    sysfs.add_rdma_port("mlx5_4", 1, netdev="ens1f0v0")
    texts = Texts(ens1np0=PFC3, eth9=PFC3, veth12ab=PFC3, lo=PFC3, ens1f0v0=PFC3)
    defaults = validate({})["sources"]["ethtool"]
    source = source_for(sysfs, texts, interfaces_include=[".*"], interfaces_exclude=defaults["interfaces_exclude"])
    assert list(source.sample().readings.interfaces) == ["ens1np0", "eth9"]
    only_rdma = source_for(sysfs, texts, interfaces_exclude=defaults["interfaces_exclude"])
    assert list(only_rdma.sample().readings.interfaces) == ["ens1np0"]
    excluded = source_for(sysfs, texts, interfaces_include=["^eth"], interfaces_exclude=["^ens"])
    assert list(excluded.sample().readings.interfaces) == ["eth9"]


def test_stats_include_exports_selected_raw_stats(sysfs):
    snapshot = source_for(sysfs, Texts(ens1np0=PFC3), stats_include=[r"^rx_prio3_(bytes|packets)$"]).sample()
    stats = {
        dict(labels)["stat"]: v for (n, labels), v in snapshot_samples(snapshot).items() if n == "mfu_nic_stat_total"
    }
    assert set(stats) == {"rx_prio3_bytes", "rx_prio3_packets"}
    assert stats["rx_prio3_packets"] == parse_ethtool_statistics(PFC3)["rx_prio3_packets"]


def test_failed_reads_are_counted_by_reason(sysfs):
    sysfs.add_rdma_device("mlx5_1", "0000:1c:00.0")
    sysfs.add_rdma_port("mlx5_1", 1, netdev="ens2np0")
    sysfs.add_rdma_device("mlx5_2", "0000:2c:00.0")
    sysfs.add_rdma_port("mlx5_2", 1, netdev="ens3np0")
    texts = Texts(ens1np0=PFC3, ens2np0=OSError(errno.EOPNOTSUPP, "no stats"), ens3np0=OSError(errno.EIO, "I/O"))
    clock = Clock()
    source = source_for(sysfs, texts, clock)
    first = source.sample()
    assert first.errors == {"not_supported": 1, "read_failed": 1}
    assert list(first.readings.interfaces) == ["ens1np0"]
    clock.now += 1
    assert source.sample().errors == {"read_failed": 1}  # unsupported: skipped until the next discovery
    del texts.texts["ens1np0"]  # renamed or unplugged
    clock.now += 1
    texts.texts["ens3np0"] = OSError(errno.EOPNOTSUPP, "no stats")
    with pytest.raises(SourceUnavailable) as raised:
        source.sample()
    assert raised.value.reason in ("interface_missing", "not_supported")
    texts.texts["ens1np0"] = PFC3
    clock.now += 1
    assert list(source.sample().readings.interfaces) == ["ens1np0"]  # rediscovered after the missing interface


def test_an_interface_without_statistics_is_counted_once_while_it_exists(sysfs):
    sysfs.add_rdma_device("mlx5_1", "0000:1c:00.0")
    sysfs.add_rdma_port("mlx5_1", 1, netdev="ens2np0")
    texts = Texts(ens1np0=PFC3, ens2np0=OSError(errno.EOPNOTSUPP, "no stats"))
    clock = Clock()
    source = source_for(sysfs, texts, clock, rediscover_interval=1.0)
    assert source.sample().errors == {"not_supported": 1}
    for _ in range(4):  # each sample rediscovers the interfaces
        clock.now += 1
        snapshot = source.sample()
        assert snapshot.errors == {}
        assert list(snapshot.readings.interfaces) == ["ens1np0"]
    assert texts.reads.count("ens2np0") == 1
    # Unplugged and back: another interface, asked afresh.
    sysfs.remove_rdma_device("mlx5_1")
    clock.now += 1
    assert source.sample().errors == {}
    sysfs.add_rdma_device("mlx5_1", "0000:1c:00.0")
    sysfs.add_rdma_port("mlx5_1", 1, netdev="ens2np0")
    clock.now += 1
    assert source.sample().errors == {"not_supported": 1}


def test_netdevs_of_excluded_rdma_devices_are_never_read(sysfs):
    sysfs.add_rdma_device("mlx5_1", "0000:1c:00.0")
    sysfs.add_rdma_port("mlx5_1", 1, netdev="ens2np0")
    sysfs.add_netdev("ens2np0", "0000:1c:00.0", ifindex=3)
    sysfs.add_netdev("eth9", "0000:5c:00.0", ifindex=4)
    texts = Texts(ens1np0=PFC3, ens2np0=PFC3, eth9=PFC3)
    # mlx5_1 stands for a Fabric Manager limited PF, which rejects the register reads behind ethtool -S.
    source = source_for(sysfs, texts, rdma_devices_exclude=[r"^mlx5_1$"], interfaces_include=[".*"])
    snapshot = source.sample()
    assert list(snapshot.readings.interfaces) == ["ens1np0", "eth9"]
    assert "ens2np0" not in texts.reads
    only = source_for(sysfs, Texts(ens1np0=PFC3, ens2np0=PFC3), rdma_devices_include=[r"^mlx5_1$"]).sample()
    assert only.readings.interfaces["ens2np0"].rdma_ports == ("mlx5_1/1",)
    assert list(only.readings.interfaces) == ["ens2np0"]


def test_factory_takes_the_rdma_device_lists_from_the_rdma_section(sysfs, monkeypatch):
    sysfs.add_rdma_device("mlx5_1", "0000:1c:00.0")
    sysfs.add_rdma_port("mlx5_1", 1, netdev="ens2np0")
    texts = Texts(ens1np0=PFC3, ens2np0=PFC3)
    # The factory builds the ioctl reader; these interfaces exist only in the fake sysfs.
    monkeypatch.setattr(ethtool, "EthtoolIoctlReader", lambda: EthtoolTextReader(texts))
    config = validate({"sources": {"rdma": {"devices_exclude": [r"^mlx5_1$"]}}})
    source = ethtool_source(typed_config(config).sources.ethtool, SourceContext(config, Paths(sysfs=str(sysfs.root))))
    assert list(source.sample().readings.interfaces) == ["ens1np0"]
    assert texts.reads == ["ens1np0"]


def test_switchdev_representors_are_not_read_unless_asked_for(tmp_path):
    sysfs = FakeSysfs(tmp_path / "sys")
    representors(sysfs)
    # A representor with no RDMA port, which only interfaces_include could bring in.
    sysfs.add_netdev("ens1f1pf1vf2", "0000:0c:00.1", ifindex=9, phys_port_name="pf1vf2")
    texts = Texts(ens1f0np0=PFC3, ens1f0pf0vf0=PFC3, ens1f0pf0sf88=PFC3, ens1f1pf1vf2=PFC3)
    default = source_for(sysfs, texts, interfaces_include=[".*"]).sample()
    assert list(default.readings.interfaces) == ["ens1f0np0"]
    assert texts.reads == ["ens1f0np0"]
    every = source_for(sysfs, texts, interfaces_include=[".*"], representors=True).sample()
    assert list(every.readings.interfaces) == ["ens1f0np0", "ens1f0pf0vf0", "ens1f0pf0sf88", "ens1f1pf1vf2"]
    assert every.readings.interfaces["ens1f0pf0sf88"].rdma_ports == ("mlx5_0/3",)


def test_no_interfaces_is_source_unavailable(tmp_path):
    source = EthtoolSource(str(tmp_path), reader=EthtoolTextReader(Texts()), clock=Clock())
    with pytest.raises(SourceUnavailable) as raised:
        source.sample()
    assert raised.value.reason == "no_interfaces"


def test_simulated_node_read_through_text_files(tmp_path):
    node = SimulatedNode(tmp_path, nics=8)
    node.nics[2].rx_pause_ratio = 0.4
    node.nics[5].drops_per_second = 3
    clock = Clock()
    source = EthtoolSource(
        node.sysfs_root,
        stats_include=["^rx_bytes_phy$"],
        clock=clock,
        reader=EthtoolTextReader.from_directory(str(node.ethtool_directory)),
    )
    source.sample()
    node.tick(1.0)
    clock.now += 1
    snapshot = source.sample()
    interfaces = snapshot.readings.interfaces
    assert list(interfaces) == [f"ens{i}np0" for i in range(1, 9)]
    assert interfaces["ens3np0"].pause_ratio[("rx", 3)] == pytest.approx(0.4)
    assert interfaces["ens6np0"].discard_deltas == {"rx_discards_phy": 3, "rx_prio3_discards": 3}
    assert snapshot_value(snapshot, "mfu_nic_stat_total", interface="ens1np0", stat="rx_bytes_phy") == 30e9
    node.set_pfc_priorities(node.nics[0], (3, 5))
    clock.now += 1
    assert source.sample().readings.interfaces["ens1np0"].pfc_priorities == (3, 5)


def test_configured_source_reads_with_the_ioctl(tmp_path):
    sysfs = FakeSysfs(tmp_path / "sys")
    sysfs.add_netdev("lo")
    config = validate({"sources": {"ethtool": {"interfaces_include": ["^lo$"], "interfaces_exclude": []}}})
    (source,) = [
        s for s in build_sources(config, SourceContext(config, Paths(sysfs=str(sysfs.root)))) if s.name == "ethtool"
    ]
    try:
        with pytest.raises(SourceUnavailable) as raised:
            source.sample()
    finally:
        source.close()
    assert raised.value.reason == "not_supported"  # the real loopback has no ethtool statistics
    assert "lo" in raised.value.detail


def test_text_reader_from_directory_maps_a_missing_file_to_no_such_device(tmp_path):
    (tmp_path / "ens1np0").mkdir()
    (tmp_path / "ens1np0" / "statistics").write_text(PFC3)
    reader = EthtoolTextReader.from_directory(str(tmp_path))
    assert reader.read("ens1np0")["rx_prio3_pause"] == 1520433
    with pytest.raises(OSError) as raised:
        reader.read("ens2np0")
    assert raised.value.errno == errno.ENODEV


def test_metrics_pass_promtool(sysfs):
    promtool = require_tool("promtool", "prometheus")
    body = exposition(source_for(sysfs, Texts(ens1np0=PFC3_4), stats_include=["^rx_prio"]).sample())
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
