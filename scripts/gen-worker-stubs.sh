#!/bin/sh
# Regenerate the worker API's Python stubs (substrate_gpu/service/ateworker/ateworker_pb2*.py*)
# from ateworker.proto beside them, with grpcio-tools' protoc (the version pyproject.toml's test
# extra pins: other versions write other bytes, and tests/service/test_worker_proto.py checks the
# checked-in stubs are exactly what this writes). Run from anywhere; OUT (default: the repository)
# is where the stubs go, under the same relative path.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo}
python=${PYTHON:-python3}
cd "$repo"
mkdir -p "$out/substrate_gpu/service/ateworker"
# The proto is named by its path from the repository root, so the generated _pb2_grpc imports
# `from substrate_gpu.service.ateworker import ateworker_pb2` (a package import, not a top-level one).
exec "$python" -m grpc_tools.protoc -I. \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    substrate_gpu/service/ateworker/ateworker.proto
