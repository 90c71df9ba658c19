"""Whether this machine has a real NVIDIA GPU (for the tests marked ``gpu``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from substrate_gpu.injection import devices


def gpu_present() -> bool:
    """A GPU this process can use: /dev/nvidiactl and at least one /dev/nvidiaN."""
    return Path("/dev/nvidiactl").exists() and devices.has_gpu(Path("/"))


def keep(findings: Path | None, name: str, data: Any) -> None:
    """Write one finding, ``<findings>/<name>.json``, when findings are kept (else nothing)."""
    if findings is not None:
        (findings / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
