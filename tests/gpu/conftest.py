"""Tests on a real NVIDIA GPU: skipped without one, even under SUBSTRATE_GPU_REQUIRE_REAL=1.

CI has no GPU, so "no GPU" is never a failure (unlike a missing runc). On a machine with a
GPU run them all, in well under 5 minutes::

    SUBSTRATE_GPU_FINDINGS=tests/data/gpu .venv/bin/pytest -m gpu tests/gpu -v

What they find on real hardware (device numbers, nvidia-smi's list, the spec nvidia-ctk wrote,
the GPUs the agent learns from it, the driver's SONAMEs, what the fd probe and a runc container
saw) is written as JSON under ``$SUBSTRATE_GPU_FINDINGS`` when it is set, to be kept as test
data (``tests/data/gpu/``, with a line in its README saying which machine).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import real
from support.gpu_hardware import gpu_present


@pytest.fixture(autouse=True)
def _skip_without_gpu(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("gpu") is not None and not gpu_present():
        real.gpu_missing("no NVIDIA GPU on this machine (/dev/nvidiactl and /dev/nvidiaN)")


@pytest.fixture
def findings() -> Path | None:
    """Where to keep what the tests found on real hardware (``$SUBSTRATE_GPU_FINDINGS``)."""
    where = os.environ.get("SUBSTRATE_GPU_FINDINGS")
    if not where:
        return None
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path
