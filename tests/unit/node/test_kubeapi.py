"""Pod lookups against a loopback HTTPS server answering the API server's pod GET shape (trustme CA)."""

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme

from mfu_exporter.node.kubeapi import PENDING, LookupFailed, PodLookup, PodMeta, in_cluster_url, parse_pod

TOKEN = "test-token-not-a-credential"


def pod_body(namespace, name, labels, phase="Running"):
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "8833712d-6e69-4f5c-95f3-aebd020ce2e7",
            "labels": labels,
            "ownerReferences": [
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama", "uid": "u", "controller": True}
            ],
        },
        "spec": {"nodeName": "gpu-node-1"},
        "status": {"phase": phase},
    }


class Api:
    def __init__(self, tmp_path):
        self.ca = trustme.CA()
        cert = self.ca.issue_cert("127.0.0.1")
        self.requests = []
        self.release = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                api.requests.append((self.path, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"kind": "Status", "code": 401})
                parts = self.path.split("/")  # /api/v1/namespaces/<ns>/pods/<name>
                namespace, name = parts[4], parts[6]
                if namespace == "locked":
                    return self._send(403, {"kind": "Status", "reason": "Forbidden", "code": 403})
                if name == "gone":
                    return self._send(404, {"kind": "Status", "reason": "NotFound", "code": 404})
                if name == "slow":
                    api.release.wait(10)
                if name == "garbage":
                    return self._send(200, ["not", "a", "pod"])
                labels = {"training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica-type": "worker"}
                self._send(200, pod_body(namespace, name, labels, "Succeeded" if name == "done" else "Running"))

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # A client that gave up (the slow pod, the untrusted certificate) leaves a broken pipe: expected here.
        self.server.handle_error = lambda request, address: None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.ca_path = tmp_path / "ca.crt"
        self.ca.cert_pem.write_to_path(str(self.ca_path))
        self.token_path = tmp_path / "token"
        self.token_path.write_text(TOKEN + "\n")

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(tmp_path):
    server = Api(tmp_path)
    yield server
    server.close()


def wait_for(lookup, namespace, name, limit=5.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        result = lookup.lookup(namespace, name)
        if result is not PENDING:
            return result
        time.sleep(0.01)
    raise AssertionError("lookup stayed pending")


def make(api, **kwargs):
    return PodLookup(api.url, token_path=str(api.token_path), ca_path=str(api.ca_path), **kwargs)


def test_labels_phase_and_owner_from_one_get_cached(api):
    lookup = make(api)
    first = lookup.lookup("train", "llama-worker-0")
    assert first is PENDING  # answered at once; the GET runs in the background
    meta = wait_for(lookup, "train", "llama-worker-0")
    assert isinstance(meta, PodMeta)
    assert meta.labels["training.kubeflow.org/job-name"] == "llama"
    assert (meta.owner_kind, meta.owner_name, meta.phase, meta.finished) == ("PyTorchJob", "llama", "Running", False)
    for _ in range(5):
        assert lookup.lookup("train", "llama-worker-0") is meta
    assert api.requests == [("/api/v1/namespaces/train/pods/llama-worker-0", f"Bearer {TOKEN}")]
    lookup.close()


def test_finished_pod_is_marked(api):
    lookup = make(api)
    assert wait_for(lookup, "train", "done").finished
    lookup.close()


def test_403_holds_back_every_lookup_until_retry_after(api):
    now = [1000.0]
    lookup = make(api, retry_after=300, clock=lambda: now[0])
    failed = wait_for(lookup, "locked", "a")
    assert isinstance(failed, LookupFailed) and failed.reason == "forbidden"
    assert "rbac" in failed.detail.lower()
    before = len(api.requests)
    assert lookup.lookup("locked", "b").reason == "forbidden"  # no request: RBAC refuses every pod alike
    assert len(api.requests) == before
    now[0] += 301
    assert lookup.lookup("train", "c") is PENDING  # tried again after retry_after
    assert isinstance(wait_for(lookup, "train", "c"), PodMeta)
    lookup.close()


def test_404_is_not_found(api):
    lookup = make(api)
    assert wait_for(lookup, "train", "gone").reason == "not_found"
    lookup.close()


def test_slow_server_times_out_without_blocking_the_caller(api):
    lookup = make(api, timeout=0.3)
    # PENDING while the server still holds the GET (it answers only once released): the caller, the sampling thread,
    # never waits for the request.
    assert lookup.lookup("train", "slow") is PENDING
    assert not api.release.is_set()
    assert wait_for(lookup, "train", "slow").reason == "timeout"
    lookup.close()


def test_untrusted_certificate_is_refused(api, tmp_path):
    other = trustme.CA()
    path = tmp_path / "other-ca.crt"
    other.cert_pem.write_to_path(str(path))
    lookup = PodLookup(api.url, token_path=str(api.token_path), ca_path=str(path))
    assert wait_for(lookup, "train", "x").reason == "tls"
    lookup.close()


def test_missing_token_and_garbage(api, tmp_path):
    lookup = PodLookup(api.url, token_path=str(tmp_path / "absent"), ca_path=str(api.ca_path))
    assert wait_for(lookup, "train", "x").reason == "no_token"
    lookup.close()
    lookup = make(api)
    assert wait_for(lookup, "train", "garbage").reason == "malformed"
    lookup.close()


def test_unreachable_server(tmp_path, api):
    lookup = PodLookup("https://127.0.0.1:9", token_path=str(api.token_path), ca_path=str(api.ca_path), timeout=0.5)
    assert wait_for(lookup, "train", "x").reason == "unreachable"
    lookup.close()


def test_forget_drops_pods_no_longer_listed(api):
    lookup = make(api)
    wait_for(lookup, "train", "a")
    wait_for(lookup, "train", "b")
    lookup.forget({("train", "b")})
    assert lookup.lookup("train", "a") is PENDING
    assert isinstance(lookup.lookup("train", "b"), PodMeta)
    lookup.close()


def test_in_cluster_url_and_parse_pod():
    assert (
        in_cluster_url({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
        == "https://10.0.0.1:443"
    )
    assert in_cluster_url({"KUBERNETES_SERVICE_HOST": "fd00::1"}) == "https://[fd00::1]:443"
    assert in_cluster_url({}) is None
    with pytest.raises(ValueError):
        parse_pod({"kind": "Pod", "metadata": {"labels": {"a": 1}}}, "n", "p")
    with pytest.raises(ValueError):
        parse_pod({"kind": "Status"}, "n", "p")
