"""The Kubernetes manifests as `kubectl apply -k` renders them, run as their securityContext says.

The base runs the exporter as root with every capability dropped so discovery can use the kubelet's pod-resources
socket (root, 0755) and the logs source can read the pods' logs (root, 0640); deploy/kubernetes-nonroot runs it as
65534 and loses both. Here the rendered DaemonSet's user, group and capabilities are applied to a real exporter
process (``setpriv``: that uid and gid, no groups, empty capability sets and bounding set, no_new_privs), in a mount
namespace of its own where the rendered hostPath volumes are bind-mounted read-only at the rendered mountPaths and the
root filesystem is read-only (readOnlyRootFilesystem). The kubelet is a real gRPC server on a unix socket
(mfu_exporter/sim/podresources.py, the upstream proto) and the pod's log is a root-owned 0640 CRI file of torchtitan
lines. Not reproduced: the seccomp RuntimeDefault profile (the container runtime's, not ours to load) and the NVIDIA
runtime (the GPUs are the fake NVML's, tests/support/fake_gpu_daemon).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from mfu_exporter.config import load_config
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.podresources import PodResourcesServer, SimPod
from tests.support.demo_harness import get, get_json
from tests.support.net import free_port
from tests.support.prom_harness import stop_process
from tests.support.tools import require_tool
from tests.support.unprivileged import checkout_view, python_in
from tests.support.wait import wait_until
from tests.unit.logs import framework_lines as fl

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
NONROOT = ROOT / "deploy" / "kubernetes-nonroot"
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
POD, NAMESPACE, CONTAINER, UID = "llm-master-0", "train", "trainer", "6f1c0a2e-0b1d-4c55-9a3e-2f7d1c9b8a01"


def render(directory: Path) -> dict[str, dict]:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed (not a Debian package): kustomize cannot render the manifests")
    built = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    return {d["kind"]: d for d in yaml.safe_load_all(built.stdout)}


@pytest.fixture(scope="module", params=[BASE, NONROOT], ids=["base", "nonroot"])
def rendered(request) -> tuple[str, dict[str, dict]]:
    return ("base" if request.param == BASE else "nonroot"), render(request.param)


class Daemon:
    """The rendered DaemonSet's one container: its args, config, user, capabilities and host mounts."""

    def __init__(self, objects: dict[str, dict]):
        self.pod = objects["DaemonSet"]["spec"]["template"]["spec"]
        (self.container,) = self.pod["containers"]
        self.security = {**self.pod.get("securityContext", {}), **self.container.get("securityContext", {})}
        mounts = {m["name"]: m for m in self.container["volumeMounts"]}
        self.host_mounts = {
            v["name"]: (v["hostPath"]["path"], mounts[v["name"]]) for v in self.pod["volumes"] if "hostPath" in v
        }
        (configmap,) = [v["configMap"]["name"] for v in self.pod["volumes"] if "configMap" in v]
        assert objects["ConfigMap"]["metadata"]["name"] == configmap
        self.config_text = objects["ConfigMap"]["data"]["config.yaml"]
        self.config_mount = next(m["mountPath"] for m in self.container["volumeMounts"] if m["name"] == "config")

    def mount_of(self, path: str) -> tuple[str, str]:
        """(host path, container path) of the hostPath volume the container sees ``path`` through."""
        for host, mount in self.host_mounts.values():
            inside = mount["mountPath"].rstrip("/")
            if path == inside or path.startswith(inside + "/"):
                return host, inside
        raise AssertionError(f"{path} is on no hostPath volume the DaemonSet mounts")


