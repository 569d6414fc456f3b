"""The pods' labels from the Kubernetes API server: one GET per new pod, cached, never on the sampling path.

``GET /api/v1/namespaces/<namespace>/pods/<name>`` with the pod's service-account token (in-cluster: the token and
CA that the kubelet projects into /var/run/secrets/kubernetes.io/serviceaccount/); the RBAC rule is ``get`` on
``pods`` (deploy/kubernetes/rbac.yaml). The answer gives the labels that name the job, the phase (a pod-resources
List still lists pods that have finished, kubernetes/kubernetes #119423) and the controlling owner.

Lookups run on a small pool of background threads: ``lookup`` answers at once from the cache, or says the answer
is pending, so a slow or hanging API server costs the discovery source nothing but the wait for its own timeout.
A 403 (no RBAC) holds back every lookup for ``retry_after`` seconds, since it would refuse every pod alike.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import quote

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TOKEN_PATH = f"{SERVICE_ACCOUNT_DIR}/token"
DEFAULT_CA_PATH = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # a pod object is a few KiB; more is not a pod


def in_cluster_url(environ: dict[str, str] | None = None) -> str | None:
    """The API server's URL from the service environment every pod gets, or None outside a cluster."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return f"https://{host}:{port}"


@dataclass(frozen=True)
class PodMeta:
    namespace: str
    name: str
    uid: str
    phase: str
    labels: dict[str, str] = field(default_factory=dict)
    owner_kind: str | None = None
    owner_name: str | None = None

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class LookupFailed:
    """Why a pod's labels are unknown: ``forbidden`` (403), ``not_found`` (404), ``timeout``, ``tls``,
    ``unreachable``, ``http_<status>``, ``malformed``, ``no_token``."""

    reason: str
    detail: str


PENDING = object()


def parse_pod(body: Any, namespace: str, name: str) -> PodMeta:
    """The fields used from a Pod object; ValueError when the body is not one."""
    if not isinstance(body, dict) or body.get("kind", "Pod") != "Pod" or not isinstance(body.get("metadata"), dict):
        raise ValueError("the answer is not a Pod object")
    meta = body["metadata"]
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValueError("metadata.labels is not a map of strings")
    owner_kind = owner_name = None
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            owner_kind, owner_name = str(ref.get("kind", "")), str(ref.get("name", ""))
            break
    status = body["status"] if isinstance(body.get("status"), dict) else {}
    return PodMeta(
        namespace, name, str(meta.get("uid", "")), str(status.get("phase", "")), dict(labels), owner_kind, owner_name
    )


class PodLookup:
    """Pod GETs against one API server, answered from a bounded cache of pods seen."""

    def __init__(
        self,
        url: str,
        token_path: str = DEFAULT_TOKEN_PATH,
        ca_path: str | None = DEFAULT_CA_PATH,
        timeout: float = 2.0,
        retry_after: float = 300.0,
        max_cached: int = 4096,
        workers: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = url.rstrip("/")
        self.token_path = token_path
        self.ca_path = ca_path
        self.timeout = timeout
        self.retry_after = retry_after
        self.max_cached = max_cached
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], PodMeta | LookupFailed] = OrderedDict()
        self._inflight: set[tuple[str, str]] = set()
        self._blocked_until = 0.0
        self.last_failure: LookupFailed | None = None
        self.requests = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kubeapi")
        # requests (with urllib3) is some 6 MB resident: imported where the API server is used, not by every node.
        import requests

        self._session = requests.Session()

    def lookup(self, namespace: str, name: str) -> PodMeta | LookupFailed | object:
        """The cached answer for this pod, or PENDING after starting a GET for it in the background."""
        key = (namespace, name)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            if key in self._inflight:
                return PENDING
            if self._clock() < self._blocked_until and self.last_failure is not None:
                # No RBAC yet: each pod gets the same refusal without a request, and is tried again once later.
                return self.last_failure
            self._inflight.add(key)
        try:
            self._pool.submit(self._fetch, key)
        except RuntimeError:  # the pool is shut down (exporter stopping)
            with self._lock:
                self._inflight.discard(key)
            return LookupFailed("closed", "the lookup pool is shut down")
        return PENDING

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop answers for pods no longer listed, so a pod recreated under the same name is looked up again."""
        with self._lock:
            for key in [k for k in self._cache if k not in keep]:
                del self._cache[key]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._session.close()

    def _fetch(self, key: tuple[str, str]) -> None:
        result = self._get(*key)
        with self._lock:
            self._inflight.discard(key)
            self._cache[key] = result
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
            if isinstance(result, LookupFailed):
                self.last_failure = result
                if result.reason in ("forbidden", "no_token", "unauthorized"):
                    self._blocked_until = self._clock() + self.retry_after

    def _get(self, namespace: str, name: str) -> PodMeta | LookupFailed:
        import requests

        try:
            # Read each time: projected service-account tokens are rotated by the kubelet (hourly by default).
            with open(self.token_path, encoding="utf-8") as file:
                token = file.read().strip()
        except OSError as error:
            return LookupFailed("no_token", f"{self.token_path}: {error.strerror or error}")
        url = f"{self.url}/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
        self.requests += 1
        try:
            with self._session.get(
                url,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                verify=self.ca_path if self.ca_path else True,
                timeout=self.timeout,
                stream=True,
                allow_redirects=False,
            ) as answer:
                if answer.status_code == 403:
                    return LookupFailed(
                        "forbidden",
                        f"403 for pod {namespace}/{name}: the service account may not "
                        "get pods (deploy/kubernetes/rbac.yaml)",
                    )
                if answer.status_code == 401:
                    return LookupFailed("unauthorized", "401: the API server refused the service-account token")
                if answer.status_code == 404:
                    return LookupFailed("not_found", f"pod {namespace}/{name} is gone")
                if answer.status_code != 200:
                    return LookupFailed(
                        f"http_{answer.status_code}", f"pod {namespace}/{name}: HTTP {answer.status_code}"
                    )
                raw = answer.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
        except requests.exceptions.SSLError as error:
            return LookupFailed("tls", str(error)[:300])
        except requests.exceptions.Timeout:
            return LookupFailed("timeout", f"no answer within {self.timeout:g}s")
        except (requests.exceptions.RequestException, OSError) as error:
            return LookupFailed("unreachable", str(error)[:300])
        if len(raw) > MAX_ANSWER_BYTES:
            return LookupFailed("malformed", f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
        try:
            return parse_pod(json.loads(raw), namespace, name)
        except ValueError as error:
            return LookupFailed("malformed", str(error)[:300])
