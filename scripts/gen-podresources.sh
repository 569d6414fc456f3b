#!/bin/sh
# Regenerate mfu_exporter/node/podresources/api_pb2.py, api_pb2.pyi and api_pb2_grpc.py from the vendored upstream
# api.proto (kubernetes/kubelet pkg/apis/podresources/v1, tag kubernetes-1.36.3, commit bbb4f8f0907a).
#
# The stubs are committed, so users need grpcio and protobuf only; grpcio-tools is pinned here so a regeneration
# gives byte-identical files. The generated code checks its runtime at import: api_pb2_grpc.py needs
# grpcio >= GRPCIO_TOOLS_VERSION and api_pb2.py the protobuf it was generated for (pyproject pins both floors).
#
#   scripts/gen-podresources.sh            # regenerate into the tree
#   scripts/gen-podresources.sh --check    # exit 1 when the committed stubs differ from a fresh generation
set -eu

GRPCIO_TOOLS_VERSION=1.85.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-"$ROOT/.venv/bin/python"}
PROTO=mfu_exporter/node/podresources/api.proto

have=$("$PY" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)
if [ "$have" != "$GRPCIO_TOOLS_VERSION" ]; then
    echo "gen-podresources: need grpcio-tools==$GRPCIO_TOOLS_VERSION in $PY (have: ${have:-none});" \
         "run: $PY -m pip install grpcio-tools==$GRPCIO_TOOLS_VERSION" >&2
    exit 2
fi

out=$ROOT
if [ "${1:-}" = "--check" ]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    mkdir -p "$out/mfu_exporter/node/podresources"
fi

# -I is the repository root, so the generated api_pb2_grpc.py imports "from mfu_exporter.node.podresources import
# api_pb2"; the proto's own "package v1;" is untouched, so the method paths stay /v1.PodResourcesLister/List.
cd "$ROOT"
"$PY" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "$PROTO"

if [ "${1:-}" = "--check" ]; then
    for f in api_pb2.py api_pb2.pyi api_pb2_grpc.py; do
        if ! cmp -s "$out/mfu_exporter/node/podresources/$f" "mfu_exporter/node/podresources/$f"; then
            echo "gen-podresources: mfu_exporter/node/podresources/$f differs from a fresh generation" >&2
            exit 1
        fi
    done
fi
