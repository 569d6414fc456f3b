"""The pod-resources client against a real gRPC server on a unix socket (the generated PodResourcesLister stubs)."""

import os
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from mfu_exporter.node.podresources import PodResourcesClient, PodResourcesError, api_pb2
from mfu_exporter.sim.podresources import PodResourcesServer, SimPod

UUID0 = "GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5"
UUID1 = "GPU-0d9a7e51-4b0c-4a43-9a61-2b1f3c4d5e6f"
MIG = "MIG-5f6a2a4e-8b9c-4d1e-a2b3-c4d5e6f7a8b9"


@pytest.fixture
def sock(tmp_path):
    # A unix socket path must stay under ~107 bytes; pytest's tmp_path can be longer.
    path = f"/tmp/podres-{os.getpid()}-{time.monotonic_ns()}.sock"
    yield path
    if os.path.exists(path):
        os.unlink(path)


def pods():
    return [
        SimPod("llama-worker-0", "train", {"pytorch": [("nvidia.com/gpu", [UUID0, UUID1])]}),
        SimPod("mig-pod", "infer", {"main": [("nvidia.com/mig-1g.10gb", [MIG])]}),
        SimPod("nic-only", "net", {"app": [("rdma/hca", ["mlx5_0"]), ("cpu", [])]}),
        SimPod("no-devices", "default", {"app": []}),
    ]


def test_list_over_a_unix_socket_returns_dataclasses(sock):
    with PodResourcesServer(sock, pods(), allocatable=[("nvidia.com/gpu", [UUID0, UUID1])]):
        client = PodResourcesClient(sock, timeout=2)
        listed = client.list()
        assert [(p.namespace, p.name) for p in listed] == [
            ("train", "llama-worker-0"),
            ("infer", "mig-pod"),
            ("net", "nic-only"),
            ("default", "no-devices"),
        ]
        assert listed[0].device_ids() == [("pytorch", "nvidia.com/gpu", UUID0), ("pytorch", "nvidia.com/gpu", UUID1)]
        assert listed[0].containers[0].devices[0].numa_nodes == (0,)
        assert listed[1].containers[0].devices[0].resource_name == "nvidia.com/mig-1g.10gb"
        assert listed[3].device_ids() == []
        allocatable = client.allocatable()
        assert [d.device_ids for d in allocatable] == [(UUID0, UUID1)]
        assert client.allocatable_supported is True
        client.close()


def test_allocatable_unimplemented_is_none_and_not_asked_again(sock):
    with PodResourcesServer(sock, pods()) as server:
        client = PodResourcesClient(sock, timeout=2)
        assert client.allocatable() is None
        calls = server.calls
        assert client.allocatable() is None
        assert server.calls == calls  # remembered: an old kubelet is not asked every cycle
        assert len(client.list()) == 4  # the channel still works after the UNIMPLEMENTED answer


def test_missing_socket(sock):
    client = PodResourcesClient(sock, timeout=1)
    with pytest.raises(PodResourcesError) as caught:
        client.list()
    assert caught.value.reason == "socket_missing"
    assert sock in caught.value.detail


def test_a_plain_file_is_not_a_socket(tmp_path):
    path = tmp_path / "kubelet.sock"
    path.write_text("not a socket")
    with pytest.raises(PodResourcesError) as caught:
        PodResourcesClient(str(path), timeout=1).list()
    assert caught.value.reason == "socket_missing"


def test_hanging_server_times_out(sock):
    with PodResourcesServer(sock, pods()) as server:
        server.hang.set()
        client = PodResourcesClient(sock, timeout=0.3)
        started = time.monotonic()
        with pytest.raises(PodResourcesError) as caught:
            client.list()
        assert caught.value.reason == "timeout"
        assert time.monotonic() - started < 3
        server.hang.clear()
        assert len(client.list()) == 4  # reconnects and works once the kubelet answers again


def _raw_unix_server(path, behaviour):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    stop = threading.Event()
    held = []

    def serve():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            behaviour(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close():
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()

    return close


def test_a_socket_that_speaks_http_is_reported(sock):
    def speak_http(conn):
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        conn.close()

    close = _raw_unix_server(sock, speak_http)
    try:
        with pytest.raises(PodResourcesError) as caught:
            PodResourcesClient(sock, timeout=1).list()
        assert caught.value.reason in ("unavailable", "malformed", "rpc_error")
    finally:
        close()


def test_a_socket_that_accepts_and_never_answers_times_out(sock):
    close = _raw_unix_server(sock, lambda conn: None)  # keeps the connection open, says nothing
    try:
        started = time.monotonic()
        with pytest.raises(PodResourcesError) as caught:
            PodResourcesClient(sock, timeout=0.5).list()
        assert caught.value.reason in ("timeout", "unavailable")
        assert time.monotonic() - started < 5
    finally:
        close()


def test_malformed_proto_answer(sock):
    # A server whose List answers bytes that are no ListPodResourcesResponse: field 1 claims 2 GiB of payload.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                lambda request, context: b"\x0a\xff\xff\xff\xff\x07\x01",
                request_deserializer=None,
                response_serializer=None,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        with pytest.raises(PodResourcesError) as caught:
            PodResourcesClient(sock, timeout=2).list()
        assert caught.value.reason == "malformed"
    finally:
        server.stop(None)


def test_ten_thousand_pods_above_the_4_mib_default(sock):
    many = [
        SimPod(
            f"job-{i:05d}-worker-{i % 8}",
            f"team-{i % 50}",
            {
                "trainer": [("nvidia.com/gpu", [f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for _ in range(4)])],
                "sidecar": [("example.com/padding", ["x" * 200])],
            },
        )
        for i in range(10_000)
    ]
    with PodResourcesServer(sock, many) as server:
        size = server._response.ByteSize()
        assert size > 4 * 1024 * 1024  # the answer busy nodes give, over gRPC's default receive limit
        listed = PodResourcesClient(sock, timeout=20).list()
        assert len(listed) == 10_000
        assert listed[9999].name == "job-09999-worker-7"
        small = PodResourcesClient(sock, timeout=20, max_message_bytes=4 * 1024 * 1024)
        with pytest.raises(PodResourcesError) as caught:
            small.list()
        assert caught.value.reason == "too_large"


def test_kubelet_restart_replaces_the_socket(sock):
    with PodResourcesServer(sock, pods()):
        client = PodResourcesClient(sock, timeout=1)
        assert len(client.list()) == 4
    with pytest.raises(PodResourcesError):
        client.list()
    with PodResourcesServer(sock, pods()[:1]):  # a new kubelet, a new socket inode at the same path
        assert len(client.list()) == 1


def test_method_paths_are_the_kubelets():
    # The proto keeps "package v1": the kubelet serves /v1.PodResourcesLister/List.
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
