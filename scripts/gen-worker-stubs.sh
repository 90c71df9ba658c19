#!/bin/sh
# Regenerate the worker's Python stubs from the .proto files beside them, with grpcio-tools'
# protoc (the version pyproject.toml's test extra pins: other versions write other bytes, and
# tests/service/test_worker_proto.py and test_atelet_proto.py check the checked-in stubs are
# exactly what this writes):
#   substrate_gpu/service/ateworker/ateworker_pb2*.py*  the worker API atelet calls
#   substrate_gpu/service/atelet/atelet_pb2*.py*        atelet's support service the worker calls
# Run from anywhere; OUT (default: the repository) is where the stubs go, under the same
# relative paths.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo}
python=${PYTHON:-python3}
cd "$repo"
mkdir -p "$out/substrate_gpu/service/ateworker" "$out/substrate_gpu/service/atelet"
# Each proto is named by its path from the repository root, so a generated _pb2_grpc imports
# `from substrate_gpu.service.ateworker import ateworker_pb2` (a package import, not a
# top-level one).
exec "$python" -m grpc_tools.protoc -I. \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    substrate_gpu/service/ateworker/ateworker.proto \
    substrate_gpu/service/atelet/atelet.proto
