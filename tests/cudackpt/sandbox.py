"""Shared pieces of the cuda-checkpoint tests: the stand-ins' paths, the GPU worker run in
containers, and the environment the stand-in tool reads. Fixtures live in conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

STANDINS = Path(__file__).resolve().parents[1] / "standins"
CUDA_CHECKPOINT = STANDINS / "cuda-checkpoint"
RUNSC = STANDINS / "runsc"
#: The tool as the container sees it.
TOOL_IN_CONTAINER = "/opt/standins/cuda-checkpoint"
STATE_IN_CONTAINER = "/run/cuda-ckpt"

# A CUDA "process": holds /dev/nvidia0 on fd 3; SIGUSR1 drops it (its CUDA state went to
# host memory), SIGUSR2 takes it again (restored). pid 1 and one child both run it.
GPU_WORKER = """\
trap 'exec 3<&-' USR1
trap 'exec 3</dev/nvidia0' USR2
exec 3</dev/nvidia0
while true; do sleep 0.05 3<&-; done
"""
INIT = f"/bin/sh /gpu-worker.sh & echo $! > {STATE_IN_CONTAINER}/child.pid; exec /bin/sh /gpu-worker.sh"


def standin_env(state: Path, **knobs: str) -> dict[str, str]:
    """The environment for running the stand-in on the host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_CHECKPOINT_STANDIN_")}
    env["CUDA_CHECKPOINT_STANDIN_STATE"] = str(state)
    env.update(knobs)
    return env
