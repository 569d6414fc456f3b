import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_daemon_runs_without_config_and_stops_cleanly_on_sigterm(tmp_path):
    port = free_port()
    env = {**os.environ, "MFU_EXPORTER_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}", "MFU_EXPORTER_PATH_SYSFS": str(tmp_path)}
    process = subprocess.Popen([sys.executable, "-m", "exporter"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, process.stdout.read1().decode() if process.poll() is not None else "not ready"
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert "mfu_exporter_build_info" in body
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
    finally:
        if process.poll() is None:
            process.kill()


def test_help_documents_every_env_var():
    result = subprocess.run([sys.executable, "-m", "exporter", "run", "--help"], capture_output=True, text=True, timeout=30)
    for env in ("MFU_EXPORTER_CONFIG", "MFU_EXPORTER_WEB_LISTEN_ADDRESS", "MFU_EXPORTER_PATH_SYSFS", "MFU_EXPORTER_LOG_LEVEL"):
        assert env in result.stdout
