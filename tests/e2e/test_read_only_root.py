"""The daemon with TLS on a read-only root file system, as the shipped DaemonSet runs it (readOnlyRootFilesystem,
no volume for temp files): every mount remounted read-only in a private mount namespace, TMPDIR and /tmp included,
and the daemon still starts and answers over HTTPS, because the certificate and key are loaded from memory."""

from __future__ import annotations

import os
import shlex
import ssl
import subprocess
import sys
import urllib.request

import pytest
import trustme

from tests.support.net import free_port
from tests.support.tools import require_tool
from tests.support.wait import wait_until

# Every mount but the kernel's own file systems, remounted read-only in a private namespace, then the daemon.
READ_ONLY = (
    "mount --make-rprivate / && "
    "findmnt -rn -o TARGET | grep -Ev '^/(proc|sys|dev)(/|$)' | "
    'while read -r m; do mount -o remount,bind,ro "$m" 2>/dev/null || true; done && '
    "if touch /tmp/.mfu-rw-probe 2>/dev/null; then echo 'mfu-test: /tmp still writable' >&2; exit 97; fi && "
    "exec {command}"
)


def test_tls_starts_and_serves_on_a_read_only_root(tmp_path):
    unshare = require_tool("unshare", "util-linux")
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace needs root")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "server.crt")
    cert.private_key_pem.write_to_path(tmp_path / "server.key")
    web_config = tmp_path / "web.yml"
    web_config.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    port = free_port()
    command = shlex.join(
        [
            sys.executable,
            "-m",
            "mfu_exporter",
            "--web.config.file",
            str(web_config),
            "--web.listen-address",
            f"127.0.0.1:{port}",
        ]
    )
    daemon = subprocess.Popen(
        [unshare, "-m", "sh", "-c", READ_ONLY.format(command=command)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": "/tmp"},
    )
    context = ssl.create_default_context()
    ca.configure_trust(context)

    def healthy():
        if daemon.poll() is not None:
            raise AssertionError(f"the daemon exited {daemon.returncode}: {daemon.stderr.read().decode()[-2000:]}")
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=5) as response:
            return response.status == 200

    try:
        assert wait_until(healthy, 60, "the daemon's /healthz over HTTPS", ignore=(OSError,))
    finally:
        daemon.terminate()
        daemon.wait(30)
        daemon.stderr.close()
