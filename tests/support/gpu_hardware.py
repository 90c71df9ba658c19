"""Whether this machine has a real NVIDIA GPU (for the tests marked ``gpu``)."""

from __future__ import annotations

from pathlib import Path

from substrate_gpu.injection import devices


def gpu_present() -> bool:
    """A GPU this process can use: /dev/nvidiactl and at least one /dev/nvidiaN."""
    return Path("/dev/nvidiactl").exists() and devices.has_gpu(Path("/"))
