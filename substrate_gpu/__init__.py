"""substrate-gpu: NVIDIA GPUs for gVisor-sandboxed AI actors.

The public API is re-exported here by name; submodules are imported by callers as modules
(``from substrate_gpu import cdi``).
"""

from __future__ import annotations

from substrate_gpu.exceptions import (
    CdiSpecError,
    ConfigError,
    DeviceResolutionError,
    ExternalCommandError,
    InjectionError,
    RootfsEscapeError,
    SubstrateGpuError,
    ToolkitError,
)

__all__ = [
    "CdiSpecError",
    "ConfigError",
    "DeviceResolutionError",
    "ExternalCommandError",
    "InjectionError",
    "RootfsEscapeError",
    "SubstrateGpuError",
    "ToolkitError",
]
