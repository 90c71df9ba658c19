"""The worker API's .proto: its checked-in stubs are current, and docs/worker-api.md's field
table is its descriptor (names, numbers, types), so any drift from upstream's wire is seen."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service import worker_proto

REPO = Path(__file__).resolve().parents[2]
STUBS = ("ateworker_pb2.py", "ateworker_pb2.pyi", "ateworker_pb2_grpc.py")
PACKAGE = Path("substrate_gpu/service/ateworker")
DOC = REPO / "docs" / "worker-api.md"


def test_the_checked_in_stubs_are_what_the_proto_generates(tmp_path: Path) -> None:
    """scripts/gen-worker-stubs.sh, run now, writes the checked-in stubs byte for byte."""
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


def _doc_rows(header: str) -> list[tuple[str, ...]]:
    """The rows of the docs table whose header line is ``header`` (backticks dropped)."""
    lines = DOC.read_text().splitlines()
    start = lines.index(header) + 2  # the header, then the |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        rows.append(tuple(re.sub(r"\s+", " ", c) for c in cells))
    return rows


@pytest.mark.parametrize(
    ("header", "rows"),
    [
        pytest.param("| method | request | response |", worker_proto.method_rows, id="methods"),
        pytest.param("| message | field | number | type |", worker_proto.field_rows, id="fields"),
        pytest.param("| enum | value | number |", worker_proto.enum_rows, id="enums"),
    ],
)
def test_the_docs_table_is_the_descriptor(header: str, rows: object) -> None:
    """Every method, field and enum value, in order, as docs/worker-api.md lists them."""
    assert callable(rows)
    assert _doc_rows(header) == rows()


def test_the_wire_names_are_upstreams() -> None:
    """The package and service are ``ateworker.Worker``: the method paths atelet calls."""
    from substrate_gpu.service.ateworker import ateworker_pb2

    assert ateworker_pb2.DESCRIPTOR.package == "ateworker"
    service = ateworker_pb2.DESCRIPTOR.services_by_name["Worker"]
    assert service.full_name == "ateworker.Worker"
