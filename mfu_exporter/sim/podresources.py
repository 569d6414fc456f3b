"""A kubelet pod-resources v1 server on a unix socket, from the same generated stubs the client uses.

It is a real gRPC server (the approach of dcgm-exporter's own MockPodResourcesServer): the exporter's client dials
its socket exactly as it dials the kubelet's. Used by the tests and by ``mfu-exporter demo`` to show a job found by
discovery. The answer is swappable while serving (``set_pods``), and ``hang`` makes every call wait, as a stuck
kubelet would.
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from mfu_exporter.node.podresources import api_pb2, api_pb2_grpc


@dataclass
class SimPod:
    name: str
    namespace: str = "default"
    # container name -> [(resource name, [device IDs])]
    containers: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)


def to_proto(pods: list[SimPod]) -> api_pb2.ListPodResourcesResponse:
    response = api_pb2.ListPodResourcesResponse()
    for pod in pods:
        message = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
        for container, resources in pod.containers.items():
            c = message.containers.add(name=container)
            for resource, ids in resources:
                d = c.devices.add(resource_name=resource, device_ids=ids)
                d.topology.nodes.add(ID=0)
    return response


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: "PodResourcesServer"):
        self.owner = owner

    def _wait(self, context) -> None:
        self.owner.calls += 1
        if self.owner.hang.is_set():
            # A stuck kubelet: hold the call until the client's deadline passes (or the server stops).
            while self.owner.hang.is_set() and context.is_active():
                self.owner._stopping.wait(0.05)
                if self.owner._stopping.is_set():
                    return

    def List(self, request, context):
        self._wait(context)
        with self.owner._lock:
            return self.owner._response

    def GetAllocatableResources(self, request, context):
        self._wait(context)
        if not self.owner.allocatable:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources disabled")
        response = api_pb2.AllocatableResourcesResponse()
        for resource, ids in self.owner.allocatable:
            response.devices.add(resource_name=resource, device_ids=ids)
        return response

    # Get is left unimplemented, as on kubelets before 1.34 with the gate off: the client must never need it.


class PodResourcesServer:
    """Serve ``pods`` at ``socket`` until ``stop``; ``allocatable`` [(resource, ids)] or empty for UNIMPLEMENTED."""

    def __init__(
        self,
        socket: str,
        pods: list[SimPod] | None = None,
        allocatable: list[tuple[str, list[str]]] | None = None,
        max_send_bytes: int = 256 * 1024 * 1024,
    ):
        self.socket = socket
        self.allocatable = allocatable or []
        self.calls = 0
        self.hang = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._response = to_proto(pods or [])
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-kubelet"),
            options=[("grpc.max_send_message_length", max_send_bytes)],
        )
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), self._server)

    def set_pods(self, pods: list[SimPod]) -> None:
        response = to_proto(pods)
        with self._lock:
            self._response = response

    def set_response(self, response: api_pb2.ListPodResourcesResponse) -> None:
        with self._lock:
            self._response = response

    def start(self) -> "PodResourcesServer":
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self._server.add_insecure_port(f"unix://{os.path.abspath(self.socket)}")
        self._server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.hang.clear()
        self._server.stop(grace=None).wait(5)

    def __enter__(self) -> "PodResourcesServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
