"""cuda-checkpoint's messages → typed errors (keyed on the CUDA error strings)."""

from __future__ import annotations

import pytest

from substrate_gpu.cudackpt import api, errors


@pytest.mark.parametrize(
    ("output", "cls"),
    [
        pytest.param(
            'Could not lock process 7: "the operation timed out"',
            api.LockTimeoutError,
            id="timeout",
        ),
        pytest.param(
            'Could not get state of process 7: "invalid argument"',
            api.NotACudaProcessError,
            id="no-pid",
        ),
        pytest.param(
            'Could not get state of process 7: "initialization error"',
            api.NotACudaProcessError,
            id="not-cuda",
        ),
        pytest.param(
            'Could not checkpoint process 7: "the operation cannot be performed in the present state"',
            api.IllegalStateError,
            id="illegal-state",
        ),
        # Real output of cuda-checkpoint (kaito-project/grit issue #9).
        pytest.param(
            'Error initializing CUDA: "OS call failed or operation not supported on this OS"',
            api.CheckpointUnsupportedError,
            id="os-unsupported",
        ),
        pytest.param(
            'Could not checkpoint process 7: "operation not supported"',
            api.CheckpointUnsupportedError,
            id="unsupported",
        ),
        # runc 1.1's exec error for a missing binary.
        pytest.param(
            'exec failed: unable to start container process: exec: "cuda-checkpoint": '
            "executable file not found in $PATH",
            api.ToolUnavailableError,
            id="tool-missing-runc",
        ),
        pytest.param(
            'Could not restore process 7: "out of memory"', api.CudaCheckpointError, id="other"
        ),
    ],
)
def test_error_class(output, cls) -> None:
    """Each CUDA error string maps to the error the suspend logic reacts to."""
    assert errors.error_class(output) is cls
