"""The two distributions as a user gets them: built from the repository's files (wheel and sdist each), checked by
twine, the client's wheel installed into a venv that holds nothing else and imported there, and the daemon's wheel
installed beside it and run.

The daemon's dependencies come from this test's own environment (a .pth line in the new venv pointing at its
site-packages), so the install needs no index and no network; the package itself is imported from the new venv only,
which the test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from mfu_exporter import __version__

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What a fresh clone gives the build: the files the two pyproject.toml files and MANIFEST.in name, nothing generated.
SOURCES = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "mfu_exporter",
    "clients",
)
CLIENT = "mfu_exporter_client"
DAEMON = "mfu_exporter"


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def bare_env() -> dict[str, str]:
    """The environment without what would let a venv's Python import from this checkout or this test's venv."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("checkout")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
            )
        else:
            shutil.copy2(source, tree / name)
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build backend is this environment's setuptools (the test extra), so no download.
    for project in (tree / "clients" / "python", tree):
        run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(project)])
    return out


def wheel(dists: Path, name: str) -> Path:
    (found,) = dists.glob(f"{name}-{__version__}-py3-none-any.whl")
    return found


def wheel_files(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def wheel_metadata(path: Path):
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return HeaderParser().parsestr(archive.read(name).decode())


def test_both_distributions_build_and_pass_twine_check(dists):
    names = sorted(p.name for p in dists.iterdir())
    assert names == sorted(
        [f"{CLIENT}-{__version__}.tar.gz", f"{CLIENT}-{__version__}-py3-none-any.whl"]
        + [f"{DAEMON}-{__version__}.tar.gz", f"{DAEMON}-{__version__}-py3-none-any.whl"]
    )
    checked = run([sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dists.iterdir()))])
    assert checked.stdout.count("PASSED") == 4, checked.stdout


def test_the_wheels_split_the_package_without_a_file_in_both(dists):
    client, daemon = wheel_files(wheel(dists, CLIENT)), wheel_files(wheel(dists, DAEMON))
    assert client == {f"mfu_exporter/{m}.py" for m in ("__init__", "client", "client_http", "jobname")}
    assert not client & daemon
    # Together they are the whole package: every module and static file of the checkout.
    tree = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "mfu_exporter").rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (path.suffix in (".py", ".pyi") or "static" in path.parts)
    }
    assert tree == client | daemon
    requires = wheel_metadata(wheel(dists, DAEMON)).get_all("Requires-Dist")
    assert f"mfu-exporter-client=={__version__}" in requires
    assert wheel_metadata(wheel(dists, CLIENT)).get_all("Requires-Dist") is None  # no dependency at all
    for name in (CLIENT, DAEMON):
        metadata = wheel_metadata(wheel(dists, name))
        assert metadata["License-Expression"] == "Apache-2.0" and metadata["Version"] == __version__


def test_the_client_wheel_imports_in_a_venv_with_nothing_else(dists, tmp_path):
    venv = tmp_path / "client-venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # This environment's pip installs into the venv, so the venv holds the client and nothing else, not even pip.
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "-q"]
    run([*pip, str(wheel(dists, CLIENT))], env=bare_env())
    probe = """
import importlib.metadata, json, sys
import mfu_exporter.client
from mfu_exporter.client import ProgressReporter
reporter = ProgressReporter("http://127.0.0.1:9", "probe", announce=False, heartbeat=None)
reporter.update(tokens_total=1)
reporter.close(timeout=0.1)
print(json.dumps({
    "file": mfu_exporter.client.__file__,
    "outside_stdlib": sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - {"__main__"}),
    "distributions": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()),
}))
"""
    # -I: no PYTHONPATH, no user site, no current directory on the path.
    done = run([str(python), "-I", "-c", probe], cwd=tmp_path, env=bare_env())
    found = json.loads(done.stdout)
    assert Path(found["file"]).is_relative_to(venv)
    assert found["outside_stdlib"] == ["mfu_exporter"]
    assert found["distributions"] == ["mfu-exporter-client"]


def test_the_daemon_wheel_installs_beside_the_client_and_runs(dists, tmp_path):
    venv = tmp_path / "daemon-venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(
        run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    # The daemon's dependencies from this environment: its site-packages appended to the venv's path (a plain path
    # line, so that directory's own .pth files, this checkout's editable install among them, are not run).
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "dependencies.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))
    wheels = [str(wheel(dists, CLIENT)), str(wheel(dists, DAEMON))]
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "-q", *wheels], env=bare_env())
    version = run([str(venv / "bin" / "mfu-exporter"), "--version"], cwd=tmp_path, env=bare_env())
    assert version.stdout.strip() == f"mfu-exporter {__version__}"
    probe = "import json, mfu_exporter, mfu_exporter.client, mfu_exporter.web.app, mfu_exporter.cli.demo as d; " + (
        "print(json.dumps([mfu_exporter.__file__, mfu_exporter.client.__file__, d.__file__]))"
    )
    files = json.loads(run([str(python), "-I", "-c", probe], cwd=tmp_path, env=bare_env()).stdout)
    assert all(Path(f).is_relative_to(site / "mfu_exporter") for f in files), files