def test_rendered_manifests_validate_and_agree_with_their_config(rendered, tmp_path):
    name, objects = rendered
    for kind, document in objects.items():
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRDs: no schema ships with kubernetes-validate (test_deploy checks them field by field)
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {kind} against Kubernetes {version}: {exc.message} at {list(exc.absolute_path)}")
    daemon = Daemon(objects)
    security = daemon.security
    # Least privilege in both: nothing to gain, nothing to write, the runtime's seccomp profile.
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert "privileged" not in security and security["seccompProfile"] == {"type": "RuntimeDefault"}
    # Every host path read-only but the state directory: the job counters across container restarts, the config's
    # state.dir, the one place the exporter writes.
    assert all(mount.get("readOnly") is True for name, (_, mount) in daemon.host_mounts.items() if name != "state")
    host, state = daemon.host_mounts["state"]
    assert "readOnly" not in state and host == state["mountPath"] == "/var/lib/mfu-exporter"
    assert yaml.safe_load(daemon.config_text)["state"]["dir"] == state["mountPath"]
    if name == "base":
        assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (0, 0, False)
    else:
        assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (65534, 65534, True)

    # What discovery and the logs source read is where the DaemonSet mounts the host's own paths.
    path = tmp_path / "config.yaml"
    path.write_text(daemon.config_text)
    config = load_config(str(path))
    socket = config["discovery"]["kubernetes"]["socket"]
    assert config["discovery"]["kubernetes"]["enabled"] != "false"
    assert config["sources"]["logs"]["enabled"] != "false" and config["sources"]["logs"]["discovered_pods"] is True
    host, inside = daemon.mount_of(socket)
    assert (
        inside == os.path.dirname(socket) == host == "/var/lib/kubelet/pod-resources"
    )  # the directory, not the socket
    pods_root = config["sources"]["logs"]["pods_root"]
    assert daemon.mount_of(pods_root) == ("/var/log/pods", pods_root)
    assert f"--config={daemon.config_mount}/config.yaml" in daemon.container["args"]


# --- the rendered DaemonSet run as its securityContext says ----------------------------------------------------------


def pod_log(path: Path) -> None:
    """A torchtitan run's container log as the kubelet writes it (CRI lines), recent enough for the MFU window."""
    now = time.time()
    lines = [
        fl.cri(now - 60, fl.titan_logger(now - 60, fl.titan_model_size("llama3", "8B", 8_030_000_000))),
        fl.cri(now - 60, fl.titan_logger(now - 60, fl.titan_peak(989e12))),
        fl.cri(now - 60, fl.titan_logger(now - 60, "Training starts at step 1")),
    ]
    for i, step in enumerate(range(10, 110, 10)):
        at = now - 50 + 5 * i
        lines.append(fl.cri(at, fl.titan_logger(at, fl.titan_step(step, 2.4, 0.3, 61.2, 77.3, 3100, 150.0, 15.17))))
    path.parent.mkdir(parents=True)
    path.write_text("".join(line + "\n" for line in lines))
    os.chown(path, 0, 0)
    path.chmod(0o640)  # as the kubelet leaves them


