"""Pure builders for every ``cuda-checkpoint`` command line.

Shapes from NVIDIA's ``cuda-checkpoint --help`` (utility 570.86.10)::

    --get-state --pid <pid>
    --action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]
    --toggle --pid <pid>
    --get-restore-tid --pid <pid>

``--timeout`` applies to ``lock`` only (the driver's ``CUcheckpointLockArgs.timeoutMs``):
it is refused here for any other action rather than sent and ignored. Values are separate
arguments (``--pid 7``), as NVIDIA documents them.
"""

from __future__ import annotations

from substrate_gpu.cudackpt import api


def _pid(pid: int) -> str:
    if isinstance(pid, bool) or pid <= 0:
        raise ValueError(f"cuda-checkpoint needs a positive pid, not {pid!r}")
    return str(pid)


def get_state(tool: str, pid: int) -> tuple[str, ...]:
    """``cuda-checkpoint --get-state --pid P``."""
    return (tool, "--get-state", "--pid", _pid(pid))


def action(
    tool: str, action: api.Action, pid: int, *, timeout_ms: int | None = None
) -> tuple[str, ...]:
    """``cuda-checkpoint --action A --pid P [--timeout MS]`` (``--timeout``: lock only)."""
    if timeout_ms is not None:
        if action != "lock":
            raise ValueError(f"cuda-checkpoint takes --timeout for lock only, not {action}")
        if timeout_ms <= 0:
            raise ValueError(f"a lock timeout must be positive, not {timeout_ms} ms")
    argv = (tool, "--action", action, "--pid", _pid(pid))
    return argv if timeout_ms is None else (*argv, "--timeout", str(timeout_ms))


def toggle(tool: str, pid: int) -> tuple[str, ...]:
    """``cuda-checkpoint --toggle --pid P``: lock+checkpoint, or restore+unlock."""
    return (tool, "--toggle", "--pid", _pid(pid))


def help_(tool: str) -> tuple[str, ...]:
    """``cuda-checkpoint --help``: exits 0 where the tool exists (an availability probe)."""
    return (tool, "--help")
