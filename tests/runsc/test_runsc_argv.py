"""Every runsc command line, checked against the shapes of the brief (§4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from substrate_gpu.runsc import argv

INV = argv.Invocation(runsc="runsc", root=Path("/run/runsc"))
B, P, D = Path("/b/a1"), Path("/b/a1/runsc.pid"), Path("/img/a1")

CASES = [
    # Global flags first; --nvproxy on create for a GPU sandbox's every container.
    pytest.param(
        argv.create(INV, "a1", bundle=B, pid_file=P, nvproxy=True),
        "runsc --root /run/runsc --nvproxy create --bundle /b/a1 --pid-file /b/a1/runsc.pid a1",
        id="create-nvproxy",
    ),
    pytest.param(
        argv.create(INV, "a1", bundle=B, pid_file=P, nvproxy=False),
        "runsc --root /run/runsc create --bundle /b/a1 --pid-file /b/a1/runsc.pid a1",
        id="create-cpu",
    ),
    # start acts on an existing sandbox: never --nvproxy.
    pytest.param(argv.start(INV, "a1"), "runsc --root /run/runsc start a1", id="start"),
    pytest.param(
        argv.checkpoint(INV, "a1", image_path=D, leave_running=False),
        "runsc --root /run/runsc checkpoint --image-path /img/a1 a1",
        id="checkpoint",
    ),
    # --leave-running keeps the sandbox alive when the checkpoint fails.
    pytest.param(
        argv.checkpoint(INV, "a1", image_path=D, leave_running=True),
        "runsc --root /run/runsc checkpoint --image-path /img/a1 --leave-running a1",
        id="checkpoint-leave-running",
    ),
    pytest.param(
        argv.checkpoint(
            INV,
            "a1",
            image_path=D,
            leave_running=True,
            cuda_checkpoint_path=Path("/opt/cc/cuda-checkpoint"),
        ),
        "runsc --root /run/runsc checkpoint --image-path /img/a1 --leave-running "
        "--cuda-checkpoint-path /opt/cc/cuda-checkpoint a1",
        id="checkpoint-cuda-checkpoint",
    ),
    # A multi-GPU actor on a runsc that has it: cuda-checkpoint one process at a time.
    pytest.param(
        argv.checkpoint(
            INV,
            "a1",
            image_path=D,
            leave_running=True,
            cuda_checkpoint_path=Path("/opt/cc/cuda-checkpoint"),
            cuda_checkpoint_sequential=True,
        ),
        "runsc --root /run/runsc checkpoint --image-path /img/a1 --leave-running "
        "--cuda-checkpoint-path /opt/cc/cuda-checkpoint --cuda-checkpoint-sequential a1",
        id="checkpoint-cuda-checkpoint-sequential",
    ),
    # --detach always: without it restore blocks until the container exits.
    pytest.param(
        argv.restore(INV, "a1", bundle=B, image_path=D, nvproxy=True),
        "runsc --root /run/runsc --nvproxy restore --bundle /b/a1 --image-path /img/a1 --detach a1",
        id="restore-nvproxy",
    ),
    pytest.param(
        argv.restore(INV, "a1", bundle=B, image_path=D, nvproxy=False),
        "runsc --root /run/runsc restore --bundle /b/a1 --image-path /img/a1 --detach a1",
        id="restore-cpu",
    ),
    pytest.param(argv.state(INV, "a1"), "runsc --root /run/runsc state a1", id="state"),
    pytest.param(argv.kill(INV, "a1", "KILL"), "runsc --root /run/runsc kill a1 KILL", id="kill"),
    pytest.param(
        argv.delete(INV, "a1", force=False), "runsc --root /run/runsc delete a1", id="delete"
    ),
    pytest.param(
        argv.delete(INV, "a1", force=True),
        "runsc --root /run/runsc delete --force a1",
        id="delete-force",
    ),
    pytest.param(argv.version(INV), "runsc --version", id="version"),
    pytest.param(argv.help_command(INV, "checkpoint"), "runsc help checkpoint", id="help-cmd"),
    pytest.param(argv.help_command(INV), "runsc help", id="help"),
    pytest.param(argv.top_level_flags(INV), "runsc flags", id="flags"),
    pytest.param(
        argv.list_supported_drivers(INV),
        "runsc nvproxy list-supported-drivers",
        id="list-supported-drivers",
    ),
]


@pytest.mark.parametrize(("built", "expected"), CASES)
def test_argv_matches_the_brief(built: tuple[str, ...], expected: str) -> None:
    """Each builder produces exactly the command line of the brief."""
    assert built == tuple(expected.split())


EXTRA = argv.Invocation(
    runsc="/usr/bin/runsc",
    root=Path("/r"),
    global_flags=("--platform=systrap", "--debug-log=/log/"),
    nvproxy_flags=("--nvproxy-driver-version=550.90.07",),
)

EXTRA_CASES = [
    pytest.param(
        argv.create(EXTRA, "a1", bundle=B, pid_file=P, nvproxy=True),
        "/usr/bin/runsc --root /r --platform=systrap --debug-log=/log/ --nvproxy "
        "--nvproxy-driver-version=550.90.07 create --bundle /b/a1 --pid-file /b/a1/runsc.pid a1",
        id="create-nvproxy-flags-travel-with-nvproxy",
    ),
    pytest.param(
        argv.create(EXTRA, "a1", bundle=B, pid_file=P, nvproxy=False),
        "/usr/bin/runsc --root /r --platform=systrap --debug-log=/log/ "
        "create --bundle /b/a1 --pid-file /b/a1/runsc.pid a1",
        id="create-cpu-no-nvproxy-flags",
    ),
    pytest.param(
        argv.restore(EXTRA, "a1", bundle=B, image_path=D, nvproxy=True),
        "/usr/bin/runsc --root /r --platform=systrap --debug-log=/log/ --nvproxy "
        "--nvproxy-driver-version=550.90.07 restore --bundle /b/a1 --image-path /img/a1 "
        "--detach a1",
        id="restore-nvproxy-flags",
    ),
    pytest.param(
        argv.start(EXTRA, "a1"),
        "/usr/bin/runsc --root /r --platform=systrap --debug-log=/log/ start a1",
        id="start-global-flags-only",
    ),
    pytest.param(
        argv.checkpoint(EXTRA, "a1", image_path=D, leave_running=False),
        "/usr/bin/runsc --root /r --platform=systrap --debug-log=/log/ "
        "checkpoint --image-path /img/a1 a1",
        id="checkpoint-global-flags-only",
    ),
]


@pytest.mark.parametrize(("built", "expected"), EXTRA_CASES)
def test_extra_global_flags_come_before_the_subcommand(
    built: tuple[str, ...], expected: str
) -> None:
    """Extra global flags precede the subcommand; nvproxy-only flags follow --nvproxy only."""
    assert built == tuple(expected.split())


@pytest.mark.parametrize(
    "built",
    [
        pytest.param(argv.start(EXTRA, "a1"), id="start"),
        pytest.param(argv.checkpoint(EXTRA, "a1", image_path=D, leave_running=True), id="ckpt"),
        pytest.param(argv.state(EXTRA, "a1"), id="state"),
        pytest.param(argv.kill(EXTRA, "a1", "TERM"), id="kill"),
        pytest.param(argv.delete(EXTRA, "a1", force=True), id="delete"),
    ],
)
def test_nvproxy_never_on_commands_for_an_existing_sandbox(built: tuple[str, ...]) -> None:
    """start/checkpoint/state/kill/delete never carry --nvproxy or its companion flags."""
    assert not any(a.startswith("--nvproxy") for a in built)


def test_sequential_cuda_checkpoint_needs_a_cuda_checkpoint_path() -> None:
    """--cuda-checkpoint-sequential orders runsc's cuda-checkpoint calls: alone it is refused."""
    with pytest.raises(ValueError, match="--cuda-checkpoint-sequential needs"):
        argv.checkpoint(
            INV, "a1", image_path=D, leave_running=True, cuda_checkpoint_sequential=True
        )
