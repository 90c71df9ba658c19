"""The cuda-checkpoint stand-in: the driver's state machine, its failure modes, its CLI.

Run on the host against a process holding a file matched as "a GPU node"; the same script
runs inside containers in test_exec_route.py.
"""

from __future__ import annotations

import os
import time

import pytest

from substrate_gpu.cudackpt import errors

pytestmark = pytest.mark.usefixtures("gpu_process")


def state(run_standin, pid: int) -> str:
    out = run_standin("--get-state", "--pid", str(pid))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_cuda_process_starts_running(run_standin, gpu_process) -> None:
    """A process holding a GPU node is 'running'."""
    assert state(run_standin, gpu_process.pid) == "running"


def test_lock_checkpoint_restore_unlock_walk_the_driver_states(run_standin, gpu_process) -> None:
    """running -lock-> locked -checkpoint-> checkpointed -restore-> locked -unlock-> running."""
    pid = str(gpu_process.pid)
    seen = []
    for action in ("lock", "checkpoint", "restore", "unlock"):
        assert run_standin("--action", action, "--pid", pid).returncode == 0
        seen.append(state(run_standin, gpu_process.pid))
    assert seen == ["locked", "checkpointed", "locked", "running"]


@pytest.mark.parametrize(
    ("setup", "action"),
    [
        pytest.param([], "checkpoint", id="checkpoint-while-running"),
        pytest.param([], "restore", id="restore-while-running"),
        pytest.param([], "unlock", id="unlock-while-running"),
        pytest.param(["lock"], "lock", id="lock-twice"),
        pytest.param(["lock", "checkpoint"], "unlock", id="unlock-while-checkpointed"),
    ],
)
def test_out_of_order_actions_are_illegal_state(run_standin, gpu_process, setup, action) -> None:
    """An action that does not fit the state fails with CUDA_ERROR_ILLEGAL_STATE, state kept."""
    pid = str(gpu_process.pid)
    for step in setup:
        assert run_standin("--action", step, "--pid", pid).returncode == 0
    before = state(run_standin, gpu_process.pid)
    out = run_standin("--action", action, "--pid", pid)
    assert out.returncode == 1
    assert "cannot be performed in the present state" in out.stderr
    assert state(run_standin, gpu_process.pid) == before


def test_toggle_suspends_then_resumes(run_standin, gpu_process) -> None:
    """--toggle goes running -> checkpointed, and back."""
    pid = str(gpu_process.pid)
    assert run_standin("--toggle", "--pid", pid).returncode == 0
    assert state(run_standin, gpu_process.pid) == "checkpointed"
    assert run_standin("--toggle", "-p", pid).returncode == 0
    assert state(run_standin, gpu_process.pid) == "running"


def test_lock_timeout_leaves_the_process_running(run_standin, gpu_process) -> None:
    """A lock that times out waits --timeout ms, fails with 'timed out', state stays running."""
    pid = str(gpu_process.pid)
    started = time.monotonic()
    out = run_standin(
        "--action",
        "lock",
        "--timeout",
        "300",
        "--pid",
        pid,
        CUDA_CHECKPOINT_STANDIN_LOCK_TIMEOUT_PIDS=pid,
    )
    assert out.returncode == 1
    assert time.monotonic() - started >= 0.3
    assert errors.error_class(out.stderr).__name__ == "LockTimeoutError"
    assert state(run_standin, gpu_process.pid) == "running"


def test_failed_restore_leaves_the_process_checkpointed(run_standin, gpu_process) -> None:
    """A restore that fails (out of memory) leaves the process checkpointed."""
    pid = str(gpu_process.pid)
    assert run_standin("--toggle", "--pid", pid).returncode == 0
    out = run_standin(
        "--action", "restore", "--pid", pid, CUDA_CHECKPOINT_STANDIN_RESTORE_FAIL_PIDS=pid
    )
    assert out.returncode == 1
    assert '"out of memory"' in out.stderr
    assert state(run_standin, gpu_process.pid) == "checkpointed"


def test_failed_checkpoint_leaves_the_process_locked(run_standin, gpu_process) -> None:
    """A checkpoint the driver refuses (UVM memory) leaves the process locked."""
    pid = str(gpu_process.pid)
    assert run_standin("--action", "lock", "--pid", pid).returncode == 0
    out = run_standin(
        "--action", "checkpoint", "--pid", pid, CUDA_CHECKPOINT_STANDIN_CHECKPOINT_FAIL_PIDS=pid
    )
    assert out.returncode == 1
    assert "operation not supported" in out.stderr
    assert state(run_standin, gpu_process.pid) == "locked"


@pytest.mark.parametrize(
    ("pid", "message"),
    [
        pytest.param("999999999", '"invalid argument"', id="no-such-pid"),
        pytest.param(str(os.getpid()), '"initialization error"', id="not-a-cuda-process"),
    ],
)
def test_a_pid_without_cuda_fails_like_the_driver(run_standin, pid, message) -> None:
    """An unknown pid, or one without a CUDA context, fails with the driver's error string."""
    out = run_standin("--get-state", "--pid", pid)
    assert out.returncode == 1
    assert f"Could not get state of process {pid}: {message}" in out.stderr
    assert errors.error_class(out.stderr).__name__ == "NotACudaProcessError"


