"""Command lines: cuda-checkpoint's, and runsc exec that carries it into the sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from substrate_gpu.cudackpt import argv
from substrate_gpu.runsc import argv as runsc_argv

T = "/opt/nvidia/cuda-checkpoint"


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        pytest.param(argv.get_state(T, 7), [T, "--get-state", "--pid", "7"], id="get-state"),
        pytest.param(
            argv.action(T, "lock", 7, timeout_ms=5000),
            [T, "--action", "lock", "--pid", "7", "--timeout", "5000"],
            id="lock-with-timeout",
        ),
        pytest.param(argv.action(T, "lock", 7), [T, "--action", "lock", "--pid", "7"], id="lock"),
        pytest.param(
            argv.action(T, "checkpoint", 7),
            [T, "--action", "checkpoint", "--pid", "7"],
            id="checkpoint",
        ),
        pytest.param(
            argv.action(T, "restore", 7), [T, "--action", "restore", "--pid", "7"], id="restore"
        ),
        pytest.param(
            argv.action(T, "unlock", 7), [T, "--action", "unlock", "--pid", "7"], id="unlock"
        ),
        pytest.param(
            argv.action(T, "restore", 7, device_map="GPU-a=GPU-b,GPU-c=GPU-c"),
            [T, "--action", "restore", "--pid", "7", "--device-map", "GPU-a=GPU-b,GPU-c=GPU-c"],
            id="restore-with-device-map",
        ),
        pytest.param(argv.toggle(T, 7), [T, "--toggle", "--pid", "7"], id="toggle"),
        pytest.param(argv.help_(T), [T, "--help"], id="help"),
    ],
)
def test_cuda_checkpoint_argv(built, expected) -> None:
    """Each builder yields NVIDIA's documented command line."""
    assert list(built) == expected


@pytest.mark.parametrize(
    "build",
    [
        # --timeout is the lock's argument only (CUcheckpointLockArgs).
        pytest.param(lambda: argv.action(T, "checkpoint", 7, timeout_ms=10), id="timeout-not-lock"),
        pytest.param(lambda: argv.action(T, "lock", 7, timeout_ms=0), id="zero-timeout"),
        pytest.param(lambda: argv.get_state(T, 0), id="pid-zero"),
        # --device-map is the restore's argument only (CUcheckpointRestoreArgs.gpuPairs).
        pytest.param(lambda: argv.action(T, "unlock", 7, device_map="a=b"), id="map-not-restore"),
        pytest.param(lambda: argv.action(T, "restore", 7, device_map="a=b,c"), id="map-half-pair"),
        pytest.param(lambda: argv.toggle(T, -3), id="negative-pid"),
    ],
)
def test_invalid_arguments_are_refused_before_running(build) -> None:
    """Arguments the tool would reject or ignore raise ValueError here."""
    with pytest.raises(ValueError):
        build()


INV = runsc_argv.Invocation(
    runsc="runsc", root=Path("/run/r"), global_flags=("--platform=systrap",)
)


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        pytest.param(
            runsc_argv.exec_(INV, "a1", argv.get_state(T, 7)),
            [
                "runsc",
                "--root",
                "/run/r",
                "--platform=systrap",
                "exec",
                "a1",
                T,
                "--get-state",
                "--pid",
                "7",
            ],
            id="exec",
        ),
        pytest.param(
            runsc_argv.exec_(INV, "a1", ["sleep", "1"], detach=True),
            [
                "runsc",
                "--root",
                "/run/r",
                "--platform=systrap",
                "exec",
                "--detach",
                "a1",
                "sleep",
                "1",
            ],
            id="exec-detach",
        ),
    ],
)
def test_runsc_exec_argv(built, expected) -> None:
    """runsc exec: global flags first, never --nvproxy, the command verbatim after the id."""
    assert list(built) == expected


def test_runsc_exec_refuses_an_empty_command() -> None:
    """An empty command is a ValueError, not a runsc usage error."""
    with pytest.raises(ValueError, match="command is empty"):
        runsc_argv.exec_(INV, "a1", [])
