"""The checkpoint manifest: JSON round trip, atomic write beside the image, strict reading."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from substrate_gpu import preflight

MANIFEST = preflight.CheckpointManifest(
    driver_version="580.65.06", gpu_count=2, cuda_state_included=True, route="runsc-cuda-checkpoint"
)


def test_json_round_trip() -> None:
    """to_json then from_json gives the same manifest."""
    assert preflight.CheckpointManifest.from_json(MANIFEST.to_json()) == MANIFEST


def test_written_next_to_the_image_and_read_back(tmp_path: Path) -> None:
    """write_manifest puts it in the image directory; read_manifest reads it back."""
    path = preflight.write_manifest(tmp_path, MANIFEST)
    assert path == tmp_path / preflight.MANIFEST_NAME
    assert preflight.read_manifest(tmp_path) == MANIFEST
    assert [p.name for p in tmp_path.iterdir()] == [preflight.MANIFEST_NAME]  # no temp left


def test_rewriting_replaces_the_whole_file(tmp_path: Path) -> None:
    """A second write replaces the first entirely."""
    preflight.write_manifest(tmp_path, MANIFEST)
    other = preflight.CheckpointManifest("570.133.20", 1, cuda_state_included=False)
    preflight.write_manifest(tmp_path, other)
    assert preflight.read_manifest(tmp_path) == other


def test_an_image_without_a_manifest_reads_none(tmp_path: Path) -> None:
    """No manifest (a CPU checkpoint, or an older one) is None, not an error."""
    assert preflight.read_manifest(tmp_path) is None


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        pytest.param("{", "invalid JSON", id="not-json"),
        pytest.param("[]", "not a JSON object", id="not-object"),
        pytest.param({"schema": 5}, "unknown schema", id="future-schema"),
        pytest.param(
            {"schema": 1, "driver_version": "", "gpu_count": 1, "cuda_state_included": True},
            "driver_version",
            id="empty-driver",
        ),
        pytest.param(
            {
                "schema": 1,
                "driver_version": "580.65.06",
                "gpu_count": -1,
                "cuda_state_included": True,
            },
            "gpu_count",
            id="negative-gpus",
        ),
        pytest.param(
            {
                "schema": 1,
                "driver_version": "580.65.06",
                "gpu_count": True,
                "cuda_state_included": True,
            },
            "gpu_count",
            id="bool-gpus",
        ),
        pytest.param(
            {
                "schema": 1,
                "driver_version": "580.65.06",
                "gpu_count": 1,
                "cuda_state_included": "yes",
            },
            "cuda_state_included",
            id="non-bool-cuda",
        ),
    ],
)
def test_invalid_manifests_name_the_problem(tmp_path: Path, payload, problem) -> None:
    """A corrupt manifest is a PreflightError naming the file and the field."""
    (tmp_path / preflight.MANIFEST_NAME).write_text(
        payload if isinstance(payload, str) else json.dumps(payload)
    )
    with pytest.raises(preflight.PreflightError, match=problem) as info:
        preflight.read_manifest(tmp_path)
    assert str(tmp_path / preflight.MANIFEST_NAME) in str(info.value)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        pytest.param(os.mkfifo, "not a regular file (a FIFO)", id="fifo"),
        pytest.param(lambda p: p.symlink_to("/etc/hostname"), "symbolic link", id="symlink"),
        pytest.param(
            lambda p: p.write_bytes(b" " * (preflight.MAX_MANIFEST_BYTES + 1)),
            f"over {1 << 20}",
            id="oversized",
        ),
    ],
)
def test_a_manifest_that_is_no_bounded_file_is_refused_at_once(
    tmp_path: Path, make: Callable[[Path], object], problem: str
) -> None:
    """A FIFO (open would block the effect and the event loop for ever), a symlink (a host
    file read) or a huge file in place of the manifest: a PreflightError naming it, at once."""
    path = tmp_path / preflight.MANIFEST_NAME
    make(path)
    done: list[BaseException] = []

    def read() -> None:
        try:
            preflight.read_manifest(tmp_path)
        except BaseException as e:
            done.append(e)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(10)  # a blocking open would hang here: fail instead
    assert done, "read_manifest blocked"
    assert isinstance(done[0], preflight.PreflightError)
    assert str(path) in str(done[0])
    assert problem in str(done[0])