def test_checkpoint_sends_the_release_signal(run_standin, gpu_process) -> None:
    """With a release signal set, checkpoint waits until the process has dropped its GPU fd."""
    pid = str(gpu_process.pid)
    knobs = {
        "CUDA_CHECKPOINT_STANDIN_RELEASE_SIGNAL": "USR1",
        "CUDA_CHECKPOINT_STANDIN_REACQUIRE_SIGNAL": "USR2",
    }
    assert run_standin("--toggle", "--pid", pid, **knobs).returncode == 0
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert not any(link.endswith("fake-nvidia0") for link in links)
    assert state(run_standin, gpu_process.pid) == "checkpointed"  # known, fd or not
    assert run_standin("--toggle", "--pid", pid, **knobs).returncode == 0
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert any(link.endswith("fake-nvidia0") for link in links)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(
            ["--action", "checkpoint", "--timeout", "5", "--pid", "1"], id="timeout-not-lock"
        ),
        pytest.param(["--get-state"], id="no-pid"),
        pytest.param(["--action", "freeze", "--pid", "1"], id="unknown-action"),
        pytest.param(["--get-state", "--toggle", "--pid", "1"], id="two-operations"),
        pytest.param(["--frobnicate"], id="unknown-option"),
    ],
)
def test_usage_errors_exit_1_with_help(run_standin, args) -> None:
    """Command-line mistakes exit 1 and print the help."""
    out = run_standin(*args)
    assert out.returncode == 1
    assert "CUDA checkpoint and restore utility." in out.stderr


def test_unsupported_driver_fails_every_operation(run_standin, gpu_process) -> None:
    """With the 'unsupported' knob every operation fails at CUDA initialisation."""
    out = run_standin(
        "--get-state", "--pid", str(gpu_process.pid), CUDA_CHECKPOINT_STANDIN_UNSUPPORTED="1"
    )
    assert out.returncode == 1
    assert 'Error initializing CUDA: "operation not supported"' in out.stderr


# -- --device-map (580 and newer) ----------------------------------------------------------

OLD, NEW = "GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6", "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"


def checkpointed_on(run_standin, pid: str, devices: str) -> None:
    for action in ("lock", "checkpoint"):
        out = run_standin("--action", action, "--pid", pid, CUDA_CHECKPOINT_STANDIN_DEVICES=devices)
        assert out.returncode == 0, out.stderr


def test_the_580_tool_restores_onto_other_gpus_with_a_device_map(run_standin, gpu_process) -> None:
    pid = str(gpu_process.pid)
    checkpointed_on(run_standin, pid, OLD)
    knobs = {"CUDA_CHECKPOINT_STANDIN_VERSION": "580.65.06", "CUDA_CHECKPOINT_STANDIN_DEVICES": NEW}
    out = run_standin("--action", "restore", "--pid", pid, "-d", f"{OLD}={NEW}", **knobs)
    assert out.returncode == 0, out.stderr
    assert state(run_standin, gpu_process.pid) == "locked"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        pytest.param([], "no map: the state stays bound to the old GPU", id="no-map"),
        pytest.param(["--device-map", f"{NEW}={NEW}"], "the old GPU unnamed", id="partial-map"),
        pytest.param(["--device-map", f"{OLD}=GPU-gone"], "a GPU it cannot see", id="unseen"),
    ],
)
def test_a_restore_onto_other_gpus_without_a_full_map_is_invalid(
    run_standin, gpu_process, args, why
) -> None:
    """As the real tool (NVIDIA/cuda-checkpoint#35): "invalid argument", still checkpointed."""
    pid = str(gpu_process.pid)
    checkpointed_on(run_standin, pid, OLD)
    knobs = {"CUDA_CHECKPOINT_STANDIN_VERSION": "580.65.06", "CUDA_CHECKPOINT_STANDIN_DEVICES": NEW}
    out = run_standin("--action", "restore", "--pid", pid, *args, **knobs)
    assert out.returncode == 1, why
    assert f'Could not restore on process ID {pid}: "invalid argument"' in out.stderr
    assert errors.error_class(out.stderr).__name__ == "NotACudaProcessError"
    assert state(run_standin, gpu_process.pid) == "checkpointed"


def test_the_570_tool_has_no_device_map(run_standin, gpu_process) -> None:
    pid = str(gpu_process.pid)
    checkpointed_on(run_standin, pid, OLD)
    out = run_standin("--action", "restore", "--pid", pid, "--device-map", f"{OLD}={NEW}")
    assert out.returncode == 1 and "Unknown option: --device-map" in out.stderr
    assert "--device-map" not in run_standin("--help").stdout


def test_a_device_map_is_for_restore_only(run_standin, gpu_process) -> None:
    out = run_standin(
        "--action", "lock", "--pid", str(gpu_process.pid), "--device-map", f"{OLD}={NEW}",
        CUDA_CHECKPOINT_STANDIN_VERSION="580.65.06",
    )  # fmt: skip
    assert out.returncode == 1 and "only valid with --action restore" in out.stderr
