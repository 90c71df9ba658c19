"""Output cut short by its reader (``… | head``) ends quietly, for every command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from substrate_gpu.cli import EXIT_OK

REPO = Path(__file__).resolve().parents[2]
SPEC = next((REPO / "tests/data/cdi/real-world").glob("*.yaml"))


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["cdi", "show", str(SPEC)], id="cdi-show"),
        pytest.param(["pool", "crd"], id="pool-crd"),
    ],
)
def test_a_reader_gone_before_the_output_is_exit_0_without_a_traceback(argv: list[str]) -> None:
    """stdout a pipe whose reader has already closed: no BrokenPipe traceback, exit 0."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "substrate_gpu", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == EXIT_OK
