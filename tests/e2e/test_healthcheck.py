"""``mfu-exporter healthcheck``, the image's HEALTHCHECK, against real daemons on loopback: plain HTTP, TLS and
mutual TLS, settings given as flags or env vars, read from the daemon's /proc entry as the Dockerfile does."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import trustme
import yaml

from tests.support.prom_harness import no_sources_config

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = [sys.executable, "-m", "mfu_exporter"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    server_ca, client_ca = trustme.CA(), trustme.CA()
    cert = server_ca.issue_cert("mfu-exporter.example")  # not 127.0.0.1: the probe asks liveness, not identity
    cert.cert_chain_pems[0].write_to_path(root / "server.crt")
    cert.private_key_pem.write_to_path(root / "server.key")
    client_ca.cert_pem.write_to_path(root / "client-ca.crt")
    return root


@contextmanager
def daemon(workdir: Path, web_config: str | None = None, *, via_env: bool = False):
    """``python -m mfu_exporter run`` in ``workdir`` with relative config paths; yields (pid, port)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(no_sources_config()))
    port = free_port()
    settings = {"--config": "config.yaml", "--web.listen-address": f"127.0.0.1:{port}"}
    if web_config is not None:
        (workdir / "web.yml").write_text(web_config)
        settings["--web.config.file"] = "web.yml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MFU_EXPORTER_")}
    if via_env:
        env |= {
            "MFU_EXPORTER_" + flag[2:].replace(".", "_").replace("-", "_").upper(): value
            for flag, value in settings.items()
        }
        argv = []
    else:
        argv = [part for flag, value in settings.items() for part in (flag, value)]
    log = (workdir / "daemon.log").open("w")
    process = subprocess.Popen(
        [*EXPORTER, "run", *argv],
        cwd=workdir,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (workdir / "daemon.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the daemon did not listen within 30 s"
                time.sleep(0.1)
        yield process.pid, port
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def healthcheck(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # The probe's own environment has none of the daemon's settings: with --daemon-pid they come from /proc.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MFU_EXPORTER_")} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [*EXPORTER, "healthcheck", *args], capture_output=True, text=True, timeout=30, cwd=cwd, env=env
    )


def dockerfile_healthcheck() -> list[str]:
    """The exec-form command of the Dockerfile's HEALTHCHECK."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    (command,) = re.findall(r"^HEALTHCHECK .*?CMD (\[.*\])\s*$", text, re.MULTILINE)
    return json.loads(command)


TLS = "tls_server_config: {cert_file: %s/server.crt, key_file: %s/server.key}\n"


def test_the_dockerfile_probe_speaks_https_to_a_tls_daemon_on_its_port(pki, tmp_path):
    command = dockerfile_healthcheck()
    assert command[:2] == ["mfu-exporter", "healthcheck"] and command[command.index("--daemon-pid") + 1] == "1"
    with daemon(tmp_path / "d", TLS % (pki, pki)) as (pid, port):
        # What the image ran before: plain HTTP to the port, which a TLS listener does not answer.
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=4).read()
        args = [str(pid) if arg == "1" else arg for arg in command[2:]]  # PID 1 in a container, the daemon here
        result = healthcheck(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"healthy: https://127.0.0.1:{port}/healthz answered 200 ok"


def test_settings_from_the_daemons_env_and_plain_http(tmp_path, pki):
    with daemon(tmp_path / "tls-env", TLS % (pki, pki), via_env=True) as (pid, port):
        result = healthcheck("--daemon-pid", str(pid))
        assert result.returncode == 0 and result.stdout.startswith(f"healthy: https://127.0.0.1:{port}/"), result.stdout
    with daemon(tmp_path / "plain") as (pid, port):
        result = healthcheck("--daemon-pid", str(pid))
        assert result.returncode == 0 and result.stdout.startswith(f"healthy: http://127.0.0.1:{port}/"), result.stdout
        # The same settings given to the probe itself, as a systemd or compose healthcheck would.
        result = healthcheck(
            "--config", "config.yaml", "--web.listen-address", f"127.0.0.1:{port}", cwd=tmp_path / "plain"
        )
        assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("version", ["TLS13", "TLS12"])  # TLS 1.3 refuses after the handshake, 1.2 during it
def test_a_daemon_that_requires_client_certificates_is_alive_at_the_handshake(tmp_path, pki, version):
    mtls = (
        f"tls_server_config:\n  cert_file: {pki}/server.crt\n  key_file: {pki}/server.key\n"
        f"  client_ca_file: {pki}/client-ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"
        f"  min_version: {version}\n  max_version: {version}\n"
    )
    with daemon(tmp_path / "mtls", mtls) as (pid, port):
        result = healthcheck("--daemon-pid", str(pid))
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith(
        f"healthy: https://127.0.0.1:{port}/healthz: TLS server answered and requires a client certificate"
    )


def test_unhealthy_when_nothing_answers_or_the_process_is_no_daemon(tmp_path, pki):
    with daemon(tmp_path / "gone", TLS % (pki, pki)) as (pid, port):
        pass  # stopped on leaving the block
    result = healthcheck(
        "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(tmp_path / "gone" / "web.yml")
    )
    assert (
        result.returncode == 1
        and result.stdout.strip() == f"unhealthy: https://127.0.0.1:{port}/healthz: Connection refused"
    )
    result = healthcheck("--daemon-pid", str(os.getpid()))  # pytest, not mfu-exporter
    assert result.returncode == 1 and "is not mfu-exporter" in result.stdout
    result = healthcheck("--daemon-pid", "999999999")
    assert result.returncode == 1 and "cannot read the daemon's settings from /proc/999999999" in result.stdout
