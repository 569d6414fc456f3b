"""The kubelet pod-resources API v1 over its unix socket: which pod holds which device on this node.

Only ``List`` and, where the kubelet has it, ``GetAllocatableResources`` are called. ``Get`` is never needed: it is
on by default only from Kubernetes 1.34 (feature gate ``KubeletPodResourcesGet``), while ``List`` is GA since 1.28
and on by default since 1.15.

The stubs (``api_pb2*.py``) are generated from the vendored upstream ``api.proto`` by ``scripts/gen-podresources.sh``;
the proto keeps its ``package v1``, so the method paths are ``/v1.PodResourcesLister/List`` as the kubelet serves them.

Blocking by design: the discovery source calls this from its sampling worker thread, and every call has a deadline,
so a kubelet that accepts the connection and never answers costs one timeout, not a hung thread.
"""

from __future__ import annotations

import builtins
import os
import stat
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # grpc and protobuf are some 15 MB resident: imported by the first call, so a node that does not discover
    # Kubernetes pods never loads them.
    import grpc

    from mfu_exporter.node.podresources import api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# gRPC's default receive limit is 4 MiB; busy nodes exceed it (dcgm-exporter #509: "received message larger than
# max (4753177 vs. 4194304)"). 10,000 pods with a few devices each is about 2 MiB, so 64 MiB leaves room for
# pods listing many CPUs and memory blocks while still bounding what one answer may allocate.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_TIMEOUT = 5.0


class PodResourcesError(Exception):
    """One failed call; ``reason`` is a short machine word for ``mfu_exporter_source_errors_total``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Devices:
    """One resource of one container: ``nvidia.com/gpu`` with its device IDs as the device plugin names them."""

    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Container:
    name: str
    devices: tuple[Devices, ...]


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    containers: tuple[Container, ...]

    def device_ids(self) -> list[tuple[str, str, str]]:
        """(container, resource name, device ID) of every device the pod holds."""
        return [(c.name, d.resource_name, i) for c in self.containers for d in c.devices for i in d.device_ids]


def _devices(message: Any) -> Devices:
    numa = tuple(n.ID for n in message.topology.nodes) if message.HasField("topology") else ()
    return Devices(message.resource_name, tuple(message.device_ids), numa)


def _code(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


class PodResourcesClient:
    """A channel to the kubelet's pod-resources socket, opened lazily and reopened after a failure.

    A kubelet restart replaces the socket (a new inode), which is why the DaemonSet mounts the socket's directory
    and not the socket itself; a call that fails closes the channel, so the next one dials the new socket.
    """

    def __init__(
        self,
        socket: str = DEFAULT_SOCKET,
        timeout: float = DEFAULT_TIMEOUT,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self.socket = socket
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None
        # None until known; False once the kubelet answered UNIMPLEMENTED (older than 1.21 or gate off).
        self.allocatable_supported: bool | None = None

    def socket_exists(self) -> bool:
        try:
            return stat.S_ISSOCK(os.stat(self.socket).st_mode)
        except OSError:
            return False

    def _connect(self) -> api_pb2_grpc.PodResourcesListerStub:
        import grpc

        from mfu_exporter.node.podresources import api_pb2_grpc

        if self._stub is None:
            if not self.socket_exists():
                raise PodResourcesError("socket_missing", f"no unix socket at {self.socket}")
            options = [
                ("grpc.max_receive_message_length", self.max_message_bytes),
                # One kubelet, no load balancing: no need for gRPC's retry or DNS machinery.
                ("grpc.enable_retries", 0),
            ]
            self._channel = grpc.insecure_channel(f"unix://{os.path.abspath(self.socket)}", options=options)
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def _call(self, method: str, request: Any) -> Any:
        import grpc

        with self._lock:
            stub = self._connect()
            try:
                return getattr(stub, method)(request, timeout=self.timeout)
            except grpc.RpcError as error:
                self._close()
                raise self._translate(error, method) from None
            except Exception as error:  # noqa: BLE001 - a decode failure inside grpc surfaces as anything
                self._close()
                raise PodResourcesError("malformed", f"{method}: {type(error).__name__}: {error}") from None

    def _translate(self, error: grpc.RpcError, method: str) -> PodResourcesError:
        import grpc

        code = _code(error)
        details = (error.details() if callable(getattr(error, "details", None)) else None) or str(error)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PodResourcesError("timeout", f"{method} gave no answer within {self.timeout:g}s")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return PodResourcesError("too_large", f"{method}: {details} (limit {self.max_message_bytes} bytes)")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return PodResourcesError("unimplemented", f"{method}: the kubelet does not serve it ({details})")
        if code == grpc.StatusCode.INTERNAL:
            # A proto that does not parse (or a peer that is not a gRPC server at all) comes back INTERNAL.
            return PodResourcesError("malformed", f"{method}: {details}")
        if code == grpc.StatusCode.UNAVAILABLE:
            return PodResourcesError("unavailable", f"{method}: {details}")
        return PodResourcesError("rpc_error", f"{method}: {code.name if code else 'unknown'}: {details}")

    def list(self) -> list[Pod]:
        """Every pod the kubelet lists with its containers' devices (pods without device limits never appear)."""
        from mfu_exporter.node.podresources import api_pb2

        response = self._call("List", api_pb2.ListPodResourcesRequest())
        pods = []
        for pod in response.pod_resources:
            containers = tuple(Container(c.name, tuple(_devices(d) for d in c.devices)) for c in pod.containers)
            pods.append(Pod(pod.namespace, pod.name, containers))
        return pods

    def allocatable(self) -> builtins.list[Devices] | None:
        """The devices the kubelet can allocate on this node, or None where it lacks the call (before 1.21)."""
        if self.allocatable_supported is False:
            return None
        from mfu_exporter.node.podresources import api_pb2

        try:
            response = self._call("GetAllocatableResources", api_pb2.AllocatableResourcesRequest())
        except PodResourcesError as error:
            if error.reason == "unimplemented":
                self.allocatable_supported = False
                return None
            raise
        self.allocatable_supported = True
        return [_devices(d) for d in response.devices]
