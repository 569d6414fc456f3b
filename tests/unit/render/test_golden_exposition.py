"""The golden exposition (tests/fixtures/e2e-output.txt, see tests/support/golden.py): the full node renders byte
for byte as recorded, and every family it exports is documented in docs/metrics.md with the labels it carries.

An intended change of the metrics rewrites the file: ``pytest --update-golden tests/unit/render/test_golden_exposition.py``
(``make golden``); the diff of the file is then part of the change, for review."""

import asyncio
import difflib

import pytest

from tests.support.expo import samples
from tests.support.golden import GOLDEN, render_full_node, sample_names
from tests.support.prom_harness import documented_metrics


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    text, _ = asyncio.run(render_full_node(tmp_path_factory.mktemp("full-node")))
    return text


def test_the_full_node_renders_as_the_golden_file(rendered, update_golden):
    if update_golden:
        GOLDEN.write_text(rendered)
        pytest.skip(f"rewrote {GOLDEN.name}: review its diff")
    expected = GOLDEN.read_text()
    if rendered != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), rendered.splitlines(), "tests/fixtures/e2e-output.txt", "live rendering", lineterm=""
        )
        pytest.fail("the exposition changed (intended? pytest --update-golden):\n" + "\n".join(list(diff)[:80]))


def test_the_golden_file_is_a_valid_exposition_of_the_whole_node():
    names = sample_names(GOLDEN.read_text())
    # One family of each plane and source: a golden file rendered from a half-built node would miss one.
    for name in (
        "mfu_exporter_build_info",
        "mfu_gpu_up",
        "mfu_rdma_port_up",
        "mfu_nic_pfc_pause_frames_total",
        "mfu_checkpoint_writes_total",
        "mfu_preflight_check_ok",
        "mfu_model_flops_utilization_ratio",
        "mfu_job_bottleneck",
    ):
        assert name in names, name


def test_every_exported_family_is_documented_with_its_labels():
    documented = documented_metrics()
    undocumented, unlisted_labels = set(), {}
    for name, labels in samples(GOLDEN.read_text()):
        if name not in documented:
            undocumented.add(name)
            continue
        extra = {label for label, _ in labels} - documented[name]
        if extra:
            unlisted_labels.setdefault(name, set()).update(extra)
    assert not undocumented, f"exported but not in docs/metrics.md: {sorted(undocumented)}"
    assert not unlisted_labels, f"labels docs/metrics.md does not list: {unlisted_labels}"
