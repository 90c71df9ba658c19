"""runsc's real failure messages map to the typed errors the lifecycle reacts to."""

from __future__ import annotations

import pytest

from substrate_gpu import exceptions
from substrate_gpu.runsc import api, errors

# Messages as gVisor (runsc/cmd, runsc/container, pkg/sentry/devices/nvproxy) and runc print them.
CASES = [
    pytest.param(
        'checkpoint failed: checkpointing container "a1": saving kernel state: '
        "encoding error: can't save with live nvproxy clients",
        api.LiveNvproxyClientsError,
        id="live-nvproxy-clients",
    ),
    pytest.param(
        "FATAL ERROR: checkpoint failed: can't save with live nvproxy clients",
        api.LiveNvproxyClientsError,
        id="live-nvproxy-clients-fatal-prefix",
    ),
    # Builds without nvproxy save support panic on any open device file: a live handle.
    pytest.param(
        "checkpoint failed: encoding error: nvproxy.frontendFD is not saveable",
        api.LiveNvproxyClientsError,
        id="frontend-fd-not-saveable",
    ),
    pytest.param(
        "checkpoint failed: encoding error: nvproxy: object handle 0xc1d00001:0x5c000002 "
        "(class 0xa06c, type *nvproxy.rmAllocObject) is not restorable",
        api.NotRestorableError,
        id="object-handle-not-restorable",
    ),
    pytest.param(
        'checkpoint failed: cannot checkpoint container "a1" in state stopped',
        api.ContainerStoppedError,
        id="checkpoint-in-state-stopped",
    ),
    pytest.param(
        'cannot start container "a1" in state stopped',
        api.ContainerStoppedError,
        id="start-in-state-stopped",
    ),
    pytest.param(
        "creating container: cannot create sandbox: nvproxy setup: "
        "unsupported Nvidia driver version: 999.1.2",
        api.UnsupportedDriverError,
        id="unsupported-driver",
    ),
    # Restoring onto another driver: must not be mistaken for a missing container.
    pytest.param(
        'restore failed: driver version "560.1.1" not found in abis map',
        api.UnsupportedDriverError,
        id="restore-driver-not-in-abis-map",
    ),
    pytest.param(
        "loading container: file does not exist", api.ContainerNotFoundError, id="runsc-not-found"
    ),
    # The texts below were captured from the pinned real runsc (scripts/runsc.version).
    pytest.param(
        "FetchSpec failed: loading container: file does not exist",
        api.ContainerNotFoundError,
        id="real-unknown-container",
    ),
    pytest.param(
        "creating container: cannot lock container metadata file: container already exists",
        api.ContainerExistsError,
        id="real-id-exists",
    ),
    pytest.param(
        'FetchSpec failed: reading spec: error opening spec file "/b/config.json": '
        "open /b/config.json: no such file or directory",
        api.BundleError,
        id="real-bad-bundle",
    ),
    pytest.param(
        'starting container: opening state file "/i/checkpoint.img" failed: '
        "open /i/checkpoint.img: no such file or directory",
        api.CheckpointImageError,
        id="real-restore-missing-image",
    ),
    pytest.param(
        'checkpoint failed: creating checkpoint state file "/i/checkpoint.img": '
        "open /i/checkpoint.img: file exists",
        api.CheckpointImageError,
        id="real-checkpoint-image-exists",
    ),
    pytest.param(
        "making directories at path provided: mkdir /f: not a directory",
        api.CheckpointImageError,
        id="real-checkpoint-unwritable",
    ),
    pytest.param(
        'starting container: cannot start container "a1" in state running',
        api.WrongStateError,
        id="real-start-running",
    ),
    pytest.param(
        'checkpoint failed: checkpointing container "a1": connecting to control server at '
        "PID 20285: connection refused",
        api.ContainerStoppedError,
        id="real-sandbox-gone",
    ),
    pytest.param(
        "creating container: cannot create sandbox: cannot create sandbox process: failed to "
        "get Nvidia driver version: failed to open /dev/nvidiactl: no such file or directory",
        api.NvproxyUnavailableError,
        id="real-nvproxy-without-driver",
    ),
    pytest.param(
        'time="2026-01-01T00:00:00Z" level=error msg="container does not exist"',
        api.ContainerNotFoundError,
        id="runc-does-not-exist",
    ),
    pytest.param(
        "creating container: cannot create sandbox: fork/exec: permission denied",
        api.RunscError,
        id="anything-else",
    ),
]


@pytest.mark.parametrize(("stderr", "expected"), CASES)
def test_error_class_from_real_messages(stderr: str, expected: type[api.RunscError]) -> None:
    """Each real runsc message maps to exactly its typed error."""
    assert errors.error_class(stderr) is expected


def test_command_error_keeps_context_and_details() -> None:
    """The typed error keeps the 'while …' message, argv, status and stderr."""
    failure = exceptions.ExternalCommandError(
        "while checkpointing container a1: runsc exited with status 128; "
        "stderr: checkpoint failed: can't save with live nvproxy clients",
        argv=("runsc", "checkpoint", "a1"),
        returncode=128,
        stderr="checkpoint failed: can't save with live nvproxy clients",
    )
    error = errors.from_command_error(failure)
    assert isinstance(error, api.LiveNvproxyClientsError)
    assert str(error).startswith("while checkpointing container a1: ")
    assert (error.argv, error.returncode, error.timed_out) == (
        ("runsc", "checkpoint", "a1"),
        128,
        False,
    )


def test_timeout_is_a_plain_runsc_error_even_with_a_telling_stderr() -> None:
    """A killed runsc maps to RunscError with timed_out, whatever it printed before dying."""
    failure = exceptions.ExternalCommandError(
        "while creating container a1: runsc did not finish within 1s",
        argv=("runsc", "create", "a1"),
        returncode=None,
        stderr="loading container: file does not exist",
        timed_out=True,
    )
    error = errors.from_command_error(failure)
    assert type(error) is api.RunscError
    assert error.timed_out