@contextlib.contextmanager
def exporter_as_rendered(daemon: Daemon, host_root: Path, port: int):
    """The exporter as the DaemonSet's container: the rendered uid, gid and capabilities, the rendered hostPath
    volumes (here: directories under ``host_root``) bind-mounted read-only at their mountPaths, the root filesystem
    read-only. The config is the rendered ConfigMap's, listening on a free loopback port instead of the node's."""
    setpriv, unshare = require_tool("setpriv", "util-linux"), require_tool("unshare", "util-linux")
    config = host_root / "etc"
    config.mkdir(mode=0o755)
    (config / "config.yaml").write_text(daemon.config_text)
    # /sys is the host's own here (no bind at the DaemonSet's /host/sys): the exporter refuses a root that is absent.
    args = [a for a in daemon.container["args"] if not a.startswith(("--config=", "--path.sysfs="))]
    args += ["--path.sysfs=/sys"]
    args += [f"--config={config / 'config.yaml'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warning"]
    security = daemon.security
    assert security["capabilities"] == {"drop": ["ALL"]}  # what the setpriv flags below reproduce
    script = ["set -e"]
    for name, (host, mount) in sorted(daemon.host_mounts.items()):
        if name not in ("pod-resources", "pod-logs"):
            continue  # /sys is the host's own here too
        inside = mount["mountPath"]
        # An empty tmpfs over the mount point's nearest existing ancestor hides this machine's own files there and
        # holds the mount point, which this machine may lack (no /var/lib/kubelet off a node).
        shadow = os.path.dirname(inside)
        while not os.path.isdir(shadow):
            shadow = os.path.dirname(shadow)
        script += [
            f"mount -t tmpfs -o mode=0755 {name} {shadow}",
            f"mkdir -p {inside}",
            f"mount --bind -o ro {host_root / 'host' / host.lstrip('/')} {inside}",
        ]
    view_lines, view = checkout_view(ROOT, host_root)
    script += view_lines
    script += ["mount -o remount,bind,ro /", f"cd {view}"]
    priv = [
        setpriv,
        f"--reuid={security['runAsUser']}",
        f"--regid={security['runAsGroup']}",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs" if security["allowPrivilegeEscalation"] is False else "--",
    ]
    command = [*priv, python_in(view, ROOT), "-m", "tests.support.fake_gpu_daemon", "--", *args]
    script.append("exec " + " ".join(command))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}  # not in a cluster: no API server
    process = subprocess.Popen(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
        cwd=ROOT,
        env={**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(view)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/"

    def ready():
        if process.poll() is not None:
            raise AssertionError(f"exporter exited {process.returncode}:\n{process.stdout.read().decode()[-3000:]}")
        return get(base + "readyz") is not None

    try:
        wait_until(
            ready,
            30,
            "the exporter to be ready",
            ignore=(OSError, urllib.error.HTTPError),
        )
        yield base, process.pid
    finally:
        stop_process(process)
        if process.returncode not in (0, -15):
            raise AssertionError(f"exporter exited {process.returncode}:\n{process.stdout.read().decode()[-3000:]}")


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status of the exporter (the python under setpriv's exec)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def test_the_rendered_daemonset_reads_the_socket_and_the_root_log_as_its_security_context_says(rendered):
    if os.geteuid() != 0:
        pytest.skip("needs root (make test runs as root): host paths mounted in a mount namespace, the rendered user")
    name, objects = rendered
    daemon = Daemon(objects)
    host_root = Path(tempfile.mkdtemp(prefix="k8s-", dir="/tmp"))
    host_root.chmod(0o755)
    host = host_root / "host"
    sockets = host / "var/lib/kubelet/pod-resources"
    sockets.mkdir(parents=True)
    log = host / f"var/log/pods/{NAMESPACE}_{POD}_{UID}/{CONTAINER}/0.log"
    pod_log(log)
    uuids = [gpu.uuid for gpu in fake_nvml.node(fake_nvml.h100, count=8).gpus]  # the daemon's fake GPUs
    kubelet = PodResourcesServer(
        str(sockets / "kubelet.sock"), [SimPod(POD, NAMESPACE, {CONTAINER: [("nvidia.com/gpu", uuids[:4])]})]
    ).start()
    (sockets / "kubelet.sock").chmod(0o755)  # the kubelet's: srwxr-xr-x root
    try:
        with exporter_as_rendered(daemon, host_root, free_port()) as (base, pid):
            status = proc_status(pid)
            user, group = daemon.security["runAsUser"], daemon.security["runAsGroup"]
            assert status["Uid"].split() == [str(user)] * 4 and status["Gid"].split() == [str(group)] * 4
            assert status["Groups"].strip() == ""
            for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                assert int(status[caps], 16) == 0, (caps, status[caps])
            assert status["NoNewPrivs"].strip() == "1"

            def sources():
                return {s["source"]: s for s in get_json(base + "api/v1/status")["sources"]}

            if name == "base":
                job = wait_until(
                    lambda: next((j for j in get_json(base + "api/v1/jobs")["jobs"] if j["mfu"] is not None), None),
                    30,
                    "the pod's job with an MFU from its log",
                )
                assert job["job"] == "llm" and job["gpu_indices"] == [0, 1, 2, 3]
                assert "kubernetes" in job["found_by"] and job["step"] == 100  # found, then fed by its log
                assert job["framework_mfu"] == pytest.approx(0.1517)
                assert job["tokens_per_second"] == pytest.approx(3100 * 4, rel=0.05), job  # tps per GPU × its 4
                discovery = sources()["discovery"]
                assert discovery["up"] and discovery["status"]["kubernetes"]["pods_with_gpus"] == 1
                assert kubelet.calls >= 1
                (followed,) = wait_until(
                    lambda: sources()["logs"]["status"].get("files"), 10, "the logs status to list the pod's log"
                )
                assert followed["path"] == f"/var/log/pods/{NAMESPACE}_{POD}_{UID}/{CONTAINER}/0.log"
                assert followed["container"] == "cri" and followed["format"] == "torchtitan"
            else:
                # What the overlay says it loses: discovery is down with "permission denied", so no pod's job is
                # found and no pod log is followed; the rest of the exporter serves on.
                # Its first sample ends its "not sampled yet"; that sample finds the socket closed to it.
                discovery = wait_until(
                    lambda: (s := sources()["discovery"])["last_sample_duration_seconds"] is not None and s,
                    30,
                    "discovery's first sample",
                )
                assert not discovery["up"] and "permission denied" in json.dumps(discovery).lower(), discovery
                assert get_json(base + "api/v1/jobs")["jobs"] == []
                assert sources()["gpu"]["up"]
                assert kubelet.calls == 0  # refused at connect(): the kubelet never saw a call
    finally:
        kubelet.stop()
        shutil.rmtree(host_root, ignore_errors=True)
