"""Pure builders for every ``runsc`` command line substrate-gpu runs.

The shapes come from the brief (§4) and gVisor's CLI, and they are the part of the runsc
integration most worth pinning down in tests, so they live here as plain functions on plain
data, with no I/O:

- **Global flags come first**, before the subcommand: ``runsc --root R [--nvproxy] create …``.
  runsc parses its global flags with Go's ``flag`` package, which stops at the first
  non-flag argument; a global flag after the subcommand is parsed by the subcommand's own
  flag set and rejected (``flag provided but not defined: -nvproxy``).
- **``--nvproxy`` goes on ``create`` and ``restore`` only.** The one that matters is the
  root (``_pause``) container's ``create``: the sandbox boots there, and ``_pause`` holds no
  GPU device, so runsc's auto-detection (which looks for NVIDIA devices in the spec) never
  fires for it; booted without nvproxy, the sentry crashes when the GPU container joins.
  Every ``restore`` of a GPU sandbox's containers carries it too (each restore re-reads
  its flags). An app container's ``create`` joins a booted sandbox, where the flag is
  redundant but harmless; the lifecycle passes it there as well, so every create and
  restore of a GPU sandbox agrees. ``start``, ``checkpoint``, ``state``, ``kill`` and
  ``delete`` act on an existing sandbox and never get it. The caller
  (:mod:`substrate_gpu.lifecycle.sandbox`) decides.
- **nvproxy-only global flags** (``--nvproxy-driver-version``,
  ``--nvproxy-allowed-driver-capabilities``) travel with ``--nvproxy`` and nowhere else:
  they configure the sandbox being booted.
- **Per-command global flags** (``extra``): upstream's worker gives ``--cpu-num-from-quota``
  to ``create`` and ``restore`` and ``--allow-connected-on-save`` to ``start`` only; they are
  global flags all the same, so they go after the other global flags, before the subcommand.
- Flag values are separate arguments (``--root R``), as in the brief; Go's ``flag`` accepts
  both that and ``--root=R``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Invocation:
    """How runsc is invoked on this node: the binary and its global flags."""

    runsc: str
    """The runsc executable (a path, or a name looked up on PATH)."""
    root: Path
    """``--root``: the directory where runsc keeps its container state."""
    global_flags: tuple[str, ...] = ()
    """Extra global flags on every command (``--platform=systrap``, ``--debug-log=/d/``)."""
    nvproxy_flags: tuple[str, ...] = ()
    """Extra global flags that travel with ``--nvproxy`` only
    (``--nvproxy-driver-version=550.90.07``)."""


def _prefix(inv: Invocation, *, nvproxy: bool = False) -> list[str]:
    argv = [inv.runsc, "--root", str(inv.root), *inv.global_flags]
    if nvproxy:
        argv += ["--nvproxy", *inv.nvproxy_flags]
    return argv


def create(
    inv: Invocation,
    container_id: str,
    *,
    bundle: Path,
    pid_file: Path,
    nvproxy: bool,
    extra: Sequence[str] = (),
) -> tuple[str, ...]:
    """``runsc --root R [--nvproxy] [EXTRA…] create --bundle B --pid-file P ID``."""
    return (
        *_prefix(inv, nvproxy=nvproxy),
        *extra,
        "create",
        "--bundle",
        str(bundle),
        "--pid-file",
        str(pid_file),
        container_id,
    )


def start(inv: Invocation, container_id: str, *, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """``runsc --root R [EXTRA…] start ID`` (never ``--nvproxy``: the sandbox exists)."""
    return (*_prefix(inv), *extra, "start", container_id)


def checkpoint(
    inv: Invocation,
    container_id: str,
    *,
    image_path: Path,
    leave_running: bool,
    cuda_checkpoint_path: Path | None = None,
    cuda_checkpoint_sequential: bool = False,
) -> tuple[str, ...]:
    """``runsc --root R checkpoint --image-path DIR [--leave-running]
    [--cuda-checkpoint-path P [--cuda-checkpoint-sequential]] ID``.

    ``--cuda-checkpoint-sequential`` only means something with a cuda-checkpoint path (it
    orders runsc's cuda-checkpoint calls), so it is refused without one.
    """
    if cuda_checkpoint_sequential and cuda_checkpoint_path is None:
        raise ValueError(
            f"checkpoint of {container_id}: --cuda-checkpoint-sequential needs "
            "--cuda-checkpoint-path"
        )
    argv = [*_prefix(inv), "checkpoint", "--image-path", str(image_path)]
    if leave_running:
        argv.append("--leave-running")
    if cuda_checkpoint_path is not None:
        argv += ["--cuda-checkpoint-path", str(cuda_checkpoint_path)]
    if cuda_checkpoint_sequential:
        argv.append("--cuda-checkpoint-sequential")
    return (*argv, container_id)


def restore(
    inv: Invocation,
    container_id: str,
    *,
    bundle: Path,
    image_path: Path,
    nvproxy: bool,
    extra: Sequence[str] = (),
    background: bool = False,
) -> tuple[str, ...]:
    """``runsc --root R [--nvproxy] [EXTRA…] restore --bundle B --image-path DIR
    [--background] --detach ID``.

    Always ``--detach``: without it runsc blocks until the restored container exits.
    ``background``: the image goes on loading after restore exits (upstream's worker).
    """
    return (
        *_prefix(inv, nvproxy=nvproxy),
        *extra,
        "restore",
        "--bundle",
        str(bundle),
        "--image-path",
        str(image_path),
        *(("--background",) if background else ()),
        "--detach",
        container_id,
    )


def exec_(
    inv: Invocation, container_id: str, command: Sequence[str], *, detach: bool = False
) -> tuple[str, ...]:
    """``runsc --root R exec [--detach] ID CMD…``: run ``command`` inside the sandbox.

    Never ``--nvproxy`` (the sandbox exists). ``command`` follows the container id verbatim:
    Go's ``flag`` stops at the first positional argument, so the command's own flags
    (``cuda-checkpoint --get-state``) are never taken for runsc's. An empty command is
    refused here rather than by runsc.
    """
    if not command:
        raise ValueError(f"exec in container {container_id}: the command is empty")
    return (
        *_prefix(inv),
        "exec",
        *(("--detach",) if detach else ()),
        container_id,
        *(str(a) for a in command),
    )


def state(inv: Invocation, container_id: str) -> tuple[str, ...]:
    """``runsc --root R state ID``."""
    return (*_prefix(inv), "state", container_id)


def kill(inv: Invocation, container_id: str, signal: str) -> tuple[str, ...]:
    """``runsc --root R kill ID SIGNAL``."""
    return (*_prefix(inv), "kill", container_id, signal)


def pause(inv: Invocation, container_id: str) -> tuple[str, ...]:
    """``runsc --root R pause ID``: of the root container, the whole sandbox is frozen."""
    return (*_prefix(inv), "pause", container_id)


def resume(inv: Invocation, container_id: str) -> tuple[str, ...]:
    """``runsc --root R resume ID``: undoes :func:`pause`."""
    return (*_prefix(inv), "resume", container_id)


def delete(inv: Invocation, container_id: str, *, force: bool) -> tuple[str, ...]:
    """``runsc --root R delete [--force] ID``."""
    return (*_prefix(inv), "delete", *(("--force",) if force else ()), container_id)


def version(inv: Invocation) -> tuple[str, ...]:
    """``runsc --version``."""
    return (inv.runsc, "--version")


def help_command(inv: Invocation, command: str | None = None) -> tuple[str, ...]:
    """``runsc help [COMMAND]``: the command list, or one command's flags."""
    return (inv.runsc, "help", *((command,) if command else ()))


def top_level_flags(inv: Invocation) -> tuple[str, ...]:
    """``runsc flags``: the global flags, in Go ``flag`` format."""
    return (inv.runsc, "flags")


def list_supported_drivers(inv: Invocation) -> tuple[str, ...]:
    """``runsc nvproxy list-supported-drivers``."""
    return (inv.runsc, "nvproxy", "list-supported-drivers")
