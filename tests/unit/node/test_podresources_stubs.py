"""The committed pod-resources stubs are what scripts/gen-podresources.sh generates from the vendored proto."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_committed_stubs_match_a_fresh_generation():
    try:
        version = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("grpcio-tools is not installed (pip install -e '.[test]' installs the pinned one)")
    pinned = next(
        line.split("=", 1)[1]
        for line in (ROOT / "scripts/gen-podresources.sh").read_text().splitlines()
        if line.startswith("GRPCIO_TOOLS_VERSION=")
    )
    if version != pinned:
        pytest.skip(f"grpcio-tools {version} installed, the stubs are pinned to {pinned}")
    done = subprocess.run(
        ["sh", str(ROOT / "scripts/gen-podresources.sh"), "--check"],
        capture_output=True,
        text=True,
        env={"PY": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_vendored_proto_is_the_upstream_v1_api():
    proto = (ROOT / "mfu_exporter/node/podresources/api.proto").read_text()
    assert "package v1;" in proto
    assert "rpc List(ListPodResourcesRequest) returns (ListPodResourcesResponse) {}" in proto
    assert "rpc GetAllocatableResources(AllocatableResourcesRequest) returns (AllocatableResourcesResponse) {}" in proto
