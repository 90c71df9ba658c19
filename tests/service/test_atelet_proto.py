"""atelet's support service .proto: its checked-in stubs are current, and docs/worker-api.md's
tables ("Registering with atelet") are its descriptor, so any drift from upstream's wire is seen."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import worker_proto
from substrate_gpu.service.atelet import atelet_pb2

from .test_worker_proto import _doc_rows

REPO = Path(__file__).resolve().parents[2]
STUBS = ("atelet_pb2.py", "atelet_pb2.pyi", "atelet_pb2_grpc.py")
PACKAGE = Path("substrate_gpu/service/atelet")


def test_the_checked_in_stubs_are_what_the_proto_generates(tmp_path: Path) -> None:
    """scripts/gen-worker-stubs.sh, run now, writes the checked-in atelet stubs byte for byte."""
    subprocess.run(
        [str(REPO / "scripts" / "gen-worker-stubs.sh"), str(tmp_path)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=120,
    )
    for name in STUBS:
        fresh = (tmp_path / PACKAGE / name).read_bytes()
        assert fresh == (REPO / PACKAGE / name).read_bytes(), (
            f"{PACKAGE / name} is stale: run scripts/gen-worker-stubs.sh"
        )


@pytest.mark.parametrize(
    ("header", "rows"),
    [
        pytest.param(
            "| atelet method | request | response |",
            functools.partial(worker_proto.method_rows, atelet_pb2.DESCRIPTOR, "WorkerSupport"),
            id="methods",
        ),
        pytest.param(
            "| atelet message | field | number | type |",
            functools.partial(worker_proto.field_rows, atelet_pb2.DESCRIPTOR),
            id="fields",
        ),
    ],
)
def test_the_docs_table_is_the_descriptor(header: str, rows: object) -> None:
    """Every method and field, in order, as docs/worker-api.md lists them."""
    assert callable(rows)
    assert _doc_rows(header) == rows()


def test_the_wire_names_are_upstreams() -> None:
    """The package and service are ``atelet.WorkerSupport``, with no enums to drift."""
    assert atelet_pb2.DESCRIPTOR.package == "atelet"
    service = atelet_pb2.DESCRIPTOR.services_by_name["WorkerSupport"]
    assert service.full_name == "atelet.WorkerSupport"
    assert worker_proto.enum_rows(atelet_pb2.DESCRIPTOR) == []
