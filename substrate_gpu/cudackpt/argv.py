"""Pure builders for every ``cuda-checkpoint`` command line.

Shapes from NVIDIA's ``cuda-checkpoint --help`` (utility 570.86.10; ``--device-map`` from
580.65.06)::

    --get-state --pid <pid>
    --action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]
             [--device-map <uuids>]
    --toggle --pid <pid>
    --get-restore-tid --pid <pid>

``--timeout`` applies to ``lock`` only (the driver's ``CUcheckpointLockArgs.timeoutMs``):
it is refused here for any other action rather than sent and ignored. ``--device-map``
(``oldUuid=newUuid,…``, every checkpointed GPU named) applies to ``restore`` only, likewise.
Values are separate arguments (``--pid 7``), as NVIDIA documents them.
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
    tool: str,
    action: api.Action,
    pid: int,
    *,
    timeout_ms: int | None = None,
    device_map: str = "",
) -> tuple[str, ...]:
    """``cuda-checkpoint --action A --pid P [--timeout MS] [--device-map M]`` (``--timeout``:
    lock only; ``--device-map``: restore only)."""
    if timeout_ms is not None:
        if action != "lock":
            raise ValueError(f"cuda-checkpoint takes --timeout for lock only, not {action}")
        if timeout_ms <= 0:
            raise ValueError(f"a lock timeout must be positive, not {timeout_ms} ms")
    if device_map:
        if action != "restore":
            raise ValueError(f"cuda-checkpoint takes --device-map for restore only, not {action}")
        pairs = [pair.partition("=") for pair in device_map.split(",")]
        if not all(old and sep and new for old, sep, new in pairs):
            raise ValueError(f"a device map is oldUuid=newUuid,..., not {device_map!r}")
    argv: tuple[str, ...] = (tool, "--action", action, "--pid", _pid(pid))
    if timeout_ms is not None:
        argv = (*argv, "--timeout", str(timeout_ms))
    return (*argv, "--device-map", device_map) if device_map else argv


def toggle(tool: str, pid: int) -> tuple[str, ...]:
    """``cuda-checkpoint --toggle --pid P``: lock+checkpoint, or restore+unlock."""
    return (tool, "--toggle", "--pid", _pid(pid))


def help_(tool: str) -> tuple[str, ...]:
    """``cuda-checkpoint --help``: exits 0 where the tool exists (an availability probe)."""
    return (tool, "--help")
